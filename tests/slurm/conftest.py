"""A real two-node SLURM on this host (.ci/slurm/up.sh) for the tests marked `slurm`; skipped, with the reason,
where it cannot run (not root, no Debian packages, daemons do not come up)."""

from __future__ import annotations

import os
import shutil
import subprocess
import time

import pytest

from tests.slurm.dag import REPO

UP = REPO / ".ci" / "slurm" / "up.sh"
DOWN = REPO / ".ci" / "slurm" / "down.sh"


def _cluster_up() -> bool:
    if not shutil.which("sinfo"):
        return False
    proc = subprocess.run(["sinfo", "-h", "-o", "%P %T"], check=False, capture_output=True, text=True, timeout=20)
    return proc.returncode == 0 and "gpu-a100" in proc.stdout and "cpu" in proc.stdout


@pytest.fixture(scope="session")
def slurm_cluster():
    """Partitions cpu + gpu-a100 over node1 and node2 (two slurmd here), 4 fake A100s each. Started here (and stopped at the end)
    unless already up (e.g. by .ci/run, which then stops it)."""
    if os.environ.get("LLMRNN_SKIP_SLURM"):
        pytest.skip(f"LLMRNN_SKIP_SLURM is set ({os.environ['LLMRNN_SKIP_SLURM']})")
    if _cluster_up():
        yield
        return
    if os.geteuid() != 0:
        pytest.skip("a local SLURM needs root (munged, slurmctld, slurmd run as root); run as root or in CI")
    proc = subprocess.run(["bash", str(UP)], check=False, capture_output=True, text=True, timeout=900)
    if proc.returncode == 2:
        pytest.skip(f"cannot set up a local SLURM: {proc.stderr.strip().splitlines()[-1:]}")
    assert proc.returncode == 0, f".ci/slurm/up.sh failed:\n{proc.stdout}\n{proc.stderr}"
    assert _cluster_up(), "SLURM came up without the cpu/gpu-a100 partitions"
    try:
        yield
    finally:
        subprocess.run(["bash", str(DOWN)], check=False, capture_output=True, text=True, timeout=60)


@pytest.fixture(autouse=True)
def no_job_outlives_its_test(request):
    """A test that fails or times out leaves its SLURM jobs (trainers, Ray heads) running; on CI's 2 cores they
    would slow every later test. Each SLURM test ends with the queue cancelled and empty."""
    yield
    if "slurm_cluster" not in request.fixturenames or not shutil.which("squeue"):
        return
    left = subprocess.run(["squeue", "-h", "-o", "%i"], check=False, capture_output=True, text=True, timeout=20)
    if not left.stdout.split():
        return
    subprocess.run(["scancel", "--full", *left.stdout.split()], check=False, capture_output=True, timeout=20)
    for _ in range(60):
        if not subprocess.run(["squeue", "-h"], check=False, capture_output=True, text=True, timeout=20).stdout.strip():
            return
        time.sleep(1)
