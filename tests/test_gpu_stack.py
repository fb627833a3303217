"""Which verl/vLLM releases a config can use, refused by `llmrnn check` before anything is queued; the GPU
count and checkpoint disk checked where the training job runs."""

from __future__ import annotations

import json
import os
import subprocess

import pytest
import yaml

from llmrnn import gpu_stack
from llmrnn.errors import CheckFailed
from tests.conftest import REPO

VERL = {"train": {"engine": "verl", "nnodes": 1}, "roles": {}}
VLLM_ONLY = {"train": {"engine": "trl"}, "roles": {"memory": {"backend": "vllm"}}}


@pytest.fixture(autouse=True)
def _one_node(monkeypatch):
    monkeypatch.delenv("LLMRNN_TRAIN_NODES", raising=False)


def test_reference_pair_passes():
    assert gpu_stack.stack_problems(VERL, {"verl": "0.7.1", "vllm": "0.17.1"}) == []
    assert gpu_stack.stack_problems(VERL, {"verl": "0.7.1", "vllm": "0.17.1+cu128"}) == []
    assert gpu_stack.stack_problems(VERL, {"verl": None, "vllm": None}) == []  # checked again in the job


def test_verl_09_refused_with_the_reason():
    (problem,) = gpu_stack.stack_problems(VERL, {"verl": "0.9.1", "vllm": "0.17.1"})
    assert problem.startswith("train.engine verl: verl 0.9.1 is installed here")
    assert "never on GPUs" in problem and "vLLM >= 0.18" in problem and "make gpu-env" in problem


@pytest.mark.parametrize("verl,vllm,bad", [("0.4.1", "0.17.1", "verl 0.4.1"), ("0.7.1", "0.30.0", "vllm 0.30.0")])
def test_unpinned_gpu_extra_pairs_refused(verl, vllm, bad):
    """`pip install 'verl' 'vllm'` unpinned resolves to verl 0.4.1 + vLLM 0.30: refused before queueing."""
    problems = gpu_stack.stack_problems(VERL, {"verl": verl, "vllm": vllm})
    assert len(problems) == 1 and bad in problems[0], problems


def test_vllm_alone_needs_017_or_newer():
    assert gpu_stack.stack_problems(VLLM_ONLY, {"verl": None, "vllm": "0.32.0"}) == []
    (problem,) = gpu_stack.stack_problems(VLLM_ONLY, {"verl": None, "vllm": "0.10.2"})
    assert "vllm 0.10.2" in problem and ">=0.17" in problem
    assert gpu_stack.stack_problems({"train": {"engine": "trl"}, "roles": {}}, {"vllm": "0.10.2"}) == []


JUDGED = {"reward": {"mode": "scalar"}, "judge": {"rubric": "config/rubrics/outcome_v2_smollm2.yaml"}}


@pytest.mark.parametrize(("train", "judge_host", "wanted"), [
    ({"engine": "verl", "nnodes": 2}, "node", None),  # the wired layout
    ({"engine": "verl", "nnodes": 2}, "10.1.2.3", None),  # an explicit address the nodes reach
    ({"engine": "verl", "nnodes": 2}, None, "judge.host: the judge listens on the rubric's loopback"),
    ({"engine": "verl", "nnodes": 3}, "127.0.0.1", "judge.host: the judge listens on 127.0.0.1"),
    ({"engine": "verl", "nnodes": 2}, "localhost", "judge.host: the judge listens on localhost"),
    ({"engine": "trl", "nnodes": 2}, "node", "train.engine trl trains in one process"),
    ({"engine": "verl", "nnodes": 1}, None, None),
])
def test_multi_node_layouts(train, judge_host, wanted):
    cfg = {"train": train, "roles": {}, **JUDGED, "judge": {**JUDGED["judge"], "host": judge_host}}
    problems = gpu_stack.stack_problems(cfg, {"verl": "0.7.1", "vllm": "0.17.1"})
    if wanted is None:
        assert problems == []
    else:
        (problem,) = problems
        assert wanted in problem and "\n" not in problem


def test_a_loopback_judge_is_fine_when_the_reward_asks_no_judge(monkeypatch):
    cfg = {"train": {"engine": "verl", "nnodes": 2}, "roles": {}, "reward": {"mode": "outcome"}}
    assert gpu_stack.stack_problems(cfg, {"verl": "0.7.1", "vllm": "0.17.1"}) == []
    monkeypatch.setenv("LLMRNN_TRAIN_NODES", "3")  # the profile's node count counts too
    (problem,) = gpu_stack.stack_problems({**JUDGED, "train": {"engine": "verl", "nnodes": 1}, "roles": {}},
                                          {"verl": "0.7.1", "vllm": "0.17.1"})
    assert "train.nnodes is 3" in problem


def test_require_gpus_in_the_job():
    gpu_stack.require_gpus(2, 2)
    with pytest.raises(CheckFailed, match="train.n_gpus_per_node=2 but 1 GPU"):
        gpu_stack.require_gpus(2, 1)


def test_checkpoint_disk_sized_from_the_model(tmp_path):
    model = tmp_path / "m"
    model.mkdir()
    (model / "model.safetensors").write_bytes(b"\0" * 1_000_000)  # 0.5 M bf16 parameters
    (model / "config.json").write_text(json.dumps({"torch_dtype": "bfloat16"}))
    assert gpu_stack.model_bytes_fp32(model) == 2_000_000
    # 20 steps saved every 5: 4 saves + the final one, all kept by default (keep_last null)
    gb, kept = gpu_stack.checkpoint_disk_gb(model, None, 20, 5)
    assert kept == 5 and gb == pytest.approx(5 * 2_000_000 * 1.1 / 1e9, abs=0.01)
    assert gpu_stack.checkpoint_disk_gb(model, 2, 20, 5)[1] == 2


VERL_ENVS = sorted(REPO.glob(".venv-verl-*/bin/python"))


@pytest.mark.skipif(not VERL_ENVS, reason="no verl env (scripts/make_verl_env.sh makes .venv-verl-<version>)")
@pytest.mark.parametrize("python", VERL_ENVS, ids=[p.parts[-3] for p in VERL_ENVS])
def test_check_in_a_real_verl_env(python, workflow_dir, tmp_path):
    """`llmrnn check` run with the interpreter of a real verl install: 0.7.1 passes the stack check,
    0.9.x is refused with one line."""
    version = python.parts[-3].removeprefix(".venv-verl-")
    over = tmp_path / "verl.yaml"
    over.write_text(yaml.safe_dump({"train": {"engine": "verl"}}))
    env = dict(os.environ, PYTHONPATH=str(REPO / "src"), HF_HUB_OFFLINE="1")
    env.pop("LLMRNN_TRAIN_NODES", None)
    proc = subprocess.run([str(python), "-m", "llmrnn.cli", "check", "--configfile", "config/config.yaml", str(over)], cwd=workflow_dir,
                          capture_output=True, text=True, env=env, timeout=600, check=False)
    refused = [line for line in proc.stderr.splitlines() if f"verl {version} is installed here" in line]
    if version.startswith("0.7"):
        assert not refused, proc.stderr
    else:
        assert proc.returncode == 1 and len(refused) == 1, proc.stderr
