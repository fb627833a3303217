"""Canonical forms: text and identifiers normalised (Unicode digits, full-width forms, confusable letters,
O/l typed for 0/1) before matching."""

from __future__ import annotations

import functools
import re
import sys
import unicodedata
from typing import Any

WORD = re.compile(r"[^\W_]+")
# characters that show as nothing (or as blank space) but are letters or marks to Unicode, so NFKC keeps them:
# Hangul fillers, the braille blank, the combining grapheme joiner, variation selectors, Khmer inherent vowels
FILLERS = frozenset([0x115F, 0x1160, 0x3164, 0xFFA0, 0x2800, 0x034F, 0x17B4, 0x17B5, 0x180B, 0x180C, 0x180D,
                     0x180F, *range(0xFE00, 0xFE10), *range(0xE0100, 0xE01F0)])
# bidi controls: a right-to-left override shows the characters after it in reverse order
RLO, BIDI_END = "\u202e", "\u202c\u2069\n"


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
        elif unicodedata.category(ch) == "Cf" or cp in FILLERS:  # Cf: bidi, tags, zero-width
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


def as_displayed(text: str) -> str:
    """The characters in the order a reader sees them: each span after a right-to-left override (to its pop,
    the end of an isolate or the line) reversed, `\u202etsiuQ annahoJ` shows `Johanna Quist`."""
    out, i = [], 0
    while (j := text.find(RLO, i)) >= 0:
        out.append(text[i:j])
        end = min((k for k in (text.find(c, j + 1) for c in BIDI_END) if k >= 0), default=len(text))
        out.append(text[j + 1:end][::-1])
        i = end
    out.append(text[i:])
    return "".join(out)


def normalize_keep_case(text: str) -> str:
    """`normalize` without the casefolding: where a word's capital matters (`Mr. White`, the name; `white`,
    the word)."""
    nfkc = unicodedata.normalize("NFKC", text.translate(_char_table())).translate(_char_table())
    return nfkc.translate(_confusable_table())


def normalize(text: str) -> str:
    """NFKC, every decimal digit as ASCII, no invisible characters, look-alike letters as the ASCII
    letter or digit they imitate, casefolded: the form both the cohort and the bundle are compared in."""
    return normalize_keep_case(text).casefold()


def canonical_id(value: Any) -> str:
    return "".join(ch for ch in normalize(str(value)) if ch.isalnum())


def _words(text: str) -> list[str]:
    return WORD.findall(normalize(text))


DIGIT_LOOKALIKE = str.maketrans("oil", "011")
LOOKALIKE_TOKEN = re.compile(r"[^\W_]*\d[^\W_]*")


def letters_as_digits(text: str) -> str:
    """Normalised text with o/i/l read as 0/1 inside tokens made of digits and those letters only (an id
    typed 9OOOOOO5 or l2345678); words without a digit are left alone."""
    def swap(m: re.Match) -> str:
        token = m.group()
        return token.translate(DIGIT_LOOKALIKE) if set(token) <= set("0123456789oil") else token

    return LOOKALIKE_TOKEN.sub(swap, text)
