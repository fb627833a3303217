"""Stage `merge`: fold the trained LoRA into the base model and prove the result is right.

Inputs it accepts (`--adapter`):
- a PEFT adapter folder (adapter_config.json + adapter_model.safetensors): what TRL writes, or what the
  verl engine copies from `global_step_N/actor/lora_adapter`;
- a verl checkpoint: the checkpoints root (latest_checkpointed_iteration.txt), `global_step_N/` or
  `global_step_N/actor/`; its `actor/lora_adapter/` is used;
- a verl FULL fine-tune (actor/ with FSDP shards, no lora_adapter): gathered by `python -m verl.model_merger
  merge --backend fsdp` (only when verl is importable: the gpu extra / envs/verl.yaml);
- a full HF model folder (full fine-tune written by TRL): copied as is, then checked.

verl's own merger is never used for LoRA: `python -m verl.model_merger merge` on a LoRA run leaves the
base weights untouched and writes lora_alpha=0 (verl issues #3050, #4553, #5325, #7285). We merge with PEFT `merge_and_unload()`; an adapter whose alpha is 0 (or missing) is repaired
from the training config (`train.lora_alpha`) and the repair is logged and recorded.

Checks (merge_check.json, all must pass, else CheckFailed and no merged folder is left behind):
- adapter_loaded: every tensor of the adapter file found its LoRA slot in the base model;
- adapter_config: rank and alpha (after any repair) equal the configured ones;
- weights_differ: merged tensors that differ from the base (at the saved dtype): > 0, and none outside
  the adapter's target modules;
- logits_match: merged logits == base+adapter (unmerged PEFT, float32) logits on probe prompts within
  max(atol + rtol * max|ref|, rounding_margin * noise), where noise is what rounding the BASE weights to
  the saved dtype alone does to its logits (0 for float32); also reports how much the adapter moves the
  logits at all (adapter_effect);
- reload_generate: the merged folder (config, safetensors, tokenizer, generation config, no adapter files)
  reloads with AutoModelForCausalLM/AutoTokenizer and generates.
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import logging
import re
import shutil
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from llmrnn import io
from llmrnn.errors import CheckFailed, InputError

log = logging.getLogger(__name__)

# Probe prompts: our own generic memory-update requests (no cohort text), rendered with the chat template.
DEFAULT_PROBES = [
    (
        'Memory so far: {"evolving_summary": "Long-standing hypertension, on two agents."} New visit: '
        "shortness of breath on exertion. Rewrite the memory as JSON."
    ),
    "Summarise in one JSON object what a clinician should remember after a visit for a fall at home.",
    'Return {"evolving_summary": "..."} for a first visit with fever and cough.',
]
# Files of the base folder that are not the model itself: copied verbatim into the merged folder.
NOT_TOKENIZER = {"config.json", "generation_config.json", "model.safetensors.index.json", ".ready"}
FSDP_SHARD = re.compile(r"model_world_size_\d+_rank_\d+\.pt$")
KEY_NOISE = ("_fsdp_wrapped_module.", "_checkpoint_wrapped_module.", "_orig_mod.")


@dataclass
class AdapterSource:
    """What `--adapter` points at, resolved."""

    kind: str  # peft_adapter | verl_lora_adapter | verl_fsdp_full | full_model
    path: Path  # the folder holding adapter_config.json (LoRA), the actor dir (FSDP) or the model dir
    given: Path
    notes: list[str] = field(default_factory=list)


# ----------------------------------------------------------------------------- config
def configured_lora(train: dict | None) -> dict:
    """Rank/alpha/target modules the training config asked for (`train.lora_rank`, `train.lora_alpha`,
    `train.lora_target_modules`; a nested `train.lora: {rank|r, alpha, target_modules}` is read too)."""
    train = train or {}
    nested = train.get("lora") if isinstance(train.get("lora"), dict) else {}
    rank = train.get("lora_rank", nested.get("rank", nested.get("r")))
    alpha = train.get("lora_alpha", nested.get("alpha"))
    targets = train.get("lora_target_modules", train.get("target_modules", nested.get("target_modules")))
    return {"rank": rank, "alpha": alpha, "target_modules": targets}


def merge_settings(merge: dict | None) -> dict:
    """The merge section with defaults filled (the schema has the same defaults)."""
    out = {
        "dtype": "auto",
        "device": "auto",
        "probe_prompts": list(DEFAULT_PROBES),
        "logits_atol": 1e-3,
        "logits_rtol": 1e-3,
        "rounding_margin": 4.0,
        "max_new_tokens": 8,
    }
    out.update({k: v for k, v in (merge or {}).items() if v is not None})
    if not out["probe_prompts"]:
        raise InputError("merge.probe_prompts: must list at least one prompt")
    return out


# ----------------------------------------------------------------------------- locating inputs
def base_dir_of(path: str | Path) -> Path:
    """`--base` may be the model folder or its `.ready` marker (the rule's input)."""
    from llmrnn.models import model_folder

    p = model_folder(path)
    if not (p / "config.json").is_file():
        raise InputError(f"{p}: base model folder has no config.json (expected an HF model folder)")
    return p


def resolve_adapter(path: str | Path) -> AdapterSource:
    """Find the adapter (or full weights) behind a TRL adapter folder or a verl checkpoint path."""
    given = Path(path)
    p = given
    if not p.exists():
        raise InputError(f"{p}: adapter path does not exist")
    notes: list[str] = []
    latest = p / "latest_checkpointed_iteration.txt"
    if latest.is_file():
        step = latest.read_text().strip()
        p = p / f"global_step_{step}"
        notes.append(f"verl checkpoints root: latest step {step}")
        if not p.is_dir():
            raise InputError(f"{latest}: names step {step} but {p} does not exist")
    if (p / "actor").is_dir():
        p = p / "actor"
    if (p / "adapter_config.json").is_file():
        kind = "verl_lora_adapter" if p.name == "lora_adapter" else "peft_adapter"
        return AdapterSource(kind, p, given, notes)
    if (p / "lora_adapter" / "adapter_config.json").is_file():
        return AdapterSource("verl_lora_adapter", p / "lora_adapter", given, notes)
    if any(FSDP_SHARD.search(f.name) for f in p.iterdir() if f.is_file()):
        return AdapterSource("verl_fsdp_full", p, given, notes + ["FSDP shards without lora_adapter/"])
    if (p / "config.json").is_file() and any(p.glob("*.safetensors")):
        return AdapterSource("full_model", p, given, notes + ["full model folder (no adapter_config.json)"])
    raise InputError(
        f"{given}: no adapter found; expected adapter_config.json + adapter_model.safetensors (TRL), a verl "
        "checkpoint (global_step_N/actor/lora_adapter or FSDP shards) or a full HF model folder"
    )


def read_adapter_config(adapter_dir: Path) -> dict:
    path = adapter_dir / "adapter_config.json"
    try:
        cfg = io.read_json(path)
    except (OSError, json.JSONDecodeError) as exc:
        raise InputError(f"{path}: cannot read adapter config: {exc}") from exc
    if not isinstance(cfg, dict) or cfg.get("peft_type", "LORA") != "LORA":
        raise InputError(f"{path}: peft_type: expected LORA, got {cfg.get('peft_type')!r}")
    return cfg


def repair_alpha(adapter_cfg: dict, configured: dict, source: str) -> tuple[dict, dict]:
    """Return (fixed config, repair record). An alpha of 0/None (verl's merger writes 0) is replaced by the
    configured alpha; without one the merge cannot be trusted and stops."""
    original = adapter_cfg.get("lora_alpha")
    fixed = dict(adapter_cfg)
    record = {"original_alpha": original, "alpha_repaired": False}
    if original in (0, None):
        alpha = configured.get("alpha")
        if not alpha:
            raise CheckFailed(
                f"{source}: lora_alpha is {original!r} (verl's model_merger writes 0) and the "
                "training config gives no lora_alpha to repair it from; set train.lora_alpha"
            )
        fixed["lora_alpha"] = alpha
        record.update(alpha_repaired=True, repaired_from="train.lora_alpha")
        log.warning(
            "%s: lora_alpha=%r in adapter_config.json (verl merger bug); repaired to train.lora_alpha=%s",
            source, original, alpha,
        )
    return fixed, record


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
    from peft import LoraConfig, PeftModel
    from peft.utils import load_peft_weights, set_peft_model_state_dict

    known = set(LoraConfig.__dataclass_fields__)
    unknown = sorted(k for k in adapter_cfg if k not in known)
    config = LoraConfig(**{k: v for k, v in adapter_cfg.items() if k in known})
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
    from safetensors import safe_open

    index: dict[str, Path] = {}
    for f in sorted(folder.glob("*.safetensors")):
        with safe_open(str(f), framework="pt") as fh:
            for key in fh.keys():  # noqa: SIM118 - safe_open handles are not dicts
                index[key] = f
    return index


def _saved_dtype(folder: Path):
    """dtype of the first floating tensor in the folder's safetensors (None if there is none)."""
    from safetensors import safe_open

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
    from safetensors import safe_open

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


def merge_lora(base_dir: Path, source: AdapterSource, adapter_cfg: dict, out_dir: Path, settings: dict) -> dict:
    """PEFT merge_and_unload of base + adapter, saved at the configured dtype into out_dir."""
    import torch

    device = _device(settings["device"])
    save_dtype = _dtype(settings["dtype"], base_dir)
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
    proc = subprocess.run(cmd, capture_output=True, text=True, check=False)
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


# ----------------------------------------------------------------------------- RoPE settings for every reader
# transformers 5.x writes RoPE only as `rope_parameters` ({"rope_type", "rope_theta", ...}); transformers 4.57 and
# vLLM 0.17 (the GPU lock, and most users of a released model) read the top-level `rope_theta` and
# `rope_scaling` and fall back to theta 10000 without scaling: a merged Llama-3 would load without error
# and answer worse. The merged config.json carries both spellings, with the base's values.
LEGACY_ROPE = ("rope_theta", "rope_scaling")


def base_rope(config: dict) -> dict:
    """The base's RoPE as transformers 4.x spells it: its own top-level keys, else from rope_parameters."""
    if any(k in config for k in LEGACY_ROPE):
        return {k: config[k] for k in LEGACY_ROPE if k in config}
    params = config.get("rope_parameters")
    if not isinstance(params, dict) or "rope_theta" not in params:
        return {}
    scaling = {k: v for k, v in params.items() if k != "rope_theta"}
    return {"rope_theta": params["rope_theta"],
            "rope_scaling": scaling if scaling.get("rope_type", "default") != "default" else None}


def keep_base_rope(base_dir: Path, out_dir: Path) -> dict:
    """Write the base's 4.x RoPE keys into the merged config.json (the 5.x `rope_parameters` stay)."""
    want = base_rope(io.read_json(base_dir / "config.json"))
    path = out_dir / "config.json"
    merged = io.read_json(path)
    if want and any(merged.get(k) != v for k, v in want.items()):
        io.write_json(path, {**merged, **want})
    return want


def _rope_check(base_dir: Path, merged_dir: Path) -> dict:
    """The merged config.json's top-level RoPE keys (what transformers 4.57 / vLLM 0.17 read) equal the base's."""
    want = base_rope(io.read_json(base_dir / "config.json"))
    merged = io.read_json(merged_dir / "config.json")
    got = {k: merged.get(k) for k in want}
    return {"base": want, "merged": got, "ok": got == want}


# ----------------------------------------------------------------------------- checks
def _check_files(merged_dir: Path) -> dict:
    have = {f.name for f in merged_dir.iterdir()}
    missing = [n for n in ("config.json", "generation_config.json", "tokenizer_config.json") if n not in have]
    if not any(n.endswith(".safetensors") for n in have):
        missing.append("*.safetensors")
    stray = sorted(n for n in have if n.startswith("adapter_") or n == "lora_adapter")
    return {"missing": missing, "adapter_files": stray, "ok": not missing and not stray}


def verify_merge(
    base_dir: Path, source: AdapterSource | None, adapter_cfg: dict | None, merged_dir: Path, settings: dict
) -> dict:
    """Run every check against the merged folder ON DISK. Returns {check: {..., ok}}."""
    import torch
    from transformers import AutoTokenizer

    device = _device(settings["device"])
    checks: dict[str, dict] = {"files": _check_files(merged_dir)}
    if checks["files"]["ok"]:
        checks["rope"] = _rope_check(base_dir, merged_dir)
    tokenizer = AutoTokenizer.from_pretrained(base_dir)
    probes = _probe_inputs(tokenizer, settings["probe_prompts"])

    lora = source is not None and source.kind in ("peft_adapter", "verl_lora_adapter")
    noise = 0.0
    targets = None
    ref = base_logits = None
    if lora:
        from peft.utils import load_peft_weights

        keys = list(load_peft_weights(str(source.path), device="cpu"))
        targets = _target_weight_names(keys)
        base = _load_model(base_dir, device, torch.float32)
        base_logits = _logits(base, probes, device)
        saved = _saved_dtype(merged_dir)
        if saved is not None and saved != torch.float32:
            # What rounding the weights to the saved dtype alone does to the logits: the noise floor.
            rounded = _load_model(base_dir, device, saved).float()
            noise = max(float((a - b).abs().max()) for a, b in zip(_logits(rounded, probes, device), base_logits))
            del rounded
        model, checks["adapter_loaded"] = attach_adapter(base, source.path, adapter_cfg)
        ref = _logits(model, probes, device)
        del model, base

    checks["weights_differ"] = compare_weights(base_dir, merged_dir, targets)
    if lora and checks["adapter_loaded"]["nonzero_lora_B"] == 0:
        checks["weights_differ"]["hint"] = (
            "every lora_B tensor is zero: training never moved the adapter (equal rewards within each "
            "group give GRPO no gradient)"
        )

    try:
        merged = _load_model(merged_dir, device, torch.float32)
        merged_tok = AutoTokenizer.from_pretrained(merged_dir)
    except Exception as exc:  # noqa: BLE001 - any load failure is the check's answer
        checks["reload_generate"] = {"ok": False, "error": f"{type(exc).__name__}: {exc}"[:300]}
        merged = None
    if merged is not None:
        got = _logits(merged, probes, device)
        if lora:
            diff = max(float((a - b).abs().max()) for a, b in zip(got, ref))
            scale = max(float(r.abs().max()) for r in ref)
            effect = max(float((r - b).abs().max()) for r, b in zip(ref, base_logits))
            tol = max(settings["logits_atol"] + settings["logits_rtol"] * scale, settings["rounding_margin"] * noise)
            top1 = [float((a.argmax(-1) == b.argmax(-1)).float().mean()) for a, b in zip(got, ref)]
            checks["logits_match"] = {
                "ok": bool(diff <= tol),
                "max_abs_diff": diff,
                "tolerance": tol,
                "atol": settings["logits_atol"],
                "rtol": settings["logits_rtol"],
                "rounding_noise": noise,
                "rounding_margin": settings["rounding_margin"],
                "max_abs_ref": scale,
                "adapter_effect": effect,
                "top1_agreement": min(top1),
                "probes": len(probes),
                "positions": sum(len(p) for p in probes),
            }
        else:
            checks["logits_match"] = {"ok": True, "skipped": "full fine-tune: no adapter to compare with"}
        ids = torch.tensor([probes[0]], device=device)
        with torch.no_grad():
            out = merged.generate(
                input_ids=ids, attention_mask=torch.ones_like(ids), max_new_tokens=settings["max_new_tokens"],
                do_sample=False, pad_token_id=merged_tok.pad_token_id or merged_tok.eos_token_id,
            )
        new = out[0, ids.shape[1]:].tolist()
        finite = all(bool(torch.isfinite(g).all()) for g in got)
        checks["reload_generate"] = {
            "ok": len(new) > 0 and finite,
            "new_tokens": len(new),
            "finite_logits": finite,
            "sample": merged_tok.decode(new, skip_special_tokens=False)[:200],
        }
    return checks


def check_adapter_config(adapter_cfg: dict | None, configured: dict, repair: dict) -> dict:
    rank, alpha = adapter_cfg.get("r"), adapter_cfg.get("lora_alpha")
    report = {
        "rank": rank,
        "alpha": alpha,
        "configured_rank": configured.get("rank"),
        "configured_alpha": configured.get("alpha"),
        "target_modules": adapter_cfg.get("target_modules"),
        "dropout": adapter_cfg.get("lora_dropout"),
        "use_rslora": bool(adapter_cfg.get("use_rslora", False)),
        "base_model_name_or_path": adapter_cfg.get("base_model_name_or_path"),
        **repair,
    }
    problems = []
    if configured.get("rank") is None or configured.get("alpha") is None:
        problems.append("training config gives no lora_rank/lora_alpha to compare with")
    else:
        if rank != configured["rank"]:
            problems.append(f"rank {rank} != configured {configured['rank']}")
        if float(alpha or 0) != float(configured["alpha"]):
            problems.append(f"alpha {alpha} != configured {configured['alpha']}")
    report["problems"] = problems
    report["ok"] = not problems
    return report


def _failures(checks: dict) -> list[str]:
    out = []
    for name, c in checks.items():
        if c.get("ok"):
            continue
        if name == "weights_differ":
            if c["changed_tensors"] == 0:
                msg = "merged weights are identical to the base (nothing was merged)"
            else:
                msg = f"{c['n_unexpected_changed']} tensors outside the adapter's targets changed"
            out.append(f"{name}: {msg}" + (f"; {c['hint']}" if c.get("hint") else ""))
        elif name == "logits_match":
            out.append(f"{name}: max |merged - base+adapter| = {c['max_abs_diff']:.3g} > {c['tolerance']:.3g}")
        elif name == "adapter_loaded":
            out.append(f"{name}: {c['n_unexpected']} adapter tensors found no slot, "
                       f"{c['n_missing_lora']} LoRA slots got no tensor")
        elif name == "adapter_config":
            out.append(f"{name}: {'; '.join(c['problems'])}")
        elif name == "files":
            out.append(f"{name}: missing {c['missing']}, adapter files {c['adapter_files']}")
        elif name == "rope":
            out.append(f"{name}: config.json RoPE {c['merged']} differs from the base's {c['base']} "
                       "(transformers 4.x and vLLM read these keys)")
        else:
            out.append(f"{name}: {c.get('error', 'failed')}")
    return out


def _report(base_dir: Path, source: AdapterSource | None, merged: Path, checks: dict, extra: dict) -> dict:
    return {
        "ok": all(c.get("ok") for c in checks.values()),
        "base": str(base_dir),
        "adapter": str(source.given) if source else None,
        "adapter_resolved": str(source.path) if source else None,
        "source_kind": source.kind if source else None,
        "source_notes": source.notes if source else [],
        "merged": str(merged),
        "checked_utc": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
        **extra,
        "checks": checks,
    }


def _fail(report: dict, check_path: Path) -> None:
    failed_path = check_path.with_name(check_path.name.replace(".json", "") + ".failed.json")
    io.write_json(failed_path, report)
    raise CheckFailed(
        "merge check failed: " + " | ".join(_failures(report["checks"])) + f" (details: {failed_path})"
    )


def run_merge(base: str | Path, adapter: str | Path, out: str | Path, check: str | Path, cfg: dict) -> dict:
    """Merge and verify; the merged folder appears at `out` only when every check passed."""
    base_dir, out_dir, check_path = base_dir_of(base), Path(out), Path(check)
    settings = merge_settings(cfg.get("merge"))
    configured = configured_lora(cfg.get("train"))
    source = resolve_adapter(adapter)
    log.info("adapter source: %s at %s", source.kind, source.path)
    t0 = time.monotonic()
    check_path.unlink(missing_ok=True)
    if out_dir.exists():  # a stale merge must not survive a failing one
        shutil.rmtree(out_dir)
    with io.atomic_dir(out_dir) as tmp:
        adapter_cfg, repair = None, {}
        if source.kind in ("peft_adapter", "verl_lora_adapter"):
            adapter_cfg, repair = repair_alpha(read_adapter_config(source.path), configured, str(source.path))
            info = merge_lora(base_dir, source, adapter_cfg, tmp, settings)
        elif source.kind == "verl_fsdp_full":
            info = merge_verl_fsdp(source.path, tmp, base_dir)
        else:
            shutil.copytree(source.path, tmp, dirs_exist_ok=True)
            info = {"dtype": "as trained", "device": "cpu"}
        info["rope"] = keep_base_rope(base_dir, tmp)
        checks = verify_merge(base_dir, source, adapter_cfg, tmp, settings)
        if adapter_cfg is not None:
            checks["adapter_config"] = check_adapter_config(adapter_cfg, configured, repair)
        report = _report(base_dir, source, out_dir, checks, {**info, "seconds": 0.0})
        report["seconds"] = round(time.monotonic() - t0, 2)
        if not report["ok"]:
            _fail(report, check_path)
    io.write_json(check_path, report)
    check_path.with_name(check_path.name.replace(".json", "") + ".failed.json").unlink(missing_ok=True)
    log.info("merge check passed: %s", ", ".join(f"{k}=ok" for k in checks))
    return report


def run_check(base: str | Path, adapter: str | Path | None, merged: str | Path, check: str | Path,
              cfg: dict) -> dict:
    """Verify a merged folder made elsewhere (e.g. by verl's model_merger) against base + adapter."""
    base_dir, merged_dir, check_path = base_dir_of(base), Path(merged), Path(check)
    settings = merge_settings(cfg.get("merge"))
    configured = configured_lora(cfg.get("train"))
    if not (merged_dir / "config.json").is_file():
        raise InputError(f"{merged_dir}: merged folder has no config.json")
    source = resolve_adapter(adapter) if adapter else None
    adapter_cfg, repair = None, {}
    if source is not None and source.kind in ("peft_adapter", "verl_lora_adapter"):
        adapter_cfg, repair = repair_alpha(read_adapter_config(source.path), configured, str(source.path))
    checks = verify_merge(base_dir, source, adapter_cfg, merged_dir, settings)
    if adapter_cfg is not None:
        checks["adapter_config"] = check_adapter_config(adapter_cfg, configured, repair)
    report = _report(base_dir, source, merged_dir, checks, {})
    if not report["ok"]:
        _fail(report, check_path)
    io.write_json(check_path, report)
    return report


# ----------------------------------------------------------------------------- CLI
def _cmd_run(args: argparse.Namespace) -> None:
    run_merge(args.base, args.adapter, args.out, args.check, args.cfg)


def _cmd_check(args: argparse.Namespace) -> None:
    run_check(args.base, args.adapter, args.merged, args.check, args.cfg)


def register(sub: argparse._SubParsersAction) -> None:
    from llmrnn.cli import json_arg

    merge = sub.add_parser("merge", help="merge the LoRA into the base model and verify it")
    msub = merge.add_subparsers(dest="merge_command", required=True)
    cfg_help = 'JSON: {"merge": {...}, "train": {"lora_rank", "lora_alpha", ...}}'

    p = msub.add_parser("run", help="PEFT merge_and_unload + checks -> merged folder and merge_check.json")
    p.add_argument("--base", required=True, help="base model folder or its .ready marker")
    p.add_argument("--adapter", required=True, help="adapter folder or verl checkpoint path")
    p.add_argument("--out", required=True, help="output: merged HF model folder")
    p.add_argument("--check", required=True, help="output: merge_check.json")
    p.add_argument("--cfg", type=json_arg, default={}, help=cfg_help)
    p.set_defaults(func=_cmd_run)

    p = msub.add_parser("check", help="verify a merged folder made elsewhere (e.g. by verl's merger)")
    p.add_argument("--base", required=True)
    p.add_argument("--adapter", help="the adapter it should contain (omit for a full fine-tune)")
    p.add_argument("--merged", required=True)
    p.add_argument("--check", required=True, help="output: the check report JSON")
    p.add_argument("--cfg", type=json_arg, default={}, help=cfg_help)
    p.set_defaults(func=_cmd_check)
