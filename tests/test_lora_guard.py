"""llmrnn.train.lora_guard: the run-time guard of verl's LoRA path (weights handed to the rollout, the saved
adapter), on a tiny real PEFT model. verl's own collector and save under it: tests/test_train_verl.py."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest
import torch

from llmrnn.errors import CheckFailed
from llmrnn.train import lora_guard, verl_overrides

TARGETS = ["q_proj", "v_proj"]


@pytest.fixture
def peft_model(tiny_model_dir):
    from peft import LoraConfig, get_peft_model
    from transformers import AutoModelForCausalLM

    torch.manual_seed(0)
    base = AutoModelForCausalLM.from_pretrained(tiny_model_dir, dtype=torch.float32)
    return get_peft_model(base, LoraConfig(r=4, lora_alpha=8, target_modules=TARGETS, task_type="CAUSAL_LM"))


def _lora(model) -> dict:
    from peft.utils import get_peft_model_state_dict

    return {k: v.clone() for k, v in get_peft_model_state_dict(model).items()}


def test_slots_count_a_and_b_of_every_adapted_module(peft_model):
    assert lora_guard.lora_slots(peft_model) == 2 * 2 * len(TARGETS)  # 2 layers x 2 modules x (A, B)
    assert len(_lora(peft_model)) == lora_guard.lora_slots(peft_model)


def test_an_empty_sync_fails_at_once_in_one_line(peft_model):
    watch = lora_guard.SyncWatch()
    with pytest.raises(lora_guard.LoraGuardError, match=r"hold 0 LoRA tensors of the actor's 8 \(sync 1\)") as exc:
        watch.observe({}, lora_guard.lora_slots(peft_model))
    assert "\n" not in str(exc.value)


def test_a_partial_sync_fails(peft_model):
    part = dict(list(_lora(peft_model).items())[:3])
    with pytest.raises(lora_guard.LoraGuardError, match=r"hold 3 LoRA tensors of the actor's 8"):
        lora_guard.SyncWatch().observe(part, lora_guard.lora_slots(peft_model))


def test_a_sync_that_did_not_change_after_an_update_fails(peft_model):
    slots = lora_guard.lora_slots(peft_model)
    watch = lora_guard.SyncWatch()
    watch.observe(_lora(peft_model), slots)  # validation before training
    watch.observe(_lora(peft_model), slots)  # step 1: no update yet, the same tensors are right
    watch.updates += 1
    with pytest.raises(lora_guard.LoraGuardError, match=r"none of the 8 LoRA tensors .* changed after 1 actor"):
        watch.observe(_lora(peft_model), slots)


def test_a_sync_that_moved_after_an_update_passes(peft_model):
    slots = lora_guard.lora_slots(peft_model)
    watch = lora_guard.SyncWatch()
    watch.observe(_lora(peft_model), slots)
    with torch.no_grad():
        next(p for n, p in peft_model.named_parameters() if "lora_B" in n).add_(1e-3)
    watch.updates += 1
    assert watch.observe(_lora(peft_model), slots) == {"lora_tensors": 8, "slots": 8, "sync": 2}
    assert watch.changed_checked


def _save(model, out, keep=None):
    from safetensors.torch import save_file

    model.save_pretrained(out)
    weights = _lora(model)
    keys = list(weights)[:keep] if keep is not None else list(weights)
    save_file({k: weights[k] for k in keys}, str(out / "adapter_model.safetensors"))
    return out


def test_an_empty_saved_adapter_is_named_as_one(peft_model, tiny_model_dir, tmp_path):
    empty = _save(peft_model, tmp_path / "a", keep=0)
    assert (empty / "adapter_model.safetensors").stat().st_size == 16  # what verl 0.7.1 + peft 0.21 writes
    with pytest.raises(CheckFailed, match=r"holds no LoRA tensor \(an empty adapter"):
        lora_guard.check_adapter_dir(empty, tiny_model_dir)
    with pytest.raises(lora_guard.LoraGuardError, match=r"holds 0 LoRA tensors of the 8 LoRA slots"):
        lora_guard.check_saved_adapter(empty, 8)


def test_a_saved_adapter_missing_slots_fails_and_a_whole_one_passes(peft_model, tiny_model_dir, tmp_path):
    part = _save(peft_model, tmp_path / "p", keep=5)
    with pytest.raises(CheckFailed, match=r"holds 5 LoRA tensors of the 8 LoRA slots it targets"):
        lora_guard.check_adapter_dir(part, tiny_model_dir)
    whole = _save(peft_model, tmp_path / "w")
    assert lora_guard.check_adapter_dir(whole, tiny_model_dir) == {"lora_tensors": 8, "slots": 8}


def test_train_runs_adapter_copy_refuses_an_empty_verl_adapter(peft_model, tmp_path):
    """`llmrnn train run` copied verl 0.7.1's 16-byte adapter without complaint (it checked rank and alpha)."""
    from llmrnn.settings.train import Train
    from llmrnn.train.verl_adapter import adapter_from_checkpoint

    actor = tmp_path / "global_step_3" / "actor"
    _save(peft_model, actor / "lora_adapter", keep=0)
    cfg = Train(lora={"rank": 4, "alpha": 8, "target_modules": TARGETS})
    with pytest.raises(CheckFailed, match=r"lora_adapter: the adapter holds no LoRA tensor"):
        adapter_from_checkpoint(actor, tmp_path / "adapter", cfg)
    assert not (tmp_path / "adapter").exists()


def test_verls_ray_workers_get_the_guard_as_their_setup_hook():
    hooks = [o for o in verl_overrides.runtime_env_overrides({}) if "worker_process_setup_hook" in o]
    assert hooks == ["+ray_kwargs.ray_init.runtime_env.worker_process_setup_hook=llmrnn.train.lora_guard.worker_setup"]
    mod, fn = hooks[0].split("=", 1)[1].rsplit(".", 1)
    code = f"import os, {mod} as m; os.umask(0o022); m.{fn}(); print(oct(os.umask(0)))"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "0o77"  # the umask hook still runs (and the guard is a no-op without verl)


def test_the_guard_config_shape_is_json(tmp_path):
    # the saved-adapter check reads adapter_config.json as PEFT writes it; a bad file is one line
    bad = tmp_path / "x"
    bad.mkdir()
    (bad / "adapter_config.json").write_text(json.dumps({"r": 4}))
    (bad / "adapter_model.safetensors").write_bytes(b"garbage")
    with pytest.raises(CheckFailed, match=r"not a readable safetensors file"):
        lora_guard.check_adapter_dir(bad)
