"""The adapter to merge: where it is (a PEFT folder or verl FSDP shards) and its LoRA config."""

from __future__ import annotations

import json
import re
import warnings
from dataclasses import dataclass, field
from pathlib import Path

from llmrnn.errors import CheckFailed, InputError
from llmrnn.models import model_folder

# Probe prompts when merge.probe_prompts is null: our own generic memory-update requests (no cohort text),
# rendered with the chat template.
DEFAULT_PROBES = [
    (
        'Memory so far: {"evolving_summary": "Long-standing hypertension, on two agents."} New visit: '
        "shortness of breath on exertion. Rewrite the memory as JSON."
    ),
    "Summarise in one JSON object what a clinician should remember after a visit for a fall at home.",
    'Return {"evolving_summary": "..."} for a first visit with fever and cough.',
]
FSDP_SHARD = re.compile(r"model_world_size_\d+_rank_\d+\.pt$")


def is_verl_engine_lora(actor: Path) -> bool:
    """verl 0.9's engine checkpoint of a LoRA run: FSDP shards + lora_train_meta.json, no lora_adapter/."""
    return (actor / "lora_train_meta.json").is_file() and any(FSDP_SHARD.search(f.name) for f in actor.iterdir())


@dataclass
class AdapterSource:
    """What `--adapter` points at, resolved."""

    kind: str  # peft_adapter | verl_lora_adapter | verl_fsdp_full | full_model
    path: Path  # the folder holding adapter_config.json (LoRA), the actor dir (FSDP) or the model dir
    given: Path
    notes: list[str] = field(default_factory=list)


# ----------------------------------------------------------------------------- locating inputs
def base_dir_of(path: str | Path) -> Path:
    """`--base` may be the model folder or its `.ready` marker (the rule's input)."""
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
    if is_verl_engine_lora(p):
        # verl 0.9's engine checkpoint of a LoRA run: the adapter is inside the FSDP shards, no lora_adapter/
        # (`llmrnn train run` gathers it itself: llmrnn.train.verl_adapter.adapter_from_checkpoint)
        raise CheckFailed(
            f"{p}: a verl 0.9 LoRA checkpoint (FSDP shards + lora_train_meta.json, no lora_adapter/); gather it "
            f"in the verl environment with `python -m verl.model_merger merge --backend fsdp --local_dir {p} "
            "--target_dir DIR` and merge DIR/lora_adapter"
        )
    if any(FSDP_SHARD.search(f.name) for f in p.iterdir() if f.is_file()):
        return AdapterSource("verl_fsdp_full", p, given, notes + ["FSDP shards without lora_adapter/"])
    if (p / "config.json").is_file() and any(p.glob("*.safetensors")):
        return AdapterSource("full_model", p, given, notes + ["full model folder (no adapter_config.json)"])
    raise InputError(
        f"{given}: no adapter found; expected adapter_config.json + adapter_model.safetensors (TRL), a verl "
        "checkpoint (global_step_N/actor/lora_adapter or FSDP shards) or a full HF model folder"
    )


def read_adapter_config(adapter_dir: Path) -> dict:
    """adapter_config.json as PEFT's own PeftConfig.from_pretrained reads it (PeftConfig.from_json_file: the
    `runtime_config` that verl 0.7.1 writes from asdict(LoraConfig) is dropped; it is only valid at runtime)."""
    from peft import PeftConfig

    path = adapter_dir / "adapter_config.json"
    try:
        with warnings.catch_warnings():  # PEFT warns that it ignores runtime_config: that is the point
            warnings.simplefilter("ignore")
            cfg = PeftConfig.from_json_file(str(path))
    except (OSError, json.JSONDecodeError) as exc:
        raise InputError(f"{path}: cannot read adapter config: {exc}") from exc
    if not isinstance(cfg, dict) or cfg.get("peft_type", "LORA") != "LORA":
        raise InputError(f"{path}: peft_type: expected LORA, got {cfg.get('peft_type')!r}")
    return cfg
