"""Training across nodes on a real two-node SLURM (.ci/slurm/up.sh: two slurmd on this host): the
judge/trainer group through profiles/slurm with train.nnodes 2 is one job over node1 and node2;
`llmrnn train run` starts Ray on both (head + worker by srun) and the CPU stand-in for verl's trainer
(multinode_workflow/standin) finds 2 Ray nodes, runs a task on each that scores through the real
reward against the real judge (bound to node1's address), and leaves no Ray process behind: neither
after success nor after `scancel`."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import time
from pathlib import Path

import pytest

from tests.slurm.dag import REPO
from tests.slurm.slurmjobs import jobs_of_run
from tests.slurm.test_slurm_run import RUN_FLAGS, _env, _snakemake

# two Ray clusters' raylets must register with their GCS within Ray's fixed 30 s: on a loaded 2-core host
# they do not, so these run in the full tier (make test-full), not beside CI's other tiers
pytestmark = [pytest.mark.slurm, pytest.mark.slow, pytest.mark.e2e, pytest.mark.full]
HERE = Path(__file__).parent
VERL_PY = REPO / ".venv-verl-0.7.1" / "bin" / "python"
TRAIN = {"engine": "verl", "nnodes": 2, "n_gpus_per_node": 2, "group_size": 2, "epochs": 1, "total_steps": 1,
         "test_freq": 0, "val_before_train": False, "batch": {"train": 2, "mini": 2, "micro_per_gpu": 1},
         "lora": {"rank": 8, "alpha": 16}}


def _two_nodes() -> bool:
    out = subprocess.run(["sinfo", "-h", "-N", "-p", "gpu-a100", "-o", "%N"], capture_output=True, text=True,
                         check=False, timeout=20).stdout.split()
    return len(set(out)) >= 2


def _ray_processes(jobid: str) -> list[str]:
    """Processes of this job's Ray on this host (both nodes live here): its temp dirs are /.../r<jobid>-*."""
    marker = f"/r{jobid}-".encode()
    found = []
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                cmdline = (entry / "cmdline").read_bytes()
            except OSError:
                continue
            if marker in cmdline:
                text = cmdline.replace(b"\0", b" ").decode(errors="replace")
                found.append(f"{entry.name}: {text[:150]}")
    return found


@pytest.fixture
def multinode_workdir(slurm_cluster, tmp_path, tiny_model_dir):
    if not VERL_PY.exists():
        pytest.skip("no .venv-verl-0.7.1 (Ray comes with verl): scripts/make_verl_env.sh 0.7.1")
    if not _two_nodes():
        pytest.skip("the local SLURM has one node (an older .ci/slurm/up.sh is running)")
    from tests.judge_helpers import write_rubric
    from tests.verl.rows import make_rows, write_parquet

    work = tmp_path / "mn"
    shutil.copytree(HERE / "multinode_workflow", work)
    shutil.copytree(REPO / "profiles", work / "profiles")
    (work / "model").symlink_to(tiny_model_dir)
    (work / "data").mkdir()
    write_parquet(work / "data" / "train.parquet", make_rows(4))
    shutil.move(write_rubric(tmp_path, score_method="expected", prefix="Score:", model=str(tiny_model_dir),
                             source="path", max_tokens=3),
                work / "rubric.yaml")
    cfg = {"verl_python": str(VERL_PY), "judge_host": "node",
           "cfg": {"train": TRAIN, "reward": {"mode": "scalar"}, "preflight": {"max_fallback_rate": 1.0}}}
    (work / "config").mkdir()
    (work / "config" / "multinode.yaml").write_text(json.dumps(cfg))
    return work


def _missing_in_verl_venv(tmp_path: Path) -> Path:
    """The verl test venv holds verl's stack, not llmrnn's: its retry dependency (tenacity, pure Python,
    in envs/gpu-lock.txt) is linked in from this venv."""
    import tenacity

    extra = tmp_path / "verl-venv-extra"
    extra.mkdir(exist_ok=True)
    link = extra / "tenacity"
    if not link.exists():
        link.symlink_to(Path(tenacity.__file__).parent)
    return extra


def _mn_env(tmp_path: Path, **extra: str) -> dict[str, str]:
    from tests.judge_helpers import make_step

    path = [HERE / "multinode_workflow" / "standin", REPO / "src", _missing_in_verl_venv(tmp_path)]
    return _env(tmp_path, LLMRNN_CONFIGFILE="config/multinode.yaml", LLMRNN_TRAIN_NODES="2",
                LLMRNN_TRAIN_GPUS="2", LLMRNN_JUDGE_GPUS="1", PYTHONPATH=os.pathsep.join(map(str, path)),
                STANDIN_GROUND_TRUTH=json.dumps(make_step()), **extra)


def test_two_node_training_job_scores_on_both_nodes_and_leaves_no_ray(multinode_workdir, tmp_path):
    work = multinode_workdir
    env = _mn_env(tmp_path)
    _snakemake(work, env, "--profile", "profiles/slurm", "all", *RUN_FLAGS, "--set-threads", "judge_server=0",
               timeout=1800)  # a hang guard: beside CI's other tiers (load 9) the run outlasted 600 s
    (job,) = jobs_of_run(work)  # one sbatch for the group, over both nodes
    record = job.rules
    assert record == {"judge_server", "train_grpo"}, record
    report = json.loads((work / "out" / "train" / "standin_report.json").read_text())
    assert len(report["ray_nodes"]) == 2
    assert all(n["resources"].get("GPU") == 2 for n in report["ray_nodes"]), report["ray_nodes"]
    # Ray's node addresses are the SLURM nodes' (loopback) addresses, never the interface address
    assert sorted(n["ip"] for n in report["ray_nodes"]) == ["127.0.1.1", "127.0.1.2"]
    assert sorted(t["slurm_node"] for t in report["tasks"]) == ["node1", "node2"]
    for task in report["tasks"]:  # the real reward asked the real judge from each node
        assert task["result"]["judge_calls"] >= 1 and 0.0 <= task["result"]["score"] <= 1.0, task
    assert report["ray_address"].startswith("127.0.1.1:")
    log = (work / "logs" / "train_grpo.log").read_text()
    assert "ray: stopped on node1" in log and "ray: stopped on node2" in log, log[-3000:]
    assert json.loads((work / "out" / "summary.json").read_text())["steps"] == 1
    assert _ray_processes(job.jobid) == []
    assert not list(Path("/tmp").glob(f"r{job.jobid}-*"))  # temp dirs removed


def test_scancel_leaves_no_ray_process_on_any_node(multinode_workdir, tmp_path):
    work = multinode_workdir
    hold = work / "out" / "holding"
    env = _mn_env(tmp_path, STANDIN_HOLD_FILE=str(hold))
    proc = subprocess.Popen([str(Path(sys.executable).parent / "snakemake"), "--profile", "profiles/slurm", "all",
                             *RUN_FLAGS, "--set-threads", "judge_server=0"], cwd=work, env=env,
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        deadline = time.time() + 1200  # a hang guard, as above
        while not hold.exists():
            assert proc.poll() is None, "the workflow ended before the stand-in held"
            assert time.time() < deadline, "the stand-in never reached the hold point"
            time.sleep(1)
        (job,) = jobs_of_run(work)
        assert len(_ray_processes(job.jobid)) >= 2  # a raylet per node (and the head's GCS) are up
        subprocess.run(["scancel", job.jobid], check=True, timeout=30)
        for _ in range(120):
            state = subprocess.run(["squeue", "-h", "-j", job.jobid, "-o", "%T"], capture_output=True,
                                   text=True, check=False).stdout.strip()
            if state not in ("PENDING", "RUNNING", "COMPLETING") and not _ray_processes(job.jobid):
                break
            time.sleep(1)
        assert _ray_processes(job.jobid) == []
        # no new srun step runs in a cancelled job: each node's own step stopped its Ray and removed its dir
        log = (work / "logs" / "train_grpo.log").read_text()
        assert "ray node node1: stopped" in log and "ray node node2: stopped" in log, log[-3000:]
        assert not list(Path("/tmp").glob(f"r{job.jobid}-*"))
    finally:
        if proc.poll() is None:  # Snakemake takes minutes to notice a cancelled job: not what is tested
            proc.kill()
            proc.wait(timeout=60)
