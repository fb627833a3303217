"""Runs INSIDE the verl 0.7.1 venv: verl's own batch assembly on our real reward outputs, in every order.

    .venv-verl-0.7.1/bin/python tests/verl/assemble_batch.py --samples s.json --dump DIR [--samples ... --dump ...] --model TOKENIZER_DIR

Each sample ({name, path, reward_kwargs, data_source, solution_str, ground_truth}) is scored as a GRPO step
scores it: verl's get_custom_reward_fn loads our function (pkg://llmrnn.reward or pkg://llmrnn.qa.rewards,
with the rendered reward_kwargs) and verl's NaiveRewardManager.run_single calls it on a one-item DataProto
(the response decoded by the tokenizer). Then, for every permutation of the samples:
- one agent-loop worker holding them all: AgentLoopWorker._postprocess (verl builds the reward extras from
  the FIRST sample's keys: a key missing later is a KeyError);
- one worker per sample: _postprocess each, then DataProto.concat (what the trainer does with the workers'
  chunks: a missing key or a different `reward_extra_keys` list is an AssertionError).
Then the trainer's half, on all samples in one worker's batch: verl's extract_reward (what fit() hands on as
reward_extra_infos_dict) and RayPPOTrainer._log_rollout_data -> _dump_generations, the trainer's own methods on
a trainer object that holds only what they read (tokenizer, global_steps; a stand-in for the rest), writing
`<dump>/1.jsonl` as `trainer.rollout_data_dir` makes fit() do every step (0.7.1: json.dumps of numpy values).
Prints one JSON line per sample set, in order: {"verl", "orders", "failures": [...], "keys": {name: [...]},
"dump": [rows] | error}; exits 0 when it ran.
"""

from __future__ import annotations

import argparse
import itertools
import json
import os
import sys
import types


def main() -> int:
    ap = argparse.ArgumentParser()
    # one or more sample sets, each with its own dump folder: one interpreter (verl, torch) for them all
    ap.add_argument("--samples", required=True, action="append")
    ap.add_argument("--model", required=True)
    ap.add_argument("--dump", required=True, action="append", help="the rollout_data_dir the trainer dumps into")
    args = ap.parse_args()

    import numpy as np
    import torch
    import verl
    from omegaconf import OmegaConf
    from verl import DataProto
    from verl.experimental.agent_loop.agent_loop import AgentLoopWorker, _InternalAgentLoopOutput
    from verl.experimental.reward_loop.reward_manager.naive import NaiveRewardManager
    from verl.trainer.ppo.ray_trainer import RayPPOTrainer
    from verl.trainer.ppo.reward import extract_reward, get_custom_reward_fn
    from verl.utils import hf_tokenizer

    tok = hf_tokenizer(args.model)
    for samples_file, dump_dir in zip(args.samples, args.dump, strict=True):
        with open(samples_file, encoding="utf-8") as fh:
            samples = json.load(fh)
        scored = []
        for s in samples:
            config = OmegaConf.create({"reward": {"custom_reward_function": {
                "path": s["path"], "name": "compute_score", "reward_kwargs": s["reward_kwargs"]}}})
            manager = NaiveRewardManager(config, tok, get_custom_reward_fn(config))
            ids = tok(s["solution_str"], add_special_tokens=False)["input_ids"] or [tok.eos_token_id]
            item = DataProto.from_dict(
                tensors={"responses": torch.tensor([ids]), "attention_mask": torch.ones(1, len(ids) + 2, dtype=torch.long),
                         "prompts": torch.zeros(1, 2, dtype=torch.long)},
                non_tensors={"data_source": np.array([s["data_source"]], dtype=object),
                             "reward_model": np.array([{"ground_truth": s["ground_truth"]}], dtype=object),
                             "extra_info": np.array([{"index": 0, "split": "train"}], dtype=object)},
            )
            scored.append((s["name"], manager.loop.run_until_complete(manager.run_single(item))))

        def output(result: dict) -> _InternalAgentLoopOutput:
            # an agent loop's padded output for a 2-token prompt and a 3-token response (the tensors don't matter)
            t = lambda *v: torch.tensor([list(v)])
            return _InternalAgentLoopOutput(
                prompt_ids=t(1, 2), response_ids=t(3, 4, 0), input_ids=t(1, 2, 3, 4, 0), position_ids=t(0, 1, 2, 3, 4),
                response_mask=t(1, 1, 0), attention_mask=t(1, 1, 1, 1, 0), reward_score=result["reward_score"],
                num_turns=2, metrics={}, extra_fields={"reward_extra_info": result["reward_extra_info"]},
            )

        worker = types.SimpleNamespace(reward_loop_worker_handles=[object()])  # rewards came from the reward loop
        failures, orders = [], 0
        for order in itertools.permutations(range(len(scored))):
            orders += 1
            names = [scored[i][0] for i in order]
            for how in ("one worker", "one worker per sample"):
                try:
                    if how == "one worker":
                        AgentLoopWorker._postprocess(worker, [output(scored[i][1]) for i in order])
                    else:
                        chunks = [AgentLoopWorker._postprocess(worker, [output(scored[i][1])]) for i in order]
                        merged = DataProto.concat(chunks)
                        assert len(merged) == len(order)
                except Exception as exc:  # noqa: BLE001 - reported, the test asserts there are none
                    failures.append({"order": names, "how": how, "error": f"{type(exc).__name__}: {exc}"})
        # the trainer's rollout dump, as fit() runs it after the reward (trainer.rollout_data_dir is set)
        batch = AgentLoopWorker._postprocess(worker, [output(r) for _, r in scored])
        batch.batch["token_level_scores"] = batch.batch["rm_scores"]  # fit(): reward_tensor from extract_reward
        _, reward_extra_infos_dict = extract_reward(batch)
        trainer = object.__new__(RayPPOTrainer)  # stand-in: only the attributes the dump reads
        trainer.tokenizer, trainer.global_steps = tok, 1
        if hasattr(RayPPOTrainer, "_init_dump_executor"):  # 0.9: the dump runs on a background thread
            trainer._init_dump_executor()
        try:
            trainer._log_rollout_data(batch, reward_extra_infos_dict, {}, dump_dir)
            if hasattr(RayPPOTrainer, "_shutdown_dump_executor"):
                trainer._shutdown_dump_executor()
            with open(os.path.join(dump_dir, "1.jsonl"), encoding="utf-8") as fh:
                dump = [json.loads(line) for line in fh if line.strip()]
        except Exception as exc:  # noqa: BLE001 - reported, the test asserts there is none
            dump = f"{type(exc).__name__}: {exc}"
        print(json.dumps({"verl": verl.__version__, "orders": orders, "failures": failures,
                          "keys": {name: list(r["reward_extra_info"]) for name, r in scored},
                          "scores": {name: float(r["reward_score"]) for name, r in scored}, "dump": dump}, default=str))
    return 0


if __name__ == "__main__":
    sys.exit(main())
