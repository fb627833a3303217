"""Runs INSIDE a verl venv: writes the actor folder of a verl FSDP FULL fine-tune (no LoRA) of a base model, as
verl's FSDP actor and its checkpoint manager leave it, for verl's own model merger to gather.

    .venv-verl-X/bin/python tests/verl/full_finetune_checkpoint.py --base DIR --out CHECKPOINTS/global_step_1/actor \
        [--attn sdpa|eager]

What is verl's own: the tokenizer (verl.utils.tokenizer.hf_tokenizer: pad = eos where the tokenizer has none)
and the config the actor trains with (verl.utils.model.update_model_config with the bos/eos/pad token ids,
as fsdp_workers._build_model_optimizer calls it, and our override_config's attn_implementation). STAND-IN:
the FSDP wrap and FSDPCheckpointManager.save_checkpoint on one rank, mirrored: the huggingface/ folder it
saves (the base's generation config, the model config, the tokenizer), model_world_size_1_rank_0.pt (the
module's state dict, plain tensors on one rank) and fsdp_config.json. The "training" moves every weight a
little, as a full fine-tune does, the tied embeddings together.
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--base", required=True)
    ap.add_argument("--out", required=True)
    # train.verl.attn_implementation: sdpa where flash-attn is absent; eager for a base sdpa does not run
    # (Gemma-2 in transformers 5)
    ap.add_argument("--attn", default="sdpa", choices=["sdpa", "eager"])
    args = ap.parse_args()

    import torch
    from transformers import AutoConfig, AutoModelForCausalLM, GenerationConfig
    from verl.utils.model import update_model_config
    from verl.utils.tokenizer import hf_tokenizer

    attn = args.attn  # what our override_config names (train.verl.attn_implementation)
    tokenizer = hf_tokenizer(args.base)
    config = AutoConfig.from_pretrained(args.base, attn_implementation=attn)
    update_model_config(config, override_config_kwargs={
        "bos_token_id": tokenizer.bos_token_id, "eos_token_id": tokenizer.eos_token_id,
        "pad_token_id": tokenizer.pad_token_id, "attn_implementation": attn})
    model = AutoModelForCausalLM.from_pretrained(args.base, torch_dtype=torch.float32, config=config,
                                                 attn_implementation=attn)
    torch.manual_seed(0)
    with torch.no_grad():
        for param in model.parameters():
            param.add_(torch.randn_like(param) * 1e-2)

    out = Path(args.out)
    hf = out / "huggingface"
    hf.mkdir(parents=True)
    try:  # fsdp_checkpoint_manager: the base's generation config, when it has one
        GenerationConfig.from_pretrained(model.config.name_or_path).save_pretrained(hf)
    except OSError:
        pass
    model.config.save_pretrained(hf)
    tokenizer.save_pretrained(hf)
    torch.save(model.state_dict(), out / "model_world_size_1_rank_0.pt")
    (out / "fsdp_config.json").write_text(json.dumps({"FSDP_version": 1, "world_size": 1}))
    print(json.dumps({"actor": str(out), "config": json.loads((hf / "config.json").read_text())}))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
