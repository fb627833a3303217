"""`llmrnn check`: your own reward (reward.custom) before anything is queued."""

from __future__ import annotations

from llmrnn.check.skips import unused
from llmrnn.reward.custom import problem

# `check` answers in seconds: it waits this long for your reward's import (in its child, which is then killed
# with all it started), or reward.custom.timeout_s where that is shorter; training waits timeout_s
CHECK_IMPORT_S = 20.0


def check_custom_reward(config: dict) -> list[str]:
    """reward.custom: the file exists, imports within CHECK_IMPORT_S, defines the name, and its signature is
    verl's (one line when not)."""
    if not (((config.get("reward") or {}).get("custom") or {}).get("path")):
        unused("no reward.custom.path")
        return []
    found = problem(config, CHECK_IMPORT_S,
                    "llmrnn check's limit on the import; training waits reward.custom.timeout_s")
    return [found] if found else []
