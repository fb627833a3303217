"""Cohort loader/validator, cleaning and splitting: every bad input gives one line and no output."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from llmrnn.cli import main
from llmrnn.cohort import SplitSizes, clean_cohort, load_cohort, split_cohort, synthesize_cohort
from llmrnn.errors import InputError


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
