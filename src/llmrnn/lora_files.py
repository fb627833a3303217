"""What a saved LoRA adapter holds, read from its files: shared by the training guard and the merge."""

from __future__ import annotations

from pathlib import Path

from safetensors import safe_open

from llmrnn.errors import CheckFailed


def is_lora_key(name: str) -> bool:
    return "lora_A" in name or "lora_B" in name or "lora_embedding_" in name


def saved_lora_tensors(adapter_dir: Path) -> int:
    """LoRA tensors in adapter_dir's adapter_model.safetensors (or .bin); 0 when neither holds any."""
    st = adapter_dir / "adapter_model.safetensors"
    if st.is_file():
        try:
            with safe_open(str(st), framework="pt") as fh:
                return sum(1 for k in fh.keys() if is_lora_key(k))  # noqa: SIM118 - safe_open has no __iter__
        except Exception as exc:  # an unreadable file is a check failure, said in one line
            raise CheckFailed(f"{st}: not a readable safetensors file ({exc})") from exc
    binf = adapter_dir / "adapter_model.bin"
    if binf.is_file():
        import torch  # lazy: only for a .bin adapter; torch's import costs seconds

        return sum(1 for k in torch.load(binf, map_location="cpu", weights_only=True) if is_lora_key(k))
    return 0
