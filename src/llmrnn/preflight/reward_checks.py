"""The reward checks: the fixed candidates of K rows scored by the judge (judge_checks), the outcome
reward (outcome_checks) or your own reward (custom_checks), with the problems that stop training."""

from __future__ import annotations

import logging
import math
import time
from collections import Counter

from llmrnn import io
from llmrnn.errors import InputError
from llmrnn.preflight.rows import CANDIDATES, EMPTY_MEMORY, _as_policy_output
from llmrnn.reward.custom import open_custom
from llmrnn.settings.evaluation import Preflight
from llmrnn.stats import percentile

log = logging.getLogger(__name__)


def _score_references(scorer, rows: list[dict]) -> tuple[list[dict], float]:
    """Score the fixed candidates (CANDIDATES) of every row; (results in row order, seconds)."""
    samples = []
    for r in rows:
        for which in CANDIDATES:
            memory = EMPTY_MEMORY if which == "empty" else _as_policy_output(r["step"].get(which))
            samples.append({"data_source": r["data_source"], "solution_str": memory,
                            "ground_truth": r["ground_truth"], "extra_info": dict(r["extra_info"], candidate=which),
                            "group": r["index"]})
    t0 = time.perf_counter()
    results = scorer.score_samples(samples, opponent=scorer.mode.reference_opponent)
    return results, time.perf_counter() - t0


def _reward_stats(scorer, rows: list[dict], results: list[dict], elapsed: float) -> tuple[dict, list[str]]:
    """What any reward mode reports about the reference candidates' rewards, and the problem of no
    candidate being a memory at all (the spread problem is _spread_problem's)."""
    methods = Counter(r["parse_method"] for r in results)
    rewards = [float(r["score"]) for r in results]
    distinct = sorted({round(x, 4) for x in rewards})
    mean = sum(rewards) / len(rewards)
    std = math.sqrt(sum((x - mean) ** 2 for x in rewards) / len(rewards))
    k = len(CANDIDATES)
    spread_rows = sum(
        1 for i in range(0, len(results), k) if len({round(r["score"], 4) for r in results[i:i + k]}) > 1
    )
    stats = {
        "mode": scorer.cfg.mode,
        "rows": len(rows),
        "candidates_per_row": list(CANDIDATES),
        "candidates": len(results),
        "invalid_json": methods.get("invalid_json", 0),
        "parse_methods": dict(sorted(methods.items())),
        "reward": {"mean": mean, "std": std, "min": min(rewards), "max": max(rewards),
                   "distinct": len(distinct), "values": distinct[:50]},
        "rows_with_spread": spread_rows,
        "elapsed_s": elapsed,
        "audit": str(scorer.audit.path),
    }
    problems = []
    if not any(r["valid_json"] for r in results):
        problems.append(f"none of the {len(results)} trajectory memories parsed as {{\"evolving_summary\": ...}} "
                        f"JSON, {scorer.mode.unparsed_consequence}; check the trajectories' h_ref/h_prev")
    return stats, problems


def _spread_problem(stats: dict, cfg: Preflight) -> list[str]:
    reward = stats["reward"]
    if reward["distinct"] >= cfg.min_distinct_rewards:
        return []
    return [(
        f"the reward is (nearly) constant: {reward['distinct']} distinct value(s) {reward['values'][:5]} over "
        f"{stats['candidates']} candidates (preflight.min_distinct_rewards {cfg.min_distinct_rewards}); GRPO "
        "learns nothing from equal rewards within a group"
    )]


def outcome_checks(scorer, rows: list[dict], cfg: Preflight) -> tuple[dict, list[str]]:
    """A reward mode that asks no judge (reward.mode outcome): the reference candidates' rewards and their
    spread; the judge keys (fallback rate, latency, calls) say there was none."""
    results, elapsed = _score_references(scorer, rows)
    stats, problems = _reward_stats(scorer, rows, results, elapsed)
    report = {"skipped": scorer.mode.no_judge_note, **stats, "judged": 0, "fallback_rate": None,
              "truncated_before_score": 0, "latency_s": {"p50": None, "p95": None}, "http_calls": 0,
              "cache_hits": 0}
    return report, problems + _spread_problem(stats, cfg)


def judge_checks(scorer, rows: list[dict], cfg: Preflight) -> tuple[dict, list[str]]:
    """Score the candidates of every row with the judge; return (judge report, problems)."""
    results, elapsed = _score_references(scorer, rows)
    stats, problems = _reward_stats(scorer, rows, results, elapsed)
    judged = [r for r in results if r["valid_json"]]
    fallbacks = stats["parse_methods"].get("fallback", 0)
    fallback_rate = fallbacks / len(judged) if judged else None
    latencies = [r["judge_latency_s"] for r in results if r["judge_calls"] and not r["cache_hits"]]
    truncated = sum(r.get("truncated_calls", 0) for r in results)
    report = {
        "rubric": scorer.rubric.path,
        "judge_model": scorer.endpoint.model,
        "engine": scorer.endpoint.engine,
        "score_method": scorer.rubric.request.score_method,
        **stats,
        "judged": len(judged),
        "fallback_rate": fallback_rate,
        "truncated_before_score": truncated,
        "latency_s": {"p50": percentile(latencies, 50), "p95": percentile(latencies, 95)},
        "http_calls": scorer.counts["http_calls"],
        "cache_hits": scorer.counts["cache_hits"],
    }
    if fallback_rate is not None and fallback_rate > cfg.max_fallback_rate:
        sample = next((r for r in results if r["parse_method"] == "fallback"), None)
        example = ""
        if sample is not None:
            example = f"; e.g. it answered {_first_answer(scorer, sample)!r}"
        problems.append(
            f"the judge does not follow the score format: {fallbacks}/{len(judged)} answers "
            f"({fallback_rate:.0%}) had no parseable score and fell back to 0.5 "
            f"(preflight.max_fallback_rate {cfg.max_fallback_rate:.0%}){example}; fix the rubric's template/"
            f"assistant_prefix or the judge model ({scorer.rubric.path}); full answers in {scorer.audit.path}"
        )
    if truncated:
        req = scorer.rubric.request
        limit = scorer.mode.max_tokens(scorer.rubric)
        problems.append(
            f"{truncated} judge answer(s) hit max_tokens={limit} before giving a score (finish_reason "
            f"'length'; api: {req.api}): a judge that thinks aloud first needs a higher max_tokens, or "
            f"`request.api: completions` with a raw prompt ({scorer.rubric.path}); answers in {scorer.audit.path}"
        )
    return report, problems + _spread_problem(stats, cfg)


def _pct(x: float | None) -> str:
    return "-" if x is None else f"{x:.0%}"


def _first_answer(scorer, result: dict) -> str:
    """The judge's answer for a result, read back from the audit record's cache (short)."""
    del result
    path = scorer.audit.path
    try:
        records = io.read_jsonl(path, skip_bad=True)
    except OSError:
        return "?"
    for rec in records:
        if rec.get("parse_method") == "fallback" and rec.get("judge"):
            return rec["judge"][0]["response"][:80]
    return "?"


def custom_checks(custom: dict, rows: list[dict], cfg: Preflight,
                  kwargs: dict | None = None) -> tuple[dict, list[str], list[str]]:
    """Your own reward (reward.custom) on the fixed candidates of real rows, called as verl calls it (with
    `kwargs`, the reward settings training passes as reward_kwargs): every
    score must be a finite number (else one problem naming the row and candidate); the spread of the
    scores is reported like the outcome reward's."""
    where = f"{custom['path']}:{custom['name']}"
    scores, problems = [], []
    t0 = time.perf_counter()
    # the same contract as check, TRL and verl: its child process, time limits, one conversion; a reward that
    # does not load (no file, wrong signature, an import that fails or hangs) stops preflight in one line
    fn = open_custom(custom)
    for r in rows:
        for which in CANDIDATES:
            text = EMPTY_MEMORY if which == "empty" else _as_policy_output(r["step"].get(which))
            try:
                scores.append(fn(f"row {r['index']} ({which})", data_source=r["data_source"], solution_str=text,
                                 ground_truth=r["ground_truth"], extra_info=dict(r["extra_info"], candidate=which),
                                 **(kwargs or {})))
            except InputError as exc:  # whatever the user's code did, already one line
                problems.append(str(exc))
                break
        if problems:
            break
    fn.close()
    elapsed = time.perf_counter() - t0
    distinct = sorted({round(x, 4) for x in scores})
    mean = sum(scores) / len(scores) if scores else None
    report = {"skipped": "reward.custom asks no judge", "custom": where, "rows": len(rows),
              "candidates_per_row": list(CANDIDATES), "candidates": len(scores),
              "reward": {"mean": mean, "min": min(scores, default=None), "max": max(scores, default=None),
                         "distinct": len(distinct), "values": distinct[:50]},
              "judged": 0, "fallback_rate": None, "latency_s": {"p50": None, "p95": None}, "elapsed_s": elapsed,
              "parse_methods": {}, "mode": "custom"}
    spread = [] if problems else _spread_problem({"reward": report["reward"], "candidates": len(scores)}, cfg)
    return report, problems, spread
