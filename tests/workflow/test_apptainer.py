"""The apptainer route of profiles/slurm: a real Snakemake run with `--sdm apptainer` and the profile's
apptainer-args, with a recording FAKE `apptainer` on PATH (tests/fake_bin/apptainer; no container runtime
here). The recorded `apptainer exec` has `--nv` (GPUs inside) and binds the HF cache as HF_HOME."""

from __future__ import annotations

import json
import os

import pytest

from tests.conftest import REPO, snakemake
from tests.slurm.dag import load_profile

pytestmark = pytest.mark.slow


def test_apptainer_exec_gets_nv_and_the_hf_cache(workflow_dir, tmp_path, monkeypatch):
    hf_home = tmp_path / "hf home"  # a space: the args must stay quoted
    profile = load_profile({"LLMRNN_SDM": "apptainer", "HF_HOME": str(hf_home), "HOME": str(tmp_path)})
    assert profile["software-deployment-method"] == ["apptainer"]
    args = profile["apptainer-args"]
    assert hf_home.is_dir()  # created: apptainer refuses to bind a missing folder
    image = tmp_path / "llmrnn-verl.sif"
    image.write_text("stand-in image file")
    log = tmp_path / "apptainer.jsonl"
    monkeypatch.setenv("PATH", f"{REPO / 'tests' / 'fake_bin'}{os.pathsep}{os.environ['PATH']}")
    monkeypatch.setenv("FAKE_APPTAINER_LOG", str(log))
    monkeypatch.setenv("LLMRNN_CONTAINER", str(image))

    snakemake(workflow_dir, "--sdm", "apptainer", "--apptainer-args", args, "check")

    calls = [json.loads(line) for line in log.read_text().splitlines()]
    execs = [c for c in calls if "exec" in c]
    assert execs, calls
    argv = execs[0]  # the words the shell gave apptainer: the quoting survived
    assert "--nv" in argv
    assert argv[argv.index("--bind") + 1] == str(hf_home)
    assert f"HF_HOME={hf_home}" in argv
    assert str(image) in argv
    assert "llmrnn check: OK" in (workflow_dir / "logs" / "demo" / "check.log").read_text()
