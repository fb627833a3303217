"""The judge server (launcher + our CPU server with a tiny real model), the endpoint wait, the client."""

from __future__ import annotations

import json
import math
import os
import signal
import stat
import subprocess
import sys
import time
from pathlib import Path

import httpx
import pytest

from llmrnn.errors import CheckFailed
from llmrnn.judge.client import Endpoint, JudgeClient, JudgeRequestError, JudgeUnavailable, wait_for_endpoint
from llmrnn.judge.launcher import NotOurServer, free_port, readiness, server_command
from llmrnn.reward import compute_score
from llmrnn.rubric import load_rubric
from tests.judge_helpers import (
    KEY,
    REPO,
    LocalServer,
    RawReply,
    ScriptedJudge,
    chat_payload,
    endless_chunked_reply,
    gzip_bomb_reply,
    make_step,
    memory,
    trickle_reply,
    write_endpoint,
    write_rubric,
)


def _launch(rubric: Path, endpoint: Path, log: Path) -> subprocess.Popen:
    env = dict(os.environ, OMP_NUM_THREADS="1", HF_HUB_OFFLINE="1")
    return subprocess.Popen(
        [sys.executable, "-m", "llmrnn.cli", "judge", "server", "--rubric", str(rubric), "--endpoint", str(endpoint)],
        stdout=log.open("w"), stderr=subprocess.STDOUT, env=env,
    )


def _gone(pid: int, timeout: float = 30) -> bool:
    deadline = time.time() + timeout
    while time.time() < deadline:
        try:
            os.kill(pid, 0)
        except ProcessLookupError:
            return True
        time.sleep(0.2)
    return False


@pytest.mark.slow
def test_real_cpu_judge_server_end_to_end(tmp_path, tiny_model_dir):
    rubric = write_rubric(tmp_path, score_method="expected", prefix="Score:", model=str(tiny_model_dir),
                          source="path", max_tokens=3)
    endpoint = tmp_path / "run" / "judge" / "endpoint.json"
    log = tmp_path / "judge_server.log"
    launcher = _launch(rubric, endpoint, log)
    try:
        # The consumer starts with the service (as under Snakemake): the file says "starting" until the
        # server answers; wait_for_endpoint returns only a ready, healthy endpoint.
        ep = wait_for_endpoint(endpoint, timeout_s=120, poll_s=0.2)
        data = json.loads(endpoint.read_text())
        assert data["status"] == "ready" and "judge healthy at" in log.read_text()
        assert data["url"].startswith("http://127.0.0.1:") and data["url"].endswith("/v1")
        assert data["model"] == "judge" and data["rubric"] == str(rubric) and data["pid"] != launcher.pid
        key_file = Path(data["api_key_file"])
        assert stat.S_IMODE(key_file.stat().st_mode) == 0o600
        key = key_file.read_text().strip()
        assert len(key) >= 32

        # Auth: /health is open, /v1 needs the per-run key.
        assert httpx.get(f"{ep.base_url}/health").status_code == 200
        assert httpx.get(f"{ep.url}/models").status_code == 401
        assert httpx.get(f"{ep.url}/models", headers={"Authorization": "Bearer wrong"}).status_code == 401
        client = JudgeClient(ep, timeout_s=60, retries=0)
        payload, _, _ = client.post("/chat/completions", {
            "model": "judge", "messages": [{"role": "user", "content": "Rate it"}, {"role": "assistant",
                                                                                   "content": "Score:"}],
            "continue_final_message": True, "add_generation_prompt": False, "max_tokens": 3, "temperature": 0,
            "logprobs": True, "top_logprobs": 3, "n": 2})
        assert len(payload["choices"]) == 2
        assert payload["choices"][0]["message"]["content"] == payload["choices"][1]["message"]["content"]
        entries = payload["choices"][0]["logprobs"]["content"]
        assert entries and all(e["logprob"] <= 0 and len(e["top_logprobs"]) == 3 for e in entries)
        # greedy: each answer token is the most likely one at its position (teacher-forced logprobs agree)
        assert all(e["top_logprobs"][0]["logprob"] >= e["logprob"] - 1e-4 for e in entries)
        with pytest.raises(JudgeRequestError, match="max_model_len"):
            client.post("/chat/completions", {"model": "judge", "messages": [{"role": "user", "content": "word " * 5000}],
                                              "max_tokens": 2})
        with pytest.raises(JudgeRequestError, match="HTTP 404"):  # raw-prompt completions: vLLM only
            client.post("/completions", {"model": "judge", "prompt": "Score:", "max_tokens": 2})
        client.close()

        # Score rows through the reward, concurrently; audit file is 0600 with the full record.
        audit = tmp_path / "run" / "train" / "audit"
        step = json.dumps(make_step())
        results = [compute_score("llm_as_rnn_memory_update", memory(f"memory {i}: heart failure"), step,
                                 {"index": 0}, endpoint_file=str(endpoint), audit_dir=str(audit))
                   for i in range(3)]
        assert all(r["judge_calls"] == 1 and r["valid_json"] for r in results)
        assert all(r["parse_method"] in ("expected", "score_line", "short_digit", "fallback") for r in results)
        files = list(audit.glob("calls_*.jsonl"))
        assert len(files) == 1 and stat.S_IMODE(files[0].stat().st_mode) == 0o600
        records = [json.loads(line) for line in files[0].read_text().splitlines()]
        assert len(records) == 3
        assert records[0]["rollout"] == memory("memory 0: heart failure")
        assert "memory 0: heart failure" in records[0]["judge"][0]["prompt"]
        assert isinstance(records[0]["judge"][0]["response"], str) and records[0]["score"] == results[0]["score"]
        assert key not in log.read_text() and key not in files[0].read_text()

        # Shutdown: SIGTERM (what Snakemake sends a service) stops server and launcher, removes the key.
        server_pid = data["pid"]
        launcher.send_signal(signal.SIGTERM)
        assert launcher.wait(60) == 0
        assert _gone(server_pid)
        assert not key_file.exists()
    finally:
        if launcher.poll() is None:
            launcher.kill()
            launcher.wait()


def test_launcher_failure_is_reported_to_waiting_consumers(tmp_path):
    rubric = write_rubric(tmp_path, model=str(tmp_path / "no-such-model"), source="path")
    endpoint = tmp_path / "judge" / "endpoint.json"
    proc = subprocess.run(
        [sys.executable, "-m", "llmrnn.cli", "judge", "server", "--rubric", str(rubric), "--endpoint", str(endpoint)],
        check=False, capture_output=True, text=True, timeout=60,
    )
    assert proc.returncode == 3 and "no-such-model" in proc.stderr and "Traceback" not in proc.stderr
    data = json.loads(endpoint.read_text())
    assert data["status"] == "failed" and "no-such-model" in data["error"]
    # A consumer fails fast with the launcher's message, not after its timeout.
    with pytest.raises(CheckFailed, match="judge server failed to start: .*no-such-model"):
        wait_for_endpoint(endpoint, timeout_s=30, poll_s=0.1)
    # ... also via the error file when the endpoint file is gone (Snakemake removes service outputs).
    endpoint.unlink()
    os.utime(endpoint.parent / "server_error.txt")
    with pytest.raises(CheckFailed, match="judge server failed to start: .*no-such-model"):
        wait_for_endpoint(endpoint, timeout_s=30, poll_s=0.1)


def test_wait_times_out_clearly_on_a_stale_endpoint(tmp_path):
    dead = subprocess.Popen([sys.executable, "-c", "pass"])
    dead.wait()
    ep = write_endpoint(tmp_path, free_port(), REPO / "config/rubrics/outcome_v2_smollm2.yaml", pid=dead.pid)
    with pytest.raises(CheckFailed, match=r"not healthy after 1 s .*pid .* not running"):
        wait_for_endpoint(ep, timeout_s=1, poll_s=0.2)


def test_wait_polls_until_health_answers(tmp_path):
    rubric = REPO / "config/rubrics/outcome_v2_smollm2.yaml"
    with ScriptedJudge(lambda body: "Score: 5") as judge:
        ep = write_endpoint(tmp_path, judge.port, rubric)
        assert wait_for_endpoint(ep, timeout_s=10).url == f"http://127.0.0.1:{judge.port}/v1"
    with ScriptedJudge(lambda body: "Score: 5", health=False) as judge:
        ep = write_endpoint(tmp_path, judge.port, rubric)
        with pytest.raises(CheckFailed, match="/health does not answer"):
            wait_for_endpoint(ep, timeout_s=1, poll_s=0.2)


def test_vllm_command_from_the_reproduce_rubric_keeps_the_key_off_argv(tmp_path):
    rubric = load_rubric(REPO / "config/rubrics/rubric_v2_rubricarm_scalar.yaml")
    key = tmp_path / "api_key"
    key.write_text("secret-xyz\n")
    argv, env, name = server_command(rubric, "OpenRubrics/RubricARM-8B-Judge", 8123, key)
    assert argv[:3] == ["vllm", "serve", "OpenRubrics/RubricARM-8B-Judge"]
    joined = " ".join(argv)
    for part in ("--host 127.0.0.1", "--port 8123", "--max-model-len 12000", "--gpu-memory-utilization 0.9",
                 "--dtype bfloat16", "--served-model-name OpenRubrics/RubricARM-8B-Judge"):
        assert part in joined
    # nine answer-ending stops (one per score line): vLLM builds that cap stop lists at 4 are told the number
    assert "secret-xyz" not in joined and env == {"VLLM_API_KEY": "secret-xyz", "VLLM_MAX_STOP_STRINGS": "9"}
    assert name == "OpenRubrics/RubricARM-8B-Judge"


# --------------------------------------------------------------------------- client retries
def _endpoint(port: int) -> Endpoint:
    return Endpoint(url=f"http://127.0.0.1:{port}/v1", model="judge", api_key_file=None, rubric="r")


def _client(port: int, retries: int = 2, timeout: float = 5.0) -> JudgeClient:
    return JudgeClient(_endpoint(port), timeout_s=timeout, retries=retries, backoff_s=0.01, backoff_max_s=0.05)


def test_refused_connection_is_retried_then_raises():
    with pytest.raises(JudgeUnavailable, match="failed 3 times; last error: ConnectError"):
        _client(free_port()).post("/chat/completions", {})


def test_timeout_is_retried_then_raises():
    with ScriptedJudge(lambda body: "Score: 5", delay_s=1.0, key=None) as judge:
        with pytest.raises(JudgeUnavailable, match="timeout"):
            _client(judge.port, retries=1, timeout=0.2).post("/chat/completions", {})
        assert judge.hits == 2


def test_http_500_is_retried_then_raises_and_recovers_when_the_server_does():
    with ScriptedJudge(lambda body: (500, {"error": "boom"}), key=None) as judge:
        with pytest.raises(JudgeUnavailable, match="HTTP 500"):
            _client(judge.port, retries=3).post("/chat/completions", {})
        assert judge.hits == 4
    answers = iter([(503, {"error": "busy"}), (500, {"error": "boom"})])
    with ScriptedJudge(lambda body: next(answers, "Score: 6"), key=None) as judge:
        payload, _, retries = _client(judge.port, retries=3).post("/chat/completions", {})
        assert retries == 2 and payload["choices"][0]["message"]["content"] == "Score: 6"


def test_client_errors_are_not_retried():
    with ScriptedJudge(lambda body: (400, {"error": "bad request"}), key=None) as judge:
        with pytest.raises(JudgeRequestError, match="HTTP 400"):
            _client(judge.port, retries=3).post("/chat/completions", {})
        assert judge.hits == 1


# --------------------------------------------------------------------------- answers that are no answer
_LP_OK = [{"token": "7", "logprob": -0.2, "top_logprobs": [{"token": "7", "logprob": -0.2}, {"token": "8", "logprob": -1.8}]}]
FAULTS = {
    "empty content": lambda body: chat_payload(""),
    "no choices": lambda body: {"id": "x", "object": "chat.completion", "choices": []},
    "logprobs missing": lambda body: chat_payload("7"),
    "logprobs malformed": lambda body: chat_payload("7", logprobs=[{"token": "7", "top_logprobs": "lots"}]),
}


@pytest.mark.parametrize("fault", sorted(FAULTS))
def test_an_answer_without_content_is_retried_then_the_judge_is_unavailable(tmp_path, fault):
    """A 200 with nothing usable is a transport failure, never the 0.5 fallback nor a bare ValueError."""
    rubric = write_rubric(tmp_path, score_method="expected", prefix="Score:")
    respond = FAULTS[fault]
    with ScriptedJudge(lambda body: (200, respond(body))) as judge:
        ep = write_endpoint(tmp_path, judge.port, rubric)
        kw = {"endpoint_file": str(ep), "audit_dir": str(tmp_path / "audit"),
              "reward_cfg": {"retries": 2, "backoff_s": 0.01, "backoff_max_s": 0.02}}
        with pytest.raises(JudgeUnavailable, match="failed 3 times; last error: HTTP 200 but"):
            compute_score("llm_as_rnn_memory_update", memory("CKD and heart failure"), json.dumps(make_step()),
                          {"index": 0}, **kw)
        assert judge.hits == 3
    # the reason is left for the train command (verl's reward workers die inside Ray)
    assert "failed 3 times" in (tmp_path / "audit" / "stop_reason.txt").read_text()


def test_an_empty_answer_then_a_real_one_scores_the_real_one(tmp_path):
    rubric = write_rubric(tmp_path, score_method="expected", prefix="Score:")
    answers = iter([(200, chat_payload("")), (200, {"choices": []})])
    with ScriptedJudge(lambda body: next(answers, (200, chat_payload("7", logprobs=_LP_OK)))) as judge:
        ep = write_endpoint(tmp_path, judge.port, rubric)
        result = compute_score("llm_as_rnn_memory_update", memory("CKD"), json.dumps(make_step()), {"index": 0},
                               endpoint_file=str(ep), audit_dir=str(tmp_path / "audit"),
                               reward_cfg={"retries": 3, "backoff_s": 0.01})
    assert result["retries"] == 2 and result["parse_method"] == "expected"
    assert result["score"] == pytest.approx((7 * math.exp(-0.2) + 8 * math.exp(-1.8))
                                            / (math.exp(-0.2) + math.exp(-1.8)) / 9)


# --------------------------------------------------------------------------- is it OUR server?
def test_a_fixed_port_held_by_another_server_fails_before_the_model_loads(tmp_path):
    """A server that ignores auth already listens on the rubric's fixed port: the launcher names the port
    and stops before loading anything; the other server never sees our key or a prompt."""
    model = tmp_path / "not-a-loadable-model"  # config.json only: loading it would fail differently
    model.mkdir()
    (model / "config.json").write_text("{}")
    with ScriptedJudge(lambda body: "Score: 9", key=None) as foreign:
        rubric = write_rubric(tmp_path, model=str(model), source="path")
        text = rubric.read_text().replace("port: 0", f"port: {foreign.port}")
        assert f"port: {foreign.port}" in text
        rubric.write_text(text)
        endpoint = tmp_path / "judge" / "endpoint.json"
        proc = subprocess.run([sys.executable, "-m", "llmrnn.cli", "judge", "server", "--rubric", str(rubric),
                               "--endpoint", str(endpoint)], check=False, capture_output=True, text=True, timeout=60)
        assert proc.returncode == 3 and "Traceback" not in proc.stderr
        assert f"port {foreign.port} on 127.0.0.1 is already in use" in proc.stderr
        data = json.loads(endpoint.read_text())
        assert data["status"] == "failed" and str(foreign.port) in data["error"]
        assert not (tmp_path / "judge" / "api_key").exists()
        assert foreign.requests == [] and foreign.bodies == []


def test_readiness_refuses_a_server_that_ignores_auth_without_sending_the_key():
    with ScriptedJudge(lambda body: "Score: 9", key=None) as foreign:
        base = f"http://127.0.0.1:{foreign.port}"
        with pytest.raises(NotOurServer, match="without the API key"):
            readiness(base, "our-secret-key", "judge")
        assert all(auth is None for _, _, auth in foreign.requests) and foreign.bodies == []


def test_readiness_refuses_a_server_that_takes_any_key(tmp_path):
    """401 without a key but 200 with ANY key: a made-up key goes first, so ours is never sent."""
    import threading
    from http.server import BaseHTTPRequestHandler

    seen: list[str | None] = []

    class AnyKey(BaseHTTPRequestHandler):
        def log_message(self, *args):
            pass

        def do_GET(self):
            seen.append(self.headers.get("Authorization"))
            ok = self.path == "/health" or self.headers.get("Authorization")
            data = json.dumps({"data": [{"id": "judge"}]}).encode()
            self.send_response(200 if ok else 401)
            self.send_header("Content-Length", str(len(data)))
            self.end_headers()
            self.wfile.write(data)

    srv = LocalServer(("127.0.0.1", 0), AnyKey)
    threading.Thread(target=srv.serve_forever, daemon=True).start()
    try:
        with pytest.raises(NotOurServer, match="accepts a made-up API key"):
            readiness(f"http://127.0.0.1:{srv.server_address[1]}", "our-secret-key", "judge")
    finally:
        srv.shutdown()
        srv.server_close()
    assert seen and all("our-secret-key" not in (h or "") for h in seen)


def test_readiness_keeps_waiting_while_nothing_answers():
    assert readiness(f"http://127.0.0.1:{free_port()}", "k", "judge") is False


# --------------------------------------------------------------------------- a server that cannot be trusted
def _score(tmp_path, judge, retries: int = 1, timeout_s: float = 30.0):
    tmp_path.mkdir(parents=True, exist_ok=True)
    rubric = write_rubric(tmp_path, score_method="expected", prefix="Score:")
    ep = write_endpoint(tmp_path, judge.port, rubric)
    return compute_score("llm_as_rnn_memory_update", memory("CKD and heart failure"), json.dumps(make_step()),
                         {"index": 0}, endpoint_file=str(ep), audit_dir=str(tmp_path / "audit"),
                         reward_cfg={"retries": retries, "backoff_s": 0.01, "backoff_max_s": 0.02,
                                     "timeout_s": timeout_s})


def _lp(token: str, logprob: float, tops: list[tuple[str, float]]) -> dict:
    return {"token": token, "logprob": logprob, "top_logprobs": [{"token": t, "logprob": v} for t, v in tops]}


UNTRUSTED = {
    "another model": lambda body: {**chat_payload("7", [_lp("7", -0.2, [("7", -0.2)])]), "model": "someone-else"},
    "text 2, logprobs for 9": lambda body: chat_payload("2", [_lp("9", -0.001, [("9", -0.001), ("2", -7.0)])]),
    "chosen 2 certain, 9 certain too": lambda body: chat_payload("2", [_lp("2", 0.0, [("9", -0.001)])]),
    "greedy but not the most likely": lambda body: chat_payload("2", [_lp("2", -3.0, [("9", -0.05), ("2", -3.0)])]),
    "chosen logprob differs from its top entry": lambda body: chat_payload("7", [_lp("7", -0.2, [("7", -4.0)])]),
    "logprob 1e308": lambda body: chat_payload("7", [_lp("7", -0.1, [("7", -0.1), ("8", 1e308)])]),
    "positive logprob": lambda body: chat_payload("7", [_lp("7", 0.5, [("7", 0.5)])]),
    "NaN logprob": lambda body: chat_payload("7", [_lp("7", float("nan"), [("7", -0.1)])]),
    "more top_logprobs than asked": lambda body: chat_payload(
        "7", [_lp("7", -0.1, [("7", -0.1)] + [(f"t{i}", -30.0) for i in range(40)])]),
    "more tokens than max_tokens": lambda body: chat_payload("7" * 70, [_lp("7", -0.1, [("7", -0.1)])] * 70),
    "more choices than asked": lambda body: {**chat_payload("7", [_lp("7", -0.1, [("7", -0.1)])]),
                                             "choices": [chat_payload("7", [_lp("7", -0.1, [("7", -0.1)])])[
                                                 "choices"][0]] * 3},
}


@pytest.mark.parametrize("fault", sorted(UNTRUSTED))
def test_an_answer_that_cannot_be_trusted_is_retried_then_the_judge_is_unavailable(tmp_path, fault):
    """Another model's answer, logprobs that are not the text's or not log-probabilities at all: never a
    score (content "2" with logprobs for "9" scored 0.999; 1e308 raised OverflowError)."""
    respond = UNTRUSTED[fault]
    with ScriptedJudge(lambda body: (200, respond(body))) as judge:
        with pytest.raises(JudgeUnavailable, match="failed 2 times; last error: HTTP 200 but"):
            _score(tmp_path, judge)
        assert judge.hits == 2


def test_a_consistent_answer_still_scores(tmp_path):
    good = chat_payload("7", [_lp("7", -0.2, [("7", -0.2), ("8", -1.8), ("x", -9.0)])])
    with ScriptedJudge(lambda body: (200, good)) as judge:
        result = _score(tmp_path, judge)
    assert result["parse_method"] == "expected" and result["retries"] == 0
    assert result["score"] == pytest.approx((7 * math.exp(-0.2) + 8 * math.exp(-1.8))
                                            / (math.exp(-0.2) + math.exp(-1.8)) / 9)


def _trickled_headers(every_s: float) -> RawReply:
    def write(h):
        for byte in b"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nX-Pad: " + b"p" * 10_000:
            try:
                h.wfile.write(bytes([byte]))
                h.wfile.flush()
            except OSError:
                return
            time.sleep(every_s)
    return RawReply(write)


@pytest.mark.parametrize("reply", ["trickle", "trickled headers", "endless chunked"])
def test_a_slow_or_endless_body_hits_the_whole_call_deadline(tmp_path, reply):
    """The timeout was per read: a byte every 0.4 s (or a chunk every 10 ms) kept a call alive for ever."""
    good = chat_payload("7", [_lp("7", -0.2, [("7", -0.2)])])
    respond = {"trickle": lambda: trickle_reply(good, 0.4), "trickled headers": lambda: _trickled_headers(0.4),
               "endless chunked": endless_chunked_reply}[reply]()
    with ScriptedJudge(lambda body: respond) as judge:
        t0 = time.monotonic()
        with pytest.raises(JudgeUnavailable, match="whole-call deadline of 1.5 s"):
            _score(tmp_path, judge, retries=1, timeout_s=1.5)
        # a bound on the test, not a measurement: two tries of 1.5 s, far below the ~60 s of the replies
        assert time.monotonic() - t0 < 20
        assert judge.hits == 2


def test_a_gzip_bomb_and_an_oversized_body_are_refused_at_the_cap(tmp_path):
    from llmrnn.transport import MAX_RESPONSE_BYTES

    bomb = gzip_bomb_reply(4 * MAX_RESPONSE_BYTES)
    with ScriptedJudge(lambda body: bomb) as judge, \
            pytest.raises(JudgeUnavailable, match=f"larger than {MAX_RESPONSE_BYTES} bytes .decompressed"):
        _score(tmp_path, judge)
    huge = chat_payload("7", [_lp("7", -0.1, [("7", -0.1)])]) | {"pad": "x" * (MAX_RESPONSE_BYTES + 1)}
    with ScriptedJudge(lambda body: (200, huge)) as judge, \
            pytest.raises(JudgeUnavailable, match=f"larger than {MAX_RESPONSE_BYTES} bytes .content-length"):
        _score(tmp_path / "plain", judge)  # its own endpoint file: compute_score keeps a client per file


def test_a_compressed_answer_within_the_cap_is_read(tmp_path):
    import gzip

    from tests.judge_helpers import gzip_reply

    reply = gzip_reply(gzip.compress(json.dumps(chat_payload("7", [_lp("7", -0.2, [("7", -0.2)])])).encode()))
    with ScriptedJudge(lambda body: reply) as judge:
        assert _score(tmp_path, judge)["score"] == pytest.approx(7 / 9)


def test_an_endpoint_naming_a_server_that_ignores_auth_is_refused(tmp_path):
    """The endpoint file is re-verified by its consumers: a server that answers without our key (a stale
    file whose port another server took, or a planted one) never gets the key nor a prompt."""
    from llmrnn.judge.client import UntrustedEndpoint

    rubric = write_rubric(tmp_path, score_method="expected", prefix="Score:")
    with ScriptedJudge(lambda body: "Score: 9", key=None) as foreign:
        ep = write_endpoint(tmp_path, foreign.port, rubric)
        with pytest.raises(UntrustedEndpoint, match="without the API key") as err:
            wait_for_endpoint(ep, timeout_s=5, poll_s=0.1)
        assert isinstance(err.value, JudgeUnavailable) and isinstance(err.value, CheckFailed)
        with pytest.raises(JudgeUnavailable):
            compute_score("llm_as_rnn_memory_update", memory("x"), json.dumps(make_step()), {"index": 0},
                          endpoint_file=str(ep), audit_dir=str(tmp_path / "audit"))
        assert foreign.bodies == [] and all(KEY not in (auth or "") for _, _, auth in foreign.requests)
        no_key = write_endpoint(tmp_path / "nokey", foreign.port, rubric, key=None)
        with pytest.raises(UntrustedEndpoint, match="no API key file"):
            wait_for_endpoint(no_key, timeout_s=5, poll_s=0.1)
        assert foreign.bodies == []


def test_bind_address_for_training_across_nodes(monkeypatch):
    """judge.host: null keeps the rubric's loopback; `node` is this node's address as SLURM reaches it
    (NodeAddr, resolved); listening on every interface is refused."""
    import socket

    from llmrnn.errors import InputError
    from llmrnn.judge.launcher import bind_address

    assert bind_address(None, "127.0.0.1") == "127.0.0.1"
    assert bind_address("10.1.2.3", "127.0.0.1") == "10.1.2.3"
    for wildcard in ("0.0.0.0", "::", ""):
        with pytest.raises(InputError, match="every interface"):
            bind_address(wildcard, "127.0.0.1")
    monkeypatch.setenv("SLURMD_NODENAME", "no-such-slurm-node-xyz")
    monkeypatch.setattr(socket, "gethostbyname", lambda name: {"no-such-slurm-node-xyz": "10.9.8.7"}[name])
    assert bind_address("node", "127.0.0.1") == "10.9.8.7"


def test_judge_serve_refuses_every_interface(tmp_path, tiny_model_dir):
    from llmrnn.cli import main
    from llmrnn.errors import InputError
    from llmrnn.judge.server import serve

    with pytest.raises(InputError, match="never to every interface"):
        serve(str(tiny_model_dir), "judge", "0.0.0.0", 1, None, 512, "float32")
    assert main(["judge", "serve", "--model", str(tiny_model_dir), "--served-model-name", "j", "--host", "::",
                 "--port", "1"]) != 0
