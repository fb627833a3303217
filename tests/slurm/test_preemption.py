"""A training job preempted mid-run survives (docs/cluster.md "Long runs"), on the real local SLURM through
profiles/slurm: a job in the `urgent` partition takes the node of the training job (partition `preemptible`,
PreemptMode=REQUEUE, GraceTime 60: .ci/slurm/up.sh), SLURM sends SIGTERM to every process of the training
job, the trainer saves at the next step boundary and exits 75, Snakemake's retry (the profile's) resumes from
that checkpoint, and the run finishes with every step trained once."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import time
from pathlib import Path

import pytest
import yaml

from tests.slurm.test_long_runs import train_command
from tests.slurm.test_slurm_run import _env
from tests.slurm.test_survival import (
    kill_job_steps_of,
    resume_node,
    snakemake_through_the_profile,
    take_node_down,
)
from tests.test_train_trl import STANDIN, tiny_cfg
from tests.verl.rows import make_rows, write_parquet

pytestmark = [pytest.mark.slurm, pytest.mark.slow, pytest.mark.e2e]
HERE = Path(__file__).parent
STEPS = 40  # 8 rows, 2 prompts a step, 10 epochs: long enough to be preempted mid-run


def _partitions() -> set[str]:
    out = subprocess.run(["sinfo", "-h", "-o", "%P"], capture_output=True, text=True, timeout=30, check=False).stdout
    return {p.rstrip("*") for p in out.split()}


def _running_job_node() -> tuple[str, str] | None:
    out = subprocess.run(["squeue", "-h", "-t", "R", "-p", "preemptible", "-o", "%i %N"], capture_output=True,
                         text=True, timeout=30, check=False).stdout.split()
    return (out[0], out[1]) if len(out) >= 2 else None


def _run_interrupted(tmp_path: Path, tiny_model_dir: Path, save_freq: int, interrupt) -> tuple[Path, dict]:
    """The preemption workflow through profiles/slurm (retries 1, partition preemptible), `interrupt(job, node)`
    called once the training job is inside its run (3 steps traced); the run must then finish. -> (work, env)"""
    if "preemptible" not in _partitions():
        pytest.skip("this local SLURM predates the preemptible partition: restart it (.ci/slurm/down.sh, up.sh)")
    work = tmp_path / "preemption"
    shutil.copytree(HERE / "preemption_workflow", work)
    shutil.copytree(HERE.parents[1] / "profiles", work / "profiles")
    cfg = tiny_cfg(epochs=10, test_freq=0, save_freq=save_freq, keep_last=None)
    (work / "config" / "preemption.yaml").write_text(yaml.safe_dump({
        "run_name": "preemption", "train": cfg, "model": str(tiny_model_dir), "reward": STANDIN,
        "train_parquet": str(write_parquet(tmp_path / "train.parquet", make_rows(8))),
        "val_parquet": str(write_parquet(tmp_path / "val.parquet", make_rows(2, split="val", seed=1)))}))
    env = _env(tmp_path, LLMRNN_CONFIGFILE="config/preemption.yaml", LLMRNN_SLURM_RETRIES="1",
               LLMRNN_SLURM_CPU_PARTITION="preemptible", PYTHONPATH=os.pathsep.join(p for p in sys.path if p))
    trace = work / "out" / "train" / "state" / "data_trace.jsonl"
    with snakemake_through_the_profile(work, env, tmp_path / "snakemake.log") as proc:
        give_up = time.time() + 600  # a guard against a hung run, not a timing assertion
        while not (trace.exists() and len(trace.read_text().splitlines()) >= 3):  # inside the run
            assert proc.poll() is None, (tmp_path / "snakemake.log").read_text()[-6000:]
            assert time.time() < give_up, "the training job never reached step 3"
            time.sleep(0.2)
        running = _running_job_node()
        assert running, "no running training job in partition preemptible"
        interrupt(*running)
        proc.wait(timeout=900)
    assert proc.returncode == 0, (tmp_path / "snakemake.log").read_text()[-6000:]
    return work, env


def _assert_resumed_once_each(work: Path, env: dict, tmp_path: Path) -> int:
    """The run trained every step once, the last attempt from a checkpoint, on the prompts of an uninterrupted
    run of the same config (here, outside SLURM). -> the step it resumed from"""
    summary = json.loads((work / "out" / "train" / "summary.json").read_text())
    resumed = summary["resumed_from_step"]
    assert summary["steps"] == STEPS, summary
    train_log = (work / "out" / "train.log").read_text()  # the last attempt's (Snakemake removed the first's)
    assert f"resuming from out/train/checkpoints/checkpoint-{resumed} (step {resumed} of {STEPS})" in train_log
    steps = [json.loads(x)["step"] for x in (work / "out" / "train" / "metrics.jsonl").read_text().splitlines()
             if json.loads(x)["kind"] == "train"]
    assert steps == list(range(1, STEPS + 1))
    ref = tmp_path / "reference"
    config = yaml.safe_load((work / "config" / "preemption.yaml").read_text())
    command = train_command(config["train"], config["train_parquet"], config["val_parquet"], config["model"], ref)
    done = subprocess.run(command, cwd=work, env=env, capture_output=True, text=True, timeout=900,
                          check=False)
    assert done.returncode == 0, done.stderr[-3000:]
    assert _trace(work / "out" / "train" / "state" / "data_trace.jsonl") == _trace(ref / "state" / "data_trace.jsonl")
    return resumed


def test_a_preempted_training_job_continues_from_the_next_step(slurm_cluster, tmp_path, tiny_model_dir):
    def preempt(job: str, node: str) -> None:
        # a job of a higher PriorityTier that needs the whole node: SLURM preempts the training job
        subprocess.run(["sbatch", "-p", "urgent", "-w", node, "--exclusive", "--mem=100",
                        "-o", str(tmp_path / "urgent.log"), "--wrap", "sleep 1"],
                       check=True, capture_output=True, text=True, timeout=30)

    work, env = _run_interrupted(tmp_path, tiny_model_dir, 100, preempt)  # no periodic save before the end
    # SIGTERM mid-run, a checkpoint at the next step boundary, exit 75 seen by Snakemake: the exec'd trainer is
    # Snakemake's own child (a shell between them dies of the signal first, "died with <Signals.SIGTERM>", and
    # the job ends while the trainer saves); the retry, a new SLURM job, resumed from that checkpoint
    slurm_logs = "".join(p.read_text() for p in (work / ".snakemake" / "slurm_logs").rglob("*.log"))
    assert "returned non-zero exit status 75" in slurm_logs and "died with <Signals.SIGTERM" not in slurm_logs
    assert _assert_resumed_once_each(work, env, tmp_path) >= 3


@pytest.mark.full  # a node taken down and brought back: the full tier (make test-full); the SIGTERM run above stays in CI
def test_a_training_job_whose_node_dies_loses_at_most_the_step_in_flight(slurm_cluster, tmp_path, tiny_model_dir):
    """Nothing saves on a dying node: with train.save_freq 1 (a LoRA checkpoint a step) the retry, on the other
    node, resumes from the last step boundary."""
    killed: dict = {}

    def kill_node(job: str, node: str) -> None:
        killed["traced"] = len((tmp_path / "preemption" / "out" / "train" / "state" / "data_trace.jsonl")
                               .read_text().splitlines())
        killed["node"] = node
        take_node_down(node)  # and nothing of the job survives on it:
        subprocess.run(["pkill", "-KILL", "-f", "--", "--work-dir out/train"], check=False, timeout=30)
        kill_job_steps_of(tmp_path / "preemption")

    try:
        work, env = _run_interrupted(tmp_path, tiny_model_dir, 1, kill_node)
    finally:
        if "node" in killed:
            resume_node(killed["node"])
    # the step being scored when the node died (traced + 1) at the latest is redone; nothing before it
    assert _assert_resumed_once_each(work, env, tmp_path) >= killed["traced"] - 1


def _trace(path: Path) -> dict[int, list[int]]:
    """step -> the dataset indices it trained on; each step once."""
    rows = [json.loads(x) for x in path.read_text().splitlines()]
    assert sorted(r["step"] for r in rows) == list(range(1, STEPS + 1))
    return {r["step"]: r["indices"] for r in rows}
