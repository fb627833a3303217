"""Memory specificity: a memory recalls its own patient's history, not another patient's."""

from __future__ import annotations

import json
import random
import statistics
from typing import Any

from llmrnn.evaluate.recall import memory_shown
from llmrnn.reward import outcome_share
from llmrnn.rnn import summary_text
from llmrnn.runconfig import filled
from llmrnn.stats import paired_bootstrap, wilcoxon_signed_rank

# ----------------------------------------------------------------------------- patient specificity
# eval.stats.specificity's defaults are the models' (runconfig.filled), read where a section is used


def _transitions(record: dict) -> dict[int, tuple[str, list[str]]]:
    """visit index -> (memory shown, ground truth) for every visit t >= 1 with diagnoses."""
    out = {}
    for i, v in enumerate(record["visits"]):
        t = int(v.get("visit_index", i))
        if t >= 1 and v.get("ground_truth"):
            out[t] = (memory_shown(v), list(v["ground_truth"]))
    return out


def other_patients(pids: list[str], pid: str, others: int | None, seed: int) -> list[str]:
    """The fixed set of OTHER patients a patient's memories are scored against: all others, or a sample of
    `others` seeded by (seed, patient id), so every variant meets the same ones."""
    pool = sorted(p for p in pids if p != pid)
    if others is None or others >= len(pool):
        return pool
    return sorted(random.Random(f"{seed}:{pid}").sample(pool, int(others)))


def specificity_by_patient(records: list[dict], cfg: dict | None = None) -> dict[str, dict]:
    """Patient id -> {"own", "other", "gap"}: the recall of each memory h_{t-1} against the patient's own visit t
    ("own", the memory recall) and against the visit t of other patients ("other", mean over the fixed set of
    other_patients that have a visit t), averaged over the transitions that have both; gap = own - other.
    A memory that lists conditions common in the cohort scores on other patients' visits too; only what
    remembers THIS patient widens the gap."""
    cfg = filled("eval.stats.specificity", cfg)
    visits = {str(r["patient_id"]): _transitions(r) for r in records}
    pids = sorted(visits)
    out = {}
    for pid in pids:
        chosen = other_patients(pids, pid, cfg["others"], int(cfg["seed"]))
        own, other = [], []
        for t, (memory, truth) in sorted(visits[pid].items()):
            theirs = [visits[q][t][1] for q in chosen if t in visits[q]]
            if not theirs:
                continue
            own.append(outcome_share(memory, truth))
            other.append(statistics.fmean(outcome_share(memory, gt) for gt in theirs))
        if own:
            o, x = statistics.fmean(own), statistics.fmean(other)
            out[pid] = {"own": o, "other": x, "gap": o - x, "transitions": len(own)}
    return out


def specificity_metrics(records: list[dict], cfg: dict | None = None) -> dict | None:
    per = specificity_by_patient(records, cfg)
    if not per:
        return None
    cfg = filled("eval.stats.specificity", cfg)
    return {
        "own_recall": statistics.fmean(p["own"] for p in per.values()),
        "other_recall": statistics.fmean(p["other"] for p in per.values()),
        "gap": statistics.fmean(p["gap"] for p in per.values()),
        "n_patients": len(per),
        "n_transitions": sum(p["transitions"] for p in per.values()),
        "others_per_patient": cfg["others"],
        "seed": cfg["seed"],
        "definition": "own = recall of each memory h_{t-1} against the patient's own visit t; other = its recall "
                      "against visit t of a fixed, seeded set of other test patients; gap = own - other, "
                      "per patient (mean over transitions)",
    }


def compare_specificity(reference: list[dict], other: list[dict], boot: dict, cfg: dict | None = None) -> dict | None:
    """The specificity gap (own - other-patient recall) of `other` vs the reference, paired by patient:
    bootstrap CI of the difference in gaps and Wilcoxon signed-rank."""
    ref, oth = specificity_by_patient(reference, cfg), specificity_by_patient(other, cfg)
    pids = sorted(set(ref) & set(oth))
    if not pids:
        return None
    a, b = [ref[p]["gap"] for p in pids], [oth[p]["gap"] for p in pids]
    boot = filled("eval.stats.bootstrap", boot)
    bs = paired_bootstrap(a, b, samples=int(boot["samples"]), seed=int(boot["seed"]))
    return {
        "metric": "specificity gap (own-patient minus other-patient memory recall)",
        "a": statistics.fmean(a),
        "b": statistics.fmean(b),
        "a_other_recall": statistics.fmean(ref[p]["other"] for p in pids),
        "b_other_recall": statistics.fmean(oth[p]["other"] for p in pids),
        "a_own_recall": statistics.fmean(ref[p]["own"] for p in pids),
        "b_own_recall": statistics.fmean(oth[p]["own"] for p in pids),
        "n_pairs": len(pids),
        "diff": bs["diff"],
        "ci95": bs["ci95"],
        "bootstrap": {"samples": bs["samples"], "seed": bs["seed"], "se": bs.get("se")},
        "wilcoxon": wilcoxon_signed_rank(a, b),
    }


def memory_words(text: Any) -> int | None:
    """Length of a memory h_t in words (its evolving_summary when it is the JSON form)."""
    if text is None:
        return None
    return len(str(summary_text(text if isinstance(text, str) else json.dumps(text))).split())
