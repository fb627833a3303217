"""`llmrnn check`: your own reward (reward.custom) before anything is queued."""

from __future__ import annotations

from llmrnn.check.skips import unused
from llmrnn.reward.custom import problem


def check_custom_reward(config: dict) -> list[str]:
    """reward.custom: the file exists, defines the name, and its signature is verl's (one line when not)."""
    if not (((config.get("reward") or {}).get("custom") or {}).get("path")):
        unused("no reward.custom.path")
        return []
    found = problem(config)
    return [found] if found else []
