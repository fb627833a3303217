"""The merge check: files, adapter config, logits, weights and RoPE of the merged folder against the base
and the adapter; the report and its failures."""

from __future__ import annotations

import time
from pathlib import Path

from llmrnn import io
from llmrnn.errors import CheckFailed
from llmrnn.merge.adapter import DEFAULT_PROBES, AdapterSource
from llmrnn.merge.weights import (
    _device,
    _load_model,
    _logits,
    _probe_inputs,
    _saved_dtype,
    _target_weight_names,
    attach_adapter,
    compare_weights,
)
from llmrnn.rope import _rope_check
from llmrnn.settings.release import Merge
from llmrnn.settings.train import TrainLora


# ----------------------------------------------------------------------------- checks
def _check_files(merged_dir: Path) -> dict:
    have = {f.name for f in merged_dir.iterdir()}
    missing = [n for n in ("config.json", "generation_config.json", "tokenizer_config.json") if n not in have]
    if not any(n.endswith(".safetensors") for n in have):
        missing.append("*.safetensors")
    stray = sorted(n for n in have if n.startswith("adapter_") or n == "lora_adapter")
    return {"missing": missing, "adapter_files": stray, "ok": not missing and not stray}


def verify_merge(
    base_dir: Path, source: AdapterSource | None, adapter_cfg: dict | None, merged_dir: Path, settings: Merge
) -> dict:
    """Run every check against the merged folder ON DISK. Returns {check: {..., ok}}."""
    import torch
    from transformers import AutoTokenizer

    device = _device(settings.device)
    checks: dict[str, dict] = {"files": _check_files(merged_dir)}
    if checks["files"]["ok"]:
        checks["rope"] = _rope_check(base_dir, merged_dir)
    tokenizer = AutoTokenizer.from_pretrained(base_dir)
    probes = _probe_inputs(tokenizer, settings.probe_prompts or DEFAULT_PROBES)

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
    if lora and checks["adapter_loaded"]["adapter_tensors"] == 0:
        checks["weights_differ"]["hint"] = (
            "the adapter is empty (no LoRA tensor saved): the trainer's LoRA collection wrote nothing"
        )
    elif lora and checks["adapter_loaded"]["nonzero_lora_B"] == 0:
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
            tol = max(settings.logits_atol + settings.logits_rtol * scale, settings.rounding_margin * noise)
            top1 = [float((a.argmax(-1) == b.argmax(-1)).float().mean()) for a, b in zip(got, ref)]
            checks["logits_match"] = {
                "ok": bool(diff <= tol),
                "max_abs_diff": diff,
                "tolerance": tol,
                "atol": settings.logits_atol,
                "rtol": settings.logits_rtol,
                "rounding_noise": noise,
                "rounding_margin": settings.rounding_margin,
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
                input_ids=ids, attention_mask=torch.ones_like(ids), max_new_tokens=settings.max_new_tokens,
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


def check_adapter_config(adapter_cfg: dict, lora: TrainLora, repair: dict) -> dict:
    """The adapter's rank and alpha (after any repair) against the configured train.lora."""
    rank, alpha = adapter_cfg.get("r"), adapter_cfg.get("lora_alpha")
    report = {
        "rank": rank,
        "alpha": alpha,
        "configured_rank": lora.rank,
        "configured_alpha": lora.alpha,
        "target_modules": adapter_cfg.get("target_modules"),
        "dropout": adapter_cfg.get("lora_dropout"),
        "use_rslora": bool(adapter_cfg.get("use_rslora", False)),
        "base_model_name_or_path": adapter_cfg.get("base_model_name_or_path"),
        **repair,
    }
    problems = []
    if rank != lora.rank:
        problems.append(f"rank {rank} != configured {lora.rank} (train.lora.rank)")
    if float(alpha or 0) != float(lora.alpha):
        problems.append(f"alpha {alpha} != configured {lora.alpha} (train.lora.alpha)")
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
