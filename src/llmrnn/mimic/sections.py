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
                            "principal", "additional", "conditions", "condition", "medical", "and", "s"},
    "past_medical_history": {"history", "medical", "surgical", "oncologic", "oncology", "cardiac",
                             "psychiatric", "pmh", "psh", "past", "other", "problems", "hx"},
}
PRIMARY_WORDS = {"primary", "principal"}
# an unknown label with one of these words starts withheld text, whatever section it stands in
DISCHARGE_TIME_WORDS = {"discharge", "discharged", "course", "instruction", "instructions", "followup", "disposition",
                        "addendum", "transitional"}


_NON_LETTERS = re.compile(r"[^a-z]+")
@functools.lru_cache(maxsize=100_000)
def header_key(label: str) -> str:
    """A header's lookup key in the table: `Past Medical/Surgical History ` -> `past medical surgical
    history` (cached: labels repeat). Not llmrnn.matching.normalise, which compares diagnoses."""
    return _NON_LETTERS.sub(" ", label.lower()).strip()


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

# ----------------------------------------------------------------------------- the kept part of a section
# Fail closed: a mixed section (Physical Exam, Pertinent Results) keeps the lines it can name as admission
# content and ends at the first line it cannot; the HPI and Medications on Admission keep their prose and
# end at a label that names a later stay or another medication list. What ends a kept part is counted by
# the kind of its label (_PART_KIND), `unplaced` where no label says what it is.
_PART_KIND = (
    ("discharge", re.compile(r"d\s*/\s*c|\bdc\b|dis?ch?a?r?g|dsch|disch|dispo|\bdischarge", re.IGNORECASE)),
    ("transfer", re.compile(r"transfer|\bxfer|\bcall ?out|\bfloor\b|\b(?:[mscn]|cv|ts)?icu\b|\bccu\b|\bunit\b",
                            re.IGNORECASE)),
    ("death", re.compile(r"death|expired|deceased|\bdied\b|\bpassed\b|\bexpiration", re.IGNORECASE)),
    ("course", re.compile(r"\bcourse\b|\bstay\b|\bevents\b|\bhospitali[sz]ation\b", re.IGNORECASE)),
    ("imaging", re.compile(r"imaging|radiology|\b(cxr|ct|cta|mri|mra|us|kub|x ?-?ray|xray|films?|ultrasound"
                           r"|studies|study|chest|head|abdomen|pelvis|findings|impression)\b", re.IGNORECASE)),
    ("microbiology", re.compile(r"micro|culture|\bcx\b|gram stain|difficile|assay|\bpcr\b|\(final|\(preliminary"
                                r"|antigen|smear", re.IGNORECASE)),
    ("pathology", re.compile(r"path|biopsy|cytology", re.IGNORECASE)),
    ("echo_ekg", re.compile(r"\b(echo\w*|tte|tee|ekg|ecg|cath|catheteri[sz]ation|eeg|emg|pft)\b", re.IGNORECASE)),
    ("procedure", re.compile(r"\b(egd|\w+scopy|\w+centesis|\w+ectomy|\w+otomy|\w+ostomy|\w+plasty|procedures?"
                             r"|operative|op note|intubation|placement|picc)\b", re.IGNORECASE)),
    ("medications", re.compile(r"\bmed(?:ication|icine)?s?\b|\brx\b|prescription", re.IGNORECASE)),
)


@functools.lru_cache(maxsize=100_000)
def _part_kind(label: str) -> str:
    for kind, pattern in _PART_KIND:
        if pattern.search(label):
            return kind
    return "other"


# a label-like line: an optional bullet and date or placeholder, a short label, a colon and text or nothing
_DATE_FIRST = r"(?:(?:___|\[\*\*[^\]\n]*\*\*\]|\d{1,4}[-/.]\d{1,2}(?:[-/.]\d{1,4})?)[ \t]+)?"
_LABELISH = re.compile(r"[ \t]*(?:[-*\u2022#>][ \t]*)?" + _DATE_FIRST
                       + r"([A-Za-z][\w \t,/&()'.#+\-]{0,60}?)[ \t]*(?::[ \t]*(.*?))?[ \t]*$")
_MINOR = {"of", "on", "at", "to", "the", "and", "or", "for", "in", "by", "with", "upon", "from", "a", "an", "s"}


@functools.lru_cache(maxsize=100_000)
def _labelish(line: str, cased: bool = True) -> tuple[str, str | None] | None:
    """(label, text after its colon or None) of a label-like line, else None. Without a colon the line
    must look like a label (cased): upper case, or title case of two words or more."""
    m = _LABELISH.match(line)
    if not m:
        return None
    label, rest = m.group(1).strip(), m.group(2)
    if rest is not None:
        return (label, rest) if len(label.split()) <= 7 else None
    letters = [c for c in label if c.isalpha()]
    if not cased:
        return label, None
    if len(letters) >= 2 and label.upper() == label:
        return label, None
    words = [w for w in re.split(r"[\s/]+", label) if any(c.isalpha() for c in w)]
    if len(words) >= 2 and all(w[0].isupper() or w.lower() in _MINOR or not w[0].isalpha() for w in words):
        return label, None
    return None


# ------------------------------------------------------------- what an admission sub-label is
_ADMIT_WORDS = {"admission", "admit", "admitting", "admitted", "presentation", "presenting", "arrival", "initial",
                "intake", "ed", "er", "emergency", "triage"}
_LABEL_FILLER = {"on", "at", "upon", "the", "of", "to", "in", "time", "department", "from", "and", "pertinent"}
_ADMIT_VOCAB = {
    "physical_exam": _ADMIT_WORDS | _LABEL_FILLER | {"exam", "examination", "physical", "pe", "vitals", "vital",
                                                     "signs", "vs", "findings", "general"},
    "pertinent_results": _ADMIT_WORDS | _LABEL_FILLER | {"labs", "lab", "laboratory", "laboratories", "results",
                                                         "result", "data", "blood", "chemistry", "chemistries",
                                                         "cbc", "values", "work", "up", "workup", "bloodwork"},
}


_ADMIT_HINT = re.compile(r"admi|presen|arriv|initial|intake|\bed\b|\ber\b|emergen|triage|exam|\bpe\b|lab|result"
                         r"|data|values", re.IGNORECASE)


# a sub-label that only repeats the section's name (`PHYSICAL EXAM:`, `LABS:`): it names no time, so what
# follows it is placed line by line as before
_NEUTRAL = {"physical_exam": {"physical", "exam", "examination", "pe"},
            "pertinent_results": {"labs", "lab", "laboratory", "laboratories", "results", "result", "data",
                                  "pertinent", "values"}}


@functools.lru_cache(maxsize=10_000)
def _neutral_label(line: str, section: str) -> bool:
    found = _labelish(line, cased=False)
    return found is not None and all(w in _NEUTRAL[section] for w in header_key(found[0]).split())


@functools.lru_cache(maxsize=100_000)
def admission_label(line: str, section: str) -> str | None:
    """The text after an admission sub-label of a mixed section (`ADMISSION EXAM:`, `Labs on admission:
    Na 131`), "" for one alone on its line, None for any other line. Every word must be on the section's
    list: `FLOOR ADMISSION EXAM`, `MICU admission labs`, `Admission imaging` are not admission parts."""
    found = _labelish(line, cased=False)
    if found is None or line.lstrip(" \t-*\u2022#>")[:1] in ("_", "[") or line.lstrip()[:1].isdigit():
        return None  # a date or `___` before it: an exam or draw of some later day
    label, rest = found
    words = header_key(label).split()
    vocab = _ADMIT_VOCAB[section]
    if words and all(w in _NEUTRAL[section] for w in words):
        return rest or ""
    if not words or not set(words) & _ADMIT_WORDS or not all(w in vocab for w in words):
        return None
    return rest or ""


# ------------------------------------------------------------- exam lines
_LATER = re.compile(
    r"\b(?:on|at|upon|prior to|day of|time of|before|after|since|until|post|for)\s+(?:the\s+)?"
    r"(?:discharge|transfer|call ?-?out|the floor|floor|icu|micu)\b|\bdischarged\b|\btransferr?ed\b|\bexpired\b"
    r"|\bdeceased\b|\btime of death\b|\bpassed away\b|\b(?:pod|hd|hospital day|post-?op(?:erative)? day)\s*#?\s*\d"
    r"|\bdischarge (?:exam|labs?|vitals|physical)|\bd/c\b|\bcall-?out\b|\b(?:[mscn]|cv|ts)?icu\b|\bccu\b"
    r"|\brepeat\b|\bsubsequent(?:ly)?\b|\bthe next (?:day|morning)\b|\binterval\b|\bpost-?op|\bresolved\b"
    r"|\b(?:since|after) admission\b|\bduring (?:the |his |her )?(?:stay|admission|hospitali[sz]ation)\b",
    re.IGNORECASE)
_SYSTEMS = (
    r"gen(?:eral)?(?: appearance)?|constitutional|appearance|heent|head|eyes?|ent|ears?|nose|throat|mouth|oropharynx"
    r"|op|neck|lymph(?: nodes?)?|lymphatics?|nodes|ln|cv|cvs|cardiac|cardio|cardiovascular|heart|cor|chest|lungs?"
    r"|pulm(?:onary)?|resp(?:iratory)?|breasts?|back|spine|abd(?:omen|ominal)?|gi|gu|genitourinary|genitalia|gyn"
    r"|pelvic|rectal|dre|ext(?:r|rem|remities|remity)?|msk|musculoskeletal|joints?|skin|integument|derm|wounds?"
    r"|incisions?|neuro(?:logic(?:al)?)?|ns|mental status|ms|mse|cn|cranial nerves|motor|sensory|sensation"
    r"|reflexes|dtrs?|coordination|cerebellar|gait|strength|tone|psych(?:iatric)?|mood|affect|speech|language"
    r"|orientation|pulses|vascular|access|lines?|foley|drains?|tubes?|ostomy|stoma|heme|hands?|feet|foot|knees?"
    r"|hips?|shoulders?|arms?|legs?|ankles?|wrists?|elbows?|face|scalp|nails|fingers|toes|[rl]ue|[rl]le|bue|ble"
    r"|extremities|vitals?|vital signs|vs|v/s|gastrointestinal|hematologic|integumentary|thyroid|pupils|cva"
    r"|peripheral vascular|attention|memory|tele|telemetry|genitals?|groin|airway|fundoscopic|funduscopic|fundi"
    r"|speculum|bimanual|orthostatics?")
_VITALS = r"t|temp|tmax|tc|bp|hr|p|rr|o2(?: sat)?|spo2|sao2|sats?|pulse ox|weight|wt|height|i/o|fs|fsbg|bmi|pain"
_EXAM_LINE = re.compile(
    r"[ \t]*(?:[-*\u2022][ \t]*)?(?:(?:left|right|l|r|bilateral|bilat|b/l)[ \t]+)?"
    rf"(?:(?:{_SYSTEMS})(?:[ \t]+(?:exam|examination|findings))?[ \t]*(?:[:=,/]|-(?!\w)|-[ \t]|[ \t]+[^\s:]|$)"
    rf"|(?:{_VITALS})[ \t]*(?:[:=]|[ \t]*[<>~]?\d))", re.IGNORECASE)
_FINDINGS = frozenset((
    "afebrile", "febrile", "alert", "awake", "oriented", "a&o", "a&ox3", "aox3", "aaox3", "aaox", "nad", "wdwn",
    "crackles", "rales", "rhonchi", "wheeze", "wheezes", "wheezing", "edema", "tachycardic", "bradycardic",
    "tachypneic", "hypoxic", "hypotensive", "hypertensive", "diaphoretic", "pale", "jaundiced", "icteric",
    "anicteric", "tender", "nontender", "non-tender", "soft", "distended", "nondistended", "non-distended",
    "obese", "cachectic", "thin", "murmur", "murmurs", "rrr", "ctab", "irregularly", "irregular", "regular",
    "clear", "lethargic", "confused", "somnolent", "unresponsive", "obtunded", "comfortable", "uncomfortable",
    "well-appearing", "ill-appearing", "dry", "warm", "cool", "mottled", "cyanotic", "erythema", "erythematous",
    "swelling", "swollen", "decreased", "diminished", "absent", "mild", "moderate", "severe", "trace", "normal",
    "no", "diffuse", "bibasilar", "faint", "intact", "supple"))
_CONTINUATION = re.compile(r"[ \t]*[a-z0-9+(/,]")


def _exam_line(line: str, after_line: bool) -> bool:
    """An exam line: it starts with an exam system label (`Neuro:`, `EXT:`, `Rectal exam:`, `VS 98.1`), or
    is a list of findings (`afebrile, alert`), or continues the line above it (starts lower case)."""
    if _LATER.search(line):
        return False
    if _EXAM_LINE.match(line):
        return True
    if after_line and _CONTINUATION.match(line) and (":" not in line or _labelish(line, cased=False) is None):
        return True  # a wrapped line, not a lower-case label (`repeat exam:`)
    items = [i.strip() for i in re.split(r"[,;]", line) if i.strip()]
    return bool(items) and len(line) <= 200 and all(
        i[0].isdigit() or i.split()[0].lower().rstrip(".") in _FINDINGS for i in items)


# ------------------------------------------------------------- lab lines
_LAB_STAMP = re.compile(r"[ \t]*(?:(___|\[\*\*[^\]\n]*\*\*\]|\d{1,4}[-/]\d{1,2}[-/]\d{1,4})[ \t]+)?"
                        r"(\d{1,2}:\d{2}[ \t]*(?:AM|PM|am|pm)?)[ \t]+(.*)$")
_SPECIMEN = re.compile(r"(?:(?:BLOOD|URINE|ASCITES|PLEURAL|CSF|\(CSF\)|CEREBROSPINAL|FLUID|JOINT|OTHER|BODY|STOOL"
                       r"|SERUM|PERITONEAL|SYNOVIAL|BAL|WHOLE)(?:[ \t]+|$))+")
_QUALITATIVE = (r"neg|pos|none|tr|sm|mod|lg|few|many|occ|rare|clear|cloudy|hazy|slhazy|slcloudy|yellow|straw|amber"
                r"|red|orange|brown|pink|random|hold|negative|positive|normal|abnormal|notdone|art|ven|mix|central"
                r"|greater|less|trace|small|large|moderate")
_LAB_TOKEN = re.compile(rf"[%A-Za-z][A-Za-z0-9%#/().'\-]*-(?:(?:[<>]=?)?(?:\d|\.\d)\S*|(?:{_QUALITATIVE})\*?)",
                        re.IGNORECASE)
# a short name before a `___` or a value (`Plt ___`, `Base XS-0`); a study's name is none (`CXR ___`)
_SHORT = re.compile(r"(?!(?:cxr|ct|cta|mri|mra|us|tte|tee|ekg|ecg|egd|kub|eeg|ercp|chest|echo|head|abd)\b)"
                    r"[A-Za-z][A-Za-z0-9]{0,7}", re.IGNORECASE)
_ANALYTE = (r"wbc|rbc|hgb|hb|hemoglobin|hct|hematocrit|plt|platelets?|mcv|na|sodium|k|potassium|cl|chloride|hco3"
            r"|bicarb(?:onate)?|co2|bun|urea|cr|creat|creatinine|glucose|glu|ca|calcium|mg|magnesium|phos|phosphate"
            r"|alt|ast|alk phos|alkphos|alp|t ?bili|bili(?:rubin)?|albumin|alb|lipase|amylase|inr|pt|ptt|trop(?:onin)?"
            r"(?: [ti])?|tnt|tni|ctropnt|ck|ck-?mb|bnp|pro-?bnp|nt-?pro-?bnp|lactate|lactic acid|lac|ph|pco2|po2"
            r"|anion gap|ag|a1c|hba1c|tsh|esr|crp|d-?dimer|ammonia|nh3|etoh|osm|uric acid|ldh|ferritin|iron|tibc|b12"
            r"|folate|neuts|lymphs|monos|eos|baso|bands|retic")
_ANALYTE_ITEM = re.compile(
    rf"(?:{_ANALYTE})[ \t]*(?:[:=][ \t]*|-|[ \t])(?:of[ \t]+)?(?:[<>]=?[ \t]*)?(?:\d+(?:\.\d+)?(?:[ \t]*(?:%|[a-z]+/[a-z]+|mg|k))?\*?"
    r"|elevated|high|low|normal|negative|positive|neg|pos|wnl|nl|undetectable|detectable|pending|trace)",
    re.IGNORECASE)


def _lab_tokens(text: str, after_lab: bool) -> bool:
    """A line of PhysioNet lab values (`MCHC-33.2 RDW-13.5 Plt ___`): every token a value, a `___`, or a
    short name before one; at least one value, or the line wraps a lab line."""
    tokens = text.split()
    values = 0
    for i, token in enumerate(tokens):
        if _LAB_TOKEN.fullmatch(token):
            values += 1
        elif token.strip("_*") == "" and "_" in token:
            continue
        elif not (_SHORT.fullmatch(token) and i + 1 < len(tokens)
                  and (_LAB_TOKEN.fullmatch(tokens[i + 1]) or tokens[i + 1].startswith("___"))):
            return False
    return bool(tokens) and (values > 0 or after_lab)


class _Draws:
    """The first draw's time stamp, whether the last stamped line belonged to it, and whether the first
    draw's block has ended (a blank line after its lines: dates are `___`, so a stamp of the same clock
    time further down may be another day's; only an admission sub-label opens it again)."""
    __slots__ = ("first", "keep", "seen", "closed")

    def __init__(self) -> None:
        self.first: tuple | None = None
        self.keep = True
        self.seen = False  # a lab line of the first draw since the last admission sub-label
        self.closed = False


def _result_line(line: str, after_line: bool, draws: _Draws) -> str | None:
    """`keep` (a lab line of the first draw, admission lab values), `later` (a lab line of another draw, or
    its wrapped continuation), None (a line it cannot place)."""
    if "-" in line or ":" in line:
        stamp = _LAB_STAMP.match(line)
        if stamp and (specimen := _SPECIMEN.match(stamp.group(3))):
            day = stamp.group(1) if stamp.group(1) and stamp.group(1) != "___" else ""
            when = (day, stamp.group(2).replace(" ", "").upper())
            draws.first = draws.first or when
            if when != draws.first or draws.closed:
                draws.keep = False
                return "later"
            draws.keep = draws.seen = True
            rest = stamp.group(3)[specimen.end():]
            return "keep" if not rest.strip() or _lab_tokens(rest, True) else None
        if _lab_tokens(line, after_line):
            return "keep" if draws.keep else "later"
    if _LATER.search(line):
        return None
    items = [i for i in re.split(r"[,;]|\s{2,}", line.strip()) if i.strip()]
    if items and all(_ANALYTE_ITEM.fullmatch(i.strip()) for i in items):
        return "keep"
    return None


_RULE_LINE = re.compile(r"[ \t]*[=\-_*~#.+]{3,}[ \t]*$")


# the label lines of a withheld rest, found in one pass (the rest can be long: every later draw and study)
# matched against "\n" + rest: a leading literal lets the engine jump from line start to line start
_REST_LABEL = re.compile(r"\n[ \t]*(?:[-*\u2022#>][ \t]*)?" + _DATE_FIRST
                         + r"(?=([A-Za-z][\w \t,/&()'.#+\-]{0,60}))\1(?::|(?=\n)|$)")


def _nonblank(text: str) -> int:
    return sum(1 for line in text.split("\n") if line.strip())


def _count_withheld(stop_line: str, rest: str, section: str, withheld: Counter) -> None:
    """Count a withheld rest of a section (from its stopping line on): one part per run of labels of one
    kind (the first is the stopping line's, `unplaced` where no label names it), and as
    `<section>:unplaced_lines` the lines from an unplaced stop up to the first label that names a kind:
    the lines withheld only because the splitter could not place them."""
    found = _labelish(stop_line, cased=False)
    kind = _part_kind(found[0]) if found is not None else "other"
    kind = "unplaced" if kind == "other" else kind
    withheld[f"{section}:{kind}"] += 1
    explained_at = None if kind == "unplaced" else 0
    for m in _REST_LABEL.finditer("\n" + rest):  # positions in rest: one less
        k = _part_kind(m.group(1))
        if k == "other":
            continue
        if explained_at is None:
            explained_at = m.start()
        if k != kind:
            withheld[f"{section}:{k}"] += 1
        kind = k
    if explained_at != 0:
        withheld[f"{section}:unplaced_lines"] += 1 + _nonblank(rest[:explained_at])


def admission_part(body: str, withheld: Counter | None = None, section: str = "physical_exam") -> str:
    """The admission part of a mixed section: its lines up to the first it cannot place (module docstring);
    admission sub-label lines dropped, lab lines of a later draw withheld (`later_draw_lines`)."""
    withheld = withheld if withheld is not None else Counter()
    results = section == "pertinent_results"
    draws = _Draws()
    kept: list[str] = []
    lines = body.split("\n")
    after_line = False
    at = 0  # where the line starts in body
    for line in lines:
        start, at = at, at + len(line) + 1
        if not line.strip() or _RULE_LINE.match(line):
            kept.append(line)
            after_line = False
            draws.closed = draws.closed or (draws.seen and not line.strip())
            continue
        rest = admission_label(line, section) if _ADMIT_HINT.search(line) else None
        if rest is not None:
            if not _neutral_label(line, section):  # `ADMISSION LABS:` opens the first draw again, `LABS:` not
                draws.closed = draws.seen = False
            if not rest.strip():
                after_line = False
                continue
            line = rest
        verdict = _result_line(line, after_line, draws) if results else (
            "keep" if _exam_line(line, after_line) else None)
        if verdict is None:
            _count_withheld(body[start:at - 1], body[at:], section, withheld)
            break
        if verdict == "keep":
            kept.append(line)
        else:
            withheld[f"{section}:later_draw_lines"] += 1
        after_line = True
    return "\n".join(kept).strip()


# ------------------------------------------------------------- the HPI and the medications on admission
_STAY = re.compile(r"\b(?:[mscn]|cv|ts)?icu\b|\bccu\b|\bunit\b|\bfloor\b|\btransfer|\bcall ?-?out\b|\bdischarg"
                   r"|\bhospitali[sz]ation\b|\bpost-?op|\bpostoperative\b|\boperative\b|\bhospital day\b"
                   r"|\b(?:since|after) admission\b|\bduring (?:the |his |her )?(?:stay|admission)\b", re.IGNORECASE)
_COURSE = re.compile(r"\bcourse\b|\bstay\b|\bevents\b|\bsummary\b|\bhospital\b", re.IGNORECASE)
_BEFORE_ADMISSION = re.compile(r"\b(?:ed|er|osh|outside|ems|pre-?hospital|triage|emergency|clinic|pcp|office)\b",
                               re.IGNORECASE)
_HPI_LABEL_WORDS = {"ros", "review", "of", "systems", "system", "ed", "er", "in", "the", "course", "osh", "outside",
                    "hospital", "ems", "triage", "initial", "vitals", "vital", "signs", "vs", "hpi", "history",
                    "present", "illness", "interval", "subjective", "note", "per", "report", "family", "patient",
                    "pt", "on", "at", "prior", "to", "arrival", "prehospital", "pre", "presentation", "presenting",
                    "collateral", "symptoms", "emergency", "department", "clinic", "pcp", "office", "and", "exam",
                    "labs", "ros:"}
_HOME_MEDS = re.compile(r"\b(?:admission|preadmission|pre-admission|home|outpatient|prior|pta|current|otc|over the"
                        r" counter|prescription|prescriptions|supplements?|vitamins?)\b", re.IGNORECASE)
_NOT_HOME_MEDS = re.compile(r"discharg|\bnew\b|\bchanged?\b|\bstop(?:ped)?\b|\bheld\b|\bhold\b|\bcontinue[ds]?\b"
                            r"|\bstart(?:ed)?\b|\bdiscontinued\b|\binpatient\b|\bhospital\b|\btransfer|\bicu\b"
                            r"|transitional", re.IGNORECASE)
_RECONCILIATION = {"new", "changed", "change", "stopped", "stop", "discontinued", "held", "hold", "continue",
                   "continued", "started", "start", "transitional"}


def _cut_at(body: str, section: str, ends, withheld: Counter) -> str:
    """body up to the first line `ends` says ends it; the rest withheld and counted."""
    if ":" not in body and body.lower() == body:  # no label can stand in it
        return body
    lines = body.split("\n")
    for i, line in enumerate(lines):
        if not line.strip():
            continue
        found = _labelish(line, cased=False)  # a stay named in any case ends it; an unknown label must look like one
        if found is not None and found[1] is None and len(found[0].split()) > 5:
            continue  # a short line of prose, not a label
        if found is not None and ends(*found, found[1] is not None or _labelish(line) is not None):
            _count_withheld(line, "\n".join(lines[i + 1:]), section, withheld)
            return "\n".join(lines[:i]).strip()
    return body


def _ends_hpi(label: str, rest: str | None, cased: bool) -> bool:
    """A course or stay label ends the HPI (`MICU COURSE`, `Summary of MICU stay: ...`); an ED or outside
    hospital course does not; an unknown label alone on its line (upper or title case) ends it too."""
    if _STAY.search(label) or (_COURSE.search(label) and not _BEFORE_ADMISSION.search(label)):
        return True
    return cased and rest is None and not all(w in _HPI_LABEL_WORDS for w in header_key(label).split())


def _ends_admission_meds(label: str, rest: str | None, cased: bool) -> bool:
    """A medication label that is not an admission one (`DISCHARGE MEDS`, `NEW MEDICATIONS`, `Medications:`)
    or a reconciliation label (`STOPPED:`, `CHANGED`) ends Medications on Admission."""
    words = set(header_key(label).split())
    if words & _RECONCILIATION or _NOT_HOME_MEDS.search(label):
        return True
    return _part_kind(label) == "medications" and not _HOME_MEDS.search(label)


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
    for m in _LABEL_LINE.finditer(text):
        rest = m.group(2)
        label = _label(m.group(1))
        if rest is None and label[1] is None:
            continue
        matches.append((m.start() + 1, m.end() if rest is None else m.start(2), m.end(), *label,
                        rest is None or not rest or rest.isspace()))
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
    for name, ends in (("history_present_illness", _ends_hpi), ("admission_medications", _ends_admission_meds)):
        if name in out.sections:
            out.sections[name] = _cut_at(out.sections[name], name, ends, out.withheld)
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
        line = raw.strip()
        if _RULE.match(line):
            continue
        m = _SUBLABEL.match(_NUMBER.sub("", line).strip())
        if m and (words := header_key(m.group(1)).split()) and all(w in SUBLABEL_WORDS["discharge_diagnosis"]
                                                                   for w in words):
            target = primary if any(w in PRIMARY_WORDS for w in words) else other
            line = (m.group(2) or "").strip()
        if (letter := _LETTER.match(line)) and letter.group(2) == ".":
            # a letter and a dot are a list marker only in a lettered list (a., b., ...): `E. Coli UTI` is a name
            in_list = letter.group(1).lower() in ("a", chr(ord(last_letter) + 1))
            last_letter = letter.group(1).lower()
            item = (_NUMBER.sub("", line) if in_list else line).strip().rstrip(" .,;")
        else:
            item = _NUMBER.sub("", line).strip().rstrip(" .,;")
        if item and not _RULE.match(item):
            if _NOT_DIAGNOSIS.fullmatch(item):
                dispositions += bool(_DISPOSITION.search(item))
                continue
            target.append(item)
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
