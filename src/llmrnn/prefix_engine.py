"""The custom CPU decode engine behind `TransformersBackend` (role setting `generation: prefix_cache`).

It is built on torch/transformers internals, so it lives apart from the small backend interface, and
`generation: generate` switches a role back to plain `model.generate()` over a left-padded batch. Both
settings give the same tokens (tests/test_backends.py compares them); run those tests after upgrading
torch or transformers. Parts:

  prefill                  the token prefix common to a batch's prompts is computed ONCE, the rest in
                           right-padded chunks; `generate` starts from the resulting cache
  preallocated_cache       a DynamicCache whose layers (a DynamicLayer subclass) write each new token into
                           buffers sized for the whole generation instead of concatenating every step
  shared_prefix_attention  registered attention function: decode attends the shared prefix from ONE stored
                           copy (split softmax merged by log-sum-exp; the CPU flash kernel, a private aten op)
  row_sampler              per-row seeded sampling as a LogitsProcessor (a row's tokens do not depend on its
                           batch neighbours; HF's sampler draws every row from one global generator)
  json_stopper             a StoppingCriteria ending a row once its answer closes its JSON object
The sampler and the stopper plug into generate() through its public hooks and serve both settings.
"""

from __future__ import annotations

import inspect
import re
from collections.abc import Sequence
from contextvars import ContextVar
from typing import Any

from llmrnn.jsonparse import JsonScanner


# ----------------------------------------------------------------------------- stopping at a closed JSON object
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


def json_stopper(tokenizer, prompt_len: int, prefixes: Sequence[str], signatures: Sequence[str | None]):
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


# ----------------------------------------------------------------------------- sampling
def row_sampler(seeds: Sequence[int], temperature: float, top_p: float, candidates: int = 128):
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


# ----------------------------------------------------------------------------- shared-prefix cache and attention
ACTIVE_CACHE: ContextVar[Any] = ContextVar("llmrnn_shared_prefix_cache", default=None)
SHARED_PREFIX_ATTENTION = "llmrnn_shared_prefix"


def preallocated_cache(data: Sequence[tuple], capacity: int, prefix: Sequence[tuple] | None = None):
    """A DynamicCache whose layers write new keys/values into buffers sized for the whole generation.

    The stock DynamicLayer concatenates the whole cache every decode step (a full copy of batch x heads x
    length x dim per layer per token); here a step copies only the new token. Layers are views of the
    buffers, so everything that reads `keys`/`values` (lengths, crop, batch selection) sees the same
    tensors a DynamicLayer would hold.
    With `prefix` (per layer (keys, values) of shape [1, heads, P, dim]): every row's first P positions
    are that one prefix, stored ONCE; `data` holds the positions after it. Lengths and mask sizes count
    the prefix; `shared_prefix_attention` reads it once per step for the whole batch.
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


def shared_prefix_attention(module, query, key, value, attention_mask, dropout=0.0, scaling=None, **kwargs):
    """SDPA for a cache whose rows share one stored prefix (preallocated_cache with `prefix`).

    Decode step (one query token per row): attention over the prefix runs as ONE flash-attention call
    with every row's query against the single prefix copy, attention over each row's own positions as a
    second call, and the two are merged with their log-sum-exps (the split-softmax identity of
    FlashAttention / cascade inference). The prefix is read once per step instead of once per row; on a
    CPU the batch's whole cache no longer streams from memory every step. Anything else (no shared
    prefix, several query tokens) is plain SDPA.
    """
    import torch
    from transformers.integrations.sdpa_attention import sdpa_attention_forward

    cache = ACTIVE_CACHE.get()
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


def use_shared_prefix_attention(model) -> bool:
    """Switch a CPU model from SDPA to shared_prefix_attention (plain SDPA whenever no prefix is shared)."""
    from transformers import AttentionInterface
    from transformers.masking_utils import AttentionMaskInterface, sdpa_mask

    if getattr(model.config, "_attn_implementation", None) != "sdpa":
        return False
    AttentionInterface.register(SHARED_PREFIX_ATTENTION, shared_prefix_attention)
    AttentionMaskInterface.register(SHARED_PREFIX_ATTENTION, sdpa_mask)
    model.set_attn_implementation(SHARED_PREFIX_ATTENTION)
    return True


# ----------------------------------------------------------------------------- prefill
def shared_prefix_length(rows: Sequence[Sequence[int]]) -> int:
    """Tokens every row starts with, leaving each row at least its last token (generate feeds it)."""
    if len(rows) < 2:
        return 0
    shortest, first, shared = min(len(r) for r in rows), rows[0], 0
    while shared < shortest - 1 and all(r[shared] == first[shared] for r in rows):
        shared += 1
    return shared


def _prefill_rows(model, rows, shared: int, prefill_batch: int, pad_id: int, device) -> tuple[list, list | None]:
    """Keys/values of every prompt token but the last: the shared prefix once, then the rest of the rows
    `prefill_batch` at a time with right padding. Returns (per row [(k, v) per layer], prefix [(k, v)])."""
    import torch
    from transformers import DynamicCache

    prefix_kv = None
    if shared:
        ids = torch.tensor([rows[0][:shared]], dtype=torch.long, device=device)
        out = model(input_ids=ids, use_cache=True, logits_to_keep=1)
        prefix_kv = [(k, v) for k, v, *_ in out.past_key_values]
    per_row: list[list[tuple]] = [[] for _ in rows]  # row -> [(k, v) per layer], shape [heads, len, dim]
    for start in range(0, len(rows), prefill_batch):
        chunk = list(range(start, min(start + prefill_batch, len(rows))))
        rests = [rows[i][shared:-1] for i in chunk]
        span = max(len(x) for x in rests)
        if span == 0:  # only when a shared prefix exists (shortest >= 2)
            for i in chunk:
                per_row[i] = [(k[0], v[0]) for k, v in prefix_kv]
            continue
        ids = torch.full((len(chunk), span), pad_id, dtype=torch.long)
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
        positions = torch.arange(shared, shared + span, device=device).expand(len(chunk), -1)
        out = model(input_ids=ids.to(device), attention_mask=mask.to(device), position_ids=positions,
                    past_key_values=cache, use_cache=True, logits_to_keep=1)
        for j, i in enumerate(chunk):
            keep = shared + len(rests[j])  # right padding: the row's own tokens come first
            per_row[i] = [(k[j, :, :keep], v[j, :, :keep]) for k, v, *_ in out.past_key_values]
    return per_row, prefix_kv


def _left_padded(per_row: list, rows, width: int, skip: int) -> list[tuple]:
    """Per layer (keys, values) of the whole batch, each row right-aligned (left padding), without the
    first `skip` columns (held by a stored shared prefix)."""
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
    return data


def prefill(model, rows: Sequence[Sequence[int]], *, pad_id: int, device, room: int = 0, prefill_batch: int = 4,
            cascade_attention: bool = False) -> tuple[dict, int]:
    """Left-padded inputs for one micro-batch plus a KV cache of every prompt token but the last, and
    the number of prompt tokens the model ran.

    Two savings over letting `generate` prefill the padded batch: (1) the token prefix common to all
    rows (system prompt + role instructions, the same for every patient) is computed ONCE and its
    keys/values shared by every row; (2) the rest is prefilled `prefill_batch` rows at a time with right
    padding, where the whole padded batch would need a batch x length x length attention mask that
    costs more than the attention itself. `generate` then starts from the cache: it feeds each row's
    last prompt token and decodes. Position ids follow each row's own tokens (HF derives them from the
    attention mask), so a row's keys/values are those of the row prefilled alone. `room`: the tokens
    the cache must still take (max_new_tokens), preallocated (preallocated_cache). With
    `cascade_attention` (the model runs shared_prefix_attention) the prefix is stored once.
    """
    import torch

    width = max(len(r) for r in rows)
    shortest = min(len(r) for r in rows)
    shared = shared_prefix_length(rows)
    # left padding; with a stored shared prefix the padding goes between prefix and rest: [prefix][pad][rest]
    cascade = bool(shared) and cascade_attention
    head = shared if cascade else 0
    input_ids = torch.tensor(
        [[*r[:head], *[pad_id] * (width - len(r)), *r[head:]] for r in rows], dtype=torch.long, device=device
    )
    attention_mask = torch.tensor(
        [[1] * head + [0] * (width - len(r)) + [1] * (len(r) - head) for r in rows], dtype=torch.long, device=device
    )
    computed = shared + sum(len(r) - 1 - shared for r in rows)
    if shortest < 2:  # nothing to cache for a one-token prompt: generate prefills as usual
        return {"input_ids": input_ids, "attention_mask": attention_mask}, computed
    with torch.inference_mode():
        per_row, prefix_kv = _prefill_rows(model, rows, shared, prefill_batch, pad_id, device)
        data = _left_padded(per_row, rows, width, skip=head)
    cache = preallocated_cache(data, width - head + room, prefix=prefix_kv if cascade else None)
    return {"input_ids": input_ids, "attention_mask": attention_mask, "past_key_values": cache}, computed
