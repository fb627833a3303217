"""Stage `judge`: the judge server (launcher + our CPU server) and the client every consumer uses.

`llmrnn judge server` (the `judge_server` rule, a Snakemake service) starts the server the rubric names
on 127.0.0.1 with a free port and a random per-run API key (file mode 0600, never logged, never on a
command line) and writes the endpoint file {"url", "model", "api_key_file", "rubric", "pid", "status",
...} at once with status "starting" (Snakemake waits only --latency-wait seconds for a service's output
before starting its consumers); only when the server answers /health AND an authenticated /v1/models
does the file say "ready" (or "failed" with the reason). It lives until
Snakemake terminates it (SIGTERM) when the consumers are done, or its parent dies; then it stops the
server and deletes the key.

Engines (rubric `serving.engine`):
- `vllm`: `vllm serve` on a GPU (reproduction; key via VLLM_API_KEY).
- `llmrnn`: `llmrnn judge serve`, a small OpenAI-compatible server in this module (FastAPI + a
  transformers model on CPU) with /health, /v1/models, /v1/completions, /v1/chat/completions, Bearer
  auth, n, and logprobs/top_logprobs. It exists because the embedded default's small judge needs the
  probability-weighted digit score (G-Eval style) for input-dependent rewards, and `transformers serve`
  rejects/ignores `logprobs`, `n` and has no API key (FINDINGS §6; transformers 5.23 lists them as
  unsupported fields). Concurrent requests are batched (left-padded) into one generate call.
- `transformers`: `transformers serve` (text scores only, no key enforcement); kept for completeness.

Consumers call `wait_for_endpoint()` (the file may appear late or be stale: they poll health, with a
timeout and a clear error) and talk to the server through `JudgeClient` (retries with backoff on
refused / timeout / 5xx, then raise `JudgeUnavailable`; never a silent fallback).
"""

from __future__ import annotations

import contextlib
import json
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
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from llmrnn import io
from llmrnn.errors import CheckFailed, InputError, LlmrnnError
from llmrnn.rubric import Rubric, load_rubric

log = logging.getLogger(__name__)
logging.getLogger("httpx").setLevel(logging.WARNING)  # one INFO line per request otherwise

ERROR_FILE = "server_error.txt"
KEY_FILE = "api_key"


class JudgeUnavailable(LlmrnnError):
    """The judge did not answer after the retry budget (refused, timeout, 5xx): training must stop."""

    exit_code = 4


class JudgeRequestError(LlmrnnError):
    """The judge rejected a request (4xx): a bug or a misconfigured rubric, not a transient failure."""


# ----------------------------------------------------------------------------- endpoint file
@dataclass(frozen=True)
class Endpoint:
    url: str  # http://127.0.0.1:PORT/v1
    model: str
    api_key_file: str | None
    rubric: str
    pid: int | None = None
    host: str | None = None
    engine: str = "llmrnn"
    status: str = "ready"  # starting | ready | failed (a file without status is taken as ready)
    error: str | None = None

    @property
    def base_url(self) -> str:
        return self.url.removesuffix("/v1")

    def api_key(self) -> str | None:
        if not self.api_key_file:
            return None
        try:
            return Path(self.api_key_file).read_text().strip()
        except OSError as exc:
            raise CheckFailed(f"judge API key file {self.api_key_file}: {exc.strerror}") from exc

    @classmethod
    def read(cls, path: str | Path) -> Endpoint:
        try:
            data = io.read_json(path)
        except (OSError, json.JSONDecodeError) as exc:
            raise InputError(f"{path}: not a readable judge endpoint file: {exc}") from exc
        try:
            return cls(
                url=data["url"], model=data["model"], api_key_file=data.get("api_key_file"),
                rubric=data["rubric"], pid=data.get("pid"), host=data.get("host"),
                engine=data.get("engine", "llmrnn"), status=data.get("status", "ready"),
                error=data.get("error"),
            )
        except KeyError as exc:
            raise InputError(f"{path}: judge endpoint file lacks {exc.args[0]!r}") from exc


def _pid_alive(pid: int | None, host: str | None) -> bool:
    if not pid or (host and host != socket.gethostname()):
        return True  # cannot tell from here; health decides
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def health_ok(base_url: str, timeout_s: float = 5.0) -> bool:
    import httpx

    try:
        return httpx.get(f"{base_url}/health", timeout=timeout_s).status_code == 200
    except httpx.HTTPError:
        return False


def wait_for_endpoint(endpoint_file: str | Path, timeout_s: float = 900.0, poll_s: float = 1.0) -> Endpoint:
    """Wait until the endpoint file says "ready" and names a live server whose /health answers; else a
    clear CheckFailed.

    The judge_server service starts together with its consumers, so the file may not exist yet or may
    still say "starting" (Snakemake wants a service's output within --latency-wait, so the launcher
    writes it at once and flips it to "ready" after the health + auth check); a file left by an earlier
    run names a dead pid or a port nobody answers on, and is waited past."""
    path = Path(endpoint_file)
    error_file = path.parent / ERROR_FILE
    start = time.time()
    deadline = start + timeout_s
    state = "endpoint file not written yet"
    while True:
        if error_file.exists() and error_file.stat().st_mtime >= start - 2:
            raise CheckFailed(f"judge server failed to start: {error_file.read_text().strip()}")
        if path.exists():
            try:
                ep = Endpoint.read(path)
            except InputError as exc:
                state = str(exc)  # being replaced right now, or broken: retry until the deadline
            else:
                if ep.status == "failed":
                    raise CheckFailed(f"judge server failed to start: {ep.error}")
                if ep.status != "ready":
                    state = f"server still {ep.status} (pid {ep.pid})"
                    if not _pid_alive(ep.pid, ep.host):
                        state = f"{path} says {ep.status} but pid {ep.pid} is not running (stale file?)"
                elif not _pid_alive(ep.pid, ep.host):
                    state = f"{path} names pid {ep.pid}, which is not running (stale file?)"
                elif health_ok(ep.base_url):
                    log.info("judge at %s is healthy (waited %.1f s)", ep.url, time.time() - start)
                    return ep
                else:
                    state = f"{ep.base_url}/health does not answer"
        if time.time() >= deadline:
            raise CheckFailed(
                f"judge endpoint {path} not healthy after {timeout_s:.0f} s ({state}); "
                "see the judge_server log (logs/RUN/judge_server.log)"
            )
        time.sleep(poll_s)


# ----------------------------------------------------------------------------- client
class JudgeClient:
    """Thread-safe OpenAI-compatible client: one connection pool, retries with exponential backoff on
    transport failures (refused, timeouts, 5xx, 429), then JudgeUnavailable. 4xx -> JudgeRequestError."""

    def __init__(self, endpoint: Endpoint, timeout_s: float = 300.0, retries: int = 4,
                 backoff_s: float = 0.5, backoff_max_s: float = 8.0, max_connections: int = 64):
        import httpx

        self.endpoint = endpoint
        self.retries = retries
        self.backoff_s = backoff_s
        self.backoff_max_s = backoff_max_s
        key = endpoint.api_key()
        headers = {"Authorization": f"Bearer {key}"} if key else {}
        self._client = httpx.Client(
            base_url=endpoint.url,
            headers=headers,
            timeout=httpx.Timeout(timeout_s, connect=min(10.0, timeout_s)),
            limits=httpx.Limits(max_connections=max_connections, max_keepalive_connections=max_connections),
        )

    def close(self) -> None:
        self._client.close()

    def post(self, path: str, body: dict) -> tuple[dict, float, int]:
        """POST and return (json payload, latency of the successful try in s, number of retries)."""
        import httpx

        last = ""
        for attempt in range(self.retries + 1):
            if attempt:
                time.sleep(min(self.backoff_max_s, self.backoff_s * 2 ** (attempt - 1)))
            t0 = time.perf_counter()
            try:
                resp = self._client.post(path, json=body)
            except httpx.TimeoutException as exc:
                last = f"timeout ({type(exc).__name__})"
                continue
            except httpx.TransportError as exc:  # refused, reset, protocol error
                last = f"{type(exc).__name__}: {exc}"
                continue
            latency = time.perf_counter() - t0
            if resp.status_code >= 500 or resp.status_code == 429:
                last = f"HTTP {resp.status_code}: {resp.text[:200]}"
                continue
            if resp.status_code >= 400:
                raise JudgeRequestError(
                    f"judge {self.endpoint.url}{path} rejected the request: HTTP {resp.status_code}: {resp.text[:300]}"
                )
            try:
                return resp.json(), latency, attempt
            except ValueError:
                last = f"HTTP {resp.status_code} with a body that is not JSON: {resp.text[:200]}"
                continue
        raise JudgeUnavailable(
            f"judge {self.endpoint.url}{path} failed {self.retries + 1} times; last error: {last}. "
            "Refusing to turn a dead judge into constant rewards."
        )


# ----------------------------------------------------------------------------- launcher
def free_port(host: str = "127.0.0.1") -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind((host, 0))
        return s.getsockname()[1]


JUDGE_MODELS_ROOT = Path("resources/judge_models")


def judge_model_dir(rubric: Rubric) -> Path:
    """The local copy the server loads: resources/models/<name> for `source: local` (prepare_base_model),
    the folder itself for `source: path`, resources/judge_models/<slug> for `source: hub`
    (prepare_judge_model downloads it once)."""
    if rubric.model_source == "local":
        from llmrnn.models import model_dir

        return Path(model_dir(rubric.model))
    if rubric.model_source == "path":
        return Path(rubric.model)
    slug = re.sub(r"[^A-Za-z0-9._-]+", "--", rubric.model.strip("/")).strip("-.") or "judge"
    return JUDGE_MODELS_ROOT / slug


def prepare_judge_model(rubric_path: str, marker: str | Path) -> dict:
    """Download a `source: hub` judge model (HF_TOKEN from the environment for gated repos)."""
    from llmrnn.models import READY, prepare_model

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
    if s.engine == "vllm":
        argv = [
            "vllm", "serve", model, "--host", s.host, "--port", str(port),
            "--served-model-name", rubric.served_model_name, "--max-model-len", str(s.max_model_len),
            "--gpu-memory-utilization", str(s.gpu_memory_utilization), "--dtype", s.dtype,
            "--max-logprobs", str(max(20, rubric.request.top_logprobs)), *s.extra_args,
        ]
        return argv, {"VLLM_API_KEY": key_file.read_text().strip()}, rubric.served_model_name
    # transformers serve: no API key, no logprobs; the request's model must equal the served path.
    argv = ["transformers", "serve", model, "--host", s.host, "--port", str(port), "--dtype", s.dtype,
            *s.extra_args]
    return argv, {}, model


def _set_pdeathsig() -> None:  # runs in the child: die with the launcher, even on SIGKILL
    with contextlib.suppress(Exception):
        import ctypes

        ctypes.CDLL("libc.so.6", use_errno=True).prctl(1, signal.SIGTERM)  # PR_SET_PDEATHSIG


def _authenticated_models(base_url: str, key: str | None, timeout_s: float = 5.0) -> list[str] | None:
    import httpx

    headers = {"Authorization": f"Bearer {key}"} if key else {}
    try:
        resp = httpx.get(f"{base_url}/v1/models", headers=headers, timeout=timeout_s)
    except httpx.HTTPError:
        return None
    if resp.status_code != 200:
        return None
    try:
        return [m.get("id") for m in resp.json().get("data", [])]
    except (ValueError, AttributeError):
        return None


def _stop(proc: subprocess.Popen, grace_s: float = 30.0) -> None:
    if proc.poll() is not None:
        return
    proc.terminate()
    try:
        proc.wait(grace_s)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait()


def run_server(rubric_path: str, endpoint_file: str, startup_timeout_s: float | None = None) -> int:
    """Start the judge server, publish the endpoint, and keep the server up until terminated.

    The endpoint file is written at once with status "starting" (Snakemake waits only --latency-wait
    seconds for a service's output before it starts the consumers), then flipped atomically to "ready"
    once /health answers and an authenticated /v1/models lists the model, or to "failed" with the
    reason. Consumers use only a "ready" endpoint (wait_for_endpoint)."""
    endpoint_path = Path(endpoint_file)
    run_dir = endpoint_path.parent
    run_dir.mkdir(parents=True, exist_ok=True)
    error_path = run_dir / ERROR_FILE
    key_path = run_dir / KEY_FILE
    error_path.unlink(missing_ok=True)
    info: dict[str, Any] = {
        "url": None, "model": None, "api_key_file": str(key_path), "rubric": str(rubric_path),
        "engine": None, "pid": None, "host": socket.gethostname(), "launcher_pid": os.getpid(),
        "status": "starting",
    }
    io.write_json(endpoint_path, info)

    def fail(message: str) -> int:
        info.update(status="failed", error=message)
        io.write_json(endpoint_path, info)
        io.write_text(error_path, message + "\n")
        raise CheckFailed(message)

    try:
        rubric = load_rubric(rubric_path)
        model = resolve_model(rubric)
    except InputError as exc:
        return fail(str(exc))
    if rubric.serving.engine != "llmrnn" and shutil.which(
        "vllm" if rubric.serving.engine == "vllm" else "transformers") is None:
        return fail(f"{rubric.path}: serving.engine {rubric.serving.engine}: its command is not on PATH "
                    "(GPU stack: install the `gpu` extra / envs/vllm.yaml)")
    key = secrets.token_urlsafe(32)
    io.write_text(key_path, key + "\n", mode=0o600)
    port = rubric.serving.port or free_port(rubric.serving.host)
    argv, extra_env, served_name = server_command(rubric, model, port, key_path)
    env = dict(os.environ, **extra_env)
    env["HF_HUB_OFFLINE"] = "1"  # only the local copy (prepare_judge_model / prepare_base_model)
    if rubric.needs_gpu:
        from llmrnn.gpus import assign

        # one node, one group job: the judge takes the last GPU, train_grpo the others (disjoint)
        assign("judge", judge_gpus=1, env=env)
    base_url = f"http://{rubric.serving.host}:{port}"
    log.info("starting judge (%s) on %s:%d: %s", rubric.serving.engine, rubric.serving.host, port,
             " ".join(argv[:4] + ["..."]))
    stop = threading.Event()
    parent = os.getppid()

    def on_signal(signum, frame):
        stop.set()

    signal.signal(signal.SIGTERM, on_signal)
    signal.signal(signal.SIGINT, on_signal)
    proc = subprocess.Popen(argv, env=env, preexec_fn=_set_pdeathsig)  # noqa: PLW1509
    info.update(url=f"{base_url}/v1", model=served_name, engine=rubric.serving.engine, pid=proc.pid)
    io.write_json(endpoint_path, info)
    timeout = startup_timeout_s or rubric.serving.startup_timeout_s
    try:
        deadline = time.time() + timeout
        while True:
            if stop.is_set():
                return 0
            if proc.poll() is not None:
                return fail(f"judge server ({rubric.serving.engine}) exited with code {proc.returncode} "
                            "before answering /health; see the judge_server log")
            if health_ok(base_url, 2.0):
                models = _authenticated_models(base_url, key if rubric.serving.engine != "transformers" else None)
                if models is not None and (served_name in models or rubric.serving.engine == "transformers"):
                    break
            if time.time() > deadline:
                return fail(f"judge server did not answer {base_url}/health within {timeout:.0f} s")
            time.sleep(0.5)
        info["status"] = "ready"
        io.write_json(endpoint_path, info)
        log.info("judge healthy at %s/v1 (model %s); endpoint %s is ready", base_url, served_name, endpoint_path)
        while not stop.is_set():
            if proc.poll() is not None:
                return fail(f"judge server exited with code {proc.returncode} while serving")
            if os.getppid() != parent:
                log.info("parent process gone; shutting the judge down")
                break
            stop.wait(1.0)
        log.info("terminating the judge server")
        return 0
    finally:
        _stop(proc)
        key_path.unlink(missing_ok=True)


# ----------------------------------------------------------------------------- our CPU server
class _Generator:
    """A transformers causal LM behind a micro-batching queue: concurrent requests with the same
    sampling settings are left-padded into one generate() call."""

    def __init__(self, model_dir: str, dtype: str, max_model_len: int, max_batch: int = 16):
        import queue

        import torch
        from transformers import AutoModelForCausalLM, AutoTokenizer

        self.torch = torch
        # The service rule has threads: 0 (Snakemake then exports OMP_NUM_THREADS=0): use at least one.
        torch.set_num_threads(max(1, int(os.environ.get("OMP_NUM_THREADS") or 1)))
        self.tok = AutoTokenizer.from_pretrained(model_dir)
        self.tok.padding_side = "left"
        if self.tok.pad_token is None:
            self.tok.pad_token = self.tok.eos_token
        torch_dtype = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16,
                       "auto": "auto"}.get(dtype, torch.float32)
        self.model = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch_dtype)
        self.model.eval()
        self.max_model_len = max_model_len
        self.max_batch = max_batch
        self.queue: queue.Queue = queue.Queue()
        self._token_text: dict[int, str] = {}
        threading.Thread(target=self._loop, daemon=True, name="generate").start()

    def token_text(self, tid: int) -> str:
        if tid not in self._token_text:
            self._token_text[tid] = self.tok.decode([tid])
        return self._token_text[tid]

    def encode_chat(self, messages: list[dict], add_generation_prompt: bool, continue_final: bool) -> list[int]:
        text = self.tok.apply_chat_template(
            messages, tokenize=False, add_generation_prompt=add_generation_prompt and not continue_final,
            continue_final_message=continue_final,
        )
        return self.tok(text, add_special_tokens=False)["input_ids"]

    def encode_text(self, prompt: str) -> list[int]:
        return self.tok(prompt, add_special_tokens=False)["input_ids"]

    def submit(self, ids: list[int], params: dict) -> dict:
        from concurrent.futures import Future

        fut: Future = Future()
        self.queue.put((ids, params, fut))
        return fut.result()

    def _loop(self) -> None:
        import queue

        while True:
            batch = [self.queue.get()]
            time.sleep(0.005)  # let concurrent requests arrive
            while len(batch) < self.max_batch:
                try:
                    batch.append(self.queue.get_nowait())
                except queue.Empty:
                    break
            groups: dict[tuple, list] = {}
            for item in batch:
                p = item[1]
                groups.setdefault((p["temperature"], p["top_p"], p["seed"]), []).append(item)
            for items in groups.values():
                try:
                    outs = self._generate([i[0] for i in items], [i[1] for i in items])
                except Exception as exc:  # noqa: BLE001 - reported to every waiting request
                    for _, _, fut in items:
                        fut.set_exception(exc)
                else:
                    for (_, _, fut), out in zip(items, outs):
                        fut.set_result(out)

    def _generate(self, prompts: list[list[int]], params: list[dict]) -> list[dict]:
        torch = self.torch
        p0 = params[0]
        max_new = max(p["max_tokens"] for p in params)
        width = max(len(ids) for ids in prompts)
        pad = self.tok.pad_token_id
        input_ids = torch.tensor([[pad] * (width - len(ids)) + ids for ids in prompts])
        attention = torch.tensor([[0] * (width - len(ids)) + [1] * len(ids) for ids in prompts])
        sample = p0["temperature"] > 0
        if p0["seed"] is not None:
            torch.manual_seed(p0["seed"])
        kwargs: dict[str, Any] = {"do_sample": sample, "max_new_tokens": max_new, "pad_token_id": pad,
                                      "return_dict_in_generate": True, "output_logits": True}
        if sample:
            kwargs.update(temperature=p0["temperature"], top_p=p0["top_p"])
        else:
            kwargs.update(temperature=None, top_p=None, top_k=None)
        with torch.inference_mode():
            out = self.model.generate(input_ids=input_ids, attention_mask=attention, **kwargs)
        new = out.sequences[:, width:]
        eos = set(self.model.generation_config.eos_token_id if isinstance(
            self.model.generation_config.eos_token_id, list) else [self.model.generation_config.eos_token_id])
        eos.add(self.tok.eos_token_id)
        results = []
        for i, p in enumerate(params):
            tokens, finish = [], "length"
            for step, tid in enumerate(new[i].tolist()[: p["max_tokens"]]):
                if tid in eos:
                    finish = "stop"
                    break
                tokens.append((step, tid))
            entries = []
            if p["logprobs"] is not None:
                for step, tid in tokens:
                    lp = torch.log_softmax(out.logits[step][i].float(), dim=-1)
                    top = torch.topk(lp, k=max(1, p["logprobs"]))
                    entries.append({
                        "token": self.token_text(tid),
                        "logprob": float(lp[tid]),
                        "top": [(self.token_text(int(t)), float(v)) for v, t in zip(top.values, top.indices)],
                    })
            text = self.tok.decode([t for _, t in tokens], skip_special_tokens=True)
            for stop_str in p["stop"]:
                cut = text.find(stop_str)
                if cut >= 0:
                    text, finish = text[:cut], "stop"
            results.append({"text": text, "finish_reason": finish, "logprobs": entries,
                            "prompt_tokens": len(prompts[i]), "completion_tokens": len(tokens)})
        return results


def build_app(model_dir: str, served_model_name: str, api_key: str | None, max_model_len: int,
              dtype: str = "float32"):
    """The FastAPI app of `llmrnn judge serve` (OpenAI-compatible subset, see module docstring)."""
    import hmac
    import uuid

    from fastapi import FastAPI, Request
    from fastapi.responses import JSONResponse

    gen = _Generator(model_dir, dtype, max_model_len)
    app = FastAPI(title="llmrnn judge")

    def error(status: int, message: str, kind: str = "invalid_request_error") -> JSONResponse:
        return JSONResponse({"error": {"message": message, "type": kind, "code": status}}, status_code=status)

    @app.middleware("http")
    async def auth(request: Request, call_next):
        if request.url.path.startswith("/v1") and api_key:
            given = request.headers.get("authorization", "")
            if not hmac.compare_digest(given.encode(), f"Bearer {api_key}".encode()):
                return error(401, "missing or wrong API key", "authentication_error")
        return await call_next(request)

    @app.get("/health")
    def health():
        return {"status": "ok"}

    @app.get("/v1/models")
    def models():
        return {"object": "list", "data": [{"id": served_model_name, "object": "model", "owned_by": "llmrnn",
                                             "max_model_len": max_model_len}]}

    def sampling(body: dict, chat: bool) -> dict | JSONResponse:
        if body.get("model") != served_model_name:
            return error(404, f"model {body.get('model')!r} is not served here (serving {served_model_name!r})")
        if body.get("stream"):
            return error(400, "stream is not supported by this server")
        max_tokens = body.get("max_completion_tokens") or body.get("max_tokens") or 16
        if chat:
            logprobs = int(body.get("top_logprobs") or 0) if body.get("logprobs") else None
        else:
            logprobs = body.get("logprobs")
            logprobs = int(logprobs) if logprobs is not None else None
        if logprobs is not None and not 0 <= logprobs <= 20:
            return error(400, "top_logprobs/logprobs must be 0..20")
        stop = body.get("stop") or []
        return {
            "max_tokens": int(max_tokens), "temperature": float(body.get("temperature", 1.0) or 0.0),
            "top_p": float(body.get("top_p", 1.0) or 1.0), "seed": body.get("seed"),
            "logprobs": logprobs, "stop": [stop] if isinstance(stop, str) else list(stop),
            "n": int(body.get("n") or 1),
        }

    def too_long(ids: list[int], p: dict) -> JSONResponse | None:
        if len(ids) + p["max_tokens"] > max_model_len:
            return error(400, f"prompt ({len(ids)} tokens) + max_tokens ({p['max_tokens']}) exceeds "
                              f"max_model_len {max_model_len}")
        return None

    def run(ids: list[int], p: dict) -> list[dict]:
        from concurrent.futures import ThreadPoolExecutor

        if p["n"] == 1:
            return [gen.submit(ids, p)]
        with ThreadPoolExecutor(p["n"]) as pool:  # n copies batch together in the generator
            return list(pool.map(lambda _: gen.submit(ids, p), range(p["n"])))

    def usage(outs: list[dict]) -> dict:
        prompt = outs[0]["prompt_tokens"]
        completion = sum(o["completion_tokens"] for o in outs)
        return {"prompt_tokens": prompt, "completion_tokens": completion, "total_tokens": prompt + completion}

    @app.post("/v1/chat/completions")
    def chat(body: dict):
        p = sampling(body, chat=True)
        if isinstance(p, JSONResponse):
            return p
        messages = body.get("messages")
        if not isinstance(messages, list) or not messages:
            return error(400, "messages must be a non-empty list")
        continue_final = bool(body.get("continue_final_message", False))
        add_gen = bool(body.get("add_generation_prompt", True))
        if continue_final and messages[-1].get("role") != "assistant":
            return error(400, "continue_final_message needs a final assistant message")
        try:
            ids = gen.encode_chat(messages, add_gen, continue_final)
        except Exception as exc:  # noqa: BLE001 - a template error is the client's problem
            return error(400, f"chat template failed: {exc}")
        if (resp := too_long(ids, p)) is not None:
            return resp
        outs = run(ids, p)
        choices = []
        for k, o in enumerate(outs):
            lp = None
            if p["logprobs"] is not None:
                lp = {"content": [{
                    "token": e["token"], "logprob": e["logprob"], "bytes": list(e["token"].encode()),
                    "top_logprobs": [{"token": t, "logprob": v, "bytes": list(t.encode())}
                                     for t, v in e["top"][: p["logprobs"]]],
                } for e in o["logprobs"]]}
            choices.append({"index": k, "message": {"role": "assistant", "content": o["text"]},
                            "logprobs": lp, "finish_reason": o["finish_reason"]})
        return {"id": f"chatcmpl-{uuid.uuid4().hex}", "object": "chat.completion", "created": int(time.time()),
                "model": served_model_name, "choices": choices, "usage": usage(outs)}

    @app.post("/v1/completions")
    def completions(body: dict):
        p = sampling(body, chat=False)
        if isinstance(p, JSONResponse):
            return p
        prompt = body.get("prompt")
        if isinstance(prompt, list) and len(prompt) == 1:
            prompt = prompt[0]
        if not isinstance(prompt, str):
            return error(400, "prompt must be one string")
        ids = gen.encode_text(prompt)
        if (resp := too_long(ids, p)) is not None:
            return resp
        outs = run(ids, p)
        choices = []
        for k, o in enumerate(outs):
            lp = None
            if p["logprobs"] is not None:
                offsets, pos = [], len(prompt)
                for e in o["logprobs"]:
                    offsets.append(pos)
                    pos += len(e["token"])
                lp = {"tokens": [e["token"] for e in o["logprobs"]],
                      "token_logprobs": [e["logprob"] for e in o["logprobs"]],
                      "top_logprobs": [dict(e["top"][: max(1, p["logprobs"])]) for e in o["logprobs"]],
                      "text_offset": offsets}
            choices.append({"index": k, "text": o["text"], "logprobs": lp, "finish_reason": o["finish_reason"]})
        return {"id": f"cmpl-{uuid.uuid4().hex}", "object": "text_completion", "created": int(time.time()),
                "model": served_model_name, "choices": choices, "usage": usage(outs)}

    return app


def serve(model_dir: str, served_model_name: str, host: str, port: int, api_key_file: str | None,
          max_model_len: int, dtype: str) -> int:
    import uvicorn

    if host not in ("127.0.0.1", "localhost", "::1"):
        raise InputError(f"--host {host}: the judge binds to loopback only")
    if not (Path(model_dir) / "config.json").is_file():
        raise InputError(f"--model {model_dir}: not a HF model directory (no config.json)")
    key = Path(api_key_file).read_text().strip() if api_key_file else None
    t0 = time.time()
    app = build_app(model_dir, served_model_name, key, max_model_len, dtype)
    log.info("judge model %s loaded in %.1f s; serving as %r on %s:%d", model_dir, time.time() - t0,
             served_model_name, host, port)
    uvicorn.run(app, host=host, port=port, log_level="warning", access_log=False)
    return 0


# ----------------------------------------------------------------------------- CLI
def _cmd_server(args) -> int:
    return run_server(args.rubric, args.endpoint, args.cfg.get("startup_timeout_s"))


def _cmd_serve(args) -> int:
    return serve(args.model, args.served_model_name, args.host, args.port, args.api_key_file,
                 args.max_model_len, args.dtype)


def _cmd_prepare_model(args) -> int:
    prepare_judge_model(args.rubric, args.out)
    return 0


def _cmd_wait(args) -> int:
    ep = wait_for_endpoint(args.endpoint, args.timeout)
    print(ep.url)
    return 0


def register(sub) -> None:
    from llmrnn.cli import json_arg

    p = sub.add_parser("judge", help="judge server: start (service), serve (our CPU server), wait")
    jsub = p.add_subparsers(dest="judge_command", required=True)

    s = jsub.add_parser("server", help="start the rubric's judge server and publish its endpoint (service)")
    s.add_argument("--rubric", required=True, help="config/rubrics/<x>.yaml")
    s.add_argument("--endpoint", required=True, help="endpoint JSON written once the server is healthy")
    s.add_argument("--cfg", type=json_arg, default={}, help="JSON of config section `judge`")
    s.set_defaults(func=_cmd_server)

    v = jsub.add_parser("serve", help="our OpenAI-compatible CPU server with logprobs (used by `server`)")
    v.add_argument("--model", required=True, help="HF model directory")
    v.add_argument("--served-model-name", required=True)
    v.add_argument("--host", default="127.0.0.1")
    v.add_argument("--port", type=int, required=True)
    v.add_argument("--api-key-file", default=None, help="file holding the Bearer key (mode 0600)")
    v.add_argument("--max-model-len", type=int, default=4096)
    v.add_argument("--dtype", default="float32")
    v.set_defaults(func=_cmd_serve)

    m = jsub.add_parser("prepare-model", help="download the rubric's judge model (source: hub) once")
    m.add_argument("--rubric", required=True, help="config/rubrics/<x>.yaml")
    m.add_argument("--out", required=True, help="output: resources/judge_models/<slug>/.ready")
    m.set_defaults(func=_cmd_prepare_model)

    w = jsub.add_parser("wait", help="wait until the endpoint is healthy; print its URL")
    w.add_argument("--endpoint", required=True)
    w.add_argument("--timeout", type=float, default=900.0)
    w.set_defaults(func=_cmd_wait)

