"""The GPU memory budget of one job: which vLLM engines a forward-pass or eval shard opens on its GPU(s),
and why a job cannot open them (`llmrnn check` runs the same plan as rnn.make_roles)."""

from __future__ import annotations

import copy
import json
import math
import os
from dataclasses import dataclass

from llmrnn.backends import engine_key, role_settings

VLLM_LORA_RANKS = (8, 16, 32, 64, 128, 256, 320, 512)  # vLLM's accepted max_lora_rank values


@dataclass(frozen=True)
class EnginePlan:
    """The vLLM engines one job (a forward-pass or eval shard, on the same GPU(s)) opens, after planning.

    engines: [{model, roles, gpu_memory_utilization, tensor_parallel_size, lora}]; roles_cfg / model_paths:
    what rnn.make_roles gets; notes: what the plan changed and why."""

    engines: list[dict]
    roles_cfg: dict
    model_paths: dict
    notes: list[str]

    @property
    def utilization(self) -> float:
        """Share of each GPU the engines reserve together (vLLM refuses to start past 1)."""
        return sum(e["gpu_memory_utilization"] for e in self.engines)


def _adapter_rank(adapter: str) -> int | None:
    try:
        with open(os.path.join(str(adapter), "adapter_config.json"), encoding="utf-8") as fh:
            return int(json.load(fh)["r"])
    except (OSError, ValueError, KeyError, TypeError):
        return None


def plan_engines(roles_cfg: dict, model_paths: dict | None = None, memory_adapter: str | None = None) -> EnginePlan:
    """Open no more vLLM engines than one GPU's memory allows (vLLM refuses a second engine once the first
    reserved its gpu_memory_utilization share: 0.85 + 0.85 > 1).

    1. The trained memory model as a LoRA on the base engine: when `memory_adapter` (the PEFT adapter the
       merged model was verified against) is given and the memory role's base model already has a vLLM
       engine for another role, the memory role runs that adapter on it: one engine instead of two.
    2. Otherwise roles that share a model and its engine settings share one engine; when the engines'
       configured shares add up to more than 1, the largest configured share is split evenly among them.
    """
    roles_cfg = copy.deepcopy(roles_cfg)
    paths = dict(model_paths or {})
    notes: list[str] = []
    vllm_roles = [r for r, c in roles_cfg.items() if (c or {}).get("backend") == "vllm"]

    def model_of(role: str) -> str:
        return str(paths.get(role) or roles_cfg[role].get("model"))

    mem = roles_cfg.get("memory") or {}
    if memory_adapter and "memory" in vllm_roles:
        base = str(mem.get("model"))
        shares = [r for r in vllm_roles if r != "memory" and model_of(r) == base]
        if shares:
            rank = _adapter_rank(memory_adapter) or 16
            max_rank = next((v for v in VLLM_LORA_RANKS if v >= rank), rank)
            paths.pop("memory", None)
            mem["lora_adapter"] = str(memory_adapter)
            for r in vllm_roles:
                if model_of(r) == base:
                    roles_cfg[r].update(enable_lora=True, max_lora_rank=max_rank)
            notes.append(f"memory role: adapter {memory_adapter} as a LoRA on the {base} engine of {', '.join(shares)}")

    groups: dict[tuple, list[str]] = {}
    for r in vllm_roles:
        c = roles_cfg[r]
        ident = engine_key({k: v for k, v in c.items() if k not in ("gpu_memory_utilization", "lora_adapter")},
                           model_of(r))
        groups.setdefault(ident, []).append(r)
    engines = []
    for members in groups.values():
        first = roles_cfg[members[0]]
        engines.append({"model": model_of(members[0]), "roles": members,
                        "gpu_memory_utilization": max(float(role_settings(roles_cfg[m])["gpu_memory_utilization"])
                                                      for m in members),
                        "tensor_parallel_size": int(role_settings(first)["tensor_parallel_size"]),
                        "lora": roles_cfg["memory"].get("lora_adapter") if "memory" in members else None})
    total = sum(e["gpu_memory_utilization"] for e in engines)
    if total > 1:
        share = math.floor(max(e["gpu_memory_utilization"] for e in engines) / len(engines) * 100) / 100
        notes.append(f"{len(engines)} vLLM engines would reserve {total:.2f} of each GPU: {share:.2f} each")
        for e in engines:
            e["gpu_memory_utilization"] = share
    for e in engines:  # every role of an engine asks for the same share, so they share one engine_key
        for r in e["roles"]:
            roles_cfg[r]["gpu_memory_utilization"] = e["gpu_memory_utilization"]
    return EnginePlan(engines, roles_cfg, paths, notes)


def gpu_budget_problems(plan: EnginePlan, gpus: int, where: str) -> list[str]:
    """Why a job cannot open its planned engines on the GPUs it asks for (empty when it can)."""
    problems = []
    if plan.engines and plan.utilization > 1:
        problems.append(f"{where}: its vLLM engines reserve {plan.utilization:.2f} of each GPU (more than 1): "
                        + "; ".join(f"{e['model']} ({', '.join(e['roles'])}) {e['gpu_memory_utilization']}"
                                    for e in plan.engines))
    for e in plan.engines:
        if e["tensor_parallel_size"] > max(gpus, 0):
            problems.append(f"{where}: the vLLM engine of {', '.join(e['roles'])} uses tensor_parallel_size "
                            f"{e['tensor_parallel_size']} but the job asks for {gpus} GPU(s)")
    return problems
