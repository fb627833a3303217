"""Ray for verl inside one SLURM allocation: sized by the job, private to the job, torn down with it.

verl runs on Ray. With `train.nnodes: N` the training job holds N nodes (profiles/slurm asks SLURM for
them); `cluster()` starts a Ray head on the node the training step runs on and a worker on each other
node of the allocation (one `srun --overlap -N1 -n1 -w NODE` step per node), waits until Ray sees the N
nodes with the expected GPUs, checks from every node that the judge answers, and yields the address
verl's `ray.init()` joins (RAY_ADDRESS). On the way out (success, failure, timeout, SIGTERM from
`scancel`) it stops every node's step and then, per node, kills whatever Ray process of THIS job is
left (found by the job's own temp dir on its command line: `ray stop` would also kill another job's
Ray on a shared node) and removes the temp dirs.

Everything Ray takes from the machine comes from the job, so two jobs on one node do not collide:
- CPUs: `--num-cpus` from SLURM_CPUS_PER_TASK / SLURM_CPUS_ON_NODE (never every core of the node);
- ports: each node step picks free ports on its node (GCS, client server, agents, metrics);
- temp dirs: `$RAY_TMPDIR/rJOB-NODE.ray` or `$TMPDIR/...` (or /tmp/... when those are too long: Ray's
  socket paths below it must stay under the ~107-character limit of a Unix socket path), removed at
  the end by each node's own step;
- token: Ray 2.5x+ turns token authentication on by default; the job writes its own token (0600) in
  its work dir on the shared filesystem and every node and the driver get RAY_AUTH_TOKEN_PATH.
With one node verl starts Ray itself: `single_node_overrides()` gives it the job's CPUs and temp dir.

Node addresses are what SLURM uses to reach the node (`scontrol show node`: NodeAddr, resolved), so
the head, the workers and the judge agree on one address per node. NCCL picks its own interface:
set NCCL_SOCKET_IFNAME (and NCCL_IB_DISABLE=1 without InfiniBand) when nodes have several.
"""

from __future__ import annotations

import contextlib
import ipaddress
import json
import logging
import os
import secrets
import shutil
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from pathlib import Path
from urllib.parse import urlparse

from llmrnn import io
from llmrnn.errors import CheckFailed, InputError
from llmrnn.gpus import is_loopback, node_address, this_node
from llmrnn.judge.launcher import free_port as free_port_on
from llmrnn.safe_path import safe_path_env

log = logging.getLogger(__name__)

# Ray puts `session_<date>_<time>_<usec>_<pid>/sockets/plasma_store` under its temp dir; a Unix socket
# path holds at most 107 characters.
SOCKET_PATH_MAX = 107
SESSION_SUFFIX_LEN = len("/session_2026-01-01_00-00-00_000000_4194304/sockets/plasma_store")
START_TIMEOUT_S = 300.0
STOP_GRACE_S = 30.0
# per node, after SIGTERM: `ray start` gets this long, then its leftovers are reaped (SIGTERM, SIGKILL:
# 5 s each); all of it within SLURM's default KillWait of 30 s
NODE_STOP_GRACE_S = 10.0


# ----------------------------------------------------------------------------- what the job gives Ray
def job_cpus(env: Mapping[str, str] | None = None) -> int:
    """CPUs of this job on this node: SLURM_CPUS_PER_TASK, else SLURM_CPUS_ON_NODE, else the CPUs this
    process may run on (its affinity mask), never the node's core count."""
    env = os.environ if env is None else env
    for key in ("SLURM_CPUS_PER_TASK", "SLURM_CPUS_ON_NODE"):
        value = (env.get(key) or "").split("(")[0].split(",")[0]  # "4(x2)" in some SLURM outputs
        if value.isdigit() and int(value) > 0:
            return int(value)
    return len(os.sched_getaffinity(0))


def job_id(env: Mapping[str, str] | None = None) -> str:
    env = os.environ if env is None else env
    return env.get("SLURM_JOB_ID") or f"p{os.getpid()}"


def temp_dir(tag: str, env: Mapping[str, str] | None = None) -> Path:
    """A short per-job temp dir for Ray: under RAY_TMPDIR (Ray's own variable) or the job's TMPDIR when
    Ray's socket paths fit below it, else under /tmp (still job-specific)."""
    env = os.environ if env is None else env
    name = f"r{job_id(env)}-{tag}.ray"  # the suffix ends the name: node1's dir is no prefix of node10's
    for root in (env.get("RAY_TMPDIR"), env.get("TMPDIR"), "/tmp"):
        if not root:
            continue
        path = Path(root) / name
        if len(str(path)) + SESSION_SUFFIX_LEN <= SOCKET_PATH_MAX:
            return path
    raise InputError(f"ray: no temp dir short enough for Ray's socket paths ({SOCKET_PATH_MAX} characters): "
                     f"/tmp/{name}")


def single_node_overrides(env: Mapping[str, str] | None = None) -> list[str]:
    """verl 0.7.1 starts Ray itself on one node (ray_kwargs.ray_init is passed to ray.init): give it the
    job's CPUs, a per-job temp dir and no dashboard (a fixed port two jobs would share)."""
    return [
        f"ray_kwargs.ray_init.num_cpus={job_cpus(env)}",
        f"+ray_kwargs.ray_init._temp_dir={temp_dir('local', env)}",
        "+ray_kwargs.ray_init.include_dashboard=false",
    ]


def allocation_nodes(env: Mapping[str, str] | None = None) -> list[str]:
    """The nodes of this SLURM job, in SLURM's order. From the job's record: inside a step
    SLURM_JOB_NODELIST may name only the step's nodes (Snakemake's jobstep runs each rule as a
    one-task step)."""
    env = os.environ if env is None else env
    nodelist = None
    if jobid := env.get("SLURM_JOB_ID"):
        out = subprocess.run(["scontrol", "show", "job", "-o", jobid], capture_output=True, text=True,
                             check=False, timeout=60)
        for token in out.stdout.split():
            if token.startswith("NodeList="):
                nodelist = token.split("=", 1)[1]
    nodelist = nodelist or env.get("SLURM_JOB_NODELIST") or env.get("SLURM_NODELIST")
    if not nodelist or nodelist == "(null)":
        return []
    out = subprocess.run(["scontrol", "show", "hostnames", nodelist], capture_output=True, text=True,
                         check=False, timeout=60)
    if out.returncode != 0:
        raise CheckFailed(f"ray: scontrol show hostnames {nodelist} failed: {out.stderr.strip()[:200]}")
    return out.stdout.split()


def judge_reach_problem(judge_url: str | None, node_addresses: Mapping[str, str]) -> str | None:
    """A judge on a loopback address is reachable only from nodes on the same host, i.e. nodes whose own
    address is loopback too (two slurmd on one host); any other node cannot reach it."""
    if not judge_url:
        return None
    host = urlparse(judge_url).hostname or ""
    if not is_loopback(host):
        return None
    remote = sorted(n for n, a in node_addresses.items() if not ipaddress.ip_address(a).is_loopback)
    if not remote:
        return None
    return (f"judge: the endpoint {judge_url} is a loopback address, unreachable from training node(s) "
            f"{', '.join(remote)}: set judge.host: node (the judge binds to its node's address)")


def judge_layout_problem(judge_url: str | None, nnodes: int) -> str | None:
    """For the preflight (in the job, before training): with several training nodes, can every node of
    the allocation reach the judge? Without an allocation the nodes are unknown: a loopback judge fails."""
    if nnodes <= 1 or not judge_url:
        return None
    nodes = allocation_nodes()
    addresses = {n: node_address(n) for n in nodes} if nodes else {f"({nnodes} training nodes)": "192.0.2.1"}
    return judge_reach_problem(judge_url, addresses)


def free_port() -> int:
    """A port free on every address of this node (Ray's servers listen on all of them)."""
    return free_port_on("")


def ray_executable() -> str:
    """The `ray` command of this Python environment (the one verl runs in)."""
    beside = Path(sys.executable).parent / "ray"
    return str(beside) if beside.exists() else (shutil.which("ray") or "ray")


# ----------------------------------------------------------------------------- one node (runs on it)
def node_command(*, head: bool, address: str | None, node_ip: str, port: int | None, num_cpus: int,
                 num_gpus: int, tmp: Path) -> list[str]:
    """`ray start --block` for this node, every port free here, every size from the job."""
    cmd = [ray_executable(), "start", "--block", f"--node-ip-address={node_ip}", f"--num-cpus={num_cpus}",
           f"--num-gpus={num_gpus}", f"--temp-dir={tmp}", "--disable-usage-stats",
           f"--dashboard-agent-listen-port={free_port()}", f"--dashboard-agent-grpc-port={free_port()}",
           f"--metrics-export-port={free_port()}", f"--runtime-env-agent-port={free_port()}"]
    if head:
        cmd += ["--head", f"--port={port}", f"--ray-client-server-port={free_port()}", "--include-dashboard=false"]
    else:
        cmd += [f"--address={address}"]
    return cmd


def cmd_node(args) -> int:
    """`llmrnn train ray-cluster node`: run by srun on each node. Runs `ray start --block` and, when it
    ends (the driver's teardown, or SIGTERM from scancel / the time limit, which it passes on), stops
    what is left of this job's Ray here and removes the temp dir: even when no new srun step can run."""
    env = os.environ
    cpus = min(args.num_cpus, job_cpus(env)) if args.num_cpus else job_cpus(env)
    node = this_node(env)
    tmp = temp_dir(node, env)
    cmd = node_command(head=args.head, address=args.address, node_ip=node_address(node), port=args.port,
                       num_cpus=cpus, num_gpus=args.num_gpus, tmp=tmp)
    log.info("ray node %s: %s", node, " ".join(cmd))
    # umask 077 for the raylet and every worker it forks: rollout dumps and audits hold patient text
    proc = subprocess.Popen(cmd, umask=0o077)
    stopping: list[int] = []

    def stop(signum, _frame):
        stopping.append(signum)
        proc.send_signal(signum)

    for signum in (signal.SIGTERM, signal.SIGINT):
        signal.signal(signum, stop)
    try:
        while proc.poll() is None and not stopping:
            time.sleep(0.5)
        # `ray start` drains its node on SIGTERM, which waits for a head that may be gone already
        # (scancel stops every node at once): give it a moment, then reap within SLURM's KillWait
        with contextlib.suppress(subprocess.TimeoutExpired):
            proc.wait(timeout=NODE_STOP_GRACE_S)
        return proc.returncode if proc.returncode is not None else 1
    finally:
        n = reap(tmp, grace_s=5.0)
        log.info("ray node %s: stopped (%d leftover process(es) signalled), %s removed", node, n, tmp)


def private_worker() -> None:
    """Ray's `worker_process_setup_hook` for verl's workers (llmrnn.train.verl_overrides.runtime_env_overrides):
    umask 077 in every worker process on every node, whatever umask its raylet was started with, so the
    rollout dumps and reward audits it writes (patient text) are readable by the user alone."""
    os.umask(0o077)


def job_processes(marker: str) -> list[int]:
    """Pids whose command line mentions `marker` (this job's Ray temp dir), except this process."""
    pids = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit() or int(entry.name) == os.getpid():
            continue
        try:
            cmdline = (entry / "cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
        except OSError:
            continue
        if marker in cmdline:
            pids.append(int(entry.name))
    return pids


def reap(tmp: Path, grace_s: float = 10.0) -> int:
    """Stop what is left of this job's Ray on this node (SIGTERM, then SIGKILL) and remove its temp dir.
    Returns how many processes had to be signalled."""
    pids = job_processes(str(tmp))
    for sig in (signal.SIGTERM, signal.SIGKILL):
        for pid in pids:
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.kill(pid, sig)
        deadline = time.time() + grace_s
        while time.time() < deadline and job_processes(str(tmp)):
            time.sleep(0.2)
        if not job_processes(str(tmp)):
            break
    shutil.rmtree(tmp, ignore_errors=True)
    return len(pids)


def cmd_stop(args) -> int:
    """`llmrnn train ray-cluster stop`: run by srun on each node at teardown."""
    tmp = temp_dir(this_node(), os.environ)
    n = reap(tmp)
    left = job_processes(str(tmp))
    print(json.dumps({"node": this_node(), "signalled": n, "left": len(left)}))
    return 1 if left else 0


# ----------------------------------------------------------------------------- the driver side
@dataclass
class Cluster:
    address: str
    nodes: list[str]
    env: dict[str, str]  # what verl's driver needs to join (RAY_ADDRESS, token)
    probe: dict


def _srun(node: str, *cmd: str) -> list[str]:
    # --overlap: share the CPUs/GPUs the training step already holds on its node
    return ["srun", "--overlap", "--nodes=1", "--ntasks=1", "-w", node, "--kill-on-bad-exit=0", *cmd]


def _self_cli(*args: str) -> list[str]:
    return [sys.executable, "-m", "llmrnn.cli", "train", "ray-cluster", *args]


def _exited(steps: Mapping[str, subprocess.Popen], head: str | None) -> None:
    """CheckFailed naming the first node whose `ray start` step has exited (it cannot join any more)."""
    for node, step in steps.items():
        if step.poll() is not None:
            role = "head" if node == head else "worker"
            raise CheckFailed(f"ray: the {role} on node {node} exited with code {step.returncode} before the cluster "
                              f"was up (its `ray start` failed there); see the train log")


def listening_pids(port: int) -> list[int] | None:
    """Pids of the processes that listen on TCP `port` on this node (from /proc/net/tcp{,6} and the
    processes' fds); None when something listens but its owner cannot be seen (another user's process)."""
    inodes = set()
    for table in ("/proc/net/tcp", "/proc/net/tcp6"):
        with contextlib.suppress(OSError):
            for line in Path(table).read_text().splitlines()[1:]:
                f = line.split()
                if len(f) > 9 and f[3] == "0A" and int(f[1].rsplit(":", 1)[1], 16) == port:
                    inodes.add(f[9])
    if not inodes:
        return []
    want = {f"socket:[{i}]" for i in inodes}
    pids = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        with contextlib.suppress(OSError):
            if any(os.readlink(fd) in want for fd in (entry / "fd").iterdir()):
                pids.append(int(entry.name))
    return pids or None


def _cmdline(pid: int) -> str:
    try:
        return (Path("/proc") / str(pid) / "cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace").strip()
    except OSError:
        return ""


def _wait_port(host: str, port: int, timeout_s: float, steps: Mapping[str, subprocess.Popen],
               marker: str | None = None) -> None:
    """Until the head's `ray start` listens on host:port. The listener must be THIS job's Ray (its command
    line names the job's temp dir, `marker`): another process on the port is refused at once, naming it."""
    deadline = time.time() + timeout_s
    head = next(iter(steps), None)
    while time.time() < deadline:
        _exited(steps, head)
        with contextlib.suppress(OSError), socket.create_connection((host, port), timeout=2):
            if marker is None:
                return
            pids = listening_pids(port)
            if pids and any(marker in _cmdline(p) for p in pids):
                return
            if pids:
                who = ", ".join(f"pid {p} ({_cmdline(p)[:80] or '?'})" for p in pids)
                raise CheckFailed(f"ray: port {port} on {host} is held by {who}, not this job's Ray head; "
                                  "nothing joined it (rerun: the head takes another free port)")
        time.sleep(0.5)
    raise CheckFailed(f"ray: the head did not listen on {host}:{port} within {timeout_s:.0f} s")


PROBE_SLACK_S = 120.0  # the probe's own start (imports, ray.init) beyond its --timeout


def _kill(proc: subprocess.Popen) -> None:
    if proc.poll() is None:
        proc.kill()
    with contextlib.suppress(subprocess.TimeoutExpired):
        proc.communicate(timeout=10)


def _probe(address: str, nodes: int, gpus: int, judge_url: str | None, env: dict, timeout_s: float,
           steps: Mapping[str, subprocess.Popen] | None = None, cmd: list[str] | None = None) -> dict:
    """Run the probe (a Ray driver) while watching every node's step: a node whose `ray start` exits is
    reported at once, naming it; a probe that outlives its timeout + PROBE_SLACK_S is killed, one line."""
    if cmd is None:
        cmd = _self_cli("probe", "--address", address, "--nodes", str(nodes), "--gpus", str(gpus),
                        "--timeout", str(timeout_s))
        if judge_url:
            cmd += ["--judge-url", judge_url]
    steps = steps or {}
    limit = timeout_s + PROBE_SLACK_S
    deadline = time.monotonic() + limit
    proc = subprocess.Popen(cmd, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        while True:
            try:
                stdout, stderr = proc.communicate(timeout=0.5)
                break
            except subprocess.TimeoutExpired:
                pass
            _exited(steps, next(iter(steps), None))
            if time.monotonic() > deadline:
                raise CheckFailed(f"ray: the start-up probe did not finish within {limit:.0f} s (train.ray "
                                  f"start timeout {timeout_s:.0f} s + {PROBE_SLACK_S:.0f} s); see the train log")
    finally:
        _kill(proc)
    report = (stdout.strip().splitlines() or [""])[-1]  # the probe prints one JSON line last
    if proc.returncode != 0 or not report:
        why = (stderr.strip().splitlines() or ["no output"])[-1]
        raise CheckFailed(f"ray: {why[:300]}")
    return json.loads(report)


@contextlib.contextmanager
def cluster(*, nodes: list[str], gpus_per_node: int, state_dir: Path, judge_url: str | None = None,
            timeout_s: float = START_TIMEOUT_S) -> Iterator[Cluster]:
    """A Ray cluster over `nodes` (head: the node this runs on), torn down on any exit."""
    head = this_node()
    if head not in nodes:
        raise CheckFailed(f"ray: this step runs on {head}, not on a node of the allocation ({', '.join(nodes)})")
    ordered = [head] + [n for n in nodes if n != head]
    addresses = {n: node_address(n) for n in ordered}
    if problem := judge_reach_problem(judge_url, addresses):
        raise CheckFailed(problem)
    state_dir.mkdir(parents=True, exist_ok=True)
    token = state_dir / "ray_auth_token"
    io.write_text(token, secrets.token_hex(32) + "\n", mode=0o600)
    # PYTHONSAFEPATH: `python -m llmrnn.cli` on each node, and the raylets and workers it starts
    env = safe_path_env({**os.environ, "RAY_AUTH_MODE": "token", "RAY_AUTH_TOKEN_PATH": str(token),
                         "RAY_USAGE_STATS_ENABLED": "0"})
    env.pop("RAY_ADDRESS", None)
    port = free_port()
    address = f"{addresses[head]}:{port}"
    cpus = job_cpus()
    log.info("ray: %d nodes (%s), head %s at %s, %d GPU(s) and up to %d CPU(s) per node", len(ordered),
             ", ".join(ordered), head, address, gpus_per_node, cpus)
    steps: dict[str, subprocess.Popen] = {}  # node -> its `ray start --block` step (the head first)
    # scancel sends SIGTERM: turn it into an exception so the teardown below runs
    previous = signal.signal(signal.SIGTERM, _raise_on_sigterm)
    try:
        steps[head] = subprocess.Popen(_srun(head, *_self_cli("node", "--head", "--port", str(port),
                                                              "--num-cpus", str(cpus), "--num-gpus",
                                                              str(gpus_per_node))), env=env, stdout=sys.stderr)
        # the head's Ray processes name its temp dir (r<job>-<node>.ray) on their command lines
        _wait_port(addresses[head], port, timeout_s, steps, marker=temp_dir(head, env).name)
        for node in ordered[1:]:
            steps[node] = subprocess.Popen(_srun(node, *_self_cli("node", "--address", address, "--num-cpus",
                                                                  str(cpus), "--num-gpus", str(gpus_per_node))),
                                           env=env, stdout=sys.stderr)
        probe = _probe(address, len(ordered), gpus_per_node, judge_url, env, timeout_s, steps)
        log.info("ray: %d nodes joined: %s", len(probe["nodes"]), json.dumps(probe))
        yield Cluster(address, ordered, {"RAY_ADDRESS": address, "RAY_AUTH_MODE": "token",
                                         "RAY_AUTH_TOKEN_PATH": str(token)}, probe)
    finally:
        signal.signal(signal.SIGTERM, signal.SIG_IGN)  # a second scancel signal must not cut the teardown
        try:
            teardown(ordered, list(steps.values()), env)
        finally:
            token.unlink(missing_ok=True)
            signal.signal(signal.SIGTERM, previous)


class Terminated(CheckFailed):
    """SIGTERM (scancel, the job's time limit) while Ray was up."""


def _raise_on_sigterm(*_):
    raise Terminated("train: terminated (SIGTERM: scancel or the job's time limit); Ray was stopped on every node")


def teardown(nodes: list[str], steps: list[subprocess.Popen], env: dict) -> None:
    """Stop each node's `ray start --block` step, then reap what is left of this job's Ray on each node."""
    for p in steps:
        if p.poll() is None:
            with contextlib.suppress(ProcessLookupError):
                p.send_signal(signal.SIGTERM)  # srun forwards it to `ray start --block`, which stops its node
    deadline = time.time() + STOP_GRACE_S
    for p in steps:
        try:
            p.wait(timeout=max(1.0, deadline - time.time()))
        except subprocess.TimeoutExpired:
            p.kill()
            p.wait(timeout=30)
    for node in nodes:
        out = subprocess.run(_srun(node, *_self_cli("stop")), env=env, capture_output=True, text=True,
                             check=False, timeout=120)
        if out.returncode != 0:
            log.warning("ray: stop on %s: %s %s", node, out.stdout.strip()[-300:], out.stderr.strip()[-300:])
        else:
            log.info("ray: stopped on %s: %s", node, out.stdout.strip())


# ----------------------------------------------------------------------------- probe (a Ray driver)
def cmd_probe(args) -> int:
    """`llmrnn train ray-cluster probe`: wait for N alive nodes with the GPUs, run one task on each node
    (which also asks the judge's /health from there), print a JSON line."""
    import ray

    ray.init(address=args.address, logging_level=logging.WARNING, log_to_driver=False)
    deadline = time.time() + args.timeout
    while True:
        alive = [n for n in ray.nodes() if n.get("Alive")]
        short = [n["NodeManagerAddress"] for n in alive if n.get("Resources", {}).get("GPU", 0) < args.gpus]
        if len(alive) >= args.nodes and not short:
            break
        if time.time() > deadline:
            raise CheckFailed(f"only {len(alive)} of {args.nodes} Ray nodes joined within {args.timeout:.0f} s"
                              + (f" ({len(short)} with fewer than {args.gpus} GPUs)" if short else ""))
        time.sleep(1.0)
    from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy

    @ray.remote(num_cpus=0)
    def where(judge_url):
        # lazy: runs in a Ray worker, which cloudpickle hands this function by value; it imports there
        import os as _os
        import urllib.request

        ok = None
        if judge_url:
            try:
                no_proxy = urllib.request.build_opener(urllib.request.ProxyHandler({}))  # straight to the node
                with no_proxy.open(judge_url.rstrip("/").removesuffix("/v1") + "/health", timeout=10) as r:
                    ok = r.status == 200
            except OSError:
                ok = False
        return {"slurm_node": _os.environ.get("SLURMD_NODENAME"), "judge_ok": ok}

    refs = [where.options(scheduling_strategy=NodeAffinitySchedulingStrategy(n["NodeID"], soft=False))
            .remote(args.judge_url) for n in alive]
    found = ray.get(refs, timeout=args.timeout)
    nodes = [{"ip": n["NodeManagerAddress"], "gpus": n["Resources"].get("GPU", 0),
              "cpus": n["Resources"].get("CPU", 0), **f} for n, f in zip(alive, found, strict=True)]
    unreachable = [n["slurm_node"] or n["ip"] for n in nodes if n["judge_ok"] is False]
    if unreachable:
        raise CheckFailed(f"judge {args.judge_url} is not reachable from node(s) {', '.join(unreachable)}: set "
                          "judge.host: node (the judge binds to its node's address)")
    print(json.dumps({"nodes": nodes}))
    return 0


def add_parser(tsub) -> None:
    p = tsub.add_parser("ray-cluster", help="Ray across the nodes of the SLURM allocation (used by `train run`)")
    rsub = p.add_subparsers(dest="ray_command", required=True)
    n = rsub.add_parser("node", help="on one node (by srun): `ray start --block` sized and placed by the job")
    n.add_argument("--head", action="store_true")
    n.add_argument("--port", type=int, default=None, help="head: GCS port")
    n.add_argument("--address", default=None, help="worker: the head's ip:port")
    n.add_argument("--num-cpus", type=int, default=None, help="at most this many (and at most the job's)")
    n.add_argument("--num-gpus", type=int, required=True)
    n.set_defaults(func=cmd_node)
    s = rsub.add_parser("stop", help="on one node (by srun): stop this job's Ray processes, remove its temp dir")
    s.set_defaults(func=cmd_stop)
    q = rsub.add_parser("probe", help="wait for N Ray nodes with G GPUs each; run a task (and a judge check) on each")
    q.add_argument("--address", required=True)
    q.add_argument("--nodes", type=int, required=True)
    q.add_argument("--gpus", type=int, default=0)
    q.add_argument("--judge-url", default=None)
    q.add_argument("--timeout", type=float, default=START_TIMEOUT_S)
    q.set_defaults(func=cmd_probe)
