"""Your own reward: config `reward.custom: {path: my_reward.py, name: compute_score}`.

The function has verl's signature, `compute_score(data_source, solution_str, ground_truth, extra_info,
**kwargs)`, and returns a number or a dict with "score". verl calls it directly
(reward.custom_reward_function.path/name); TRL calls `trl_reward(fn)`, which scores each completion the
same way. It replaces the judge's scorer (no judge server is planned). `llmrnn check` refuses a missing
file, an undefined name or another signature with one line (`problem`); preflight scores a few real rows
with it and refuses a score that is not a finite number (`score_of`). Its file's content is hashed into the
rules' `code` param and the checkpoint fingerprint (llmrnn.provenance.code_identity).
"""

from __future__ import annotations

import importlib.util
import inspect
import math
from collections.abc import Callable
from pathlib import Path
from typing import Any

from llmrnn.constants import DATA_SOURCE
from llmrnn.errors import InputError
from llmrnn.reward.config import CUSTOM_NAME, RewardConfig, settings
from llmrnn.reward.entry import _completion_text

PARAMETERS = ("data_source", "solution_str", "ground_truth", "extra_info")
SIGNATURE = "(data_source, solution_str, ground_truth, extra_info, **kwargs)"


def custom_of(reward: Any) -> dict | None:
    """{"path", "name"} of config section `reward` (or the whole config), None when no own reward is set."""
    reward = settings(reward, "reward")
    custom = reward.get("custom") if isinstance(reward.get("custom"), dict) else None
    if not custom:  # also a section of another recipe (qa.reward): only its `custom` key is read here
        return None
    return RewardConfig.from_any({"custom": custom}).custom_reward


def code_files(config: dict) -> list[str]:
    """The own reward's file, for a rule's code_hash(...) (empty without one)."""
    custom = custom_of((config or {}).get("reward"))
    return [str(custom["path"])] if custom else []


def _load(path: str, name: str) -> Any:
    file = Path(path)
    if not file.is_file():
        raise InputError(f"reward.custom.path: {path}: no such file")
    spec = importlib.util.spec_from_file_location(f"llmrnn_custom_reward_{file.stem}", file)
    if spec is None or spec.loader is None:
        raise InputError(f"reward.custom.path: {path}: not a Python file")
    module = importlib.util.module_from_spec(spec)
    try:
        spec.loader.exec_module(module)
    except Exception as exc:
        raise InputError(f"reward.custom.path: {path}: importing it failed: {type(exc).__name__}: {exc}") from exc
    if not hasattr(module, name):
        raise InputError(f"reward.custom.name: {path} defines no {name!r}")
    return getattr(module, name)


def signature_problem(fn: Any) -> str | None:
    """Why `fn` cannot be called as verl calls a reward, or None."""
    if not callable(fn):
        return "is not callable"
    try:
        params = inspect.signature(fn).parameters
    except (TypeError, ValueError):
        return "has no inspectable signature"
    by_keyword = {n for n, p in params.items() if p.kind in (p.POSITIONAL_OR_KEYWORD, p.KEYWORD_ONLY)}
    missing = [n for n in PARAMETERS if n not in by_keyword]
    if missing or not any(p.kind == p.VAR_KEYWORD for p in params.values()):
        return f"has signature {inspect.signature(fn)}; verl calls {SIGNATURE}" + (
            f" (missing {', '.join(missing)})" if missing else " (no **kwargs)")
    return None


def load(path: str, name: str = CUSTOM_NAME) -> Callable:
    """The own reward function, or InputError in one line: no file, no such name, another signature."""
    fn = _load(path, name)
    problem = signature_problem(fn)
    if problem:
        raise InputError(f"reward.custom: {path}:{name} {problem}")
    return fn


def problem(config: dict) -> str | None:
    """`llmrnn check`'s line for the config's own reward (None: none set, or it loads with verl's signature)."""
    try:
        custom = custom_of((config or {}).get("reward"))
        if custom:
            load(custom["path"], custom["name"])
    except InputError as exc:
        return str(exc)
    return None


def score_of(result: Any, where: str) -> float:
    """The reward a call returned (a number or {"score": number}) as a finite float, else one line."""
    value = result.get("score") if isinstance(result, dict) else result
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(float(value)):
        raise InputError(f"reward.custom: {where} returned {value!r}; expected a finite number or "
                         "a dict with a finite 'score'")
    return float(value)


def trl_reward(fn: Callable, name: str = CUSTOM_NAME) -> Callable:
    """TRL's batch reward function over a per-sample verl reward: the parquet's reward_model.ground_truth,
    extra_info and data_source columns become its arguments; every other keyword TRL or `train run` passes
    (the reward settings among them) goes on as **kwargs."""

    def reward(prompts: list, completions: list, **columns) -> list[float]:
        n = len(completions)
        reward_model = columns.pop("reward_model", None) or [None] * n
        extra = columns.pop("extra_info", None) or [{}] * n
        sources = columns.pop("data_source", None) or [DATA_SOURCE] * n
        out = []
        for completion, rm, source, info in zip(completions, reward_model, sources, extra):
            gt = rm.get("ground_truth") if isinstance(rm, dict) else rm
            result = fn(data_source=source, solution_str=_completion_text(completion), ground_truth=gt,
                        extra_info=info or {}, **columns)
            out.append(score_of(result, name))
        return out

    reward.__name__ = name
    return reward
