"""What a training run leaves behind, for both engines (TRL's GRPO, verl) and the QA warm start: the LoRA
adapter, checked against the settings that trained it, and the run's metrics log. Either engine imports
these; neither imports the other."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

from llmrnn import io
from llmrnn.errors import CheckFailed
from llmrnn.settings.qa import QaSft
from llmrnn.settings.train import Train


def export_adapter(model, tokenizer, adapter_dir: Path, cfg: Train | QaSft) -> None:
    """Write the LoRA adapter (+ tokenizer) atomically and check its rank/alpha against `cfg.lora` (GRPO's
    train.lora or the warm start's qa.sft.lora)."""
    with io.atomic_dir(adapter_dir) as tmp:
        model.save_pretrained(tmp)
        tokenizer.save_pretrained(tmp)
    check_adapter(adapter_dir, cfg)


def export_checkpoint_adapter(checkpoint: Path, tokenizer, adapter_dir: Path, cfg: Train) -> None:
    """The LoRA adapter of an earlier checkpoint (PEFT's files in checkpoint-N/) as the run's adapter."""
    with io.atomic_dir(adapter_dir) as tmp:
        for f in checkpoint.glob("adapter_*"):
            shutil.copy2(f, Path(tmp) / f.name)
        tokenizer.save_pretrained(tmp)
    check_adapter(adapter_dir, cfg)


def finish_metrics(live: Path, final: Path) -> None:
    """Copy the live metrics to the rule's output (atomically); refuse an empty log."""
    text = live.read_text(encoding="utf-8") if live.exists() else ""
    if not any(line.strip() for line in text.splitlines()):
        raise CheckFailed(f"{live}: no metrics were logged; the run did not train")
    io.write_text(final, text)


def check_adapter(adapter_dir: Path, cfg: Train | QaSft) -> dict:
    """The adapter's config must carry the training-time rank and alpha (merge uses it)."""
    section = "qa.sft.lora" if isinstance(cfg, QaSft) else "train.lora"
    conf_path = adapter_dir / "adapter_config.json"
    if not conf_path.is_file():
        raise CheckFailed(f"{conf_path}: missing; no LoRA adapter was written")
    conf = json.loads(conf_path.read_text(encoding="utf-8"))
    want = {"r": cfg.lora.rank, "lora_alpha": cfg.lora.alpha}
    got = {k: conf.get(k) for k in want}
    if got != want:
        raise CheckFailed(f"{conf_path}: r/lora_alpha {got} differ from {section} {want}")
    return conf
