"""Inference backends: transformers on a real tiny model, openai against a real HTTP server on 127.0.0.1."""

from __future__ import annotations

import json
import sys
import threading
import typing
from http.server import BaseHTTPRequestHandler

import pytest

from llmrnn import backends, prefix_engine
from llmrnn.backends import BackendError, make_backend
from llmrnn.errors import InputError
from tests.judge_helpers import LocalServer

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


def test_generate_scored_gives_the_same_texts_with_the_logprobs_of_the_tokens_drawn(tiny):
    """The judge server's logprobs come from the same batched call: greedy picks each step's top token,
    and the seeded samples are the ones `generate` draws."""
    import math

    scored = tiny.generate_scored(CONVS, 0.0, 1.0, 6, top_logprobs=3)
    assert [text for text, _ in scored] == tiny.generate(CONVS, 0.0, 1.0, 6)
    for text, entries in scored:
        assert 1 <= len(entries) <= 6 and "".join(e["token"] for e in entries).strip() == text
        for e in entries:
            assert len(e["top"]) == 3 and e["top"][0][0] == e["token"]
            assert math.isclose(e["top"][0][1], e["logprob"], abs_tol=1e-5) and e["logprob"] <= 0
    seeds = [11, 22, 33, 44, 55]
    sampled = tiny.generate_scored(CONVS, 1.0, 0.9, 6, seeds=seeds, top_logprobs=0)
    assert [t for t, _ in sampled] == tiny.generate(CONVS, 1.0, 0.9, 6, seeds=seeds)
    assert all(e["top"] == [] for _, entries in sampled for e in entries)


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
    srv = LocalServer(("127.0.0.1", 0), _Handler)
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
    assert prefix_engine.json_closed('{"a": "}"}')
    assert not prefix_engine.json_closed('{"a": "}')
    assert prefix_engine.json_closed('noise {"a": {"b": 1}} more')
    assert not prefix_engine.json_closed('{"a": {"b": 1}')
    assert not prefix_engine.json_closed("no braces")


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


SHARED = [
    [{"role": "system", "content": "Answer with JSON only. " * 6},
     {"role": "user", "content": f"patient {i}: " + "chronic kidney disease " * (1 + 2 * i)}]
    for i in range(5)
]


@pytest.fixture(scope="module")
def plain(tiny_model_dir):
    """The same engine with `generation: generate`: plain model.generate() prefilling the padded batch."""
    return make_backend({"backend": "transformers", "batch_size": 2, "generation": "generate"}, tiny_model_dir,
                        cache=False)


def test_shared_prefix_prefill_gives_the_tokens_of_a_plain_prefill(tiny, plain):
    """The batch's common prompt prefix is computed once, the rest in right-padded chunks; the sampled
    tokens are those of HF generate prefilling the left-padded batch itself (generation: generate)."""
    seeds = [3, 1, 4, 1, 5]
    before = tiny.prefill_tokens
    ours = tiny.generate(SHARED, temperature=1.0, top_p=0.9, max_tokens=10, seeds=seeds)
    computed = tiny.prefill_tokens - before
    prompt_tokens = sum(tiny.prompt_lengths(SHARED))
    assert computed < prompt_tokens - 3 * 40  # the ~50-token system prompt ran once per micro-batch of 2
    before = plain.prefill_tokens
    theirs = plain.generate(SHARED, temperature=1.0, top_p=0.9, max_tokens=10, seeds=seeds)
    assert plain.prefill_tokens - before == prompt_tokens  # generate() ran every prompt token itself
    assert ours == theirs and len(set(ours)) > 1


@pytest.mark.parametrize("stop_at_json", [True, False])
def test_both_generation_settings_give_the_same_tokens(tiny_model_dir, stop_at_json):
    """generation: prefix_cache (llmrnn.prefix_engine) and generation: generate (plain model.generate())
    decode the same tokens, greedy and seeded; this guards a torch/transformers upgrade of either path."""
    engines = [make_backend({"backend": "transformers", "batch_size": 4, "generation": g,
                             "stop_at_json": stop_at_json}, tiny_model_dir, cache=False)
               for g in ("prefix_cache", "generate")]
    assert engines[0].shared_prefix_attention and not engines[1].shared_prefix_attention
    conversations = SHARED + CONVS  # shared-prefix rows and rows without a common prefix, in one call
    cached, plain = (e.generate(conversations, temperature=0.0, top_p=1.0, max_tokens=12) for e in engines)
    assert cached == plain
    seeds = list(range(100, 100 + len(conversations)))
    cached, plain = (e.generate(conversations, temperature=1.0, top_p=0.9, max_tokens=12, seeds=seeds)
                     for e in engines)
    assert cached == plain and len(set(cached)) > 1  # the random model's samples differ row to row


def test_unknown_generation_setting_is_one_clear_error(tiny_model_dir):
    with pytest.raises(InputError, match="generation 'fast': expected one of prefix_cache, generate"):
        make_backend({"backend": "transformers", "generation": "fast"}, tiny_model_dir, cache=False)


def test_preallocated_cache_grows_and_follows_batch_selection():
    import torch

    keys = torch.arange(2 * 1 * 3 * 2, dtype=torch.float32).reshape(2, 1, 3, 2)
    cache = prefix_engine.preallocated_cache([(keys, keys + 100)], capacity=4)
    layer = cache.layers[0]
    for step in range(3):  # the third token overflows capacity 4: fresh, larger buffers
        new = torch.full((2, 1, 1, 2), float(step))
        k, v = layer.update(new, new + 100)
    assert k.shape == (2, 1, 6, 2) and cache.get_seq_length() == 6
    assert torch.equal(k[:, :, :3], keys) and torch.equal(v[:, :, 3:], torch.tensor([100.0, 101, 102])
                                                          .view(1, 1, 3, 1).expand(2, 1, 3, 2))
    layer.batch_select_indices(torch.tensor([1]))
    k, _ = layer.update(torch.full((1, 1, 1, 2), 9.0), torch.zeros(1, 1, 1, 2))
    assert k.shape == (1, 1, 7, 2) and torch.equal(k[0, :, :3], keys[1]) and k[0, 0, 6, 0] == 9.0


@pytest.mark.parametrize("top_p", [0.5, 0.9])
def test_wide_rows_draw_the_multinomial_token_of_the_nucleus(top_p):
    """Rows whose mass spreads beyond the top candidates take the full sort: their token is the one
    torch.multinomial draws from the nucleus-filtered distribution with the row's own generator."""
    import torch

    torch.manual_seed(0)
    scores = torch.randn(4, 300) * 0.3  # flat rows: 16 candidates never hold the nucleus
    seeds = [7, 8, 9, 10]
    out = prefix_engine.row_sampler(seeds, 1.0, top_p, candidates=16)(None, scores.clone())
    probs = torch.softmax(scores, dim=-1)
    sorted_p, order = torch.sort(probs, dim=-1, descending=True)
    sorted_p = sorted_p.masked_fill((torch.cumsum(sorted_p, -1) - sorted_p) > top_p, 0.0)
    nucleus = torch.zeros_like(probs).scatter(-1, order, sorted_p)
    expected = [int(torch.multinomial(nucleus[i], 1, generator=torch.Generator().manual_seed(s)))
                for i, s in enumerate(seeds)]
    assert out.argmax(dim=-1).tolist() == expected


def test_peaked_rows_sample_the_nucleus_from_their_candidates():
    """A peaked row draws among its top candidates only: never outside the nucleus, and with the nucleus
    distribution's frequencies (2000 seeded draws, so the counts are fixed, not flaky)."""
    import torch

    logits = torch.full((1, 500), -20.0)
    logits[0, :4] = torch.log(torch.tensor([0.5, 0.3, 0.15, 0.05]))  # nucleus at top_p 0.9: tokens 0, 1, 2
    seeds = list(range(2000))
    sampler = prefix_engine.row_sampler(seeds, 1.0, 0.9, candidates=8)
    tokens = sampler(None, logits.expand(len(seeds), -1).clone()).argmax(dim=-1)
    counts = torch.bincount(tokens, minlength=4)[:4].tolist()
    assert counts[3] == 0 and sum(counts) == len(seeds)
    for got, p in zip(counts[:3], (0.5 / 0.95, 0.3 / 0.95, 0.15 / 0.95)):
        assert abs(got / len(seeds) - p) < 0.04


def test_shared_prefix_is_stored_once_and_attended_like_per_row_copies(tiny_model_dir):
    """CPU decode attends the batch's shared prefix from ONE stored copy (split softmax merged by log-sum-exp);
    the tokens equal those of an engine that keeps a full copy of the prefix in every row's cache."""
    split = backends.TransformersBackend(str(tiny_model_dir), batch_size=8)
    copies = backends.TransformersBackend(str(tiny_model_dir), batch_size=8, shared_prefix_attention=False)
    assert split.shared_prefix_attention and not copies.shared_prefix_attention
    rows = split.tokenizer(split.render(SHARED), add_special_tokens=False)["input_ids"]
    cache = split._prefill(rows, room=4)["past_key_values"]
    shared = cache.layers[0].prefix[0].shape[-2]
    assert shared > 40 and cache.layers[0].prefix[0].shape[0] == 1  # one copy, not one per row
    assert cache.get_seq_length() == max(map(len, rows)) - 1 and cache.layers[0].keys.shape[-2] == cache.get_seq_length() - shared
    seeds = [9, 8, 7, 6, 5]
    assert split.generate(SHARED, 1.0, 0.9, 12, seeds=seeds) == copies.generate(SHARED, 1.0, 0.9, 12, seeds=seeds)


@pytest.mark.parametrize("native", [True, False], ids=["native-bf16-cpu", "emulated-bf16-cpu"])
def test_dtype_auto_on_the_cpu_is_bf16_only_where_the_cpu_has_it(tiny_model_dir, monkeypatch, native):
    import torch

    from llmrnn import gpus

    monkeypatch.setattr(gpus, "cpu_has_native_bf16", lambda cpuinfo=None: native)
    engine = backends.TransformersBackend(str(tiny_model_dir), dtype="auto")
    assert engine.model.dtype == (torch.bfloat16 if native else torch.float32)
    assert backends.TransformersBackend(str(tiny_model_dir), dtype="bfloat16").model.dtype == torch.bfloat16


class _TokenizerOnlyLLM:
    """The one method of vllm.LLM that VLLMBackend.prompt_lengths calls (vLLM itself: tests/test_vllm.py)."""

    def __init__(self, tok):
        self.tok = tok

    def get_tokenizer(self):
        return self.tok


def test_vllm_prompt_lengths_count_tokens_not_batch_encoding_keys(tiny):
    """Issue 31 item 2: with transformers 5, apply_chat_template(tokenize=True) returns a BatchEncoding whose
    len() is 2 (its keys): full_history's cap saw every prompt as 2 tokens and never left a visit out. The
    count is the prompt's tokens, for the engine and for the trained model served as a LoRA on it."""
    engine = object.__new__(backends.VLLMBackend)
    engine.llm = _TokenizerOnlyLLM(tiny.tokenizer)
    counts = engine.prompt_lengths(CONVS)
    assert counts == tiny.prompt_lengths(CONVS) and min(counts) > 10, counts
    assert backends.LoRAView(engine, "adapter").prompt_lengths(CONVS) == counts
