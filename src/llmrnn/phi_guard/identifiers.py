"""Finding identifiers in text: ids in any grouping or script, number literals by value, redaction."""

from __future__ import annotations

import decimal
import re

from llmrnn.phi_guard.canonical import normalize
from llmrnn.phi_guard.decoders import decoded_views
from llmrnn.phi_guard.ordinary_words import ORDINARY_WORD_SURNAMES
from llmrnn.phi_guard.secrets import SURNAME_JOINERS, Secrets

# up to two of these may sit inside an identifier written with grouping (12 345, 12,345, 12-345, MRN-AB7)
ID_JOINERS = frozenset(" \t\r\n,.-_'\u2019\u02bc/\u00b7\u2010\u2012\u2013\u2014\u2212\u066b\u066c*`~\\")
ID_RUN = re.compile(r"\d+|[^\W\d_]+")


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


# a date written any way a reader reads as one: numbers with separators (3/14/56, 14.03.1956, 1956 03 14) or
# with a month name (March 14th, 1956; 14 Mar 56; 14-mar-1956)
DATE = re.compile(
    r"(?<![^\W_])(?:(\d{1,4})[-/. ]{1,2}(\d{1,2})[-/. ]{1,2}(\d{1,4})"
    r"|([a-z]{3,9})\.?[ \t-]{1,2}(\d{1,2})(?:st|nd|rd|th)?,?[ \t-]{1,2}(\d{2,4})"
    r"|(\d{1,2})(?:st|nd|rd|th)?[ \t-]{1,2}(?:of[ \t]+)?([a-z]{3,9})\.?,?[ \t-]{1,2}(\d{2,4}))(?![^\W_])")
MONTHS = ("jan", "feb", "mar", "apr", "may", "jun", "jul", "aug", "sep", "oct", "nov", "dec")


def _years(n: int, digits: int) -> list[int]:
    if digits <= 2:
        return [1900 + n, 2000 + n]  # a two-digit year: either century
    return [n] if 1000 <= n <= 2999 else []


def date_values(parts: list[str]) -> set[str]:
    """yyyymmdd of every reading of a date's three parts (digits or a month name): the year first or last,
    month and day in either order; an impossible reading gives nothing."""
    nums = [int(p) if p.isdigit() else (MONTHS.index(p[:3]) + 1 if p[:3] in MONTHS else None) for p in parts]
    if None in nums:
        return set()
    named = [not p.isdigit() for p in parts]
    out = set()
    for y in (0, 2):
        rest = [i for i in range(3) if i != y]
        if named[y]:
            continue
        for year in _years(nums[y], len(parts[y])):
            for m, d in (rest, rest[::-1]):
                if any(named) and not named[m]:
                    continue
                if 1 <= nums[m] <= 12 and 1 <= nums[d] <= 31:
                    out.add(f"{year:04d}{nums[m]:02d}{nums[d]:02d}")
    return out


def find_dates(text: str, ids: dict[str, str]) -> list[tuple[int, str]]:
    """(offset, kind) of every date in normalised `text` that is a date of birth of the reference (the
    reference holds its yyyymmdd form), however it is written."""
    hits = []
    for m in DATE.finditer(text):
        parts = [g for g in m.groups() if g is not None]
        for value in date_values(parts):
            if kind := ids.get(value):
                hits.append((m.start(), kind))
                break
    return hits


NAME_WORD = re.compile(r"[^\W\d_]+")
NAME_SLACK = 2  # words that may sit between a name's words (a middle name or initial, a title)


_BY_WORD: dict[int, tuple[dict, int, dict[str, list[tuple[str, ...]]], frozenset[str]]] = {}


def _names_by_first_word(names: dict[tuple[str, ...], str]) -> tuple[dict[str, list[tuple[str, ...]]], frozenset[str]]:
    """({first word: names}, every name word) of `names`, built once per names table (a bundle has many
    small texts: tokenizer entries); the table itself is kept with it, so its id is not reused."""
    cached = _BY_WORD.get(id(names))
    if cached is None or cached[0] is not names or cached[1] != len(names):
        first: dict[str, list[tuple[str, ...]]] = {}
        for name in names:
            first.setdefault(name[0], []).append(name)
        cached = _BY_WORD[id(names)] = (names, len(names), first, frozenset(w for name in names for w in name))
    return cached[2], cached[3]


def find_names(text: str, names: dict[tuple[str, ...], str]) -> list[tuple[int, str]]:
    """(offset, kind) of every name of the notes in normalised `text` with its words in any order and up to
    NAME_SLACK other words among them (`quist, johanna`, `johanna m. quist`)."""
    by_word = _names_by_first_word(names)
    where: dict[str, list[tuple[int, int]]] = {}  # word -> [(word index, char offset)]
    for n, m in enumerate(NAME_WORD.finditer(text)):
        if m.group() in by_word[1]:
            where.setdefault(m.group(), []).append((n, m.start()))
    hits = []
    for name in (name for w in where for name in by_word[0].get(w, ())):
        kind = names[name]
        if not all(w in where for w in name):
            continue
        span = len(name) + NAME_SLACK
        for n, offset in where[name[0]]:
            if all(any(abs(k - n) < span for k, _ in where[w]) for w in name[1:]):
                hits.append((offset, kind))
                break
    return hits


# A patient's surname alone, where it names a person. A BARE surname is never a finding, rare or not: the
# tokenizer's vocabulary is scanned entry by entry and holds many surnames as word pieces, and a model card on
# clinical data names eponyms (Parkinson, Graves, Addison) that are also some patient's surname; a bare word
# does not say a person is meant, a title, an initial or a possessive does.
NAME_TOKEN = re.compile(r"[^\W\d_]+(?:(?:['\u2019\u02bc](?![sS](?![^\W_]))|-)[^\W\d_]+)*")
# a title before it, with up to two initials between (`Mrs. Quist`, `Dr J. Quist`, `pt Quist`); not after a
# number (`10 ms`, `12 pt` are units)
TITLE_BEFORE = re.compile(r"(?i)(?<!\d)(?<!\d )(?<![^\W_])(mrs|mr|ms|mx|miss|dr|prof|professor|doctor|patient|pt)"
                          r"(?:\.\s*|\s+)(?:[^\W\d_]\.?\s+){0,2}$")
# titles that are also ordinary words: before an ordinary-word surname only when that is capitalised
WORD_TITLES = frozenset({"miss", "patient", "pt", "doctor", "professor"})
INITIAL_AFTER = re.compile(r",[ \t]*([^\W\d_])(?:\.|(?![^\W_]))")  # `QUIST, J.`, `quist, j`
# an ordinary word before a capital initial that ends there (`WHITE, P.`; not `white, a colour`)
CAPITAL_INITIAL_AFTER = re.compile(r",[ \t]*([^\W\d_])(?:\.|[ \t]*(?:$|[,;)\]]))", re.MULTILINE)
GIVEN_AFTER = re.compile(r",[ \t]*([^\W\d_]{2,})")  # `Quist, Maria` (capitalised)
POSSESSIVE_S = re.compile(r"['\u2019\u02bc][sS](?![^\W_])")  # `Quist's`
POSSESSIVE_APOSTROPHE = re.compile(r"['\u2019\u02bc](?![^\W_])")  # `Jones'`
# a possessive that names a disease, sign or law after a person long dead (`Parkinson's disease`)
EPONYM_AFTER = re.compile(
    r"(?i)['\u2019\u02bc]s?\s+(?:disease|syndrome|sign|signs|palsy|test|law|reflex|triad|phenomenon|criteria"
    r"|classification|score|scale|maneuver|manoeuvre|operation|procedure|fracture|nodes?|ulcer|tumou?r|lymphoma"
    r"|sarcoma|encephalopathy|contracture|disorder|method|rule|equation|formula|modulus|constant|theorem"
    r"|principle|algorithm|razor|paradox)(?![^\W_])")


def find_surnames(cased: str, surnames: dict[str, str]) -> list[tuple[int, str, str]]:
    """(offset, kind, how) of every surname of the notes in `cased` (normalised, case kept) written as a
    person's name: after a title, before an initial, before a capitalised given name, or possessive. An
    ordinary-word surname (ordinary_words; White, Young) counts after a title or before a capital initial only."""
    hits = []
    for m in NAME_TOKEN.finditer(cased):
        key = SURNAME_JOINERS.sub("", m.group().casefold())
        kind = surnames.get(key)
        if kind is None:
            continue
        ordinary = key in ORDINARY_WORD_SURNAMES or len(key) <= 2
        capital = m.group()[0].isupper()
        after = cased[m.end():m.end() + 80]
        title = TITLE_BEFORE.search(cased[max(0, m.start() - 40):m.start()])
        if title and (capital or not ordinary or title.group(1).lower() not in WORD_TITLES):
            hits.append((m.start(), kind, "after a title"))
        elif (initial := (CAPITAL_INITIAL_AFTER if ordinary else INITIAL_AFTER).match(after)) and \
                (not ordinary or capital and initial.group(1).isupper()):
            hits.append((m.start(), kind, "before an initial"))
        elif ordinary:
            continue
        elif (given := GIVEN_AFTER.match(after)) and given.group(1)[0].isupper():
            hits.append((m.start(), kind, "before a given name"))
        elif (POSSESSIVE_S.match(after) or key.endswith("s") and POSSESSIVE_APOSTROPHE.match(after)) \
                and not EPONYM_AFTER.match(after):
            hits.append((m.start(), kind, "as a possessive"))
    return hits


def redact(name: str, secrets: Secrets) -> str:
    """A name (file, tensor, JSON key) safe to print: identifier-bearing runs replaced by ***; a name that
    holds one only once decoded (URL escapes, base64) is replaced whole, its folder kept."""
    if not find_ids(name, secrets.ids, secrets.max_len):
        if any(find_ids(view, secrets.ids, secrets.max_len) for _, view in decoded_views(name)):
            return re.sub(r"[^/]+$", "***", name)
        return name
    return "".join("***" if find_ids(part, secrets.ids, secrets.max_len) else part
                   for part in re.split(r"([^\W_]+)", name))
