"""The GPU stack installed here, and the vLLM engines of each forward-pass job within its GPUs."""

from __future__ import annotations

import importlib
import importlib.util

from llmrnn.check.skips import skip, unused
from llmrnn.engine_budget import gpu_budget_problems, plan_engines
from llmrnn.gpu_stack import DISTRIBUTIONS, installed, stack_problems, uses_vllm


def check_gpu_stack(config: dict) -> list[str]:
    """verl/vLLM releases installed here that the config cannot use; more than one training node."""
    train = config.get("train") or {}
    needed = [p for p, wanted in (("verl", train.get("engine") == "verl"), ("vllm", uses_vllm(config))) if wanted]
    absent = [p for p in needed if p in DISTRIBUTIONS and not _importable(p)]
    if absent:
        # "all:" when nothing the config needs could be checked: the OK line then lists the GPU stack as
        # skipped only, never as checked
        whole = "all: " if len(absent) == len(needed) else ""
        skip(f"{whole}{' and '.join(absent)} not importable here; the job that needs it checks it")
    return stack_problems(config)


def _importable(package: str) -> bool:
    """Installed (its distribution) AND importable here: an install whose import fails checked nothing."""
    if installed(package) is None or importlib.util.find_spec(package) is None:
        return False
    if package != "verl":  # vLLM's import starts CUDA probes (seconds); its version is what is checked
        return True
    try:  # the training check imported it already (check_verl_command): cached
        importlib.import_module(package)
    except Exception:  # noqa: BLE001 - any failure of the import: not importable
        return False
    return True


def check_engine_budget(config: dict) -> list[str]:
    """The vLLM engines each forward-pass job opens, planned by the code the jobs run
    (llmrnn.engine_budget.plan_engines via rnn.make_roles), fit the GPUs the job asks for: trajectory shards and
    eval shards of the base and the trained memory model (a second model: split budget, or a LoRA)."""
    roles = config.get("roles") or {}
    if not any((r or {}).get("backend") == "vllm" for r in roles.values()):
        unused("no role on the vllm backend")
        return []
    problems = []
    jobs = [("trajectory_shard", "trajectories", None), ("eval_shard (base)", "eval", None),
            ("eval_shard (trained)", "eval", {"memory": "<trained memory model>"})]
    for where, section, paths in jobs:
        gpus = (((config.get(section) or {}).get("resources")) or {}).get("gpu")
        plan = plan_engines(roles, paths)
        problems += gpu_budget_problems(plan, 1 if gpus is None else int(gpus), where)
    return problems
