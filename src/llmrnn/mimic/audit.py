"""`llmrnn cohort audit`: how often each shown section of a cohort holds discharge-time signals.

Counts only, never text. Per shown section (every clinical_sections entry but the target): the visits that
have it, and how many of them hold each signal:
  discharge_wording  discharge / transfer / death wording (`discharged`, `D/C'd`, `expired`, `hospice`)
  later_day          a day after admission (`POD 2`, `HD #3`, `hospital day 4`, `on the day of discharge`),
                     or, where the build knows the admission date, a written date after it
  procedure_phrase   what was done (`underwent`, `s/p`, `...ectomy`, `...centesis`, `...scopy`, `intubation`,
                     `catheterization`, `PICC line placement`, `EGD`)
  result_phrase      a result or study (`IMPRESSION`, `FINDINGS`, `culture`, `no growth`, `GRAM STAIN`, `(Final ___)`,
                     `echocardiogram`, a date or `___` before a study name: `___ CXR`, `___ CHEST (PA & LAT)`,
                     `EF 35%` outside the history sections: a history's own past results are admission-time)
  target_verbatim    one of the visit's own discharge diagnoses, word for word (4+ letters)
  any                one of the above
A signal is a flag for a reviewer, not proof: a chronic diagnosis in the past medical history is a
target word for word and admission-time knowledge. The numbers compare modes and sections on one copy.
A section name the cohort format does not know is counted as `other` (never printed: a key can hold text).
The build's own audit (build_report.json `leak_audit`) also counts, per section, the lines the splitter
withheld because it could not place them (`unplaced_lines`, `visits_with_unplaced_lines`): what the
fail-closed rule costs on this copy.
"""

from __future__ import annotations

import re
from collections import Counter
from datetime import date
from pathlib import Path

from llmrnn import io
from llmrnn.errors import InputError
from llmrnn.mimic.sections import KEPT, diagnosis_list

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
        ("underwent", "s/p", "status post", "was performed", "placement", "intubat", "extubated", "ectomy",
         "otomy", "ostomy", "plasty", "scopy", "centesis", "catheteriz", "egd", "picc", "bronch", "cath "),
        (r"underwent|\bs/p\b|status post|was performed|placement|\bintubat|\bextubated|\bcatheteri[sz]ation"
         r"|\w(?:ectom|otom|ostom|plast|scop)y\b|\w+centesis\b|\begd\b|\bpicc\b|\bbronch\b|\bcath\b")),
    "result_phrase": (
        ("impression", "findings", "cultur", "grew", "no growth", "biopsy", "pathology", "showed", "revealed",
         "demonstrated", "ef", "gram stain", "echocardiogram", "(final", "(preliminary", "assay", "cxr", "ct ",
         "mri", "x-ray", "ultrasound", "echo", "chest (", "ekg", "ecg", "tte", "tee", "egd", "scopy", "centesis"),
        (r"\bimpression\b|\bfindings\b|\bcultures?\b|\bgrew\b|no growth|biopsy (?:showed|revealed)|pathology"
         r"|\b(?:echo|tte|ct|cxr|mri|ultrasound) (?:showed|revealed|demonstrated)|gram stain|echocardiogram"
         r"|\((?:final|preliminary)\b|\bassay\b|\bef\s*(?:of\s*)?\d+\s*%"
         r"|(?:___|\d{4}-\d{2}-\d{2}|\d{1,2}/\d{1,2}(?:/\d{2,4})?)\s+(?:cxr|ct|cta|mri|mra|us|ultrasound|echo|tte|tee"
         r"|ekg|ecg|chest|kub|x-?ray|egd|colonoscopy|eeg|portable|abdomen|head)\b"
         r"|\b(?:cxr|ct|cta|mri|echo\w*|tte|tee|ekg|ecg|egd|colonoscopy|eeg|\w+scopy|\w+centesis)\s+___")),
}
# a history's own past results (`CHF, EF 30%` in the past medical history) are admission-time knowledge
HISTORY_SECTIONS = ("past_medical_history", "history_present_illness", "social_history", "family_history",
                    "chief_complaint", "admission_medications")
_HISTORY_RESULT = re.compile(SIGNAL_RULES["result_phrase"][1].replace(r"|\bef\s*(?:of\s*)?\d+\s*%", ""))
SIGNALS = {name: re.compile(pattern) for name, (_, pattern) in SIGNAL_RULES.items()}
KINDS = (*SIGNALS, "target_verbatim", "any")
UNPLACED = ("unplaced_lines", "visits_with_unplaced_lines")
OTHER = "other"  # every section name outside the cohort format (KEPT)
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
                  rules: tuple[str, ...] | None = None, low: str | None = None, section: str | None = None
                  ) -> set[str]:
    """The signal kinds one section's text holds (see the module docstring). rules: only these can fire
    (possible_rules of the visit's sections); low: text.lower() where the caller has it; section: its
    name (a history section's own past results are no signal)."""
    low = text.lower() if low is None else low
    found = set()
    history = section in HISTORY_SECTIONS
    for name in SIGNAL_RULES if rules is None else rules:
        for key in SIGNAL_RULES[name][0]:  # a plain loop: a generator per rule costs more than the searches
            if key in low:
                pattern = _HISTORY_RESULT if history and name == "result_phrase" else SIGNALS[name]
                if pattern.search(low):
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
        self.unplaced: dict[str, Counter] | None = None  # the build's: lines withheld as unplaced, per section

    def add(self, shown: dict[str, str], targets: list[str], admitted: date | None = None) -> None:
        pattern = target_pattern(targets)
        self.add_signals({name: visit_signals(str(text), pattern, admitted, section=name)
                          for name, text in shown.items() if text and str(text).strip()})

    def add_unplaced(self, lines: dict[str, int]) -> None:
        """One visit's lines withheld because the splitter could not place them, per section."""
        if self.unplaced is None:
            self.unplaced = {}
        for name, n in lines.items():
            counter = self.unplaced.setdefault(name, Counter())
            counter["unplaced_lines"] += n
            counter["visits_with_unplaced_lines"] += 1

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
        out = {name: {"visits": c["visits"], **{k: c[k] for k in KINDS},
                      "share_any": round(c["any"] / c["visits"], 4) if c["visits"] else 0.0}
               for name, c in sorted(self.by_section.items())}
        if self.unplaced is not None:  # known to the build only
            for name in sorted(set(out) | set(self.unplaced)):
                row = out.setdefault(name, {"visits": 0, **dict.fromkeys(KINDS, 0), "share_any": 0.0})
                row.update({k: self.unplaced.get(name, Counter())[k] for k in UNPLACED})
        return out


def audit_cohort(patients: list[dict]) -> dict:
    """The audit of a cohort in the LLM-as-RNN format: every section but discharge_diagnosis is 'shown'.
    A section name outside the format (KEPT) is audited as `other`, its texts joined: a key is never
    printed, as it may hold patient text."""
    audit = Audit()
    for patient in patients:
        for visit in patient["visits"]:
            sections = visit.get("clinical_sections") or {}
            targets = diagnosis_list(sections.get("discharge_diagnosis") or "")
            shown = {k: v for k, v in sections.items() if k in KEPT}
            other = [str(v) for k, v in sections.items() if k not in KEPT and k != "discharge_diagnosis" and v]
            if other:
                shown[OTHER] = "\n".join(other)
            audit.add(shown, targets)
    return audit.summary()


def table(summary: dict) -> str:
    """The audit as aligned text lines (what `llmrnn cohort audit` prints)."""
    extra = [k for k in UNPLACED if any(k in c for c in summary.values())]
    head = ["section", "visits", *KINDS, *extra]
    rows = [[name if name in KEPT else OTHER, str(c["visits"]),
             *[f"{c[k]} ({c[k] / c['visits']:.0%})" if c["visits"] else "0" for k in KINDS],
             *[str(c.get(k, 0)) for k in extra]]
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
