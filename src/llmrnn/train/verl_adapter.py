"""The trained LoRA adapter out of verl's chosen checkpoint, for `llmrnn train run`: verl 0.7 writes
actor/lora_adapter/ (copied as it is); verl 0.9's engine writes FSDP shards + lora_train_meta.json, whose
adapter verl's own model merger gathers."""

from __future__ import annotations

import json
import logging
import shutil
import subprocess
import sys
from pathlib import Path

from llmrnn import io
from llmrnn.errors import CheckFailed
from llmrnn.lora_files import repair_alpha
from llmrnn.merge.adapter import is_verl_engine_lora
from llmrnn.safe_path import safe_path_env
from llmrnn.settings.train import Train
from llmrnn.train.lora_guard import check_adapter_dir
from llmrnn.train.outputs import check_adapter

log = logging.getLogger(__name__)


def adapter_from_checkpoint(actor: Path, dst: Path, cfg: Train, *, python: str | None = None,
                            scratch: Path | None = None) -> dict:
    """The chosen checkpoint's LoRA adapter into `dst`. verl 0.7 writes actor/lora_adapter/ (copied as it is);
    verl 0.9's engine writes FSDP shards + lora_train_meta.json only: verl's own model merger (`python`, the
    training Python, which has verl) gathers the adapter in `scratch` (default: beside `actor`), its alpha is
    checked against lora_train_meta.json and train.lora, then it is copied and `scratch` removed. Returns
    {"adapter_from": "lora_adapter" | "model_merger", ...}."""
    if (actor / "lora_adapter").is_dir() or not actor.is_dir() or not is_verl_engine_lora(actor):
        copy_adapter(actor / "lora_adapter", dst, cfg)
        return {"adapter_from": "lora_adapter"}
    scratch = scratch or actor.parent / "gathered"
    try:
        gathered = gather_lora_adapter(actor, scratch, python)
        alpha = fix_gathered_alpha(gathered, actor, cfg)
        copy_adapter(gathered, dst, cfg)
    finally:
        shutil.rmtree(scratch, ignore_errors=True)  # the merger also wrote the whole model there
    return {"adapter_from": "model_merger", **alpha}


def gather_lora_adapter(actor: Path, scratch: Path, python: str | None = None) -> Path:
    """verl 0.9: `python -m verl.model_merger merge --backend fsdp` on the actor's shards (the way verl's docs
    convert a checkpoint); it writes the base model and, from the `lora_` tensors, scratch/lora_adapter/.
    Its output goes to scratch/model_merger.log; a failure is one line naming it."""
    shutil.rmtree(scratch, ignore_errors=True)
    scratch.mkdir(parents=True)
    log_path = scratch.parent / "model_merger.log"
    cmd = [python or sys.executable, "-m", "verl.model_merger", "merge", "--backend", "fsdp",
           "--local_dir", str(actor), "--target_dir", str(scratch / "model")]
    log.info("verl: gathering the LoRA adapter of %s with verl's model merger", actor)
    with open(log_path, "w", encoding="utf-8") as fh:
        # the job's environment as is (its working directory off sys.path): the shards are read with map_location="cpu", their DTensor meshes unpickled
        proc = subprocess.run(cmd, stdout=fh, stderr=subprocess.STDOUT, check=False, env=safe_path_env())
    adapter = scratch / "model" / "lora_adapter"
    if proc.returncode != 0 or not (adapter / "adapter_config.json").is_file():
        lines = [x for x in log_path.read_text(encoding="utf-8", errors="replace").splitlines() if x.strip()]
        last = lines[-1].strip() if lines else "no output"
        what = f"exited with {proc.returncode}" if proc.returncode else "wrote no lora_adapter/"
        raise CheckFailed(f"train: verl's model_merger {what} gathering the LoRA adapter of {actor}: {last} "
                          f"(full output: {log_path})")
    return adapter


def fix_gathered_alpha(adapter: Path, actor: Path, cfg: Train) -> dict:
    """verl's merger takes r/lora_alpha from lora_train_meta.json and writes alpha 0 without it (0.7.1's copy
    always does). An alpha of 0/None is set from lora_train_meta.json, else train.lora.alpha (the repair the
    merge makes too: llmrnn.lora_files.repair_alpha); the copy then checks r/alpha against train.lora
    (check_adapter)."""
    conf_path = adapter / "adapter_config.json"
    meta_path = actor / "lora_train_meta.json"
    meta = json.loads(meta_path.read_text(encoding="utf-8")) if meta_path.is_file() else {}
    conf, record = repair_alpha(json.loads(conf_path.read_text(encoding="utf-8")), f"verl: {adapter}",
                                [("lora_train_meta.json", meta.get("lora_alpha")), ("train.lora.alpha", cfg.lora.alpha)])
    if record["alpha_repaired"]:
        io.write_text(conf_path, json.dumps(conf, indent=2) + "\n")
    return {"merger_alpha": record["original_alpha"], "alpha_fixed_from": record["repaired_from"]}


def copy_adapter(src: Path, dst: Path, cfg: Train) -> None:
    """verl's actor/lora_adapter carries the real alpha (model_merger's copy says 0). An adapter with fewer
    LoRA tensors than the slots it targets (an empty one: 0) is refused (llmrnn.train.lora_guard)."""
    if not (src / "adapter_config.json").is_file():
        raise CheckFailed(f"{src}: no lora_adapter in the final verl checkpoint")
    check_adapter_dir(src)
    with io.atomic_dir(dst) as tmp:
        shutil.copytree(src, tmp, dirs_exist_ok=True)
    check_adapter(dst, cfg)
