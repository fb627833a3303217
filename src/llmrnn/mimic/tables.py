"""Reading PhysioNet's CSV tables (MIMIC-IV hosp/, MIMIC-IV-Note note/) for `llmrnn cohort build`: where
each table lives, its required columns, and its rows, read with pyarrow and checked by Python's csv reader,
which takes over from the first row pyarrow would read differently (so values and error lines are the csv
reader's). Any bad file is one InputError line naming the file, row and field.
"""

from __future__ import annotations

import codecs
import csv
import errno
import functools
import gzip
import io
import itertools
import os
import re
import stat
import zlib
from collections.abc import Iterator
from io import BufferedReader, TextIOWrapper
from pathlib import Path

from llmrnn.errors import InputError

# file -> (folder key, required columns)
TABLES: dict[str, tuple[str, tuple[str, ...]]] = {
    "patients": ("hosp", ("subject_id", "gender", "anchor_age")),
    "admissions": ("hosp", ("subject_id", "hadm_id", "admittime")),
    "diagnoses_icd": ("hosp", ("subject_id", "hadm_id", "seq_num", "icd_code", "icd_version")),
    "d_icd_diagnoses": ("hosp", ("icd_code", "icd_version", "long_title")),
    "discharge": ("note", ("note_id", "subject_id", "hadm_id", "note_type", "note_seq", "text")),
}
ICD_TABLES = ("diagnoses_icd", "d_icd_diagnoses")
_SURROGATE = re.compile("[\udc80-\udcff]")  # bytes that are not UTF-8, kept by surrogateescape
# one CSV field (a discharge note is some kB; MIMIC-IV-Note's longest is under 100 kB) and one physical line are
# read up to these many characters, then refused: a huge field inside a small gzip never fills the memory
MAX_FIELD_CHARS = 8 << 20
MAX_LINE_CHARS = 8 << 20
ARROW_BLOCK = 4 << 20  # bytes pyarrow parses at a time (a row must fit in one: a longer one goes to csv_rows;
# MIMIC-IV-Note's longest note is under 100 kB). 16 MiB blocks cost 130 MB more memory and no less time
csv.field_size_limit(MAX_FIELD_CHARS)


def tables_needed(diagnoses: str, icd_version: int | None = None) -> tuple[str, ...]:
    if icd_version is not None:  # the version filter reads diagnoses_icd
        return tuple(t for t in TABLES if diagnoses == "icd" or t != "d_icd_diagnoses")
    return tuple(t for t in TABLES if diagnoses == "icd" or t not in ICD_TABLES)


def table_path(folder: str | Path, table: str) -> Path:
    """<folder>/<table>.csv.gz, or <table>.csv where the user unpacked it."""
    gz = Path(folder) / f"{table}.csv.gz"
    plain = Path(folder) / f"{table}.csv"
    return plain if not os.path.lexists(gz) and os.path.lexists(plain) else gz


def table_paths(hosp: str | Path, note: str | Path, diagnoses: str = "note", icd_version: int | None = None
                ) -> dict[str, Path]:
    folders = {"hosp": hosp, "note": note}
    return {t: table_path(folders[TABLES[t][0]], t) for t in tables_needed(diagnoses, icd_version)}


def _open(path: Path, errors: str = "strict"):
    raw = gzip.open(path, "rb") if path.suffix == ".gz" else open(path, "rb")  # noqa: SIM115 (closed by caller)
    # utf-8-sig: a byte-order mark (Excel writes one) is not part of the first column's name
    return raw, TextIOWrapper(BufferedReader(raw, 1 << 20), encoding="utf-8-sig", errors=errors, newline="")


class _LineTooLong(Exception):
    pass


def _other_encoding(start: bytes) -> str | None:
    """UTF-16 or UTF-32 when the file starts with their byte-order mark (else None: UTF-8, with or without one)."""
    for bom, name in ((codecs.BOM_UTF32_LE, "UTF-32"), (codecs.BOM_UTF32_BE, "UTF-32"), (codecs.BOM_UTF16_LE, "UTF-16"),
                      (codecs.BOM_UTF16_BE, "UTF-16")):
        if start.startswith(bom):
            return name
    return None


def _lines(text: TextIOWrapper) -> Iterator[str]:
    """The physical lines of `text`, each read up to MAX_LINE_CHARS characters (never a whole huge line)."""
    while line := text.readline(MAX_LINE_CHARS + 1):
        if len(line) > MAX_LINE_CHARS:
            raise _LineTooLong
        yield line


def not_a_file(path: Path) -> str | None:
    """What `path` is when it is not a readable regular file (missing, a dangling link, a symbolic-link loop,
    a fifo, a folder, a device or socket), else None."""
    try:
        mode = path.stat().st_mode
    except OSError as exc:
        if exc.errno == errno.ELOOP:
            return "a symbolic link loop, not a file"
        if exc.errno == errno.ENOENT and path.is_symlink():
            return "a dangling symbolic link (its target is missing)"
        if exc.errno == errno.ENOENT:
            return "missing"
        return f"cannot be read ({os.strerror(exc.errno) if exc.errno else exc})"
    if stat.S_ISREG(mode):
        return None
    if stat.S_ISFIFO(mode):
        return "a fifo (named pipe), not a file; refused (reading it could wait forever)"
    if stat.S_ISDIR(mode):
        return "a folder, not a file"
    return "a device or socket, not a file"


def header_problem(path: Path, table: str) -> str | None:
    """None when the file exists and its header has the columns the build reads, else one line."""
    what = not_a_file(path)
    if what == "missing":
        return f"{path}: missing ({'MIMIC-IV-Note note/' if table == 'discharge' else 'MIMIC-IV hosp/'} " \
               f"{table}.csv.gz)"
    if what:
        return f"{path}: {what}"
    try:
        raw, text = _open(path, errors="surrogateescape")  # bad text past the header: rows() names it
        with raw:
            start = raw.read(4)
        if other := _other_encoding(start):
            return (f"{path}: row 0: header: {other} text (a byte-order mark); MIMIC-IV's tables are UTF-8: convert it "
                    f"(iconv -f {other} -t UTF-8)")
        raw, text = _open(path, errors="surrogateescape")
        with raw, text:
            header = next(csv.reader(_lines(text), strict=True), None)
    except _LineTooLong:
        return f"{path}: row 0: header: a line longer than {MAX_LINE_CHARS} characters; refused"
    except (OSError, EOFError, zlib.error, csv.Error) as exc:
        return f"{path}: row 0: header: unreadable ({exc})"
    if not header:
        return f"{path}: row 0: header: empty file"
    twice = next((c for c in header if header.count(c) > 1), None)
    if twice is not None:
        return f"{path}: row 0: header: column {twice[:40]!r} appears twice (which one is meant?)"
    missing = [c for c in TABLES[table][1] if c not in header]
    if missing:
        return f"{path}: row 0: header: column {missing[0]} missing (the file has: {', '.join(header)[:200]})"
    return None


def folder_problems(hosp: str | Path, note: str | Path, diagnoses: str = "note", icd_version: int | None = None
                    ) -> list[str]:
    """What `llmrnn check` says about a PhysioNet folder before anything is queued."""
    return [p for t, path in table_paths(hosp, note, diagnoses, icd_version).items()
            if (p := header_problem(path, t))]


def rows(path: Path, table: str) -> Iterator[tuple[int, dict[str, str]]]:
    """(1-based data row, {column: value}) of a table, streamed; a bad file is one InputError line.
    Read by pyarrow's CSV reader (C++, a block of ARROW_BLOCK bytes at a time): Python's csv module cost
    more than splitting the notes. Python's reader (csv_rows) stays the rule: where arrow fails or a block
    holds anything csv_rows would refuse (a NUL byte, a field or row past the limits), csv_rows takes over
    from the first row not yet yielded, so the values and every error line are csv_rows's."""
    if problem := header_problem(path, table):
        raise InputError(problem)
    import pyarrow as pa
    import pyarrow.compute as pc
    import pyarrow.csv as pacsv

    header = _header(path)
    done = 0
    if len(set(header)) == len(header) and not any(c in "".join(header) for c in "\r\n\x00"):
        names = list(TABLES[table][1])
        try:
            # arrow reads the bytes through _TailKept: the file's last bytes say whether a quote closed its last field
            with gzip.open(path, "rb") if path.suffix == ".gz" else open(path, "rb") as raw:
                source = _TailKept(raw)
                reader = pacsv.open_csv(
                    io.BufferedReader(source, 1 << 20),
                    read_options=pacsv.ReadOptions(column_names=header, skip_rows=1, block_size=ARROW_BLOCK),
                    parse_options=pacsv.ParseOptions(newlines_in_values=True, ignore_empty_lines=False),
                    convert_options=pacsv.ConvertOptions(column_types=dict.fromkeys(header, pa.string()),
                                                         strings_can_be_null=False, check_utf8=True))
                with reader:
                    # one batch read ahead: only the file's last batch can hold a quote left open to its end
                    nonempty = (b for b in reader if b.num_rows)
                    for batch, following in itertools.pairwise(itertools.chain(nonempty, [None])):
                        open_at_end = following is None and not source.tail.rstrip(b"\r\n").endswith(b'"')
                        row_bytes = pc.min_max(functools.reduce(pc.add, [pc.binary_length(c) for c in batch.columns]))
                        if (row_bytes["min"].as_py() == 0  # an empty line: arrow reads a row of empty fields
                                or row_bytes["max"].as_py() > min(MAX_FIELD_CHARS, MAX_LINE_CHARS)
                                or any(_has_nul(c) for c in batch.columns)
                                or _quoting_csv_may_refuse(batch, open_at_end)):
                            break  # csv_rows names it (or reads on, where bytes overcount characters)
                        columns = [batch.column(c).to_pylist() for c in names]
                        for values in zip(*columns):
                            done += 1
                            yield done, dict(zip(names, values))
                    else:
                        return
        except (pa.ArrowException, ValueError, OSError, EOFError, zlib.error):
            pass  # csv_rows reads the rest and names the problem
    for row_no, r in csv_rows(path, table):
        if row_no > done:
            yield row_no, r


class _TailKept(io.RawIOBase):
    """A binary file that keeps the last bytes read from it (whether a quote closed the file's last field)."""

    def __init__(self, raw) -> None:
        self.raw, self.tail = raw, b""

    def readable(self) -> bool:
        return True

    def readinto(self, buffer) -> int:
        n = self.raw.readinto(buffer)
        if n:
            self.tail = (self.tail + bytes(memoryview(buffer)[max(n - 8, 0):n]))[-8:]
        return n


def _quoting_csv_may_refuse(batch, open_at_end: bool) -> bool:
    """Whether a batch holds quoting that Python's strict csv reader may refuse and arrow reads on: a quote
    char left inside a value (a stray quote, spaces around a quoted field; an escaped "" also counts, read
    by csv_rows then), or a last field ending in a line break where the file does not end in a quote (a
    quote left open swallows the rest of the file into the last row's last field; arrow ends it at the end
    of the file without a word). open_at_end: this is the file's last batch and no quote ends the file; a
    note ending in a line break is no sign of one elsewhere, and the notes of PhysioNet's layout end in one
    (llmrnn.mimic.synth writes `___\n` last): checking every batch handed the whole file to csv_rows, about
    3x slower a row than arrow."""
    import pyarrow.compute as pc

    if any(pc.any(pc.match_substring(c, '"')).as_py() for c in batch.columns):
        return True
    if not open_at_end:
        return False
    final_value = batch.column(batch.num_columns - 1)[batch.num_rows - 1].as_py() or ""
    return final_value.endswith(("\n", "\r"))


def _has_nul(column) -> bool:
    """Whether a string column's data holds a NUL byte (numpy over the data buffers: a substring kernel is
    ~40x slower)."""
    import numpy as np

    return any(np.count_nonzero(data) != len(data) for chunk in getattr(column, "chunks", [column])
               if (data := np.frombuffer(chunk.buffers()[2] or b"", np.uint8)).size)


def _header(path: Path) -> list[str]:
    raw, text = _open(path, errors="surrogateescape")
    with raw, text:
        return next(csv.reader(_lines(text)))


def csv_rows(path: Path, table: str, locate_bad_text: bool = False) -> Iterator[tuple[int, dict[str, str]]]:
    """rows() by Python's csv module: the reader whose values and error lines are the rule.
    locate_bad_text: yield nothing, raise at the first field that is not UTF-8 (after a strict pass failed)."""
    row_no = 0
    try:
        raw, text = _open(path, errors="surrogateescape" if locate_bad_text else "strict")
        with raw, text:
            reader = csv.reader(_lines(text), strict=True)  # a quote left open is an error, not rows swallowed
            header = next(reader)
            index = {c: header.index(c) for c in TABLES[table][1]}
            for row_no, values in enumerate(reader, 1):
                if len(values) != len(header):
                    raise InputError(f"{path}: row {row_no}: {len(values)} fields, the header has {len(header)}")
                for column, value in zip(header, values):
                    if "\x00" in value:
                        raise InputError(f"{path}: row {row_no}: {column}: {value.count(chr(0))} NUL byte(s); "
                                         "text holds none (a damaged or binary file); refused")
                if locate_bad_text:
                    for column, value in zip(header, values):
                        if _SURROGATE.search(value):
                            raise InputError(f"{path}: row {row_no}: {column}: not UTF-8 text")
                    continue
                yield row_no, {c: values[i] for c, i in index.items()}
    except UnicodeDecodeError:
        # strict decoding is fast but knows only a byte offset: a second pass names the row and field
        for _ in csv_rows(path, table, locate_bad_text=True):
            pass
        raise InputError(f"{path}: row {row_no + 1}: not UTF-8 text") from None
    except (EOFError, zlib.error, gzip.BadGzipFile) as exc:
        raise InputError(f"{path}: row {row_no + 1}: truncated or corrupt gzip ({exc})") from None
    except _LineTooLong:
        raise InputError(f"{path}: row {row_no + 1}: a line longer than {MAX_LINE_CHARS} characters; refused "
                         "(a discharge note is some kB)") from None
    except csv.Error as exc:
        if "field larger than field limit" in str(exc):
            raise InputError(f"{path}: row {row_no + 1}: a field longer than {MAX_FIELD_CHARS} characters; refused "
                             "(a discharge note is some kB)") from None
        raise InputError(f"{path}: row {row_no + 1}: not CSV ({exc})") from None
    except OSError as exc:
        raise InputError(f"{path}: row {row_no + 1}: cannot read ({exc})") from None


