"""`llmrnn check`: your own reward (reward.custom) before anything is queued."""

from __future__ import annotations


def check_custom_reward(config: dict) -> list[str]:
    """reward.custom: the file exists, defines the name, and its signature is verl's (one line when not)."""
    from llmrnn.reward.custom import problem

    found = problem(config)
    return [found] if found else []
