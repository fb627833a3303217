"""Config section `reward`: its settings (RewardConfig), the one parser of settings that arrive as arguments
(a mapping, or a JSON string: how verl's reward_kwargs and TRL's reward-function arguments carry them), and
who asks the judge."""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import dataclass, field, fields
from typing import Any

from llmrnn.errors import InputError
from llmrnn.settings import section_defaults

STOP_REASON_FILE = "stop_reason.txt"  # in the audit dir: why the reward stopped training (read by train)
CUSTOM_NAME = "compute_score"  # reward.custom.name's default: verl's name for a reward function


def settings(value: Any, what: str) -> dict:
    """Settings given to a scorer as an argument, as a plain dict: a mapping (TRL's keyword arguments,
    an OmegaConf DictConfig from verl's reward_kwargs) or its JSON text; None or "" is {}. The one idiom
    every reward (llmrnn.reward, llmrnn.qa.rewards) reads its settings with."""
    if value is None or value == "":
        return {}
    if isinstance(value, str):
        try:
            value = json.loads(value)
        except json.JSONDecodeError as exc:
            raise InputError(f"{what}: settings are not JSON: {exc}") from exc
    if not isinstance(value, Mapping):
        raise InputError(f"{what}: settings must be a mapping, got {type(value).__name__}")
    return {str(k): (dict(v) if isinstance(v, Mapping) else v) for k, v in value.items()}


MODES = ("scalar", "pairwise", "outcome")
OPPONENTS = ("group", "reference")


@dataclass(frozen=True)
class RewardConfig:
    """Config section `reward` (documented in docs/configuration.md; schema defaults match these)."""

    mode: str = "scalar"
    pairwise_opponent: str = "group"
    outcome_epsilon: float = 0.0
    invalid_json_score: float = 0.05
    max_concurrency: int = 64
    retries: int = 4
    backoff_s: float = 0.5
    backoff_max_s: float = 8.0
    timeout_s: float = 300.0
    health_timeout_s: float = 900.0
    cache_size: int = 4096
    call_budget_s: float = 900.0  # one judge call, every try and wait together
    dead_after_s: float = 30.0  # a judge that is certainly gone (dead pid, refused port) fails the wait then
    stall_s: float = 120.0  # a judge that stops answering while calls wait on it fails them all then
    # your own reward (llmrnn.reward.custom): {"path": file.py or None (the built-in reward), "name": function}
    custom: dict = field(default_factory=lambda: section_defaults("reward.custom"))

    @classmethod
    def from_any(cls, value: Any) -> RewardConfig:
        if isinstance(value, RewardConfig):
            return value
        value = settings(value, "reward")
        value = value.get("reward", value)  # accept {"reward": {...}} (cfg_json) or the section itself
        allowed = {f.name for f in fields(cls)}
        unknown = set(value) - allowed
        if unknown:
            raise InputError(f"reward: unknown key(s) {sorted(unknown)}; allowed: {sorted(allowed)}")
        if value.get("custom") is not None:
            custom = settings(value["custom"], "reward.custom")
            value = {**value, "custom": {"path": custom.get("path") or None, "name": custom.get("name") or CUSTOM_NAME,
                                         **{k: custom[k] for k in ("timeout_s", "max_abs") if custom.get(k) is not None}}}
        cfg = cls(**value)
        if cfg.mode not in MODES:
            raise InputError(f"reward.mode: {cfg.mode!r} is not one of {', '.join(MODES)}")
        if cfg.pairwise_opponent not in OPPONENTS:
            raise InputError(f"reward.pairwise_opponent: {cfg.pairwise_opponent!r} is not one of group, reference")
        return cfg

    @property
    def judged(self) -> bool:
        """Scalar and pairwise modes ask the judge; outcome mode scores the memory's recall alone, and your
        own reward (reward.custom) replaces the judge's scorer."""
        return self.mode != "outcome" and self.custom_reward is None

    @property
    def custom_reward(self) -> dict | None:
        """{"path", "name"} of your own reward, None when reward.custom.path is not set."""
        return dict(self.custom) if (self.custom or {}).get("path") else None


# The settings that bound every wait on the judge (health, each call, the whole call, a gone judge): what
# any command that asks the judge gets from config section `reward` (`qa judge` too, whatever the mode).
JUDGE_WAIT_KEYS = ("max_concurrency", "retries", "backoff_s", "backoff_max_s", "timeout_s", "health_timeout_s",
                   "call_budget_s", "dead_after_s", "stall_s")


def judge_wait_cfg(reward: Any) -> dict:
    """The JUDGE_WAIT_KEYS of config section `reward` (absent keys keep RewardConfig's defaults)."""
    return {k: v for k, v in settings(reward, "reward").items() if k in JUDGE_WAIT_KEYS}


NO_JUDGE = "reward.mode outcome asks no judge"  # why preflight and training run without an endpoint


def asks_judge(config: dict) -> bool:
    """Whether a workflow config's reward needs the judge server (llmrnn.plan plans judge_server,
    and preflight/train take its endpoint, only then): recipe qa when its judge weight is on, the memory
    head unless reward.mode is outcome. The one place that decides it for the rules and `llmrnn check`."""
    if config.get("recipe") == "qa":
        return bool((((config.get("qa") or {}).get("reward") or {}).get("weights") or {}).get("judge"))
    return RewardConfig.from_any(config.get("reward") or {}).judged


def missing_endpoint(mode: str, how: str) -> InputError:
    """The one line for a judged reward mode given no endpoint (`how`: where the caller names it)."""
    return InputError(f"reward.mode {mode} asks the judge but no judge endpoint was given: {how} "
                      "(RUN/judge/endpoint.json; reward.mode outcome needs none)")

