"""Weights: the base and merged models loaded, the adapter attached, logits on probe prompts and the
merged weights compared with the adapter's update."""

from __future__ import annotations

import warnings
from pathlib import Path
from typing import Any

from safetensors import safe_open

from llmrnn import io
from llmrnn.errors import CheckFailed, InputError

KEY_NOISE = ("_fsdp_wrapped_module.", "_checkpoint_wrapped_module.", "_orig_mod.")


# ----------------------------------------------------------------------------- torch helpers
def _device(name: str) -> str:
    import torch

    if name == "auto":
        return "cuda" if torch.cuda.is_available() else "cpu"
    return name


def _dtype(name: str, base_dir: Path):
    import torch

    if name == "auto":
        cfg = io.read_json(base_dir / "config.json")
        name = str(cfg.get("dtype") or cfg.get("torch_dtype") or "float32")
    try:
        value = getattr(torch, name.replace("torch.", ""))
    except AttributeError:
        raise InputError(f"merge.dtype: unknown dtype {name!r}") from None
    if not isinstance(value, torch.dtype):
        raise InputError(f"merge.dtype: unknown dtype {name!r}")
    return value


def _load_model(path: Path, device: str, dtype=None):
    import torch
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(path, dtype=dtype or torch.float32)
    return model.to(device).eval()


def _probe_inputs(tokenizer, prompts: list[str]) -> list[list[int]]:
    out = []
    for text in prompts:
        if tokenizer.chat_template:
            ids = tokenizer.apply_chat_template(
                [{"role": "user", "content": text}], add_generation_prompt=True, tokenize=True
            )
            if isinstance(ids, dict) or hasattr(ids, "keys"):
                ids = ids["input_ids"]
        else:
            ids = tokenizer(text)["input_ids"]
        out.append(list(ids))
    return out


def _logits(model, probes: list[list[int]], device: str) -> list:
    import torch

    with torch.no_grad():
        return [
            model(input_ids=torch.tensor([ids], device=device)).logits[0].float().cpu() for ids in probes
        ]


def _clean_key(key: str) -> str:
    for noise in KEY_NOISE:
        key = key.replace(noise, "")
    return key


def attach_adapter(base_model, adapter_dir: Path, adapter_cfg: dict):
    """Wrap `base_model` with the adapter (config possibly repaired) and load its weights; return
    (peft_model, load report). Keys that find no LoRA slot are reported, never ignored."""
    from peft import LoraConfig, PeftConfig, PeftModel
    from peft.utils import load_peft_weights, set_peft_model_state_dict

    # as PeftConfig.from_pretrained builds it: check_kwargs, then from_peft_type (keys this PEFT does not know,
    # from a newer PEFT, are dropped with a warning; runtime-only keys never reach a LoraConfig)
    cfg = {k: v for k, v in adapter_cfg.items() if k != "runtime_config"}
    unknown = sorted(k for k in cfg if k not in LoraConfig.__dataclass_fields__)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # the unknown keys are in the report
        try:
            config = PeftConfig.from_peft_type(**PeftConfig.check_kwargs(**{"peft_type": "LORA", **cfg}))
        except (TypeError, ValueError) as exc:
            raise CheckFailed(f"{adapter_dir}/adapter_config.json: not a LoRA config PEFT can load: {exc}") from exc
    config.inference_mode = True
    config.init_lora_weights = True  # a slot that gets no tensor stays zero (and is reported), never random
    try:
        model = PeftModel(base_model, config)
    except ValueError as exc:  # target modules not in the base model
        raise CheckFailed(f"{adapter_dir}: adapter does not fit the base model: {exc}") from exc
    weights = {_clean_key(k): v for k, v in load_peft_weights(str(adapter_dir), device="cpu").items()}
    result = set_peft_model_state_dict(model, weights)
    missing = [k for k in result.missing_keys if "lora_" in k]
    report = {
        "adapter_tensors": len(weights),
        "unexpected_keys": list(result.unexpected_keys)[:10],
        "n_unexpected": len(result.unexpected_keys),
        "missing_lora_keys": missing[:10],
        "n_missing_lora": len(missing),
        "ignored_config_keys": unknown,
    }
    nonzero_b = sum(1 for k, v in weights.items() if "lora_B" in k and bool(v.abs().sum() > 0))
    report["nonzero_lora_B"] = nonzero_b
    report["ok"] = bool(weights) and not result.unexpected_keys and not missing
    return model, report


def _target_weight_names(adapter_weights_keys: list[str]) -> set[str]:
    """Names of base weights the adapter touches, e.g. model.layers.0.self_attn.q_proj.weight."""
    names = set()
    for key in adapter_weights_keys:
        if ".lora_A" not in key:
            continue
        stem = _clean_key(key).split(".lora_A")[0]
        stem = stem.removeprefix("base_model.model.")
        names.add(f"{stem}.weight")
    return names


def _safetensors_index(folder: Path) -> dict[str, Path]:
    index: dict[str, Path] = {}
    for f in sorted(folder.glob("*.safetensors")):
        with safe_open(str(f), framework="pt") as fh:
            for key in fh.keys():  # noqa: SIM118 - safe_open handles are not dicts
                index[key] = f
    return index


def _saved_dtype(folder: Path):
    """dtype of the first floating tensor in the folder's safetensors (None if there is none)."""
    for f in sorted(folder.glob("*.safetensors")):
        with safe_open(str(f), framework="pt") as fh:
            for key in fh.keys():  # noqa: SIM118 - safe_open handles are not dicts
                t = fh.get_slice(key)
                dtype = t.get_dtype()
                if dtype in ("F32", "BF16", "F16"):
                    import torch

                    return {"F32": torch.float32, "BF16": torch.bfloat16, "F16": torch.float16}[dtype]
    return None


def compare_weights(base_dir: Path, merged_dir: Path, targets: set[str] | None) -> dict:
    """Count merged tensors that differ from the base, comparing at the merged tensor's dtype (so a pure
    dtype conversion counts as unchanged)."""
    import torch

    base_idx, merged_idx = _safetensors_index(base_dir), _safetensors_index(merged_dir)
    common = sorted(set(base_idx) & set(merged_idx))
    changed, max_delta = [], 0.0
    handles: dict[Path, Any] = {}

    def tensor(path: Path, key: str):
        if path not in handles:
            handles[path] = safe_open(str(path), framework="pt")
        return handles[path].get_tensor(key)

    for key in common:
        m = tensor(merged_idx[key], key)
        b = tensor(base_idx[key], key).to(m.dtype)
        if b.shape != m.shape or not torch.equal(b, m):
            changed.append(key)
            if b.shape == m.shape:
                max_delta = max(max_delta, float((m.float() - b.float()).abs().max()))
    unexpected = sorted(k for k in changed if targets is not None and k not in targets)
    report = {
        "changed_tensors": len(changed),
        "total_tensors": len(common),
        "expected_changed": len(targets) if targets is not None else None,
        "unexpected_changed": unexpected[:10],
        "n_unexpected_changed": len(unexpected),
        "only_in_base": sorted(set(base_idx) - set(merged_idx))[:10],
        "only_in_merged": sorted(set(merged_idx) - set(base_idx))[:10],
        "max_abs_delta": max_delta,
    }
    report["ok"] = bool(changed) and not unexpected and not report["only_in_merged"]
    return report
