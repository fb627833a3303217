"""Training: batch geometry, the verl command composed against the installed verl config, attention."""

from __future__ import annotations

import importlib.util
import logging
from pathlib import Path

from llmrnn.check.gpus import SDM_ENV, deployment_method
from llmrnn.check.skips import skip
from llmrnn.check.slurm import check_profile_gpus
from llmrnn.errors import LlmrnnError
from llmrnn.plan.recipe import RECIPES
from llmrnn.reward.function import BUILTIN_REWARD, RewardFunction
from llmrnn.settings.train import Train
from llmrnn.train import config as tcfg
from llmrnn.train import verl_overrides
from llmrnn.train.tracking import report_to, tracker_problems

log = logging.getLogger(__name__)


def check_training(config: dict) -> list[str]:
    """Batch geometry (Train.geometry) and, for verl, the command composed against the
    installed verl config (when verl is importable here)."""
    if "train" not in config:
        return []

    try:
        cfg = tcfg.settings(config["train"])
        problems = [f"train: {p}" for p in cfg.geometry.problems]
    except LlmrnnError as exc:
        return [f"train: {exc}"]
    problems += check_trackers(cfg)
    if cfg.engine == "verl":
        # the recipe's reward module (the qa recipe's: llmrnn.qa.rewards, compute_score of the same signature)
        recipe = RECIPES.get(config.get("recipe"))
        problems += check_verl_command(cfg, recipe.reward_function if recipe else BUILTIN_REWARD)
        problems += check_profile_gpus(config, cfg)
        problems += check_attention(cfg)
        problems += check_lora_dropout(cfg)
    return problems


def check_lora_dropout(train_cfg: Train) -> list[str]:
    """verl (0.7.1 and 0.9.1) builds the actor's LoraConfig from model.lora_rank, lora_alpha, target_modules
    (and exclude_modules) only (fsdp_workers.py): it has no override for LoRA dropout, so a nonzero
    train.lora.dropout would be silently ignored. Refuse it: the run trains what the config says or not at all."""
    dropout = train_cfg.lora.dropout
    if dropout == 0.0:
        return []
    return [(f"train.lora.dropout: {dropout} under train.engine verl, which builds its LoRA without dropout (verl has "
            "no setting for it) and would ignore it; set 0.0, or use train.engine trl, which applies it")]


def check_trackers(train_cfg: Train) -> list[str]:
    """train.report_to, for either engine (both import the trackers in the Python that runs the job: TRL in
    the training process, verl in main_ppo): tracking.tracker_problems in this environment, which is the
    jobs' own unless a software-deployment method brings another (then skipped: the job's own start refuses a
    missing tracker in one line, llmrnn.train.tracking.prepare)."""
    if not report_to(train_cfg):
        return []
    if sdm := deployment_method():
        skip(f"train.report_to's trackers in the jobs' own environments ({SDM_ENV}={' '.join(sdm)})")
        return []
    return tracker_problems(train_cfg)


def check_attention(train_cfg: Train) -> list[str]:
    """flash_attention_2 (and the remove-padding it turns on) imports flash-attn in verl's actor: refuse
    it where flash-attn is not importable (the GPU lock does not carry it: a CUDA source build)."""
    if train_cfg.verl.attn_implementation != "flash_attention_2" or importlib.util.find_spec("flash_attn"):
        return []
    return [("train.verl.attn_implementation: flash_attention_2 needs the flash-attn package, which is not "
             "importable here (envs/gpu-lock.txt leaves it out); use sdpa (the default) or install flash-attn")]


def check_verl_command(cfg: Train, reward: RewardFunction = BUILTIN_REWARD) -> list[str]:
    try:
        import verl  # noqa: F401
    except Exception:  # noqa: BLE001 - not installed, or an install whose import fails
        log.info("check: verl not importable here; the verl command is checked by preflight on the GPU node")
        skip("the verl command (verl not importable here; preflight composes it on the GPU node)")
        return []

    try:
        overrides = verl_overrides.build_overrides(
            cfg, train_parquet="train.parquet", val_parquet="val.parquet", model_dir="model",
            out_dir="out", experiment_name="check",
            reward_path=reward.verl_path,
        )
    except LlmrnnError as exc:
        return [f"train (verl command): {exc}"]
    return compose_verl(overrides)


def compose_verl(overrides: list[str]) -> list[str]:
    """Compose verl's ppo_trainer config with the overrides (Hydra rejects unknown keys)."""
    try:
        import verl
        from hydra import compose, initialize_config_dir
        from hydra.core.global_hydra import GlobalHydra
    except ImportError as exc:
        return [f"train (verl command): cannot import hydra/verl to compose it: {exc}"]
    config_dir = str(Path(verl.__file__).parent / "trainer" / "config")
    GlobalHydra.instance().clear()
    try:
        with initialize_config_dir(config_dir=config_dir, version_base=None):
            compose(config_name="ppo_trainer", overrides=overrides)
    except Exception as exc:  # noqa: BLE001 - Hydra raises several types; each is a config problem
        first = (str(exc).strip().splitlines() or [type(exc).__name__])[0][:300]
        return [f"train (verl {getattr(verl, '__version__', '?')} command): {first}"]
    finally:
        GlobalHydra.instance().clear()
    return []
