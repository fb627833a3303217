"""Format scanners: JSON values, tokenizer vocabularies, protobuf/sentencepiece, tiktoken and safetensors
read by their structure."""

from __future__ import annotations

import base64
import binascii
import functools
import json
import math
import mmap
import re
import struct
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from tokenizers import decoders

from llmrnn.phi_guard.canonical import WORD, _char_table, canonical_id
from llmrnn.phi_guard.identifiers import find_ids, redact
from llmrnn.phi_guard.scan import Scan
from llmrnn.phi_guard.secrets import ID_KEYS, Secrets

# JSON numbers under these keys are sizes, seeds, ports or hyperparameters (a seed of 12345 is common),
# not identifiers; and token ids in model metadata files
SIZE_KEY = re.compile(r"(^|_)(size|bytes|length|len|embeddings|theta|window|dim|positions|mb|gb|runtime|samples"
                      r"|tokens|seed|steps|port)$")
# in model metadata files: bos_token_id, eos_token_id, image_token_id, `id` of an added token; any other
# `*_id` number (record_id, example_id) is compared with the cohort's ids
TOKEN_ID_KEY = re.compile(r"^ids?$|(^|_)token(_type)?_ids?$")
ST_DTYPES = {"BOOL": 1, "U8": 1, "I8": 1, "F8_E4M3": 1, "F8_E5M2": 1, "F8_E8M0": 1, "I16": 2, "U16": 2,
             "F16": 2, "BF16": 2, "I32": 4, "U32": 4, "F32": 4, "I64": 8, "U64": 8, "F64": 8}
ST_INT = {"I16": "<i2", "U16": "<u2", "I32": "<i4", "U32": "<u4", "I64": "<i8", "U64": "<u8",
          "F16": "<f2", "F32": "<f4", "F64": "<f8"}
VOCAB_JSON = {"vocab.json", "added_tokens.json"}
MODEL_METADATA = {"config.json", "generation_config.json", "tokenizer.json", "tokenizer_config.json",
                  "special_tokens_map.json", "added_tokens.json", "model.safetensors.index.json",
                  "adapter_config.json", "preprocessor_config.json"}


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
        scan_joined(scan, rel, data)


def _leaves(value: Any, out: list[str], budget: int = 1 << 20) -> None:
    """The strings of decoded JSON in document order (keys too), up to `budget` of them; numbers are left out
    (each is compared by its value, and sizes and seeds side by side would read as a number of their own)."""
    stack = [value]
    while stack and len(out) < budget:
        v = stack.pop()
        if isinstance(v, dict):
            for k, item in reversed(list(v.items())):
                stack.append(item)
                stack.append(str(k).split("\x00")[0])
        elif isinstance(v, list):
            stack.extend(reversed(v))
        elif isinstance(v, str):
            out.append(v)


def scan_joined(scan: Scan, rel: str, value: Any, path: str = "$") -> None:
    """An identifier split across JSON structure (a name in two fields of one record, an MRN over two strings
    of a list): the strings of `value` are scanned once more joined by a space, in document order."""
    leaves: list[str] = []
    _leaves(value, leaves)
    if len(leaves) > 1:
        scan.ids_in(f"{rel} {path} (its strings joined)", " ".join(leaves), docs=False)


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
