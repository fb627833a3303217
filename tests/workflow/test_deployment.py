"""Software deployment on a cluster, without its runtimes (FAKE `apptainer` and `conda` from tests/fake_bin):
- apptainer: a real Snakemake run with `--sdm apptainer` and profiles/slurm's apptainer-args; the recorded
  `apptainer exec` has `--nv` (GPUs inside) and binds the HF cache as HF_HOME;
- conda: the envs/*.yaml Snakemake plans for each job (llmrnn.plan.Plan.conda_env)."""

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


def _conda_envs(workflow_dir, monkeypatch, *args: str) -> set[str]:
    monkeypatch.setenv("PATH", f"{REPO / 'tests' / 'fake_bin'}{os.pathsep}{os.environ['PATH']}")
    proc = snakemake(workflow_dir, "--list-conda-envs", *args)
    return {line.split()[0] for line in proc.stdout.splitlines() if line.startswith("envs/")}


def test_eval_shard_gets_the_vllm_env_when_the_roles_use_vllm(workflow_dir, monkeypatch):
    from tests.slurm.dag import prepare_reproduce_inputs

    prepare_reproduce_inputs(workflow_dir)
    shard = "results/phase1_v2judge_repro/eval/base/shard_0.jsonl"  # upstream: split (data), models (cpu)
    assert _conda_envs(workflow_dir, monkeypatch, "--configfile", "config/reproduce.yaml", "--", shard) == {
        "envs/data.yaml", "envs/cpu.yaml", "envs/vllm.yaml"}
    assert "envs/verl.yaml" in _conda_envs(workflow_dir, monkeypatch, "--configfile", "config/reproduce.yaml")
    # the embedded default: transformers backend and TRL, no GPU env anywhere
    assert _conda_envs(workflow_dir, monkeypatch, "--", "results/demo/eval/base/shard_0.jsonl") == {
        "envs/data.yaml", "envs/cpu.yaml"}
