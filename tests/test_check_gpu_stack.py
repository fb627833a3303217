"""`llmrnn check` refuses what the jobs cannot run: the packages the planned backends need (verl for
train.engine verl, vLLM for a vLLM role or judge, TRL for the CPU trainer), in the environment the jobs run
in: this one, unless a software-deployment method (LLMRNN_SDM, as profiles/slurm reads it) brings its own.
It said OK and "skipped: gpu stack" before, and every GPU job then failed (three times each on SLURM)."""

from __future__ import annotations

from pathlib import Path

import pytest

from llmrnn.check import load_config, skips
from llmrnn.check.gpus import check_gpu_stack, needed_packages
from llmrnn.gpu_stack import installed
from tests.conftest import REPO


@pytest.fixture
def smoke(monkeypatch):
    monkeypatch.chdir(REPO)
    for name in ("LLMRNN_SDM", "LLMRNN_TRAIN_GPUS", "LLMRNN_JUDGE_GPUS", "LLMRNN_TRAIN_NODES"):
        monkeypatch.delenv(name, raising=False)
    config, _ = load_config([Path("config/smoke.yaml")])
    return config


def test_the_smoke_config_needs_verl_and_vllm(smoke):
    assert set(needed_packages(smoke)) >= {"verl", "vllm"}


def test_a_missing_package_is_a_problem_naming_make_gpu_env(smoke):
    if installed("verl") and installed("vllm"):
        pytest.skip("the GPU stack is installed here")
    skips.reset()
    problems = [p for p in check_gpu_stack(smoke) if p.startswith("gpu stack: ")]
    assert len(problems) == 1, problems
    assert "not installed in this environment" in problems[0] and "make gpu-env" in problems[0]
    assert not skips.SKIPPED  # refused, not skipped


@pytest.mark.parametrize("sdm", ["apptainer", "conda", "apptainer conda"])
def test_a_deployment_method_brings_its_own_packages(smoke, monkeypatch, sdm):
    monkeypatch.setenv("LLMRNN_SDM", sdm)
    skips.reset()
    assert not [p for p in check_gpu_stack(smoke) if "not installed" in p]
    assert skips.SKIPPED and sdm in skips.SKIPPED[0][1]


def test_the_cpu_demo_needs_what_this_venv_has(monkeypatch):
    monkeypatch.chdir(REPO)
    monkeypatch.delenv("LLMRNN_SDM", raising=False)
    config, _ = load_config([Path("config/config.yaml")])
    assert needed_packages(config) == ["trl"]
    assert check_gpu_stack(config) == []
