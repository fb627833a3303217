"""The GPU stack installed here, and the vLLM engines of each forward-pass job within its GPUs."""

from __future__ import annotations

import importlib
import importlib.util
import os
import sys

from llmrnn.check.judge import _judge_in_dag
from llmrnn.check.skips import skip, unused
from llmrnn.engine_budget import gpu_budget_problems, plan_engines
from llmrnn.gpu_stack import installed, stack_problems
from llmrnn.rubric import load_rubric

# LLMRNN_SDM: the software-deployment method the jobs run under (profiles/slurm reads the same variable;
# rule check passes Snakemake's own --sdm in it): empty = the environment `llmrnn check` runs in
SDM_ENV = "LLMRNN_SDM"
GPU_ENV_HINT = ("build it with `make gpu-env` and run snakemake from that venv (.venv-gpu/bin on PATH), or "
                "let each job bring it: LLMRNN_SDM=apptainer (or conda) with profiles/slurm (docs/cluster.md)")


def needed_packages(config: dict) -> list[str]:
    """The distributions the planned jobs import: the training engine's (verl | trl) and vLLM's where a
    forward-pass role or a started judge (llmrnn.check.judge: as the plan starts it) serves on vLLM."""
    train = config.get("train") or {}
    engine = train.get("engine") if isinstance(train, dict) else None
    roles = config.get("roles") or {}
    vllm = any((r or {}).get("backend") == "vllm" for r in roles.values() if isinstance(r, dict))
    if not vllm and _judge_in_dag(config):
        try:
            vllm = load_rubric(config["judge"]["rubric"]).needs_gpu
        except Exception:  # noqa: BLE001 - an unreadable rubric is check_judge's problem line
            vllm = False
    return [p for p, wanted in (("verl", engine == "verl"), ("trl", engine == "trl"), ("vllm", vllm)) if wanted]


def deployment_method() -> list[str]:
    return os.environ.get(SDM_ENV, "").split()


def check_gpu_stack(config: dict) -> list[str]:
    """The packages the planned jobs need, in the environment they run in (this one unless a
    software-deployment method brings its own: conda env files, an apptainer image); verl/vLLM releases
    the config cannot use; more than one training node. A missing package is refused here: every job that
    needs it would fail (and, on SLURM, queue again for the same GPUs)."""
    sdm = deployment_method()
    problems = []
    needed = needed_packages(config)
    if sdm:
        skip(f"{', '.join(needed) or 'no GPU package'} from the jobs' own environments ({SDM_ENV}={' '.join(sdm)})")
    else:
        absent = [p for p in needed if not _importable(p)]
        if absent:
            problems.append(f"gpu stack: {' and '.join(absent)} not installed in this environment "
                            f"({sys.prefix}), which the jobs run in ({SDM_ENV} unset: no software-deployment "
                            f"method): {GPU_ENV_HINT}")
    return problems + stack_problems(config, {} if sdm else None)


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
