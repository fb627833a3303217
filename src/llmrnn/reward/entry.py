"""The reward's entry points, one scorer behind them (llmrnn.reward.scorer):

- `compute_score(data_source, solution_str, ground_truth, extra_info, **kw)`: verl's per-sample
  signature (verl calls it with reward.custom_reward_function.reward_kwargs as **kw); returns a dict with
  "score" and diagnostics (parse_method, judge_latency_s, retries, ...).
- `compute_score_batch(data_sources, solution_strs, ground_truths, extra_infos, **kw)`: verl's batch
  reward manager signature; scores concurrently, pairwise within groups possible.
- `trl_reward_func(prompts, completions, **columns)`: TRL's batch reward function (same scorer); `train run`
  hands it the same settings as keyword arguments (functools.partial).
"""

from __future__ import annotations

import json
import math
from typing import Any

from llmrnn.constants import DATA_SOURCE
from llmrnn.errors import InputError
from llmrnn.reward.guard import fallback_rate
from llmrnn.reward.kwargs import ARG_KEYS
from llmrnn.reward.scorer import Scorer, get_scorer


def _scorer_from(kwargs: dict) -> Scorer:
    return get_scorer(kwargs.pop("endpoint_file", None), kwargs.pop("rubric_file", None),
                      kwargs.pop("audit_dir", None), kwargs.pop("reward_cfg", None), kwargs.pop("guard", None))


# The keys compute_score returns, in this order, on EVERY path (judged, invalid JSON, judge fallback, pairwise,
# outcome): verl 0.7.1 builds a worker's reward extras from its first sample's keys (AgentLoopWorker._postprocess)
# and asserts equal `reward_extra_keys` when it concatenates the workers' chunks (DataProto.concat), so a key
# present on one path only crashes a batch that mixes paths. A diagnostic a path has no value for gets NEUTRAL's.
PUBLIC_KEYS = ("score", "judge_score", "outcome", "parse_method", "valid_json", "judge_latency_s", "retries",
               "judge_calls", "cache_hits", "raw_score", "truncated_calls")
NEUTRAL = {"raw_score": None, "truncated_calls": 0}  # no judge answer: no raw number, none cut off
PARSE_FLAGS = ("expected", "score_line", "short_digit", "fallback", "invalid_json", "pairwise", "outcome")


def _public(result: dict, numeric_only: bool) -> dict:
    out = {k: result.get(k, NEUTRAL.get(k)) for k in PUBLIC_KEYS}
    if out.get("judge_score") is None:
        out["judge_score"] = out["score"]
    if numeric_only:  # verl averages and dumps every extra key: floats only, the method encoded as flags
        method = out.pop("parse_method")
        out.pop("raw_score", None)
        for m in PARSE_FLAGS:
            out[f"parse_{m}"] = float(method == m)
        return verl_values(out, "llmrnn.reward.compute_score")
    return out


def compute_score(data_source: str, solution_str: str, ground_truth: Any, extra_info: dict | None = None,
                  **kwargs) -> dict:
    """verl's per-sample reward (pairwise mode compares with the row's reference memory h_ref)."""
    numeric_only = bool(kwargs.pop("numeric_only", False))
    scorer = _scorer_from(kwargs)
    sample = {"data_source": data_source, "solution_str": solution_str, "ground_truth": ground_truth,
              "extra_info": extra_info or {}}
    return _public(scorer.score_samples([sample], opponent="reference")[0], numeric_only)


def _group_key(extra_info: Any, ground_truth: Any) -> str:
    if isinstance(extra_info, dict) and extra_info.get("index") is not None:
        return f"{extra_info.get('split')}:{extra_info['index']}"
    return str(hash(ground_truth if isinstance(ground_truth, str) else json.dumps(ground_truth, sort_keys=True)))


def compute_score_batch(data_sources: list, solution_strs: list, ground_truths: list, extra_infos: list,
                        **kwargs) -> list[dict]:
    """verl's batch reward manager signature: all judge calls of the batch run concurrently; in pairwise
    mode with pairwise_opponent: group, candidates of the same row compete with each other."""
    numeric_only = bool(kwargs.pop("numeric_only", False))
    scorer = _scorer_from(kwargs)
    samples = [
        {"data_source": ds, "solution_str": sol, "ground_truth": gt, "extra_info": ei or {},
         "group": _group_key(ei, gt)}
        for ds, sol, gt, ei in zip(data_sources, solution_strs, ground_truths, extra_infos)
    ]
    results = scorer.score_samples(samples, opponent=scorer.cfg.pairwise_opponent)
    return [_public(r, numeric_only) for r in results]


def _completion_text(completion: Any) -> str:
    if isinstance(completion, str):
        return completion
    if isinstance(completion, list) and completion and isinstance(completion[-1], dict):
        return completion[-1].get("content") or ""
    if isinstance(completion, dict):
        return completion.get("content") or ""
    return str(completion)


def trl_reward_func(prompts: list, completions: list, **columns) -> list[float]:
    """TRL GRPOTrainer reward function: dataset columns (reward_model, extra_info, data_source) arrive
    as keyword lists; groups are the rows' generations (pairwise_opponent: group compares within them).
    The batch's judge fallback rate goes to TRL's `log_metric` (metrics.jsonl `judge_fallback_rate`)."""
    n = len(completions)
    reward_model = columns.get("reward_model") or [None] * n
    ground_truths = [rm.get("ground_truth") if isinstance(rm, dict) else rm for rm in reward_model]
    if any(gt is None for gt in ground_truths):
        raise InputError("trl_reward_func: column reward_model.ground_truth missing (verl parquet format)")
    extra = columns.get("extra_info") or [{} for _ in range(n)]
    sources = columns.get("data_source") or [DATA_SOURCE] * n
    kw = {k: columns[k] for k in ARG_KEYS if k in columns and k != "numeric_only"}
    results = compute_score_batch(sources, [_completion_text(c) for c in completions], ground_truths, extra, **kw)
    rate = fallback_rate(results)
    if rate is not None and callable(columns.get("log_metric")):  # TRL >= 1.x hands reward functions a logger
        columns["log_metric"]("judge_fallback_rate", rate)
    return [float(r["score"]) for r in results]


def verl_values(result: dict, where: str) -> dict[str, float]:
    """A reward's dict as verl carries it: every value a Python float. verl packs each key across the batch
    with np.array (ints become int64, bools bool_), averages them into the step's metrics and, with
    trainer.rollout_data_dir set, json.dumps them into the rollout dump: verl 0.7.1's _dump_generations has
    no default= and fails on int64 at the end of every step. Our rewards return this under numeric_only
    (the flag train run gives verl); a value that is not a finite real number is our bug: one line, here."""
    out: dict[str, float] = {}
    for key, value in result.items():
        if isinstance(value, bool):
            value = float(value)
        if not isinstance(value, (int, float)) or not math.isfinite(float(value)):
            raise ValueError(f"{where}: {key}={value!r} is not a finite number (verl averages and dumps it)")
        out[key] = float(value)
    return out
