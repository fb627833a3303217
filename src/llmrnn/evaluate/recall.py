"""Patients and memory recall: which patients an eval variant sees, and how much of each patient's
history its memory recalls."""

from __future__ import annotations

import random
import statistics

from llmrnn.errors import InputError
from llmrnn.reward import outcome_share
from llmrnn.rnn import summary_text

MEMORY_VARIANTS = ("base", "trained")  # memory = "rnn", only the memory role's weights differ
# variant -> run_forward memory mode; memprompt: the model's own recent errors with their corrections
BASELINES = {"zero_shot": "none", "full_history": "full_history", "memprompt": "memprompt"}
ROLES = ("prediction", "evaluation", "memory")
REFERENCE = "base"


def variant_mode(variant: str) -> str:
    if variant in MEMORY_VARIANTS:
        return "rnn"
    if variant in BASELINES:
        return BASELINES[variant]
    raise InputError(f"eval: unknown variant {variant!r}; expected one of {[*MEMORY_VARIANTS, *BASELINES]}")


# ----------------------------------------------------------------------------- selecting test patients
def select_patients(patients: list[dict], max_patients: int | None, seed: int) -> list[dict]:
    """The evaluated patients: all of the test split, or a seeded sample of `max_patients` (file order kept)."""
    if max_patients is None or max_patients >= len(patients):
        return list(patients)
    if max_patients < 1:
        raise InputError(f"eval.max_patients must be >= 1 or null, got {max_patients}")
    keep = sorted(random.Random(seed).sample(range(len(patients)), max_patients))
    return [patients[i] for i in keep]


def memory_shown(visit: dict) -> str:
    """The memory the prediction model saw at this visit: h_{t-1}'s summary (rnn; the initial memory for
    no-memory baselines), the concatenated history (full_history) or the recent errors (memprompt)."""
    if visit.get("memory_shown") is not None:
        return str(visit["memory_shown"])
    return summary_text(visit.get("h_prev") or "")


def patient_memory_recall(record: dict) -> list[tuple[int, float]]:
    """(visit_index, recall) for every visit t >= 1 of a patient record with diagnoses."""
    out = []
    for i, v in enumerate(record["visits"]):
        t = int(v.get("visit_index", i))
        if t >= 1 and v.get("ground_truth"):
            out.append((t, outcome_share(memory_shown(v), v["ground_truth"])))
    return out


def recall_by_patient(records: list[dict]) -> dict[str, float]:
    """Patient id -> mean memory recall over its transitions (patients with none are left out)."""
    out = {}
    for rec in records:
        values = [r for _, r in patient_memory_recall(rec)]
        if values:
            out[str(rec["patient_id"])] = statistics.fmean(values)
    return out


def memory_recall_metrics(records: list[dict]) -> dict | None:
    per_patient = recall_by_patient(records)
    if not per_patient:
        return None
    by_visit: dict[int, list[float]] = {}
    for rec in records:
        for t, r in patient_memory_recall(rec):
            by_visit.setdefault(t, []).append(r)
    return {
        "value": statistics.fmean(per_patient.values()),
        "unit": "patient (mean over its visit transitions)",
        "n_patients": len(per_patient),
        "n_transitions": sum(len(v) for v in by_visit.values()),
        "by_visit_index": {str(t): statistics.fmean(v) for t, v in sorted(by_visit.items())},
    }
