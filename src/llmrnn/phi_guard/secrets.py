"""The reference secrets: the identifiers and clinical texts of the cohort or QA data a bundle must not
contain, read into one `Secrets`."""

from __future__ import annotations

import json
import re
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from llmrnn import io
from llmrnn.errors import InputError
from llmrnn.phi_guard.canonical import canonical_id, letters_as_digits, normalize

ID_KEYS = ("subject_id", "visit_id", "hadm_id", "patient_id", "stay_id", "mrn")


# ----------------------------------------------------------------------------- cohort secrets
@dataclass
class Secrets:
    ids: dict[str, str] = field(default_factory=dict)  # canonical id -> kind (subject_id, visit_id, ...)
    too_short: set[str] = field(default_factory=set)
    texts: list[str] = field(default_factory=list)
    text_kinds: list[str] = field(default_factory=list)  # per text, what a finding calls it
    hashes: set[str] = field(default_factory=set)
    # names from the notes, as their normalised words -> kind: also found reordered or with a word between
    # (`Quist, Johanna`, `Johanna M. Quist`)
    names: dict[tuple[str, ...], str] = field(default_factory=dict)
    # the surname of each such name, normalised with its apostrophes and hyphens dropped (o'brien -> obrien)
    # -> kind: found alone where it names a person (`Mrs. Quist`, `QUIST, J.`, `Quist's`)
    surnames: dict[str, str] = field(default_factory=dict)
    min_words: int = 8
    min_line_words: int = 3
    noun: str = "cohort"  # what the reference is, in findings: "cohort identifier", "QA data identifier"

    def add_text(self, text: str, kind: str) -> None:
        self.texts.append(text)
        self.text_kinds.append(kind)

    @property
    def max_len(self) -> int:
        return max((len(i) for i in self.ids), default=0)

    def add_id(self, key: str, value: Any, min_len: int) -> None:
        if value is None or isinstance(value, bool):
            return
        full = canonical_id(value)
        if len(full) < min_len:
            self.too_short.add(full)
            return
        self.ids.setdefault(full, key)
        # the id-like parts of a string id (MRN-AB7731X -> ab7731x): a card may drop the prefix
        for part in re.split(r"[\W_]+", normalize(str(value))):
            # a digits-only part must be long enough not to be a shard number (model-00001-of-00002)
            needed = max(min_len, 6) if part.isdigit() else min_len
            if len(part) >= needed and any(c.isdigit() for c in part):
                self.ids.setdefault(part, key)
            # a part of digits and o/i/l (LO4567) typed with 0/1 instead (L04567) reads as its digit form
            as_digits = letters_as_digits(part)
            if as_digits != part and as_digits.isdigit() and len(as_digits) >= max(min_len, 6):
                self.ids.setdefault(as_digits, key)


def _reference_files(paths: Iterable[str | Path], read: Callable[[Path], Any], what: str,
                     secrets: Secrets) -> Iterator[tuple[Path, Any]]:
    """(path, parsed content) of each reference file, its sha256 recorded (a bundle file with the same
    bytes is refused); an unreadable file is one InputError naming it."""
    for path in map(Path, paths):
        try:
            data = read(path)
        except (OSError, json.JSONDecodeError, UnicodeDecodeError) as exc:
            raise InputError(f"{path}: cannot read {what}: {type(exc).__name__}") from exc
        secrets.hashes.add(io.sha256_file(path))
        yield path, data


def load_cohort_secrets(split_files: Iterable[str | Path], min_id_digits: int = 5) -> Secrets:
    """Identifiers (canonical forms), clinical texts and sha256 of the split files."""
    secrets = Secrets()
    for _, data in _reference_files(split_files, io.read_json, "split file", secrets):
        for patient in data if isinstance(data, list) else []:
            visits = patient.get("visits") if isinstance(patient, dict) else None
            for record in [patient, *(visits if isinstance(visits, list) else [])]:
                if not isinstance(record, dict):
                    continue
                for key in ID_KEYS:
                    secrets.add_id(key, record.get(key), min_id_digits)
                sections = record.get("clinical_sections") or {}
                for value in [*sections.values(), record.get("allergies")]:
                    if isinstance(value, str) and value.strip():
                        secrets.add_text(value, "clinical text from the cohort")
                        add_text_identifiers(secrets, value, "the clinical text", min_id_digits)
    secrets.too_short -= set(secrets.ids)
    return secrets


# the QA record fields whose text came from the user's data; options are left out: they are the answer
# vocabulary shared by many questions (diagnosis names), not one record's text
QA_TEXT_FIELDS = ("question", "context", "reasoning")
# an identifier written inside a QA text ("Patient MRN 12345678", "record A1234567"): a token with at
# least min_id_digits digits (measurements, leads and dates written with separators have fewer)
TEXT_ID_TOKEN = re.compile(r"[^\s,;:()\[\]{}<>\"']+")


def ids_in_text(text: str, min_digits: int) -> Iterator[str]:
    for token in TEXT_ID_TOKEN.findall(normalize(text)):
        token = token.strip(".-_/#*'")
        if sum(ch.isdigit() for ch in token) >= min_digits:
            yield token


# a name written next to a name-like header ("Name: Johanna Quist", "Patient: J. Quist"): the header in any
# case, the name as capitalised words on the same line
NAME_HEADER = re.compile(
    r"(?i:\b(?:(?:patient|pt|full|first|last|family|given|maiden|mother'?s?|father'?s?)[ \t]*name|name|patient"
    r"|surname|attending|physician|doctor|nurse|contact|next[ \t]+of[ \t]+kin|guardian)[ \t]*[:#=-][ \t]*)"
    r"((?:Mrs?\.|Ms\.|Dr\.)?[ \t]*[A-Z][A-Za-z'\u2019-]*\.?"
    # more words one space apart, up to the next header on its line (`Unit No:`, `Admission Date:`, `Sex:`)
    r"(?: (?![A-Za-z]+(?:[ \t]+(?:of[ \t]+)?(?:No|Number|Num|Date|Name|ID|Id|Birth|Kin|Time|Type)\.?)?[ \t]*[:#=])"
    r"[A-Z][A-Za-z'\u2019-]*\.?){0,3})"
)
# a date of birth next to its header: numeric (1956-03-14, 03/14/1956, 14.03.1956) or with a month name
DOB = re.compile(
    r"(?i:\b(?:date[ \t]+of[ \t]+birth|d\.?o\.?b\.?|birth[ \t]*date|born(?:[ \t]+on)?)[ \t]*[:#=-]?[ \t]*)"
    r"(\d{1,4}[-/. ]\d{1,2}[-/. ]\d{1,4}|(?:[A-Za-z]{3,9}\.?[ \t]+\d{1,2},?[ \t]+\d{4})|(?:\d{1,2}[ \t]+[A-Za-z]{3,9}\.?,?[ \t]+\d{4}))"
)
MONTHS = {m: n for n, m in enumerate(("jan", "feb", "mar", "apr", "may", "jun", "jul", "aug", "sep", "oct", "nov",
                                      "dec"), start=1)}
NOT_A_NAME = {"male", "female", "unknown", "none", "n", "a", "na", "the", "mr", "mrs", "ms", "dr"}
# words after a surname that are not one (`Quist Jr.`, `Dr. Smith MD`)
NAME_SUFFIXES = {"jr", "sr", "ii", "iii", "iv", "md", "do", "rn", "np", "pa", "phd", "dds", "esq", "mba", "msc"}
# what a contact header names instead of a person (`Contact: Mother`, `Next of kin: Wife`): never a surname
RELATIONS = {"mother", "father", "parent", "parents", "wife", "husband", "spouse", "partner", "son", "daughter",
             "sister", "brother", "sibling", "child", "friend", "family", "self", "guardian", "patient", "other"}
NOT_A_SURNAME = NOT_A_NAME | NAME_SUFFIXES | RELATIONS
SURNAME_JOINERS = re.compile(r"['\u2019\u02bc-]")


def surname_key(word: str) -> str:
    """A surname as the guard compares it: normalised, apostrophes and hyphens dropped (O'Brien, however its
    apostrophe is typed)."""
    return SURNAME_JOINERS.sub("", normalize(word))


def _surnames_of(header: str, name: str) -> list[str]:
    """The surname of a name found next to `header`: its one all-capitals word (`QUIST Johanna`), else its last
    word that is no title, initial or suffix, and a hyphenated surname's parts too (`Smith-Jones` is also
    written `Mrs. Jones`); none after a given-name header (`First name:`)."""
    if re.search(r"(?i)\b(?:first|given)\b", header):
        return []
    words = []
    for raw in name.split():
        word = raw.strip(".")
        if len(word) > 1 and word.lower() not in NOT_A_SURNAME:
            words.append(word)
            if raw.endswith("."):  # a sentence ends after the name (`Name: Johanna Quist. What ...`)
                break
    capitals = [w for w in words if w.isupper()]
    if not words:
        return []
    surname = capitals[0] if len(capitals) == 1 and len(words) > 1 else words[-1]
    parts = [p for p in surname.split("-") if len(p) > 1]
    return [surname_key(surname), *(surname_key(p) for p in parts if len(parts) > 1)]


def _date_forms(text: str) -> list[str]:
    """The digit strings a date of birth is written as (yyyymmdd, mmddyyyy, ddmmyyyy; month names as numbers):
    a card that writes 03/14/1956 for a note's 1956-03-14 holds the same date."""
    parts = re.findall(r"\d+|[A-Za-z]+", text)
    nums = [int(p) if p.isdigit() else MONTHS.get(p[:3].lower()) for p in parts]
    if len(nums) != 3 or None in nums:
        return []
    years = [n for n in nums if n > 31]
    if len(years) != 1:
        return []
    year = years[0]
    rest = [n for n in nums if n is not year]
    forms = set()
    for month, day in ((rest[0], rest[1]), (rest[1], rest[0])):
        if 1 <= month <= 12 and 1 <= day <= 31:
            forms |= {f"{year:04d}{month:02d}{day:02d}", f"{month:02d}{day:02d}{year:04d}",
                      f"{day:02d}{month:02d}{year:04d}"}
    return sorted(forms)


def add_text_identifiers(secrets: Secrets, text: str, where: str, min_id_digits: int) -> None:
    """Identifiers written inside a reference text (both recipes): record numbers (a token with at least
    min_id_digits digits), names next to a name-like header (and their surnames), dates of birth in any digit
    order."""
    for token in ids_in_text(text, min_id_digits):
        secrets.add_id(f"identifier in {where}", token, min_id_digits)
    for m in NAME_HEADER.finditer(text):
        name = m.group(1).strip()
        words = [w for w in re.findall(r"[^\W\d_]+", name) if w.lower() not in NOT_A_NAME]
        if len(words) == 1 and re.match(r"[ \t]+[a-z]", text[m.end():]):
            continue  # a sentence after the header (`Patient - Denies chest pain`), not a name
        # one capitalised word after a header is not a name (`Contact: Daughter at bedside`, `Patient - Denies
        # chest pain`): as an identifier it matched ordinary words everywhere; it counts as a surname only,
        # found where it names a person (`Mrs. Quist`)
        if len(words) >= 2 and sum(map(len, words)) >= min_id_digits:
            secrets.add_id(f"name in {where}", " ".join(words), min_id_digits)
            parts = tuple(normalize(w) for w in words if len(w) > 1)
            if len(parts) >= 2:
                secrets.names.setdefault(parts, f"name in {where}")
        # a short surname too (Ng, Li): it is looked for only where it names a person, not as an id
        for surname in _surnames_of(m.group(0)[:m.start(1) - m.start(0)], name):
            secrets.surnames.setdefault(surname, f"surname of a name in {where}")
    for m in DOB.finditer(text):
        for form in _date_forms(m.group(1)):
            secrets.add_id(f"date of birth in {where}", form, min_id_digits)


def load_qa_secrets(qa_files: Iterable[str | Path], min_id_digits: int = 5) -> Secrets:
    """Record ids, group ids (the patient for cohort-made questions), identifiers written inside the
    record's texts, and the texts of the QA data stage's split files (JSONL of normalised records), and
    their sha256. An id is exempt only by provenance: the data stage marks the ids it made up for records
    that had none (`id_generated`); an id that merely looks like one (q1234567) is checked like any other."""
    secrets = Secrets(noun="QA data")
    for path, records in _reference_files(qa_files, io.read_jsonl, "QA split file", secrets):
        for n, record in enumerate(records):
            if not isinstance(record, dict):
                raise InputError(f"{path}: record {n}: not a JSON object (not a QA split file)")
            made_up = [record.get("id")] if record.get("id_generated") is True else []
            for key, kind in (("id", "record id"), ("group", "group id")):
                value = record.get(key)
                if value is not None and value not in made_up:
                    secrets.add_id(kind, value, min_id_digits)
            texts = [(f, record.get(f)) for f in QA_TEXT_FIELDS]
            if not record.get("options"):  # a free-text answer is the record's own text; a letter is not
                texts.append(("answer", record.get("answer")))
            for name, value in texts:
                if isinstance(value, str) and value.strip():
                    secrets.add_text(value, f"QA record text ({name})")
                    add_text_identifiers(secrets, value, f"the {name}", min_id_digits)
    secrets.too_short -= set(secrets.ids)
    return secrets


SPLIT_FORMATS = {"cohort": load_cohort_secrets, "qa": load_qa_secrets}
