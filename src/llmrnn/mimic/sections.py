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
  - line ends are LF (normalise_line_ends, once per note), and a header may come without its colon where
    it is the whole line (`Brief Hospital Course`, `DISCHARGE MEDICATIONS`); each word has one form and
    `X at/on discharge` is `discharge X` (section_key), so every spelling of the template meets its entry;
  - the shown text fails closed (llmrnn.mimic.admission): of the mixed sections (Physical Exam, Pertinent
    Results) only the lines positively named as admission content are kept, up to the first line that
    cannot be placed; the HPI ends at a course or stay label, Medications on Admission at any other
    medication list; what is withheld is counted by kind, and the lines withheld only because they could
    not be placed as `<section>:unplaced_lines`.
Which of the sections are shown is a build setting (cohort.mimic_iv.mode / sections); RISK says what each
one risks.
"""

from __future__ import annotations

import functools
import re
from collections import Counter
from dataclasses import dataclass, field

from llmrnn.mimic.admission import admission_part, cut_admission_medications, cut_hpi, header_key
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
                            "principal", "additional", "conditions", "condition", "medical", "and", "s"},
    "past_medical_history": {"history", "medical", "surgical", "oncologic", "oncology", "cardiac",
                             "psychiatric", "pmh", "psh", "past", "other", "problems", "hx"},
}
PRIMARY_WORDS = {"primary", "principal"}
# an unknown label with one of these words starts withheld text, whatever section it stands in
DISCHARGE_TIME_WORDS = {"discharge", "discharged", "course", "instruction", "instructions", "followup", "disposition",
                        "addendum", "transitional"}


# one spelling per word of a header: singular, `meds`/`dx`/`hx` written out, `follow up` one word
_WORD_FORMS = {"medications": "medication", "meds": "medication", "med": "medication", "medicines": "medication",
               "diagnoses": "diagnosis", "dx": "diagnosis", "dxs": "diagnosis", "instructions": "instruction",
               "procedures": "procedure", "complaints": "complaint", "results": "result", "labs": "lab",
               "examination": "exam", "examinations": "exam", "exams": "exam", "hx": "history",
               "conditions": "condition", "s": ""}
# `X on/at/upon/prior to discharge|admission` -> `discharge|admission X`: the template's two word orders
_WORD_ORDER = re.compile(r"^(.+?) (?:on|at|upon|prior to|for|of) (discharge|admission)$")


@functools.lru_cache(maxsize=100_000)
def section_key(label: str) -> str:
    """A header's key in the table: header_key, then one form per word and one word order, so `Medications
    at Discharge`, `DISCHARGE MEDICATION` and `Discharge Meds` meet (`discharge medication`)."""
    words = [_WORD_FORMS.get(w, w) for w in header_key(label).split()]
    norm = " ".join(w for i, w in enumerate(words) if w and (i == 0 or w != words[i - 1]))
    norm = norm.replace("follow up", "followup")
    if m := _WORD_ORDER.match(norm):
        norm = f"{m.group(2)} {m.group(1)}"
    return norm


HEADERS: dict[str, str] = {section_key(v): canonical for canonical, vs in HEADER_VARIANTS.items() for v in vs}
TEMPLATE_WORDING = {section_key(vs[0]) for vs in HEADER_VARIANTS.values()} | {section_key(v) for v in TARGET_STRICT}
# matched against "\n" + text: a leading literal lets the engine jump from line start to line start; the
# label is taken whole at once (a lookahead and a back-reference: an atomic group before Python 3.11), as
# a lazy or backtracking label tried every shorter label on each line of prose. The colon may be missing
# where the label is the whole line (`Brief Hospital Course`, `DISCHARGE MEDICATIONS`): group 2 is None then
_LABEL_LINE = re.compile(r"\n[ \t]*(?=([A-Za-z][A-Za-z0-9 \t,/&()'\-]{0,60}))\1[ \t]*(?::[ \t]*([^\n]*)|(?=\n|$))")
_LINE_ENDS = re.compile(r"\r\n?|[\x85\u2028\u2029]")


def normalise_line_ends(text: str) -> str:
    """CRLF, CR and the Unicode line separators as LF: once, where a note is read (split_note), so no
    pattern after it meets a `\r`."""
    return _LINE_ENDS.sub("\n", text) if ("\r" in text or "\x85" in text or "\u2028" in text
                                           or "\u2029" in text) else text

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
    norm = section_key(label)
    return norm, HEADERS.get(norm), norm in TEMPLATE_WORDING


def split_note(text: str) -> SplitNote:
    """Canonical section -> its text, with what was withheld counted (see the module docstring)."""
    out = SplitNote()
    text = "\n" + normalise_line_ends(text)  # positions below are in this text; slicing it gives the sections
    # (line start, content start, end, key, canonical, template wording, alone on its line) of each label line;
    # a line without a colon counts only where it is a known header (`Brief Hospital Course`)
    matches = []
    # where a template wording of each section stands alone on its line: a loose wording, or a label with
    # text after it, before that yields to it (narrative); found in the same pass (a note has some 40 labels)
    template_at: dict[str, int] = {}
    for m in _LABEL_LINE.finditer(text):
        label_text, rest = m.groups()
        norm, canonical, template = _label(label_text)
        at, end = m.span()
        at += 1
        if rest is None:
            if canonical is None:
                continue
            content, alone = end, True
        else:
            content, alone = m.start(2), not rest or rest.isspace()
        if canonical and template and alone:
            template_at[canonical] = at
        matches.append((at, content, end, norm, canonical, template, alone))
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
    # each part ends where the next one's header starts
    for (canonical, start, _), (_, _, end) in zip(parts, [*parts[1:], (None, None, len(text))]):
        if canonical[0] != "_":
            out.sections[canonical] = text[start:end].strip()
    for name in ADMISSION_AND_DISCHARGE:
        if name in out.sections:
            out.full[name] = out.sections[name]
            out.sections[name] = admission_part(out.sections[name], out.withheld, name)
    for name, cut in (("history_present_illness", cut_hpi), ("admission_medications", cut_admission_medications)):
        if name in out.sections:
            out.sections[name] = cut(out.sections[name], out.withheld)
    return out


# ----------------------------------------------------------------------------- the target
# a list marker: a number, a bullet, or a letter with `)` or with `.` before a capital (`A. Sepsis`); a letter
# and a dot before a lower-case word is an abbreviated genus (`E. coli`, `C. difficile`, `H. pylori`)
_NUMBER = re.compile(r"^(?:\(?\d{1,3}[.):]|#\s*\d{1,3}[.):]?|\(?[a-zA-Z]\)(?=\s)|[a-zA-Z]\.(?=\s+[A-Z0-9(])"
                     r"|[-*\u2022#>~+o](?=\s)|[-*\u2022#>]+)\s*")
# a disposition or a placeholder written where the diagnosis belongs: not a diagnosis
_NOT_DIAGNOSIS = re.compile(
    r"(?:patient |pt )?(?:expired|deceased|died|death|dead|ama|left ama|left against medical advice|against medical"
    r" advice|hospice|home hospice|comfort measures(?: only)?|cmo|dnr/dni|transferred|transfer(?:red)? to \w+"
    r"|home|home with services|snf|rehab|extended care|n/?a|none|unknown|deferred|see above|see hpi|pending)"
    r"(?:\s+(?:on|at)\s+\S+)?", re.IGNORECASE)
_DISPOSITION = re.compile(r"expired|deceased|died|death|dead|ama|left|against|hospice|comfort|cmo|dnr|transfer"
                          r"|home|snf|rehab|extended", re.IGNORECASE)
_LETTER = re.compile(r"\(?([a-zA-Z])([.)])\s+[A-Z]")
_RULE = re.compile(r"^[\s=\-_*~#.+]*$")
_SUBLABEL = re.compile(r"^([A-Za-z][A-Za-z ,/&()'\-]{0,50}?)\s*(?::\s*(.*))?$")


_NAME, _DISPOSED, _NONE = "name", "disposition", "none"  # what a Discharge Diagnosis line's item is


def _diagnosis_item(item: str) -> tuple[str, str]:
    """(item, _NAME), or (item, _DISPOSED) for a disposition (`Expired`), (item, _NONE) for nothing to keep (a
    rule, a placeholder such as `None`)."""
    if not item or _RULE.match(item):
        return item, _NONE
    if _NOT_DIAGNOSIS.fullmatch(item):
        return item, _DISPOSED if _DISPOSITION.search(item) else _NONE
    return item, _NAME


@functools.lru_cache(maxsize=100_000)
def _diagnosis_line(raw: str) -> tuple[bool | None, str | None, tuple[str, str], tuple[str, str]] | None:
    """One line of a Discharge Diagnosis section read alone: None for a rule or a blank, else (the sub-list
    its label opens: True primary, False other, None no label; the lower-cased letter of an `A.` marker or
    None; its _diagnosis_item read as a lettered-list entry, and as written). Cached: the lines repeat from
    note to note (`Primary:`, `Secondary:`, `Hypertension`), and diagnosis_target keeps the list's state."""
    line = raw.strip()
    if _RULE.match(line):
        return None
    sub = None
    m = _SUBLABEL.match(_NUMBER.sub("", line).strip())
    if m and (words := header_key(m.group(1)).split()) and all(w in SUBLABEL_WORDS["discharge_diagnosis"]
                                                               for w in words):
        sub = any(w in PRIMARY_WORDS for w in words)
        line = (m.group(2) or "").strip()
    listed = _diagnosis_item(_NUMBER.sub("", line).strip().rstrip(" .,;"))
    if (letter := _LETTER.match(line)) and letter.group(2) == ".":
        return sub, letter.group(1).lower(), listed, _diagnosis_item(line.strip().rstrip(" .,;"))
    return sub, None, listed, listed


def diagnosis_target(body: str | None) -> tuple[list[str], str | None]:
    """A Discharge Diagnosis section -> (names, None), or ([], why it is empty): `no section`,
    `empty section`, `no diagnosis in the section` (only labels, rules, blanks, placeholders such as `None`)
    or `only a disposition` (`Expired`, `AMA`: where the patient went, not what they had). Primary sub-list first;
    sub-list labels (`Primary:`, `SECONDARY DIAGNOSES`), numbering, bullets and `=====` rules removed;
    duplicates (case-insensitive) dropped."""
    if body is None:
        return [], "no section"
    if not body.strip():
        return [], "empty section"
    primary: list[str] = []
    other: list[str] = []
    target = other
    dispositions = 0
    last_letter = "`"  # the letter before `a`
    for raw in body.split("\n"):
        parsed = _diagnosis_line(raw)
        if parsed is None:
            continue  # a rule (`=====`) or a blank
        sub, letter, listed, written = parsed
        if sub is not None:
            target = primary if sub else other
        if letter is not None:
            # a letter and a dot are a list marker only in a lettered list (a., b., ...): `E. Coli UTI` is a name
            in_list = letter in ("a", chr(ord(last_letter) + 1))
            last_letter = letter
            item, kind = listed if in_list else written
        else:
            item, kind = listed
        if kind == _NAME:
            target.append(item)
        elif kind == _DISPOSED:
            dispositions += 1
    names, seen = [], set()
    for item in primary + other:
        if item.lower() not in seen:
            seen.add(item.lower())
            names.append(item)
    if names:
        return names, None
    return [], "only a disposition (Expired, AMA, ...)" if dispositions else "no diagnosis in the section"


def diagnosis_list(body: str | None) -> list[str]:
    return diagnosis_target(body)[0]


def numbered(names: list[str]) -> str:
    """The cohort's discharge_diagnosis text: `1. name` lines (llmrnn.rnn.parse_diagnoses reads them)."""
    return "\n".join(f"{i}. {name}" for i, name in enumerate(names, 1))
