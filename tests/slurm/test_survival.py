"""A long run survives the cluster (docs/cluster.md "Long runs"), on the real local SLURM through
profiles/slurm and its retries, in one Snakemake run (tests/slurm/survival_workflow): a job that dies of
memory is submitted again asking for more, and a shard whose node is killed mid-way continues on the other
node from the rows it kept, losing none and writing none twice."""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from tests.slurm.test_slurm_run import RUN_FLAGS, _env

pytestmark = [pytest.mark.slurm, pytest.mark.slow, pytest.mark.e2e]
HERE = Path(__file__).parent


def _worked(work: Path) -> list[dict]:
    log = work / "worked.log"
    return [json.loads(x) for x in log.read_text().splitlines()] if log.exists() else []


def _scontrol(*args: str, check: bool = True) -> None:
    subprocess.run(["scontrol", "update", *args], check=check, capture_output=True, text=True, timeout=30)


def take_node_down(node: str) -> None:
    """The node dies: SLURM takes it down (its jobs fail); drained, it stays out of service when its slurmd
    (alive here) registers again (ReturnToService=2). `resume_node` brings it back for the other tests."""
    _scontrol(f"NodeName={node}", "State=DOWN", "Reason=llmrnn-test-killed-node")
    _scontrol(f"NodeName={node}", "State=DRAIN", "Reason=llmrnn-test-killed-node")


def kill_job_steps_of(work: Path) -> None:
    """What a node taken down here leaves running (proctrack/linuxproc, no cgroups): the job steps' Snakemake
    of the workflow in `work` (`--snakefile WORK/Snakefile`), which would wait for its dead job forever."""
    subprocess.run(["pkill", "-KILL", "-f", "--", f"--snakefile {work}/Snakefile"], check=False, timeout=30)


def resume_node(node: str) -> None:
    _scontrol(f"NodeName={node}", "State=RESUME", check=False)


@contextlib.contextmanager
def snakemake_through_the_profile(work: Path, env: dict, log_path: Path):
    """`snakemake --profile profiles/slurm all` started in `work`, its output to a file (a pipe nobody reads
    would block it), stopped if it still runs when the block ends."""
    with open(log_path, "w") as log:
        proc = subprocess.Popen([str(Path(sys.executable).parent / "snakemake"), "--profile", "profiles/slurm",
                                 "all", *RUN_FLAGS], cwd=work, env=env, stdout=log, stderr=subprocess.STDOUT,
                                start_new_session=True)
        try:
            yield proc
        finally:
            if proc.poll() is None:
                os.killpg(proc.pid, signal.SIGTERM)
                proc.wait(timeout=60)


def test_memory_retry_and_a_killed_node_lose_no_row(slurm_cluster, tmp_path):
    work = tmp_path / "survival"
    shutil.copytree(HERE / "survival_workflow", work)
    shutil.copytree(HERE.parents[1] / "profiles", work / "profiles")
    (work / "hold").touch()
    env = _env(tmp_path, LLMRNN_CONFIGFILE="config/survival.yaml", LLMRNN_SLURM_RETRIES="2",
               PYTHONPATH=os.pathsep.join(p for p in sys.path if p))
    killed = None
    try:
        with snakemake_through_the_profile(work, env, tmp_path / "snakemake.log") as proc:
            give_up = time.time() + 600  # a guard against a hung run, not a timing assertion
            while not any(w["item"] == 3 for w in _worked(work)):  # the shard holds in row 3, rows 0-2 kept
                assert proc.poll() is None, (tmp_path / "snakemake.log").read_text()[-6000:]
                assert time.time() < give_up, "the shard never reached row 3"
                time.sleep(0.5)
            first = next(w for w in _worked(work) if w["item"] == 3)
            killed = first["node"]
            take_node_down(killed)  # and nothing of the job survives on it
            try:
                os.kill(first["pid"], signal.SIGKILL)
            except ProcessLookupError:
                pass
            kill_job_steps_of(work)
            (work / "hold").unlink()
            proc.wait(timeout=900)
    finally:
        if killed:
            resume_node(killed)
    assert proc.returncode == 0, (tmp_path / "snakemake.log").read_text()[-6000:]

    # memory: the first attempt asked SLURM for 300 MB and died of it, the retry asked for 600 and finished
    # (the executor adds a MB or so for its own process)
    attempts = [line.split() for line in (work / "attempts_hungry.log").read_text().splitlines()]
    assert len(attempts) == 2 and attempts[0][0] != attempts[1][0], attempts  # two SLURM jobs
    assert 300 <= int(attempts[0][1]) < 400 and 600 <= int(attempts[1][1]) < 700, attempts
    assert (work / "out" / "hungry.txt").read_text().strip() == "ok"

    # the shard: every row once, in order; only the row that was running when the node died was redone, by
    # Snakemake's retry (a new SLURM job) on the other node
    rows = [json.loads(x) for x in (work / "out" / "shard.jsonl").read_text().splitlines()]
    assert rows == [{"item": i, "square": i * i} for i in range(8)]
    worked = _worked(work)
    assert [w["item"] for w in worked] == [0, 1, 2, 3, 3, 4, 5, 6, 7], worked
    assert worked[3]["node"] == killed != worked[4]["node"] and worked[3]["job"] != worked[4]["job"]
    assert not (work / "out" / "shard.jsonl.partial").exists()
