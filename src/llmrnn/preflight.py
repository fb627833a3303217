"""Stage `preflight`: prove the real judge follows the score format before any GPU hour is spent.

`llmrnn preflight run` scores K rows of the train parquet with the real judge (through the same
llmrnn.reward scorer training uses), three candidates per row: the row's reference memory h_ref, its
previous memory h_prev and an empty memory (different memories of the same patient: GRPO only learns
when the judge tells such candidates apart; a small base model often leaves h_ref == h_prev, the empty
memory keeps a contrast). It writes RUN/train/preflight.json:

    {"ok": bool, "problems": [str], "warnings": [str],
     "judge": {"rows", "calls", "parse_methods": {...}, "fallback_rate", "reward": {mean, std, min, max,
               distinct, values}, "rows_with_spread", "latency_s": {p50, p95}, ...},
     "training": {...}}

Judge problems: a fallback rate above `preflight.max_fallback_rate` (the judge is not printing a
score: the reference authors saw most scalar-coerced rewards fall back to 0.5) or fewer than
`preflight.min_distinct_rewards` distinct rewards (a constant reward trains nothing). With
`preflight.on_problem: fail` they stop the DAG with one line saying why; `warn` records them as
warnings. The training part comes from `llmrnn.train.preflight.training_checks(...)` when that
module exists (owned by the train stage); its problems always count.
"""

from __future__ import annotations

import importlib
import inspect
import json
import logging
import math
import time
from collections import Counter
from dataclasses import dataclass, fields
from pathlib import Path
from typing import Any

from llmrnn import io
from llmrnn.errors import CheckFailed, InputError

log = logging.getLogger(__name__)


CANDIDATES = ("h_ref", "h_prev", "empty")
EMPTY_MEMORY = json.dumps({"evolving_summary": ""})


@dataclass(frozen=True)
class PreflightConfig:
    """Config section `preflight` (config/README.md)."""

    rows: int = 8
    seed: int = 0
    max_fallback_rate: float = 0.25
    min_distinct_rewards: int = 3
    on_problem: str = "fail"  # fail | warn

    @classmethod
    def from_dict(cls, value: dict | None) -> PreflightConfig:
        value = dict(value or {})
        allowed = {f.name for f in fields(cls)}
        unknown = set(value) - allowed
        if unknown:
            raise InputError(f"preflight: unknown key(s) {sorted(unknown)}; allowed: {sorted(allowed)}")
        cfg = cls(**value)
        if cfg.on_problem not in ("fail", "warn"):
            raise InputError(f"preflight.on_problem: {cfg.on_problem!r} is not one of fail, warn")
        if cfg.rows < 1:
            raise InputError("preflight.rows: must be >= 1")
        return cfg


def _percentile(values: list[float], q: float) -> float | None:
    if not values:
        return None
    ordered = sorted(values)
    pos = (len(ordered) - 1) * q
    lo, hi = math.floor(pos), math.ceil(pos)
    return ordered[lo] + (ordered[hi] - ordered[lo]) * (pos - lo)


def load_rows(parquet: str | Path, k: int, seed: int) -> list[dict]:
    import pandas as pd

    from llmrnn.train.data import read_rows  # one reader (and one set of messages) for trajectory parquets

    path = Path(parquet)
    df = pd.DataFrame(read_rows(path))
    if len(df) == 0:
        raise InputError(f"{path}: no rows")
    if len(df) > k:
        df = df.sample(n=k, random_state=seed).sort_index()
    rows = []
    for idx, row in df.iterrows():
        rm = row["reward_model"]
        gt = rm.get("ground_truth") if isinstance(rm, dict) else None
        if not isinstance(gt, str):
            raise InputError(f"{path}: row {idx}: reward_model.ground_truth: expected a JSON string")
        try:
            step = json.loads(gt)
        except json.JSONDecodeError as exc:
            raise InputError(f"{path}: row {idx}: reward_model.ground_truth: not JSON: {exc}") from exc
        extra = row["extra_info"]
        rows.append({"index": int(idx), "ground_truth": gt, "step": step, "data_source": row["data_source"],
                     "extra_info": dict(extra) if isinstance(extra, dict) else {}})
    return rows


def _as_policy_output(memory: Any) -> str:
    """A memory from the trajectory as the policy would print it (the JSON string)."""
    if isinstance(memory, str):
        return memory
    return json.dumps(memory if isinstance(memory, dict) else {"evolving_summary": str(memory or "")})


def judge_checks(scorer, rows: list[dict], cfg: PreflightConfig) -> tuple[dict, list[str]]:
    """Score the candidates of every row; return (judge report, problems)."""
    samples = []
    for r in rows:
        for which in CANDIDATES:
            memory = EMPTY_MEMORY if which == "empty" else _as_policy_output(r["step"].get(which))
            samples.append({"data_source": r["data_source"], "solution_str": memory,
                            "ground_truth": r["ground_truth"], "extra_info": dict(r["extra_info"], candidate=which),
                            "group": r["index"]})
    t0 = time.perf_counter()
    opponent = "group" if scorer.cfg.mode == "pairwise" else "reference"
    results = scorer.score_samples(samples, opponent=opponent)
    elapsed = time.perf_counter() - t0
    methods = Counter(r["parse_method"] for r in results)
    judged = [r for r in results if r["valid_json"]]
    fallbacks = methods.get("fallback", 0)
    fallback_rate = fallbacks / len(judged) if judged else None
    rewards = [float(r["score"]) for r in results]
    distinct = sorted({round(x, 4) for x in rewards})
    mean = sum(rewards) / len(rewards)
    std = math.sqrt(sum((x - mean) ** 2 for x in rewards) / len(rewards))
    k = len(CANDIDATES)
    spread_rows = sum(
        1 for i in range(0, len(results), k) if len({round(r["score"], 4) for r in results[i:i + k]}) > 1
    )
    latencies = [r["judge_latency_s"] for r in results if r["judge_calls"] and not r["cache_hits"]]
    truncated = sum(r.get("truncated_calls", 0) for r in results)
    report = {
        "rubric": scorer.rubric.path,
        "judge_model": scorer.endpoint.model,
        "engine": scorer.endpoint.engine,
        "mode": scorer.cfg.mode,
        "score_method": scorer.rubric.request.score_method,
        "rows": len(rows),
        "candidates_per_row": list(CANDIDATES),
        "candidates": len(results),
        "judged": len(judged),
        "invalid_json": methods.get("invalid_json", 0),
        "parse_methods": dict(sorted(methods.items())),
        "fallback_rate": fallback_rate,
        "truncated_before_score": truncated,
        "reward": {"mean": mean, "std": std, "min": min(rewards), "max": max(rewards),
                   "distinct": len(distinct), "values": distinct[:50]},
        "rows_with_spread": spread_rows,
        "latency_s": {"p50": _percentile(latencies, 0.5), "p95": _percentile(latencies, 0.95)},
        "http_calls": scorer.counts["http_calls"],
        "cache_hits": scorer.counts["cache_hits"],
        "elapsed_s": elapsed,
        "audit": str(scorer.audit.path),
    }
    problems = []
    if not judged:
        problems.append(f"none of the {len(results)} trajectory memories parsed as {{\"evolving_summary\": ...}} "
                        "JSON, so the judge was never asked; check the trajectories' h_ref/h_prev")
    elif fallback_rate is not None and fallback_rate > cfg.max_fallback_rate:
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
        limit = req.max_tokens if scorer.cfg.mode == "scalar" else scorer.rubric.pairwise.max_tokens
        problems.append(
            f"{truncated} judge answer(s) hit max_tokens={limit} before giving a score (finish_reason "
            f"'length'; api: {req.api}): a judge that thinks aloud first needs a higher max_tokens, or "
            f"`request.api: completions` with a raw prompt ({scorer.rubric.path}); answers in {scorer.audit.path}"
        )
    if len(distinct) < cfg.min_distinct_rewards:
        problems.append(
            f"the reward is (nearly) constant: {len(distinct)} distinct value(s) {distinct[:5]} over "
            f"{len(rewards)} candidates (preflight.min_distinct_rewards {cfg.min_distinct_rewards}); GRPO "
            "learns nothing from equal rewards within a group"
        )
    return report, problems


def _first_answer(scorer, result: dict) -> str:
    """The judge's answer for a result, read back from the audit record's cache (short)."""
    del result
    path = scorer.audit.path
    try:
        for line in path.read_text(encoding="utf-8").splitlines():
            rec = json.loads(line)
            if rec.get("parse_method") == "fallback" and rec.get("judge"):
                return rec["judge"][0]["response"][:80]
    except (OSError, json.JSONDecodeError):
        pass
    return "?"


# ----------------------------------------------------------------------------- training part (train stage)
def training_part(context: dict) -> dict:
    """Adapter to the train stage's checks: `llmrnn.train.preflight.training_checks(**kw)` returning
    {"problems": [...], ...}. Only the keyword arguments it declares are passed (it may take **kw)."""
    try:
        module = importlib.import_module("llmrnn.train.preflight")
    except ModuleNotFoundError as exc:
        if exc.name in ("llmrnn.train", "llmrnn.train.preflight"):
            return {"skipped": "llmrnn.train.preflight is not available: no training checks run", "problems": []}
        raise
    checks = getattr(module, "training_checks", None)
    if checks is None:
        return {"skipped": "llmrnn.train.preflight has no training_checks(): no training checks run", "problems": []}
    params = inspect.signature(checks).parameters
    takes_all = any(p.kind is inspect.Parameter.VAR_KEYWORD for p in params.values())
    kwargs = {k: v for k, v in context.items() if v is not None and (takes_all or k in params)}
    missing = [name for name, p in params.items()
               if p.default is inspect.Parameter.empty and p.kind in (p.POSITIONAL_OR_KEYWORD, p.KEYWORD_ONLY)
               and name not in kwargs]
    if missing:
        return {"skipped": f"training checks not run: no value for {', '.join(missing)} "
                           "(the preflight rule passes --tokenizer-dir and the train config)",
                "problems": [], "warnings": [f"training checks skipped (missing {', '.join(missing)})"]}
    result = checks(**kwargs)
    if not isinstance(result, dict) or not isinstance(result.get("problems", []), list):
        raise CheckFailed("llmrnn.train.preflight.training_checks must return a dict with a 'problems' list")
    result.setdefault("problems", [])
    return result


# ----------------------------------------------------------------------------- command
def run_preflight(train_parquet: str, endpoint_file: str, out: str, audit_dir: str, cfg: dict,
                  val_parquet: str | None = None, tokenizer_dir: str | None = None) -> dict:
    from llmrnn.reward import RewardConfig, Scorer

    pcfg = PreflightConfig.from_dict(cfg.get("preflight"))
    rcfg = RewardConfig.from_any(cfg.get("reward") or {})
    judge_cfg = cfg.get("judge") or {}
    if tokenizer_dir and Path(tokenizer_dir).name == ".ready":  # a model's marker stands for its folder
        tokenizer_dir = str(Path(tokenizer_dir).parent)
    rows = load_rows(train_parquet, pcfg.rows, pcfg.seed)
    scorer = Scorer(endpoint_file, judge_cfg.get("rubric") or None, audit_dir, rcfg)
    try:
        judge_report, judge_problems = judge_checks(scorer, rows, pcfg)
    finally:
        scorer.close()
    log.info("judge preflight: %s", json.dumps({k: judge_report[k] for k in
                                                ("parse_methods", "fallback_rate", "reward", "latency_s")}))
    training = training_part({
        "train_cfg": cfg.get("train"), "train_parquet": train_parquet, "val_parquet": val_parquet,
        "tokenizer_dir": tokenizer_dir, "out_dir": str(Path(out).parent), "endpoint_file": endpoint_file,
        "judge_report": judge_report, "check_gpus": False,  # a 0-GPU job step: `train run` counts them
    })
    problems, warnings = [], []
    (problems if pcfg.on_problem == "fail" else warnings).extend(judge_problems)
    problems.extend(f"training: {p}" for p in training.get("problems", []))
    warnings.extend(f"training: {w}" for w in training.get("warnings", []) or [])
    report = {"ok": not problems, "problems": problems, "warnings": warnings, "judge": judge_report,
              "training": training}
    io.write_json(out, report)
    for w in warnings:
        log.warning("preflight warning: %s", w)
    if problems:
        raise CheckFailed("preflight failed: " + " | ".join(problems))
    return report


def _cmd_run(args) -> int:
    run_preflight(args.train_parquet, args.endpoint, args.out, args.audit_dir, args.cfg, args.val_parquet,
                  args.tokenizer_dir)
    return 0


def register(sub) -> None:
    from llmrnn.cli import json_arg

    p = sub.add_parser("preflight", help="judge compliance + training checks before GRPO")
    psub = p.add_subparsers(dest="preflight_command", required=True)
    r = psub.add_parser("run", help="score K train rows with the real judge; write preflight.json")
    r.add_argument("--train-parquet", required=True)
    r.add_argument("--val-parquet", default=None)
    r.add_argument("--endpoint", required=True, help="RUN/judge/endpoint.json (waits for its health)")
    r.add_argument("--out", required=True, help="RUN/train/preflight.json")
    r.add_argument("--audit-dir", required=True, help="audit JSONL directory for the preflight calls")
    r.add_argument("--tokenizer-dir", default=None, help="policy base model dir (training checks: prompt lengths)")
    r.add_argument("--cfg", type=json_arg, default={}, help="JSON of sections judge, reward, preflight[, train]")
    r.set_defaults(func=_cmd_run)
