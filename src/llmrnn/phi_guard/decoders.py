"""Decoders: the views of a text or a byte string a scan must see (the text a reader of the rendered page
sees, encodings, compression, base64/base32/hex, URL/HTML/backslash escapes)."""

from __future__ import annotations

import base64
import binascii
import bz2
import codecs
import functools
import gzip
import html
import lzma
import re
import urllib.parse
import zlib
from collections.abc import Iterator
from html.parser import HTMLParser
from io import BytesIO

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
MAX_UNESCAPE = 4  # %2541 -> %41 -> A: escapes applied over and over are undone this many times
# markup a renderer turns into something else than the characters written: HTML tags and entities,
# markdown links, emphasis, code spans, tables, headings
MARKUP = re.compile(r"[<>&\[\]*_`|~#]")
# tags a page renders as a break between words (a cell, a line, a block); every other tag is invisible
BREAK_TAGS = frozenset({"br", "p", "div", "li", "ul", "ol", "tr", "td", "th", "table", "thead", "tbody", "h1",
                        "h2", "h3", "h4", "h5", "h6", "blockquote", "pre", "hr", "dt", "dd", "section", "header",
                        "footer", "article", "caption", "summary", "details", "img"})


class _VisibleText(HTMLParser):
    """The text of an HTML page as a reader sees it: tags dropped, entities decoded, a break (newline) where a
    block, a line-break tag or a table cell separates words."""

    def __init__(self) -> None:
        super().__init__(convert_charrefs=True)
        self.parts: list[str] = []

    def handle_starttag(self, tag: str, attrs) -> None:
        if tag in BREAK_TAGS:
            self.parts.append("\n")
        alt = dict(attrs).get("alt") if tag == "img" else None
        if alt:  # shown where the image is not
            self.parts.append(alt)

    def handle_endtag(self, tag: str) -> None:
        if tag in BREAK_TAGS:
            self.parts.append("\n")

    def handle_data(self, data: str) -> None:
        self.parts.append(data)


@functools.cache
def _markdown():
    from markdown_it import MarkdownIt

    # CommonMark with raw HTML passed through (the Hub renders it) and GitHub's tables and strikethrough
    return MarkdownIt("commonmark", {"html": True}).enable(["table", "strikethrough"])


def rendered_text(text: str) -> str | None:
    """What a reader of the rendered page sees of `text` (markdown rendered, then HTML tags stripped to their
    visible text), or None when `text` holds no markup (it renders as itself)."""
    if not MARKUP.search(text):
        return None
    try:
        page = _markdown().render(text)
    except (ValueError, RecursionError):  # not markdown at all: HTML alone is still stripped
        page = text
    parser = _VisibleText()
    try:
        parser.feed(page)
        parser.close()
    except (AssertionError, RecursionError):  # HTMLParser gives up on some malformed markup
        return None
    visible = "".join(parser.parts)
    return visible if visible.split() != text.split() else None


def decoded_views(text: str, depth: int = 0) -> Iterator[tuple[str, str]]:
    """(how, text) for every decoding of `text` that could hide an identifier or clinical text: backslash
    escapes, HTML entities, URL escapes, base64 and hex runs (decoded payloads are decoded again); first the
    rendered page's visible text (markup between words stripped: `chest<br>pain`, `[chest](u) pain`)."""
    if depth == 0 and (visible := rendered_text(text)) is not None:
        yield "rendered", visible
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
