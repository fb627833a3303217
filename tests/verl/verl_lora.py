"""A LoRA adapter folder written the way verl 0.7.1's FSDP worker writes `global_step_N/actor/lora_adapter/`
(verl/workers/fsdp_workers.py ActorRolloutRefWorker.save_checkpoint), for a PEFT model on CPU:

    peft_config = asdict(peft_model.peft_config["default"])   # every dataclass field, runtime_config too
    peft_config["task_type"] = peft_config["task_type"].value
    peft_config["peft_type"] = peft_config["peft_type"].value
    peft_config["target_modules"] = list(peft_config["target_modules"])
    save_file(layered_summon_lora_params(fsdp_module), ".../adapter_model.safetensors")
    json.dump(peft_config, f, ensure_ascii=False, indent=4)

layered_summon_lora_params needs FSDP-wrapped submodules (it summons each one's full parameters); for a LoRA on
the decoder layers it yields get_peft_model_state_dict's keys under `base_model.model.model.layers.<i>.`, which
is what get_peft_model_state_dict of the whole (unwrapped) model gives here. Importable from the main venv and
from the verl venvs (plain PEFT + safetensors).
"""

from __future__ import annotations

import json
import os
from dataclasses import asdict


def save_like_verl_071(peft_model, lora_save_path: str) -> str:
    from peft.utils.save_and_load import get_peft_model_state_dict
    from safetensors.torch import save_file

    os.makedirs(lora_save_path, exist_ok=True)
    peft_config = asdict(peft_model.peft_config.get("default", {}))
    peft_config["task_type"] = peft_config["task_type"].value
    peft_config["peft_type"] = peft_config["peft_type"].value
    peft_config["target_modules"] = list(peft_config["target_modules"])
    params = {k: v.detach().cpu().contiguous() for k, v in get_peft_model_state_dict(peft_model).items()}
    save_file(params, os.path.join(lora_save_path, "adapter_model.safetensors"))
    with open(os.path.join(lora_save_path, "adapter_config.json"), "w", encoding="utf-8") as f:
        json.dump(peft_config, f, ensure_ascii=False, indent=4)
    return lora_save_path
