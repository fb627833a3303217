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
warnings.

reward.mode outcome asks no judge: no endpoint is needed (none is waited on), the same candidates are
scored with the outcome reward and "judge" says {"skipped": "reward.mode outcome asks no judge", "mode",
"rows", "candidates", "parse_methods", "reward": {...}, "rows_with_spread", ...} with fallback_rate None;
its spread problems are warnings (the fixed reference memories all miss what the policy must learn to
carry, so their spread says nothing about the rollouts').

Training problems (`training_checks`: batch geometry, prompt lengths vs max_prompt_length, LR
schedule, GPUs, free disk; each one line saying what to change) always count. `llmrnn preflight
training` runs them alone, without a judge.
"""

from __future__ import annotations

import json
import logging
import math
import os
import shutil
import time
from collections import Counter
from pathlib import Path
from typing import Any

from llmrnn import io
from llmrnn.errors import CheckFailed, InputError
from llmrnn.gpus import visible_gpus
from llmrnn.models import model_folder
from llmrnn.stats import percentile
from llmrnn.train.config import PreflightConfig

log = logging.getLogger(__name__)


CANDIDATES = ("h_ref", "h_prev", "empty")
EMPTY_MEMORY = json.dumps({"evolving_summary": ""})


def load_rows(parquet: str | Path, k: int, seed: int) -> list[dict]:
    import pandas as pd

    from llmrnn.train.data import (
        read_trajectory_parquet,  # one reader (and one set of messages) for trajectory parquets
    )

    path = Path(parquet)
    df = pd.DataFrame(read_trajectory_parquet(path))
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
    opponent = "group" if scorer.cfg.mode == "pairwise" else "reference"
    results = scorer.score_samples(samples, opponent=opponent)
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
        asked = "so the judge was never asked" if scorer.cfg.judged else "so every reward is 0"
        problems.append(f"none of the {len(results)} trajectory memories parsed as {{\"evolving_summary\": ...}} "
                        f"JSON, {asked}; check the trajectories' h_ref/h_prev")
    return stats, problems


def _spread_problem(stats: dict, cfg: PreflightConfig) -> list[str]:
    reward = stats["reward"]
    if reward["distinct"] >= cfg.min_distinct_rewards:
        return []
    return [(
        f"the reward is (nearly) constant: {reward['distinct']} distinct value(s) {reward['values'][:5]} over "
        f"{stats['candidates']} candidates (preflight.min_distinct_rewards {cfg.min_distinct_rewards}); GRPO "
        "learns nothing from equal rewards within a group"
    )]


def outcome_checks(scorer, rows: list[dict], cfg: PreflightConfig) -> tuple[dict, list[str]]:
    """Outcome mode (no judge): the reference candidates' outcome rewards and their spread; the judge
    keys (fallback rate, latency, calls) say there was none."""
    from llmrnn.reward import NO_JUDGE

    results, elapsed = _score_references(scorer, rows)
    stats, problems = _reward_stats(scorer, rows, results, elapsed)
    report = {"skipped": NO_JUDGE, **stats, "judged": 0, "fallback_rate": None,
              "truncated_before_score": 0, "latency_s": {"p50": None, "p95": None}, "http_calls": 0,
              "cache_hits": 0}
    return report, problems + _spread_problem(stats, cfg)


def judge_checks(scorer, rows: list[dict], cfg: PreflightConfig) -> tuple[dict, list[str]]:
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
        limit = req.max_tokens if scorer.cfg.mode == "scalar" else scorer.rubric.pairwise.max_tokens
        problems.append(
            f"{truncated} judge answer(s) hit max_tokens={limit} before giving a score (finish_reason "
            f"'length'; api: {req.api}): a judge that thinks aloud first needs a higher max_tokens, or "
            f"`request.api: completions` with a raw prompt ({scorer.rubric.path}); answers in {scorer.audit.path}"
        )
    return report, problems + _spread_problem(stats, cfg)


# ----------------------------------------------------------------------------- judge agreement
# shuffled words are left out: a memory with the same words carries the same facts, and a judge that
# reads facts rightly ties it with the original
WRONG_MEMORIES = ("other_patient", "diagnoses_removed", "truncated")


def _summary_of(memory: Any) -> str:
    from llmrnn.rnn import summary_text

    return str(summary_text(_as_policy_output(memory)) or "")


def _memory_json(summary: str) -> str:
    return json.dumps({"evolving_summary": summary})


def wrong_memory(kind: str, row: dict, rows: list[dict], rng) -> str | None:
    """A memory that should score below the row's reference memory h_ref: another patient's reference
    memory, h_ref without the words of the patient's diagnoses (this and the next visit), or its first
    half. None when the kind cannot make a different memory from this row."""
    from llmrnn.matching import content_words, normalise

    ref = _summary_of(row["step"].get("h_ref"))
    words = ref.split()
    if kind == "other_patient":
        pid = str(row["extra_info"].get("patient_id"))
        others = [r for r in rows if str(r["extra_info"].get("patient_id")) != pid
                  and _summary_of(r["step"].get("h_ref")).strip() not in ("", ref.strip())]
        return _memory_json(_summary_of(rng.choice(others)["step"].get("h_ref"))) if others else None
    if kind == "diagnoses_removed":
        step = row["step"]
        diagnoses = [*(step.get("next_ground_truth_diagnoses") or []), *(step.get("ground_truth_diagnoses") or [])]
        drop = frozenset().union(*(content_words(normalise(str(d))) for d in diagnoses)) if diagnoses else frozenset()
        kept = [w for w in words if not (content_words(normalise(w)) & drop)]
        return _memory_json(" ".join(kept)) if len(kept) < len(words) else None
    if kind == "truncated":
        return _memory_json(" ".join(words[: len(words) // 2])) if len(words) >= 2 else None
    raise ValueError(kind)


def agreement_pairs(rows: list[dict], seed: int) -> tuple[list[dict], int]:
    """(pairs, rows skipped): one pair per row, the wrong kinds in turn (the next kind when a row cannot make
    the planned one); a row whose reference memory is empty makes none."""
    import random

    rng = random.Random(seed)
    pairs, skipped = [], 0
    for i, row in enumerate(rows):
        if not _summary_of(row["step"].get("h_ref")).strip():
            skipped += 1
            continue
        for k in range(len(WRONG_MEMORIES)):
            kind = WRONG_MEMORIES[(i + k) % len(WRONG_MEMORIES)]
            wrong = wrong_memory(kind, row, rows, rng)
            if wrong is not None:
                pairs.append({"row": row, "kind": kind, "wrong": wrong})
                break
        else:
            skipped += 1
    return pairs, skipped


def agreement_checks(scorer, rows: list[dict], cfg: PreflightConfig) -> tuple[dict, list[str], list[str]]:
    """How often the judge's score ranks a patient's reference memory above a wrong one (agreement_pairs).
    Scalar: both memories scored alone; pairwise: they meet each other in both orders. A tie is not
    agreement. Returns (report, problems, warnings): below agreement_fail_below a problem, below
    agreement_warn_below a warning; the rate carries its Wilson 95% interval."""
    from llmrnn.stats import wilson_ci

    pairs, skipped = agreement_pairs(rows, cfg.seed)
    samples = []
    for i, pair in enumerate(pairs):
        row = pair["row"]
        # both as {"evolving_summary": ...}: the judge compares contents, never two formats
        reference = _memory_json(_summary_of(row["step"].get("h_ref")))
        for which, memory in (("reference", reference), ("wrong", pair["wrong"])):
            samples.append({"data_source": row["data_source"], "solution_str": memory, "ground_truth": row["ground_truth"],
                            "extra_info": dict(row["extra_info"], candidate=f"agreement_{which}_{pair['kind']}"),
                            "group": f"agreement_{i}"})
    results = scorer.score_samples(samples, opponent="group") if samples else []
    by_kind: dict[str, dict] = {}
    agreed = ties = scored = 0
    examples = []
    for i, pair in enumerate(pairs):
        ref, wrong = results[2 * i]["judge_score"], results[2 * i + 1]["judge_score"]
        if ref is None or wrong is None:  # a memory that did not parse was never judged
            continue
        scored += 1
        k = by_kind.setdefault(pair["kind"], {"pairs": 0, "agreed": 0, "ties": 0})
        k["pairs"] += 1
        if ref > wrong:
            agreed += 1
            k["agreed"] += 1
        elif ref == wrong:
            ties += 1
            k["ties"] += 1
        if len(examples) < 12:
            examples.append({"kind": pair["kind"], "patient_id": pair["row"]["extra_info"].get("patient_id"),
                             "reference_score": ref, "wrong_score": wrong})
    lo, hi = wilson_ci(agreed, scored)
    rate = agreed / scored if scored else None
    report = {
        "mode": scorer.cfg.mode,
        "question": "does the judge's reward rank a patient's reference memory (h_ref) above a wrong one?",
        "wrong_memories": list(WRONG_MEMORIES),
        "pairs": scored, "agreed": agreed, "ties": ties, "rows_skipped": skipped + len(pairs) - scored,
        "rate": rate, "ci95": [lo, hi], "ci_method": "wilson",
        "by_kind": {k: {**v, "rate": v["agreed"] / v["pairs"]} for k, v in sorted(by_kind.items())},
        "warn_below": cfg.agreement_warn_below, "fail_below": cfg.agreement_fail_below,
        "examples": examples,
    }
    problems, warnings = [], []
    what = (f"the judge ranked a patient's reference memory above a wrong one in {agreed}/{scored} pairs "
            f"({_pct(rate)}, 95% CI {_pct(lo)}-{_pct(hi)}, ties {ties})")
    if not scored:
        problems.append("judge agreement: no pair could be scored (no reference memory parsed as memory JSON)")
    elif rate < cfg.agreement_fail_below:
        problems.append(f"judge agreement: {what}, below preflight.agreement_fail_below {cfg.agreement_fail_below:.0%}: "
                        "its reward would not tell right memories from wrong ones")
    elif rate < cfg.agreement_warn_below:
        warnings.append(f"judge agreement: {what}, below preflight.agreement_warn_below {cfg.agreement_warn_below:.0%}")
    report["verdict"] = "fail" if problems else "warn" if warnings else "ok"
    return report, problems, warnings


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


# ----------------------------------------------------------------------------- training checks
def _split_lengths(split: str, path, tokenizer, limit: int, max_dropped_fraction: float) -> tuple[dict, int, list[str]]:
    """Prompt lengths of one parquet vs max_prompt_length: (report, rows that fit, problems)."""
    from llmrnn.train import data as tdata

    rows = tdata.read_trajectory_parquet(path)
    lengths = tdata.prompt_lengths(rows, tokenizer)
    over = [i for i, n in enumerate(lengths) if n > limit]
    report = {
        "rows": len(rows),
        "prompt_tokens_max": max(lengths) if lengths else 0,
        "prompt_tokens_mean": round(sum(lengths) / len(lengths), 1) if lengths else 0,
        "overlong_rows": len(over),
        "overlong_examples": [
            {"row": i, "tokens": lengths[i], **{k: (rows[i].get("extra_info") or {}).get(k)
                                                for k in ("patient_id", "visit_index")}}
            for i in over[:5]
        ],
    }
    problems = []
    if not rows:
        problems.append(f"{split} parquet {path}: no rows")
    elif over and len(over) / len(rows) > max_dropped_fraction:
        problems.append(
            f"{split} parquet {path}: {len(over)} of {len(rows)} prompts exceed train.max_prompt_length={limit} "
            f"tokens (longest {max(lengths)}); verl would silently drop them: raise max_prompt_length or "
            "shorten the prompts"
        )
    return report, len(rows) - len(over), problems


def _data_checks(cfg: dict, train_parquet, val_parquet, tokenizer_dir, max_dropped_fraction: float):
    """Prompt lengths of both splits and the steps the usable train rows make: (report, problems)."""
    from transformers import AutoTokenizer

    from llmrnn.train import config as tcfg

    tokenizer = AutoTokenizer.from_pretrained(tokenizer_dir)
    limit = cfg["max_prompt_length"]
    data: dict = {"max_prompt_length": limit, "val": None}
    data["train"], kept_train, problems = _split_lengths("train", train_parquet, tokenizer, limit,
                                                         max_dropped_fraction)
    if val_parquet is not None:
        data["val"], _, val_problems = _split_lengths("val", val_parquet, tokenizer, limit, max_dropped_fraction)
        problems += val_problems
    elif cfg["test_freq"]:
        problems.append("no val parquet: validation every train.test_freq steps needs one")
    spe = tcfg.steps_per_epoch(cfg, kept_train)
    data["steps_per_epoch"] = spe
    data["planned_steps"] = tcfg.planned_steps(cfg, kept_train)
    if kept_train and spe == 0:
        problems.append(
            f"train parquet: {kept_train} usable rows are fewer than one batch of train.batch.train="
            f"{cfg['batch']['train']} prompts (the partial batch is dropped): no step would run"
        )
    return data, problems


LR_CHECK_STEP = 20  # optimizer step at which the LR must have reached LR_MIN_FRACTION of train.lr
LR_MIN_FRACTION = 0.3


def _lr_checks(cfg: dict, planned: int, updates_per_step: int) -> tuple[dict, list[str]]:
    """The optimizer steps the run makes and the LR it sees at the first/last one."""
    from llmrnn.train import config as tcfg

    updates = planned * updates_per_step
    warm = int(cfg["warmup_steps"] or 0)
    schedule = {
        "scheduler": cfg["lr_scheduler"],
        "peak_lr": float(cfg["lr"]),
        "warmup_steps": warm,
        "optimizer_steps": updates,
        "lr_first_step": tcfg.lr_at(cfg, 1, updates) if updates else None,
        "lr_last_step": tcfg.lr_at(cfg, updates, updates) if updates else None,
    }
    problems = []
    if not float(cfg["lr"]) > 0:
        problems.append(f"train.lr={cfg['lr']}: must be > 0")
    if updates and warm >= updates:
        problems.append(
            f"train.warmup_steps={warm} >= the run's {updates} optimizer steps: the LR never reaches train.lr"
        )
    # the schedule must reach useful values early: a run whose LR is still tiny after LR_CHECK_STEP updates
    # (a long warmup, a cosine decaying over a short budget) spends its step budget learning nothing
    check_step = min(LR_CHECK_STEP, updates)
    if updates:
        lr_check = tcfg.lr_at(cfg, check_step, updates)
        schedule.update(check_step=check_step, lr_at_check_step=lr_check, min_fraction=LR_MIN_FRACTION)
        if float(cfg["lr"]) > 0 and lr_check < LR_MIN_FRACTION * float(cfg["lr"]) and warm < updates:
            problems.append(
                f"LR schedule: at optimizer step {check_step} of {updates} the LR is {lr_check:.3g}, below "
                f"{LR_MIN_FRACTION:.0%} of train.lr={cfg['lr']}: shorten train.warmup_steps or give the run more steps"
            )
    if cfg["save_freq"] and planned and cfg["save_freq"] > planned:
        schedule["note"] = "save_freq > planned steps: only the final checkpoint is written"
    return schedule, problems


def _gpu_checks(cfg: dict, gpus_available: int | None, check_gpus: bool = True) -> tuple[dict, list[str]]:
    engine = cfg["engine"]
    need = 0 if engine == "trl" else cfg["n_gpus_per_node"]
    have = visible_gpus() if gpus_available is None else int(gpus_available)
    gpus = {"engine": engine, "requested_per_node": need, "nnodes": cfg["nnodes"], "available_here": have}
    problems = []
    if not check_gpus:
        gpus["checked_by"] = "train run (the training job)"
    elif engine == "verl" and have < need:
        problems.append(
            f"train.n_gpus_per_node={need} but {have} GPU(s) are visible here (verl cannot train on CPU; "
            "use train.engine: trl, or run on a GPU node)"
        )
    return gpus, problems


def _disk_checks(cfg: dict, target: Path, model_dir, planned: int) -> tuple[dict, list[str]]:
    """Free disk for checkpoints where they will go (the nearest existing folder of `target`). verl's
    checkpoints hold the full fp32 actor, so its need is sized from the model x checkpoints kept."""
    from llmrnn.gpu_stack import checkpoint_disk_gb

    probe = target
    while not probe.exists() and probe != probe.parent:
        probe = probe.parent
    free_gb = shutil.disk_usage(probe).free / 1e9  # statvfs: blind to the user's quota
    disk = {"path": str(target), "free_gb": round(free_gb, 2)}
    from llmrnn.quota import user_quota

    quota = user_quota(probe)
    disk["quota"] = quota.note
    where = f"{free_gb:.1f} GB free at {probe}"
    if quota.left_gb is not None and quota.left_gb < free_gb:
        free_gb, where = quota.left_gb, f"{quota.left_gb:.1f} GB left under your quota at {probe} ({quota.note})"
    need_gb, why = float(cfg["min_free_disk_gb"]), f"train.min_free_disk_gb={cfg['min_free_disk_gb']}"
    if cfg["engine"] == "verl":
        ckpt_gb, kept = checkpoint_disk_gb(model_dir, cfg["keep_last"], planned, cfg["save_freq"])
        disk.update(checkpoints_kept=kept, checkpoints_gb=ckpt_gb)
        if ckpt_gb > need_gb:
            need_gb, why = ckpt_gb, (f"{kept} checkpoint(s) kept (train.keep_last={cfg['keep_last']}) x "
                                     f"{ckpt_gb / kept:.1f} GB (fp32 weights of {model_dir})")
    disk["min_free_gb"] = need_gb
    problems = []
    if free_gb < need_gb:
        problems.append(f"only {where}; {need_gb:.1f} GB needed for {why}: free disk, or set train.keep_last "
                        "(verl trainer.max_actor_ckpt_to_keep; the reference kept every checkpoint, train.select "
                        "last needs only the last)")
    return disk, problems


def training_checks(
    train_cfg: dict,
    train_parquet: str | os.PathLike,
    val_parquet: str | os.PathLike | None,
    tokenizer_dir: str | os.PathLike,
    *,
    out_dir: str | os.PathLike | None = None,
    gpus_available: int | None = None,
    max_dropped_fraction: float = 0.0,
    check_gpus: bool = True,
) -> dict:
    """Batch geometry, prompt lengths vs max_prompt_length, LR schedule, GPUs, free disk.

    check_gpus=False where the caller holds no GPU by design (the preflight step of the training group):
    `train run` counts them itself before verl starts.

    Returns {"ok", "problems": [...], "engine", "geometry", "data", "lr_schedule", "gpus", "disk"}."""
    from llmrnn.train import config as tcfg

    cfg = tcfg.normalize(train_cfg)
    geo = tcfg.geometry(cfg)
    data, data_problems = _data_checks(cfg, train_parquet, val_parquet, tokenizer_dir, max_dropped_fraction)
    schedule, lr_problems = _lr_checks(cfg, data["planned_steps"], geo.updates_per_step)
    gpus, gpu_problems = _gpu_checks(cfg, gpus_available, check_gpus)
    disk, disk_problems = _disk_checks(cfg, Path(out_dir) if out_dir else Path(train_parquet).parent,
                                       tokenizer_dir, data["planned_steps"])
    problems = [*geo.problems, *data_problems, *lr_problems, *gpu_problems, *disk_problems]
    return {
        "ok": not problems,
        "problems": problems,
        "engine": cfg["engine"],
        "geometry": geo.as_dict(),
        "data": data,
        "lr_schedule": schedule,
        "gpus": gpus,
        "disk": disk,
    }


# ----------------------------------------------------------------------------- command
def run_preflight(train_parquet: str, endpoint_file: str | None, out: str, audit_dir: str, cfg: dict,
                  val_parquet: str | None = None, tokenizer_dir: str | None = None) -> dict:
    """Reward checks (judge_checks; outcome_checks when reward.mode outcome asks no judge, which needs
    no endpoint) + training checks -> `out`; CheckFailed when a problem counts."""
    from llmrnn.reward import RewardConfig, Scorer, missing_endpoint

    pcfg = PreflightConfig.from_dict(cfg.get("preflight"))
    rcfg = RewardConfig.from_any(cfg.get("reward") or {})
    if rcfg.judged and not endpoint_file:  # before any work: the judged modes cannot check anything
        raise missing_endpoint(rcfg.mode, "pass --endpoint")
    judge_cfg = cfg.get("judge") or {}
    if tokenizer_dir:
        tokenizer_dir = str(model_folder(tokenizer_dir))
    rows = load_rows(train_parquet, pcfg.rows, pcfg.seed)
    scorer = Scorer(endpoint_file, judge_cfg.get("rubric") or None, audit_dir, rcfg)
    agreement, agreement_problems, agreement_warnings = None, [], []
    try:
        checks = judge_checks if rcfg.judged else outcome_checks
        judge_report, judge_problems = checks(scorer, rows, pcfg)
        if rcfg.judged and pcfg.agreement_pairs:
            agreement, agreement_problems, agreement_warnings = agreement_checks(
                scorer, load_rows(train_parquet, pcfg.agreement_pairs, pcfg.seed + 1), pcfg)
    finally:
        scorer.close()
    log.info("reward preflight: %s", json.dumps({k: judge_report[k] for k in
                                                 ("mode", "parse_methods", "fallback_rate", "reward", "latency_s")}))
    if cfg.get("train") is None or tokenizer_dir is None:
        missing = "train config" if cfg.get("train") is None else "--tokenizer-dir"
        training = {"skipped": f"training checks not run: no {missing} (the preflight rule passes both)",
                    "problems": [], "warnings": [f"training checks skipped (no {missing})"]}
    else:  # the disk check looks where checkpoints go: the folder of preflight.json (RUN/train)
        training = training_checks(cfg["train"], train_parquet, val_parquet, tokenizer_dir,
                                   out_dir=Path(out).parent,
                                   check_gpus=False)  # a 0-GPU job step: `train run` counts them
    problems, warnings = [], []
    if rcfg.mode == "outcome":
        # The outcome reward asks no judge, and the fixed reference memories (h_ref, h_prev, empty) all
        # miss what the policy must learn to carry, so their spread says nothing about the rollouts'
        # spread: report, do not stop (`llmrnn train diagnose` measures the rollouts' spread).
        warnings.extend(f"reward.mode outcome (no judge): {p}" for p in judge_problems)
    else:
        (problems if pcfg.on_problem == "fail" else warnings).extend(judge_problems + agreement_problems)
        warnings.extend(agreement_warnings)
    problems.extend(f"training: {p}" for p in training.get("problems", []))
    warnings.extend(f"training: {w}" for w in training.get("warnings", []) or [])
    if rcfg.judged and (reach := _judge_reach_problem(endpoint_file, cfg)):
        problems.append(reach)
    report = {"ok": not problems, "problems": problems, "warnings": warnings, "judge": judge_report,
              "judge_agreement": agreement if agreement is not None else {"skipped": (
                  "reward.mode outcome asks no judge (`llmrnn preflight agreement` checks one beside training)"
                  if not rcfg.judged else "preflight.agreement_pairs is 0")},
              "training": training}
    io.write_json(out, report)
    for w in warnings:
        log.warning("preflight warning: %s", w)
    if problems:
        raise CheckFailed("preflight failed: " + " | ".join(problems))
    return report


def _judge_reach_problem(endpoint_file: str | None, cfg: dict) -> str | None:
    """train.nnodes > 1: verl runs reward workers on every node, so each must reach the judge."""
    nnodes = int((cfg.get("train") or {}).get("nnodes", 1))
    if nnodes <= 1 or not endpoint_file:
        return None
    from llmrnn.judge.client import Endpoint
    from llmrnn.train.ray_cluster import judge_layout_problem

    return judge_layout_problem(Endpoint.read(endpoint_file).url, nnodes)
WHY_OUTCOME = (
    "reward.mode outcome: the training reward is the share of the next visit's diagnoses a memory names, "
    "not the judge's score; this check measures the judge the config names (judge.rubric) beside the "
    "training path, so the choice is shown, not assumed"
)


def run_agreement(train_parquet: str, endpoint_file: str, out: str, audit_dir: str, cfg: dict,
                  mode: str | None = None) -> dict:
    """The judge-agreement check alone (for a run whose reward asks no judge): the judge at `endpoint_file`
    scores agreement_pairs pairs in `mode` (default: the reward's judged mode, else scalar). Writes `out`
    with a verdict; it never stops the workflow (a judged run's preflight does that)."""
    from dataclasses import replace

    from llmrnn.reward import RewardConfig, Scorer

    pcfg = PreflightConfig.from_dict(cfg.get("preflight"))
    reward = RewardConfig.from_any(cfg.get("reward") or {})
    check_mode = mode or (reward.mode if reward.judged else "scalar")
    rcfg = replace(reward, mode=check_mode)
    if not rcfg.judged:
        raise InputError(f"preflight agreement --mode {check_mode}: the check needs a judged mode (scalar, pairwise)")
    rows = load_rows(train_parquet, max(2, pcfg.agreement_pairs), pcfg.seed + 1)
    scorer = Scorer(endpoint_file, (cfg.get("judge") or {}).get("rubric") or None, audit_dir, rcfg)
    try:
        report, problems, warnings = agreement_checks(scorer, rows, pcfg)
        report.update(rubric=scorer.rubric.path, judge_model=scorer.endpoint.model,
                      score_method=scorer.rubric.request.score_method)
    finally:
        scorer.close()
    report.update(problems=problems, warnings=warnings, training_reward_mode=reward.mode,
                  sample_note=f"{report['pairs']} pairs (preflight.agreement_pairs {pcfg.agreement_pairs}): a small "
                              "sample, so the 95% interval is wide")
    if not reward.judged:
        report["why_training_reward"] = WHY_OUTCOME
    io.write_json(out, report)
    log.info("judge agreement: %s (%s)", report["verdict"], "; ".join(problems + warnings) or "ok")
    return report


def _cmd_agreement(args) -> int:
    run_agreement(args.train_parquet, args.endpoint, args.out, args.audit_dir, args.cfg, args.mode)
    return 0


def _cmd_training(args) -> int:
    from llmrnn.train import config as tcfg

    cfg = args.cfg.get("train", args.cfg)
    result = training_checks(tcfg.normalize(cfg), args.train, args.val, model_folder(args.model),
                             out_dir=args.out_dir, gpus_available=args.gpus)
    if args.out:
        io.write_json(args.out, result)
    for problem in result["problems"]:
        log.error("preflight: %s", problem)
    print(json.dumps(result, indent=2))
    return 0 if result["ok"] else 3


def _cmd_run(args) -> int:
    run_preflight(args.train_parquet, args.endpoint, args.out, args.audit_dir, args.cfg, args.val_parquet,
                  args.tokenizer_dir)
    return 0


def register(sub) -> None:
    from llmrnn.cli import json_arg

    p = sub.add_parser("preflight", help="judge compliance + training checks before GRPO")
    psub = p.add_subparsers(dest="preflight_command", required=True)
    r = psub.add_parser("run", help="score K train rows with the reward (the real judge unless reward.mode is "
                                    "outcome) + training checks; write preflight.json")
    r.add_argument("--train-parquet", required=True)
    r.add_argument("--val-parquet", default=None)
    r.add_argument("--endpoint", default=None,
                   help="RUN/judge/endpoint.json (waits for its health); required unless reward.mode is outcome")
    r.add_argument("--out", required=True, help="RUN/train/preflight.json")
    r.add_argument("--audit-dir", required=True, help="audit JSONL directory for the preflight calls")
    r.add_argument("--tokenizer-dir", default=None, help="policy base model dir (training checks: prompt lengths)")
    r.add_argument("--cfg", type=json_arg, default={}, help="JSON of sections judge, reward, preflight[, train]")
    r.set_defaults(func=_cmd_run)

    a = psub.add_parser("agreement", help="judge agreement alone: does the judge rank a patient's reference "
                                          "memory above another patient's or a corrupted one? (never fails)")
    a.add_argument("--train-parquet", required=True)
    a.add_argument("--endpoint", required=True, help="the judge's endpoint.json (waits for its health)")
    a.add_argument("--out", required=True, help="agreement.json")
    a.add_argument("--audit-dir", required=True)
    a.add_argument("--mode", choices=("scalar", "pairwise"), default=None,
                   help="judge mode checked (default: reward.mode when judged, else scalar)")
    a.add_argument("--cfg", type=json_arg, default={}, help="JSON of sections judge, reward, preflight")
    a.set_defaults(func=_cmd_agreement)

    t = psub.add_parser("training", help="training checks only (no judge): batch geometry, prompt lengths, LR, "
                                         "GPUs, disk")
    t.add_argument("--cfg", type=json_arg, required=True, help='JSON {"train": {...}} (config subset)')
    t.add_argument("--train", required=True, help="train parquet")
    t.add_argument("--val", default=None, help="val parquet")
    t.add_argument("--model", required=True, help="policy base model dir (its tokenizer measures the prompts)")
    t.add_argument("--out", default=None, help="write the JSON result here")
    t.add_argument("--out-dir", default=None, help="where checkpoints will go (free disk check)")
    t.add_argument("--gpus", type=int, default=None, help="GPUs available (default: detect)")
    t.set_defaults(func=_cmd_training)
