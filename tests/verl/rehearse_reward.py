"""Runs INSIDE the verl 0.7.1 venv: the reward half of a GRPO step, with verl's own classes.

    .venv-verl-0.7.1/bin/python tests/verl/rehearse_reward.py --overrides o.json --responses r.json

1. composes verl's config with our overrides (check_verl.composed: what main_ppo does before a GPU);
2. verl's RLHFDataset loads data.train_files (our trajectory parquet) with the actor's tokenizer;
3. one batch as the rollout hands it to the reward (verl 0.7.1 DataProto: prompts left-padded from the
   chat template of each row's raw_prompt, as the agent loop renders it; responses right-padded; the
   attention mask over both; data_source / reward_model / extra_info from the dataset rows);
4. verl's RewardLoopWorker (experimental/reward_loop/reward_loop.py: what main_ppo's reward workers run,
   minus Ray) builds the configured reward manager (naive) with verl's get_custom_reward_fn and scores the
   batch sample by sample through our compute_score (pkg://llmrnn.reward + reward_kwargs).
Prints one JSON line; exits non-zero on any failure. Only vLLM/the actor (GPU) are left out.
"""

from __future__ import annotations

import argparse
import json
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--overrides", required=True)
    ap.add_argument("--responses", required=True, help="JSON list: the rollout's text for row i % len")
    args = ap.parse_args()
    with open(args.responses, encoding="utf-8") as fh:
        responses = json.load(fh)

    import verl
    from check_verl import _vllm_free_lora_rank_check, composed
    from reward_batch import reward_batch
    from verl.experimental.reward_loop.reward_loop import RewardLoopWorker
    from verl.utils import hf_tokenizer
    from verl.utils.dataset.rl_dataset import RLHFDataset
    from verl.utils.ray_utils import get_event_loop

    config = composed(args.overrides)
    _vllm_free_lora_rank_check()
    tok = hf_tokenizer(config.actor_rollout_ref.model.path)
    files = config.data.train_files
    files = [files] if isinstance(files, str) else list(files)
    ds = RLHFDataset(data_files=files, tokenizer=tok, config=config.data, processor=None)
    items = [ds[i] for i in range(len(ds))]
    texts = [responses[i % len(responses)] for i in range(len(items))]

    prompt_ids = [tok.apply_chat_template(it["raw_prompt"], add_generation_prompt=True, tokenize=True) for it in items]
    prompt_ids = [list(p["input_ids"]) if isinstance(p, dict) or hasattr(p, "keys") else list(p) for p in prompt_ids]
    response_ids = [tok(t, add_special_tokens=False)["input_ids"] for t in texts]
    batch = reward_batch(items, prompt_ids, response_ids, tok.pad_token_id or 0)
    worker = RewardLoopWorker(config)
    outputs = get_event_loop().run_until_complete(worker.compute_score_batch(batch))
    print(json.dumps({
        "verl": verl.__version__,
        "dataset_rows": len(ds),
        "reward_manager": type(worker.reward_manager).__module__ + "." + type(worker.reward_manager).__name__,
        "scores": [float(o["reward_score"]) for o in outputs],
        # numeric_only: the method arrives as parse_<method> = 1.0 (verl averages every extra key)
        "parse_methods": [next((k[len("parse_"):] for k, v in o["reward_extra_info"].items()
                                if k.startswith("parse_") and v == 1.0), None) for o in outputs],
        "extra_keys": sorted(outputs[0]["reward_extra_info"]),
        "patients": [it["extra_info"]["patient_id"] for it in items],
    }, default=str))
    return 0


if __name__ == "__main__":
    sys.exit(main())
