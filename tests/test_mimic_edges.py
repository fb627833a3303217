"""`llmrnn cohort build`, round 5: a byte-order mark, a fifo, a symbolic-link loop, NUL bytes, a huge field
in a small gzip, ids beyond int64, impossible dates and a full disk are each one line naming the file, row
and field, with a non-zero exit and no output."""

from __future__ import annotations

import gzip
import os
from pathlib import Path

import pytest

from tests.test_mimic import _build, _note, _write_tables

NOTE_HEADER = b"note_id,subject_id,hadm_id,note_type,note_seq,charttime,storetime,text\n"


def _tables(root: Path) -> None:
    _write_tables(root, [("a", 10, 100, 1, _note()), ("b", 10, 101, 1, _note())])


def _refused(tmp_path, capsys, root: Path, expected: str) -> None:
    rc, cohort, report, out = _build(tmp_path, root)
    err = capsys.readouterr().err.strip().splitlines()
    assert rc != 0 and cohort is None and report is None
    assert err and expected in err[-1], err
    assert "Traceback" not in "\n".join(err)
    assert not list(Path(out).parent.iterdir()) if Path(out).parent.exists() else True


def test_a_byte_order_mark_is_read_as_utf8_sig(tmp_path):
    _tables(tmp_path)
    for name in ("hosp/patients.csv.gz", "note/discharge.csv.gz"):
        path = tmp_path / name
        path.write_bytes(gzip.compress(b"\xef\xbb\xbf" + gzip.decompress(path.read_bytes())))
    rc, cohort, report, _ = _build(tmp_path, tmp_path)
    assert rc == 0 and cohort and cohort[0]["subject_id"] == 10 and report["patients_out"] == 1


def test_a_fifo_is_named_as_a_fifo(tmp_path, capsys):
    _tables(tmp_path)
    path = tmp_path / "hosp/admissions.csv.gz"
    path.unlink()
    os.mkfifo(path)
    _refused(tmp_path, capsys, tmp_path, "admissions.csv.gz: a fifo (named pipe), not a file")


def test_a_symbolic_link_loop_is_named_as_one(tmp_path, capsys):
    _tables(tmp_path)
    path = tmp_path / "hosp/patients.csv.gz"
    path.unlink()
    path.symlink_to(path.name)  # points at itself
    _refused(tmp_path, capsys, tmp_path, "patients.csv.gz: a symbolic link loop, not a file")


def test_nul_bytes_are_refused_with_their_row_and_field(tmp_path, capsys):
    _tables(tmp_path)
    (tmp_path / "note/discharge.csv.gz").write_bytes(gzip.compress(
        NOTE_HEADER + b'a,10,100,DS,1,,,"ok"\nb,10,101,DS,1,,,"bad\x00\x00 text"\n'))
    _refused(tmp_path, capsys, tmp_path, "discharge.csv.gz: row 2: text: 2 NUL byte(s)")


def test_a_huge_field_in_a_small_gzip_is_refused_without_reading_it_whole(tmp_path, capsys):
    """A 64 MiB field (the gzip is tens of kB) is refused past the per-field limit, as one line."""
    _tables(tmp_path)
    with gzip.open(tmp_path / "note/discharge.csv.gz", "wb", compresslevel=9) as fh:
        fh.write(NOTE_HEADER + b'a,10,100,DS,1,,,"')
        block = b"x" * (1 << 20)
        for _ in range(64):
            fh.write(block)
        fh.write(b'"\n')
    assert (tmp_path / "note/discharge.csv.gz").stat().st_size < 1 << 20
    _refused(tmp_path, capsys, tmp_path, "discharge.csv.gz: row 1: a line longer than")


def test_a_huge_multi_line_field_is_refused_at_the_field_limit(tmp_path, capsys):
    _tables(tmp_path)
    with gzip.open(tmp_path / "note/discharge.csv.gz", "wb") as fh:
        fh.write(NOTE_HEADER + b'a,10,100,DS,1,,,"')
        line = b"y" * 1023 + b"\n"
        for _ in range(10 * 1024):  # 10 MiB over short lines
            fh.write(line)
        fh.write(b'"\n')
    _refused(tmp_path, capsys, tmp_path, "discharge.csv.gz: row 1: a field longer than")


@pytest.mark.parametrize(("admissions", "expected"), [
    ([(10, 2**63, "2150-03-01 10:00:00")], "admissions.csv.gz: row 1: hadm_id: 9223372036854775808 is beyond a 64-bit"),
    ([(10, 100, "2150-13-01 10:00:00")], "admissions.csv.gz: row 1: admittime: '2150-13-01 10:00:00' is not a valid date-time"),
    ([(10, 100, "2150-02-30 10:00:00")], "admissions.csv.gz: row 1: admittime: '2150-02-30 10:00:00' is not a valid"),
])
def test_invalid_ids_and_dates_are_refused_at_build_time(tmp_path, capsys, admissions, expected):
    _write_tables(tmp_path, [("a", 10, 100, 1, _note())], admissions=admissions)
    _refused(tmp_path, capsys, tmp_path, expected)


@pytest.mark.parametrize(("admissions", "expected"), [
    ([(10, -100, "2150-03-01 10:00:00")], "admissions.csv.gz: row 1: hadm_id: '-100' is not a non-negative integer"),
    ([(10, "+100", "2150-03-01 10:00:00")], "admissions.csv.gz: row 1: hadm_id: '+100' is not a non-negative integer"),
    ([(10, "\u0661\u0660\u0660", "2150-03-01 10:00:00")], "admissions.csv.gz: row 1: hadm_id: '\u0661\u0660\u0660' is not"),
])
def test_an_id_that_is_not_plain_digits_is_refused(tmp_path, capsys, admissions, expected):
    _write_tables(tmp_path, [("a", 10, 100, 1, _note())], admissions=admissions)
    _refused(tmp_path, capsys, tmp_path, expected)


@pytest.mark.parametrize(("patients", "expected"), [
    ([(10, "F", -5)], "patients.csv.gz: row 1: anchor_age: '-5' is not a non-negative integer"),
    ([(10, "F", 400)], "patients.csv.gz: row 1: anchor_age: 400 is not an age"),
    ([(10, "<b>x</b>", 70)], "patients.csv.gz: row 1: gender: '<b>x</b>' is not one of F, M or empty"),
])
def test_an_impossible_patient_value_is_refused(tmp_path, capsys, patients, expected):
    _write_tables(tmp_path, [("a", 10, 100, 1, _note())], patients=patients)
    _refused(tmp_path, capsys, tmp_path, expected)


def test_a_quote_left_open_is_refused_not_read_as_one_long_field(tmp_path, capsys):
    _tables(tmp_path)
    path = tmp_path / "note/discharge.csv.gz"
    path.write_bytes(gzip.compress(gzip.decompress(path.read_bytes()) + b'c,10,102,DS,1,,,"never closed\n'))
    _refused(tmp_path, capsys, tmp_path, "discharge.csv.gz: row 3: not CSV (unexpected end of data)")


def test_a_column_named_twice_is_refused(tmp_path, capsys):
    _tables(tmp_path)
    path = tmp_path / "hosp/admissions.csv.gz"
    path.write_bytes(gzip.compress(gzip.decompress(path.read_bytes()).replace(b"dischtime", b"admittime", 1)))
    _refused(tmp_path, capsys, tmp_path, "admissions.csv.gz: row 0: header: column 'admittime' appears twice")


def test_a_utf16_table_is_named_as_such(tmp_path, capsys):
    _tables(tmp_path)
    path = tmp_path / "hosp/patients.csv.gz"
    path.write_bytes(gzip.compress(gzip.decompress(path.read_bytes()).decode().encode("utf-16")))
    _refused(tmp_path, capsys, tmp_path, "patients.csv.gz: row 0: header: UTF-16 text (a byte-order mark)")


def test_a_subject_id_beyond_int64_is_refused(tmp_path, capsys):
    _write_tables(tmp_path, [("a", 10, 100, 1, _note())], patients=[(2**64, "F", 70)],
                  admissions=[(2**64, 100, "2150-03-01 10:00:00")])
    _refused(tmp_path, capsys, tmp_path, "patients.csv.gz: row 1: subject_id: 18446744073709551616 is beyond")


def test_a_full_disk_is_one_line_and_leaves_nothing(tmp_path, capsys, small_disk):
    notes = [(f"n{i}", 10, 100 + i, 1, _note(diagnosis="Primary:\n1. Pneumonia " + "z " * 20000)) for i in range(12)]
    _write_tables(tmp_path, notes, admissions=[(10, 100 + i, f"2150-01-{i + 1:02d} 10:00:00") for i in range(12)])
    from llmrnn import cli

    out = small_disk / "cohort.json"
    rc = cli.main(["cohort", "build", "--hosp", str(tmp_path / "hosp"), "--note", str(tmp_path / "note"),
                   "--out", str(out), "--report", str(small_disk / "report.json"), "--cfg", "{}"])
    err = capsys.readouterr().err.strip().splitlines()
    assert rc != 0 and "Traceback" not in "\n".join(err)
    assert err and f"{small_disk}: no space left on the device while building the cohort" in err[-1], err
    assert not list(small_disk.iterdir())


# the note file is read by pyarrow; Python's csv module (tables.csv_rows) is the rule it must agree with
READER_CASES = {
    "crlf, quotes and an accent": NOTE_HEADER[:-1] + b'\r\na,1,2,DS,1,,,"line1\r\nline2 ""q"" \xc3\xa9"\r\n'
                                  b"b,1,3,DS,2,x,y,plain\r\n",
    "bom, blank line inside a note, no last newline": b"\xef\xbb\xbf" + NOTE_HEADER + b'a,1,2,DS,1,,,"x\n\ny"\n'
                                                      b'b,1,3,DS,2,,,""',
    "bare carriage returns": NOTE_HEADER[:-1] + b'\ra,1,2,DS,1,,,"x\ry"\rb,1,3,DS,2,,,z\r',
    "a quote inside an unquoted field": NOTE_HEADER + b'a,1,2,DS,1,,,ab"c\nb,1,3,DS,2,,,"ab"c\n',
    "spaces around quotes": NOTE_HEADER + b'a,1,2,DS,1,,, "q" \nb,1,3,DS,2,,,"t" \n',
    "an empty line at the end": NOTE_HEADER + b"a,1,2,DS,1,,,x\n\n",
    "an empty line between notes": NOTE_HEADER + b"a,1,2,DS,1,,,x\n\nb,1,3,DS,2,,,z\n",
    "a short row": NOTE_HEADER + b"a,1,2,DS,1,,,x\nb,1,3,DS\n",
    "a NUL in a column the build does not read": NOTE_HEADER + b"a,1,2,DS,1,\x00,,x\n",
    "not UTF-8 in the second block": NOTE_HEADER + b"a,1,2,DS,1,,,x\n" * 3 + b'b,1,3,DS,2,,,"caf\xe9"\n',
    "a quote left open in the last note": NOTE_HEADER + b'a,1,2,DS,1,,,"x\n"\n' * 3 + b'b,1,3,DS,2,,,"y\n',
    "a quote left open, then notes": NOTE_HEADER + b'a,1,2,DS,1,,,"x\nb,1,3,DS,2,,,"y\n"\n' * 3,
}


def _read(reader, path: Path):
    from llmrnn.errors import InputError

    try:
        return list(reader(path, "discharge"))
    except InputError as exc:
        return str(exc)


@pytest.mark.parametrize("block", [64, 1 << 20])  # 64 bytes: several blocks, the hand-over from any row
@pytest.mark.parametrize("case", sorted(READER_CASES))
def test_the_arrow_reader_gives_what_pythons_csv_module_gives(tmp_path, monkeypatch, case, block):
    from llmrnn.mimic import tables

    monkeypatch.setattr(tables, "ARROW_BLOCK", block)
    path = tmp_path / "discharge.csv.gz"
    path.write_bytes(gzip.compress(READER_CASES[case]))
    assert _read(tables.rows, path) == _read(tables.csv_rows, path)


def test_well_formed_notes_are_read_by_arrow_alone(tmp_path, monkeypatch):
    """The fast path is taken: Python's reader is never asked for a well-formed file (BOM, CRLF, a quoted
    multi-line note). A value holding a quote char goes to csv_rows (test above), as strict csv may refuse it."""
    from llmrnn.mimic import tables

    path = tmp_path / "discharge.csv.gz"
    data = NOTE_HEADER[:-1] + b'\r\na,1,2,DS,1,,,"line1\r\nline2 q \xc3\xa9"\r\nb,1,3,DS,2,x,y,plain\r\n'
    path.write_bytes(gzip.compress(b"\xef\xbb\xbf" + data))
    expected = list(tables.csv_rows(path, "discharge"))
    monkeypatch.setattr(tables, "csv_rows", lambda *a, **k: pytest.fail("handed over to csv_rows"))
    got = list(tables.rows(path, "discharge"))
    assert got == expected and got[0][1]["text"] == 'line1\r\nline2 q \u00e9'


def test_notes_ending_in_a_line_break_are_read_by_arrow_alone(tmp_path, monkeypatch):
    """MIMIC-IV-Note's notes end in a line break: a batch whose last note does is no quote left open (only
    the file's last batch can hold one), so the fast path reads every block of such a file."""
    from llmrnn.mimic import tables

    monkeypatch.setattr(tables, "ARROW_BLOCK", 128)  # several blocks, each ending in such a note (the header fits)
    path = tmp_path / "discharge.csv.gz"
    path.write_bytes(gzip.compress(NOTE_HEADER + b"".join(
        b'n%d,1,%d,DS,1,,,"Followup Instructions:\n___\n"\n' % (i, i) for i in range(8))))
    expected = list(tables.csv_rows(path, "discharge"))
    monkeypatch.setattr(tables, "csv_rows", lambda *a, **k: pytest.fail("handed over to csv_rows"))
    got = list(tables.rows(path, "discharge"))
    assert got == expected and len(got) == 8 and got[7][1]["text"] == "Followup Instructions:\n___\n"
