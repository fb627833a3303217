"""What profiles/slurm asks of the cluster: GPU counts equal to the config's; each job's runtime within its
partition's MaxTime (where `sinfo` answers)."""

from __future__ import annotations

import logging
from pathlib import Path

from llmrnn.benchmarks import longest_job_minutes
from llmrnn.check.judge import _judge_gpus_needed
from llmrnn.check.skips import skip
from llmrnn.plan.common import Paths
from llmrnn.plan.recipe import TRAIN_RULES
from llmrnn.settings.train import Train
from llmrnn.slurm import (
    COUNTS,
    CPU_PARTITION,
    GPU_PARTITION,
    env_count,
    gpu_placement,
    partition_limits,
    setting,
)

log = logging.getLogger(__name__)

# What profiles/slurm requests when these are not exported (its defaults: the reproduction's layout);
# tests/test_shared_concepts.py asserts they equal the rendered profile and config/reproduce.yaml.
PROFILE_GPU_DEFAULTS = {"LLMRNN_TRAIN_GPUS": 2, "LLMRNN_JUDGE_GPUS": 1, "LLMRNN_TRAIN_NODES": 1}


def _profile_value(name: str) -> int:
    try:
        return env_count(name)
    except ValueError:  # check_profile_env says it
        return PROFILE_GPU_DEFAULTS[name]


def check_profile_env(config: dict) -> list[str]:
    """The counts profiles/slurm reads from the environment (llmrnn.slurm.COUNTS) are whole numbers in range:
    the profile itself refuses them too, but only when Snakemake starts on the cluster."""
    problems = []
    for name in COUNTS:
        try:
            env_count(name)
        except ValueError as exc:
            problems.append(f"profiles/slurm: {exc}")
    return problems


def check_profile_gpus(config: dict, train_cfg: Train) -> list[str]:
    """profiles/slurm asks for LLMRNN_TRAIN_GPUS / LLMRNN_JUDGE_GPUS; they must match the config."""
    problems = []
    profile_train = _profile_value("LLMRNN_TRAIN_GPUS")
    want = train_cfg.n_gpus_per_node
    if want != profile_train:
        problems.append(f"train.n_gpus_per_node is {want} but profiles/slurm requests {profile_train} GPU(s) for "
                        f"train_grpo: export LLMRNN_TRAIN_GPUS={want}")
    nodes = train_cfg.nnodes
    profile_nodes = _profile_value("LLMRNN_TRAIN_NODES")
    if nodes != profile_nodes:
        problems.append(f"train.nnodes is {nodes} but profiles/slurm requests {profile_nodes} node(s): "
                        f"export LLMRNN_TRAIN_NODES={nodes}")
    judge = _judge_gpus_needed(config)
    profile_judge = _profile_value("LLMRNN_JUDGE_GPUS")
    if judge is not None and judge > profile_judge:
        problems.append(f"the judge needs {judge} GPU(s) but profiles/slurm requests {profile_judge}: "
                        f"export LLMRNN_JUDGE_GPUS={judge}")
    return problems


def _runtime(config: dict, *path: str) -> int | None:
    node = config
    for part in path:
        node = node.get(part) if isinstance(node, dict) else None
    return int(node) if isinstance(node, (int, float)) and not isinstance(node, bool) else None


def slurm_jobs(config: dict) -> list[tuple[str, int, str, str]]:
    """(job, runtime in minutes, partition, the knob that sets it) of each job profiles/slurm submits with a
    runtime from the config, as the plan groups them: the judge, the preflight and the trainer are one sbatch
    (group train_node) whose runtime is the longest member's (a service group: Snakemake takes the max)."""
    gpu, cpu = setting(GPU_PARTITION), setting(CPU_PARTITION)

    def merge_partition() -> str:
        gpus = _runtime(config, "merge", "resources", "gpu") or 0
        return gpu_placement(gpus).get("slurm_partition", cpu)

    train = [("train_grpo", "train.resources.runtime")]
    if _judge_gpus_needed(config) != 0:
        train.append(("judge_server", "judge.resources.runtime"))
    group = [(job, _runtime(config, *knob.split(".")), knob) for job, knob in train]
    group = [g for g in group if g[1] is not None]
    jobs: list[tuple[str, int, str, str]] = []
    if group:
        job, minutes, knob = max(group, key=lambda g: g[1])
        label = "the judge/preflight/trainer job (group train_node)" if len(group) > 1 else "train_grpo"
        jobs.append((f"{label}, {job}", minutes, gpu, knob))
    if config.get("recipe") == "qa":
        steps = [("qa_sft", "qa.sft.resources.runtime", gpu), ("qa_merge_sft", "merge.resources.runtime",
                 merge_partition()), ("qa_eval_model", "qa.eval.resources.runtime", gpu)]
    else:
        steps = [("trajectory_shard", "trajectories.resources.runtime", gpu),
                 ("eval_shard", "eval.resources.runtime", gpu),
                 ("merge_model", "merge.resources.runtime", merge_partition())]
    for job, knob, partition in steps:
        minutes = _runtime(config, *knob.split("."))
        if minutes is not None:
            jobs.append((job, minutes, partition, knob))
    return jobs


def _hours(minutes: int) -> str:
    return f"{minutes} min ({minutes / 60:g} h)"


def check_partition_time(config: dict) -> list[str]:
    """Where `sinfo` answers (a SLURM login node): each job's runtime within its partition's MaxTime, or one
    line naming the job, its runtime, the partition, its limit and the knob. SLURM would queue such a job
    forever (PartitionTimeLimit) or refuse it, hours into the run. No sinfo here: nothing to compare with."""
    limits = partition_limits()
    if not limits:
        skip("all: no sinfo here, not a SLURM login node")
        return []
    problems = []
    for job, minutes, partition, knob in slurm_jobs(config):
        if partition not in limits:
            log.warning("check: partition %s of %s is not one sinfo lists (%s): its time limit is not checked",
                        partition, job, ", ".join(sorted(limits)))
            skip(f"{job}: partition {partition} is not one sinfo lists")
            continue
        limit = limits[partition]
        if limit is not None and minutes > limit:
            problems.append(f"slurm: {job} asks {_hours(minutes)} but partition {partition} allows "
                            f"{_hours(limit)} (sinfo MaxTime): lower {knob}, or choose a partition that allows "
                            "it (LLMRNN_SLURM_GPU_PARTITION / LLMRNN_SLURM_CPU_PARTITION)")
    return problems


def benchmark_advice(config: dict, logs: str | None = None) -> list[str]:
    """Warnings from the last run's benchmark files (logs/<run>/benchmarks, llmrnn.benchmarks): a job whose
    longest measured attempt took longer than its runtime asks, or than its partition allows (where sinfo
    answers). Warnings, not problems: the next run's data or hardware may differ."""
    if not config.get("run_name"):
        return []
    root = f"{logs or Paths.of(config['run_name']).logs}/benchmarks"
    if not Path(root).is_dir():
        return []
    limits = partition_limits() or {}
    advice = []
    for job, minutes, partition, knob in slurm_jobs(config):
        # the judge/preflight/trainer group runs as long as its trainer: its runtime is the longest member's
        rule = "train_grpo" if "group train_node" in job else job.rsplit(", ", 1)[-1]
        measured = longest_job_minutes(root, rule)
        if measured is None:
            continue
        took, path = measured
        resumes = rule in TRAIN_RULES  # a GRPO job resumes from its checkpoint in the next attempt
        if took > minutes:
            advice.append(f"the last run's {rule} took {took:.0f} min ({path}) but {knob} asks {_hours(minutes)}: "
                          + ("it will stop at its limit and continue in a rerun; raise it to finish in one job"
                             if resumes else f"it will be killed at its limit; raise {knob}"))
        limit = limits.get(partition)
        if limit is not None and took > limit:
            advice.append(f"the last run's {rule} took {took:.0f} min ({path}), more than partition {partition} "
                          f"allows ({_hours(limit)}, sinfo MaxTime): "
                          + ("it will need several jobs (each continues from the last checkpoint)" if resumes
                             else "split the work (more shards) or choose a partition that allows it"))
    return advice
