"""What a saved LoRA adapter holds, read from its files, and the one repair of its alpha: shared by the
training guard, verl's adapter step and the merge."""

from __future__ import annotations

import logging
from collections.abc import Mapping
from pathlib import Path

from safetensors import safe_open

from llmrnn.errors import CheckFailed

log = logging.getLogger(__name__)


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


def repair_alpha(adapter_cfg: Mapping, where: str, sources: list[tuple[str, int | None]]) -> tuple[dict, dict]:
    """(config, record) of an adapter_config.json whose lora_alpha is 0 or missing, what verl's model merger
    writes for a LoRA (0.7.1 always; 0.9 without lora_train_meta.json): the alpha is set from the first of
    `sources` ((name, alpha), most trusted first) that has one, and the record says so
    ({original_alpha, alpha_repaired, repaired_from}). A config with a real alpha is returned as it is."""
    original = adapter_cfg.get("lora_alpha")
    fixed = dict(adapter_cfg)
    record = {"original_alpha": original, "alpha_repaired": False, "repaired_from": None}
    if original not in (0, None):
        return fixed, record
    source, alpha = next(((name, a) for name, a in sources if a), (None, None))
    if source is None:
        raise CheckFailed(f"{where}: lora_alpha is {original!r} (verl's model merger writes 0) and none of "
                          f"{[name for name, _ in sources]} gives one to repair it from")
    fixed["lora_alpha"] = alpha
    record.update(alpha_repaired=True, repaired_from=source)
    log.warning("%s: lora_alpha=%r in adapter_config.json (verl's model merger writes 0); set to %s from %s",
                where, original, alpha, source)
    return fixed, record
