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
from pathlib import Path

from llmrnn import io
from llmrnn.errors import InputError
from llmrnn.mimic.sections import diagnosis_list

# signal -> (literals one of which must be in the lower-cased text, the pattern that confirms it there):
# str.find over the literals first, as most sections hold none (a case-insensitive regex alone is slow)
SIGNAL_RULES = {
    "discharge_wording": (
        ("discharg", "d/c", "dc'd", "dcd", "transferred", "expired", "deceased", "died", "death", "passed away",
         "comfort measures", "hospice"),
        r"discharg|\bd/?c'?d\b|transferred|expired|deceased|\bdied\b|time of death|passed away|comfort measures|hospice"),
    "later_day": (
        ("pod", "hd", "hospital day", "op day", "operative day", "day of ", "on day", "the day "),
        (r"(?<![a-z])(?:pod|hd|hospital day|post-?op(?:erative)? day)\s*#?\s*\d|\bday of (?:discharge|transfer)\b"
        r"|\bon (?:the )?day \d")),
    "procedure_phrase": (
        ("underwent", "s/p", "status post", "was performed", "placement of", "intubated", "extubated", "ectomy",
         "otomy", "ostomy", "plasty", "scopy"),
        (r"underwent|\bs/p\b|status post|was performed|placement of|\bintubated|\bextubated"
        r"|\w(?:ectom|otom|ostom|plast|scop)y\b")),
    "result_phrase": (
        ("impression:", "findings:", "culture", "grew", "no growth", "biopsy", "pathology", "showed", "revealed",
         "demonstrated", "ef"),
        (r"impression:|findings:|culture (?:grew|positive|negative)|\bgrew\b|no growth|biopsy (?:showed|revealed)"
        r"|pathology|\b(?:echo|tte|ct|cxr|mri|ultrasound) (?:showed|revealed|demonstrated)|\bef\s*(?:of\s*)?\d+\s*%")),
}
SIGNALS = {name: re.compile(pattern) for name, (_, pattern) in SIGNAL_RULES.items()}
KINDS = (*SIGNALS, "target_verbatim", "any")
_DATE = re.compile(r"(?<!\d)([12]\d{3})-(\d{2})-(\d{2})(?!\d)")


def _later_date(text: str, admitted: date | None) -> bool:
    if admitted is None or "-" not in text:
        return False
    for m in _DATE.finditer(text):
        try:
            if date(int(m.group(1)), int(m.group(2)), int(m.group(3))) > admitted:
                return True
        except ValueError:
            continue
    return False


class TargetNames:
    """A visit's target names (4+ letters), found word for word in a text (case and line breaks aside);
    plain string search: compiling a pattern per visit costs more than the search."""

    def __init__(self, targets: list[str]) -> None:
        names = {" ".join(n.lower().split()) for n in targets}
        self.names = [n for n in names if sum(map(str.isalpha, n)) >= 4]

    def search(self, text: str, low: str | None = None) -> bool:
        """low: text.lower() where the caller has it."""
        if not self.names:
            return False
        low = low if low is not None else text.lower()
        if "\n" in low or "  " in low or "\t" in low:
            low = " ".join(low.split())
        for name in self.names:
            at = low.find(name)
            while at >= 0:
                end = at + len(name)
                if (at == 0 or not low[at - 1].isalnum()) and (end == len(low) or not low[end].isalnum()):
                    return True
                at = low.find(name, at + 1)
        return False


def target_pattern(targets: list[str]) -> TargetNames | None:
    found = TargetNames(targets)
    return found if found.names else None


def possible_rules(lows) -> tuple[str, ...]:
    """The rules whose literals occur in any of these lower-cased texts: one pass over a visit's sections
    joined, not one per section (most sections hold no literal of most rules)."""
    joined = "\x00".join(lows)  # no literal holds a NUL: none matches across two sections
    found = []
    for name, (keys, _) in SIGNAL_RULES.items():
        for key in keys:
            if key in joined:
                found.append(name)
                break
    return tuple(found)


def visit_signals(text: str, targets: list[str] | TargetNames | None, admitted: date | None = None,
                  rules: tuple[str, ...] | None = None, low: str | None = None) -> set[str]:
    """The signal kinds one section's text holds (see the module docstring). rules: only these can fire
    (possible_rules of the visit's sections); low: text.lower() where the caller has it."""
    low = text.lower() if low is None else low
    found = set()
    for name in SIGNAL_RULES if rules is None else rules:
        for key in SIGNAL_RULES[name][0]:  # a plain loop: a generator per rule costs more than the searches
            if key in low:
                if SIGNALS[name].search(low):
                    found.add(name)
                break
    if "later_day" not in found and _later_date(text, admitted):
        found.add("later_day")
    names = target_pattern(targets) if isinstance(targets, list) else targets
    if names is not None and names.search(text, low):
        found.add("target_verbatim")
    if found:
        found.add("any")
    return found


class Audit:
    """Per section: visits with it, and with each signal (counts only)."""

    def __init__(self) -> None:
        self.by_section: dict[str, Counter] = {}

    def add(self, shown: dict[str, str], targets: list[str], admitted: date | None = None) -> None:
        pattern = target_pattern(targets)
        self.add_signals({name: visit_signals(str(text), pattern, admitted) for name, text in shown.items()
                          if text and str(text).strip()})

    def add_signals(self, signals: dict[str, set[str] | list[str]]) -> None:
        """Counts of sections whose signals were found elsewhere (the build's workers)."""
        for name, kinds in signals.items():
            counter = self.by_section.get(name)
            if counter is None:  # not setdefault(name, Counter()): that builds a Counter per call
                counter = self.by_section[name] = Counter()
            counter["visits"] += 1
            for kind in kinds:
                counter[kind] += 1

    def summary(self) -> dict:
        return {name: {"visits": c["visits"], **{k: c[k] for k in KINDS},
                       "share_any": round(c["any"] / c["visits"], 4) if c["visits"] else 0.0}
                for name, c in sorted(self.by_section.items())}


def audit_cohort(patients: list[dict]) -> dict:
    """The audit of a cohort in the LLM-as-RNN format: every section but discharge_diagnosis is 'shown'."""
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


def command(args, load_cohort) -> None:
    """`llmrnn cohort audit`: one table per cohort (e.g. built in each mode, side by side); --out: the
    counts as JSON. load_cohort: llmrnn.cohort's reader (passed in: cohort imports this module)."""
    if args.out and any(Path(c).resolve() == Path(args.out).resolve() for c in args.cohort):
        raise InputError(f"--out and --cohort name the same file {args.out}; give each its own")
    summaries = {str(c): audit_cohort(load_cohort(c)) for c in args.cohort}
    if args.out:
        io.write_texts({args.out: io.json_text({"signals": list(KINDS), "cohorts": summaries})})
    print("\n\n".join(f"{path}\n{table(summary)}" for path, summary in summaries.items()))
