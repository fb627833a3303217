"""CPU STAND-IN for `python -m verl.trainer.main_ppo` (no GPU here: verl's trainer needs GPUs in the Ray
cluster). It does what verl does with the cluster, not the training: joins the Ray cluster through
`ray.init()` (RAY_ADDRESS and the token from `llmrnn train run`), asserts it has trainer.nnodes alive
nodes, runs one task on each node that calls the real reward (llmrnn.reward.compute_score, with verl's
reward_kwargs) against the real judge service, writes what it saw to standin_report.json and a
checkpoint the wrapper accepts. STANDIN_HOLD_FILE: after scoring, touch that file and wait (a test
kills the job then)."""

import json
import os
import sys
import time
from pathlib import Path

import ray
from peft import LoraConfig, get_peft_model
from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy
from transformers import AutoModelForCausalLM


def hydra_str(value):
    """A quoted Hydra override value as the string Hydra reads (llmrnn.train.verl_overrides._hydra_value quotes)."""
    if len(value) >= 2 and value[0] == value[-1] == "'":
        return value[1:-1].replace("\\'", "'").replace("\\\\", "\\")
    return value


args = dict(a.split("=", 1) for a in sys.argv[1:] if "=" in a)
prefix = "+reward.custom_reward_function.reward_kwargs."
reward_kwargs = {k[len(prefix):]: hydra_str(v) for k, v in args.items() if k.startswith(prefix)}
reward_kwargs["numeric_only"] = reward_kwargs.get("numeric_only") == "true"
want = int(args["trainer.nnodes"])
out = Path(args["trainer.default_local_dir"]).parent

ray.init()
alive = [n for n in ray.nodes() if n["Alive"]]
assert len(alive) == want, f"{len(alive)} Ray nodes alive, trainer.nnodes={want}"


@ray.remote(num_cpus=1)
def score_here(ground_truth: str, kwargs: dict) -> dict:
    from llmrnn.reward import compute_score

    result = compute_score("llm_as_rnn_memory_update", json.dumps({"evolving_summary": "CKD stage 3, HTN"}),
                           ground_truth, {"index": 0}, **kwargs)
    return {"slurm_node": os.environ.get("SLURMD_NODENAME"), "ip": ray.util.get_node_ip_address(),
            "pid": os.getpid(), "result": result}


ground_truth = os.environ["STANDIN_GROUND_TRUTH"]
refs = [score_here.options(scheduling_strategy=NodeAffinitySchedulingStrategy(n["NodeID"], soft=False))
        .remote(ground_truth, reward_kwargs) for n in alive]
report = {"ray_nodes": [{"ip": n["NodeManagerAddress"], "resources": n["Resources"]} for n in alive],
          "tasks": ray.get(refs), "ray_address": os.environ.get("RAY_ADDRESS")}
(out / "standin_report.json").write_text(json.dumps(report, indent=1))

if os.environ.get("STANDIN_HOLD_FILE"):
    Path(os.environ["STANDIN_HOLD_FILE"]).write_text(str(os.getpid()))
    while True:
        time.sleep(1)

steps = int(args["trainer.total_training_steps"])
score = report["tasks"][0]["result"]["score"]
Path(os.environ["VERL_FILE_LOGGER_PATH"]).write_text(
    "".join(json.dumps({"step": s, "data": {"critic/score/mean": score}}) + "\n" for s in range(1, steps + 1)))
ckpt = Path(args["trainer.default_local_dir"])
adapter = ckpt / f"global_step_{steps}" / "actor" / "lora_adapter"
adapter.mkdir(parents=True, exist_ok=True)
# An untrained LoRA of the configured shape, saved by PEFT as verl's checkpoint saves it: `llmrnn train run`
# refuses an adapter without one LoRA tensor per targeted slot (an empty adapter is a silent no-op merge).
targets = [t.strip(" '\"") for t in hydra_str(args["actor_rollout_ref.model.target_modules"]).strip("[]").split(",")]
base = AutoModelForCausalLM.from_pretrained(hydra_str(args["actor_rollout_ref.model.path"]))
get_peft_model(base, LoraConfig(r=int(args["actor_rollout_ref.model.lora_rank"]), target_modules=targets,
                                lora_alpha=int(args["actor_rollout_ref.model.lora_alpha"]))).save_pretrained(adapter)
(ckpt / "latest_checkpointed_iteration.txt").write_text(str(steps))
