"""The section table of a MIMIC-IV-Note discharge summary and the splitter that reads it.

A header is a line `Label:` (optionally with text after the colon). Labels are normalised (lower case,
every run of non-letters one space), so `PAST MEDICAL HISTORY:`, `Past Medical/Surgical History :` and
`past  medical history:` meet the same entry of HEADERS. How a line is read:
  - a known label starts its canonical section (single-word labels such as `Exam:` only when alone on the
    line); the same canonical again while inside it is content (`Diagnoses:` within Discharge Diagnosis);
  - an unknown label alone on its line after a blank line is an UNKNOWN header: counted, and its text
    kept out of every section until the next known header (never merged into the previous section).
    Inside physical_exam and pertinent_results such labels are the section's own parts (ADMISSION
    LABS:, IMAGING:); inside discharge_diagnosis and past_medical_history their usual sub-list labels are;
  - everything else is content of the current section.
Discharge-time text is withheld: the sections in DISCHARGE_TIME are never returned, and physical_exam and
pertinent_results end at their first line whose label names discharge (`DISCHARGE EXAM:`, `Labs on
discharge:`); a leading admission label (`ADMISSION EXAM:`) is dropped.
"""

from __future__ import annotations

import functools
import re
from dataclasses import dataclass, field

# canonical section <- header variants (as written in notes; normalised when the table is built)
HEADER_VARIANTS: dict[str, tuple[str, ...]] = {
    "_header": ("Name", "Unit No", "Admission Date", "Discharge Date", "Date of Birth", "Sex", "Service",
                "Attending"),
    "allergies": ("Allergies", "Allergy", "Drug Allergies", "Allergies/Adverse Drug Reactions"),
    "chief_complaint": ("Chief Complaint", "Chief Complaints", "CC", "Reason for Admission"),
    "procedures": ("Major Surgical or Invasive Procedure", "Major Surgical or Invasive Procedures",
                   "Major Surgical and Invasive Procedure", "Major Surgical or Invasive Procedure(s)",
                   "Invasive Procedures", "Procedures"),
    "history_present_illness": ("History of Present Illness", "History of the Present Illness", "HPI",
                                "Present Illness"),
    "past_medical_history": ("Past Medical History", "Past Medical/Surgical History",
                             "Past Medical and Surgical History", "Past Surgical History", "PMH", "PMHx",
                             "Past History", "Medical History"),
    "social_history": ("Social History", "Social Hx", "SH"),
    "family_history": ("Family History", "Family Hx", "FH"),
    "physical_exam": ("Physical Exam", "Physical Examination", "Exam", "Admission Exam",
                      "Admission Physical Exam", "Physical Exam on Admission"),
    "pertinent_results": ("Pertinent Results", "Pertinent Labs", "Results", "Labs", "Laboratory Results",
                          "Data"),
    "hospital_course": ("Brief Hospital Course", "Hospital Course", "Summary of Hospital Course",
                        "Brief Summary of Hospital Course", "Hospital Course by Problem"),
    "admission_medications": ("Medications on Admission", "Admission Medications", "Meds on Admission",
                              "Home Medications", "Outpatient Medications", "Preadmission Medications",
                              "Medications Prior to Admission"),
    "discharge_medications": ("Discharge Medications", "Discharge Meds", "Medications on Discharge"),
    "discharge_disposition": ("Discharge Disposition", "Disposition", "Facility"),
    "discharge_diagnosis": ("Discharge Diagnosis", "Discharge Diagnoses", "Final Diagnosis",
                            "Final Diagnoses", "Diagnoses", "Diagnosis"),
    "discharge_condition": ("Discharge Condition", "Condition at Discharge", "Condition on Discharge"),
    "discharge_instructions": ("Discharge Instructions", "Instructions"),
    "followup_instructions": ("Followup Instructions", "Follow-up Instructions", "Follow up Instructions",
                              "Followup", "Follow up"),
    "addendum": ("Addendum",),
}
# Written at or after discharge: never shown as the visit (discharge_diagnosis is the target and is
# returned only as the parsed list, which the prompts never render).
DISCHARGE_TIME = ("hospital_course", "discharge_medications", "discharge_disposition", "discharge_diagnosis",
                  "discharge_condition", "discharge_instructions", "followup_instructions", "addendum")
# What the cohort keeps, in this order (llmrnn.cohort's record format).
KEPT = ("chief_complaint", "history_present_illness", "past_medical_history", "procedures",
        "admission_medications", "pertinent_results", "physical_exam", "social_history", "family_history")
ADMISSION_AND_DISCHARGE = ("physical_exam", "pertinent_results")
SUBLABEL_WORDS = {
    "discharge_diagnosis": {"primary", "secondary", "diagnosis", "diagnoses", "dx", "chronic", "active",
                            "acute", "resolved", "other", "problems", "issues", "discharge", "final",
                            "principal", "additional", "conditions", "medical", "and"},
    "past_medical_history": {"history", "medical", "surgical", "oncologic", "oncology", "cardiac",
                             "psychiatric", "pmh", "psh", "past", "other", "problems", "hx"},
}
PRIMARY_WORDS = {"primary", "principal"}
# an unknown label with one of these words starts withheld text, whatever section it stands in
DISCHARGE_TIME_WORDS = {"discharge", "discharged", "course", "instructions", "followup", "disposition", "addendum"}


_NON_LETTERS = re.compile(r"[^a-z]+")
@functools.lru_cache(maxsize=100_000)
def header_key(label: str) -> str:
    """A header's lookup key in the table: `Past Medical/Surgical History ` -> `past medical surgical
    history` (cached: labels repeat). Not llmrnn.matching.normalise, which compares diagnoses."""
    return _NON_LETTERS.sub(" ", label.lower()).strip()


HEADERS: dict[str, str] = {header_key(v): canonical for canonical, vs in HEADER_VARIANTS.items() for v in vs}
# matched against "\n" + text: a leading literal lets the engine jump from line start to line start
_LABEL_LINE = re.compile(r"\n[ \t]*([A-Za-z][A-Za-z0-9 ,/&()'\-]{0,60}?)[ \t]*:[ \t]*([^\n]*)")
_DISCHARGE_WORD = re.compile(r"\bdischarge", re.IGNORECASE)
_ADMISSION_WORD = re.compile(r"\b(admission|admit|arrival|presentation)", re.IGNORECASE)
_NUMBER = re.compile(r"^(?:\(?\d{1,3}[.):]|\(?[a-zA-Z][.)](?=\s)|[-*\u2022#>]+)\s*")


@dataclass
class SplitNote:
    sections: dict[str, str] = field(default_factory=dict)  # canonical -> text (discharge-time ones too)
    unknown_headers: int = 0
    repeated: int = 0


def _after_blank(text: str, start: int) -> bool:
    if start <= 1:  # the first line of the note (text starts with the added newline)
        return True
    prev_end = start - 1  # the newline ending the previous line
    prev_start = text.rfind("\n", 0, prev_end) + 1
    return not text[prev_start:prev_end].strip()


def _written_at_discharge(norm: str) -> bool:
    """An unknown label naming discharge-time text (`Discharge Labs`, `Hospital Course by Systems`); the
    ED course in the history is admission-time text."""
    words = set(norm.split())
    return bool(words & DISCHARGE_TIME_WORDS) and not norm.startswith("ed ")


def _is_sublabel(current: str, norm: str) -> bool:
    if current in ADMISSION_AND_DISCHARGE or current == "hospital_course":  # their own parts (`# Sepsis:`)
        return True
    words = SUBLABEL_WORDS.get(current)
    return bool(words) and any(w in words for w in norm.split())


def split_note(text: str) -> SplitNote:
    """Canonical section -> its text, with the count of unknown headers (see the module docstring)."""
    out = SplitNote()
    parts: list[tuple[str, int, int]] = []  # (canonical, content start, header start)
    current = "_header"
    text = "\n" + text  # positions below are in this text; slicing it gives the same sections
    for m in _LABEL_LINE.finditer(text):
        norm = header_key(m.group(1))
        canonical = HEADERS.get(norm)
        alone = not m.group(2).strip()
        if canonical is not None and (alone or " " in norm or canonical in ("_header", "allergies")):
            if canonical == current:
                continue  # `Diagnoses:` inside Discharge Diagnosis: a sub-label, content
            parts.append((canonical, m.start(2), m.start() + 1))
            current = canonical
        elif _written_at_discharge(norm) and not (current == "discharge_diagnosis" and _is_sublabel(current, norm)):
            out.unknown_headers += 1  # `DISCHARGE LABS:`, `Hospital Course by Systems:` anywhere: withheld
            parts.append(("_unknown", m.start(2), m.start() + 1))
            current = "_unknown"
        elif alone and norm and _after_blank(text, m.start() + 1) and not _is_sublabel(current, norm):
            out.unknown_headers += 1
            parts.append(("_unknown", m.end(), m.start() + 1))
            current = "_unknown"
    bounds = [(p[0], p[1], parts[i + 1][2] if i + 1 < len(parts) else len(text)) for i, p in enumerate(parts)]
    for canonical, start, end in bounds:
        if canonical.startswith("_"):
            continue
        body = text[start:end].strip()
        if canonical in out.sections:
            out.repeated += 1
            out.sections[canonical] = f"{out.sections[canonical]}\n\n{body}".strip()
        else:
            out.sections[canonical] = body
    for name in ADMISSION_AND_DISCHARGE:
        if name in out.sections:
            out.sections[name] = admission_part(out.sections[name])
    return out


def admission_part(body: str) -> str:
    """The lines before the first one whose label names discharge; a leading admission label dropped."""
    lines = body.split("\n")
    kept: list[str] = []
    for line in lines:
        label = line.split(":", 1)[0] if ":" in line else line
        if len(label) <= 60 and _DISCHARGE_WORD.search(label):
            break
        kept.append(line)
    while kept and not kept[0].strip():
        kept.pop(0)
    if kept:
        first = kept[0].strip()
        if first.endswith(":") and len(first) <= 60 and _ADMISSION_WORD.search(first):
            kept.pop(0)
    return "\n".join(kept).strip()


def diagnosis_list(body: str | None) -> list[str]:
    """A Discharge Diagnosis section -> names, primary sub-list first; sub-list labels (`Primary:`,
    `SECONDARY DIAGNOSES:`), numbering and bullets removed; duplicates (case-insensitive) dropped."""
    if not body:
        return []
    primary: list[str] = []
    other: list[str] = []
    target = other
    for raw in body.split("\n"):
        line = raw.strip()
        m = re.match(r"^([A-Za-z][A-Za-z ,/&()'\-]{0,50}?)\s*:\s*(.*)$", line)
        if m and (words := header_key(m.group(1)).split()) and all(w in SUBLABEL_WORDS["discharge_diagnosis"]
                                                                   for w in words):
            target = primary if any(w in PRIMARY_WORDS for w in words) else other
            line = m.group(2).strip()
        item = _NUMBER.sub("", line).strip().rstrip(" .,;")
        if item:
            target.append(item)
    names, seen = [], set()
    for item in primary + other:
        if item.lower() not in seen:
            seen.add(item.lower())
            names.append(item)
    return names


def numbered(names: list[str]) -> str:
    """The cohort's discharge_diagnosis text: `1. name` lines (llmrnn.rnn.parse_diagnoses reads them)."""
    return "\n".join(f"{i}. {name}" for i, name in enumerate(names, 1))
