"""Gather: per-variant metrics with confidence intervals, and the comparisons between variants."""

from __future__ import annotations

import statistics
from pathlib import Path
from typing import Any

from llmrnn import io
from llmrnn.errors import InputError
from llmrnn.evaluate.grading import FinalJudge
from llmrnn.evaluate.recall import REFERENCE, ROLES, memory_recall_metrics, recall_by_patient
from llmrnn.evaluate.specificity import compare_specificity, specificity_metrics
from llmrnn.runconfig import filled
from llmrnn.stats import mcnemar, paired_bootstrap, wilcoxon_signed_rank, wilson_ci

# ----------------------------------------------------------------------------- metrics
ACCURACY_KEYS = (("primary_correct", "acc_at_1"), ("any_top5_correct", "acc_at_5"))  # grade key -> metric


def _rate(values: list[bool]) -> float | None:
    return sum(values) / len(values) if values else None


def check_patients(variant: str, records: list[dict]) -> None:
    seen: set[str] = set()
    for rec in records:
        pid = str(rec["patient_id"])
        if pid in seen:
            raise InputError(f"eval {variant}: patient {pid} appears in more than one shard")
        seen.add(pid)
        if not rec.get("visits"):
            raise InputError(f"eval {variant}: patient {pid}: no visits")
        if rec["visits"][-1].get("grade") is None:
            raise InputError(f"eval {variant}: patient {pid}: last visit is not graded (run `llmrnn evaluate grade`)")


def accuracy(last_grades: list[dict]) -> dict:
    """Acc@1 and Acc@5 of the patients' last-visit grades, each with its Wilson 95% interval."""
    n = len(last_grades)
    out = {}
    for key, name in ACCURACY_KEYS:
        k = sum(bool(g[key]) for g in last_grades)
        lo, hi = wilson_ci(k, n)
        out[name] = {"value": k / n if n else None, "correct": k, "n": n, "ci95": [lo, hi], "ci_method": "wilson"}
    return out


def variant_metrics(records: list[dict], specificity: dict | None = None) -> dict:
    """Metrics of one variant from its graded patient records (order-independent)."""
    records = sorted(records, key=lambda r: str(r["patient_id"]))
    last = [r["visits"][-1]["grade"] for r in records]
    out: dict[str, Any] = {"n_patients": len(last), "n_visits": sum(len(r["visits"]) for r in records),
                           **accuracy(last)}
    by_visit: dict[int, list[dict]] = {}
    for r in records:
        for i, v in enumerate(r["visits"]):
            if v.get("grade") is not None:
                by_visit.setdefault(int(v.get("visit_index", i)), []).append(v["grade"])
    out["by_visit_index"] = [
        {
            "visit_index": i,
            "n": len(gs),
            "acc_at_1": _rate([bool(g["primary_correct"]) for g in gs]),
            "acc_at_5": _rate([bool(g["any_top5_correct"]) for g in gs]),
        }
        for i, gs in sorted(by_visit.items())
    ]
    visits = [v for r in records for v in r["visits"]]
    unparsable = {}
    for role in ROLES:
        flags = [not v[f"{role}_ok"] for v in visits if v.get(f"{role}_ok") is not None]
        unparsable[role] = {"rate": _rate(flags), "n": len(flags)}
    judged = [not v["grade"]["judge_ok"] for v in visits if v.get("grade") is not None]
    unparsable["final_judge"] = {"rate": _rate(judged), "n": len(judged)}
    out["unparsable"] = unparsable
    words = [v["memory_words"] for v in visits if v.get("memory_words") is not None]
    mem_by_visit: dict[int, list[int]] = {}
    for r in records:
        for i, v in enumerate(r["visits"]):
            if v.get("memory_words") is not None:
                mem_by_visit.setdefault(int(v.get("visit_index", i)), []).append(v["memory_words"])
    out["memory_words"] = (
        {
            "mean": statistics.fmean(words),
            "median": statistics.median(words),
            "max": max(words),
            "n": len(words),
            "mean_by_visit_index": {str(i): statistics.fmean(ws) for i, ws in sorted(mem_by_visit.items())},
        }
        if words
        else None
    )
    out["memory_recall"] = memory_recall_metrics(records)
    out["memory_specificity"] = specificity_metrics(records, specificity)
    return out


def compare_memory_recall(reference: list[dict], other: list[dict], boot: dict) -> dict | None:
    """Memory recall of `other` vs the reference on the patients both have transitions for."""
    ref, oth = recall_by_patient(reference), recall_by_patient(other)
    pids = sorted(set(ref) & set(oth))
    if not pids:
        return None
    a, b = [ref[p] for p in pids], [oth[p] for p in pids]
    boot = filled("eval.stats.bootstrap", boot)
    bs = paired_bootstrap(a, b, samples=int(boot["samples"]), seed=int(boot["seed"]))
    return {
        "a": statistics.fmean(a),
        "b": statistics.fmean(b),
        "n_pairs": len(pids),
        "diff": bs["diff"],
        "ci95": bs["ci95"],
        "bootstrap": {"samples": bs["samples"], "seed": bs["seed"], "se": bs.get("se")},
        "wilcoxon": wilcoxon_signed_rank(a, b),
    }


def compare_accuracy(reference: dict[str, dict], other: dict[str, dict], boot: dict, exact_below: int) -> dict:
    """Acc@1 and Acc@5 of `other` vs the reference ({patient id: last visit's grade}, the same patients):
    the difference with its paired bootstrap CI, and McNemar."""
    pids = sorted(reference)
    boot = filled("eval.stats.bootstrap", boot)
    result = {}
    for key, metric in ACCURACY_KEYS:
        a = [bool(reference[p][key]) for p in pids]
        b = [bool(other[p][key]) for p in pids]
        bs = paired_bootstrap(a, b, samples=int(boot["samples"]), seed=int(boot["seed"]))
        result[metric] = {
            "a": sum(a) / len(a) if a else None,
            "b": sum(b) / len(b) if b else None,
            "diff": bs["diff"],
            "ci95": bs["ci95"],
            "bootstrap": {"samples": bs["samples"], "seed": bs["seed"], "se": bs.get("se")},
            "mcnemar": mcnemar(a, b, exact_below=exact_below),
        }
    return result


def compare(reference: list[dict], other: list[dict], name: str, boot: dict, exact_below: int,
            specificity: dict | None = None) -> dict:
    """`name` vs the reference on paired patients: difference + paired bootstrap CI + McNemar per metric."""
    ref = {str(r["patient_id"]): r["visits"][-1]["grade"] for r in reference}
    oth = {str(r["patient_id"]): r["visits"][-1]["grade"] for r in other}
    if set(ref) != set(oth):
        missing = sorted(set(ref) ^ set(oth))[:5]
        raise InputError(f"eval: {name} and {REFERENCE} graded different patients (e.g. {missing}); pairs must match")
    result: dict[str, Any] = {"a": REFERENCE, "b": name, "n_pairs": len(ref), "difference": "b - a"}
    result.update(compare_accuracy(ref, oth, boot, exact_below))
    result["memory_recall"] = compare_memory_recall(reference, other, boot)
    result["memory_specificity"] = compare_specificity(reference, other, boot, specificity)
    return result


def gather(graded: dict[str, list[Path]], cfg: dict) -> tuple[dict, dict]:
    """{variant: [graded shard files]} -> (metrics, comparison)."""
    per_variant = {}
    for variant, paths in graded.items():
        records = [rec for p in sorted(paths, key=str) for rec in io.read_jsonl(p)]
        check_patients(variant, records)
        per_variant[variant] = records
    judge = FinalJudge(cfg.get("final_judge", {}))
    stats_cfg = filled("eval.stats", cfg.get("stats"))
    specificity = stats_cfg["specificity"]
    metrics = {
        "final_judge": judge.describe(),
        "scored_visit": "last visit of each patient (Acc@1, Acc@5); by_visit_index grades every graded visit",
        "variants": {v: variant_metrics(r, specificity) for v, r in per_variant.items()},
    }
    boot = stats_cfg["bootstrap"]
    exact_below = int(stats_cfg["mcnemar_exact_below"])
    if REFERENCE not in per_variant:
        raise InputError(f"eval gather: no {REFERENCE} variant among {sorted(per_variant)}")
    comparison = {
        "reference": REFERENCE,
        "primary": "trained",
        "comparisons": {
            v: compare(per_variant[REFERENCE], recs, v, boot, exact_below, specificity)
            for v, recs in per_variant.items()
            if v != REFERENCE
        },
    }
    return metrics, comparison
