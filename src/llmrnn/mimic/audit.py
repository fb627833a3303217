"""`llmrnn cohort audit`: how often each shown section of a cohort holds discharge-time signals.

Counts only, never text. Per shown section (every clinical_sections entry but the target): the visits that
have it, and how many of them hold each signal:
  discharge_wording  discharge / transfer / death wording (`discharged`, `D/C'd`, `expired`, `hospice`)
  later_day          a day after admission (`POD 2`, `HD #3`, `hospital day 4`, `on the day of discharge`),
                     or, where the build knows the admission date, a written date after it
  procedure_phrase   what was done (`underwent`, `s/p`, `...ectomy`, `intubated`, `placement of`)
  result_phrase      a result read later (`IMPRESSION:`, `culture grew`, `no growth`, `biopsy showed`, `EF 35%`)
  target_verbatim    one of the visit's own discharge diagnoses, word for word (4+ letters)
  any                one of the above
A signal is a flag for a reviewer, not proof: a chronic diagnosis in the past medical history is a
target word for word and admission-time knowledge. The numbers compare modes and sections on one copy.
"""

from __future__ import annotations

import re
from collections import Counter
from datetime import date

SIGNALS = {
    "discharge_wording": re.compile(
        r"\b(discharg\w*|d/c'?d|dc'?d|transferred|expired|deceased|died|time of death|passed away|comfort measures"
        r"|hospice)\b", re.IGNORECASE),
    "later_day": re.compile(
        r"\b(POD|HD|hospital day|post-?op(?:erative)? day)\s*#?\s*\d+|\bday of (discharge|transfer)\b"
        r"|\bon (the )?day \d+\b", re.IGNORECASE),
    "procedure_phrase": re.compile(
        r"\b(underwent|s/p|status post|was performed|placement of|intubated|extubated|\w{3,}(ectomy|otomy|ostomy"
        r"|plasty|scopy))\b", re.IGNORECASE),
    "result_phrase": re.compile(
        r"\b(impression:|findings:|culture (grew|positive|negative)|grew|no growth|biopsy (showed|revealed)"
        r"|pathology|(echo|tte|ct|cxr|mri|ultrasound) (showed|revealed|demonstrated)|EF\s*(of\s*)?\d+\s*%)",
        re.IGNORECASE),
}
KINDS = (*SIGNALS, "target_verbatim", "any")
_DATE = re.compile(r"\b(\d{4})-(\d{2})-(\d{2})\b")
_SPACE = re.compile(r"\s+")


def _later_date(text: str, admitted: date | None) -> bool:
    if admitted is None:
        return False
    for m in _DATE.finditer(text):
        try:
            if date(int(m.group(1)), int(m.group(2)), int(m.group(3))) > admitted:
                return True
        except ValueError:
            continue
    return False


def visit_signals(text: str, targets: list[str], admitted: date | None = None) -> set[str]:
    """The signal kinds one section's text holds (see the module docstring)."""
    found = {name for name, pattern in SIGNALS.items() if pattern.search(text)}
    if "later_day" not in found and _later_date(text, admitted):
        found.add("later_day")
    flat = _SPACE.sub(" ", text).lower()
    for name in targets:
        name = _SPACE.sub(" ", name).strip().lower()
        if len(re.sub(r"[^a-z]", "", name)) >= 4 and re.search(rf"(?<!\w){re.escape(name)}(?!\w)", flat):
            found.add("target_verbatim")
            break
    if found:
        found.add("any")
    return found


class Audit:
    """Per section: visits with it, and with each signal (counts only)."""

    def __init__(self) -> None:
        self.by_section: dict[str, Counter] = {}

    def add(self, shown: dict[str, str], targets: list[str], admitted: date | None = None) -> None:
        for name, text in shown.items():
            if not text or not str(text).strip():
                continue
            counter = self.by_section.setdefault(name, Counter())
            counter["visits"] += 1
            for kind in visit_signals(str(text), targets, admitted):
                counter[kind] += 1

    def summary(self) -> dict:
        return {name: {"visits": c["visits"], **{k: c[k] for k in KINDS},
                       "share_any": round(c["any"] / c["visits"], 4) if c["visits"] else 0.0}
                for name, c in sorted(self.by_section.items())}


def audit_cohort(patients: list[dict]) -> dict:
    """The audit of a cohort in the LLM-as-RNN format: every section but discharge_diagnosis is 'shown'."""
    from llmrnn.mimic.sections import diagnosis_list

    audit = Audit()
    for patient in patients:
        for visit in patient["visits"]:
            sections = visit.get("clinical_sections") or {}
            targets = diagnosis_list(sections.get("discharge_diagnosis") or "")
            audit.add({k: v for k, v in sections.items() if k != "discharge_diagnosis"}, targets)
    return audit.summary()


def table(summary: dict) -> str:
    """The audit as aligned text lines (what `llmrnn cohort audit` prints)."""
    head = ["section", "visits", *KINDS]
    rows = [[name, str(c["visits"]), *[f"{c[k]} ({c[k] / c['visits']:.0%})" if c["visits"] else "0" for k in KINDS]]
            for name, c in summary.items()]
    widths = [max(len(r[i]) for r in [head, *rows]) for i in range(len(head))]
    return "\n".join("  ".join(cell.ljust(w) for cell, w in zip(r, widths)).rstrip() for r in [head, *rows])
