"""Real snakemake runs of the cohort stages in a temp working directory."""

from __future__ import annotations

import json

import yaml

from tests.conftest import snakemake


def write_config(workdir, **overrides) -> None:
    cfg = yaml.safe_load((workdir / "config/config.yaml").read_text())
    for key, value in overrides.items():
        cfg[key] = value
    (workdir / "config/config.yaml").write_text(yaml.safe_dump(cfg))


def test_cohort_stages_run_and_splits_are_reproducible(workflow_dir):
    write_config(workflow_dir, cohort={"source": "synthetic", "synthetic": {"patients": 25, "seed": 3}},
                 split={"val_size": 3, "train_size": 4, "seed": 42})
    target = "results/demo/splits/splits.json"
    snakemake(workflow_dir, target)
    summary = json.loads((workflow_dir / target).read_text())
    report = json.loads((workflow_dir / "results/demo/cohort/cleaning_report.json").read_text())
    assert summary["sizes"]["val"] == 3 and summary["sizes"]["train"] == 4
    assert summary["sizes"]["test"] == report["patients_out"] - 7
    assert (workflow_dir / "logs/demo/split_cohort.log").exists()
    first = (workflow_dir / "results/demo/splits/train.json").read_bytes()
    snakemake(workflow_dir, target, "--forceall")
    assert (workflow_dir / "results/demo/splits/train.json").read_bytes() == first


def test_missing_cohort_file_is_a_clear_error(workflow_dir):
    write_config(workflow_dir, cohort={"source": "data/nothing_here.json"})
    proc = snakemake(workflow_dir, "results/demo/splits/splits.json", check=False)
    assert proc.returncode != 0
    out = proc.stdout + proc.stderr
    assert "data/nothing_here.json does not exist" in out
    assert "MIMIC-IV is credentialed" in out


def test_config_typo_is_rejected_by_schema(workflow_dir):
    write_config(workflow_dir, split={"val_size": 3, "train_szie": 4, "seed": 42})
    proc = snakemake(workflow_dir, "-n", check=False)
    assert proc.returncode != 0
    assert "train_szie" in proc.stdout + proc.stderr


def test_bad_cohort_stops_with_one_line_and_no_outputs(workflow_dir):
    (workflow_dir / "bad.json").write_text(json.dumps([{"subject_id": 9, "visits": "x"}]))
    write_config(workflow_dir, cohort={"source": "bad.json"})
    proc = snakemake(workflow_dir, "results/demo/cohort/cleaned.json", check=False)
    assert proc.returncode != 0
    log = (workflow_dir / "logs/demo/clean_cohort.log").read_text()
    assert "bad.json: patient 9: visits: expected a list, got str" in log
    assert not (workflow_dir / "results/demo/cohort/cleaned.json").exists()
