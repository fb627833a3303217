"""Runs INSIDE the locked GPU venv without CUDA (`make .venv-gpu-cpu/.installed-llmrnn`: envs/gpu-lock.txt's
transformers 4.57 with CPU torch): loads the actor the way verl 0.7.1's FSDP worker does, with the model
settings our overrides composed to (tests/verl/check_verl.py reports them from verl's own config).

    .venv-gpu-cpu/bin/python tests/verl/load_actor.py --model DIR --settings settings.json

verl itself cannot be imported in that venv (it carries the lock minus torch/CUDA, and verl is not a
dependency of llmrnn), so this mirrors verl 0.7.1's code line by line, citing it:
- verl/workers/fsdp_workers.py, ActorRolloutRefWorker._build_model_optimizer (lines 393-475 of 0.7.1):
  attn_implementation = override_model_config.get("attn_implementation", "flash_attention_2");
  AutoConfig.from_pretrained(local_path, trust_remote_code=..., attn_implementation=...);
  update_model_config(config, {bos,eos,pad token ids} | override_model_config) (verl/utils/model.py: setattr);
  AutoModelForCausalLM.from_pretrained(pretrained_model_name_or_path=local_path, torch_dtype=float32 (actor),
  config=..., trust_remote_code=..., attn_implementation=...);
- use_remove_padding: verl/workers/actor/dp_actor.py's forward unpads through verl/utils/attention_utils.py
  _get_attention_functions, which on CUDA runs `from flash_attn.bert_padding import index_first_axis,
  pad_input, rearrange, unpad_input`.
Then one forward pass on CPU. Prints one JSON line; exits 1 with `ImportError: ...` on stderr when the load
fails the way it would on the GPU node.
"""

from __future__ import annotations

import argparse
import json
import sys


def load_like_verl(local_path: str, override_model_config: dict, use_remove_padding: bool):
    import torch
    from transformers import AutoConfig, AutoModelForCausalLM, AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(local_path)
    attn_implementation = override_model_config.get("attn_implementation", "flash_attention_2")
    actor_model_config = AutoConfig.from_pretrained(local_path, trust_remote_code=False,
                                                    attn_implementation=attn_implementation)
    override_config_kwargs = {"bos_token_id": tokenizer.bos_token_id, "eos_token_id": tokenizer.eos_token_id,
                              "pad_token_id": tokenizer.pad_token_id}
    override_config_kwargs.update(override_model_config)
    for key, val in override_config_kwargs.items():  # verl.utils.model.update_model_config (flat keys here)
        setattr(actor_model_config, key, val)
    actor_module = AutoModelForCausalLM.from_pretrained(
        pretrained_model_name_or_path=local_path, torch_dtype=torch.float32, config=actor_model_config,
        trust_remote_code=False, attn_implementation=attn_implementation,
    )
    if use_remove_padding:
        from flash_attn.bert_padding import index_first_axis, pad_input, rearrange, unpad_input  # noqa: F401
    return tokenizer, actor_module


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--model", required=True)
    ap.add_argument("--settings", required=True, help="JSON {model_override_config, use_remove_padding}")
    args = ap.parse_args()
    with open(args.settings, encoding="utf-8") as fh:
        settings = json.load(fh)
    import torch
    import transformers

    try:
        tokenizer, model = load_like_verl(args.model, settings["model_override_config"], settings["use_remove_padding"])
    except ImportError as exc:
        print(f"ImportError: {exc}", file=sys.stderr)
        return 1
    ids = tokenizer("a patient visit", return_tensors="pt")
    with torch.no_grad():
        logits = model(**ids).logits
    print(json.dumps({"transformers": transformers.__version__, "attn_implementation": model.config._attn_implementation,
                      "logits_shape": list(logits.shape), "finite": bool(torch.isfinite(logits).all())}))
    return 0


if __name__ == "__main__":
    sys.exit(main())
