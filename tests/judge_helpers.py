"""Test helpers for the judge/reward/preflight tests: a real HTTP server on 127.0.0.1 whose answers are
scripted (the judge MODEL is the fake part: a test decides what it says; HTTP, auth, JSON and timing are
real), endpoint/rubric files, and TrajectorySteps."""

from __future__ import annotations

import json
import os
import sys
import threading
import time
from collections.abc import Callable
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
KEY = "test-key-123"


class LocalServer(ThreadingHTTPServer):
    """The tests' HTTP servers on 127.0.0.1: a thread a request, a deep backlog, quiet about clients gone."""

    daemon_threads = True
    request_queue_size = 256  # listen() backlog: the default 5 drops SYNs under 100+ concurrent calls

    def handle_error(self, request, client_address) -> None:
        """A client that left before its answer (a timeout under test, a killed trainer) is not an error of
        the server: no traceback. Python 3.11's traceback printing parses the source line (ast.parse) for its
        carets, and the AST constructor's recursion counter is shared by threads: a later test's ast.parse in
        the main thread failed with "SystemError: AST constructor recursion depth mismatch" (seen in CI;
        CPython issue 106905, pytest issue 10763)."""
        if isinstance(sys.exc_info()[1], (BrokenPipeError, ConnectionResetError)):
            return
        super().handle_error(request, client_address)


def chat_payload(text: str, logprobs: list | None = None) -> dict:
    choice = {"index": 0, "message": {"role": "assistant", "content": text}, "finish_reason": "stop",
              "logprobs": {"content": logprobs} if logprobs is not None else None}
    return {"id": "x", "object": "chat.completion", "model": "judge", "choices": [choice]}


class RawReply:
    """What a hostile server writes itself: `write(handler)` gets the request handler (its wfile)."""

    def __init__(self, write: Callable[[BaseHTTPRequestHandler], None]):
        self.write = write


def trickle_reply(payload: dict, every_s: float) -> RawReply:
    """Headers at once, then the body one byte every `every_s` seconds (each read gets something)."""
    def write(h):
        data = json.dumps(payload).encode()
        h.send_response(200)
        h.send_header("Content-Type", "application/json")
        h.send_header("Content-Length", str(len(data)))
        h.end_headers()
        for i in range(len(data)):
            try:
                h.wfile.write(data[i:i + 1])
                h.wfile.flush()
            except OSError:  # the client hung up
                return
            time.sleep(every_s)
    return RawReply(write)


def endless_chunked_reply(chunk: bytes = b" " * 512, limit_s: float = 60.0) -> RawReply:
    """A chunked body that never ends (until the client hangs up, or limit_s as a safety net)."""
    def write(h):
        h.send_response(200)
        h.send_header("Content-Type", "application/json")
        h.send_header("Transfer-Encoding", "chunked")
        h.end_headers()
        h.wfile.write(b"%x\r\n{\r\n" % 1)
        end = time.monotonic() + limit_s
        while time.monotonic() < end:
            try:
                h.wfile.write(b"%x\r\n%s\r\n" % (len(chunk), chunk))
                h.wfile.flush()
            except OSError:
                return
            time.sleep(0.01)
    return RawReply(write)


def gzip_bomb_reply(inflated_bytes: int) -> RawReply:
    """Content-Encoding: gzip, a small body that inflates to `inflated_bytes` of JSON-ish padding."""
    import gzip
    import io as _io

    buf = _io.BytesIO()
    with gzip.GzipFile(fileobj=buf, mode="wb", compresslevel=9) as gz:
        gz.write(b'{"pad": "')
        block = b"0" * (1 << 20)
        for _ in range(inflated_bytes >> 20):
            gz.write(block)
        gz.write(b'"}')
    return gzip_reply(buf.getvalue())


def gzip_reply(data: bytes) -> RawReply:
    """A 200 answer whose body is `data`, sent as gzip-compressed JSON."""
    def write(h):
        h.send_response(200)
        h.send_header("Content-Type", "application/json")
        h.send_header("Content-Encoding", "gzip")
        h.send_header("Content-Length", str(len(data)))
        h.end_headers()
        h.wfile.write(data)
    return RawReply(write)


class ScriptedJudge:
    """OpenAI-style server: `respond(body) -> text | (status, dict) | RawReply`; optional fixed delay; counts
    hits. With a key, /v1/models and POSTs refuse requests without it (as the servers we start do)."""

    def __init__(self, respond: Callable[[dict], object], delay_s: float = 0.0, key: str | None = KEY,
                 health: bool = True, port: int = 0):
        self.respond = respond
        self.delay_s = delay_s
        self.hits = 0
        self.dead = False
        self.inflight = 0
        self.max_inflight = 0
        self.bodies: list[dict] = []
        self.requests: list[tuple[str, str, str | None]] = []  # (method, path, Authorization header)
        self._lock = threading.Lock()
        outer = self

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"
            disable_nagle_algorithm = True  # headers and body go out as separate writes

            def log_message(self, *args):
                pass

            def _send(self, status: int, obj: dict) -> None:
                data = json.dumps(obj).encode()
                self.send_response(status)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)

            def do_GET(self):
                with outer._lock:
                    outer.requests.append(("GET", self.path, self.headers.get("Authorization")))
                if self.path == "/health":
                    self._send(200 if health else 503, {"status": "ok"})
                elif self.path == "/v1/models":
                    if key and self.headers.get("Authorization") != f"Bearer {key}":
                        self._send(401, {"error": "bad key"})
                    else:
                        self._send(200, {"data": [{"id": "judge"}]})
                else:
                    self._send(404, {"error": "no"})

            def do_POST(self):
                if outer.dead:  # a killed server: drop the connection without answering
                    self.close_connection = True
                    return
                body = json.loads(self.rfile.read(int(self.headers.get("Content-Length", 0))) or b"{}")
                with outer._lock:
                    outer.requests.append(("POST", self.path, self.headers.get("Authorization")))
                    outer.hits += 1
                    outer.bodies.append(body)
                if key and self.headers.get("Authorization") != f"Bearer {key}":
                    self._send(401, {"error": "bad key"})
                    return
                with outer._lock:
                    outer.inflight += 1
                    outer.max_inflight = max(outer.max_inflight, outer.inflight)
                try:
                    if outer.delay_s:
                        time.sleep(outer.delay_s)
                    out = outer.respond(body)
                finally:
                    with outer._lock:
                        outer.inflight -= 1
                if isinstance(out, RawReply):
                    out.write(self)
                elif isinstance(out, tuple):
                    self._send(*out)
                else:
                    self._send(200, chat_payload(str(out)))

        self.server = LocalServer(("127.0.0.1", port), Handler)
        self.port = self.server.server_address[1]
        self.thread = threading.Thread(target=self.server.serve_forever, daemon=True)

    def __enter__(self):
        self.thread.start()
        return self

    def __exit__(self, *exc) -> None:
        self.dead = True
        self.server.shutdown()
        self.server.server_close()


def prompt_of(body: dict) -> str:
    return "\n".join(m["content"] for m in body.get("messages", []) if m["role"] == "user")


def write_endpoint(tmp: Path, port: int, rubric: Path, key: str | None = KEY, pid: int | None = None) -> Path:
    jdir = tmp / "judge"
    jdir.mkdir(parents=True, exist_ok=True)
    key_file = None
    if key:
        key_file = jdir / "api_key"
        key_file.write_text(key + "\n")
        os.chmod(key_file, 0o600)
    ep = jdir / "endpoint.json"
    ep.write_text(json.dumps({"url": f"http://127.0.0.1:{port}/v1", "model": "judge",
                              "api_key_file": str(key_file) if key_file else None, "rubric": str(rubric),
                              "pid": pid or os.getpid()}))
    return ep


def write_rubric(tmp: Path, *, score_method: str = "text", prefix: str = "", model: str = "judge-model",
                 source: str = "hub", max_tokens: int = 64, engine: str = "llmrnn") -> Path:
    """The default rubric's text with test-specific request/judge settings."""
    from omegaconf import OmegaConf

    raw = OmegaConf.to_container(OmegaConf.load(REPO / "config/rubrics/outcome_v2_smollm2.yaml"))
    raw["judge"] = {"model": model, "source": source, "served_model_name": "judge"}
    raw["serving"]["engine"] = engine
    raw["request"].update(score_method=score_method, assistant_prefix=prefix, max_tokens=max_tokens)
    raw["pairwise"]["assistant_prefix"] = ""
    path = tmp / "rubric.yaml"
    OmegaConf.save(OmegaConf.create(raw), path)
    return path


def make_step(i: int = 0, ref: str = "CKD stage 3 and hypertension; watch heart failure.",
              prev: str = "") -> dict:
    return {
        "patient_id": f"p{i}", "visit_index": 0, "visit_id": f"v{i}", "update_prompt": "Rewrite the memory.",
        "h_prev": json.dumps({"evolving_summary": prev}), "h_ref": json.dumps({"evolving_summary": ref}),
        "visit": {"chief_complaint": "dyspnea"}, "next_visit": {"chief_complaint": "edema"},
        "prediction": {"top_5_diagnoses": ["pneumonia"], "primary_diagnosis": "pneumonia"},
        "evaluation": {"primary_correct": False, "any_top5_correct": False, "missed_diagnoses": [],
                       "why_missed": "", "improvement_suggestions": ""},
        "next_prediction": {"top_5_diagnoses": ["copd"], "primary_diagnosis": "copd"},
        "next_evaluation": {"primary_correct": False, "any_top5_correct": False,
                            "missed_diagnoses": ["heart failure"], "why_missed": "", "improvement_suggestions": ""},
        "ground_truth_diagnoses": ["pneumonia"],
        "next_ground_truth_diagnoses": ["Heart failure", "CKD stage 3"],
        "parse_ok": {"prediction": True, "evaluation": True, "memory": True, "next_prediction": True,
                     "next_evaluation": True},
    }


def memory(text: str) -> str:
    return json.dumps({"evolving_summary": text})


def write_parquet(path: Path, steps: list[dict]) -> Path:
    import pandas as pd

    rows = []
    for k, step in enumerate(steps):
        rows.append({
            "prompt": [{"role": "user", "content": step["update_prompt"]}],
            "data_source": "llm_as_rnn_memory_update", "ability": "clinical_summary",
            "reward_model": {"style": "rubric", "ground_truth": json.dumps(step)},
            "extra_info": {"split": "train", "patient_id": step["patient_id"], "visit_index": step["visit_index"],
                           "visit_id": step["visit_id"], "index": k},
        })
    path.parent.mkdir(parents=True, exist_ok=True)
    pd.DataFrame(rows).to_parquet(path)
    return path


def json_policy_reward(prompts: list, completions: list, **columns) -> list[float]:
    """llmrnn.reward.trl_reward_func with the policy's text wrapped into the memory JSON it should write.

    STAND-IN for a policy that writes JSON: the tiny random test model never does, so no sample would
    reach the judge. Reward, judge HTTP, parsing, guard and TRL's metric logging are the real ones."""
    from llmrnn.reward import trl_reward_func

    wrapped = [[{"role": "assistant", "content": memory(str(c[-1]["content"] if isinstance(c, list) else c))}]
               for c in completions]
    return trl_reward_func(prompts, wrapped, **columns)
