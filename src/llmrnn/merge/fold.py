"""Folding the adapter into the base: PEFT's merge_and_unload, or verl's FSDP checkpoint merger."""

from __future__ import annotations

import importlib.util
import logging
import shutil
import subprocess
import sys
import time
from pathlib import Path

from llmrnn.errors import CheckFailed
from llmrnn.merge.adapter import AdapterSource
from llmrnn.merge.weights import _device, _dtype, _load_model, attach_adapter
from llmrnn.safe_path import safe_path_env
from llmrnn.settings.release import Merge

log = logging.getLogger(__name__)


# Files of the base folder that are not the model itself: copied verbatim into the merged folder.
NOT_TOKENIZER = {"config.json", "generation_config.json", "model.safetensors.index.json", ".ready"}


# ----------------------------------------------------------------------------- merge
def _copy_tokenizer_files(base_dir: Path, out_dir: Path) -> list[str]:
    copied = []
    for f in sorted(base_dir.iterdir()):
        if f.is_file() and not f.name.startswith(".") and f.name not in NOT_TOKENIZER and f.suffix not in (
            ".safetensors", ".bin", ".pt", ".pth", ".gguf"
        ):
            shutil.copy2(f, out_dir / f.name)
            copied.append(f.name)
    return copied


def merge_lora(base_dir: Path, source: AdapterSource, adapter_cfg: dict, out_dir: Path, settings: Merge) -> dict:
    """PEFT merge_and_unload of base + adapter, saved at the configured dtype into out_dir."""
    import torch

    device = _device(settings.device)
    save_dtype = _dtype(settings.dtype, base_dir)
    t0 = time.monotonic()
    base = _load_model(base_dir, device, torch.float32)
    model, _ = attach_adapter(base, source.path, adapter_cfg)
    merged = model.merge_and_unload(progressbar=False, safe_merge=True)
    merged = merged.to(save_dtype)
    merged.save_pretrained(out_dir, safe_serialization=True)
    copied = _copy_tokenizer_files(base_dir, out_dir)
    log.info("merged %s into %s (%s) in %.1fs", source.path, out_dir, save_dtype, time.monotonic() - t0)
    return {"dtype": str(save_dtype).removeprefix("torch."), "device": device, "copied": copied}


def merge_verl_fsdp(actor_dir: Path, out_dir: Path, base_dir: Path) -> dict:
    """Gather a verl FSDP full fine-tune into an HF folder with verl's own merger (verl must be importable)."""
    if importlib.util.find_spec("verl") is None:
        raise CheckFailed(
            f"{actor_dir}: a verl FSDP full fine-tune needs `python -m verl.model_merger`, but verl is not "
            "importable here; run merge_model in the verl environment (envs/verl.yaml or the gpu extra)"
        )
    cmd = [sys.executable, "-m", "verl.model_merger", "merge", "--backend", "fsdp",
           "--local_dir", str(actor_dir), "--target_dir", str(out_dir)]
    log.info("running %s", " ".join(cmd))
    proc = subprocess.run(cmd, capture_output=True, text=True, check=False, env=safe_path_env())
    if proc.returncode != 0:
        tail = (proc.stderr or proc.stdout).strip().splitlines()[-1:] or ["no output"]
        raise CheckFailed(f"{actor_dir}: verl.model_merger failed ({proc.returncode}): {tail[0]}")
    if (out_dir / "lora_adapter").exists():
        raise CheckFailed(
            f"{actor_dir}: verl.model_merger produced lora_adapter/: this is a LoRA run; point --adapter at "
            "global_step_N/actor/lora_adapter instead (verl's merger does not merge LoRA)"
        )
    for f in _copy_tokenizer_files(base_dir, out_dir):
        log.debug("tokenizer file from base: %s", f)
    return {"dtype": "as written by verl.model_merger", "device": "cpu"}
