"""Cohort loader/validator, cleaning and splitting: every bad input gives one line and no output."""

from __future__ import annotations

import hashlib
import json
import subprocess
import sys
from pathlib import Path

import pytest

from llmrnn.cli import main
from llmrnn.cohort import SplitSizes, clean_cohort, load_cohort, split_cohort, synthesize_cohort
from llmrnn.errors import InputError
from tests import unprivileged


def visit(n: int, dx: str = "1. hypertension") -> dict:
    return {
        "visit_id": 1000 + n,
        "visit_number": n + 1,
        "sex": "F",
        "clinical_sections": {"discharge_diagnosis": dx, "chief_complaint": "pain"},
    }


def patient(pid: int, n_visits: int = 3) -> dict:
    return {"subject_id": pid, "visits": [visit(i) for i in range(n_visits)]}


def write(tmp_path: Path, content: bytes | str | object, name: str = "cohort.json") -> Path:
    path = tmp_path / name
    if isinstance(content, bytes):
        path.write_bytes(content)
    elif isinstance(content, str):
        path.write_text(content)
    else:
        path.write_text(json.dumps(content))
    return path


BAD_INPUTS = {
    "empty file": (b"", "empty file"),
    "not JSON": ("[{oops", "line 1 column 3: not JSON"),
    "wrong top-level type": ({"subject_id": 1}, "top level: expected a JSON list of patients, got dict"),
    "missing subject_id": ([{"visits": [visit(0)]}], "record 0: subject_id: missing"),
    "duplicate subject_id": ([patient(7), patient(7)], "patient 7: subject_id: duplicate (record 1)"),
    "visits not a list": ([{"subject_id": 3, "visits": {"a": 1}}], "patient 3: visits: expected a list, got dict"),
    "visit without clinical_sections": (
        [{"subject_id": 4, "visits": [{"visit_id": 1, "visit_number": 1}]}],
        "patient 4 visit 0: clinical_sections: missing",
    ),
    "diagnosis not text": (
        [{"subject_id": 123, "visits": [visit(0), visit(1), {**visit(2), "clinical_sections": {"discharge_diagnosis": 5}}]}],
        "patient 123 visit 2: clinical_sections.discharge_diagnosis: expected text",
    ),
    "visit_number not integer": (
        [{"subject_id": 5, "visits": [{**visit(0), "visit_number": "one"}]}],
        "patient 5 visit 0: visit_number: expected an integer",
    ),
    "subject_id wrong type": ([{"subject_id": [1], "visits": [visit(0)]}], "record 0: subject_id: expected an integer"),
    "non-UTF-8 bytes": (b'[{"subject_id": 1, "visits": "\xff\xfe"}]', "byte 30: not UTF-8 text"),
}


@pytest.mark.parametrize("case", sorted(BAD_INPUTS))
def test_bad_input_gives_one_clear_line(tmp_path, case):
    content, expected = BAD_INPUTS[case]
    path = write(tmp_path, content)
    with pytest.raises(InputError) as err:
        load_cohort(path)
    message = str(err.value)
    assert message.startswith(str(path) + ": ")
    assert expected in message
    assert "\n" not in message


@pytest.mark.parametrize("case", ["not JSON", "duplicate subject_id", "non-UTF-8 bytes"])
def test_cli_bad_input_exits_nonzero_without_output(tmp_path, case, capsys):
    content, expected = BAD_INPUTS[case]
    path = write(tmp_path, content)
    out, report = tmp_path / "cleaned.json", tmp_path / "report.json"
    rc = main(["cohort", "clean", "--cohort", str(path), "--out", str(out), "--report", str(report)])
    err = capsys.readouterr().err.strip().splitlines()
    assert rc != 0
    assert len(err) == 1 and expected in err[0]
    assert not out.exists() and not report.exists()
    assert not any(p.name.endswith(".tmp") for p in tmp_path.iterdir())


def test_missing_cohort_file_says_what_is_expected(tmp_path):
    with pytest.raises(InputError, match="cohort file not found.*MIMIC-IV is credentialed"):
        load_cohort(tmp_path / "nope.json")


def test_cli_subprocess_prints_no_traceback(tmp_path):
    path = write(tmp_path, "not json")
    proc = subprocess.run(
        [sys.executable, "-m", "llmrnn.cli", "cohort", "validate", str(path)], capture_output=True, text=True, check=False
    )
    assert proc.returncode == 2
    assert "Traceback" not in proc.stderr
    assert "not JSON" in proc.stderr


def test_synthetic_cohort_is_deterministic_marked_and_longitudinal():
    a, b = synthesize_cohort(30, seed=3), synthesize_cohort(30, seed=3)
    assert a == b
    assert a != synthesize_cohort(30, seed=4)
    assert all(p["synthetic"] for p in a)
    n_visits = [len(p["visits"]) for p in a]
    assert min(n_visits) >= 2 and max(n_visits) <= 8
    # at least one patient's later visit repeats a diagnosis seen before (a memory can help)
    recurring = 0
    for p in a:
        seen: set[str] = set()
        for v in p["visits"]:
            dx = {line.split(". ", 1)[-1] for line in v["clinical_sections"]["discharge_diagnosis"].splitlines()}
            recurring += bool(dx & seen)
            seen |= dx
    assert recurring > 10


def test_synthetic_cohort_has_patients_for_cleaning(tmp_path):
    path = tmp_path / "s.json"
    assert main(["cohort", "synth", "--patients", "60", "--seed", "7", "--out", str(path),
                 "--meta", str(tmp_path / "s.json.meta.json")]) == 0
    patients = load_cohort(path)
    kept, report = clean_cohort(patients)
    assert report["patients_dropped_empty_diagnosis"] > 0
    assert report["patients_out"] == len(kept) == 60 - report["patients_dropped_empty_diagnosis"]
    assert json.loads((tmp_path / "s.json.meta.json").read_text())["synthetic"] is True


def test_clean_drops_patient_with_any_empty_diagnosis():
    good, bad = patient(1), patient(2)
    bad["visits"][1]["clinical_sections"]["discharge_diagnosis"] = "  "
    nulled = patient(3)
    nulled["visits"][0]["clinical_sections"]["discharge_diagnosis"] = None
    kept, report = clean_cohort([good, bad, nulled])
    assert [p["subject_id"] for p in kept] == [1]
    assert report["patients_dropped_empty_diagnosis"] == 2
    assert report["visits_in"] == 9 and report["visits_out"] == 3


def test_split_sizes_order_and_zero_overlap():
    patients = [patient(i) for i in range(50)]
    splits = split_cohort(patients, SplitSizes(val=10, train=15, seed=42))
    assert {k: len(v) for k, v in splits.items()} == {"train": 15, "val": 10, "test": 25}
    ids = {k: {p["subject_id"] for p in v} for k, v in splits.items()}
    assert not (ids["train"] & ids["val"] or ids["train"] & ids["test"] or ids["val"] & ids["test"])
    assert ids["train"] | ids["val"] | ids["test"] == set(range(50))
    # val is drawn first with the seed: it does not depend on the train size
    assert ids["val"] == {p["subject_id"] for p in split_cohort(patients, SplitSizes(10, 5, 42))["val"]}
    assert ids["val"] != {p["subject_id"] for p in split_cohort(patients, SplitSizes(10, 15, 43))["val"]}


def test_split_too_large_is_a_clear_error():
    with pytest.raises(InputError, match="leaves no test patients out of 5"):
        split_cohort([patient(i) for i in range(5)], SplitSizes(val=3, train=2, seed=1))


def test_split_cli_same_seed_same_bytes(tmp_path):
    cohort = tmp_path / "c.json"
    cohort.write_text(json.dumps([patient(i) for i in range(30)]))

    def run(outdir: Path) -> dict[str, bytes]:
        args = ["cohort", "split", "--cohort", str(cohort), "--cfg", '{"val_size": 5, "train_size": 7, "seed": 42}']
        for name in ("train", "val", "test"):
            args += [f"--{name}", str(outdir / f"{name}.json")]
        assert main(args + ["--summary", str(outdir / "splits.json")]) == 0
        return {p.name: p.read_bytes() for p in outdir.iterdir()}

    first, second = run(tmp_path / "a"), run(tmp_path / "b")
    assert first == second
    summary = json.loads(first["splits.json"])
    assert summary["sizes"] == {"train": 7, "val": 5, "test": 18}
    assert summary["overlap"] == 0 and summary["seed"] == 42
    import hashlib

    assert summary["sha256"]["train"] == hashlib.sha256(first["train.json"]).hexdigest()


# ----------------------------------------------------------------------------- what later stages cannot process
def sections(**extra: object) -> dict:
    return {"discharge_diagnosis": "1. hypertension", "chief_complaint": "pain", **extra}


def one_patient(pid: object = 1, **visit_fields: object) -> list[dict]:
    return [{"subject_id": pid, "visits": [{**visit(0), **visit_fields}, visit(1)]}]


# Written as JSON text: json.dumps cannot produce lone surrogates, NaN placement or huge numbers the way a
# careless exporter does.
UNPROCESSABLE = {
    "lone surrogate in a section": (
        ('[{"subject_id": 1, "visits": [{"visit_id": 1, "visit_number": 1, '
        '"clinical_sections": {"discharge_diagnosis": "x", "chief_complaint": "pain \\ud800"}}]}]'),
        "patient 1 visit 0: clinical_sections.chief_complaint: lone surrogate",
    ),
    "lone surrogate in a key": (
        ('[{"subject_id": 1, "\\udc00x": 1, "visits": [{"visit_id": 1, "visit_number": 1, '
        '"clinical_sections": {"discharge_diagnosis": "x"}}]}]'),
        "patient 1: <key>: lone surrogate",
    ),
    "Arabic-Indic digit in subject_id": (one_patient("MRN-\u0661\u0662\u0663"), "subject_id: non-ASCII digit U+0661"),
    "fullwidth digit in visit_id": (one_patient(2, visit_id="V\uff17"), "patient 2 visit 0: visit_id: non-ASCII digit U+FF17"),
    "lone surrogate in subject_id": ('[{"subject_id": "A\\ud800", "visits": []}]', "record 0: subject_id: lone surrogate"),
    "newline in visit_id": (one_patient(2, visit_id="V1\nV2"), "patient 2 visit 0: visit_id: control or unprintable"),
    "superscript digit in subject_id": (one_patient("A\u00b2"), "subject_id: non-ASCII digit U+00B2"),
    "duplicate visit_number": (
        [{"subject_id": 3, "visits": [visit(0), {**visit(1), "visit_number": 1}]}],
        "patient 3 visit 1: visit_number: 1 repeats the previous visit's 1",
    ),
    "out-of-order visit_number": (
        [{"subject_id": 4, "visits": [visit(2), visit(0), visit(1)]}],
        "patient 4 visit 1: visit_number: 1 is lower than the previous visit's 3",
    ),
    "duplicate visit_id": (
        [{"subject_id": 5, "visits": [visit(0), {**visit(1), "visit_id": 1000}]}],
        "patient 5 visit 1: visit_id: duplicate 1000",
    ),
    "NaN in an extra patient field": (
        ('[{"subject_id": 6, "score": NaN, "visits": [{"visit_id": 1, "visit_number": 1, '
        '"clinical_sections": {"discharge_diagnosis": "x"}}]}]'),
        "patient 6: score: NaN is not a JSON number",
    ),
    "Infinity in an extra visit field": (
        ('[{"subject_id": 7, "visits": [{"visit_id": 1, "visit_number": 1, "los": {"days": [1, -Infinity]}, '
        '"clinical_sections": {"discharge_diagnosis": "x"}}]}]'),
        "patient 7 visit 0: los.days.1: -Infinity is not a JSON number",
    ),
    "overflowing float": (
        ('[{"subject_id": 8, "visits": [{"visit_id": 1, "visit_number": 1, "w": 1e999, '
        '"clinical_sections": {"discharge_diagnosis": "x"}}]}]'),
        "patient 8 visit 0: w: 1e999 is not a JSON number",
    ),
    "empty cohort": ("[]", "top level: no patients (empty list)"),
    "5000-digit integer id": ('[{"subject_id": ' + "7" * 5000 + ', "visits": []}]', "line 1: a number of 5000 digits"),
    "5000-digit text id": (one_patient("7" * 5000), "record 0: subject_id: 5000 characters, more than 128"),
    "id beyond int64": (one_patient(2**64), "record 0: subject_id: integer does not fit in 64 bits"),
    "visit_number beyond int64": (one_patient(3, visit_number=-(2**70)), "patient 3 visit 0: visit_number: integer does"),
    "deep nesting in an extra field": (
        '[{"subject_id": 9, "x": ' + "[" * 50 + "]" * 50 + ', "visits": []}]',
        "patient 9: x" + ".0" * 32 + ": nested deeper than 32 levels",
    ),
    "nesting too deep to parse": ("[" * 100_000 + "]" * 100_000, "nested too deeply to parse"),
}


@pytest.mark.parametrize("case", sorted(UNPROCESSABLE))
def test_validation_refuses_what_later_stages_cannot_process(tmp_path, case, capsys):
    content, expected = UNPROCESSABLE[case]
    path = write(tmp_path, content)
    with pytest.raises(InputError) as err:
        load_cohort(path)
    assert expected in str(err.value) and str(err.value).startswith(f"{path}: ")
    # the CLI: one line, non-zero, nothing written
    out, report = tmp_path / "cleaned.json", tmp_path / "report.json"
    rc = main(["cohort", "clean", "--cohort", str(path), "--out", str(out), "--report", str(report)])
    lines = capsys.readouterr().err.strip().splitlines()
    assert rc == 2 and len(lines) == 1 and expected in lines[0]
    assert sorted(p.name for p in tmp_path.iterdir()) == ["cohort.json"]


def test_utf8_bom_is_accepted(tmp_path):
    path = write(tmp_path, b"\xef\xbb\xbf" + json.dumps([patient(1)]).encode())
    assert [p["subject_id"] for p in load_cohort(path)] == [1]


def test_every_patient_dropped_is_an_error_and_writes_nothing(tmp_path, capsys):
    cohort = [patient(1), patient(2)]
    for p in cohort:
        p["visits"][0]["clinical_sections"]["discharge_diagnosis"] = ""
    path = write(tmp_path, cohort)
    out, report = tmp_path / "cleaned.json", tmp_path / "report.json"
    rc = main(["cohort", "clean", "--cohort", str(path), "--out", str(out), "--report", str(report)])
    lines = capsys.readouterr().err.strip().splitlines()
    assert rc == 2 and len(lines) == 1
    assert "every patient was dropped (2 of 2" in lines[0]
    assert not out.exists() and not report.exists()
    assert main(["cohort", "validate", str(path)]) == 2  # validate accepts only what later stages can use
    assert "every patient was dropped (2 of 2" in capsys.readouterr().err


def run_clean(tmp_path: Path, cohort: Path, out: Path, report: Path, capsys) -> tuple[int, list[str]]:
    rc = main(["cohort", "clean", "--cohort", str(cohort), "--out", str(out), "--report", str(report)])
    return rc, capsys.readouterr().err.strip().splitlines()


def test_directory_as_cohort_is_one_line(tmp_path, capsys):
    (tmp_path / "cohort_dir").mkdir()
    rc, lines = run_clean(tmp_path, tmp_path / "cohort_dir", tmp_path / "o.json", tmp_path / "r.json", capsys)
    assert rc == 2 and len(lines) == 1 and "cohort_dir: is a directory, not a cohort file" in lines[0]


def clean_lines(cohort: Path, out: Path, report: Path) -> tuple[int, list[str]]:
    """`llmrnn cohort clean` as a user who meets file modes (as root: root without its override)."""
    proc = unprivileged.llmrnn("cohort", "clean", "--cohort", str(cohort), "--out", str(out), "--report", str(report))
    return proc.returncode, proc.stderr.strip().splitlines()


def test_unreadable_cohort_is_one_line(tmp_path):
    path = write(tmp_path, [patient(1)])
    path.chmod(0)
    rc, lines = clean_lines(path, tmp_path / "o.json", tmp_path / "r.json")
    assert rc == 2 and len(lines) == 1 and "cannot read the cohort file (Permission denied)" in lines[0]


def test_read_only_output_folder_is_one_line_and_writes_nothing(tmp_path):
    path = write(tmp_path, [patient(1), patient(2)])
    locked = tmp_path / "locked"
    locked.mkdir()
    locked.chmod(0o500)
    rc, lines = clean_lines(path, tmp_path / "o.json", locked / "r.json")
    assert rc == 2 and len(lines) == 1 and "r.json: cannot write (Permission denied)" in lines[0]
    assert not (tmp_path / "o.json").exists() and list(locked.iterdir()) == []


def test_output_folder_that_cannot_exist_is_one_line_and_writes_nothing(tmp_path, capsys):
    # a folder path running through a FILE: unwritable for root too
    path = write(tmp_path, [patient(1), patient(2)])
    rc, lines = run_clean(tmp_path, path, tmp_path / "o.json", tmp_path / "cohort.json" / "sub" / "r.json", capsys)
    assert rc == 2 and len(lines) == 1 and "r.json: cannot write (Not a directory)" in lines[0]
    assert sorted(p.name for p in tmp_path.iterdir()) == ["cohort.json"]


def test_output_that_is_a_directory_leaves_no_other_output(tmp_path, capsys):
    path = write(tmp_path, [patient(1), patient(2)])
    (tmp_path / "r.json").mkdir()
    rc, lines = run_clean(tmp_path, path, tmp_path / "o.json", tmp_path / "r.json", capsys)
    assert rc == 2 and len(lines) == 1 and "r.json: is a directory" in lines[0]
    assert sorted(p.name for p in tmp_path.iterdir()) == ["cohort.json", "r.json"]
    assert list((tmp_path / "r.json").iterdir()) == []


@pytest.mark.parametrize("same", ["out", "cohort"])
def test_report_naming_another_argument_file_is_refused(tmp_path, capsys, same):
    path = write(tmp_path, [patient(1), patient(2)])
    before = path.read_bytes()
    out = tmp_path / "cleaned.json"
    report = {"out": out, "cohort": tmp_path / "." / "cohort.json"}[same]
    rc, lines = run_clean(tmp_path, path, out, report, capsys)
    assert rc == 2 and len(lines) == 1 and f"--report and --{same} name the same file" in lines[0]
    assert not out.exists() and path.read_bytes() == before


def test_split_outputs_must_be_distinct(tmp_path, capsys):
    cohort = write(tmp_path, [patient(i) for i in range(10)])
    args = ["cohort", "split", "--cohort", str(cohort), "--cfg", '{"val_size": 2, "train_size": 2, "seed": 1}',
            "--train", str(tmp_path / "a.json"), "--val", str(tmp_path / "a.json"), "--test", str(tmp_path / "t.json"),
            "--summary", str(tmp_path / "s.json")]
    assert main(args) == 2
    assert "--val and --train name the same file" in capsys.readouterr().err
    assert sorted(p.name for p in tmp_path.iterdir()) == ["cohort.json"]


def test_source_sha256_is_the_file_content_or_none(tmp_path):
    from llmrnn.cohort import source_sha256

    path = write(tmp_path, [patient(1)])
    assert source_sha256(str(path)) == hashlib.sha256(path.read_bytes()).hexdigest()
    assert source_sha256("synthetic") is None and source_sha256(str(tmp_path / "missing.json")) is None
