"""The qa recipe's SFT warm start on the tiny model, one step through TRL's SFTTrainer to the checked adapter:
the unit tier's guard of the chain `qa sft` runs (settings model -> SFTTrainer -> export_adapter ->
check_adapter), which before this test only the e2e tier's QA workflow reached."""

from __future__ import annotations

import json
import re

import pytest

from llmrnn import io
from llmrnn.errors import CheckFailed, InputError
from llmrnn.qa.sft import settings, train_sft
from llmrnn.train.outputs import check_adapter


def _rows(n: int) -> list[dict]:
    return [{"messages": [{"role": "user", "content": f"What is {i} plus {i}?"},
                          {"role": "assistant", "content": f"<answer>{2 * i}</answer>"}]} for i in range(n)]


def test_one_sft_step_writes_an_adapter_with_the_configured_rank_and_alpha(tmp_path, tiny_model_dir):
    io.write_jsonl(tmp_path / "train.jsonl", _rows(4))
    io.write_jsonl(tmp_path / "val.jsonl", _rows(2))
    cfg = {"max_steps": 1, "batch_size": 2, "max_length": 64, "lora": {"rank": 4, "alpha": 8}}
    summary = train_sft(cfg, str(tmp_path / "train.jsonl"), str(tmp_path / "val.jsonl"), str(tiny_model_dir),
                        adapter_dir=str(tmp_path / "adapter"), metrics_path=str(tmp_path / "metrics.jsonl"),
                        summary_path=str(tmp_path / "summary.json"))
    assert summary["steps"] == 1 and summary["train_rows"] == 4 and summary["val_rows"] == 2
    conf = json.loads((tmp_path / "adapter/adapter_config.json").read_text())
    assert (conf["r"], conf["lora_alpha"]) == (4, 8)
    assert [row["kind"] for row in io.read_jsonl(tmp_path / "metrics.jsonl")] == ["train", "val"]
    # the check names the warm start's own section when the adapter disagrees with it
    with pytest.raises(CheckFailed, match=r"differ from qa\.sft\.lora"):
        check_adapter(tmp_path / "adapter", settings({"lora": {"rank": 8}}))


@pytest.mark.parametrize(("cfg", "key"), [({"lora_rank": 8}, "qa.sft.lora_rank"),
                                          ({"batch_size": 0}, "qa.sft.batch_size"),
                                          ({"lora": {"alpha": "x"}}, "qa.sft.lora.alpha")])
def test_bad_sft_settings_are_one_line_naming_the_key(cfg, key):
    with pytest.raises(InputError, match="^" + re.escape(key) + ": "):
        settings(cfg)
