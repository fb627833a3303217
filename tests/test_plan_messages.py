"""What the workflow says before it runs, as a user sees it: a config typo under `snakemake -n` is a few lines
naming the key (it was a 975-line schema dump), and a changed config is named in config keys (Snakemake's
rerun reason quotes kilobytes of JSON), with the `llmrnn config diff` line that lists them all."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from llmrnn.plan.common import config_changes
from llmrnn.runconfig import read_layer, resolve, write_run_config
from tests.conftest import REPO, copy_workflow


@pytest.fixture(scope="module")
def workflow(tmp_path_factory) -> Path:
    return copy_workflow(tmp_path_factory.mktemp("messages"))


def _dry_run(work: Path, *args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "snakemake", "--profile", "profiles/local", "-n", "all", *args],
                          cwd=work, capture_output=True, text=True, timeout=600, check=False,
                          env=dict(os.environ, PYTHONPATH=str(REPO / "src")))


def test_a_config_typo_is_a_short_message_naming_the_key(workflow):
    (workflow / "typo.yaml").write_text("trian: {lr: 1.0e-4}\n")
    proc = _dry_run(workflow, "--configfile", "config/config.yaml", "typo.yaml")
    out = proc.stdout + proc.stderr
    assert proc.returncode != 0
    assert "'trian' was unexpected" in out and "llmrnn check" in out
    assert len(out.splitlines()) < 15, out[:3000]


def test_a_changed_config_is_named_in_config_keys(workflow, tmp_path):
    layers = [read_layer(workflow / "config" / "config.yaml")]
    run = workflow / "results" / "demo"
    write_run_config(run / "config.yaml", resolve(layers)[0], layers)
    (workflow / "steps.yaml").write_text((workflow / "config" / "config.yaml").read_text()
                                         .replace("total_steps: 4", "total_steps: 5"))
    proc = _dry_run(workflow, "--configfile", "steps.yaml")
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert "config keys changed since results/demo/config.yaml was written (1;" in proc.stderr
    assert "train.total_steps: 4 (" in proc.stderr and "config.yaml) -> 5 (steps.yaml)" in proc.stderr
    assert "llmrnn config diff results/demo/config.yaml steps.yaml" in proc.stderr
    same = _dry_run(workflow)
    assert "config keys changed" not in same.stderr


def test_config_changes_stays_short(tmp_path):
    layers = [read_layer(REPO / "config" / "config.yaml")]
    write_run_config(tmp_path / "config.yaml", resolve(layers)[0], layers)
    assert config_changes(tmp_path / "config.yaml", layers) == []
    assert config_changes(tmp_path / "missing.yaml", layers) == []
    many = [("over.yaml", {"train": {"lr": 1e-5, "seed": 1, "total_steps": 3, "group_size": 4},
                           "eval": {"seed": 5, "max_patients": 10}, "split": {"seed": 1}, "trajectories": {"seed": 3},
                           "preflight": {"rows": 2}})]
    lines = config_changes(tmp_path / "config.yaml", [*layers, *many], limit=8)
    assert len(lines) == 1 + 8 + 1 and lines[-1] == "  ..." and "(9;" in lines[0]
