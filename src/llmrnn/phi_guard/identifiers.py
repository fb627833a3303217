"""Finding identifiers in text: ids in any grouping or script, number literals by value, redaction."""

from __future__ import annotations

import decimal
import re

from llmrnn.phi_guard.canonical import normalize
from llmrnn.phi_guard.decoders import decoded_views
from llmrnn.phi_guard.secrets import Secrets

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


def redact(name: str, secrets: Secrets) -> str:
    """A name (file, tensor, JSON key) safe to print: identifier-bearing runs replaced by ***; a name that
    holds one only once decoded (URL escapes, base64) is replaced whole, its folder kept."""
    if not find_ids(name, secrets.ids, secrets.max_len):
        if any(find_ids(view, secrets.ids, secrets.max_len) for _, view in decoded_views(name)):
            return re.sub(r"[^/]+$", "***", name)
        return name
    return "".join("***" if find_ids(part, secrets.ids, secrets.max_len) else part
                   for part in re.split(r"([^\W_]+)", name))
