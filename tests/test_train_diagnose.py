"""`llmrnn train diagnose`: reward spread per group, advantage, LoRA update size (real PEFT adapter)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from llmrnn.errors import InputError
from llmrnn.train import diagnose
from tests.conftest import llmrnn_in_process


def write_audit(directory: Path, groups: list[tuple[str, int, list[float]]]) -> None:
    directory.mkdir(parents=True, exist_ok=True)
    lines = [
        json.dumps({"score": s, "valid_json": s > 0, "extra_info": {"split": split, "index": idx}})
        for split, idx, scores in groups
        for s in scores
    ]
    (directory / "calls_1.jsonl").write_text("\n".join(lines) + "\n")


def test_group_spread_and_advantage(tmp_path):
    write_audit(tmp_path / "audit", [
        ("train", 0, [0.0, 0.0, 0.0, 0.0]),  # flat: no gradient
        ("train", 1, [0.0, 1.0, 0.0, 1.0]),  # spread: |advantage| 1 for every sample
        ("val", 0, [0.5, 0.0, 0.5, 0.0]),  # val samples are left out by default
        ("train", 0, [0.5, 0.5, 0.5, 0.5]),
    ])
    out = diagnose.group_stats(diagnose.read_audit(tmp_path / "audit"), 4)
    assert (out["groups"], out["groups_with_spread"]) == (3, 1)
    assert out["mean_abs_advantage"] == pytest.approx(4 * (1 / (0.5 + 1e-4)) * 0.5 / 12)
    assert out["rewards"]["distribution"] == {"0.000": 6, "0.500": 4, "1.000": 2}
    assert diagnose.group_stats(diagnose.read_audit(tmp_path / "audit"), 4, split=None)["groups"] == 4
    with pytest.raises(InputError, match="group-size"):
        diagnose.group_stats([], 1)
    with pytest.raises(InputError, match="no calls_"):
        diagnose.read_audit(tmp_path)


def test_lora_update_size_of_a_real_adapter(tmp_path, tiny_model_dir):
    import torch
    from peft import LoraConfig, get_peft_model
    from transformers import AutoModelForCausalLM

    model = get_peft_model(AutoModelForCausalLM.from_pretrained(tiny_model_dir),
                           LoraConfig(r=4, lora_alpha=8, target_modules=["q_proj", "v_proj"]))
    model.save_pretrained(tmp_path / "fresh")
    fresh = diagnose.lora_update(tmp_path / "fresh")
    assert fresh["update_norm_total"] == 0.0 and fresh["zero_b_modules"] == fresh["modules"] > 0
    with torch.no_grad():
        name, b = next((n, p) for n, p in model.named_parameters() if "lora_B" in n)
        b.fill_(0.01)
    model.save_pretrained(tmp_path / "moved")
    moved = diagnose.lora_update(tmp_path / "moved")
    assert moved["update_norm_total"] > 0 and moved["zero_b_modules"] == fresh["modules"] - 1
    assert moved["largest"]["module"] in name
    write_audit(tmp_path / "audit", [("train", 0, [0.0, 1.0])])
    shown = llmrnn_in_process("train", "diagnose", "--audit", str(tmp_path / "audit"), "--group-size", "2",
                              "--adapter", str(tmp_path / "moved"))
    assert shown.returncode == 0, shown.stderr
    assert json.loads(shown.stdout)["lora"]["update_norm_total"] == pytest.approx(moved["update_norm_total"])
