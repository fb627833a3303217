"""scripts/ray_cluster.sh: Ray head + workers over the allocation's nodes before verl (trainer.nnodes > 1).
Only one node exists here, so the multi-node path is checked as a dry run of the exact srun steps."""

from __future__ import annotations

import os
import shutil
import subprocess

import pytest

from tests.slurm.dag import REPO

SCRIPT = REPO / "scripts" / "ray_cluster.sh"


def _run(*args: str, **env: str) -> subprocess.CompletedProcess:
    full = {k: v for k, v in os.environ.items() if not k.startswith(("SLURM_", "LLMRNN_RAY", "CUDA_"))}
    full.update(env)
    return subprocess.run(["bash", str(SCRIPT), *args], env=full, capture_output=True, text=True, timeout=60,
                          check=False)


def test_dry_run_starts_head_then_workers_and_points_the_command_at_it():
    proc = _run("--dry-run", "--", "python", "-m", "verl.trainer.main_ppo", "trainer.nnodes=3",
                LLMRNN_RAY_NODES="gpu01 gpu02 gpu03", CUDA_VISIBLE_DEVICES="0,1", LLMRNN_RAY_CPUS_PER_NODE="16")
    assert proc.returncode == 0, proc.stderr
    lines = proc.stdout.strip().splitlines()
    assert lines[0].startswith("srun --overlap -N1 -n1 -w gpu01 ray start --head")
    assert "--num-gpus=2" in lines[0] and "--num-cpus=16" in lines[0]
    workers = [ln for ln in lines if "ray start --address=" in ln]
    assert [w.split(" -w ")[1].split()[0] for w in workers] == ["gpu02", "gpu03"]
    assert all(":6379" in w for w in workers)
    assert lines[-2].startswith("RAY_ADDRESS=") and lines[-2].endswith(":6379")
    assert lines[-1].strip() == "python -m verl.trainer.main_ppo trainer.nnodes=3"


def _scontrol_works() -> bool:
    """scontrol installed AND configured: with SLURM installed but not running it cannot even expand a list."""
    if not shutil.which("scontrol"):
        return False
    return subprocess.run(["scontrol", "show", "hostnames", "n[1-2]"], check=False, capture_output=True).returncode == 0


@pytest.mark.skipif(not _scontrol_works(), reason="no working SLURM client (scontrol missing or unconfigured)")
def test_nodelist_of_the_allocation_is_expanded():
    proc = _run("--dry-run", "--", "true", SLURM_JOB_NODELIST="a100-[07-08]")
    assert proc.returncode == 0, proc.stderr
    assert " -w a100-07 ray start --head" in proc.stdout and " -w a100-08 ray start --address" in proc.stdout


def test_one_node_runs_the_command_without_ray(tmp_path):
    marker = tmp_path / "ran"
    proc = _run("--", "bash", "-c", f"echo $RAY_ADDRESS > {marker}", LLMRNN_RAY_NODES="onlynode")
    assert proc.returncode == 0, proc.stderr
    assert marker.read_text().strip() == ""  # verl starts its own local Ray
    assert _run().returncode == 2  # no command: usage error
