"""LLM inference behind one small interface, three engines chosen per model role by config.

    backend = make_backend(role_cfg, model_path)
    texts = backend.generate(list_of_chat_message_lists, temperature, top_p, max_tokens, seeds=None)

`generate` is ONE batched call: the whole list goes to the engine at once (the forward pass sends all
patients of a visit step in one call per role). Engines:
  transformers  in-process HF model (CPU default; "cuda" when configured); left padding, batched
                `generate` in micro-batches of `batch_size` sequences sorted by length; with
                `stop_at_json` (default) a row stops once its answer closes its JSON object, so the
                rambling small models add after the JSON costs no decode steps; `generation`:
                `prefix_cache` (default: llmrnn.prefix_engine's shared-prefix prefill, cache and
                attention, built on torch/transformers internals) or `generate` (plain
                `model.generate()` prefilling the padded batch itself); both give the same tokens;
  vllm          in-process vLLM engine (GPU); imported only when a role uses it; LLM.chat with one
                SamplingParams per row;
  openai        any OpenAI-compatible endpoint (POST {url}/chat/completions) via httpx, `concurrency`
                requests in flight, retries with backoff, then a BackendError (a dead endpoint stops the
                run instead of turning into empty outputs). The key is read from the environment
                variable NAMED by `api_key_env`, never from the config.
Sampling: temperature 0 is greedy. With `seeds` (one int per row) sampling is seeded per row, so a
row's output does not depend on which other rows share its batch (the transformers engine samples
each row with its own torch.Generator; vLLM and OpenAI pass the seed through).
Engines are cached per (engine, model, settings): roles that share a model share one loaded copy.
"""

from __future__ import annotations

import ipaddress
import logging
import os
import random
import time
from collections.abc import Sequence
from concurrent.futures import FIRST_EXCEPTION, ThreadPoolExecutor, wait
from typing import Any, Protocol
from urllib.parse import urlsplit

from llmrnn import prefix_engine
from llmrnn.errors import InputError, LlmrnnError, NotRetriable
from llmrnn.gpus import cpu_dtype
from llmrnn.prompts import chat_tokens
from llmrnn.retry import RequestRejected, RetriesExhausted, RetryPolicy
from llmrnn.settings import defaults
from llmrnn.settings.workflow import Role
from llmrnn.transport import BoundedHTTP, JudgeAborted, LiveCalls
from llmrnn.upload import env_name_problem

log = logging.getLogger(__name__)

Messages = list[dict[str, str]]
BACKENDS = ("transformers", "vllm", "openai")
DTYPES = ("float32", "bfloat16", "float16", "auto")
GENERATION = ("prefix_cache", "generate")  # transformers: llmrnn.prefix_engine, or plain model.generate()


class BackendError(LlmrnnError):
    """An inference engine failed in a way the run cannot continue from (endpoint down, bad reply)."""


class Backend(Protocol):
    calls: int

    def generate(
        self,
        conversations: Sequence[Messages],
        temperature: float,
        top_p: float,
        max_tokens: int,
        seeds: Sequence[int] | None = None,
    ) -> list[str]: ...


def _continues(conversation: Messages) -> bool:
    """True when the conversation ends with an assistant message the model must continue."""
    return bool(conversation) and conversation[-1].get("role") == "assistant"


# ----------------------------------------------------------------------------- transformers
def _token_logprobs(tokenizer, new, logits, k: int, eos) -> list[list[dict]]:
    """Per row of `new` (generated ids) and generated token up to EOS: {token, logprob, top [(token,
    logprob)] * k}, from `logits` (one [rows, vocab] tensor per step, as generate(output_logits=True))."""
    import torch

    # EOS ends a row; rows stopped early (stop_at_json) are filled with padding
    stop = set(eos if isinstance(eos, list) else [eos]) | {tokenizer.eos_token_id, tokenizer.pad_token_id}
    rows: list[list[dict]] = [[] for _ in range(len(new))]
    done = [False] * len(new)
    for step, step_logits in enumerate(logits):
        lp = torch.log_softmax(step_logits.float(), dim=-1)
        top = torch.topk(lp, k=max(1, k), dim=-1)
        for j in range(len(new)):
            tid = int(new[j, step])
            done[j] = done[j] or tid in stop
            if done[j]:
                continue
            rows[j].append({"token": tokenizer.decode([tid]), "logprob": float(lp[j, tid]),
                            "top": [(tokenizer.decode([int(t)]), float(v))
                                    for v, t in zip(top.values[j][:k], top.indices[j][:k])]})
    return rows


class TransformersBackend:
    """In-process HF model; one `generate` call = one batched pass over all conversations."""

    def __init__(self, model_path: str, device: str = "cpu", dtype: str = "float32", batch_size: int = 16,
                 stop_at_json: bool = True, prefill_batch: int = 4, shared_prefix_attention: bool = True,
                 generation: str = "prefix_cache"):
        import torch
        from transformers import AutoModelForCausalLM, AutoTokenizer

        if not os.path.isfile(os.path.join(str(model_path), "config.json")):
            raise InputError(f"{model_path}: not a HF model directory (no config.json)")
        if generation not in GENERATION:
            raise InputError(f"roles: generation {generation!r}: expected one of {', '.join(GENERATION)}")
        self.generation = generation
        self.model_path = str(model_path)
        self.device = device
        self.batch_size = max(1, int(batch_size))
        self.prefill_batch = max(1, int(prefill_batch))
        self.stop_at_json = stop_at_json
        self.tokenizer = AutoTokenizer.from_pretrained(self.model_path)
        self.tokenizer.padding_side = "left"
        if self.tokenizer.pad_token_id is None:
            self.tokenizer.pad_token = self.tokenizer.eos_token
        if not self.tokenizer.chat_template:
            raise InputError(f"{model_path}: the tokenizer has no chat template")
        # auto on the CPU: bfloat16 only where the CPU computes it natively (emulated it is slower than fp32)
        torch_dtype = cpu_dtype(dtype) if device == "cpu" else dtype
        if torch_dtype != "auto":
            torch_dtype = getattr(torch, torch_dtype)
        log.info("%s: %s on %s", self.model_path, torch_dtype, device)
        self.model = AutoModelForCausalLM.from_pretrained(self.model_path, dtype=torch_dtype).to(device).eval()
        # the split prefix/rest attention uses the CPU flash kernel; elsewhere the prefix is copied per row
        self.shared_prefix_attention = (
            generation == "prefix_cache" and device == "cpu" and shared_prefix_attention
            and prefix_engine.use_shared_prefix_attention(self.model)
        )
        gen = self.model.generation_config
        eos = gen.eos_token_id if gen.eos_token_id is not None else self.tokenizer.eos_token_id
        self.eos_token_id = eos
        self.calls = 0
        self.sequences = 0
        self.prefill_tokens = 0  # prompt tokens run through the model before decoding (shared prefixes once)
        self._signatures: list[str | None] | None = None

    @property
    def signatures(self) -> list[str | None]:
        if self._signatures is None:
            self._signatures = prefix_engine.token_signatures(self.tokenizer)
        return self._signatures

    def render(self, conversations: Sequence[Messages]) -> list[str]:
        """Chat template; a final assistant message is continued (a response prefix), not closed."""
        return [
            self.tokenizer.apply_chat_template(
                list(c), tokenize=False, add_generation_prompt=not _continues(c), continue_final_message=_continues(c)
            )
            for c in conversations
        ]

    def prompt_lengths(self, conversations: Sequence[Messages]) -> list[int]:
        texts = self.render(conversations)
        return [len(ids) for ids in self.tokenizer(texts, add_special_tokens=False)["input_ids"]]

    def _prefill(self, rows: Sequence[Sequence[int]], room: int = 0) -> dict:
        """The inputs `model.generate` starts from for one micro-batch: prefix_engine.prefill's cache, or
        (generation: generate) the plain left-padded batch, which generate prefills itself."""
        if self.generation == "generate":
            self.prefill_tokens += sum(len(r) for r in rows)
            enc = self.tokenizer.pad({"input_ids": [list(r) for r in rows]}, return_tensors="pt")
            return {k: v.to(self.device) for k, v in enc.items()}
        enc, computed = prefix_engine.prefill(
            self.model, rows, pad_id=int(self.tokenizer.pad_token_id), device=self.device, room=room,
            prefill_batch=self.prefill_batch, cascade_attention=self.shared_prefix_attention,
        )
        self.prefill_tokens += computed
        return enc

    def generate(
        self,
        conversations: Sequence[Messages],
        temperature: float,
        top_p: float,
        max_tokens: int,
        seeds: Sequence[int] | None = None,
    ) -> list[str]:
        return [text for text, _ in self.generate_scored(conversations, temperature, top_p, max_tokens, seeds)]

    def generate_scored(self, conversations: Sequence[Messages], temperature: float, top_p: float, max_tokens: int,
                        seeds: Sequence[int] | None = None, top_logprobs: int | None = None
                        ) -> list[tuple[str, list[dict] | None]]:
        """`generate`, plus with `top_logprobs` = k per generated token {token, logprob, top: [(token,
        logprob)] * k} from the model's own distribution at that step (before temperature/top-p, as vLLM
        reports them): what an OpenAI-compatible server returns as logprobs (llmrnn.judge.server)."""
        import torch
        from transformers import GenerationConfig, LogitsProcessorList, StoppingCriteriaList

        self.calls += 1
        self.sequences += len(conversations)
        if not conversations:
            return []
        texts = self.render(conversations)
        rows = self.tokenizer(texts, add_special_tokens=False)["input_ids"]
        lengths = [len(x) for x in rows]
        order = sorted(range(len(texts)), key=lambda i: (lengths[i], i))
        if seeds is None and temperature > 0:
            seeds = [random.getrandbits(62) for _ in texts]
        out: list[tuple[str, list[dict] | None]] = [("", None)] * len(texts)
        scored = top_logprobs is not None
        config = GenerationConfig(
            max_new_tokens=int(max_tokens),
            do_sample=False,
            eos_token_id=self.eos_token_id,
            pad_token_id=self.tokenizer.pad_token_id,
            return_dict_in_generate=scored,
            output_logits=scored,
        )
        for start in range(0, len(order), self.batch_size):
            idx = order[start : start + self.batch_size]
            enc = self._prefill([rows[i] for i in idx], room=int(max_tokens))
            processors = LogitsProcessorList()
            if temperature > 0:
                processors.append(prefix_engine.row_sampler([seeds[i] for i in idx], temperature, top_p))
            stoppers = StoppingCriteriaList()
            if self.stop_at_json:
                prefixes = [conversations[i][-1]["content"] if _continues(conversations[i]) else "" for i in idx]
                stoppers.append(
                    prefix_engine.json_stopper(self.tokenizer, enc["input_ids"].shape[1], prefixes, self.signatures)
                )
            active = prefix_engine.ACTIVE_CACHE.set(enc.get("past_key_values"))
            try:
                with torch.inference_mode():
                    generated = self.model.generate(
                        **enc, generation_config=config, logits_processor=processors, stopping_criteria=stoppers
                    )
            finally:
                prefix_engine.ACTIVE_CACHE.reset(active)
            logits = generated.logits if scored else None
            new = (generated.sequences if scored else generated)[:, enc["input_ids"].shape[1] :]
            entries = _token_logprobs(self.tokenizer, new, logits, top_logprobs, self.eos_token_id) if scored else None
            for j, (i, row) in enumerate(zip(idx, new)):
                out[i] = (self.tokenizer.decode(row, skip_special_tokens=True).strip(), entries[j] if scored else None)
        return out


# ----------------------------------------------------------------------------- vllm
class VLLMBackend:
    """In-process vLLM engine (GPU). vllm is imported here only, so CPU installs never need it.
    With `enable_lora`, `generate(..., lora_path=DIR)` runs the rows through that PEFT adapter on this base
    engine (vLLM's LoRARequest): one engine serves the base and the trained memory model."""

    def __init__(self, model_path: str, dtype: str = "auto", gpu_memory_utilization: float = 0.85,
                 max_model_len: int | None = None, tensor_parallel_size: int = 1, enforce_eager: bool = False,
                 enable_lora: bool = False, max_lora_rank: int = 16):
        try:
            from vllm import LLM
        except ImportError as exc:
            raise NotRetriable(
                f"roles: backend vllm needs the vllm package ({exc}): build the GPU stack with `make gpu-env` "
                "(or --sdm conda/apptainer), or use backend: transformers on CPU"
            ) from None
        kwargs: dict[str, Any] = {
            "model": str(model_path),
            "dtype": dtype,
            "gpu_memory_utilization": gpu_memory_utilization,
            "tensor_parallel_size": tensor_parallel_size,
            "enforce_eager": enforce_eager,
            "seed": 0,
        }
        if max_model_len:
            kwargs["max_model_len"] = max_model_len
        if enable_lora:
            kwargs.update(enable_lora=True, max_lora_rank=int(max_lora_rank), max_loras=1)
        self.llm = LLM(**kwargs)
        self.model_path = str(model_path)
        self.calls = 0
        self.sequences = 0
        self._lora_ids: dict[str, int] = {}

    def prompt_lengths(self, conversations: Sequence[Messages]) -> list[int]:
        """Tokens of each chat prompt as LLM.chat renders it (the engine's own tokenizer and chat template)."""
        tok = self.llm.get_tokenizer()
        return [chat_tokens(tok, c) for c in conversations]

    def _lora_request(self, lora_path: str | None):
        if lora_path is None:
            return None
        from vllm.lora.request import LoRARequest

        lora_id = self._lora_ids.setdefault(str(lora_path), len(self._lora_ids) + 1)
        return LoRARequest(f"adapter{lora_id}", lora_id, str(lora_path))

    def generate(self, conversations, temperature, top_p, max_tokens, seeds=None, lora_path=None) -> list[str]:
        from vllm import SamplingParams

        self.calls += 1
        self.sequences += len(conversations)
        if not conversations:
            return []
        seeds = list(seeds) if seeds is not None else [None] * len(conversations)
        params = [
            SamplingParams(temperature=temperature, top_p=top_p if temperature > 0 else 1.0,
                           max_tokens=int(max_tokens), seed=s)
            for s in seeds
        ]
        cont = _continues(conversations[0])
        outputs = self.llm.chat([list(c) for c in conversations], params, use_tqdm=False,
                                add_generation_prompt=not cont, continue_final_message=cont,
                                lora_request=self._lora_request(lora_path))
        return [o.outputs[0].text.strip() if o.outputs else "" for o in outputs]


class LoRAView:
    """A role served by a PEFT adapter on a shared vLLM base engine (VLLMBackend with enable_lora)."""

    def __init__(self, engine: VLLMBackend, lora_path: str):
        self.engine = engine
        self.lora_path = str(lora_path)
        self.model_path = self.lora_path
        self.calls = 0
        self.sequences = 0

    def prompt_lengths(self, conversations: Sequence[Messages]) -> list[int]:
        """The base engine's count (an adapter keeps its base's tokenizer): full_history's cap needs it."""
        return self.engine.prompt_lengths(conversations)

    def generate(self, conversations, temperature, top_p, max_tokens, seeds=None) -> list[str]:
        self.calls += 1
        self.sequences += len(conversations)
        return self.engine.generate(conversations, temperature, top_p, max_tokens, seeds, lora_path=self.lora_path)


# ----------------------------------------------------------------------------- openai-compatible HTTP
def _no_choices(payload) -> str | None:
    """An answer without choices is no answer (retried, then BackendError), not an empty text."""
    choices = payload.get("choices") if isinstance(payload, dict) else None
    if not isinstance(choices, list) or not choices or not isinstance(choices[0], dict):
        return "the answer has no choices"
    return None


def external_host(url: str | None) -> str | None:
    """The host of `url` when requests to it leave this machine and the site's private network (a hosted
    API: a third party), else None. Local: localhost, loopback/private/link-local IP literals, and
    single-label names (cluster-internal hosts such as `gpu-node-12`); any dotted name counts as external."""
    host = (urlsplit(str(url or "")).hostname or "").rstrip(".").lower()
    if not host or host == "localhost" or host.endswith(".localhost"):
        return None
    try:
        ip = ipaddress.ip_address(host)
    except ValueError:
        return host if "." in host else None
    return None if (ip.is_loopback or ip.is_private or ip.is_link_local) else host


def external_problem(url: str | None, allowed: bool, where: str, opt_in: str) -> str | None:
    """Why sending patient text to `url` is refused (None when the host is local or the config opted in)."""
    host = external_host(url)
    if host is None or allowed:
        return None
    return (f"{where}: {host} is outside this site: it would receive patient text; set {opt_in}: true to allow "
            "it (check your data-use agreement), or use a local endpoint")


class OpenAIBackend:
    """Any OpenAI-compatible endpoint: POST {url}/chat/completions, `concurrency` requests in flight.
    A host outside the site (external_host) receives patient text: refused unless `allow_external`."""

    def __init__(self, url: str, model: str, api_key_env: str | None = None, concurrency: int = 8,
                 timeout_s: float = 120.0, max_retries: int = 4, api_key: str | None = None,
                 allow_external: bool = False, opt_in: str = "roles.<role>.allow_external",
                 stall_s: float | None = 120.0, stall_key: str = "roles.<role>.stall_s"):
        if not url:
            raise InputError("roles: backend openai needs `url` (the endpoint's base URL, e.g. http://host:port/v1)")
        if not model:
            raise InputError("roles: backend openai needs `model` (the served model name)")
        if problem := external_problem(url, allow_external, "openai backend", opt_in):
            raise InputError(problem)
        if api_key is None and api_key_env:
            if env_name_problem(api_key_env):  # a key typed in place of the name: never echo it
                raise InputError(f"roles: api_key_env {env_name_problem(api_key_env)}")
            api_key = os.environ.get(api_key_env)
            if not api_key:
                raise InputError(f"roles: api_key_env {api_key_env}: environment variable is not set")
        self.url = url.rstrip("/")
        self.model = model
        self.headers = {"Authorization": f"Bearer {api_key}"} if api_key else {}
        self.concurrency = max(1, int(concurrency))
        self.timeout_s = float(timeout_s)
        self.max_retries = int(max_retries)
        self.stall_s = float(stall_s) if stall_s else None
        self.stall_key = stall_key
        self._live = None  # the last batch's watchdog
        self.calls = 0
        self.sequences = 0

    def _one(self, http, body: dict) -> str:
        policy = RetryPolicy(retries=self.max_retries, backoff_s=1.0, backoff_max_s=30.0)
        try:
            data, _, _ = policy.post_json(http, f"{self.url}/chat/completions", body, headers=self.headers,
                                          check=_no_choices, sleep=http.live.aborted.wait)
        except (RequestRejected, RetriesExhausted) as exc:
            raise BackendError(f"openai backend {self.url} (model {self.model}): request {exc}") from None
        except JudgeAborted:
            raise BackendError(f"{http.live.reason or f'openai backend {self.url}: request abandoned'}; "
                               f"the other requests in flight were cut") from None
        return (data["choices"][0].get("message") or {}).get("content") or ""

    def generate(self, conversations, temperature, top_p, max_tokens, seeds=None) -> list[str]:
        import httpx


        self.calls += 1
        self.sequences += len(conversations)
        if not conversations:
            return []
        seeds = list(seeds) if seeds is not None else [None] * len(conversations)
        bodies = []
        for conv, seed in zip(conversations, seeds):
            body = {"model": self.model, "messages": list(conv), "temperature": temperature,
                    "top_p": top_p, "max_tokens": int(max_tokens)}
            if seed is not None:
                body["seed"] = int(seed) % (2**31)
            if _continues(conv):  # vLLM's extension; servers without it answer afresh after the prefix
                body.update(add_generation_prompt=False, continue_final_message=True)
            bodies.append(body)
        # the judge client's bounds: a whole-request deadline (a trickling server is cut), a cap on the answer,
        # and the stall watchdog (a server that stops answering fails every request after stall_s)
        live = LiveCalls(self.stall_s, first_s=self.timeout_s, what=f"openai backend {self.url} (model {self.model})",
                     setting=self.stall_key).carry(self._live)  # the server's pace, learnt over earlier batches
        self._live = live
        with httpx.Client(timeout=self.timeout_s, headers={"Accept-Encoding": "identity"},
                          limits=httpx.Limits(max_connections=self.concurrency,
                                              max_keepalive_connections=0)) as client, \
                ThreadPoolExecutor(self.concurrency) as pool:
            http = BoundedHTTP(client, self.timeout_s, live=live)
            try:
                futures = [pool.submit(self._one, http, b) for b in bodies]
                wait(futures, return_when=FIRST_EXCEPTION)
                failures = [f.exception() for f in futures if f.done() and not f.cancelled() and f.exception()]
                if failures:  # one failed: cut the others now instead of waiting on their deadlines
                    live.abort()
                    pool.shutdown(wait=False, cancel_futures=True)
                    raise next((e for e in failures if "abandoned" not in str(e)), failures[0])
                return [f.result() for f in futures]
            finally:
                live.close()


# ----------------------------------------------------------------------------- factory
_POOL: dict[tuple, Any] = {}


def role_settings(role_cfg: dict) -> dict:
    """A role's config over the Role model's defaults (llmrnn.settings; what a workflow run gets from the
    schema), so a library or CLI caller that names fewer keys gets the same engine. Keys of the engine
    plan (enable_lora, lora_adapter, ...) pass through."""
    return {**defaults(Role), **role_cfg}


def engine_key(role_cfg: dict, model_path: str | None) -> tuple:
    """What identifies one loaded engine: roles with the same key share it."""
    role_cfg = role_settings(role_cfg)
    backend = role_cfg["backend"]
    if backend == "transformers":
        return (backend, str(model_path), role_cfg["device"], role_cfg["dtype"],
                int(role_cfg["batch_size"]), bool(role_cfg["stop_at_json"]),
                int(role_cfg["prefill_batch"]), role_cfg["generation"])
    if backend == "vllm":
        return (backend, str(model_path), role_cfg["dtype"],
                float(role_cfg["gpu_memory_utilization"]), role_cfg.get("max_model_len"),
                int(role_cfg["tensor_parallel_size"]), bool(role_cfg["enforce_eager"]),
                bool(role_cfg.get("enable_lora", False)), int(role_cfg.get("max_lora_rank", 16)))
    if backend == "openai":
        return (backend, role_cfg.get("url"), str(model_path or role_cfg.get("model")),
                role_cfg.get("api_key_env"), int(role_cfg["concurrency"]),
                bool(role_cfg["allow_external"]), float(role_cfg["timeout_s"]), int(role_cfg["max_retries"]),
                float(role_cfg["stall_s"]))
    raise InputError(f"roles: backend {backend!r}: expected one of {', '.join(BACKENDS)}")


def make_backend(role_cfg: dict, model_path: str | os.PathLike | None, cache: bool = True):
    """The engine a role's config asks for, loaded once per engine_key (cache=False: a fresh one)."""
    model_path = None if model_path is None else str(model_path)
    if role_cfg.get("lora_adapter"):  # the role's model is an adapter on the shared base engine (plan_engines)
        if role_cfg.get("backend") != "vllm":
            raise InputError("roles: lora_adapter is served by the vllm backend only")
        base = {k: v for k, v in role_cfg.items() if k != "lora_adapter"}
        return LoRAView(make_backend({**base, "enable_lora": True}, model_path, cache), role_cfg["lora_adapter"])
    role_cfg = role_settings(role_cfg)
    key = engine_key(role_cfg, model_path)
    if cache and key in _POOL:
        return _POOL[key]
    backend = key[0]
    t0 = time.time()
    if backend == "transformers":
        engine = TransformersBackend(model_path, device=role_cfg["device"],
                                     dtype=role_cfg["dtype"],
                                     batch_size=int(role_cfg["batch_size"]),
                                     stop_at_json=bool(role_cfg["stop_at_json"]),
                                     prefill_batch=int(role_cfg["prefill_batch"]),
                                     generation=role_cfg["generation"])
    elif backend == "vllm":
        engine = VLLMBackend(model_path, dtype=role_cfg["dtype"],
                             gpu_memory_utilization=float(role_cfg["gpu_memory_utilization"]),
                             max_model_len=role_cfg.get("max_model_len"),
                             tensor_parallel_size=int(role_cfg["tensor_parallel_size"]),
                             enforce_eager=bool(role_cfg["enforce_eager"]),
                             enable_lora=bool(role_cfg.get("enable_lora", False)),
                             max_lora_rank=int(role_cfg.get("max_lora_rank", 16)))
    else:
        engine = OpenAIBackend(url=role_cfg.get("url"), model=model_path or role_cfg.get("model"),
                               api_key_env=role_cfg.get("api_key_env"),
                               allow_external=bool(role_cfg["allow_external"]),
                               opt_in=role_cfg.get("opt_in_key", "roles.<role>.allow_external"),
                               concurrency=int(role_cfg["concurrency"]),
                               timeout_s=float(role_cfg["timeout_s"]),
                               max_retries=int(role_cfg["max_retries"]),
                               stall_s=float(role_cfg["stall_s"]),
                               stall_key=role_cfg.get("stall_key", "roles.<role>.stall_s"))
    log.info("%s engine for %s ready in %.1f s", backend, model_path, time.time() - t0)
    if cache:
        _POOL[key] = engine
    return engine


def clear_cache() -> None:
    _POOL.clear()
