"""Inference backends: transformers on a real tiny model, openai against a real HTTP server on 127.0.0.1."""

from __future__ import annotations

import json
import sys
import threading
import typing
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest

from llmrnn import backends
from llmrnn.backends import BackendError, make_backend
from llmrnn.errors import InputError

CONVS = [
    [{"role": "user", "content": f"patient {i} with congestive heart failure " * (1 + i % 3)}] for i in range(5)
]


@pytest.fixture(scope="module")
def tiny(tiny_model_dir):
    return make_backend({"backend": "transformers", "batch_size": 2}, tiny_model_dir, cache=False)


def test_transformers_batched_equals_one_by_one_greedy(tiny):
    batched = tiny.generate(CONVS, temperature=0.0, top_p=1.0, max_tokens=8)
    alone = [tiny.generate([c], temperature=0.0, top_p=1.0, max_tokens=8)[0] for c in CONVS]
    assert len(batched) == len(CONVS)
    assert batched == alone


def test_transformers_seeded_sampling_is_per_row(tiny):
    seeds = [11, 22, 33, 44, 55]
    a = tiny.generate(CONVS, temperature=1.0, top_p=0.9, max_tokens=8, seeds=seeds)
    b = tiny.generate(CONVS[::-1], temperature=1.0, top_p=0.9, max_tokens=8, seeds=seeds[::-1])
    assert a == b[::-1]
    assert any(a)  # sampled tokens of the random model decode to text
    c = tiny.generate(CONVS, temperature=1.0, top_p=0.9, max_tokens=8, seeds=[s + 1 for s in seeds])
    assert a != c


def test_transformers_counts_calls_and_continues_a_response_prefix(tiny):
    before = tiny.calls
    conv = [{"role": "user", "content": "json please"}, {"role": "assistant", "content": '{"evolving_summary": "'}]
    text = tiny.render([conv])[0]
    assert text.rstrip().endswith('{"evolving_summary": "')  # continued, not closed by <|im_end|>
    tiny.generate([conv, conv], temperature=0.0, top_p=1.0, max_tokens=4)
    assert tiny.calls == before + 1 and tiny.generate([], 0.0, 1.0, 4) == []


def test_make_backend_shares_engines_and_rejects_unknown(tiny_model_dir):
    backends.clear_cache()
    a = make_backend({"backend": "transformers"}, tiny_model_dir)
    b = make_backend({"backend": "transformers", "temperature": 0.1}, tiny_model_dir)
    assert a is b
    with pytest.raises(InputError, match="backend 'llamacpp'"):
        make_backend({"backend": "llamacpp"}, tiny_model_dir)
    with pytest.raises(InputError, match="not a HF model directory"):
        make_backend({"backend": "transformers"}, tiny_model_dir.parent / "nope", cache=False)
    backends.clear_cache()


@pytest.mark.skipif("vllm" in sys.modules or __import__("importlib").util.find_spec("vllm") is not None,
                    reason="vllm installed: this checks the CPU install's message")
def test_vllm_without_vllm_is_one_clear_line(tiny_model_dir):
    with pytest.raises(InputError, match="needs the vllm package"):
        make_backend({"backend": "vllm"}, tiny_model_dir, cache=False)


class _Handler(BaseHTTPRequestHandler):
    requests: typing.ClassVar[list] = []
    fail_first = 0

    def do_POST(self):
        body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
        type(self).requests.append((self.path, self.headers.get("Authorization"), body))
        if type(self).fail_first > 0:
            type(self).fail_first -= 1
            self.send_response(503)
            self.end_headers()
            return
        if body["model"] == "missing":
            self.send_response(404)
            self.end_headers()
            self.wfile.write(b"no such model")
            return
        text = "echo:" + body["messages"][-1]["content"]
        payload = json.dumps({"choices": [{"message": {"role": "assistant", "content": text}}]}).encode()
        self.send_response(200)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(payload)))
        self.end_headers()
        self.wfile.write(payload)

    def log_message(self, *args):
        pass


@pytest.fixture
def server():
    _Handler.requests = []
    _Handler.fail_first = 0
    srv = ThreadingHTTPServer(("127.0.0.1", 0), _Handler)
    thread = threading.Thread(target=srv.serve_forever, daemon=True)
    thread.start()
    yield f"http://127.0.0.1:{srv.server_address[1]}/v1"
    srv.shutdown()
    srv.server_close()


def test_openai_backend_keeps_order_sends_sampling_and_key(server, monkeypatch):
    monkeypatch.setenv("TEST_LLMRNN_KEY", "sekret")
    cfg = {"backend": "openai", "url": server, "api_key_env": "TEST_LLMRNN_KEY", "concurrency": 4}
    be = make_backend(cfg, "served-model", cache=False)
    convs = [[{"role": "user", "content": f"q{i}"}] for i in range(9)]
    out = be.generate(convs, temperature=0.3, top_p=0.9, max_tokens=17, seeds=list(range(9)))
    assert out == [f"echo:q{i}" for i in range(9)]
    path, auth, body = _Handler.requests[0]
    assert path == "/v1/chat/completions" and auth == "Bearer sekret"
    assert body["model"] == "served-model" and body["temperature"] == 0.3 and body["max_tokens"] == 17
    assert be.calls == 1


def test_openai_backend_retries_then_raises(server, monkeypatch):
    _Handler.fail_first = 1
    be = backends.OpenAIBackend(url=server, model="m", max_retries=2)
    monkeypatch.setattr(backends.time, "sleep", lambda s: None)
    assert be.generate([[{"role": "user", "content": "x"}]], 0.0, 1.0, 4) == ["echo:x"]
    bad = backends.OpenAIBackend(url=server, model="missing", max_retries=2)
    with pytest.raises(BackendError, match="HTTP 404"):
        bad.generate([[{"role": "user", "content": "x"}]], 0.0, 1.0, 4)
    dead = backends.OpenAIBackend(url="http://127.0.0.1:9/v1", model="m", max_retries=1, timeout_s=2)
    with pytest.raises(BackendError, match="request failed"):
        dead.generate([[{"role": "user", "content": "x"}]], 0.0, 1.0, 4)


def test_openai_missing_key_env_is_an_input_error(monkeypatch):
    monkeypatch.delenv("NOPE_LLMRNN_KEY", raising=False)
    with pytest.raises(InputError, match="NOPE_LLMRNN_KEY"):
        backends.OpenAIBackend(url="http://127.0.0.1:1/v1", model="m", api_key_env="NOPE_LLMRNN_KEY")


def test_json_closed():
    assert backends.json_closed('{"a": "}"}')
    assert not backends.json_closed('{"a": "}')
    assert backends.json_closed('noise {"a": {"b": 1}} more')
    assert not backends.json_closed('{"a": {"b": 1}')
    assert not backends.json_closed("no braces")


def test_stop_at_json_stops_rows_whose_prefix_is_already_a_complete_object(tiny_model_dir):
    be = make_backend({"backend": "transformers", "stop_at_json": True}, tiny_model_dir, cache=False)
    done = [{"role": "user", "content": "x"}, {"role": "assistant", "content": '{"evolving_summary": "x"}'}]
    open_ = [{"role": "user", "content": "x"}, {"role": "assistant", "content": '{"evolving_summary": "'}]
    out = be.generate([done, open_], temperature=1.0, top_p=1.0, max_tokens=12, seeds=[1, 2])
    free = make_backend({"backend": "transformers", "stop_at_json": False}, tiny_model_dir, cache=False)
    unstopped = free.generate([done], temperature=1.0, top_p=1.0, max_tokens=12, seeds=[1])[0]

    def n_tokens(text):
        return len(be.tokenizer(text, add_special_tokens=False)["input_ids"])

    assert n_tokens(out[0]) <= 1  # the stopper fires at its first check, after one token
    assert n_tokens(unstopped) > 1
