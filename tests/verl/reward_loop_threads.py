"""Runs INSIDE a verl venv (0.7.1 or 0.9.1): your own reward (reward.custom) through verl's own reward loop,
many samples in flight at once, as main_ppo's reward workers score a step.

    .venv-verl-0.7.1/bin/python tests/verl/reward_loop_threads.py --overrides o.json --rounds 3

The overrides are those `llmrnn train run` builds for reward.custom (reward.custom_reward_function names
pkg://llmrnn.reward:custom_compute_score, the reward settings in its reward_kwargs). verl's RewardLoopWorker
(what each reward-loop Ray actor runs, minus Ray) builds its naive reward manager with verl's own
get_custom_reward_fn; compute_score_batch starts one task per sample and NaiveRewardManager.run_single runs each
synchronous compute_score in the event loop's thread pool (loop.run_in_executor), so several threads call our
wrapper at once. Every row's response is its own ("answer <i>"); the reward under test derives the score from
the row's extra_info index and its solution_str. Prints one JSON line: each round's scores and the pool's size.
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
    ap.add_argument("--rounds", type=int, default=3)
    args = ap.parse_args()

    import verl
    from check_verl import composed
    from reward_batch import reward_batch
    from verl.experimental.reward_loop.reward_loop import RewardLoopWorker
    from verl.utils import hf_tokenizer
    from verl.utils.dataset.rl_dataset import RLHFDataset
    from verl.utils.ray_utils import get_event_loop

    config = composed(args.overrides)
    tok = hf_tokenizer(config.actor_rollout_ref.model.path)
    files = config.data.train_files
    ds = RLHFDataset(data_files=[files] if isinstance(files, str) else list(files), tokenizer=tok,
                     config=config.data, processor=None)
    items = [ds[i] for i in range(len(ds))]
    response_ids = [tok(f"answer {i}", add_special_tokens=False)["input_ids"] for i in range(len(items))]
    prompt_ids = [tok("prompt", add_special_tokens=False)["input_ids"]] * len(items)
    batch = reward_batch(items, prompt_ids, response_ids, tok.pad_token_id or 0)
    worker = RewardLoopWorker(config)
    loop = get_event_loop()
    rounds, errors = [], []
    for _ in range(args.rounds):
        try:
            outputs = loop.run_until_complete(worker.compute_score_batch(batch))
        except Exception as exc:  # noqa: BLE001 - reported, the test names it
            errors.append(f"{type(exc).__name__}: {exc}")
            continue
        rounds.append([float(o["reward_score"]) for o in outputs])
    pool = getattr(loop, "_default_executor", None)
    print(json.dumps({
        "verl": verl.__version__,
        "reward_manager": type(worker.reward_manager).__name__,
        "indices": [int(it["extra_info"]["index"]) for it in items],
        "rounds": rounds,
        "errors": errors,
        "pool_threads": getattr(pool, "_max_workers", None),
    }))
    return 0


if __name__ == "__main__":
    sys.exit(main())
