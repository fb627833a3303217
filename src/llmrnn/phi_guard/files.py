"""Files: a file scanned by its type (a format scanner, a text stream window by window, or a refused blob)."""

from __future__ import annotations

import codecs
import lzma
import re
import stat
import zlib
from pathlib import Path

from llmrnn import io
from llmrnn.phi_guard.decoders import (
    CONTROL,
    DECOMPRESS,
    _decompress,
    decode_text,
    decoded_views,
    sniff,
    text_encodings,
)
from llmrnn.phi_guard.formats import scan_json, scan_safetensors, scan_sentencepiece, scan_vocab_entry
from llmrnn.phi_guard.identifiers import find_ids
from llmrnn.phi_guard.scan import OVERLAP_CHARS, WINDOW_CHARS, Scan

ALLOWED_SUFFIXES = {".safetensors", ".json", ".md", ".txt", ".jinja", ".model", ".yaml", ".yml", ".gitattributes"}
SUSPECT_NAME = re.compile(
    r"(audit|calls_|cohort|cleaned|splits?\b|^(train|val|test|ood)\.json$|trajector|rollout|patient|question"
    r"|^sft_)", re.IGNORECASE
)
STREAM_ABOVE = 4 << 20
VOCAB_LINES = {"vocab.txt", "merges.txt"}


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
        tail, base, lines = "", 0, 0
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
            if scan.window(rel, window, base=base, lines_before=lines):
                return True  # one finding names the file; the rest of it need not be read
            keep = min(len(window), OVERLAP_CHARS)
            base += len(window) - keep
            lines += window.count("\n", 0, len(window) - keep)
            tail = window[len(window) - keep:]


def refuse_irregular(scan: Scan, path: Path, display: str) -> bool:
    """Refuse a link (never followed) or anything not a regular file; True when refused."""
    mode = path.lstat().st_mode
    if stat.S_ISLNK(mode):
        what = "a linked folder" if path.is_dir() else "a dangling link" if not path.exists() else "a linked file"
        scan.refuse(display, f"{what}: a symbolic link; refused, never followed (a release holds regular files only)")
    elif not stat.S_ISREG(mode):
        scan.refuse(display, "not a regular file (a fifo, device or socket); refused")
    else:
        return False
    return True


def scan_file(scan: Scan, root: Path, path: Path, display: str) -> None:
    try:
        _scan_file(scan, root, path, display)
    except OSError as exc:
        scan.refuse(display, f"cannot be read ({type(exc).__name__}); refused rather than skipped")


def _scan_file(scan: Scan, root: Path, path: Path, display: str) -> None:
    rel = path.relative_to(root).as_posix()
    name = path.name.lower()
    suffix = path.suffix.lower() if path.suffix else name
    if refuse_irregular(scan, path, display):
        return
    if suffix not in ALLOWED_SUFFIXES and name != ".gitattributes":
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
