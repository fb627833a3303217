"""Config section `reward`: its settings model (llmrnn.settings.Reward) read from any form, the one parser
of settings that arrive as arguments (a mapping, or a JSON string: how verl's reward_kwargs and TRL's reward-function arguments carry them), and
who asks the judge."""

from __future__ import annotations

import json
from collections.abc import Mapping
from typing import Any

from llmrnn.errors import InputError
from llmrnn.reward.modes import reward_mode
from llmrnn.settings import Reward, section_defaults
from llmrnn.settings.base import parse

STOP_REASON_FILE = "stop_reason.txt"  # in the audit dir: why the reward stopped training (read by train)
CUSTOM_NAME = section_defaults("reward.custom")["name"]  # verl's name for a reward function


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


def reward_settings(value: Any) -> Reward:
    """Config section `reward` as its settings model (llmrnn.settings.Reward), from the model itself, a
    mapping or its JSON (also {"reward": {...}}: a cfg_json). An empty reward.custom.path or name is unset."""
    if isinstance(value, Reward):
        return value
    value = settings(value, "reward")
    value = value.get("reward", value)
    if value.get("custom") is not None:
        custom = settings(value["custom"], "reward.custom")
        value = {**value, "custom": {k: v for k, v in custom.items() if v is not None and v != ""}}
    return parse(Reward, value, "reward")


# The settings that bound every wait on the judge (health, each call, the whole call, a gone judge): what
# any command that asks the judge gets from config section `reward` (`qa judge` too, whatever the mode).
JUDGE_WAIT_KEYS = ("max_concurrency", "retries", "backoff_s", "backoff_max_s", "timeout_s", "health_timeout_s",
                   "call_budget_s", "dead_after_s", "stall_s")


def judge_wait_cfg(reward: Any) -> dict:
    """The JUDGE_WAIT_KEYS of config section `reward` (absent keys keep the settings' defaults)."""
    return {k: v for k, v in settings(reward, "reward").items() if k in JUDGE_WAIT_KEYS}


def asks_judge(config: dict) -> bool:
    """Whether a workflow config's reward needs the judge server (llmrnn.plan plans judge_server,
    and preflight/train take its endpoint, only then): recipe qa when its judge weight is on, the memory
    head when its reward mode asks one (llmrnn.reward.modes). The one place that decides it for the rules and
    `llmrnn check`."""
    if config.get("recipe") == "qa":
        return bool((((config.get("qa") or {}).get("reward") or {}).get("weights") or {}).get("judge"))
    return reward_mode(reward_settings(config.get("reward") or {})).asks_judge

