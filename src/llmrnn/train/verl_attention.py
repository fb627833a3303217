"""The attention verl's actor runs with: train.verl.attn_implementation resolved (`auto`: whether flash-attn
imports in the Python that runs main_ppo, a probe in a child process). The Hydra overrides render it
(llmrnn.train.verl_overrides), the training summary and the model card quote it."""

from __future__ import annotations

import subprocess

from llmrnn.safe_path import safe_path_env

FLASH_PROBE = "import flash_attn, flash_attn.bert_padding; print(flash_attn.__version__)"


def resolve_attention(configured: str, python: str | None = None) -> dict:
    """train.verl.attn_implementation as it runs: `auto` is flash_attention_2 (with verl's remove-padding, as
    the reference's verl+vLLM image ran) where flash-attn imports in the Python that runs main_ppo, else sdpa.
    Returns {configured, ran, use_remove_padding, flash_attn (version or None), why}: the training summary's
    `attention`, which the model card quotes."""
    if configured != "auto":
        return {"configured": configured, "ran": configured, "use_remove_padding": configured == "flash_attention_2",
                "flash_attn": None, "why": "set in train.verl.attn_implementation"}
    if python is None:  # this process (check, rendering); training asks the Python that runs main_ppo
        try:
            import flash_attn
            import flash_attn.bert_padding  # verl's remove-padding imports it

            version, tail = str(flash_attn.__version__), ""
        except (ImportError, OSError, RuntimeError) as exc:  # a CUDA/ABI error too
            version, tail = None, f"{type(exc).__name__}: {exc}"[:200]
    else:
        proc = subprocess.run([python, "-c", FLASH_PROBE], capture_output=True, text=True, timeout=300, check=False,
                              env=safe_path_env())
        version = proc.stdout.strip().splitlines()[-1] if proc.returncode == 0 and proc.stdout.strip() else None
        tail = (proc.stderr.strip().splitlines() or ["no output"])[-1][:200]
    ran = "flash_attention_2" if version else "sdpa"
    why = (f"auto: flash-attn {version} imports" if version else f"auto: flash-attn does not import ({tail})")
    return {"configured": "auto", "ran": ran, "use_remove_padding": bool(version), "flash_attn": version,
            "why": why}

