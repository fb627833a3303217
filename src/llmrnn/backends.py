"""LLM inference behind one small interface, three engines chosen per model role by config.

    backend = make_backend(role_cfg, model_path)
    texts = backend.generate(list_of_chat_message_lists, temperature, top_p, max_tokens, seeds=None)

`generate` is ONE batched call: the whole list goes to the engine at once (the forward pass sends all
patients of a visit step in one call per role). Engines:
  transformers  in-process HF model (CPU default; "cuda" when configured); left padding, batched
                `generate` in micro-batches of `batch_size` sequences sorted by length; with
                `stop_at_json` (default) a row stops once its answer closes its JSON object, so the
                rambling small models add after the JSON costs no decode steps;
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

import inspect
import logging
import os
import random
import re
import time
from collections.abc import Sequence
from contextvars import ContextVar
from typing import Any, Protocol

from llmrnn.errors import InputError, LlmrnnError
from llmrnn.jsonparse import JsonScanner

log = logging.getLogger(__name__)

Messages = list[dict[str, str]]
BACKENDS = ("transformers", "vllm", "openai")
DTYPES = ("float32", "bfloat16", "float16", "auto")


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


def json_closed(text: str) -> bool:
    """True once `text` holds a complete top-level {...} object (braces in strings ignored)."""
    return JsonScanner().feed(text)


def _json_signature(text: str) -> str:
    """What json_closed needs of a piece of text: its structural characters ({, }, ", \\), every run of
    other characters shortened to one "x" (it only matters as the character a backslash escapes)."""
    return re.sub(r'[^{}"\\]+', "x", text)


def token_signatures(tokenizer) -> list[str | None]:
    """Per vocabulary id: _json_signature of its text ("" for special tokens, which decoding skips), or None
    when the token alone decodes to nothing. A token holding part of a multi-byte character decodes alone to
    U+FFFD where the whole text has that character: both are non-structural, and structural characters are
    single ASCII bytes, never part of a multi-byte character, so the signatures agree with the whole text's."""
    size = max(len(tokenizer), max(tokenizer.get_vocab().values(), default=0) + 1)
    ids = [[i] for i in range(size)]
    texts = tokenizer.batch_decode(ids, skip_special_tokens=True)
    raw = tokenizer.batch_decode(ids, skip_special_tokens=False)
    sigs: list[str | None] = []
    for text, full in zip(texts, raw):
        if not text and full:
            sigs.append("")  # skipped when decoding
        elif not text:
            sigs.append(None)
        else:
            sigs.append(_json_signature(text))
    return sigs


def _json_stopper(tokenizer, prompt_len: int, prefixes: Sequence[str], signatures: Sequence[str | None]):
    """Stops a row as soon as its answer (response prefix + new tokens) closes its JSON object.

    Incremental: each step scans only the new token's signature (token_signatures) instead of decoding
    every row's whole answer. A row whose token has no fixed signature, or whose incremental verdict the
    full decode (checked once, when it first says closed) does not confirm, is decoded in full every
    step from then on, as json_closed on the decoded text always did: the stopping decision is the same.
    """
    import torch
    from transformers import StoppingCriteria

    class JsonDone(StoppingCriteria):
        def __init__(self) -> None:
            self.scanners = []
            for prefix in prefixes:
                sc = JsonScanner()
                sc.feed(prefix)
                self.scanners.append(sc)
            self.exact = [False] * len(prefixes)
            self.done = [False] * len(prefixes)
            self.seen = prompt_len

        def _exact(self, i: int, row) -> bool:
            return json_closed(prefixes[i] + tokenizer.decode(row[prompt_len:], skip_special_tokens=True))

        def __call__(self, input_ids, scores, **kwargs):
            new = input_ids[:, self.seen :].tolist()
            self.seen = input_ids.shape[1]
            for i, toks in enumerate(new):
                if self.done[i]:
                    continue
                if not self.exact[i]:
                    sig = [signatures[t] if 0 <= t < len(signatures) else None for t in toks]
                    if any(s is None for s in sig):
                        self.exact[i] = True
                    elif self.scanners[i].feed("".join(sig)):
                        if self._exact(i, input_ids[i]):
                            self.done[i] = True
                        else:
                            self.exact[i] = True
                        continue
                if self.exact[i]:
                    self.done[i] = self._exact(i, input_ids[i])
            return torch.tensor(self.done, dtype=torch.bool, device=input_ids.device)

    return JsonDone()


# ----------------------------------------------------------------------------- transformers
_ACTIVE_CACHE: ContextVar[Any] = ContextVar("llmrnn_shared_prefix_cache", default=None)
SHARED_PREFIX_ATTENTION = "llmrnn_shared_prefix"


def _preallocated_cache(data: Sequence[tuple], capacity: int, prefix: Sequence[tuple] | None = None):
    """A DynamicCache whose layers write new keys/values into buffers sized for the whole generation.

    The stock DynamicLayer concatenates the whole cache every decode step (a full copy of batch x heads x
    length x dim per layer per token); here a step copies only the new token. Layers are views of the
    buffers, so everything that reads `keys`/`values` (lengths, crop, batch selection) sees the same
    tensors a DynamicLayer would hold.
    With `prefix` (per layer (keys, values) of shape [1, heads, P, dim]): every row's first P positions
    are that one prefix, stored ONCE; `data` holds the positions after it. Lengths and mask sizes count
    the prefix; `_shared_prefix_attention` reads it once per step for the whole batch.
    """
    import torch
    from transformers import DynamicCache
    from transformers.cache_utils import DynamicLayer

    # transformers 4.x (the GPU stack's 4.57) initialises a layer from the keys alone, 5.x from both
    init_args = len(inspect.signature(DynamicLayer.lazy_initialization).parameters) - 1

    class PreallocatedLayer(DynamicLayer):
        def __init__(self, keys: torch.Tensor, values: torch.Tensor, shared: tuple | None) -> None:
            super().__init__()
            self.lazy_initialization(*(keys, values)[:init_args])
            self.prefix = shared
            self.prefix_length = 0 if shared is None else shared[0].shape[-2]
            self._kbuf = self._vbuf = None
            self._store(keys, values, max(capacity, keys.shape[-2]))

        def _store(self, keys: torch.Tensor, values: torch.Tensor, size: int) -> None:
            n = keys.shape[-2]
            self._kbuf = keys.new_empty((*keys.shape[:2], size, keys.shape[-1]))
            self._vbuf = values.new_empty((*values.shape[:2], size, values.shape[-1]))
            self._kbuf[:, :, :n] = keys
            self._vbuf[:, :, :n] = values
            self.keys, self.values = self._kbuf[:, :, :n], self._vbuf[:, :, :n]

        def update(self, key_states, value_states, *args, **kwargs):
            n, new = self.keys.shape[-2], key_states.shape[-2]
            if (self.keys.shape[0] != self._kbuf.shape[0] or self.keys.data_ptr() != self._kbuf.data_ptr()
                    or n + new > self._kbuf.shape[-2]):  # batch reselected, or out of room: fresh buffers
                self._store(self.keys, self.values, max(2 * (n + new), capacity))
            self._kbuf[:, :, n : n + new] = key_states
            self._vbuf[:, :, n : n + new] = value_states
            self.keys, self.values = self._kbuf[:, :, : n + new], self._vbuf[:, :, : n + new]
            return self.keys, self.values

        def get_seq_length(self) -> int:
            return self.prefix_length + self.keys.shape[-2]

        def get_mask_sizes(self, query_length) -> tuple[int, int]:
            # transformers 5.x passes the query length, 4.x the query's cache_position tensor
            queries = query_length.shape[0] if hasattr(query_length, "shape") else int(query_length)
            return self.get_seq_length() + queries, 0

    prefix = prefix or [None] * len(data)
    cache = DynamicCache()
    cache.layers = [PreallocatedLayer(k, v, shared) for (k, v), shared in zip(data, prefix)]
    return cache


def _shared_prefix_attention(module, query, key, value, attention_mask, dropout=0.0, scaling=None, **kwargs):
    """SDPA for a cache whose rows share one stored prefix (_preallocated_cache with `prefix`).

    Decode step (one query token per row): attention over the prefix runs as ONE flash-attention call
    with every row's query against the single prefix copy, attention over each row's own positions as a
    second call, and the two are merged with their log-sum-exps (the split-softmax identity of
    FlashAttention / cascade inference). The prefix is read once per step instead of once per row; on a
    CPU the batch's whole cache no longer streams from memory every step. Anything else (no shared
    prefix, several query tokens) is plain SDPA.
    """
    import torch
    from transformers.integrations.sdpa_attention import sdpa_attention_forward

    cache = _ACTIVE_CACHE.get()
    layer = cache.layers[module.layer_idx] if cache is not None else None
    prefix = getattr(layer, "prefix", None)
    if prefix is None:
        return sdpa_attention_forward(module, query, key, value, attention_mask, dropout=dropout, scaling=scaling,
                                      **kwargs)
    prefix_keys, prefix_values = prefix
    batch, heads, q_len, dim = query.shape
    if q_len != 1:  # not on generate's path after _prefill; correct, without the saving
        full_k = torch.cat([prefix_keys.expand(batch, -1, -1, -1), key], dim=2)
        full_v = torch.cat([prefix_values.expand(batch, -1, -1, -1), value], dim=2)
        return sdpa_attention_forward(module, query, full_k, full_v, attention_mask, dropout=dropout,
                                      scaling=scaling, **kwargs)
    kv_heads, shared = key.shape[1], prefix_keys.shape[-2]
    group = heads // kv_heads  # query head h reads key/value head h // group
    scale = scaling if scaling is not None else dim**-0.5
    flash = torch.ops.aten._scaled_dot_product_flash_attention_for_cpu
    q = query.reshape(batch, kv_heads, group, dim)
    out_p, lse_p = flash(q.transpose(0, 1).reshape(1, kv_heads, batch * group, dim), prefix_keys, prefix_values,
                         scale=scale)[:2]
    mask = None
    if attention_mask is not None:
        mask = attention_mask[..., shared:]
        if mask.dtype == torch.bool:
            mask = torch.zeros(mask.shape, dtype=query.dtype, device=query.device).masked_fill(~mask, float("-inf"))
    out_r, lse_r = flash(q, key, value, attn_mask=mask, scale=scale)[:2]
    out_p = out_p.reshape(kv_heads, batch, group, dim).transpose(0, 1)
    lse_p = lse_p.reshape(kv_heads, batch, group).transpose(0, 1)
    top = torch.maximum(lse_p, lse_r)
    w_p, w_r = torch.exp(lse_p - top).unsqueeze(-1), torch.exp(lse_r - top).unsqueeze(-1)
    out = (out_p * w_p + out_r * w_r) / (w_p + w_r)
    return out.to(query.dtype).reshape(batch, heads, 1, dim).transpose(1, 2).contiguous(), None


def _use_shared_prefix_attention(model) -> bool:
    """Switch a CPU model from SDPA to _shared_prefix_attention (plain SDPA whenever no prefix is shared)."""
    from transformers import AttentionInterface
    from transformers.masking_utils import AttentionMaskInterface, sdpa_mask

    if getattr(model.config, "_attn_implementation", None) != "sdpa":
        return False
    AttentionInterface.register(SHARED_PREFIX_ATTENTION, _shared_prefix_attention)
    AttentionMaskInterface.register(SHARED_PREFIX_ATTENTION, sdpa_mask)
    model.set_attn_implementation(SHARED_PREFIX_ATTENTION)
    return True


def _row_sampler(seeds: Sequence[int], temperature: float, top_p: float, candidates: int = 128):
    """A logits processor that samples each row with its own generator and forces that token.

    Used with greedy decoding (do_sample=False): the processed scores are -inf except at the sampled
    token, so argmax picks it. Row i's draws depend only on seeds[i] and its own logits.
    The draw is torch.multinomial(probs[i], 1, generator=g_i) computed the way torch does it for one
    sample (argmax(p / q), q ~ Exp(1) drawn from g_i, aten Distributions.cpp), so the per-row work is
    one exponential_ on a row of a preallocated buffer and the rest is vectorised over the batch;
    the tokens are the ones torch.multinomial with the same generators gives.
    Top-p without sorting the vocabulary: a row whose `candidates` most likely tokens already hold more
    than top_p of the mass has its nucleus among them (the nucleus is a prefix of the sorted order), so
    it draws noise for those candidates only and skips the full sort (a 49k-entry vocabulary costs
    ~3 ms a row to sort and ~0.8 ms a row to fill with noise on CPU). argmax(p / q) over a set holding
    the nucleus is still an exact draw from the nucleus distribution; only rows that spread their mass
    wider (random test models) take the full path, token for token the torch.multinomial draw.
    """
    import torch
    from transformers import LogitsProcessor

    def nucleus_draw(probs, noise):
        drop = (torch.cumsum(probs, dim=-1) - probs) > top_p  # probs sorted descending
        return (probs.masked_fill(drop, 0.0) / noise).argmax(dim=-1, keepdim=True)

    class RowSampler(LogitsProcessor):
        def __init__(self) -> None:
            self.generators = [torch.Generator().manual_seed(int(s) & 0x7FFF_FFFF_FFFF_FFFF) for s in seeds]
            self.buffers: dict[int, torch.Tensor] = {}

        def _noise(self, rows: Sequence[int], width: int):
            """Exp(1) noise, `width` draws for each of `rows`, each row from its own generator."""
            buf = self.buffers.get(width)
            if buf is None or buf.shape[0] < len(self.generators):
                buf = self.buffers[width] = torch.empty((len(self.generators), width))
            out = buf[: len(rows)]
            for j, i in enumerate(rows):
                out[j].exponential_(1, generator=self.generators[i])
            return out

        def __call__(self, input_ids, scores):
            logits = scores.float() / max(temperature, 1e-5)
            probs = torch.softmax(logits, dim=-1)
            if top_p >= 1.0:
                tokens = torch.div(probs, self._noise(range(len(probs)), probs.shape[-1])).argmax(dim=-1, keepdim=True)
            else:
                tokens = torch.empty((probs.shape[0], 1), dtype=torch.long, device=probs.device)
                top_p_, top_i = probs.topk(min(candidates, probs.shape[-1]), dim=-1)
                covered = top_p_.sum(dim=-1) > top_p
                rows = covered.nonzero().squeeze(1).tolist()
                if rows:
                    pick = nucleus_draw(top_p_[rows], self._noise(rows, top_p_.shape[-1]))
                    tokens[rows] = top_i[rows].gather(-1, pick)
                rows = (~covered).nonzero().squeeze(1).tolist()
                if rows:
                    sorted_p, order = torch.sort(probs[rows], dim=-1, descending=True)
                    pick = nucleus_draw(sorted_p, self._noise(rows, probs.shape[-1]).gather(-1, order))
                    tokens[rows] = order.gather(-1, pick)
            return torch.full_like(scores, float("-inf")).scatter_(-1, tokens, 0.0)

    return RowSampler()


class TransformersBackend:
    """In-process HF model; one `generate` call = one batched pass over all conversations."""

    def __init__(self, model_path: str, device: str = "cpu", dtype: str = "float32", batch_size: int = 16,
                 stop_at_json: bool = True, prefill_batch: int = 4, shared_prefix_attention: bool = True):
        import torch
        from transformers import AutoModelForCausalLM, AutoTokenizer

        if not os.path.isfile(os.path.join(str(model_path), "config.json")):
            raise InputError(f"{model_path}: not a HF model directory (no config.json)")
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
        torch_dtype = torch.float32 if dtype == "auto" and device == "cpu" else dtype
        if isinstance(torch_dtype, str) and torch_dtype != "auto":
            torch_dtype = getattr(torch, torch_dtype)
        self.model = AutoModelForCausalLM.from_pretrained(self.model_path, dtype=torch_dtype).to(device).eval()
        # the split prefix/rest attention uses the CPU flash kernel; elsewhere the prefix is copied per row
        self.shared_prefix_attention = device == "cpu" and shared_prefix_attention and _use_shared_prefix_attention(
            self.model
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
            self._signatures = token_signatures(self.tokenizer)
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
        """Left-padded inputs for one micro-batch plus a KV cache of every prompt token but the last.

        Two savings over letting `generate` prefill the padded batch: (1) the token prefix common to all
        rows (system prompt + role instructions, the same for every patient) is computed ONCE and its
        keys/values shared by every row; (2) the rest is prefilled `prefill_batch` rows at a time with right
        padding, where the whole padded batch would need a batch x length x length attention mask that
        costs more than the attention itself. `generate` then starts from the cache: it feeds each row's
        last prompt token and decodes. Position ids follow each row's own tokens (HF derives them from the
        attention mask), so a row's keys/values are those of the row prefilled alone. `room`: the tokens
        the cache must still take (max_new_tokens), preallocated (_preallocated_cache).
        """
        import torch
        from transformers import DynamicCache

        width = max(len(r) for r in rows)
        shortest = min(len(r) for r in rows)
        shared = 0
        if len(rows) > 1:
            first = rows[0]
            while shared < shortest - 1 and all(r[shared] == first[shared] for r in rows):
                shared += 1
        # left padding; with a stored shared prefix the padding goes between prefix and rest: [prefix][pad][rest]
        cascade = bool(shared) and self.shared_prefix_attention
        head = shared if cascade else 0
        pad_id = int(self.tokenizer.pad_token_id)
        input_ids = torch.tensor(
            [[*r[:head], *[pad_id] * (width - len(r)), *r[head:]] for r in rows], dtype=torch.long, device=self.device
        )
        attention_mask = torch.tensor(
            [[1] * head + [0] * (width - len(r)) + [1] * (len(r) - head) for r in rows], dtype=torch.long,
            device=self.device,
        )
        self.prefill_tokens += shared + sum(len(r) - 1 - shared for r in rows)
        if shortest < 2:  # nothing to cache for a one-token prompt: generate prefills as usual
            return {"input_ids": input_ids, "attention_mask": attention_mask}

        prefix_kv = None
        with torch.inference_mode():
            if shared:
                ids = torch.tensor([rows[0][:shared]], dtype=torch.long, device=self.device)
                out = self.model(input_ids=ids, use_cache=True, logits_to_keep=1)
                prefix_kv = [(k, v) for k, v, *_ in out.past_key_values]
            per_row: list[list[tuple]] = [[] for _ in rows]  # row -> [(k, v) per layer], shape [heads, len, dim]
            for start in range(0, len(rows), self.prefill_batch):
                chunk = list(range(start, min(start + self.prefill_batch, len(rows))))
                rests = [rows[i][shared:-1] for i in chunk]
                span = max(len(x) for x in rests)
                if span == 0:  # only when a shared prefix exists (shortest >= 2)
                    for i in chunk:
                        per_row[i] = [(k[0], v[0]) for k, v in prefix_kv]
                    continue
                ids = torch.full((len(chunk), span), int(self.tokenizer.pad_token_id), dtype=torch.long)
                mask = torch.zeros((len(chunk), shared + span), dtype=torch.long)
                mask[:, :shared] = 1
                for j, rest in enumerate(rests):
                    ids[j, : len(rest)] = torch.tensor(rest, dtype=torch.long)
                    mask[j, shared : shared + len(rest)] = 1
                cache = None
                if prefix_kv is not None:
                    cache = DynamicCache(
                        ddp_cache_data=[(k.expand(len(chunk), -1, -1, -1), v.expand(len(chunk), -1, -1, -1))
                                        for k, v in prefix_kv]
                    )
                positions = torch.arange(shared, shared + span, device=self.device).expand(len(chunk), -1)
                out = self.model(input_ids=ids.to(self.device), attention_mask=mask.to(self.device),
                                 position_ids=positions, past_key_values=cache, use_cache=True, logits_to_keep=1)
                for j, i in enumerate(chunk):
                    keep = shared + len(rests[j])  # right padding: the row's own tokens come first
                    per_row[i] = [(k[j, :, :keep], v[j, :, :keep]) for k, v, *_ in out.past_key_values]
            skip = head  # cached columns held by the stored prefix
            data = []
            for layer in range(len(per_row[0])):
                k0, v0 = per_row[0][layer]
                keys = k0.new_zeros((len(rows), k0.shape[0], width - 1 - skip, k0.shape[2]))
                values = v0.new_zeros((len(rows), v0.shape[0], width - 1 - skip, v0.shape[2]))
                for i, r in enumerate(rows):
                    k, v = per_row[i][layer]
                    keys[i, :, width - len(r) :] = k[:, skip:]
                    values[i, :, width - len(r) :] = v[:, skip:]
                data.append((keys, values))
        cache = _preallocated_cache(data, width - skip + room, prefix=prefix_kv if cascade else None)
        return {"input_ids": input_ids, "attention_mask": attention_mask, "past_key_values": cache}

    def generate(
        self,
        conversations: Sequence[Messages],
        temperature: float,
        top_p: float,
        max_tokens: int,
        seeds: Sequence[int] | None = None,
    ) -> list[str]:
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
        out: list[str] = [""] * len(texts)
        config = GenerationConfig(
            max_new_tokens=int(max_tokens),
            do_sample=False,
            eos_token_id=self.eos_token_id,
            pad_token_id=self.tokenizer.pad_token_id,
        )
        for start in range(0, len(order), self.batch_size):
            idx = order[start : start + self.batch_size]
            enc = self._prefill([rows[i] for i in idx], room=int(max_tokens))
            processors = LogitsProcessorList()
            if temperature > 0:
                processors.append(_row_sampler([seeds[i] for i in idx], temperature, top_p))
            stoppers = StoppingCriteriaList()
            if self.stop_at_json:
                prefixes = [conversations[i][-1]["content"] if _continues(conversations[i]) else "" for i in idx]
                stoppers.append(
                    _json_stopper(self.tokenizer, enc["input_ids"].shape[1], prefixes, self.signatures)
                )
            active = _ACTIVE_CACHE.set(enc.get("past_key_values"))
            try:
                with torch.inference_mode():
                    generated = self.model.generate(
                        **enc, generation_config=config, logits_processor=processors, stopping_criteria=stoppers
                    )
            finally:
                _ACTIVE_CACHE.reset(active)
            new = generated[:, enc["input_ids"].shape[1] :]
            for i, row in zip(idx, new):
                out[i] = self.tokenizer.decode(row, skip_special_tokens=True).strip()
        return out


# ----------------------------------------------------------------------------- vllm
class VLLMBackend:
    """In-process vLLM engine (GPU). vllm is imported here only, so CPU installs never need it."""

    def __init__(self, model_path: str, dtype: str = "auto", gpu_memory_utilization: float = 0.85,
                 max_model_len: int | None = None, tensor_parallel_size: int = 1, enforce_eager: bool = False):
        try:
            from vllm import LLM
        except ImportError as exc:
            raise InputError(
                f"roles: backend vllm needs the vllm package ({exc}); install the gpu extra / envs/vllm.yaml, "
                "or use backend: transformers on CPU"
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
        self.llm = LLM(**kwargs)
        self.model_path = str(model_path)
        self.calls = 0
        self.sequences = 0

    def generate(self, conversations, temperature, top_p, max_tokens, seeds=None) -> list[str]:
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
                                add_generation_prompt=not cont, continue_final_message=cont)
        return [o.outputs[0].text.strip() if o.outputs else "" for o in outputs]


# ----------------------------------------------------------------------------- openai-compatible HTTP
class OpenAIBackend:
    """Any OpenAI-compatible endpoint: POST {url}/chat/completions, `concurrency` requests in flight."""

    def __init__(self, url: str, model: str, api_key_env: str | None = None, concurrency: int = 8,
                 timeout_s: float = 120.0, max_retries: int = 4, api_key: str | None = None):
        if not url:
            raise InputError("roles: backend openai needs `url` (the endpoint's base URL, e.g. http://host:port/v1)")
        if not model:
            raise InputError("roles: backend openai needs `model` (the served model name)")
        if api_key is None and api_key_env:
            from llmrnn.upload import env_name_problem

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
        self.calls = 0
        self.sequences = 0

    def _one(self, client, body: dict) -> str:
        import httpx

        delay, last = 1.0, "no attempt"
        for attempt in range(self.max_retries + 1):
            try:
                resp = client.post(f"{self.url}/chat/completions", json=body, headers=self.headers)
                if resp.status_code == 200:
                    data = resp.json()
                    return ((data.get("choices") or [{}])[0].get("message") or {}).get("content") or ""
                last = f"HTTP {resp.status_code}: {resp.text[:200]}"
                if resp.status_code not in (408, 409, 429) and resp.status_code < 500:
                    break  # a client error does not heal by retrying
            except (httpx.HTTPError, ValueError) as exc:
                last = f"{type(exc).__name__}: {exc}"
            if attempt < self.max_retries:
                time.sleep(delay)
                delay = min(delay * 2, 30.0)
        raise BackendError(f"openai backend {self.url} (model {self.model}): request failed: {last}")

    def generate(self, conversations, temperature, top_p, max_tokens, seeds=None) -> list[str]:
        from concurrent.futures import ThreadPoolExecutor

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
        with httpx.Client(timeout=self.timeout_s) as client, ThreadPoolExecutor(self.concurrency) as pool:
            return list(pool.map(lambda b: self._one(client, b), bodies))


# ----------------------------------------------------------------------------- factory
_POOL: dict[tuple, Any] = {}


def engine_key(role_cfg: dict, model_path: str | None) -> tuple:
    """What identifies one loaded engine: roles with the same key share it."""
    backend = role_cfg.get("backend", "transformers")
    if backend == "transformers":
        return (backend, str(model_path), role_cfg.get("device", "cpu"), role_cfg.get("dtype", "float32"),
                int(role_cfg.get("batch_size", 16)), bool(role_cfg.get("stop_at_json", True)),
                int(role_cfg.get("prefill_batch", 4)))
    if backend == "vllm":
        return (backend, str(model_path), role_cfg.get("dtype", "auto"),
                float(role_cfg.get("gpu_memory_utilization", 0.85)), role_cfg.get("max_model_len"),
                int(role_cfg.get("tensor_parallel_size", 1)), bool(role_cfg.get("enforce_eager", False)))
    if backend == "openai":
        return (backend, role_cfg.get("url"), str(model_path or role_cfg.get("model")),
                role_cfg.get("api_key_env"), int(role_cfg.get("concurrency", 8)))
    raise InputError(f"roles: backend {backend!r}: expected one of {', '.join(BACKENDS)}")


def make_backend(role_cfg: dict, model_path: str | os.PathLike | None, cache: bool = True):
    """The engine a role's config asks for, loaded once per engine_key (cache=False: a fresh one)."""
    model_path = None if model_path is None else str(model_path)
    key = engine_key(role_cfg, model_path)
    if cache and key in _POOL:
        return _POOL[key]
    backend = key[0]
    t0 = time.time()
    if backend == "transformers":
        engine = TransformersBackend(model_path, device=role_cfg.get("device", "cpu"),
                                     dtype=role_cfg.get("dtype", "float32"),
                                     batch_size=int(role_cfg.get("batch_size", 16)),
                                     stop_at_json=bool(role_cfg.get("stop_at_json", True)),
                                     prefill_batch=int(role_cfg.get("prefill_batch", 4)))
    elif backend == "vllm":
        engine = VLLMBackend(model_path, dtype=role_cfg.get("dtype", "auto"),
                             gpu_memory_utilization=float(role_cfg.get("gpu_memory_utilization", 0.85)),
                             max_model_len=role_cfg.get("max_model_len"),
                             tensor_parallel_size=int(role_cfg.get("tensor_parallel_size", 1)),
                             enforce_eager=bool(role_cfg.get("enforce_eager", False)))
    else:
        engine = OpenAIBackend(url=role_cfg.get("url"), model=model_path or role_cfg.get("model"),
                               api_key_env=role_cfg.get("api_key_env"),
                               concurrency=int(role_cfg.get("concurrency", 8)),
                               timeout_s=float(role_cfg.get("timeout_s", 120)),
                               max_retries=int(role_cfg.get("max_retries", 4)))
    log.info("%s engine for %s ready in %.1f s", backend, model_path, time.time() - t0)
    if cache:
        _POOL[key] = engine
    return engine


def clear_cache() -> None:
    _POOL.clear()
