"""One scan of a bundle: its findings, the checks every piece of text goes through, and the clinical-text
pass (shingles of the reference's sections matched on decoded text)."""

from __future__ import annotations

import math
import re
from collections.abc import Iterator

from llmrnn.constants import CREDENTIAL
from llmrnn.phi_guard.canonical import RLO, _words, as_displayed, letters_as_digits, normalize_keep_case
from llmrnn.phi_guard.decoders import decoded_views
from llmrnn.phi_guard.identifiers import find_dates, find_ids, find_names, find_numbers, find_surnames
from llmrnn.phi_guard.secrets import Secrets

ITEM_SPLIT = re.compile(r"\n|;|\u2022|,\s")
LIST_MARKER = re.compile(r"^\s*(?:[-*\u00b7]|\(?\d{1,2}[.)])\s+")
# a credential in a URL: scheme://user:password@host
URL_CREDENTIAL = re.compile(r"(?i)\b[a-z][a-z0-9+.-]*://[^/?#@\s:]*:[^/?#\s]*@")
# Long texts are scanned in windows that overlap by far more than the longest thing looked for (an id
# with its separators, `min_words` words, a base64 run of them), so memory stays bounded by the window,
# not the file; text files above STREAM_ABOVE bytes are read from disk window by window.
WINDOW_CHARS = 1 << 20
OVERLAP_CHARS = 1 << 16
DOC_BUDGET_CHARS = 1 << 20  # decoded text kept for the clinical-text pass before it runs and is dropped
# a markdown table's cell borders (and the line breaks between its rows): an id split over cells is read
# with the cells joined by a space
TABLE_BORDER = re.compile(r"[ \t]*(?:\|[ \t]*\r?\n?[ \t]*)+")
# JSON written into a text: the strings of a list or record joined by a space
JSON_BORDER = re.compile(r'"(?:\s*[,:\[\]{}]\s*)+"')
# Free text (what a user wrote: a tag, a commit message, a prompt in the settings) is prose; encoded data in
# it is refused, not decoded: a data URI, a base64 run (24+ characters, letters of both cases and a digit, a
# stretch of 16 without a path separator: not a path or a model name), runs of URL, HTML or backslash escapes
DATA_URI = re.compile(r"(?i)\bdata:[a-z0-9.+/-]*(?:;[a-z0-9=.+-]+)*,")
B64_BLOB = re.compile(r"[A-Za-z0-9+/_-]{24,}={0,2}")
ESCAPE_RUN = re.compile(r"(?i)(?:%[0-9a-f]{2}){4,}|(?:&#x?[0-9a-f]+;){4,}|(?:\\(?:u[0-9a-f]{4}|x[0-9a-f]{2})){4,}")


def encoded_data(text: str) -> tuple[str, int] | None:
    """(what, char offset) of the first encoded data `text` holds (None when it holds none): free text is
    refused with it, not decoded."""
    if m := DATA_URI.search(text):
        return "a data URI", m.start()
    if m := ESCAPE_RUN.search(text):
        return "a run of URL, HTML or backslash escapes", m.start()
    for m in B64_BLOB.finditer(text):
        run = m.group()
        if all(c in "0123456789abcdefABCDEF" for c in run.rstrip("=")):
            continue  # a hash (hex): decoded and scanned like text
        if any(len(seg) >= 16 and re.search(r"[a-z]", seg) and re.search(r"[A-Z]", seg) and re.search(r"\d", seg)
               for seg in re.split(r"[/_-]", run)):
            return "base64 data", m.start()
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
        self.birth_dates = any(k.startswith("date of birth") for k in secrets.ids.values())
        self.free_text = False  # the text scanned now is what a user wrote: encoded data in it is refused

    def refuse(self, where: str, what: str) -> None:
        self.findings.append(f"{where}: {what}")

    def ids_in(self, where: str, text: str, docs: bool = True) -> None:
        """Identifiers in `text` and in every decoding of it; the texts join the clinical-text pass. A long
        text is scanned window by window (bounded memory); the first window with a finding ends it."""
        if len(text) <= WINDOW_CHARS:
            self.window(where, text, docs)
            return
        lines, counted = 0, 0
        for start in range(0, len(text), WINDOW_CHARS - OVERLAP_CHARS):
            window = text[start:start + WINDOW_CHARS]
            lines += text.count("\n", counted, start)  # counted from where the last window started, not from 0
            counted = start
            if self.window(where, window, docs, start, lines) or start + WINDOW_CHARS >= len(text):
                return

    def line_of_id(self, text: str) -> int | None:
        """The first line (1-based) of `text` that holds an identifier written as itself or in any decoded or
        rendered form of that line (or of it joined with the next line: markup may split an id over two);
        None when only the whole text shows one."""
        lines = text.split("\n")
        for span in (1, 2):
            for n in range(len(lines)):
                chunk = "\n".join(lines[n:n + span])
                if any(self._id_hits(view)[0] for _, view in [("", chunk), *decoded_views(chunk)]):
                    return n + 1
        return None

    def window(self, where: str, text: str, docs: bool = True, base: int = 0, lines_before: int = 0) -> bool:
        """One window of a text, starting at char `base` (after `lines_before` lines) of it; True when it had
        a finding."""
        before = len(self.findings)
        views = [("", text), *self.read_as_shown(text), *decoded_views(text)]
        if self.free_text and (encoded := encoded_data(text)):
            self.refuse(where, f"{encoded[0]} in user-supplied free text at char {base + encoded[1]}; refused, "
                               "not decoded")
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
                if "\n" in text and (line := self.line_of_id(text)) is not None:
                    at = f"{at}, line {lines_before + line}"
                self.refuse(where, f"{self.secrets.noun} identifier ({kind}){form} at {at}{more}")
                break
            if docs:
                self.docs.append((f"{where}{' (' + how + ')' if how else ''}", view))
                self.doc_chars += len(view)
        if self.doc_chars > DOC_BUDGET_CHARS:
            find_clinical_text(self)
        return len(self.findings) > before

    @staticmethod
    def read_as_shown(text: str) -> list[tuple[str, str]]:
        """Views of `text` as a person reads it where that differs from its characters: a right-to-left
        override's span reversed, a table's cells joined."""
        views = []
        if RLO in text:
            views.append(("as displayed", as_displayed(text)))
        if "|" in text:
            views.append(("table cells joined", TABLE_BORDER.sub(" ", text)))
        if '"' in text:
            views.append(("JSON strings joined", JSON_BORDER.sub(" ", text)))
        return views

    def _id_hits(self, view: str) -> tuple[list[tuple[int, str]], str]:
        """Hits of the ids written as text, then as the VALUE of a number literal (0012345678,
        1.2345678e7, 0xBC614E), then with digit look-alike letters read as digits (9OOOOOO5, l2345678)."""
        hits = find_ids(view, self.secrets.ids, self.max_len)
        if hits:
            return hits, ""
        cased = normalize_keep_case(view)
        normal = cased.casefold()  # = normalize(view)
        if self.secrets.names and (hits := find_names(normal, self.secrets.names)):
            return hits, " with its words reordered or apart"
        if self.secrets.surnames and (found := find_surnames(cased, self.secrets.surnames)):
            return [(offset, kind) for offset, kind, _ in found], f" {found[0][2]}"
        if not self.numeric_ids:
            return [], ""
        if hits := find_numbers(normal, self.secrets.ids):
            return hits, " as a number"
        as_digits = letters_as_digits(normal)
        if as_digits != normal and (hits := find_ids(as_digits, self.secrets.ids, self.max_len)):
            return hits, " written with look-alike letters"
        if self.birth_dates and (hits := find_dates(normal, self.secrets.ids)):
            return hits, " written as a date"
        return [], ""

    def number(self, where: str, value: float) -> None:
        if isinstance(value, float) and not (math.isfinite(value) and value.is_integer()):
            return
        kind = self.secrets.ids.get(str(abs(int(value))))  # -12345678 is the id with a sign
        if kind:
            self.refuse(where, f"{self.secrets.noun} identifier ({kind}) as a JSON number")


# ----------------------------------------------------------------------------- clinical text
def _shingles(words: list[str], k: int) -> Iterator[tuple[int, str]]:
    for i in range(len(words) - k + 1):
        yield i, " ".join(words[i:i + k])


# Clinical text whose word breaks are hidden (words glued by <wbr>, zero-width or bidi characters, a
# footnote digit or escaped markup inside or between words: `chest<wbr>pain`, `pain<sup>1</sup>`) is matched on
# its letters alone too: LETTERS_PER_WORD x min_words letters in a row, starting where a reference word starts.
LETTERS_PER_WORD = 5
SQUASHED = "\x00"  # marks a letters-only phrase: its hashes never equal a word sequence's


def _letters(text: str) -> tuple[str, list[int]]:
    """The letters of normalised `text` alone, and where in them each word starts."""
    letters, starts, at = [], [], 0
    for word in _words(text):
        starts.append(at)  # a running count: summing the letters so far for each word was quadratic
        letters.append("".join(ch for ch in word if ch.isalpha()))
        at += len(letters[-1])
    return "".join(letters), starts


def _letter_runs(secrets: Secrets) -> int:
    return LETTERS_PER_WORD * secrets.min_words


def _reference_phrases(secrets: Secrets) -> Iterator[tuple[str, str]]:
    """(kind, word sequence) to look for, streamed (a real cohort is large, the bundle is small): every
    `min_words` window of every clinical text, every whole shorter line or list item of at least
    `min_line_words` words (medication lists, short sections), and every run of _letter_runs letters that
    starts at a word (marked SQUASHED)."""
    k = secrets.min_words
    n = _letter_runs(secrets)
    for text, kind in zip(secrets.texts, secrets.text_kinds, strict=True):
        yield from ((kind, s) for _, s in _shingles(_words(text), k))
        for item in [text, *ITEM_SPLIT.split(text)]:
            words = _words(LIST_MARKER.sub("", item))
            if secrets.min_line_words <= len(words) < k:
                yield kind, " ".join(words)
        letters, starts = _letters(text)
        yield from ((kind, SQUASHED + letters[i:i + n]) for i in starts if i + n <= len(letters))


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
    n = _letter_runs(secrets)
    for d, (_, text) in enumerate(scan.docs):
        words = _words(text)
        for k in lengths:
            for i, shingle in _shingles(words, k):
                table.setdefault(hash(shingle), (d << 48) | (k << 32) | i)
        letters, _ = _letters(text)  # every offset: the bundle's word breaks may be anywhere, or nowhere
        for i in range(len(letters) - n + 1):
            table.setdefault(hash(SQUASHED + letters[i:i + n]), (d << 48) | i)
    flagged = scan.flagged
    glued: dict[str, str] = {}  # file -> its letters-only finding, reported where no word sequence is found
    if table:
        for kind, phrase_hash in _reference_hashes(scan):
            hit = table.get(phrase_hash)
            if hit is None:
                continue
            where, k, i = scan.docs[hit >> 48][0], (hit >> 32) & 0xFFFF, hit & 0xFFFFFFFF
            if not k:
                glued.setdefault(where, f"{kind} ({n} letters in a row from letter {i} on, its word breaks hidden)")
            elif where.split(" ")[0] not in flagged:
                scan.refuse(where, f"{kind} ({k} words from word {i} on)")
                flagged.add(where.split(" ")[0])
    for where, what in glued.items():
        if where.split(" ")[0] not in flagged:
            scan.refuse(where, what)
            flagged.add(where.split(" ")[0])
    scan.docs.clear()  # scanned: a long file's texts are checked in batches and then dropped
    scan.doc_chars = 0
