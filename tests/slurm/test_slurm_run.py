"""Real SLURM (.ci/slurm/up.sh): the workflow through profiles/slurm lands GPU rules on gpu-a100 with a
GPU request and CPU rules on cpu, the judge/trainer group is one job with disjoint GPUs, and every
target is produced."""

from __future__ import annotations

import json
import os
import shutil
import sys
from pathlib import Path

import pytest

from tests.slurm.dag import (
    copy_extra_parts,
    gpu_rules,
    load_profile,
    parse_dry_run,
    run,
    write_model_layer,
    write_small_config,
)
from tests.slurm.slurmjobs import jobs_of_run

pytestmark = [pytest.mark.slurm, pytest.mark.slow, pytest.mark.e2e]
HERE = Path(__file__).parent
# Faster polling than a real cluster needs; keep the executor's logs for the assertions.
RUN_FLAGS = ["--slurm-keep-successful-logs", "--slurm-init-seconds-before-status-checks", "2",
             "--seconds-between-status-checks", "3", "--latency-wait", "180"]
# This machine has 2 cores; Snakemake asks a core per member of the stand-in group (threads 1 each)
# inside the allocation (a real A100 node has plenty; the real judge/preflight rules declare 0).
TWO_CORE_THREADS = ["--set-threads", "judge_server=0", "preflight=0"]


def _env(tmp_path: Path, **extra: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("LLMRNN_", "SLURM_"))}
    env.update(
        PATH=f"{Path(sys.executable).parent}{os.pathsep}{os.environ['PATH']}",
        OMP_NUM_THREADS="1", HF_HUB_OFFLINE="1", TOKENIZERS_PARALLELISM="false",
        LLMRNN_SLURM_STATUS="squeue",  # no accounting daemon here: sacct would hang the run
    )
    env.update(extra)
    return env


def _snakemake(workdir: Path, env: dict[str, str], *args: str, timeout: float = 600):
    proc = run([str(Path(sys.executable).parent / "snakemake"), *args], cwd=workdir, env=env, timeout=timeout)
    assert proc.returncode == 0, (
        f"snakemake {' '.join(args)} failed ({proc.returncode}):\n{proc.stdout[-6000:]}\n{proc.stderr[-6000:]}"
    )
    return proc.stdout + proc.stderr


def _assert_jobs_placed(workdir: Path, env: dict[str, str], planned_rules: set[str]) -> list:
    profile = load_profile(env)
    gpus = gpu_rules(profile)
    jobs = jobs_of_run(workdir)
    assert jobs, "no SLURM job logs under .snakemake/slurm_logs"
    ran = set().union(*(j.rules for j in jobs))
    assert planned_rules <= ran, f"rules never run as SLURM jobs: {sorted(planned_rules - ran)}"
    for job in jobs:
        wanted = sum(gpus.get(r, 0) for r in job.rules)
        on_gpu_partition = any(r in gpus for r in job.rules)
        if on_gpu_partition:
            assert job.partition == "gpu-a100", (job.rules, job.partition, job.log)
            assert job.gpus == wanted, (job.rules, job.gpus, wanted)
        else:
            assert job.partition == "cpu", (job.rules, job.partition, job.log)
            assert job.gpus == 0, (job.rules, job.gpus)
    return jobs


def test_judge_and_trainer_share_one_node_on_disjoint_gpus(slurm_cluster, tmp_path):
    work = tmp_path / "group"
    shutil.copytree(HERE / "group_workflow", work)
    shutil.copytree(HERE.parents[1] / "profiles", work / "profiles")
    env = _env(tmp_path, LLMRNN_CONFIGFILE="config/group.yaml")
    _snakemake(work, env, "--profile", "profiles/slurm", "all", *RUN_FLAGS, *TWO_CORE_THREADS, timeout=600)
    jobs = _assert_jobs_placed(work, env, {"judge_server", "preflight", "train_grpo"})
    assert len(jobs) == 1, [j.rules for j in jobs]  # one sbatch for the whole group
    assert jobs[0].gpus == 3  # 1 judge + 2 actor/rollout, the reference layout
    judge = json.loads((work / "out/judge_probe.json").read_text())
    train = json.loads((work / "out/train.json").read_text())
    pre = json.loads((work / "out/preflight.json").read_text())
    assert train["slurm_job"] == pre["slurm_job"] == jobs[0].jobid
    assert judge["slurm_job"] == jobs[0].jobid
    assert len(train["assigned"]) == 2 and len(judge["assigned"]) == 1
    assert not set(judge["assigned"]) & set(train["assigned"]), (judge, train)


def test_workflow_through_the_profile_on_real_slurm(slurm_cluster, workflow_dir, tmp_path, tiny_model_dir):
    copy_extra_parts(workflow_dir)
    # the embedded default (CPU engines), shrunk to few rows, on the tiny model: this test is about where jobs run
    files = ["config/config.yaml", write_small_config(workflow_dir), write_model_layer(workflow_dir, tiny_model_dir)]
    env = _env(tmp_path, LLMRNN_CONFIGFILE=" ".join(files), LLMRNN_SLURM_JOBS="2")
    plan = _snakemake(workflow_dir, env, "--profile", "profiles/slurm", "-n", "all")
    planned = {j.rule for j in parse_dry_run(plan) if j.shell is not None}
    assert planned, plan[-3000:]
    # local rules (the model downloads: compute nodes have no internet) run on the login node, not as jobs
    import subprocess
    import sys

    from tests.slurm.test_local_downloads import LOCAL_RULES

    local = subprocess.run([sys.executable, "-c", LOCAL_RULES, *files], cwd=workflow_dir, env=env,
                           capture_output=True, text=True, timeout=300, check=True)
    planned -= set(json.loads(local.stdout.strip().splitlines()[-1]))
    assert planned, plan[-3000:]
    _snakemake(workflow_dir, env, "--profile", "profiles/slurm", "all", *RUN_FLAGS, timeout=3000)
    _assert_jobs_placed(workflow_dir, env, planned)
    # every target produced: nothing left to do for a plain local dry run of the same config (by
    # files and their times; params/code triggers are the rerun table's business)
    left = _snakemake(workflow_dir, env, "--cores", "1", "-n", "all", "--rerun-triggers", "mtime", "input",
                      "--configfile", *files)
    assert "Nothing to be done" in left, left[-3000:]
