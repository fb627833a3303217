"""`llmrnn judge serve`: a small OpenAI-compatible judge server for CPU (engine `llmrnn` of a rubric).

Routes: GET /health (open), GET /v1/models and POST /v1/chat/completions (Bearer key), with n,
temperature/top_p/seed, stop, max_tokens, logprobs/top_logprobs and continue_final_message. It exists
because the embedded default's small judge needs logprobs for its probability-weighted digit score
(G-Eval style), and `transformers serve` (transformers 5.23) ignores `logprobs` and `n` and has no API key.

Generation is the forward pass's engine, llmrnn.backends.TransformersBackend (`generate_scored`, which
also returns each generated token's logprob and top alternatives): concurrent requests are collected
into one batched call per sampling setting, so the rows share the prompt prefix the engine computes once.
"""

from __future__ import annotations

import hmac
import logging
import queue
import random
import threading
import time
import uuid
from concurrent.futures import Future, ThreadPoolExecutor
from pathlib import Path

from llmrnn.backends import make_backend
from llmrnn.errors import InputError

# an OpenAI request without temperature / top_p samples at 1.0 (the API's own defaults; not llmrnn config)
OPENAI_TEMPERATURE = OPENAI_TOP_P = 1.0

log = logging.getLogger(__name__)


class Engine:
    """A TransformersBackend behind a queue: requests arriving together share one generate call."""

    def __init__(self, backend, max_batch: int = 16):
        self.backend = backend
        self.max_batch = max_batch
        self.queue: queue.Queue = queue.Queue()
        threading.Thread(target=self._loop, daemon=True, name="generate").start()

    def prompt_length(self, messages: list[dict]) -> int:
        return self.backend.prompt_lengths([messages])[0]

    def submit(self, messages: list[dict], params: dict) -> dict:
        fut: Future = Future()
        self.queue.put((messages, params, fut))
        return fut.result()

    def _loop(self) -> None:
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
                groups.setdefault((p["temperature"], p["top_p"], p["max_tokens"]), []).append(item)
            for items in groups.values():
                try:
                    outs = self._generate([i[0] for i in items], [i[1] for i in items])
                except Exception as exc:  # noqa: BLE001 - reported to every waiting request
                    for _, _, fut in items:
                        fut.set_exception(exc)
                else:
                    for (_, _, fut), out in zip(items, outs):
                        fut.set_result(out)

    def _generate(self, conversations: list[list[dict]], params: list[dict]) -> list[dict]:
        p0 = params[0]
        seeds = None
        if p0["temperature"] > 0 and any(p["seed"] is not None for p in params):
            seeds = [p["seed"] if p["seed"] is not None else random.getrandbits(62) for p in params]
        # tokens are always scored (k 0 when nobody asked): exact token counts and finish reasons
        top_k = max((p["logprobs"] or 0) for p in params)
        outs = self.backend.generate_scored(conversations, p0["temperature"], p0["top_p"], p0["max_tokens"], seeds,
                                            top_logprobs=top_k)
        results = []
        for (text, entries), p in zip(outs, params):
            finish = "length" if len(entries) >= p["max_tokens"] else "stop"
            for stop_str in p["stop"]:
                cut = text.find(stop_str)
                if cut >= 0:  # vLLM's include_stop_str_in_output keeps the stop (a rubric's score line)
                    text, finish = text[:cut + (len(stop_str) if p["include_stop"] else 0)], "stop"
            results.append({"text": text, "logprobs": entries, "completion_tokens": len(entries),
                            "finish_reason": finish})
        return results


def _error(status: int, message: str, kind: str = "invalid_request_error"):
    from fastapi.responses import JSONResponse

    return JSONResponse({"error": {"message": message, "type": kind, "code": status}}, status_code=status)


def sampling(body: dict, served_model_name: str) -> dict | str:
    """The request's sampling settings, or why the request is invalid."""
    if body.get("model") != served_model_name:
        return f"model {body.get('model')!r} is not served here (serving {served_model_name!r})"
    if body.get("stream"):
        return "stream is not supported by this server"
    logprobs = int(body.get("top_logprobs") or 0) if body.get("logprobs") else None
    if logprobs is not None and not 0 <= logprobs <= 20:
        return "top_logprobs must be 0..20"
    stop = body.get("stop") or []
    return {
        "max_tokens": int(body.get("max_completion_tokens") or body.get("max_tokens") or 16),
        "temperature": float(body.get("temperature", OPENAI_TEMPERATURE) or 0.0),
        "top_p": float(body.get("top_p", OPENAI_TOP_P) or 1.0), "seed": body.get("seed"),
        "logprobs": logprobs, "stop": [stop] if isinstance(stop, str) else list(stop),
        "include_stop": bool(body.get("include_stop_str_in_output")),
        "n": int(body.get("n") or 1),
    }


def _choice(k: int, out: dict, top_k: int | None) -> dict:
    lp = None
    if top_k is not None:
        lp = {"content": [{
            "token": e["token"], "logprob": e["logprob"], "bytes": list(e["token"].encode()),
            "top_logprobs": [{"token": t, "logprob": v, "bytes": list(t.encode())} for t, v in e["top"][:top_k]],
        } for e in out["logprobs"]]}
    return {"index": k, "message": {"role": "assistant", "content": out["text"]}, "logprobs": lp,
            "finish_reason": out["finish_reason"]}


def chat_completion(engine: Engine, body: dict, served_model_name: str, max_model_len: int) -> dict | tuple:
    """An OpenAI chat.completion for `body`, or (status, message) when the request is invalid."""
    p = sampling(body, served_model_name)
    if isinstance(p, str):
        return (404 if p.startswith("model ") else 400), p
    messages = body.get("messages")
    if not isinstance(messages, list) or not messages or not all(isinstance(m, dict) for m in messages):
        return 400, "messages must be a non-empty list of objects"
    if body.get("continue_final_message") and messages[-1].get("role") != "assistant":
        return 400, "continue_final_message needs a final assistant message"
    try:
        prompt_tokens = engine.prompt_length(messages)
    except Exception as exc:  # noqa: BLE001 - a template error is the client's problem
        return 400, f"chat template failed: {exc}"
    if prompt_tokens + p["max_tokens"] > max_model_len:
        return 400, (f"prompt ({prompt_tokens} tokens) + max_tokens ({p['max_tokens']}) exceeds "
                     f"max_model_len {max_model_len}")
    copies = [dict(p, seed=None if p["seed"] is None else int(p["seed"]) + k) for k in range(p["n"])]
    with ThreadPoolExecutor(len(copies)) as pool:  # the n copies reach the engine together: one batch
        outs = list(pool.map(lambda params: engine.submit(messages, params), copies))
    completion = sum(o["completion_tokens"] for o in outs)
    return {"id": f"chatcmpl-{uuid.uuid4().hex}", "object": "chat.completion", "created": int(time.time()),
            "model": served_model_name, "choices": [_choice(k, o, p["logprobs"]) for k, o in enumerate(outs)],
            "usage": {"prompt_tokens": prompt_tokens, "completion_tokens": completion,
                      "total_tokens": prompt_tokens + completion}}


def build_app(engine: Engine, served_model_name: str, api_key: str | None, max_model_len: int):
    """The FastAPI app of `llmrnn judge serve` (module docstring)."""
    from fastapi import FastAPI, Request

    app = FastAPI(title="llmrnn judge")

    @app.middleware("http")
    async def auth(request: Request, call_next):
        if request.url.path.startswith("/v1") and api_key:
            given = request.headers.get("authorization", "")
            if not hmac.compare_digest(given.encode(), f"Bearer {api_key}".encode()):
                return _error(401, "missing or wrong API key", "authentication_error")
        return await call_next(request)

    @app.get("/health")
    def health():
        return {"status": "ok"}

    @app.get("/v1/models")
    def models():
        return {"object": "list", "data": [{"id": served_model_name, "object": "model", "owned_by": "llmrnn",
                                             "max_model_len": max_model_len}]}

    @app.post("/v1/chat/completions")
    def chat(body: dict):
        out = chat_completion(engine, body, served_model_name, max_model_len)
        return _error(*out) if isinstance(out, tuple) else out

    return app


def serve(model_dir: str, served_model_name: str, host: str, port: int, api_key_file: str | None,
          max_model_len: int, dtype: str) -> int:
    import uvicorn


    if host in ("", "0.0.0.0", "::"):  # one address (loopback, or the node's for multi-node training)
        raise InputError(f"--host {host!r}: the judge binds to one address, never to every interface")
    if not (Path(model_dir) / "config.json").is_file():
        raise InputError(f"--model {model_dir}: not a HF model directory (no config.json)")
    key = Path(api_key_file).read_text().strip() if api_key_file else None
    t0 = time.time()
    # stop_at_json off: a judge answers a score, not a JSON object
    backend = make_backend({"backend": "transformers", "device": "cpu", "dtype": dtype, "stop_at_json": False},
                           model_dir, cache=False)
    app = build_app(Engine(backend), served_model_name, key, max_model_len)
    log.info("judge model %s loaded in %.1f s; serving as %r on %s:%d", model_dir, time.time() - t0,
             served_model_name, host, port)
    uvicorn.run(app, host=host, port=port, log_level="warning", access_log=False)
    return 0
