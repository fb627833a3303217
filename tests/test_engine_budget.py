"""Forward-pass jobs never open more vLLM engines than one GPU's memory allows (vLLM 0.17.1 refuses a
second engine once the first reserved its gpu_memory_utilization: 0.85 + 0.85 > 1). The trained memory
model runs as a LoRA on the base engine when its adapter is given, else the share is split by engine
count; `llmrnn check` runs the same plan.

vLLM itself needs a GPU (or its CPU build, tests/test_vllm.py): here a RECORDING STAND-IN for
VLLMBackend takes its place and refuses, as vLLM does, an engine that would take the reserved shares of
the same GPU past 1."""

from __future__ import annotations

import json
from typing import ClassVar

import pytest
import yaml

from llmrnn import backends, check, engine_budget, rnn
from tests.conftest import REPO

REPRO_ROLES = yaml.safe_load((REPO / "config/reproduce.yaml").read_text())["roles"]


class StandInVLLM:
    """STAND-IN for vllm.LLM behind VLLMBackend (no GPU here): records each engine and its requests and
    fails like vLLM when the engines of this process reserve more than the whole GPU."""

    engines: ClassVar[list[StandInVLLM]] = []

    def __init__(self, model_path, gpu_memory_utilization=0.85, enable_lora=False, max_lora_rank=16, **kw):
        reserved = sum(e.utilization for e in StandInVLLM.engines) + gpu_memory_utilization
        if reserved > 1:
            raise ValueError(f"Free memory on device is less than desired GPU memory utilization ({reserved:.2f})")
        self.model_path, self.utilization = str(model_path), gpu_memory_utilization
        self.enable_lora, self.max_lora_rank = enable_lora, max_lora_rank
        self.requests: list[tuple[int, str | None]] = []
        self.calls = 0
        StandInVLLM.engines.append(self)

    def generate(self, conversations, temperature, top_p, max_tokens, seeds=None, lora_path=None):
        if lora_path and not self.enable_lora:
            raise ValueError("LoRA is not enabled")
        self.requests.append((len(conversations), lora_path))
        return ["{}"] * len(conversations)


@pytest.fixture
def stand_in_vllm(monkeypatch):
    StandInVLLM.engines = []
    monkeypatch.setattr(backends, "VLLMBackend", StandInVLLM)
    backends.clear_cache()
    yield StandInVLLM
    backends.clear_cache()


@pytest.fixture
def adapter(tmp_path):
    """A real PEFT adapter folder (rank 16) as train_grpo leaves it."""
    from peft import LoraConfig, get_peft_model

    from tests.tiny_model import build_tiny_model

    base = build_tiny_model(tmp_path / "base")
    from transformers import AutoModelForCausalLM

    model = get_peft_model(AutoModelForCausalLM.from_pretrained(base),
                           LoraConfig(r=16, lora_alpha=32, target_modules=["q_proj", "v_proj"]))
    model.save_pretrained(tmp_path / "adapter")
    return str(tmp_path / "adapter")


def _roles(model: str) -> dict:
    return {r: dict(cfg, model=model) for r, cfg in REPRO_ROLES.items()}


def test_trained_memory_model_beside_the_base_splits_the_share(stand_in_vllm):
    roles = rnn.make_roles(_roles("base-model"), {"memory": "merged"})
    engines = {e.model_path.split("/")[-1]: e.utilization for e in stand_in_vllm.engines}
    assert engines == {"base-model": 0.42, "merged": 0.42}  # 0.85 split over two engines, <= 1 together
    assert roles["prediction"].backend is roles["evaluation"].backend is not roles["memory"].backend


def test_trained_memory_model_as_a_lora_on_the_base_engine(stand_in_vllm, adapter):
    roles = rnn.make_roles(_roles("base-model"), {"memory": "merged"}, memory_adapter=adapter)
    (engine,) = stand_in_vllm.engines  # one engine, the configured share, LoRA on
    assert (engine.model_path.split("/")[-1], engine.utilization, engine.enable_lora, engine.max_lora_rank) == (
        "base-model", 0.85, True, 16)
    roles["memory"].generate([[{"role": "user", "content": "m"}]])
    roles["prediction"].generate([[{"role": "user", "content": "p"}], [{"role": "user", "content": "q"}]])
    assert engine.requests == [(1, adapter), (2, None)]  # the memory rows run through the adapter only


def test_same_model_roles_with_different_shares_share_one_engine(stand_in_vllm):
    cfg = _roles("base-model")
    cfg["evaluation"]["gpu_memory_utilization"] = 0.5
    rnn.make_roles(cfg)
    assert [(e.model_path.split("/")[-1], e.utilization) for e in stand_in_vllm.engines] == [("base-model", 0.85)]


def test_three_models_split_three_ways():
    plan = engine_budget.plan_engines({"prediction": {"backend": "vllm", "model": "a"},
                                  "evaluation": {"backend": "vllm", "model": "b", "gpu_memory_utilization": 0.9},
                                  "memory": {"backend": "transformers", "model": "c"}}, {})
    assert [e["gpu_memory_utilization"] for e in plan.engines] == [0.45, 0.45] and plan.utilization <= 1
    assert plan.roles_cfg["memory"] == {"backend": "transformers", "model": "c"}


def test_budget_problems_name_the_engines():
    plan = engine_budget.EnginePlan([{"model": "a", "roles": ["prediction"], "gpu_memory_utilization": 0.85,
                                 "tensor_parallel_size": 1, "lora": None},
                                {"model": "b", "roles": ["memory"], "gpu_memory_utilization": 0.85,
                                 "tensor_parallel_size": 2, "lora": None}], {}, {}, [])
    problems = engine_budget.gpu_budget_problems(plan, 1, "eval_shard (trained)")
    assert any("reserve 1.70 of each GPU" in p and "a (prediction) 0.85" in p for p in problems), problems
    assert any("tensor_parallel_size 2 but the job asks for 1 GPU" in p for p in problems), problems


@pytest.fixture
def in_workflow(workflow_dir, monkeypatch):
    monkeypatch.chdir(workflow_dir)
    return workflow_dir


def test_check_plans_the_reproduction_and_refuses_what_cannot_fit(in_workflow, tmp_path):
    config, problems = check.load_config([REPO / "config/config.yaml", REPO / "config/reproduce.yaml"])
    assert not problems and check.check_engine_budget(config) == []
    wide = tmp_path / "tp2.yaml"
    wide.write_text(json.dumps({"roles": {"memory": {"tensor_parallel_size": 2}}}))
    config, _ = check.load_config([REPO / "config/config.yaml", REPO / "config/reproduce.yaml", wide])
    problems = check.check_engine_budget(config)
    assert any(p.startswith("eval_shard (trained):") and "tensor_parallel_size 2" in p for p in problems), problems


def test_eval_shard_refuses_a_memory_adapter_that_is_no_adapter(tmp_path, adapter):
    from llmrnn.errors import InputError
    from llmrnn.evaluate import run_shard

    merged = tmp_path / "base"  # an HF folder (the adapter fixture's base model) standing for merged/
    with pytest.raises(InputError, match="not a PEFT adapter folder .* memory adapter of trained") as err:
        run_shard([], "trained", _roles("base-model"), str(REPO / "config/prompts/llmrnn.yaml"), 0,
                  memory_model=str(merged), memory_adapter=str(tmp_path / "nothing"))
    assert "\n" not in str(err.value)
