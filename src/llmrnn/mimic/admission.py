"""What of a discharge summary's section is admission-time text: the fail-closed line rules.

A mixed section (Physical Exam, Pertinent Results) keeps the lines it can name as admission content, and
the first line it cannot place ends the kept part:
  - exam lines: a line that starts with an exam system label (`VS:`, `Neuro exam:`, `Rectal exam:`, `EXT -`,
    `Lungs clear`), a list of findings (`afebrile, alert`), or a line wrapped from the one above (lower case);
  - lab lines: PhysioNet's dump format (`___ 07:20PM BLOOD WBC-15.2* ...` and its wrapped value lines) of the
    first draw, or admission lab values (`WBC 14, Na 131`); a stamped line of another draw is withheld and
    counted (`later_draw_lines`), as is one of the same clock time once the first draw's block has ended
    (dates are `___`: it may be another day's);
  - a sub-label every word of which names admission or presentation and the section's kind (`ADMISSION
    EXAM`, `Labs on admission:`); `FLOOR ADMISSION EXAM`, `MICU admission labs`, `___ exam` are not;
  - a line that names a later time (`at discharge`, `POD 2`, `MICU`, `repeat`) is never placed.
So a `Discharge Exam` in any spelling, pasted micro (`GRAM STAIN (Final ___):`), a study with its date first
(`___ CXR:`), an echo, endoscopy or paracentesis report, and prose all end it. The HPI keeps its prose and
ends at a course or stay label (`MICU COURSE`, `Summary of MICU stay:`; an ED or outside-hospital course
stays) or an unknown label alone on its line; Medications on Admission ends at a medication label that is
not an admission one (`NEW MEDICATIONS`, `Inpatient medications:`) or a reconciliation label (`STOPPED:`).
What is withheld is counted, `<section>:<kind>` once per run of parts of one kind, and
`<section>:unplaced_lines`: the lines withheld only because no rule could place them, from the stopping line
up to the next label that names a kind (the cost of the strict rule).
"""

from __future__ import annotations

import functools
import re
from collections import Counter

_NON_LETTERS = re.compile(r"[^a-z]+")
@functools.lru_cache(maxsize=100_000)
def header_key(label: str) -> str:
    """A header's lookup key in the table: `Past Medical/Surgical History ` -> `past medical surgical
    history` (cached: labels repeat). Not llmrnn.matching.normalise, which compares diagnoses."""
    return _NON_LETTERS.sub(" ", label.lower()).strip()



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
# the label taken whole at once (a lookahead and a back-reference): a lazy label before an optional colon
# tried every shorter label against every rest of the line
_LABELISH = re.compile(r"[ \t]*(?:[-*\u2022#>][ \t]*)?" + _DATE_FIRST
                       + r"(?=([A-Za-z][\w \t,/&()'.#+\-]{0,60}))\1(?::(.*))?$")
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
        rest = rest.strip()
        return (label, rest) if len(label.split()) <= 7 else None
    letters = [c for c in label if c.isalpha()]
    if not cased:
        return label, None
    if label.endswith("."):
        return None  # a sentence (`MMM.` wrapped from the line above), not a label
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
def _admission_rest(line: str, section: str) -> str | None:
    """admission_label of a line of a mixed section, tried only where a word of one can stand (_ADMIT_HINT):
    one cache lookup a line where a case-blind search and a lookup were two."""
    return admission_label(line, section) if _ADMIT_HINT.search(line) else None


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
    r"|\brepeat\b|\blater\b|\bsubsequent(?:ly)?\b|\bthe next (?:day|morning)\b|\binterval\b|\bpost-?op|\bresolved\b"
    r"|\b(?:since|after) admission\b|\bduring (?:the |his |her )?(?:stay|admission|hospitali[sz]ation)\b")
@functools.lru_cache(maxsize=100_000)
def _later(line: str) -> bool:
    """Whether a line names a later time; these patterns are lower case, matched against the lower-cased line
    (a case-blind alternation of this size costs several times more). Cached: the alternation is tried at
    every position of the line, and exam lines repeat from note to note (`GEN: NAD`)."""
    return bool(_LATER.search(line.lower()))


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
    rf"|(?:{_VITALS})[ \t]*(?:[:=]|[ \t]*[<>~]?\d))")
_EXAM_FINDING_WORDS = frozenset((
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


WRAP = 55  # a placed line this long or longer was most likely wrapped: the next line may start in capitals


def _exam_line(line: str, after: int) -> bool:
    """An exam line: it starts with an exam system label (`Neuro:`, `EXT:`, `Rectal exam:`, `VS 98.1`), or
    is a list of findings (`afebrile, alert`), or continues the placed line above it (`after`: its length),
    starting lower case, or in any case where that line was long enough to have been wrapped."""
    return _exam_verdict(line, bool(after), after >= WRAP)


@functools.lru_cache(maxsize=100_000)
def _exam_verdict(line: str, below_placed: bool, below_wrapped: bool) -> bool:
    """_exam_line of a line, given whether a placed line stands above it and whether that one was wrapped:
    all it reads of `after`, so the verdict is cached by line (exam lines repeat from note to note)."""
    if _later(line):
        return False
    if _EXAM_LINE.match(line.lower()):
        return True
    if below_placed and (_CONTINUATION.match(line) or below_wrapped) and (
            ":" not in line or _labelish(line, cased=False) is None):
        return True  # a wrapped line, not a label (`repeat exam:`)
    items = [i.strip() for i in line.replace(";", ",").split(",") if i.strip()]
    return bool(items) and len(line) <= 200 and all(
        i[0].isdigit() or i.split()[0].lower().rstrip(".") in _EXAM_FINDING_WORDS for i in items)


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
    r"|elevated|high|low|normal|negative|positive|neg|pos|wnl|nl|undetectable|detectable|pending|trace)")
_ITEMS = re.compile(r"[,;]|\s{2,}")


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
    __slots__ = ("closed", "first", "keep", "seen")

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
    if _later(line):
        return None
    items = [i for i in _ITEMS.split(line.strip().lower()) if i.strip()]
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
    unplaced = kind == "unplaced"
    # the labels by findall, no match object each (a withheld rest has a label on every line of a problem list)
    named = [k for k in map(_part_kind, _REST_LABEL.findall("\n" + rest)) if k != "other"]
    for k in named:
        if k != kind:
            withheld[f"{section}:{k}"] += 1
        kind = k
    if unplaced:
        # where the first label that names a kind starts (positions in "\n" + rest: its newline, the line's start in rest)
        explained_at = next(m.start() for m in _REST_LABEL.finditer("\n" + rest)
                            if _part_kind(m.group(1)) != "other") if named else None
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
    after = 0  # the length of the placed line just above, 0 after a blank or a label
    at = 0  # where the line starts in body
    for line in lines:
        start, at = at, at + len(line) + 1
        if not line.strip() or _RULE_LINE.match(line):
            kept.append(line)
            after = 0
            draws.closed = draws.closed or (draws.seen and not line.strip())
            continue
        rest = _admission_rest(line, section)
        if rest is not None:
            if not _neutral_label(line, section):  # `ADMISSION LABS:` opens the first draw again, `LABS:` not
                draws.closed = draws.seen = False
            if not rest.strip():
                after = 0
                continue
            line = rest
        verdict = _result_line(line, bool(after), draws) if results else (
            "keep" if _exam_line(line, after) else None)
        if verdict is None:
            _count_withheld(body[start:at - 1], body[at:], section, withheld)
            break
        if verdict == "keep":
            kept.append(line)
        else:
            withheld[f"{section}:later_draw_lines"] += 1
        after = len(line.rstrip())
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


def cut_hpi(body: str, withheld: Counter) -> str:
    """The HPI up to a course or stay label (see the module docstring)."""
    return _cut_at(body, "history_present_illness", _ends_hpi, withheld)


def cut_admission_medications(body: str, withheld: Counter) -> str:
    """Medications on Admission up to another medication list's label (see the module docstring)."""
    return _cut_at(body, "admission_medications", _ends_admission_meds, withheld)
