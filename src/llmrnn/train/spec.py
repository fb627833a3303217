"""One training run as both engines take it: `llmrnn train run` builds a RunSpec once and hands it to TRL's
engine (llmrnn.train.trl_engine.train) or verl's runner (llmrnn.train.verl_cmd.run). What only one engine
needs stays a keyword of that engine: TRL's extra `callbacks`, verl's `python` (the interpreter that runs
main_ppo) and `verl_version` (the release the overrides are built for)."""

from __future__ import annotations

import dataclasses
import os

from llmrnn.reward.function import BUILTIN_REWARD, RewardFunction
from llmrnn.settings.train import Train
from llmrnn.train import config as tcfg


@dataclasses.dataclass(frozen=True)
class RunSpec:
    """What one run trains on, writes and rewards with.

    cfg: the `train` settings (a raw section is validated here, train.config.settings; a Train is kept as it
    is). work_dir holds the checkpoints, state/ (live metrics) and audit/, kept across reruns so a killed run
    resumes; adapter_dir and metrics_path are the outputs, written once the run is complete. run_name: TRL's
    run name, verl's experiment name (None: TRL's default, verl's "llmrnn"). reward_func: --reward-func's
    RewardFunction: TRL calls its function, verl compute_score of the same module (default llmrnn.reward's). reward_kwargs: the reward's arguments (llmrnn.reward.kwargs; None: the
    audit dir under work_dir and endpoint_file). custom: your own reward {"path", "name"} (reward.custom),
    called instead of reward_func under its contract (llmrnn.reward.custom); reward_kwargs' reward_cfg must
    name it. endpoint_file: the judge's endpoint.json (None: no judge). tracked_config: the config the
    trackers log with the run (train.report_to; TRL's callbacks, verl logs its own)."""

    cfg: Train
    train_parquet: str | os.PathLike
    val_parquet: str | os.PathLike | None
    model_dir: str | os.PathLike
    work_dir: str | os.PathLike
    adapter_dir: str | os.PathLike
    metrics_path: str | os.PathLike
    run_name: str | None = None
    reward_func: RewardFunction = BUILTIN_REWARD
    reward_kwargs: dict | None = None
    custom: dict | None = None
    endpoint_file: str | None = None
    tracked_config: dict | None = None

    def __post_init__(self) -> None:
        object.__setattr__(self, "cfg", tcfg.settings(self.cfg))  # frozen: the one validation, at creation

    @property
    def reward(self) -> RewardFunction:
        """The reward this run calls: your own (reward.custom) where set, else reward_func; what the
        checkpoint fingerprint and job_code name as the reward."""
        return RewardFunction.custom(self.custom) if self.custom else self.reward_func
