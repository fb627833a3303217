"""SFT warm start: LoRA supervised fine-tuning with TRL's SFTTrainer (CPU or one GPU).

The loss covers the assistant answer only (rows are prompt/completion pairs). The adapter is checked
like GRPO's (rank/alpha as configured), then merged and verified by `llmrnn merge run`; GRPO starts
from the merged model.
"""

from __future__ import annotations

import json
import logging
import os
import time
from pathlib import Path

from llmrnn import io
from llmrnn.errors import CheckFailed, InputError
from llmrnn.models import model_folder
from llmrnn.settings.base import parse
from llmrnn.settings.qa import QaSft
from llmrnn.train.outputs import export_adapter

log = logging.getLogger(__name__)


def settings(cfg: dict | None) -> QaSft:
    """The `qa.sft` section as its validated settings model (defaults filled, bounds checked)."""
    return parse(QaSft, cfg or {}, "qa.sft")


def _pairs(path: str | os.PathLike) -> list[dict]:
    rows = []
    for i, row in enumerate(io.read_jsonl(path)):
        msgs = row.get("messages")
        if not isinstance(msgs, list) or len(msgs) < 2 or msgs[-1].get("role") != "assistant":
            raise InputError(f"{path}: row {i}: messages: expected chat messages ending with the assistant answer")
        rows.append({"prompt": msgs[:-1], "completion": msgs[-1:]})
    if not rows:
        raise InputError(f"{path}: no SFT rows")
    return rows


def _progress_callback():
    from transformers import TrainerCallback

    class Progress(TrainerCallback):
        def on_log(self, args, state, control, logs=None, **kw):
            if logs and ("loss" in logs or "eval_loss" in logs):
                shown = {k: round(v, 4) for k, v in logs.items() if isinstance(v, float)}
                log.info("sft step %d/%d %s", state.global_step, state.max_steps, shown)

    return Progress()


def train_sft(cfg: dict | None, train_file: str, val_file: str | None, model_dir: str, *, adapter_dir: str,
              metrics_path: str, summary_path: str) -> dict:
    """Train the LoRA; writes the adapter folder, metrics.jsonl (one row per logged step) and summary.json."""
    cfg = settings(cfg)
    import torch

    torch.set_num_threads(cfg.num_threads)
    from datasets import Dataset
    from peft import LoraConfig
    from transformers import AutoModelForCausalLM, AutoTokenizer, PrinterCallback
    from trl import SFTConfig, SFTTrainer


    model_dir = str(model_folder(model_dir))
    work = Path(adapter_dir).parent / "sft_checkpoints"  # beside the outputs; save_strategy "no" keeps it empty
    tokenizer = AutoTokenizer.from_pretrained(model_dir)
    if tokenizer.pad_token is None:
        tokenizer.pad_token = tokenizer.eos_token
    train_ds = Dataset.from_list(_pairs(train_file))
    val_ds = Dataset.from_list(_pairs(val_file)) if val_file else None
    cuda = torch.cuda.is_available()
    args = SFTConfig(
        output_dir=str(work),
        seed=cfg.seed,
        use_cpu=not cuda,
        bf16=bool(cuda and torch.cuda.is_bf16_supported()),
        learning_rate=cfg.lr,
        num_train_epochs=float(cfg.epochs),
        max_steps=cfg.max_steps or -1,
        per_device_train_batch_size=cfg.batch_size,
        per_device_eval_batch_size=cfg.batch_size,
        gradient_accumulation_steps=cfg.grad_accum,
        max_length=cfg.max_length,
        eval_strategy="epoch" if val_ds is not None else "no",
        save_strategy="no",
        logging_steps=1,
        report_to=[],
        disable_tqdm=True,
        dataloader_num_workers=0,
    )
    lora = LoraConfig(r=cfg.lora.rank, lora_alpha=cfg.lora.alpha,
                      lora_dropout=cfg.lora.dropout, target_modules=list(cfg.lora.target_modules),
                      bias="none", task_type="CAUSAL_LM")
    model = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32)
    trainer = SFTTrainer(model=model, args=args, train_dataset=train_ds, eval_dataset=val_ds,
                         processing_class=tokenizer, peft_config=lora, callbacks=[_progress_callback()])
    trainer.remove_callback(PrinterCallback)  # it prints dicts to stdout; one log line per step instead
    t0 = time.perf_counter()
    trainer.train()
    history = [h for h in trainer.state.log_history if "loss" in h or "eval_loss" in h]
    if not any("loss" in h for h in history):
        raise CheckFailed("qa sft: no training loss was logged; the run did not train")
    io.write_jsonl(metrics_path, [
        {"step": h.get("step"), "kind": "val" if "eval_loss" in h else "train",
         **{k: v for k, v in h.items() if isinstance(v, (int, float))}} for h in history])
    export_adapter(trainer.model, tokenizer, Path(adapter_dir), cfg)
    summary = {"engine": "trl-sft", "steps": int(trainer.state.global_step), "train_rows": len(train_ds),
               "val_rows": len(val_ds) if val_ds is not None else 0,
               "first_loss": next(h["loss"] for h in history if "loss" in h),
               "last_loss": [h["loss"] for h in history if "loss" in h][-1],
               "seconds": round(time.perf_counter() - t0, 2)}
    io.write_json(summary_path, summary)
    log.info("SFT done: %s", json.dumps(summary))
    return summary
