"""PHI guard: scan a release bundle (the exact folder that would be uploaded) for the data it was made from.

The reference (what must not leak) depends on the recipe: the cohort's split files (memory_head), or the
QA records of the qa data stage (recipe qa: questions, contexts, free-text answers and reasonings, record
and group ids; for ECG QA they come from patients). Both are read into the same `Secrets` and scanned by
the same machinery below; findings name the reference ("cohort identifier", "QA data identifier").

Every file is either scanned by its structure or refused; nothing is skipped:
- policy: a symbolic link (to a file or a folder, dangling or not) or anything but a regular file is refused
  and never followed; a file type that is not model/card/manifest material (allow-list: safetensors, json, md, txt,
  jinja, model, yaml, gitattributes), a name that looks like an audit log, cohort or QA file, bytes equal to a
  split file, JSON shaped like a cohort;
- content, by structure: JSON values after json.loads (recursing, repeated keys kept; token ids and sizes
  in model metadata are numbers, not identifiers), tokenizer vocab and merges entry by entry
  (tokenizer.json, vocab.json, vocab.txt, merges.txt; an entry is flagged only when it IS an identifier,
  its id or rank never is), safetensors header (it must describe the file's bytes exactly) + metadata +
  tensor bytes (strings and character codes hidden in tensors), `tokenizer.model` pieces (sentencepiece
  protobuf or tiktoken lines), text decoded from UTF-8/16/32
  (BOM or NUL pattern), gzip/bz2/xz decompressed, base64/base32/hex/URL/HTML/backslash escapes decoded
  (escapes applied several times over are undone as often). Anything that cannot be parsed as what it
  claims to be is refused. Long texts are scanned in overlapping windows and large text files read from
  disk window by window, so memory does not grow with the file;
- identifiers: the cohort's subject/visit ids in any form: digits grouped (`12 345`, `12,345`, `12-345`),
  other Unicode digits, full-width forms, look-alike letters of other scripts (Cyrillic `АВ7731Х`, via
  Unicode's confusables data) and O/l typed for 0/1, string ids (`MRN-AB7731X`, also its id-like part
  `AB7731X`), number literals by value (`0012345`, `0x3039`), `*_id` and signed JSON numbers, and in file
  names; for QA data also the identifiers written inside a record's texts (`MRN 12345678`). An id the QA
  data stage made up for a record without one is exempt by provenance (the record says `id_generated`),
  never by its shape;
- clinical text: `min_words` consecutive words of a clinical section (or of a QA record's question,
  context, reasoning or free-text answer), or a whole short line / list item of at least `min_line_words`
  words (a medication list), matched on decoded text;
- a credential-like string (hf_..., sk-..., ghp_..., AKIA..., a URL's user:password@) pasted anywhere.

Findings say what and where (file, offset or JSON path, kind) and never repeat the identifier or text.
Identifiers shorter than `min_id_digits` characters cannot be told apart from ordinary numbers and are
not matched; the report counts them. Clinical text is still matched for those patients.
"""

from __future__ import annotations

import base64
import binascii
import bz2
import codecs
import decimal
import functools
import gzip
import html
import json
import logging
import lzma
import math
import mmap
import os
import re
import stat
import struct
import sys
import unicodedata
import urllib.parse
import zlib
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass, field
from io import BytesIO
from pathlib import Path
from typing import Any

from llmrnn import io
from llmrnn.constants import CREDENTIAL
from llmrnn.errors import CheckFailed, InputError

log = logging.getLogger(__name__)

ALLOWED_SUFFIXES = {".safetensors", ".json", ".md", ".txt", ".jinja", ".model", ".yaml", ".yml", ".gitattributes"}
SUSPECT_NAME = re.compile(
    r"(audit|calls_|cohort|cleaned|splits?\b|^(train|val|test|ood)\.json$|trajector|rollout|patient|question"
    r"|^sft_)", re.IGNORECASE
)
ID_KEYS = ("subject_id", "visit_id", "hadm_id", "patient_id", "stay_id", "mrn")
# JSON numbers under these keys are sizes, seeds, ports or hyperparameters (a seed of 12345 is common),
# not identifiers; and token ids in model metadata files
SIZE_KEY = re.compile(r"(^|_)(size|bytes|length|len|embeddings|theta|window|dim|positions|mb|gb|runtime|samples"
                      r"|tokens|seed|steps|port)$")
# in model metadata files: bos_token_id, eos_token_id, image_token_id, `id` of an added token; any other
# `*_id` number (record_id, example_id) is compared with the cohort's ids
TOKEN_ID_KEY = re.compile(r"^ids?$|(^|_)token(_type)?_ids?$")
# up to two of these may sit inside an identifier written with grouping (12 345, 12,345, 12-345, MRN-AB7)
ID_JOINERS = frozenset(" \t\r\n,.-_'\u2019\u02bc/\u00b7\u2010\u2012\u2013\u2014\u2212\u066b\u066c*`~\\")
ID_RUN = re.compile(r"\d+|[^\W\d_]+")
WORD = re.compile(r"[^\W_]+")
ITEM_SPLIT = re.compile(r"\n|;|\u2022|,\s")
LIST_MARKER = re.compile(r"^\s*(?:[-*\u00b7]|\(?\d{1,2}[.)])\s+")
# a Hub/OpenAI/GitHub/GitLab/Slack/AWS/Google credential pasted anywhere in the bundle (one digit at least)
MAX_DECOMPRESSED = 512 * 1024 * 1024
MAGIC = [(b"\x1f\x8b", "gzip"), (b"BZh", "bzip2"), (b"\xfd7zXZ\x00", "xz"), (b"PK\x03\x04", "zip"),
         (b"(\xb5/\xfd", "zstd"), (b"\x80\x02", "pickle"), (b"\x80\x03", "pickle"), (b"\x80\x04", "pickle"),
         (b"\x80\x05", "pickle"), (b"%PDF", "pdf"), (b"\x7fELF", "executable"), (b"PAR1", "parquet"),
         (b"\x93NUMPY", "numpy"), (b"SQLite format 3", "sqlite")]
DECOMPRESS = {"gzip": gzip.decompress, "bzip2": bz2.decompress, "xz": lzma.decompress}
B64_RUN = re.compile(r"(?:[A-Za-z0-9+/]{40,}\r?\n)+[A-Za-z0-9+/]+={0,2}|[A-Za-z0-9+/_-]{8,}={0,2}")
CONTROL = re.compile(r"[\x00-\x08\x0e-\x1f\x7f-\x9f]")
HEX_RUN = re.compile(r"\b(?:[0-9a-fA-F]{2}){6,}\b")
# RFC 4648 base32 (upper or lower case, padded or not): 16+ characters, i.e. 10+ bytes
B32_RUN = re.compile(r"(?<![A-Za-z0-9])(?:[A-Z2-7]{16,}|[a-z2-7]{16,})={0,6}(?![A-Za-z0-9])")
# a credential in a URL: scheme://user:password@host
URL_CREDENTIAL = re.compile(r"(?i)\b[a-z][a-z0-9+.-]*://[^/?#@\s:]*:[^/?#\s]*@")
MAX_UNESCAPE = 4  # %2541 -> %41 -> A: escapes applied over and over are undone this many times
# Long texts are scanned in windows that overlap by far more than the longest thing looked for (an id
# with its separators, `min_words` words, a base64 run of them), so memory stays bounded by the window,
# not the file; text files above STREAM_ABOVE bytes are read from disk window by window.
WINDOW_CHARS = 1 << 20
OVERLAP_CHARS = 1 << 16
STREAM_ABOVE = 4 << 20
DOC_BUDGET_CHARS = 1 << 20  # decoded text kept for the clinical-text pass before it runs and is dropped
ST_DTYPES = {"BOOL": 1, "U8": 1, "I8": 1, "F8_E4M3": 1, "F8_E5M2": 1, "F8_E8M0": 1, "I16": 2, "U16": 2,
             "F16": 2, "BF16": 2, "I32": 4, "U32": 4, "F32": 4, "I64": 8, "U64": 8, "F64": 8}
ST_INT = {"I16": "<i2", "U16": "<u2", "I32": "<i4", "U32": "<u4", "I64": "<i8", "U64": "<u8",
          "F16": "<f2", "F32": "<f4", "F64": "<f8"}
VOCAB_JSON = {"vocab.json", "added_tokens.json"}
VOCAB_LINES = {"vocab.txt", "merges.txt"}
MODEL_METADATA = {"config.json", "generation_config.json", "tokenizer.json", "tokenizer_config.json",
                  "special_tokens_map.json", "added_tokens.json", "model.safetensors.index.json",
                  "adapter_config.json", "preprocessor_config.json"}


# ----------------------------------------------------------------------------- normalisation
@functools.cache
def _char_table() -> dict[int, str | None]:
    """Every Unicode decimal digit (Arabic-Indic, Devanagari, Thai, ...) -> its ASCII digit; invisible
    format characters (zero-width space, soft hyphen, word joiner) -> removed."""
    table: dict[int, str | None] = {}
    for cp in range(128, sys.maxunicode + 1):
        ch = chr(cp)
        if ch.isdecimal():
            table[cp] = str(unicodedata.decimal(ch))
        elif unicodedata.category(ch) == "Cf":
            table[cp] = None
    return table


@functools.cache
def _confusable_table() -> dict[int, str]:
    """Non-ASCII characters that look like an ASCII letter or digit -> that character (Unicode's
    confusables data, UTS #39, as shipped by confusable-homoglyphs): Cyrillic `МRN-АВ7731Х` reads as
    MRN-AB7731X. Applied after NFKC, so full-width and mathematical forms are already ASCII."""
    from confusable_homoglyphs.utils import load

    table: dict[int, str] = {}
    for char, homoglyphs in load("confusables.json").items():
        if len(char) != 1 or char.isascii() or char.isdecimal():
            continue
        for glyph in homoglyphs:
            c = glyph["c"].strip("\u200e\u200f")
            if len(c) == 1 and c.isascii() and c.isalnum():
                table[ord(char)] = c
                break
    return table


def normalize(text: str) -> str:
    """NFKC, every decimal digit as ASCII, no invisible characters, look-alike letters as the ASCII
    letter or digit they imitate, casefolded: the form both the cohort and the bundle are compared in."""
    nfkc = unicodedata.normalize("NFKC", text.translate(_char_table())).translate(_char_table())
    return nfkc.translate(_confusable_table()).casefold()


def canonical_id(value: Any) -> str:
    return "".join(ch for ch in normalize(str(value)) if ch.isalnum())


def _words(text: str) -> list[str]:
    return WORD.findall(normalize(text))


# ----------------------------------------------------------------------------- cohort secrets
@dataclass
class Secrets:
    ids: dict[str, str] = field(default_factory=dict)  # canonical id -> kind (subject_id, visit_id, ...)
    too_short: set[str] = field(default_factory=set)
    texts: list[str] = field(default_factory=list)
    text_kinds: list[str] = field(default_factory=list)  # per text, what a finding calls it
    hashes: set[str] = field(default_factory=set)
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
                    for token in ids_in_text(value, min_id_digits):
                        secrets.add_id(f"identifier in the {name}", token, min_id_digits)
    secrets.too_short -= set(secrets.ids)
    return secrets


SPLIT_FORMATS = {"cohort": load_cohort_secrets, "qa": load_qa_secrets}


# ----------------------------------------------------------------------------- matching
def find_ids(text: str, ids: dict[str, str], max_len: int) -> list[tuple[int, str]]:
    """(offset in the normalised text, kind) of every identifier, with grouping characters allowed between
    its letter/digit runs (`12 345`, `12,345`, `mrn-ab7731x`); a match starts and ends on run boundaries."""
    if not ids:
        return []
    text = normalize(text)
    runs = list(ID_RUN.finditer(text))
    hits = []
    for i, start in enumerate(runs):
        joined = ""
        for j in range(i, len(runs)):
            if j > i:
                gap = text[runs[j - 1].end():runs[j].start()]
                if len(gap) > 2 or not set(gap) <= ID_JOINERS:
                    break
            joined += runs[j].group()
            if len(joined) > max_len:
                break
            if joined in ids:
                hits.append((start.start(), ids[joined]))
                break
    return hits


NUMBER = re.compile(r"(?<![^\W_])(?<!\.)(?:0x[0-9a-f]+|\d+(?:\.\d+)?(?:e[-+]?\d{1,3})?)(?![^\W_])")
DIGIT_LOOKALIKE = str.maketrans("oil", "011")
LOOKALIKE_TOKEN = re.compile(r"[^\W_]*\d[^\W_]*")


def find_numbers(text: str, ids: dict[str, str]) -> list[tuple[int, str]]:
    """(offset, kind) of every number literal of normalised `text` whose integer VALUE is a numeric id:
    leading zeros, a fraction of zeros, an exponent or hex spell the same number with other digits."""
    hits = []
    for m in NUMBER.finditer(text):
        literal = m.group()
        try:
            value = int(literal, 16) if literal.startswith("0x") else decimal.Decimal(literal)
        except (ValueError, decimal.InvalidOperation):
            continue
        if isinstance(value, decimal.Decimal):
            if value != value.to_integral_value():
                continue
            value = int(value)
        if kind := ids.get(str(value)):
            hits.append((m.start(), kind))
    return hits


def letters_as_digits(text: str) -> str:
    """Normalised text with o/i/l read as 0/1 inside tokens made of digits and those letters only (an id
    typed 9OOOOOO5 or l2345678); words without a digit are left alone."""
    def swap(m: re.Match) -> str:
        token = m.group()
        return token.translate(DIGIT_LOOKALIKE) if set(token) <= set("0123456789oil") else token

    return LOOKALIKE_TOKEN.sub(swap, text)


def redact(name: str, secrets: Secrets) -> str:
    """A name (file, tensor, JSON key) safe to print: identifier-bearing runs replaced by ***; a name that
    holds one only once decoded (URL escapes, base64) is replaced whole, its folder kept."""
    if not find_ids(name, secrets.ids, secrets.max_len):
        if any(find_ids(view, secrets.ids, secrets.max_len) for _, view in decoded_views(name)):
            return re.sub(r"[^/]+$", "***", name)
        return name
    return "".join("***" if find_ids(part, secrets.ids, secrets.max_len) else part
                   for part in re.split(r"([^\W_]+)", name))


def decoded_views(text: str, depth: int = 0) -> Iterator[tuple[str, str]]:
    """(how, text) for every decoding of `text` that could hide an identifier or clinical text: backslash
    escapes, HTML entities, URL escapes, base64 and hex runs (decoded payloads are decoded again)."""
    if "\\" in text:
        yield "backslash escapes", re.sub(r"\\u([0-9a-fA-F]{4})", lambda m: chr(int(m.group(1), 16)),
                                          re.sub(r"\\[nrtfbv]", " ", text))
    for how, marker, undo in (("HTML entities", "&", html.unescape), ("URL escapes", "%", urllib.parse.unquote)):
        view = text
        for n in range(MAX_UNESCAPE):
            if marker not in view or (undone := undo(view)) == view:
                break
            view = undone
            yield (how if n == 0 else f"{how} x{n + 1}"), view
    if depth >= 2:
        return
    for run, decode, name in ((B32_RUN, _b32, "base32"), (B64_RUN, _b64, "base64")):
        yield from _encoded_views(text, run, decode, name, depth)
    for m in HEX_RUN.finditer(text):
        inner = _payload_text(bytes.fromhex(m.group()))
        if inner:
            yield f"hex at char {m.start()}", inner


def _encoded_views(text: str, run: re.Pattern, decode, name: str, depth: int) -> Iterator[tuple[str, str]]:
    """The text inside each `name`-encoded run of `text` (and its own decoded views); for base64, the
    strings inside a binary payload."""
    for m in run.finditer(text):
        payload = decode(m.group())
        inner = _payload_text(payload) if payload else None
        if inner:
            yield f"{name} at char {m.start()}", inner
            yield from ((f"{name} at char {m.start()}, {how}", t) for how, t in decoded_views(inner, depth + 1))
        elif name == "base64" and payload and len(payload) >= 16:  # binary (an image, ...): its strings
            strings = [r.decode("ascii") for r in re.findall(rb"[\x20-\x7e]{5,}", payload)]
            if strings:
                yield f"strings of base64 at char {m.start()}", "\n".join(strings)


def _b64(run: str) -> bytes | None:
    compact = re.sub(r"\s+", "", run).rstrip("=")
    if len(compact) % 4 == 1:
        return None
    padded = compact + "=" * (-len(compact) % 4)
    try:
        if "-" in padded or "_" in padded:
            return base64.urlsafe_b64decode(padded)
        return base64.b64decode(padded, validate=True)
    except (binascii.Error, ValueError):
        return None


def _b32(run: str) -> bytes | None:
    compact = run.rstrip("=").upper()
    if len(compact) % 8 in (1, 3, 6):  # no whole number of bytes ends there
        return None
    try:
        return base64.b32decode(compact + "=" * (-len(compact) % 8))
    except (binascii.Error, ValueError):
        return None


def _payload_text(data: bytes) -> str | None:
    """Decoded text of a payload (decompressed when it is gzip/bz2/xz), or None when it is not text."""
    kind = sniff(data)
    if kind in DECOMPRESS:
        try:
            data = _decompress(kind, data)
        except (OSError, EOFError, ValueError, lzma.LZMAError, zlib.error):
            return None
    text = decode_text(data)
    if not text or sum(ch.isprintable() or ch.isspace() for ch in text) < 0.95 * len(text):
        return None
    return text


def sniff(data: bytes) -> str | None:
    return next((kind for magic, kind in MAGIC if data.startswith(magic)), None)


def _decompress(kind: str, data: bytes) -> bytes:
    if kind == "gzip":
        with gzip.GzipFile(fileobj=BytesIO(data)) as fh:
            out = fh.read(MAX_DECOMPRESSED + 1)
    else:
        out = DECOMPRESS[kind](data)
    if len(out) > MAX_DECOMPRESSED:
        raise ValueError("too large")
    return out


def text_encodings(data: bytes) -> list[str]:
    """The encodings worth trying for bytes that start with `data`: the BOM's, else UTF-8, else (a NUL
    pattern) UTF-16 of the right byte order, then UTF-32."""
    for bom, enc in ((codecs.BOM_UTF32_LE, "utf-32"), (codecs.BOM_UTF32_BE, "utf-32"), (codecs.BOM_UTF8, "utf-8-sig"),
                     (codecs.BOM_UTF16_LE, "utf-16"), (codecs.BOM_UTF16_BE, "utf-16")):
        if data.startswith(bom):
            return [enc]
    if len(data) % 2 == 0 and data.count(0) * 3 >= len(data):
        even, odd = data[0::2].count(0), data[1::2].count(0)
        return ["utf-16-le" if odd > even else "utf-16-be", "utf-32"]
    return ["utf-8"]


def decode_text(data: bytes) -> str | None:
    """Text of UTF-8/16/32 bytes (BOM, else the NUL pattern of UTF-16), or None when it is not text."""
    for enc in text_encodings(data):
        try:
            text = data.decode(enc)
        except UnicodeDecodeError:
            continue
        if not CONTROL.search(text):
            return text
    return None


# ----------------------------------------------------------------------------- the scan
class Scan:
    """Findings of one bundle; documents (decoded text) are kept for the clinical-text pass."""

    def __init__(self, secrets: Secrets):
        self.secrets = secrets
        self.findings: list[str] = []
        self.docs: list[tuple[str, str]] = []  # (where, decoded text)
        self.doc_chars = 0
        self.flagged: set[str] = set()  # files with a clinical-text finding already
        # hashes of the reference's phrases, kept after the first clinical-text pass when there are not
        # too many (a large file needs several passes); None: not known yet, False: too many to keep
        self.reference_hashes: list[tuple[str, int]] | bool | None = None
        self.max_len = secrets.max_len
        self.numeric_only = all(i.isdigit() for i in secrets.ids)
        self.numeric_ids = any(i.isdigit() for i in secrets.ids)

    def refuse(self, where: str, what: str) -> None:
        self.findings.append(f"{where}: {what}")

    def ids_in(self, where: str, text: str, docs: bool = True) -> None:
        """Identifiers in `text` and in every decoding of it; the texts join the clinical-text pass. A long
        text is scanned window by window (bounded memory); the first window with a finding ends it."""
        if len(text) <= WINDOW_CHARS:
            self.window(where, text, docs)
            return
        for start in range(0, len(text), WINDOW_CHARS - OVERLAP_CHARS):
            if self.window(where, text[start:start + WINDOW_CHARS], docs, start) or start + WINDOW_CHARS >= len(text):
                return

    def window(self, where: str, text: str, docs: bool = True, base: int = 0) -> bool:
        """One window of a text, starting at char `base` of it; True when it had a finding."""
        before = len(self.findings)
        views = [("", text), *decoded_views(text)]
        credential = CREDENTIAL.search(text) or URL_CREDENTIAL.search(text)
        if credential:
            self.refuse(where, f"a credential-like string at char {base + credential.start()}")
        for how, view in views:
            hits, form = self._id_hits(view)
            if hits:
                offset, kind = hits[0]
                more = f" (+{len(hits) - 1} more)" if len(hits) > 1 else ""
                at = f"{how}, char {offset}" if how else f"char {base + offset}"
                if how and base:
                    at = f"char {base} + {at}"
                self.refuse(where, f"{self.secrets.noun} identifier ({kind}){form} at {at}{more}")
                break
            if docs:
                self.docs.append((f"{where}{' (' + how + ')' if how else ''}", view))
                self.doc_chars += len(view)
        if self.doc_chars > DOC_BUDGET_CHARS:
            find_clinical_text(self)
        return len(self.findings) > before

    def _id_hits(self, view: str) -> tuple[list[tuple[int, str]], str]:
        """Hits of the ids written as text, then as the VALUE of a number literal (0012345678,
        1.2345678e7, 0xBC614E), then with digit look-alike letters read as digits (9OOOOOO5, l2345678)."""
        hits = find_ids(view, self.secrets.ids, self.max_len)
        if hits or not self.numeric_ids:
            return hits, ""
        normal = normalize(view)
        if hits := find_numbers(normal, self.secrets.ids):
            return hits, " as a number"
        as_digits = letters_as_digits(normal)
        if as_digits != normal and (hits := find_ids(as_digits, self.secrets.ids, self.max_len)):
            return hits, " written with look-alike letters"
        return [], ""

    def number(self, where: str, value: float) -> None:
        if isinstance(value, float) and not (math.isfinite(value) and value.is_integer()):
            return
        kind = self.secrets.ids.get(str(abs(int(value))))  # -12345678 is the id with a sign
        if kind:
            self.refuse(where, f"{self.secrets.noun} identifier ({kind}) as a JSON number")


def _key_label(key: str, secrets: Secrets) -> str:
    if re.fullmatch(r"[A-Za-z_][A-Za-z0-9_.-]{0,40}", key) and not find_ids(key, secrets.ids, secrets.max_len):
        return f".{key}"
    return "[a key]"


def scan_json_value(scan: Scan, rel: str, value: Any, path: str = "$", key: str = "",
                    skip_numbers: bool = False) -> None:
    """Recurse through decoded JSON: every key and string is scanned as text, numbers as identifiers
    unless they sit under a key that holds token ids or sizes of the model."""
    if isinstance(value, dict):
        token_ids = key == "added_tokens_decoder"
        for k, v in value.items():
            sub = f"{path}{_key_label(str(k), scan.secrets)}"
            if not (token_ids and str(k).isdigit()):
                scan.ids_in(f"{rel} key {sub}", str(k), docs=False)
            scan_json_value(scan, rel, v, sub, str(k), skip_numbers)
    elif isinstance(value, list):
        for i, v in enumerate(value):
            scan_json_value(scan, rel, v, f"{path}[{i}]", key, skip_numbers)
    elif isinstance(value, str):
        scan.ids_in(f"{rel} {path}", value)
    elif isinstance(value, (int, float)) and not isinstance(value, bool):
        lowered = key.lower()
        not_an_id = SIZE_KEY.search(lowered) or (skip_numbers and TOKEN_ID_KEY.search(lowered))
        if lowered in ID_KEYS or not not_an_id:
            scan.number(f"{rel} {path}", value)


@functools.cache
def _byte_level():
    from tokenizers import decoders

    return decoders.ByteLevel()


def scan_vocab_entry(scan: Scan, where: str, piece: str) -> None:
    """A tokenizer vocab entry: flagged only when it IS an identifier (byte-level or sentencepiece markers,
    case and separators aside); `w10005` in a stock vocabulary is a word piece, and ids/ranks are never read."""
    texts = {piece, _byte_level().decode([piece]).replace("\u2581", " ")}
    for text in texts:
        if len(WORD.findall(text)) >= scan.secrets.min_line_words:  # a multi-word piece or added token
            scan.docs.append((where, text))
    if scan.numeric_only and not any(ch.isdigit() for t in texts for ch in t):
        return
    for text in texts:
        if canonical_id(text) in scan.secrets.ids:
            scan.refuse(where, f"{scan.secrets.noun} identifier in a vocab entry")
            return


def scan_tokenizer_json(scan: Scan, rel: str, data: dict) -> None:
    """tokenizer.json: vocab keys and merges entry by entry (never their ids/ranks); the rest as JSON."""
    model = dict(data.get("model") or {})
    vocab = model.pop("vocab", None) or {}
    merges = model.pop("merges", None) or []
    pieces = vocab.keys() if isinstance(vocab, dict) else [v[0] if isinstance(v, list) else v for v in vocab]
    for n, piece in enumerate(pieces):
        scan_vocab_entry(scan, f"{rel} vocab entry #{n}", str(piece))
    for n, merge in enumerate(merges):
        joined = "".join(merge) if isinstance(merge, list) else str(merge).replace(" ", "")
        scan_vocab_entry(scan, f"{rel} merge #{n}", joined)
    added = data.get("added_tokens") or []
    for n, tok in enumerate(added):
        scan_vocab_entry(scan, f"{rel} added token #{n}", str(tok.get("content", "")) if isinstance(tok, dict) else "")
    rest = {k: v for k, v in data.items() if k not in ("model", "added_tokens")}
    scan_json_value(scan, rel, {"model": model, **rest}, skip_numbers=True)


def _keep_duplicate_keys(pairs: list[tuple[str, Any]]) -> dict:
    """json.loads keeps only the last of repeated keys; a value hidden under the first must be seen too."""
    out: dict = {}
    for key, value in pairs:
        out[key if key not in out else f"{key}\x00duplicate {len(out)}"] = value
    return out


def scan_json(scan: Scan, rel: str, name: str, text: str) -> None:
    try:
        data = json.loads(text, object_pairs_hook=_keep_duplicate_keys)
    except ValueError as exc:
        scan.refuse(rel, f"not valid JSON (line {getattr(exc, 'lineno', '?')}); refused rather than skipped")
        return
    except RecursionError:
        scan.refuse(rel, "JSON nested too deeply to scan; refused rather than skipped")
        return
    try:
        _scan_json_data(scan, rel, name, data)
    except RecursionError:
        scan.refuse(rel, "JSON nested too deeply to scan; refused rather than skipped")


def _scan_json_data(scan: Scan, rel: str, name: str, data: Any) -> None:
    records = data if isinstance(data, list) else [data]
    if any(isinstance(r, dict) and "visits" in r and any(k in r for k in ID_KEYS) for r in records[:50]):
        scan.refuse(rel, "JSON records with subject_id and visits (a cohort file)")
    if isinstance(data, list) and any(isinstance(r, dict) and {"question", "answer"} <= set(r) for r in records[:50]):
        scan.refuse(rel, "JSON records with question and answer (a QA data file)")
    if isinstance(data, dict) and isinstance(data.get("model"), dict) and "vocab" in data["model"]:
        scan_tokenizer_json(scan, rel, data)
    elif name in VOCAB_JSON and isinstance(data, dict):  # {token: id}: entries as vocab, ids never compared
        for n, piece in enumerate(data):
            scan_vocab_entry(scan, f"{rel} vocab entry #{n}", str(piece))
    else:
        scan_json_value(scan, rel, data, skip_numbers=name in MODEL_METADATA)


# ----------------------------------------------------------------------------- sentencepiece
def _varint(buf: bytes, i: int) -> tuple[int, int]:
    value = shift = 0
    while True:
        if i >= len(buf) or shift > 63:
            raise ValueError("truncated varint")
        b = buf[i]
        value |= (b & 0x7F) << shift
        i += 1
        if not b & 0x80:
            return value, i
        shift += 7


def protobuf_fields(buf: bytes) -> Iterator[tuple[int, int, Any]]:
    """(field number, wire type, value) of one protobuf message; ValueError when it is not one."""
    i = 0
    while i < len(buf):
        key, i = _varint(buf, i)
        number, wire = key >> 3, key & 7
        if wire == 0:
            value, i = _varint(buf, i)
        elif wire in (1, 5):
            size = 8 if wire == 1 else 4
            value, i = buf[i:i + size], i + size
        elif wire == 2:
            size, i = _varint(buf, i)
            value, i = buf[i:i + size], i + size
        else:
            raise ValueError(f"wire type {wire}")
        if i > len(buf) or number == 0:
            raise ValueError("truncated message")
        yield number, wire, value


# sentencepiece ModelProto: 1 pieces, 2 trainer_spec, 3 normalizer_spec, 4 self_test_data, 5 denormalizer_spec
SP_STRING_FIELDS = {2: None, 3: {1, 6}, 4: None, 5: {1, 6}}  # None: every LEN field is a string (or a sample)


TIKTOKEN_LINE = re.compile(rb"[A-Za-z0-9+/]*={0,2} \d+")


def scan_tiktoken(scan: Scan, rel: str, data: bytes) -> None:
    """A tiktoken BPE file (Llama 3's original tokenizer.model): `<base64 token> <rank>` per line."""
    for n, line in enumerate(data.splitlines()):
        try:
            piece = base64.b64decode(line.split(b" ")[0], validate=True).decode("utf-8", "replace")
        except (binascii.Error, ValueError):
            scan.refuse(rel, f"line {n + 1} is not base64 (not a tiktoken file); refused rather than skipped")
            return
        scan_vocab_entry(scan, f"{rel} line {n + 1}", piece)


def scan_sentencepiece(scan: Scan, rel: str, data: bytes) -> None:
    """tokenizer.model: every piece as a vocab entry, every other string as text; refused if it does not
    parse as a sentencepiece ModelProto (or a tiktoken BPE file)."""
    lines = data.splitlines()
    if lines and all(TIKTOKEN_LINE.fullmatch(line) for line in lines):
        scan_tiktoken(scan, rel, data)
        return
    try:
        for n, (number, wire, value) in enumerate(protobuf_fields(data)):
            if wire != 2 or number not in (1, *SP_STRING_FIELDS):
                raise ValueError(f"field {number} is not part of a sentencepiece model")
            if number == 1:  # SentencePiece {1 piece: string, 2 score: float, 3 type: enum}, nothing else
                fields = list(protobuf_fields(value))
                if any((f, w) not in ((1, 2), (2, 5), (3, 0)) for f, w, _ in fields):
                    raise ValueError(f"piece #{n} holds a field a sentencepiece piece does not have")
                piece = next((v for f, w, v in fields if f == 1), b"")
                scan_vocab_entry(scan, f"{rel} piece #{n}", piece.decode("utf-8"))
                continue
            for sub, sub_wire, sub_value in protobuf_fields(value):
                if sub_wire != 2:
                    continue
                if number == 4:  # self-test samples: input and expected strings
                    strings = [v.decode("utf-8") for f, w, v in protobuf_fields(sub_value) if w == 2]
                elif SP_STRING_FIELDS[number] is None or sub in SP_STRING_FIELDS[number]:
                    strings = [sub_value.decode("utf-8")]
                else:  # precompiled_charsmap: a binary trie followed by the normalised strings
                    strings = [s for s in re.split(r"[\x00\ufffd]+", sub_value.decode("utf-8", "replace")) if s]
                for s in strings:
                    scan.ids_in(f"{rel} field {number}.{sub}", s)
    except (ValueError, UnicodeDecodeError) as exc:
        scan.refuse(rel, f"not a sentencepiece model ({exc}); refused rather than skipped")


# ----------------------------------------------------------------------------- safetensors
def _safetensors_layout(fh, size: int) -> tuple[int, dict]:
    head = fh.read(8)
    if len(head) < 8:
        raise ValueError("shorter than its header length")
    (n,) = struct.unpack("<Q", head)
    if n > min(size - 8, 100_000_000):
        raise ValueError("header length beyond the file")
    header = json.loads(fh.read(n).decode("utf-8"))
    if not isinstance(header, dict):
        raise ValueError("header is not a JSON object")  # noqa: TRY004 - one error type for a bad file
    data_len = size - 8 - n
    spans = []
    for name, info in header.items():
        if name == "__metadata__":
            if not (isinstance(info, dict) and all(isinstance(v, str) for v in info.values())):
                raise ValueError("__metadata__ is not a map of strings")
            continue
        if not isinstance(info, dict):
            raise ValueError("malformed tensor entry")  # noqa: TRY004 - one error type for a bad file
        dtype, shape, offsets = info.get("dtype"), info.get("shape"), info.get("data_offsets")
        if dtype not in ST_DTYPES:
            raise ValueError("unknown tensor dtype")
        if not (isinstance(shape, list) and all(isinstance(d, int) and d >= 0 for d in shape)
                and isinstance(offsets, list) and len(offsets) == 2
                and all(isinstance(o, int) and o >= 0 for o in offsets)):
            raise ValueError("malformed tensor entry")
        if offsets[1] - offsets[0] != math.prod(shape) * ST_DTYPES[dtype]:
            raise ValueError("tensor size does not match its shape")
        spans.append((offsets[0], offsets[1], name, dtype))
    spans.sort()
    end = 0
    for start, stop, _, _ in spans:
        if start != end:
            raise ValueError("bytes between tensors")  # a gap could hide anything
        end = stop
    if end != data_len:
        raise ValueError("bytes after the last tensor")
    return 8 + n, {"header": header, "spans": spans}


def _byte_classes(secrets: Secrets) -> list[tuple[bytes, int]]:
    """(allowed bytes, minimum run) of the byte runs worth decoding: ASCII text, digits with grouping
    characters, letters and digits (string ids)."""
    digits = [len(i) for i in secrets.ids if i.isdigit()]
    alnum = [len(i) for i in secrets.ids if not i.isdigit()]
    classes = [(bytes(range(0x20, 0x7F)) + b"\t\n\r", 32)]
    if digits:
        classes.append((b"0123456789 ,.'_-", min(digits)))
    if alnum:
        classes.append((b"0123456789abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ _-", min(alnum)))
    return classes


def _strings_in_bytes(scan: Scan, where: str, data: bytes, classes: list[tuple[bytes, int]]) -> None:
    """Runs of text-like bytes, each scanned as text (bytes.translate + a regex over the result keep a
    multi-GB tensor at C speed)."""
    for allowed, min_len in classes:
        marks = data.translate(bytes(0x31 if b in allowed else 0x30 for b in range(256)))
        start = marks.find(b"1" * min_len)
        while start >= 0:
            stop = marks.find(b"0", start)
            stop = len(marks) if stop < 0 else stop
            before = len(scan.findings)
            scan.ids_in(f"{where} byte {start}", data[start:stop].decode("ascii"))
            if len(scan.findings) > before:
                return
            start = marks.find(b"1" * min_len, stop)


@functools.cache
def _digit_code_points():
    import numpy as np

    pairs = sorted((cp, int(v)) for cp, v in _char_table().items() if v is not None)
    return np.array([cp for cp, _ in pairs]), np.array([v for _, v in pairs])


def _code_points(data, dtype: str):
    """Values of an integer (or integral float) tensor read as characters: ASCII as is, other Unicode
    digits as ASCII digits, anything else 0."""
    import numpy as np

    if dtype == "BF16":
        values = (np.frombuffer(data, dtype="<u2").astype(np.uint32) << 16).view(np.float32)
    else:
        values = np.frombuffer(data, dtype=ST_INT[dtype])
    integral = np.isfinite(values) & (values == np.floor(values)) if values.dtype.kind == "f" else True
    codes = np.where(integral & (values >= 0) & (values <= sys.maxunicode), values, 0).astype(np.int64)
    big = np.flatnonzero(codes >= 127)
    if big.size:
        cps, digits = _digit_code_points()
        at = np.clip(np.searchsorted(cps, codes[big]), 0, len(cps) - 1)
        codes[big] = np.where(cps[at] == codes[big], digits[at] + 0x30, 0)
    return np.where((codes >= 9) & (codes < 127), codes, 0).astype(np.uint8).tobytes()


def _id_values(scan: Scan, where: str, data: bytes, dtype: str) -> None:
    """A numeric identifier stored as a tensor VALUE (an int64 tensor of subject ids)."""
    import numpy as np

    numeric = [int(i) for i in scan.secrets.ids if i.isdigit() and len(i) < 19]
    if not numeric:
        return
    values = np.frombuffer(data, dtype=ST_INT[dtype])
    hit = np.flatnonzero(np.isin(values, np.array(numeric, dtype=np.int64)))
    if hit.size:
        kind = scan.secrets.ids[str(int(values[hit[0]]))]
        scan.refuse(where, f"{scan.secrets.noun} identifier ({kind}) as a tensor value at element {int(hit[0])}")


def scan_safetensors(scan: Scan, rel: str, path: Path) -> None:
    """safetensors: the header must describe the file exactly; metadata and tensor names are scanned as
    text and tensor bytes for strings (also tensors of character codes)."""
    size = path.stat().st_size
    try:
        with open(path, "rb") as fh:
            start, layout = _safetensors_layout(fh, size)
    except (ValueError, UnicodeDecodeError, struct.error, RecursionError) as exc:
        reason = str(exc) if isinstance(exc, ValueError) and not isinstance(exc, json.JSONDecodeError) else "header"
        scan.refuse(rel, f"not a valid safetensors file ({reason}); refused rather than skipped")
        return
    for key, value in (layout["header"].get("__metadata__") or {}).items():
        scan.ids_in(f"{rel} metadata key {_key_label(key, scan.secrets)}", f"{key}\n{value}")
    classes = _byte_classes(scan.secrets)
    if size == start:
        return
    with open(path, "rb") as fh, mmap.mmap(fh.fileno(), 0, access=mmap.ACCESS_READ) as mm:
        for begin, stop, name, dtype in layout["spans"]:
            label = redact(name, scan.secrets)
            scan.ids_in(f"{rel} tensor name {label!r}", name, docs=False)
            chunk = 64 * 1024 * 1024
            for off in range(start + begin, start + stop, chunk):
                data = mm[off:min(off + chunk, start + stop)]
                _strings_in_bytes(scan, f"{rel} tensor {label!r}", data, classes)
                # small integer tensors only: packed quantized weights are random integers, not records
                if dtype in ("I16", "U16", "I32", "U32", "I64", "U64", "F64") and stop - begin <= 8 << 20:
                    _id_values(scan, f"{rel} tensor {label!r}", data[: len(data) - len(data) % ST_DTYPES[dtype]], dtype)
                if dtype in ST_INT or dtype == "BF16":
                    _strings_in_bytes(scan, f"{rel} tensor {label!r} as character codes",
                                      _code_points(data[: len(data) - len(data) % ST_DTYPES[dtype]], dtype),
                                      classes)


# ----------------------------------------------------------------------------- files
def scan_blob(scan: Scan, rel: str, name: str, data: bytes, depth: int = 0) -> None:
    """Bytes of a text-typed file (.json, .md, ...): decompressed when compressed, decoded, then scanned
    by structure; anything else is refused."""
    kind = sniff(data)
    text = decode_text(data)  # a text that merely starts like a magic number ("BZh...") stays text
    if kind in DECOMPRESS and depth < 2 and text is None:
        try:
            inner = _decompress(kind, data)
        except (OSError, EOFError, ValueError, lzma.LZMAError, zlib.error):
            scan.refuse(rel, f"{kind} data that does not decompress; refused")
            return
        scan_blob(scan, f"{rel} ({kind})", name.removesuffix(".gz"), inner, depth + 1)
        return
    if text is None:
        what = f"{kind} data in a file named as text" if kind else "neither UTF-8, UTF-16 nor UTF-32 text"
        scan.refuse(rel, f"{what}; refused rather than skipped")
        return
    if name.endswith(".json"):
        scan_json(scan, rel, name, text)
    elif name in VOCAB_LINES:  # one vocab entry (vocab.txt) or merge pair (merges.txt) per line
        for n, line in enumerate(text.splitlines()):
            scan_vocab_entry(scan, f"{rel} line {n + 1}", line.replace(" ", "") if name == "merges.txt" else line)
    else:
        scan.ids_in(rel, text)


def scan_text_stream(scan: Scan, rel: str, path: Path) -> bool:
    """A large text file (card, notes, yaml), read and scanned window by window in bounded memory; windows
    overlap by OVERLAP_CHARS so nothing looked for is cut in two. False (nothing done) when the file starts
    like compressed or binary data: the caller reads it whole."""
    with open(path, "rb") as fh:
        head = fh.read(1 << 16)
        if sniff(head):
            return False
        encoding = text_encodings(head[: len(head) - len(head) % 4])[0]
        decoder = codecs.getincrementaldecoder(encoding)("strict")
        fh.seek(0)
        tail, base = "", 0
        while True:
            raw = fh.read(WINDOW_CHARS - OVERLAP_CHARS)
            try:
                text = decoder.decode(raw, final=not raw)
            except UnicodeDecodeError as exc:
                scan.refuse(rel, f"not {encoding} text after char {base + len(tail)} ({exc.reason}); refused "
                                 "rather than skipped")
                return True
            if CONTROL.search(text):
                scan.refuse(rel, "control characters in a text file; refused rather than skipped")
                return True
            if not text and not raw:
                return True
            window = tail + text
            if scan.window(rel, window, base=base):
                return True  # one finding names the file; the rest of it need not be read
            keep = min(len(window), OVERLAP_CHARS)
            base += len(window) - keep
            tail = window[len(window) - keep:]


def scan_file(scan: Scan, root: Path, path: Path, display: str) -> None:
    try:
        _scan_file(scan, root, path, display)
    except OSError as exc:
        scan.refuse(display, f"cannot be read ({type(exc).__name__}); refused rather than skipped")


def _scan_file(scan: Scan, root: Path, path: Path, display: str) -> None:
    rel = path.relative_to(root).as_posix()
    name = path.name.lower()
    suffix = path.suffix.lower() if path.suffix else name
    mode = path.lstat().st_mode
    if stat.S_ISLNK(mode):
        what = "a linked folder" if path.is_dir() else "a dangling link" if not path.exists() else "a linked file"
        scan.refuse(display, f"{what}: a symbolic link; refused, never followed (a release holds regular files only)")
    elif not stat.S_ISREG(mode):
        scan.refuse(display, "not a regular file (a fifo, device or socket); refused")
    elif suffix not in ALLOWED_SUFFIXES and name != ".gitattributes":
        scan.refuse(display, "file type not allowed in a release")
    elif any(SUSPECT_NAME.search(part) for part in rel.split("/")):
        scan.refuse(display, "name looks like an audit log, cohort or QA data file")
    elif any(find_ids(view, scan.secrets.ids, scan.max_len) for _, view in [("", rel), *decoded_views(rel)]):
        scan.refuse(display, f"file name holds a {scan.secrets.noun} identifier")
    elif io.sha256_file(path) in scan.secrets.hashes:
        scan.refuse(display, f"identical to a {scan.secrets.noun} split file")
    elif suffix == ".safetensors":
        scan_safetensors(scan, display, path)
    elif suffix == ".model":
        scan_sentencepiece(scan, display, path.read_bytes())
    elif (path.stat().st_size > STREAM_ABOVE and not name.endswith(".json") and name not in VOCAB_LINES
          and scan_text_stream(scan, display, path)):
        return
    else:
        scan_blob(scan, display, name, path.read_bytes())


# ----------------------------------------------------------------------------- clinical text
def _shingles(words: list[str], k: int) -> Iterator[tuple[int, str]]:
    for i in range(len(words) - k + 1):
        yield i, " ".join(words[i:i + k])


def _reference_phrases(secrets: Secrets) -> Iterator[tuple[str, str]]:
    """(kind, word sequence) to look for, streamed (a real cohort is large, the bundle is small): every
    `min_words` window of every clinical text, and every whole shorter line or list item of at least
    `min_line_words` words (medication lists, short sections)."""
    k = secrets.min_words
    for text, kind in zip(secrets.texts, secrets.text_kinds, strict=True):
        yield from ((kind, s) for _, s in _shingles(_words(text), k))
        for item in [text, *ITEM_SPLIT.split(text)]:
            words = _words(LIST_MARKER.sub("", item))
            if secrets.min_line_words <= len(words) < k:
                yield kind, " ".join(words)


REFERENCE_HASHES_KEPT = 500_000


def _reference_hashes(scan: Scan) -> Iterator[tuple[str, int]]:
    """(kind, hash) of every reference phrase: from the list kept by an earlier pass, else computed (and
    kept when there are at most REFERENCE_HASHES_KEPT of them)."""
    if isinstance(scan.reference_hashes, list):
        yield from scan.reference_hashes
        return
    kept: list[tuple[str, int]] | None = [] if scan.reference_hashes is None else None
    for kind, phrase in _reference_phrases(scan.secrets):
        item = (kind, hash(phrase))
        if kept is not None:
            kept.append(item)
            if len(kept) > REFERENCE_HASHES_KEPT:
                kept = None
        yield item
    scan.reference_hashes = kept if kept is not None else False


def find_clinical_text(scan: Scan) -> None:
    """Every word sequence of the bundle's decoded texts (lengths min_line_words..min_words) is hashed;
    the cohort's phrases are looked up in that table. Where a sequence starts is packed into one int
    (document, length, word) to keep the table small."""
    secrets = scan.secrets
    lengths = range(min(secrets.min_line_words, secrets.min_words), secrets.min_words + 1)
    table: dict[int, int] = {}
    for d, (_, text) in enumerate(scan.docs):
        words = _words(text)
        for k in lengths:
            for i, shingle in _shingles(words, k):
                table.setdefault(hash(shingle), (d << 48) | (k << 32) | i)
    flagged = scan.flagged
    if table:
        for kind, phrase_hash in _reference_hashes(scan):
            hit = table.get(phrase_hash)
            if hit is None:
                continue
            where, k, i = scan.docs[hit >> 48][0], (hit >> 32) & 0xFFFF, hit & 0xFFFFFFFF
            if where.split(" ")[0] not in flagged:
                scan.refuse(where, f"{kind} ({k} words from word {i} on)")
                flagged.add(where.split(" ")[0])
    scan.docs.clear()  # scanned: a long file's texts are checked in batches and then dropped
    scan.doc_chars = 0


def bundle_entries(root: Path) -> Iterator[Path]:
    """Every entry under `root` that is not a real folder (files, links of any kind, fifos, devices),
    without descending into linked folders."""
    for folder, dirs, names in os.walk(root, followlinks=False):
        for name in [*names, *(d for d in dirs if os.path.islink(os.path.join(folder, d)))]:
            yield Path(folder, name)


def scan_bundle(bundle: str | Path, split_files: Iterable[str | Path], min_words: int = 8,
                min_id_digits: int = 5, min_line_words: int = 3, split_format: str = "cohort") -> dict:
    """Scan every file under `bundle` for the data of `split_files` (`split_format`: cohort split JSONs or
    QA split JSONL); the report's `findings` lists what was found. Links are refused, never followed (a
    linked folder is one finding, its files are not listed), and so is anything but a regular file."""
    root = Path(bundle)
    if split_format not in SPLIT_FORMATS:
        raise InputError(f"PHI guard: split format {split_format!r} is not one of {sorted(SPLIT_FORMATS)}")
    secrets = SPLIT_FORMATS[split_format](split_files, min_id_digits)
    secrets.min_words, secrets.min_line_words = min_words, min_line_words
    files = sorted(bundle_entries(root))
    scan = Scan(secrets)
    for path in files:
        scan_file(scan, root, path, redact(path.relative_to(root).as_posix(), secrets))
    find_clinical_text(scan)
    return {
        "ok": not scan.findings,
        "reference": split_format,
        "files_scanned": len(files),
        "identifiers_checked": len(secrets.ids),
        "identifiers_too_short_to_check": len(secrets.too_short),
        "clinical_texts_checked": len(secrets.texts),
        "min_words": min_words,
        "min_line_words": min_line_words,
        "min_id_digits": min_id_digits,
        "findings": scan.findings,
    }


def enforce(report: dict, bundle: str | Path) -> None:
    """Raise CheckFailed (one line: the first finding) unless the scan found nothing."""
    findings = report["findings"]
    if findings:
        more = f" (+{len(findings) - 1} more)" if len(findings) > 1 else ""
        raise CheckFailed(f"PHI guard refused the release bundle {bundle}: {findings[0]}{more}")
    log.info(
        "PHI guard: %d files clean (%d identifiers, %d clinical texts checked)",
        report["files_scanned"], report["identifiers_checked"], report["clinical_texts_checked"],
    )
