"""Atomic file writes and hashing: a killed job never leaves a file that looks complete."""

from __future__ import annotations

import contextlib
import copy
import hashlib
import json
import os
import re
import shutil
import stat
import tempfile
import time
from collections.abc import Callable, Iterable, Iterator
from pathlib import Path
from typing import Any

import yaml

from llmrnn.errors import InputError


def _tmp_beside(path: Path) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)
    os.close(fd)
    return Path(tmp)


@contextlib.contextmanager
def atomic_path(path: str | os.PathLike, mode: int | None = None) -> Iterator[Path]:
    """Yield a temp path beside `path`; rename it onto `path` only if the block succeeds."""
    target = Path(path)
    tmp = _tmp_beside(target)
    try:
        yield tmp
        if mode is not None:
            os.chmod(tmp, mode)
        os.replace(tmp, target)
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise


def remove_stale_temps(target: str | os.PathLike, labels: tuple[str, ...] = ()) -> list[Path]:
    """Temp folders an earlier, killed build of `target` left beside it (`.NAME.XXXXXXXX.tmp`, or
    `.NAME.LABEL.XXXXXXXX.tmp` for a labelled helper folder); Snakemake runs one job per output at a
    time, so none of them belongs to a live build. Returns what was removed."""
    target = Path(target)
    labelled = rf"(?:(?:{'|'.join(map(re.escape, labels))})\.)?" if labels else ""
    pattern = re.compile(rf"\.{re.escape(target.name)}\.{labelled}[a-z0-9_]{{8}}\.tmp")
    removed = []
    if target.parent.is_dir():
        for old in target.parent.iterdir():
            if pattern.fullmatch(old.name) and old.is_dir() and not old.is_symlink():
                shutil.rmtree(old, ignore_errors=True)
                removed.append(old)
    return removed


@contextlib.contextmanager
def atomic_dir(path: str | os.PathLike) -> Iterator[Path]:
    """Yield a temp directory beside `path`; it replaces `path` only if the block succeeds. Temp
    directories of an earlier build of `path` that was killed are removed first."""
    target = Path(path)
    target.parent.mkdir(parents=True, exist_ok=True)
    remove_stale_temps(target)
    tmp = Path(tempfile.mkdtemp(prefix=f".{target.name}.", suffix=".tmp", dir=target.parent))
    try:
        yield tmp
        if target.exists():
            shutil.rmtree(target)
        os.replace(tmp, target)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise


def write_text(path: str | os.PathLike, text: str, mode: int | None = None) -> None:
    with atomic_path(path, mode) as tmp:
        tmp.write_text(text, encoding="utf-8")


def json_text(obj: Any) -> str:
    """The JSON text write_json writes (for write_texts)."""
    return json.dumps(obj, indent=2, sort_keys=False, ensure_ascii=False) + "\n"


def write_json(path: str | os.PathLike, obj: Any, mode: int | None = None) -> None:
    write_text(path, json_text(obj), mode)


def deep_merge(base: dict, over: dict | None) -> dict:
    """`over` layered onto `base` the way Snakemake layers --configfile files: mappings merge key by key,
    anything else (lists included) replaces; neither input is changed."""
    out = copy.deepcopy(base)
    for key, value in (over or {}).items():
        if isinstance(value, dict) and isinstance(out.get(key), dict):
            out[key] = deep_merge(out[key], value)
        else:
            out[key] = copy.deepcopy(value)
    return out


def read_json(path: str | os.PathLike, what: str = "JSON file") -> Any:
    """A JSON file under the input rule (read_regular_bytes: a regular file, bounded, read in time)."""
    return json.loads(decode_text(read_regular_bytes(path, what, INPUT_MAX_BYTES), str(path)))


# ----------------------------------------------------------------------------- the input reader policy
# ONE policy for every user data file (cohort, QA records): UTF-8, with or without a byte-order mark (editors
# on Windows write one; it is valid UTF-8), and nothing else: Latin-1 or UTF-16 bytes are refused with the
# byte offset rather than guessed at, so no text is silently mis-decoded.
def decode_text(raw: bytes, where: str, offset: int = 0) -> str:
    """`raw` as text under the reader policy; an InputError naming `where` and the byte otherwise."""
    try:
        return raw.decode("utf-8-sig")
    except UnicodeDecodeError as exc:
        raise InputError(f"{where}: byte {offset + exc.start}: not UTF-8 text ({exc.reason}); "
                         "save the file as UTF-8") from None


def read_input_text(path: str | os.PathLike, what: str = "file") -> str:
    """A user's data file as text under the reader policy and the input rule (read_regular_bytes); every
    failure is one InputError line."""
    return decode_text(read_regular_bytes(path, what, INPUT_MAX_BYTES), str(path))


def unique_keys(where: str) -> Callable[[list[tuple[str, Any]]], dict]:
    """json's object_pairs_hook refusing a key given twice in one object (json keeps the last silently, so
    a second `discharge_diagnosis` or `subject_id` would replace the first unseen). The key is named only
    when it is a plain field name: a key can be any text of the file, patient text included."""
    def hook(pairs: list[tuple[str, Any]]) -> dict:
        out = dict(pairs)
        if len(out) != len(pairs):
            seen: set[str] = set()
            key = next(k for k, _ in pairs if k in seen or seen.add(k))
            named = repr(key) if FIELD_NAME.fullmatch(key) else "a key"
            raise InputError(f"{where}: {named} appears twice in one object; JSON keys must be unique")
        return out

    return hook


FIELD_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_]{0,63}")


# ----------------------------------------------------------------------------- the YAML reader
# ONE loader for every YAML file the package reads (config layers, RUN/config.yaml, the schema, rubrics,
# prompt files): a regular file (a fifo or a device such as /dev/zero is refused before it is opened for
# reading, so nothing hangs or fills memory) of at most YAML_MAX_BYTES, UTF-8 text (the reader policy),
# YAML's safe types only, no key twice in one mapping (YAML says keys are unique; PyYAML silently keeps the
# last), nesting at most YAML_MAX_DEPTH deep and aliases that expand to at most YAML_MAX_NODES nodes (an
# 800-byte "billion laughs" file of nested anchors would otherwise expand to gigabytes in whatever walks it).
YAML_MAX_BYTES = 4 * 1024 * 1024
YAML_MAX_DEPTH = 64
YAML_MAX_NODES = 200_000


# ----------------------------------------------------------------------------- the input rule
# EVERY file the package reads as input (cohort and QA data, config layers, JSON records, JSONL logs) is opened
# here: a regular file (a fifo would block the reader forever, /dev/zero or a link to it would fill memory;
# both are refused before a byte is read), of at most INPUT_MAX_BYTES (the full MIMIC-IV cohort is a few
# hundred MB), read within READ_TIMEOUT_S (a file on a stalled network mount that still trickles, checked
# between 1 MiB reads).
INPUT_MAX_BYTES = 4 * 1024**3  # 4 GiB: json.loads of it already needs tens of GB of memory
READ_TIMEOUT_S = 600.0


class MissingInput(InputError, FileNotFoundError):
    """An input file that does not exist: one InputError line, and still the FileNotFoundError (an OSError)
    that callers reading an optional file (a log not written yet) catch."""

    def __str__(self) -> str:
        return str(self.args[0]) if self.args else ""


def open_regular(path: str | os.PathLike, what: str = "file", limit: int | None = INPUT_MAX_BYTES) -> int:
    """A read-only descriptor of `path`, which must be a regular file of at most `limit` bytes (the input
    rule above); anything else is one InputError line. Opened non-blocking, so a fifo never blocks it."""
    try:
        fd = os.open(path, os.O_RDONLY | getattr(os, "O_NONBLOCK", 0) | getattr(os, "O_NOCTTY", 0))
    except FileNotFoundError:
        raise MissingInput(f"{path}: {what} does not exist") from None
    except IsADirectoryError:
        raise InputError(f"{path}: is a folder, not a {what}") from None
    except OSError as exc:
        raise InputError(f"{path}: cannot read the {what} ({exc.strerror or type(exc).__name__})") from None
    try:
        st = os.fstat(fd)
        if stat.S_ISDIR(st.st_mode):
            raise InputError(f"{path}: is a folder, not a {what}")
        if not stat.S_ISREG(st.st_mode):
            raise InputError(f"{path}: not a regular file (a fifo, socket or device); give the {what} as a file")
        if limit is not None and st.st_size > limit:
            raise InputError(f"{path}: {st.st_size} bytes, larger than the {limit} a {what} may have")
        os.set_blocking(fd, True)  # a regular file: plain reads from here
    except BaseException:
        os.close(fd)
        raise
    return fd


def read_regular_bytes(path: str | os.PathLike, what: str = "file", limit: int | None = INPUT_MAX_BYTES,
                       timeout_s: float | None = None) -> bytes:
    """The bytes of a regular file of at most `limit` bytes, read within `timeout_s` (READ_TIMEOUT_S by
    default); anything else is one InputError line."""
    fd = open_regular(path, what, limit)
    deadline = time.monotonic() + (READ_TIMEOUT_S if timeout_s is None else timeout_s)
    try:
        chunks, size = [], 0
        while chunk := os.read(fd, 1 << 20):
            chunks.append(chunk)
            size += len(chunk)
            if limit is not None and size > limit:  # it grew while being read
                raise InputError(f"{path}: larger than {limit} bytes; not a {what}")
            if time.monotonic() > deadline:
                raise InputError(f"{path}: not read within {READ_TIMEOUT_S if timeout_s is None else timeout_s:g} s "
                                 f"(a stalled mount?); copy the {what} to a local disk")
        return b"".join(chunks)
    except OSError as exc:
        raise InputError(f"{path}: cannot read the {what} ({exc.strerror or type(exc).__name__})") from None
    finally:
        os.close(fd)


def _yaml_loader():
    class Loader(yaml.SafeLoader):
        """SafeLoader with duplicate keys refused and nesting bounded while composing."""

        depth = 0

        def compose_node(self, parent, index):
            self.depth += 1
            try:
                if self.depth > YAML_MAX_DEPTH:
                    mark = self.peek_event().start_mark
                    raise yaml.YAMLError(f"nested more than {YAML_MAX_DEPTH} levels deep (line {mark.line + 1})")
                return super().compose_node(parent, index)
            finally:
                self.depth -= 1

        def compose_mapping_node(self, anchor):
            node = super().compose_mapping_node(anchor)
            seen: set = set()  # the keys as written (merge keys `<<` may be overridden: that is their point)
            for key_node, _ in node.value:
                if key_node.tag == "tag:yaml.org,2002:merge" or not isinstance(key_node, yaml.ScalarNode):
                    continue
                key = self.construct_object(key_node)
                if key in seen:
                    raise yaml.YAMLError(f"key {key!r} appears twice in one mapping "
                                         f"(line {key_node.start_mark.line + 1})")
                seen.add(key)
            return node

    return Loader


def _expanded_size(node, memo: dict) -> int:
    """Nodes of the tree `node` stands for once every alias is expanded (shared nodes counted per use)."""
    key = id(node)
    if memo.get(key) == -1:
        raise InputError(f"an alias (line {node.start_mark.line + 1}) refers to a value that contains it")
    if key not in memo:
        memo[key] = -1  # in progress: met again below it, it is a cycle
        children = node.value if isinstance(node.value, list) else []
        total = 1
        for child in children:
            for sub in (child if isinstance(child, tuple) else (child,)):
                total += _expanded_size(sub, memo)
                if total > YAML_MAX_NODES:
                    break
        memo[key] = total
    return memo[key]


def loads_yaml(text: str, where: str) -> Any:
    """The value of a YAML document under the YAML policy above; every problem is one InputError line."""
    loader = _yaml_loader()(text)
    try:
        node = loader.get_single_node()
        if node is None:
            return None
        try:
            size = _expanded_size(node, {})
        except InputError as exc:
            raise InputError(f"{where}: {exc}") from None
        if size > YAML_MAX_NODES:
            raise InputError(f"{where}: its aliases (*name) expand to more than {YAML_MAX_NODES} values; "
                             "write the values out instead of nesting anchors")
        return loader.construct_document(node)
    except yaml.YAMLError as exc:
        raise InputError(f"{where}: not valid YAML: {' '.join(str(exc).split())[:300]}") from None
    except (ValueError, RecursionError) as exc:  # an integer of too many digits; a cycle walked too deep
        raise InputError(f"{where}: not valid YAML: {str(exc).splitlines()[0][:200]}") from None
    finally:
        loader.dispose()


def read_yaml(path: str | os.PathLike, what: str = "YAML file") -> Any:
    """A YAML file under the YAML policy above (regular file, size, UTF-8, duplicate keys, depth, aliases)."""
    return loads_yaml(decode_text(read_regular_bytes(path, what, YAML_MAX_BYTES), str(path)), str(path))


def loads_input(text: str, where: str, **hooks) -> Any:
    """json.loads of a user's data: malformed or too deeply nested JSON, or a key twice in one object, is
    one InputError line."""
    hooks.setdefault("object_pairs_hook", unique_keys(where))
    try:
        return json.loads(text, **hooks)
    except json.JSONDecodeError as exc:
        raise InputError(f"{where}: line {exc.lineno} column {exc.colno}: not JSON ({exc.msg})") from None
    except RecursionError:
        raise InputError(f"{where}: nested too deeply to parse") from None
    except ValueError as exc:  # e.g. an integer of more digits than Python converts (int_max_str_digits)
        raise InputError(f"{where}: not JSON ({str(exc).splitlines()[0][:120]})") from None


def read_jsonl(path: str | os.PathLike, skip_bad: bool = False, what: str = "JSON-lines file") -> list[Any]:
    """The values of a JSON-lines file (the reader policy: UTF-8, an optional BOM; the input rule; no key twice
    in one object), blank lines skipped.
    A line that is not UTF-8 JSON is an InputError naming the file and line, or skipped with `skip_bad` (a
    log another process is still writing, or one whose last line a kill cut off)."""
    rows = []
    offset = 0
    with os.fdopen(open_regular(path, what), "rb") as fh:
        for lineno, raw in enumerate(fh, 1):
            start, offset = offset, offset + len(raw)
            try:
                line = decode_text(raw, f"{path}: line {lineno}", start)
                if not line.strip():
                    continue
                rows.append(json.loads(line, object_pairs_hook=unique_keys(f"{path}: line {lineno}")))
            except (InputError, ValueError, RecursionError) as exc:  # JSONDecodeError is a ValueError
                if skip_bad:
                    continue
                if isinstance(exc, InputError):
                    raise
                why = (exc.msg if isinstance(exc, json.JSONDecodeError) else "nested too deeply to parse"
                       if isinstance(exc, RecursionError) else str(exc).splitlines()[0][:120])
                raise InputError(f"{path}: line {lineno}: not JSON ({why})") from None
    return rows


def jsonl_text(rows: Iterable[Any]) -> str:
    """The JSONL text write_jsonl writes (for write_texts): one JSON value per line, keys sorted."""
    return "".join(json.dumps(r, ensure_ascii=False, sort_keys=True) + "\n" for r in rows)


def write_jsonl(path: str | os.PathLike, rows: Iterable[Any], mode: int | None = None) -> None:
    """One JSON value per line (keys sorted), written atomically."""
    write_text(path, jsonl_text(rows), mode)


def sha256_bytes(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


def sha256_file(path: str | os.PathLike) -> str:
    """sha256 of a regular file (a fifo or device is one InputError line, never a hang)."""
    h = hashlib.sha256()
    with os.fdopen(open_regular(path, "file", None), "rb") as fh:
        for chunk in iter(lambda: fh.read(1 << 20), b""):
            h.update(chunk)
    return h.hexdigest()


def write_texts(texts: dict[str | os.PathLike, str]) -> None:
    """Write several text files as one step (write_all)."""
    write_all({path: (lambda tmp, text=text: tmp.write_text(text, encoding="utf-8")) for path, text in texts.items()})


def write_all(writers: dict[str | os.PathLike, Callable[[Path], Any]]) -> None:
    """Write several files as one step: each writer fills a temp beside its target, and the temps are
    renamed only when all are written, so a failure (full disk, unwritable folder, bad data) leaves NONE
    of the outputs and no temp; an OSError becomes one InputError line naming the path."""
    temps: list[tuple[Path, Path]] = []
    try:
        for path, writer in writers.items():
            target = Path(path)
            if target.is_dir():
                raise InputError(f"{target}: is a directory; the output must be a file path")
            try:
                tmp = _tmp_beside(target)
                temps.append((tmp, target))
                writer(tmp)
            except OSError as exc:
                raise InputError(f"{target}: cannot write ({exc.strerror or type(exc).__name__})") from None
        for tmp, target in temps:
            os.replace(tmp, target)  # same folder as its temp: only fails where the temp write would have
    finally:
        for tmp, _ in temps:
            tmp.unlink(missing_ok=True)
