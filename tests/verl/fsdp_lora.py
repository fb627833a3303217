"""Runs INSIDE a verl 0.7.1 venv: verl's own FSDP ActorRolloutRefWorker (role "actor") on a tiny real model
over 2 CPU ranks (torch.distributed gloo), and the two places its LoRA adapter leaves the actor:

- the weight sync's collector: `collect_lora_params(actor_module_fsdp, layered_summon, base_sync_done=True)`,
  what ActorRolloutRefWorker.rollout_mode hands vLLM before every rollout (rollout_mode itself ends in the
  vLLM server's update_weights, which needs the GPU: the collector is called as it calls it);
- `save_checkpoint` (the FSDP checkpoint manager's shards and actor/lora_adapter/) and `load_checkpoint`.

Real: verl's worker __init__/init_model (its FSDP1 wrap with get_fsdp_wrap_policy(is_lora=True), PEFT LoRA,
optimizer, FSDPCheckpointManager), the installed PEFT. Between the two syncs one optimizer step moves the LoRA
tensors (verl's update_actor needs a rollout batch; the step is its optimizer's). llmrnn's LoRA guard
(llmrnn.train.lora_guard.install, as the Ray worker hook installs it) wraps verl's code first; the collector is
also called unwrapped, to count what verl alone hands over. Stand-ins: the accelerator memory counters, and
FSDP1's sync_module_states (see CPUFullyShardedDataParallel).

    .venv-verl-0.7.1/bin/python tests/verl/fsdp_lora.py --model DIR --out REPORT.json --ckpt CKPT_DIR

Writes {"peft", "slots", "collected", "collected_after_update", "saved_tensors", "adapter_bytes", "reloaded",
"guard_sync" | "guard_sync_after_update" | "guard_save" (the guard's one line, where it failed)} (rank 0).
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import traceback


def overrides(model: str, ckpt: str) -> list[str]:
    return [
        f"actor_rollout_ref.model.path={model}", "actor_rollout_ref.model.lora_rank=8",
        "actor_rollout_ref.model.lora_alpha=16", "actor_rollout_ref.model.target_modules=all-linear",
        "actor_rollout_ref.model.use_remove_padding=false",
        "+actor_rollout_ref.model.override_config.attn_implementation=sdpa",
        "actor_rollout_ref.actor.ppo_mini_batch_size=2", "actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu=1",
        "actor_rollout_ref.actor.fsdp_config.param_offload=false", "actor_rollout_ref.rollout.name=vllm",
        "actor_rollout_ref.rollout.layered_summon=true", "actor_rollout_ref.rollout.load_format=safetensors",
        "actor_rollout_ref.rollout.log_prob_micro_batch_size_per_gpu=1", "actor_rollout_ref.rollout.n=2",
        "actor_rollout_ref.ref.log_prob_micro_batch_size_per_gpu=1", "trainer.n_gpus_per_node=2",
        f"trainer.default_local_dir={ckpt}", "data.train_batch_size=2",
    ]


def rank_main(rank: int, world: int, args) -> None:
    os.environ.update(RANK=str(rank), LOCAL_RANK=str(rank), WORLD_SIZE=str(world))
    from llmrnn.train import lora_guard
    from llmrnn.train.lora_guard import WATCH, LoraGuardError, lora_slots

    lora_guard.install()  # as the Ray worker hook does (verl_overrides.WORKER_SETUP_HOOK)
    import torch
    import torch.distributed as dist
    import verl
    import verl.workers.fsdp_workers as fw
    from hydra import compose, initialize_config_dir
    from verl.utils.fsdp_utils import collect_lora_params  # noqa: F401 - the guard wraps this name first
    from verl.workers.fsdp_workers import ActorRolloutRefWorker

    for name in ("memory_reserved", "memory_allocated", "max_memory_allocated", "max_memory_reserved"):
        if not hasattr(torch.cpu, name):  # STAND-IN: the accelerator memory counters verl logs read 0 on CPU
            setattr(torch.cpu, name, lambda *a, **k: 0)
    for name in ("empty_cache", "reset_peak_memory_stats", "ipc_collect"):
        if not hasattr(torch.cpu, name):
            setattr(torch.cpu, name, lambda *a, **k: None)
    if not hasattr(torch.cpu, "mem_get_info"):
        torch.cpu.mem_get_info = lambda *a, **k: (0, 0)
    torch.manual_seed(0)  # both ranks init the LoRA tensors alike (stands in for sync_module_states, below)
    from torch.distributed.fsdp import FullyShardedDataParallel

    class CPUFullyShardedDataParallel(FullyShardedDataParallel):
        """STAND-IN detail: FSDP1 refuses CPU parameters with sync_module_states=True (verl's setting, which
        broadcasts rank 0's weights from GPU); on CPU each rank loads the same weights and seed instead."""

        def __init__(self, *a, **kw):
            kw.update(sync_module_states=False, device_id=torch.device("cpu"))
            super().__init__(*a, **kw)

    fw.FSDP = CPUFullyShardedDataParallel  # the worker's own wrap call, policy and settings otherwise
    dist.init_process_group("gloo", rank=rank, world_size=world)
    config_dir = os.path.join(os.path.dirname(verl.__file__), "trainer", "config")
    with initialize_config_dir(config_dir=config_dir, version_base=None):
        config = compose(config_name="ppo_trainer", overrides=overrides(args.model, args.ckpt))
    report: dict = {"rank": rank}
    import peft

    report["peft"] = peft.__version__
    try:
        worker = ActorRolloutRefWorker(config.actor_rollout_ref, role="actor")
        worker.init_model()
        module = worker.actor_module_fsdp
        report["slots"] = lora_slots(module)
        report["fsdp"] = type(module).__name__
        layered = bool(config.actor_rollout_ref.rollout.layered_summon)
        guarded = fw.collect_lora_params  # the guard's wrapper where it is installed
        raw = getattr(guarded, "__wrapped__", guarded)

        def sync(collect):  # what rollout_mode hands vLLM (base weights already loaded: load_format safetensors)
            return collect(module=module, layered_summon=layered, base_sync_done=True)

        def guard(what, fn):
            try:
                return fn()
            except LoraGuardError as exc:
                report[f"guard_{what}"] = str(exc)
                return None

        report["collected"] = sum(1 for k in sync(raw) if "lora_" in k)
        guard("sync", lambda: sync(guarded))
        # one optimizer step on a real loss (verl's update_actor needs a rollout batch; the step is its optimizer's)
        ids = torch.randint(0, 100, (1, 8))
        with torch.autocast("cpu", dtype=torch.bfloat16):  # the FSDP mixed precision verl sets (bf16 params)
            loss = module(input_ids=ids, attention_mask=torch.ones_like(ids)).logits.float().pow(2).mean()
        loss.backward()
        worker.actor_optimizer.step()
        worker.actor_optimizer.zero_grad()
        WATCH.updates += 1  # what the guard's update_actor wrapper counts
        report["collected_after_update"] = sum(1 for k in sync(raw) if "lora_" in k)
        if "guard_sync" not in report:
            guard("sync_after_update", lambda: sync(guarded))
        step = os.path.join(args.ckpt, "global_step_1", "actor")
        guard("save", lambda: worker.save_checkpoint(step, global_step=1))
        adapter = os.path.join(step, "lora_adapter", "adapter_model.safetensors")
        if rank == 0 and os.path.exists(adapter):
            from safetensors import safe_open

            with safe_open(adapter, framework="pt") as fh:
                report["saved_tensors"] = len(list(fh.keys()))
            report["adapter_bytes"] = os.path.getsize(adapter)
        worker.load_checkpoint(step)
        report["reloaded"] = True
    except Exception as exc:  # noqa: BLE001 - the report says which step failed, in its own line
        report["error"] = f"{type(exc).__name__}: {exc}"
        report["traceback"] = traceback.format_exc()[-3000:]
    if rank == 0:
        with open(args.out, "w", encoding="utf-8") as fh:
            json.dump(report, fh)
    if "error" in report:
        os._exit(0)  # the other rank may wait in a collective that will not come
    dist.barrier()
    dist.destroy_process_group()


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--model", required=True)
    ap.add_argument("--out", required=True)
    ap.add_argument("--ckpt", required=True)
    args = ap.parse_args()
    os.environ.setdefault("MASTER_ADDR", "127.0.0.1")
    os.environ.setdefault("MASTER_PORT", str(20000 + os.getpid() % 20000))
    import torch.multiprocessing as mp

    mp.spawn(rank_main, args=(2, args), nprocs=2, join=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
