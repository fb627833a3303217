"""llmrnn.train.ray_cluster without a cluster: what a job gives Ray (CPUs, temp dir, ports), the judge's
reachability rule, and the single-node overrides verl gets. The two-node run is tests/slurm/test_multinode.py."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from llmrnn.errors import InputError
from llmrnn.train import ray_cluster as rc


def test_cpus_come_from_the_job_never_from_the_node():
    assert rc.job_cpus({"SLURM_CPUS_PER_TASK": "6", "SLURM_CPUS_ON_NODE": "64"}) == 6
    assert rc.job_cpus({"SLURM_CPUS_ON_NODE": "4(x2)"}) == 4
    # outside SLURM: the CPUs this process may run on (its affinity), which a job's cgroup narrows
    assert rc.job_cpus({}) == len(os.sched_getaffinity(0))


def test_temp_dir_is_per_job_per_node_and_short_enough_for_ray_sockets():
    a = rc.temp_dir("node1", {"SLURM_JOB_ID": "17", "TMPDIR": "/scratch/job17"})
    b = rc.temp_dir("node1", {"SLURM_JOB_ID": "18", "TMPDIR": "/scratch/job17"})
    assert str(a) == "/scratch/job17/r17-node1.ray" and a != b
    assert not str(rc.temp_dir("node10", {"SLURM_JOB_ID": "17"})).startswith(str(rc.temp_dir("node1", {"SLURM_JOB_ID": "17"})))
    long_tmp = "/" + "x" * 80
    fallback = rc.temp_dir("node1", {"SLURM_JOB_ID": "17", "TMPDIR": long_tmp})
    assert str(fallback) == "/tmp/r17-node1.ray"
    assert str(rc.temp_dir("n1", {"SLURM_JOB_ID": "3", "RAY_TMPDIR": "/scratch/ray", "TMPDIR": "/tmp"})) \
        == "/scratch/ray/r3-n1.ray"
    assert len(str(fallback)) + rc.SESSION_SUFFIX_LEN <= rc.SOCKET_PATH_MAX
    with pytest.raises(InputError, match="short enough"):
        rc.temp_dir("n" * 80, {"SLURM_JOB_ID": "17"})


def test_single_node_verl_gets_the_jobs_cpus_and_temp_dir():
    ov = rc.single_node_overrides({"SLURM_CPUS_PER_TASK": "8", "SLURM_JOB_ID": "5", "TMPDIR": "/tmp"})
    assert "ray_kwargs.ray_init.num_cpus=8" in ov
    assert "+ray_kwargs.ray_init._temp_dir=/tmp/r5-local.ray" in ov


def test_node_command_sizes_and_ports_come_from_the_job(tmp_path):
    head = rc.node_command(head=True, address=None, node_ip="10.0.0.5", port=41000, num_cpus=6, num_gpus=2,
                           tmp=tmp_path)
    assert "--head" in head and "--port=41000" in head and "--num-cpus=6" in head and "--num-gpus=2" in head
    assert "--node-ip-address=10.0.0.5" in head and f"--temp-dir={tmp_path}" in head and "--block" in head
    assert "--include-dashboard=false" in head  # the dashboard's fixed port would be shared by two jobs
    worker = rc.node_command(head=False, address="10.0.0.5:41000", node_ip="10.0.0.6", port=None, num_cpus=6,
                             num_gpus=2, tmp=tmp_path)
    assert "--address=10.0.0.5:41000" in worker and "--head" not in worker
    fixed = [a for a in worker if a.startswith(("--dashboard-agent-listen-port", "--metrics-export-port"))]
    assert len(fixed) == 2 and all(int(a.split("=")[1]) > 0 for a in fixed)


def test_a_loopback_judge_is_refused_when_a_node_is_elsewhere():
    url = "http://127.0.0.1:8000/v1"
    problem = rc.judge_reach_problem(url, {"a100-01": "10.0.0.5", "a100-02": "10.0.0.6"})
    assert "a100-01, a100-02" in problem and "judge.host: node" in problem
    # every node on this very host (two slurmd on one machine): loopback reaches them all
    assert rc.judge_reach_problem(url, {"node1": "127.0.1.1", "node2": "127.0.1.2"}) is None
    assert rc.judge_reach_problem("http://10.0.0.5:8000/v1", {"a100-02": "10.0.0.6"}) is None
    assert rc.judge_reach_problem(None, {"a100-02": "10.0.0.6"}) is None


def test_reap_stops_only_this_jobs_processes(tmp_path):
    import subprocess
    import sys

    mine = tmp_path / "r1-node1.ray"
    other = tmp_path / "r2-node1.ray"
    mine.mkdir()
    procs = [subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)", f"--temp-dir={d}"])
             for d in (mine, other)]
    try:
        assert rc.reap(mine, grace_s=5) == 1
        assert procs[0].wait(timeout=10) != 0 and procs[1].poll() is None
        assert not mine.exists()
    finally:
        for p in procs:
            p.kill()
            p.wait()


VERL_PY = Path(__file__).resolve().parents[2] / ".venv-verl-0.7.1" / "bin" / "python"
COMPOSE = """
import json, sys
from pathlib import Path
import verl
from hydra import compose, initialize_config_dir
from omegaconf import OmegaConf
with initialize_config_dir(config_dir=str(Path(verl.__file__).parent / "trainer" / "config"), version_base=None):
    cfg = compose(config_name="ppo_trainer", overrides=json.loads(sys.argv[1]))
print(json.dumps(OmegaConf.to_container(cfg.ray_kwargs.ray_init)))
"""


def test_single_node_overrides_reach_verls_ray_init(tmp_path):
    """verl 0.7.1's main_ppo passes ray_kwargs.ray_init to ray.init(): the keys compose in its own config."""
    import json
    import subprocess

    if not VERL_PY.exists():
        pytest.skip("no .venv-verl-0.7.1: scripts/make_verl_env.sh 0.7.1")
    ov = rc.single_node_overrides({"SLURM_CPUS_PER_TASK": "8", "SLURM_JOB_ID": "42", "TMPDIR": "/tmp"})
    out = subprocess.run([str(VERL_PY), "-c", COMPOSE, json.dumps(ov)], capture_output=True, text=True,
                         timeout=300, check=False)
    assert out.returncode == 0, out.stderr[-2000:]
    ray_init = json.loads(out.stdout.strip().splitlines()[-1])
    assert ray_init == {"num_cpus": 8, "_temp_dir": "/tmp/r42-local.ray", "include_dashboard": False}


@pytest.mark.parametrize("nnodes", [1, 2])
def test_verl_run_gives_ray_the_job_or_refuses_a_missing_allocation(tmp_path, monkeypatch, nnodes):
    from llmrnn.errors import CheckFailed
    from llmrnn.train import verl_cmd
    from llmrnn.train.spec import RunSpec
    from tests.verl.rows import make_rows, write_parquet

    for var in ("SLURM_JOB_NODELIST", "SLURM_NODELIST"):
        monkeypatch.delenv(var, raising=False)
    monkeypatch.setenv("SLURM_CPUS_PER_TASK", "3")
    monkeypatch.setenv("SLURM_JOB_ID", "77")
    monkeypatch.setenv("TMPDIR", "/tmp")
    ran = []

    def main_ppo_not_run(cmd, env, out, follow, stop=None):  # no verl here: capture the command and stop
        ran.append(cmd)
        raise RuntimeError("stopped before verl")

    monkeypatch.setattr(verl_cmd, "_main_ppo", main_ppo_not_run)
    monkeypatch.setattr(rc, "allocation_nodes", lambda env=None: [])
    train = write_parquet(tmp_path / "train.parquet", make_rows(8))
    cfg = {"batch": {"train": 2, "mini": 2, "micro_per_gpu": 1}, "group_size": 2, "epochs": 1, "test_freq": 0,
           "nnodes": nnodes}
    spec = RunSpec(cfg, train_parquet=train, val_parquet=None, model_dir="m", work_dir=str(tmp_path / "w"),
                   adapter_dir=tmp_path / "a", metrics_path=tmp_path / "m.jsonl", run_name="e")
    if nnodes == 1:
        with pytest.raises(RuntimeError, match="stopped before verl"):
            verl_cmd.run(spec, verl_version="0.7.1")
        (cmd,) = ran
        assert "ray_kwargs.ray_init.num_cpus=3" in cmd and "+ray_kwargs.ray_init._temp_dir=/tmp/r77-local.ray" in cmd
    else:
        with pytest.raises(CheckFailed, match="train.nnodes is 2 but this job holds 0 node"):
            verl_cmd.run(spec, verl_version="0.7.1")
        assert ran == []


# --------------------------------------------------------------------------- start-up faults (issue 33 item 8)
def _sleeper(*marker: str):
    import subprocess
    import sys

    return subprocess.Popen([sys.executable, "-c", "import time; time.sleep(120)", *marker])


def test_a_worker_that_exits_at_once_is_reported_at_once_naming_its_node():
    """The probe would wait its whole timeout for the missing node; the node's step exiting ends the wait
    at once, naming the node (real processes: a probe that hangs, a head that runs, a worker that dies)."""
    import subprocess
    import sys
    import time

    from llmrnn.errors import CheckFailed

    head = _sleeper()
    worker = subprocess.Popen([sys.executable, "-c", "raise SystemExit(7)"])
    hung_probe = [sys.executable, "-c", "import time; time.sleep(300)"]
    try:
        t0 = time.monotonic()
        with pytest.raises(CheckFailed, match=r"ray: the worker on node gpu-07 exited with code 7 before the cluster"):
            rc._probe("127.0.0.1:1", 2, 0, None, dict(os.environ), 300.0, {"gpu-01": head, "gpu-07": worker},
                      cmd=hung_probe)
        assert time.monotonic() - t0 < 20
    finally:
        head.kill()
        head.wait()


def test_a_probe_past_its_limit_is_one_line_not_a_timeout_traceback(monkeypatch):
    import sys

    from llmrnn.errors import CheckFailed

    monkeypatch.setattr(rc, "PROBE_SLACK_S", 0.5)
    with pytest.raises(CheckFailed, match=r"ray: the start-up probe did not finish within 2 s"):
        rc._probe("127.0.0.1:1", 1, 0, None, dict(os.environ), 1.0, {},
                  cmd=[sys.executable, "-c", "import time; time.sleep(300)"])


def _listener(port_file: Path, *marker: str):
    import subprocess
    import sys
    import time

    code = ("import socket, sys, time; s = socket.socket(); s.bind(('127.0.0.1', 0)); s.listen(); "
            "open(sys.argv[1], 'w').write(str(s.getsockname()[1])); time.sleep(120)")
    proc = subprocess.Popen([sys.executable, "-c", code, str(port_file), *marker])
    deadline = time.monotonic() + 30
    while not (port_file.exists() and port_file.read_text()) and time.monotonic() < deadline:
        time.sleep(0.05)
    return proc, int(port_file.read_text())


def test_a_listener_on_the_head_port_that_is_not_this_jobs_ray_is_not_taken_for_the_head(tmp_path):
    from llmrnn.errors import CheckFailed

    head = _sleeper()
    other, port = _listener(tmp_path / "other")
    ours, our_port = _listener(tmp_path / "ours", "--temp-dir=/tmp/r17-gpu-01.ray/session_x/logs")
    try:
        with pytest.raises(CheckFailed, match=rf"ray: port {port} on 127.0.0.1 is held by pid {other.pid} .*not this "
                                              "job's Ray head"):
            rc._wait_port("127.0.0.1", port, 30, {"gpu-01": head}, marker="r17-gpu-01.ray")
        rc._wait_port("127.0.0.1", our_port, 30, {"gpu-01": head}, marker="r17-gpu-01.ray")  # this job's: taken
    finally:
        for p in (head, other, ours):
            p.kill()
            p.wait()
