"""Judge agreement: does the judge rank a patient's reference memory above another patient's or a
corrupted one? (agreement_checks inside preflight; run_agreement alone beside a run whose reward asks no judge)"""

from __future__ import annotations

import json
import logging
import random
from pathlib import Path
from typing import Any

from llmrnn import io
from llmrnn.errors import InputError
from llmrnn.matching import content_words, normalise
from llmrnn.preflight.reward_checks import _pct
from llmrnn.preflight.rows import _as_policy_output, load_rows
from llmrnn.reward import JUDGED_MODES, Scorer, reward_mode, reward_settings
from llmrnn.rnn import summary_text
from llmrnn.settings.evaluation import Preflight, preflight_settings
from llmrnn.stats import wilson_ci

log = logging.getLogger(__name__)

# ----------------------------------------------------------------------------- judge agreement
# shuffled words are left out: a memory with the same words carries the same facts, and a judge that
# reads facts rightly ties it with the original
WRONG_MEMORIES = ("other_patient", "diagnoses_removed", "truncated")


def _summary_of(memory: Any) -> str:
    return str(summary_text(_as_policy_output(memory)) or "")


def _memory_json(summary: str) -> str:
    return json.dumps({"evolving_summary": summary})


def wrong_memory(kind: str, row: dict, rows: list[dict], rng) -> str | None:
    """A memory that should score below the row's reference memory h_ref: another patient's reference
    memory, h_ref without the words of the patient's diagnoses (this and the next visit), or its first
    half. None when the kind cannot make a different memory from this row."""
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


def agreement_checks(scorer, rows: list[dict], cfg: Preflight) -> tuple[dict, list[str], list[str]]:
    """How often the judge's score ranks a patient's reference memory above a wrong one (agreement_pairs).
    Scalar: both memories scored alone; pairwise: they meet each other in both orders. A tie is not
    agreement. Returns (report, problems, warnings): below agreement_fail_below a problem, below
    agreement_warn_below a warning; the rate carries its Wilson 95% interval."""
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



def run_agreement(train_parquet: str, endpoint_file: str, out: str, audit_dir: str, cfg: dict,
                  mode: str | None = None) -> dict:
    """The judge-agreement check alone (for a run whose reward asks no judge): the judge at `endpoint_file`
    scores agreement_pairs pairs in `mode` (default: the reward's judged mode, else scalar). Writes `out`
    with a verdict; it never stops the workflow (a judged run's preflight does that)."""
    pcfg = preflight_settings(cfg.get("preflight"))
    reward = reward_settings(cfg.get("reward") or {})
    training = reward_mode(reward)
    check_mode = mode or (reward.mode if training.asks_judge else JUDGED_MODES[0])
    # the check measures the judge of judge.rubric, not the training reward: your own reward file
    # (reward.custom) is left out of its scorer, so a custom-reward run can still ask it by hand
    rcfg = reward.model_copy(update={"mode": check_mode, "custom": reward.custom.model_copy(update={"path": None})})
    if check_mode not in JUDGED_MODES:
        raise InputError(f"preflight agreement --mode {check_mode}: the check needs a mode that asks the judge "
                         f"({', '.join(JUDGED_MODES)})")
    rows = load_rows(train_parquet, max(2, pcfg.agreement_pairs), pcfg.seed + 1)
    Path(audit_dir).mkdir(parents=True, exist_ok=True)  # the rule's output, though no pair may be scored (no row
    # with a reference memory: the judge writes nothing in it, and Snakemake would fail the finished job)
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
    if training.why_training_reward:
        report["why_training_reward"] = training.why_training_reward
    io.write_json(out, report)
    log.info("judge agreement: %s (%s)", report["verdict"], "; ".join(problems + warnings) or "ok")
    return report
