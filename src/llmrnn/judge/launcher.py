"""`llmrnn judge server`: start the server the rubric names, prove it is ours, publish the endpoint.

The `judge_server` rule is a Snakemake service. The launcher starts the rubric's engine on 127.0.0.1 (or,
for training across nodes, on the address config `judge.host` names: `node` = this node's address as
SLURM reaches it, so reward workers on every node reach it; the key guards it as on loopback) with
a random per-run API key (file mode 0600, never logged, never on a command line) and writes the endpoint
file at once with status "starting" (Snakemake waits only --latency-wait seconds for a service's output
before starting its consumers). A fixed `serving.port` that is already in use fails at once, naming the
port, before any model loads. The file says "ready" only when the server on that port proved it is the
one we started: /health answers, /v1/models REFUSES a request without the key (401/403; a server that
ignores auth is someone else's and never sees the key or a prompt), and with the key lists the served
model. Otherwise it says "failed" with the reason. The launcher lives until Snakemake terminates it
(SIGTERM) when the consumers are done, or its parent dies; then it stops the server and deletes the key.

Engines (rubric `serving.engine`): `vllm` (`vllm serve` on a GPU; key via VLLM_API_KEY) and `llmrnn`
(`llmrnn judge serve`, llmrnn.judge.server: our CPU server with logprobs and n).
"""

from __future__ import annotations

import contextlib
import ctypes
import dataclasses
import logging
import os
import re
import secrets
import shutil
import signal
import socket
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Any

from llmrnn import io
from llmrnn.errors import CheckFailed, InputError
from llmrnn.gpus import assign, node_address, this_node
from llmrnn.judge.client import ERROR_FILE, KEY_FILE, NotOurServer, health_ok, readiness  # noqa: F401
from llmrnn.models import READY, model_dir, prepare_model
from llmrnn.rubric import Rubric, load_rubric
from llmrnn.safe_path import safe_path_env

log = logging.getLogger(__name__)


def free_port(host: str = "127.0.0.1") -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind((host, 0))
        return s.getsockname()[1]


def port_in_use(host: str, port: int) -> bool:
    """True when something already listens on host:port. SO_REUSEADDR as the servers set it, so a port
    left in TIME_WAIT by an earlier run counts as free, a listening one as taken."""
    with socket.socket(socket.AF_INET6 if ":" in host else socket.AF_INET, socket.SOCK_STREAM) as s:
        s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            s.bind((host, port))
        except OSError:
            return True
    return False


JUDGE_MODELS_ROOT = Path("resources/judge_models")


def judge_model_dir(rubric: Rubric) -> Path:
    """The local copy the server loads: resources/models/<name> for `source: local` (prepare_base_model),
    the folder itself for `source: path`, resources/judge_models/<slug> for `source: hub`
    (prepare_judge_model downloads it once)."""
    if rubric.model_source == "local":
        return Path(model_dir(rubric.model))
    if rubric.model_source == "path":
        return Path(rubric.model)
    slug = re.sub(r"[^A-Za-z0-9._-]+", "--", rubric.model.strip("/")).strip("-.") or "judge"
    return JUDGE_MODELS_ROOT / slug


def prepare_judge_model(rubric_path: str, marker: str | Path) -> dict:
    """Download a `source: hub` judge model (HF_TOKEN from the environment for gated repos)."""
    rubric = load_rubric(rubric_path)
    if rubric.model_source != "hub":
        raise InputError(f"{rubric.path}: judge.source {rubric.model_source}: {rubric.model} is no Hub model; "
                         "nothing to download")
    want = judge_model_dir(rubric) / READY
    if Path(marker) != want:
        raise InputError(f"--out {marker}: the judge model of {rubric.path} goes to {want}")
    return prepare_model("judge", {"source": "hub", "repo_id": rubric.model}, marker)


def resolve_model(rubric: Rubric) -> str:
    """The local folder the server loads the judge model from (never a hub id: the server runs offline)."""
    path = judge_model_dir(rubric)
    if not (path / "config.json").is_file():
        made_by = {"local": "; prepare_base_model makes it", "hub": "; prepare_judge_model downloads it"}
        raise InputError(f"{rubric.path}: judge.model: {path} is not a HF model directory (no config.json)"
                         f"{made_by.get(rubric.model_source, '')}")
    return str(path)


def server_command(rubric: Rubric, model: str, port: int, key_file: Path) -> tuple[list[str], dict, str]:
    """(argv, extra env, served model name) for the rubric's engine. The key never goes on argv."""
    s = rubric.serving
    if s.engine == "llmrnn":
        argv = [
            sys.executable, "-m", "llmrnn.cli", "judge", "serve", "--model", model,
            "--served-model-name", rubric.served_model_name, "--host", s.host, "--port", str(port),
            "--api-key-file", str(key_file), "--max-model-len", str(s.max_model_len), "--dtype", s.dtype,
            *s.extra_args,
        ]
        return argv, {}, rubric.served_model_name
    argv = [
        "vllm", "serve", model, "--host", s.host, "--port", str(port),
        "--served-model-name", rubric.served_model_name, "--max-model-len", str(s.max_model_len),
        "--gpu-memory-utilization", str(s.gpu_memory_utilization), "--dtype", s.dtype,
        "--max-logprobs", str(max(20, rubric.request.top_logprobs)), *s.extra_args,
    ]
    env = {"VLLM_API_KEY": key_file.read_text().strip()}
    # newer vLLM builds (the CPU build 0.32) refuse more than VLLM_MAX_STOP_STRINGS (default 4) stops per
    # request with HTTP 400; the rubric's answer-ending stops (one per score line) may be more
    stops = max(len(rubric.request.stop), len(rubric.pairwise.stop))
    if stops > 4:
        env["VLLM_MAX_STOP_STRINGS"] = str(stops)
    return argv, env, rubric.served_model_name


def _set_pdeathsig() -> None:  # runs in the child: die with the launcher, even on SIGKILL
    with contextlib.suppress(Exception):
        ctypes.CDLL("libc.so.6", use_errno=True).prctl(1, signal.SIGTERM)  # PR_SET_PDEATHSIG


def _stop(proc: subprocess.Popen, grace_s: float = 30.0) -> None:
    if proc.poll() is not None:
        return
    proc.terminate()
    try:
        proc.wait(grace_s)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait()


class _Publisher:
    """The endpoint file (and the error file a consumer may find when Snakemake removed the endpoint)."""

    def __init__(self, endpoint_file: str, rubric_path: str):
        self.path = Path(endpoint_file)
        self.path.parent.mkdir(parents=True, exist_ok=True)
        self.error_path = self.path.parent / ERROR_FILE
        self.key_path = self.path.parent / KEY_FILE
        self.error_path.unlink(missing_ok=True)
        self.info: dict[str, Any] = {
            "url": None, "model": None, "api_key_file": str(self.key_path), "rubric": str(rubric_path),
            "engine": None, "pid": None, "host": socket.gethostname(), "launcher_pid": os.getpid(),
            "status": "starting",
        }
        self.write()

    def write(self, **changes) -> None:
        self.info.update(changes)
        io.write_json(self.path, self.info)

    def fail(self, message: str) -> int:
        self.write(status="failed", error=message)
        io.write_text(self.error_path, message + "\n")
        raise CheckFailed(message)


def _prepare(rubric_path: str, pub: _Publisher, host: str) -> tuple[Rubric, str, int]:
    """Rubric, model and port, checked before anything starts (a port in use fails here, naming it)."""
    try:
        rubric = load_rubric(rubric_path)
        model = resolve_model(rubric)
    except InputError as exc:
        pub.fail(str(exc))
    s = rubric.serving
    if s.engine == "vllm" and shutil.which("vllm") is None:
        pub.fail(f"{rubric.path}: serving.engine vllm: its command is not on PATH "
                 "(the GPU stack: `make gpu-env`, or --sdm conda/apptainer)")
    if s.port and port_in_use(host, s.port):
        pub.fail(f"{rubric.path}: serving.port {s.port}: port {s.port} on {host} is already in use by another "
                 "process; free it or set serving.port: 0 (a free port per run)")
    return rubric, model, s.port or free_port(host)


WILDCARDS = ("", "0.0.0.0", "::")


def bind_address(configured: str | None, rubric_host: str) -> str:
    """Where the judge listens: the rubric's loopback host unless config judge.host names another;
    `node` is this node's address as SLURM reaches it (what the other training nodes use)."""
    if configured is None:
        return rubric_host
    if configured in WILDCARDS:
        raise InputError(f"judge.host: {configured!r} would listen on every interface; name one address or `node`")
    if configured == "node":
        return node_address(this_node())
    return configured


def run_server(rubric_path: str, endpoint_file: str, startup_timeout_s: float | None = None,
               host: str | None = None) -> int:
    """Start the judge server, publish the endpoint, and keep the server up until terminated."""
    pub = _Publisher(endpoint_file, rubric_path)
    try:
        bind = bind_address(host, load_rubric(rubric_path).serving.host)
    except (InputError, CheckFailed) as exc:
        pub.fail(str(exc))
    rubric, model, port = _prepare(rubric_path, pub, bind)
    rubric = dataclasses.replace(rubric, serving=dataclasses.replace(rubric.serving, host=bind))
    pub.write(bind_address=bind)
    key = secrets.token_urlsafe(32)
    io.write_text(pub.key_path, key + "\n", mode=0o600)
    argv, extra_env, served_name = server_command(rubric, model, port, pub.key_path)
    env = safe_path_env(dict(os.environ, **extra_env))  # `python -m llmrnn.cli`: no stray ./llmrnn
    env["HF_HUB_OFFLINE"] = "1"  # only the local copy (prepare_judge_model / prepare_base_model)
    if rubric.needs_gpu:
        # one node, one group job: the judge takes the last GPU, train_grpo the others (disjoint)
        assign("judge", judge_gpus=1, env=env)
    base_url = f"http://{rubric.serving.host}:{port}"
    log.info("starting judge (%s) on %s:%d: %s", rubric.serving.engine, rubric.serving.host, port,
             " ".join(argv[:4] + ["..."]))
    stop = threading.Event()
    signal.signal(signal.SIGTERM, lambda *_: stop.set())
    signal.signal(signal.SIGINT, lambda *_: stop.set())
    proc = subprocess.Popen(argv, env=env, preexec_fn=_set_pdeathsig)  # noqa: PLW1509
    pub.write(url=f"{base_url}/v1", model=served_name, engine=rubric.serving.engine, pid=proc.pid)
    try:
        if not _wait_ready(proc, pub, base_url, key, served_name, stop,
                           startup_timeout_s or rubric.serving.startup_timeout_s):
            return 0
        # the line first, then the file: whoever sees "ready" finds the line in the log (a loaded test read
        # the log between the two once)
        log.info("judge healthy at %s/v1 (model %s); endpoint %s is ready", base_url, served_name, pub.path)
        pub.write(status="ready")
        _serve_until_stopped(proc, pub, stop)
        return 0
    finally:
        _stop(proc)
        pub.key_path.unlink(missing_ok=True)


def _wait_ready(proc, pub: _Publisher, base_url: str, key: str, served_name: str, stop: threading.Event,
                timeout: float) -> bool:
    """True when the server proved it is ours; False when we were told to stop first; else pub.fail."""
    deadline = time.time() + timeout
    while not stop.is_set():
        if proc.poll() is not None:
            pub.fail(f"judge server exited with code {proc.returncode} before it was ready (is port "
                     f"{base_url.rsplit(':', 1)[1]} free?); see the judge_server log")
        try:
            if readiness(base_url, key, served_name, 2.0):
                return True
        except NotOurServer as exc:
            pub.fail(str(exc))
        if time.time() > deadline:
            pub.fail(f"judge server did not answer {base_url}/health within {timeout:.0f} s")
        time.sleep(0.5)
    return False


def _serve_until_stopped(proc, pub: _Publisher, stop: threading.Event) -> None:
    parent = os.getppid()
    while not stop.is_set():
        if proc.poll() is not None:
            pub.fail(f"judge server exited with code {proc.returncode} while serving")
        if os.getppid() != parent:
            log.info("parent process gone; shutting the judge down")
            return
        stop.wait(1.0)
    log.info("terminating the judge server")
