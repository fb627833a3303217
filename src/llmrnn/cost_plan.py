"""The cost plan before submission: GPU-hours and wall time per stage and in all (the recipe's `cost_stages`:
the memory head's; recipe qa is not planned yet).

Each GPU-holding stage is its planned jobs (the counts the rules plan: trajectories.shards x the train and val
splits, eval.shards x the variants, one training job over train.nnodes nodes with the judge beside it when a
job starts it) x the GPUs each asks (as profiles/slurm places them: a shard 1 GPU, the trainer
train.n_gpus_per_node per node, the judge the rubric's) x its hours. The hours are the stage's cap
(`resources.runtime`: what SLURM may charge) unless the run's earlier `benchmark:` files
(logs/<run>/benchmarks/<rule>/, llmrnn.benchmarks) measured the stage: then its longest measured job. The
wall time is the critical path (the recipe's `critical_path`): the trajectory shards, the training group, the
merge and the eval shards one after the other, each stage's shards side by side. tests/test_cost.py keeps the job counts equal to the
dry run's.
"""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path

from llmrnn.benchmarks import read_benchmarks
from llmrnn.errors import LlmrnnError
from llmrnn.plan import ExperimentPlan, Plan


def plan_stages(config: Mapping, benchmarks: str | Path | None = None) -> list[dict]:
    """Per stage: jobs, GPUs per job, hours per job (cap or measured), GPU-hours, and where the hours came from.
    An experiment's (config `experiment`): every member's, a job group members share counted once."""
    plan = Plan(config)
    if plan.experiment is not None:
        return experiment_stages(plan.experiment, benchmarks)
    if not plan.recipe.cost_stages:
        raise LlmrnnError(f"cost plan: recipe {plan.recipe.name} is not planned yet (the memory-head recipe only)")
    c = config
    measured: dict[str, float] = {}
    for job in read_benchmarks(benchmarks) if benchmarks else []:
        measured[job.stage] = max(measured.get(job.stage, 0.0), job.wall_s / 3600)
    train_nodes = int(c["train"].get("nnodes") or 1)
    train_cap = c["train"]["resources"]["runtime"] / 60
    judge_started = plan.judge.planned() or plan.judge.agreement_on()
    # each stage the memory head's recipe counts: its jobs, GPUs per job and runtime cap (hours)
    rows = [
        ("trajectory_shard", c["trajectories"]["shards"] * 2, c["trajectories"]["resources"]["gpu"] or 0,
         c["trajectories"]["resources"]["runtime"] / 60),
        # the judge lives as long as the training job it serves (one SLURM job: its cap is the group's)
        ("judge_server", 1 if judge_started else 0, plan.judge.gpus(), train_cap),
        ("train_grpo", 1, plan.train.gpus() * train_nodes, train_cap),
        ("merge_model", 1, c["merge"]["resources"]["gpu"] or 0, c["merge"]["resources"]["runtime"] / 60),
        ("eval_shard", len(plan.evaluate.variants()) * c["eval"]["shards"], c["eval"]["resources"]["gpu"] or 0,
         c["eval"]["resources"]["runtime"] / 60),
    ]
    stages = []
    for stage, jobs, gpus, cap_h in rows:
        if not jobs or stage not in plan.recipe.cost_stages:
            continue
        source = "measured" if stage in measured else "cap"
        hours = measured.get(stage, cap_h)
        if stage == "judge_server" and "train_grpo" in measured:
            hours, source = measured["train_grpo"], "measured"  # it lived as long as training
        stages.append({"stage": stage, "jobs": jobs, "gpus_per_job": int(gpus), "hours_per_job": hours,
                       "gpu_hours": jobs * int(gpus) * hours, "source": source,
                       "critical": stage in plan.recipe.critical_path})
    return stages


# the cost stages whose jobs an experiment's members may share, and the experiment stage whose folder says who
# shares them (llmrnn.plan.SHARED_STAGES); the eval shards of the untrained variants (base, baselines) too
SHARED_COST_STAGES = {"trajectory_shard": "trajectories", "judge_server": "judge"}


def experiment_stages(experiment: ExperimentPlan, benchmarks: str | Path | None = None) -> list[dict]:
    """An experiment's cost plan: each member's stages (its benchmarks in logs/RUN/<member>/benchmarks when
    `benchmarks` is the run's logs/RUN/benchmarks), a job group that members share (the same folder: the plan's
    stage keys) counted once: the trajectory shards, the judge that only the agreement check starts, and the
    untrained variants' eval shards; training, merge and the trained model's eval shards once per member. The
    critical path is one member's: members run side by side."""
    totals: dict[str, dict] = {}
    counted: set[tuple[str, str]] = set()

    def first_time(stage: str, folder: str | None) -> bool:
        if folder is None:  # not shared by this member: its own
            return True
        seen = (stage, folder) in counted
        counted.add((stage, folder))
        return not seen

    for name, member in experiment.members.items():
        member_benchmarks = Path(benchmarks).parent / name / "benchmarks" if benchmarks else None
        for row in plan_stages(member.config, member_benchmarks):
            stage, jobs = row["stage"], row["jobs"]
            if stage in SHARED_COST_STAGES and not first_time(stage, member.paths.stage_roots.get(SHARED_COST_STAGES[stage])):
                continue
            if stage == "eval_shard" and not first_time(stage, member.paths.stage_roots.get("untrained_eval")):
                jobs = member.config["eval"]["shards"]  # the trained model's shards alone
            total = totals.setdefault(stage, {**row, "jobs": 0, "gpu_hours": 0.0, "hours_per_job": 0.0})
            total["jobs"] += jobs
            total["gpu_hours"] += jobs * row["gpus_per_job"] * row["hours_per_job"]
            total["hours_per_job"] = max(total["hours_per_job"], row["hours_per_job"])
            if row["source"] == "cap":
                total["source"] = "cap"
    return list(totals.values())


def wall_hours(stages: list[dict]) -> float:
    """The critical path: each critical stage's longest job, one stage after the other."""
    return sum(s["hours_per_job"] for s in stages if s["critical"])


def _h(hours: float) -> str:
    return f"{hours:.2f} h" if hours < 10 else f"{hours:.0f} h"


def plan_table(stages: list[dict]) -> str:
    """One line a stage and a total line, as `llmrnn report cost-plan` and `llmrnn check` print them."""
    lines = [f"{'stage':<17} {'jobs':>4} {'GPUs/job':>8} {'hours/job':>10} {'GPU-hours':>10}  from"]
    for s in stages:
        lines.append(f"{s['stage']:<17} {s['jobs']:>4} {s['gpus_per_job']:>8} {_h(s['hours_per_job']):>10} "
                     f"{s['gpu_hours']:>10.1f}  {'earlier run' if s['source'] == 'measured' else 'runtime cap'}")
    lines.append(f"{'total':<17} {sum(s['jobs'] for s in stages):>4} {'':>8} {_h(wall_hours(stages)):>10} "
                 f"{sum(s['gpu_hours'] for s in stages):>10.1f}  wall: critical path")
    return "\n".join(lines) + "\n"


def summary_line(stages: list[dict]) -> str:
    capped = any(s["source"] == "cap" for s in stages)
    return (f"cost plan: {'up to ' if capped else 'about '}{sum(s['gpu_hours'] for s in stages):.1f} GPU-hours, "
            f"wall {'up to ' if capped else 'about '}{_h(wall_hours(stages))} on the critical path "
            "(per stage: llmrnn report cost-plan, or snakemake ... cost_plan)")
