"""RoPE settings for every reader: the merged config.json carries the base's values in both spellings."""

from __future__ import annotations

from pathlib import Path

from llmrnn import io

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
