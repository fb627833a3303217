"""The section table of a MIMIC-IV-Note discharge summary and the allow-list splitter that reads it.

Text is SHOWN only where the note's top-level structure positively says it is admission-time; everything
else is withheld and counted. How a note is read:
  - a header is a line that starts with a known label and a colon (`Past Medical History:`). Labels are
    normalised (lower case, every run of non-letters one space), so `PAST MEDICAL HISTORY:` and
    `Past Medical/Surgical History :` meet the same entry of HEADERS;
  - headers count only where the discharge-summary template puts them (TEMPLATE_ORDER): the header block
    (Name, Admission Date, Allergies, Attending), then the admission block (Chief Complaint ... Pertinent
    Results, in any order among themselves), then the discharge block (Brief Hospital Course ...
    Followup Instructions, forward only). A label that would reopen a section already seen, or go back
    from the discharge block into the admission block, is narrative: content of the section it stands in
    (`Past medical history:` inside the Brief Hospital Course stays in the withheld course);
  - a shown section's header must stand alone on its line, and a loose wording (`Home Medications:`,
    `Diagnoses:`) yields to a template wording of the same section later in the note; the target's loose
    wordings (`Diagnosis:`, `Final Diagnosis:`) count only in the discharge block, so a pathology report's
    `DIAGNOSIS:` inside Pertinent Results never opens the target;
  - inside a shown section that is not mixed, an unknown label alone on its line after a blank line ends
    the section (its text withheld, counted); a label naming discharge-time text (`DISCHARGE LABS:`,
    `Transitional Issues:`) withholds from that line on, wherever it stands;
  - the mixed sections (Physical Exam, Pertinent Results) are cut into parts at their sub-labels; only the
    opening block and parts whose label names admission or presentation are kept (ADMISSION_PART). Every
    other part (D/C, discharge, transfer, death, imaging, microbiology, pathology, echo, unnamed labs) is
    withheld and counted by kind. In kept results, lab lines of a later draw (a second `___ 07:20AM`
    time stamp) are withheld too.
Which of the sections are shown is a build setting (cohort.mimic_iv.mode / sections); RISK says what each
one risks.
"""

from __future__ import annotations

import functools
import re
from collections import Counter
from dataclasses import dataclass, field

from llmrnn.settings.workflow import ADMISSION_TIME, MODES, REFERENCE, RISK  # noqa: F401 (re-exported)

# canonical section <- header variants (as written in notes; normalised when the table is built).
# The first variant of each is the template's wording.
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
    "discharge_diagnosis": ("Discharge Diagnosis", "Discharge Diagnoses", "Discharge Dx", "Discharge Dxs",
                            "Discharge Diagnosis/Diagnoses", "Final Diagnosis", "Final Diagnoses", "Diagnoses",
                            "Diagnosis"),
    "discharge_condition": ("Discharge Condition", "Condition at Discharge", "Condition on Discharge"),
    "discharge_instructions": ("Discharge Instructions", "Instructions"),
    "followup_instructions": ("Followup Instructions", "Follow-up Instructions", "Follow up Instructions",
                              "Followup", "Follow up"),
    "addendum": ("Addendum",),
}
# where the template puts each section: 0 the header block, 1 the admission block (any order inside),
# 2.. the discharge block (forward only)
TEMPLATE_ORDER: dict[str, int] = {
    "_header": 0, "allergies": 0,
    **dict.fromkeys(("chief_complaint", "procedures", "history_present_illness", "past_medical_history",
                     "social_history", "family_history", "physical_exam", "pertinent_results"), 1),
    "hospital_course": 2, "admission_medications": 3, "discharge_medications": 4, "discharge_disposition": 5,
    "discharge_diagnosis": 6, "discharge_condition": 7, "discharge_instructions": 8, "followup_instructions": 9,
    "addendum": 10,
}
# the target's wordings that count anywhere after the admission block; the others only from Discharge
# Medications on (a pathology report's DIAGNOSIS: or FINAL DIAGNOSIS: sits inside Pertinent Results)
TARGET_STRICT = ("Discharge Diagnosis", "Discharge Diagnoses", "Discharge Dx", "Discharge Dxs",
                 "Discharge Diagnosis/Diagnoses")

# RISK (what each section risks when shown), ADMISSION_TIME, REFERENCE and MODES live with the settings
# (cohort.mimic_iv.mode / sections), imported above
SHOWABLE = tuple(RISK)
# What the cohort keeps, in this order (llmrnn.cohort's record format), when shown.
KEPT = ("chief_complaint", "history_present_illness", "past_medical_history", "procedures",
        "admission_medications", "hospital_course", "pertinent_results", "physical_exam", "social_history",
        "family_history")
DISCHARGE_TIME = ("hospital_course", "discharge_medications", "discharge_disposition", "discharge_diagnosis",
                  "discharge_condition", "discharge_instructions", "followup_instructions", "addendum")
ADMISSION_AND_DISCHARGE = ("physical_exam", "pertinent_results")
SUBLABEL_WORDS = {
    "discharge_diagnosis": {"primary", "secondary", "diagnosis", "diagnoses", "dx", "dxs", "chronic", "active",
                            "acute", "resolved", "other", "problems", "issues", "discharge", "final",
                            "principal", "additional", "conditions", "medical", "and", "s"},
    "past_medical_history": {"history", "medical", "surgical", "oncologic", "oncology", "cardiac",
                             "psychiatric", "pmh", "psh", "past", "other", "problems", "hx"},
}
PRIMARY_WORDS = {"primary", "principal"}
# an unknown label with one of these words starts withheld text, whatever section it stands in
DISCHARGE_TIME_WORDS = {"discharge", "discharged", "course", "instructions", "followup", "disposition", "addendum",
                        "transitional"}


_NON_LETTERS = re.compile(r"[^a-z]+")
@functools.lru_cache(maxsize=100_000)
def header_key(label: str) -> str:
    """A header's lookup key in the table: `Past Medical/Surgical History ` -> `past medical surgical
    history` (cached: labels repeat). Not llmrnn.matching.normalise, which compares diagnoses."""
    return _NON_LETTERS.sub(" ", label.lower()).strip()


HEADERS: dict[str, str] = {header_key(v): canonical for canonical, vs in HEADER_VARIANTS.items() for v in vs}
TEMPLATE_WORDING = {header_key(vs[0]) for vs in HEADER_VARIANTS.values()} | {header_key(v) for v in TARGET_STRICT}
# matched against "\n" + text: a leading literal lets the engine jump from line start to line start; the
# label is taken whole at once (a lookahead and a back-reference: an atomic group before Python 3.11), as
# a lazy or backtracking label tried every shorter label on each line of prose
_LABEL_LINE = re.compile(r"\n[ \t]*(?=([A-Za-z][A-Za-z0-9 ,/&()'\-]{0,60}))\1[ \t]*:[ \t]*([^\n]*)")

# ----------------------------------------------------------------------------- parts of a mixed section
_PART_WORDS = re.compile(
    r"\b(exam|examination|pe|labs?|laboratory|results?|studies|study|data|imaging|radiology|micro"
    r"|microbiology|cultures?|path|pathology|biopsy|cytology|echo|tte|tee|ekg|ecg|cxr|ct|cta|mri|mra|us"
    r"|ultrasound|x ?ray|xray|kub|films?|cath|catheterization|eeg|emg|pft)\b", re.IGNORECASE)
_ADMISSION_LABEL = re.compile(r"\b(admission|admit|admitting|admitted|arrival|presentation|presenting|initial"
                              r"|intake|ed|emergency)\b", re.IGNORECASE)
# kinds of a withheld part, first match wins
_PART_KIND = (
    ("discharge", re.compile(r"d\s*/\s*c|\bdc\b|dis?ch?a?r?g|dsch|disch|dispo|\bdischarge", re.IGNORECASE)),
    ("transfer", re.compile(r"transfer|\bxfer|\bcall ?out|\bupon arrival to (the )?floor", re.IGNORECASE)),
    ("death", re.compile(r"death|expired|deceased|\bdied\b|\bpassed\b|\bexpiration", re.IGNORECASE)),
    ("imaging", re.compile(r"imaging|radiology|\b(cxr|ct|cta|mri|mra|us|kub|x ?ray|xray|films?|ultrasound"
                           r"|studies|study)\b", re.IGNORECASE)),
    ("microbiology", re.compile(r"micro|culture|\bcx\b", re.IGNORECASE)),
    ("pathology", re.compile(r"path|biopsy|cytology", re.IGNORECASE)),
    ("echo_ekg", re.compile(r"\b(echo|tte|tee|ekg|ecg|cath|catheterization|eeg|emg|pft)\b", re.IGNORECASE)),
)
_LAB_STAMP = re.compile(r"^[ \t]*(?:___|\[\*\*[^\]]*\*\*\]|\d{1,4}[-/]\d{1,2}[-/]\d{1,4})?[ \t]*"
                        r"(\d{1,2}:\d{2}[ \t]*(?:AM|PM|am|pm)?)[ \t]+[A-Z]")


@functools.lru_cache(maxsize=100_000)
def _part_kind(label: str) -> str:
    for kind, pattern in _PART_KIND:
        if pattern.search(label):
            return kind
    return "other"


@functools.lru_cache(maxsize=100_000)
def _starts_part(label: str, alone: bool) -> bool:
    return bool(_PART_WORDS.search(label) or any(p.search(label) for _, p in _PART_KIND[:3])
                or _written_at_discharge(header_key(label)) or (alone and _ADMISSION_LABEL.search(label)))


@functools.lru_cache(maxsize=100_000)
def _is_admission(label: str) -> bool:
    return bool(_ADMISSION_LABEL.search(label)) and _part_kind(label) not in ("discharge", "transfer", "death")


# matched against "\n" + body (a leading literal: the engine jumps from line start to line start)
_CANDIDATE = re.compile(r"\n[ \t]*(?:[-*\u2022][ \t]*)?(?:([A-Za-z#][\w ,/&()'#.\-]{0,60}?)[ \t]*:[ \t]*([^\n]*)"
                        r"|([A-Z][A-Z0-9 /&()'\-]{2,50})[ \t]*)(?=\n|\Z)")


def _first_draw(chunk: str, withheld: Counter, section: str) -> str:
    """A kept part of the results without the lab lines of a later draw (another time stamp than the
    part's first), their wrapped continuation lines with them; a blank line ends a draw."""
    if ":" not in chunk:  # every time stamp has one
        return chunk
    kept, first_stamp, keep_draw = [], None, True
    for line in chunk.split("\n"):
        stamp = _LAB_STAMP.match(line)
        if stamp:
            when = stamp.group(1).replace(" ", "").upper()
            first_stamp = first_stamp or when
            keep_draw = when == first_stamp
            if not keep_draw:
                withheld[f"{section}:later_draw_lines"] += 1
        elif not line.strip():
            keep_draw = True
        if keep_draw:
            kept.append(line)
    return "\n".join(kept)


def admission_part(body: str, withheld: Counter | None = None, section: str = "physical_exam") -> str:
    """The opening block and the parts whose label names admission/presentation (their label lines
    dropped); every other part withheld, counted in `withheld` as `<section>:<kind>` (a run of parts of
    one kind once: `CT abd:` inside IMAGING). In pertinent_results a lab line of another draw than the
    part's first (another time stamp) is withheld too (_first_draw)."""
    withheld = withheld if withheld is not None else Counter()
    bounds = []  # (label line start, its end, label, text after the label)
    for m in _CANDIDATE.finditer("\n" + body):  # positions in body: one less
        label, rest = (m.group(1), m.group(2)) if m.group(1) is not None else (m.group(3), "")
        if _starts_part(label, not rest.strip()):
            bounds.append((m.start(), m.end() - 1, label, rest))
    draws = section == "pertinent_results"
    opening = body[:bounds[0][0]] if bounds else body
    chunks = [_first_draw(opening, withheld, section) if draws else opening]
    kind = None
    for i, (_, end, label, rest) in enumerate(bounds):
        upto = bounds[i + 1][0] if i + 1 < len(bounds) else len(body)
        if _is_admission(label):
            kind = None
            chunk = (rest + "\n" if rest.strip() else "") + body[end + 1:upto]
            chunks.append(_first_draw(chunk, withheld, section) if draws else chunk)
        elif _part_kind(label) != kind:
            kind = _part_kind(label)
            withheld[f"{section}:{kind}"] += 1
    return "".join(c if c.endswith("\n") or not c else c + "\n" for c in chunks).strip()


# ----------------------------------------------------------------------------- the splitter
@dataclass
class SplitNote:
    sections: dict[str, str] = field(default_factory=dict)  # canonical -> text (discharge-time ones too)
    full: dict[str, str] = field(default_factory=dict)  # the mixed sections before the admission cut
    unknown_headers: int = 0
    repeated: int = 0  # a header of a section already seen, or going back: narrative, not a new section
    withheld: Counter = field(default_factory=Counter)  # `<section>:<kind>` -> parts withheld


def _after_blank(text: str, start: int) -> bool:
    if start <= 1:  # the first line of the note (text starts with the added newline)
        return True
    prev_end = start - 1  # the newline ending the previous line
    prev_start = text.rfind("\n", 0, prev_end) + 1
    return not text[prev_start:prev_end].strip()


@functools.lru_cache(maxsize=100_000)
def _written_at_discharge(norm: str) -> bool:
    """An unknown label naming discharge-time text (`Discharge Labs`, `Hospital Course by Systems`); the
    ED course in the history is admission-time text."""
    words = set(norm.split())
    return bool(words & DISCHARGE_TIME_WORDS) and not norm.startswith("ed ")


def _is_sublabel(current: str, norm: str) -> bool:
    if current in ADMISSION_AND_DISCHARGE or TEMPLATE_ORDER.get(current, 1) >= 2:  # their own parts
        return True
    words = SUBLABEL_WORDS.get(current)
    return bool(words) and any(w in words for w in norm.split())


def _opens(canonical: str, norm: str, alone: bool, current: str, seen: set[str]) -> bool:
    """Whether a known label at line start is a top-level header here (see the module docstring)."""
    order, now = TEMPLATE_ORDER[canonical], TEMPLATE_ORDER.get(current, 1)
    if order == 0:  # the header block: only before the first section
        return now == 0
    if canonical in seen:
        return False
    if order >= 2 and canonical != "admission_medications" and alone and norm in TEMPLATE_WORDING:
        return True  # a withheld section's template header ends whatever stands before it, in any order
    if not (order > now or (order == 1 and now <= 1)):
        return False
    if canonical == "discharge_diagnosis" and norm not in TEMPLATE_WORDING and now < TEMPLATE_ORDER["discharge_medications"]:
        return False
    if order == 1 or canonical == "admission_medications":  # a shown section: its header alone on the line
        return alone
    return alone or " " in norm  # withheld text: `Discharge Dx: pneumonia` too


@functools.lru_cache(maxsize=100_000)
def _label(label: str) -> tuple[str, str | None, bool]:
    """A label line's (lookup key, canonical section or None, a template wording)."""
    norm = header_key(label)
    return norm, HEADERS.get(norm), norm in TEMPLATE_WORDING


def split_note(text: str) -> SplitNote:
    """Canonical section -> its text, with what was withheld counted (see the module docstring)."""
    out = SplitNote()
    text = "\n" + text  # positions below are in this text; slicing it gives the same sections
    # (line start, content start, end, key, canonical, template wording, alone on its line) of each label line
    matches = [(m.start() + 1, m.start(2), m.end(), *_label(m.group(1)), not (rest := m.group(2)) or rest.isspace())
               for m in _LABEL_LINE.finditer(text)]
    # where a template wording of each section stands alone on its line: a loose wording, or a label with
    # text after it, before that yields to it (narrative)
    template_at: dict[str, int] = {}
    for at, _, _, _, canonical, template, alone in matches:
        if canonical and template and alone:
            template_at[canonical] = at
    parts: list[tuple[str, int, int]] = []  # (canonical, content start, header start)
    current, seen = "_header", set()
    for at, content, end, norm, canonical, template, alone in matches:
        if canonical is not None:
            if canonical == current:
                continue  # `Diagnoses:` inside Discharge Diagnosis: a sub-label, content
            loose_first = (not template or not alone) and template_at.get(canonical, -1) > at
            if not loose_first and _opens(canonical, norm, alone, current, seen):
                parts.append((canonical, content, at))
                current = canonical
                seen.add(canonical)
            elif TEMPLATE_ORDER[canonical]:
                out.repeated += 1
            continue  # narrative: content of the section it stands in
        if _written_at_discharge(norm) and not (current == "discharge_diagnosis" and _is_sublabel(current, norm)):
            if TEMPLATE_ORDER.get(current, 1) < 2 and current not in ADMISSION_AND_DISCHARGE:
                out.unknown_headers += 1  # `DISCHARGE LABS:`, `Transitional Issues:` in a shown part: withheld
                parts.append(("_unknown", content, at))
                current = "_unknown"
        elif alone and norm and _after_blank(text, at) and not _is_sublabel(current, norm):
            out.unknown_headers += 1
            parts.append(("_unknown", end, at))
            current = "_unknown"
    bounds = [(p[0], p[1], parts[i + 1][2] if i + 1 < len(parts) else len(text)) for i, p in enumerate(parts)]
    for canonical, start, end in bounds:
        if canonical.startswith("_"):
            continue
        out.sections[canonical] = text[start:end].strip()
    for name in ADMISSION_AND_DISCHARGE:
        if name in out.sections:
            out.full[name] = out.sections[name]
            out.sections[name] = admission_part(out.sections[name], out.withheld, name)
    return out


# ----------------------------------------------------------------------------- the target
_NUMBER = re.compile(r"^(?:\(?\d{1,3}[.):]|#\s*\d{1,3}[.):]?|\(?[a-zA-Z][.)](?=\s)|[-*\u2022#>~+o](?=\s)|[-*\u2022#>]+)\s*")
_RULE = re.compile(r"^[\s=\-_*~#.+]*$")
_SUBLABEL = re.compile(r"^([A-Za-z][A-Za-z ,/&()'\-]{0,50}?)\s*(?::\s*(.*))?$")


def diagnosis_target(body: str | None) -> tuple[list[str], str | None]:
    """A Discharge Diagnosis section -> (names, None), or ([], why it is empty): `no section`,
    `empty section` or `no diagnosis in the section` (only labels, rules, blanks). Primary sub-list first;
    sub-list labels (`Primary:`, `SECONDARY DIAGNOSES`), numbering, bullets and `=====` rules removed;
    duplicates (case-insensitive) dropped."""
    if body is None:
        return [], "no section"
    if not body.strip():
        return [], "empty section"
    primary: list[str] = []
    other: list[str] = []
    target = other
    for raw in body.split("\n"):
        line = raw.strip()
        if _RULE.match(line):
            continue
        m = _SUBLABEL.match(_NUMBER.sub("", line).strip())
        if m and (words := header_key(m.group(1)).split()) and all(w in SUBLABEL_WORDS["discharge_diagnosis"]
                                                                   for w in words):
            target = primary if any(w in PRIMARY_WORDS for w in words) else other
            line = (m.group(2) or "").strip()
        item = _NUMBER.sub("", line).strip().rstrip(" .,;")
        if item and not _RULE.match(item):
            target.append(item)
    names, seen = [], set()
    for item in primary + other:
        if item.lower() not in seen:
            seen.add(item.lower())
            names.append(item)
    return names, None if names else "no diagnosis in the section"


def diagnosis_list(body: str | None) -> list[str]:
    return diagnosis_target(body)[0]


def numbered(names: list[str]) -> str:
    """The cohort's discharge_diagnosis text: `1. name` lines (llmrnn.rnn.parse_diagnoses reads them)."""
    return "\n".join(f"{i}. {name}" for i, name in enumerate(names, 1))
