"""Real snakemake runs of the cohort stages in a temp working directory."""

from __future__ import annotations

import hashlib
import json
import os
from pathlib import Path

import pytest
import yaml

from llmrnn.cohort import dump_cohort, synthesize_cohort
from tests.conftest import snakemake


def write_config(workdir, **overrides) -> None:
    cfg = yaml.safe_load((workdir / "config/config.yaml").read_text())
    for key, value in overrides.items():
        cfg[key] = value
    (workdir / "config/config.yaml").write_text(yaml.safe_dump(cfg))


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


@pytest.mark.slow
def test_hostile_cohort_path_is_quoted_and_nothing_executes(workflow_dir, tmp_path_factory):
    # a path with spaces, both quote kinds, a semicolon and command substitutions: unquoted, the clean
    # rule split it into several arguments and ran the $(...) parts
    outside = tmp_path_factory.mktemp("hostile") / "my data $(touch PWNED_DIR)"
    outside.mkdir()
    source = outside / """co'hort "v1"; touch PWNED_SEMI $(touch PWNED) `touch PWNED_TICK`.json"""
    source.write_text(dump_cohort(synthesize_cohort(25, seed=3)))
    write_config(workflow_dir, cohort={"source": str(source)}, split={"val_size": 3, "train_size": 4, "seed": 42})
    snakemake(workflow_dir, "results/demo/splits/splits.json")
    report = json.loads((workflow_dir / "results/demo/cohort/cleaning_report.json").read_text())
    summary = json.loads((workflow_dir / "results/demo/splits/splits.json").read_text())
    assert report["source"] == str(source)
    assert summary["sizes"]["test"] == report["patients_out"] - 7
    planted = [p for root in (workflow_dir, outside.parent, Path.cwd()) for p in root.rglob("PWNED*")]
    assert planted == []


def test_replaced_cohort_with_older_mtime_reruns_cleaning_and_splits(workflow_dir):
    source = workflow_dir / "cohort.json"
    source.write_text(dump_cohort(synthesize_cohort(25, seed=3)))
    write_config(workflow_dir, cohort={"source": "cohort.json"}, split={"val_size": 3, "train_size": 4, "seed": 42})
    target = "results/demo/splits/splits.json"
    snakemake(workflow_dir, target)
    unchanged = snakemake(workflow_dir, target, "-n")
    assert "Nothing to be done" in unchanged.stdout + unchanged.stderr
    # the user swaps in another cohort whose file is OLDER than every output (copied with its mtime)
    source.write_text(dump_cohort(synthesize_cohort(30, seed=4)))
    os.utime(source, (1_000_000_000, 1_000_000_000))
    dry = snakemake(workflow_dir, target, "-n")
    planned = dry.stdout + dry.stderr
    assert "clean_cohort" in planned and "split_cohort" in planned, planned
    snakemake(workflow_dir, target)
    report = json.loads((workflow_dir / "results/demo/cohort/cleaning_report.json").read_text())
    assert report["patients_in"] == 30
    assert report["source_sha256"] == hashlib.sha256(source.read_bytes()).hexdigest()
    summary = json.loads((workflow_dir / target).read_text())
    assert sum(summary["sizes"].values()) == report["patients_out"]


def test_brace_in_cohort_path_is_refused_before_any_job(workflow_dir):
    (workflow_dir / "data{x}").mkdir()
    (workflow_dir / "data{x}" / "c.json").write_text(dump_cohort(synthesize_cohort(25, seed=3)))
    write_config(workflow_dir, cohort={"source": "data{x}/c.json"})
    proc = snakemake(workflow_dir, "results/demo/splits/splits.json", "-n", check=False)
    assert proc.returncode != 0
    assert "contains a brace, which Snakemake reads as a wildcard" in proc.stdout + proc.stderr


def test_demo_builds_its_cohort_from_synthetic_physionet_files_with_the_same_splits(workflow_dir):
    """The embedded default (cohort.source mimic_iv on the files synth_mimic_iv writes) runs build_cohort
    first, and its splits hold the same patients, visits and shown sections as the synthetic JSON's. The
    synthetic JSON's run is also the cohort stages' own check: the split sizes, the split's log, and a
    --forceall rerun that writes the same train split byte for byte (one run instead of a second copy)."""
    cfg = yaml.safe_load((workflow_dir / "config/config.yaml").read_text())
    assert cfg["cohort"]["source"] == "mimic_iv"
    cohort = dict(cfg["cohort"], synthetic={"patients": 25, "seed": 3})
    split = {"val_size": 3, "train_size": 4, "seed": 42}
    write_config(workflow_dir, cohort=cohort, split=split)
    target = "results/demo/splits/splits.json"
    dry = snakemake(workflow_dir, target, "-n")
    planned = dry.stdout + dry.stderr
    assert planned.index("rule synth_mimic_iv") < planned.index("rule build_cohort") < planned.index("rule clean_cohort")
    snakemake(workflow_dir, target)
    built = {name: json.loads((workflow_dir / f"results/demo/splits/{name}.json").read_text()) for name in ("train", "val", "test")}
    write_config(workflow_dir, cohort={"source": "synthetic", "synthetic": {"patients": 25, "seed": 3}}, split=split)
    (workflow_dir / "logs/demo/split_cohort.log").unlink()  # the synthetic run's split writes its own
    snakemake(workflow_dir, target)
    summary = json.loads((workflow_dir / target).read_text())
    report = json.loads((workflow_dir / "results/demo/cohort/cleaning_report.json").read_text())
    assert summary["sizes"]["val"] == 3 and summary["sizes"]["train"] == 4
    assert summary["sizes"]["test"] == report["patients_out"] - 7
    assert (workflow_dir / "logs/demo/split_cohort.log").exists()
    first = (workflow_dir / "results/demo/splits/train.json").read_bytes()
    snakemake(workflow_dir, target, "--forceall")
    assert (workflow_dir / "results/demo/splits/train.json").read_bytes() == first
    for name, patients in built.items():
        ref = json.loads((workflow_dir / f"results/demo/splits/{name}.json").read_text())
        for p in ref:
            p.pop("synthetic")
            for v in p["visits"]:
                for name_ in ("hospital_course", "procedures"):  # withheld by the build: written during the stay
                    v["clinical_sections"].pop(name_)
        assert patients == ref, name


def test_physionet_folder_missing_a_file_fails_before_any_job(workflow_dir):
    (workflow_dir / "mimic/hosp").mkdir(parents=True)
    write_config(workflow_dir, cohort={"source": "mimic_iv", "mimic_iv": {"hosp": "mimic/hosp", "note": "mimic/note"}})
    proc = snakemake(workflow_dir, "results/demo/cohort/cleaned.json", check=False)
    out = proc.stdout + proc.stderr
    assert proc.returncode != 0
    assert "cohort.mimic_iv: mimic/hosp/patients.csv.gz: missing" in out, out[-2000:]
    assert not (workflow_dir / "results/demo/cohort").exists()
