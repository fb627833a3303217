"""Folding the adapter into the base: PEFT's merge_and_unload, or verl's FSDP checkpoint merger."""

from __future__ import annotations

import importlib.util
import json
import logging
import shutil
import subprocess
import sys
import time
from pathlib import Path

from safetensors import safe_open

from llmrnn import io
from llmrnn.constants import VERL_MERGER
from llmrnn.errors import CheckFailed
from llmrnn.merge.adapter import AdapterSource
from llmrnn.merge.weights import (
    _device,
    _dtype,
    _load_model,
    _safetensors_index,
    _saved_dtype,
    attach_adapter,
)
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
    # the tokenizer is the base's prepared copy byte for byte (the release accounts for it so): the merger's own
    # save of it (transformers' spelling of the same tokenizer, maybe under other file names) goes first
    for f in out_dir.iterdir():
        if f.is_file() and f.name not in NOT_TOKENIZER and f.suffix != ".safetensors":
            f.unlink()
    for f in _copy_tokenizer_files(base_dir, out_dir):
        log.debug("tokenizer file from base: %s", f)
    for name in _drop_tied_copies(out_dir):
        log.info("%s: dropped verl's merger's copy of the tied tensor %s (the base's architecture ties it)", out_dir, name)
    saved = _saved_dtype(out_dir)  # the merger casts every tensor to bfloat16
    # written_by: the release accounts for what this writer sets (phi_guard.accounting: the token ids, the tied
    # output embedding)
    return {"dtype": str(saved).removeprefix("torch.") if saved else f"as written by {VERL_MERGER}", "device": "cpu",
            "written_by": VERL_MERGER}


def _tied_pairs(folder: Path) -> dict[str, str]:
    """{tied tensor: the tensor it is tied to} of the model in `folder` ({} when it ties none): transformers 5
    names both (`_tied_weights_keys` as a mapping), transformers 4 the copies only, of the input embedding."""
    from transformers import AutoConfig, AutoModelForCausalLM

    config = AutoConfig.from_pretrained(folder)
    if not getattr(config, "tie_word_embeddings", False):
        return {}
    try:
        cls = AutoModelForCausalLM._model_mapping[type(config)]
    except KeyError:
        return {}
    keys = getattr(cls, "_tied_weights_keys", None) or {}
    if isinstance(keys, dict):
        return {str(k): str(v) for k, v in keys.items()}
    return {str(k): f"{cls.base_model_prefix}.embed_tokens.weight" for k in keys}


def _drop_tied_copies(out_dir: Path) -> list[str]:
    """verl's merger casts each tensor to bfloat16 on its own, so a model with tied word embeddings is saved
    with its output embedding as a second tensor (lm_head.weight), which the base's files do not hold. Where
    it is the tied tensor's bytes, it goes (transformers ties it again on load): the merged weights are the
    base's architecture, as the merge check and the release's accounting require. A copy that differs stays
    (the merge check then refuses it: only_in_merged)."""
    import torch
    from safetensors.torch import load_file, save_file

    index = _safetensors_index(out_dir)
    dropped = []
    for copy, source in _tied_pairs(out_dir).items():
        if copy not in index or source not in index:
            continue
        with safe_open(str(index[copy]), framework="pt") as a, safe_open(str(index[source]), framework="pt") as b:
            if not torch.equal(a.get_tensor(copy), b.get_tensor(source)):
                continue
            metadata = a.metadata()
        tensors = load_file(index[copy])
        gone = tensors.pop(copy)
        save_file(tensors, index[copy], metadata=metadata)
        _drop_from_index(out_dir / "model.safetensors.index.json", copy, gone.numel(), gone.numel() * gone.element_size())
        dropped.append(copy)
    return dropped


def _drop_from_index(path: Path, name: str, params: int, size: int) -> None:
    """A sharded save's index without tensor `name` (its totals less that tensor's)."""
    if not path.is_file():
        return
    data = json.loads(path.read_text(encoding="utf-8"))
    data["weight_map"].pop(name, None)
    meta = data.get("metadata") or {}
    for key, less in (("total_size", size), ("total_parameters", params)):
        if isinstance(meta.get(key), int):
            meta[key] -= less
    io.write_text(path, json.dumps(data, indent=2, sort_keys=True) + "\n")  # atomic: a killed merge leaves the old index
