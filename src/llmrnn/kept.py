"""Rows kept across a kill: a forward-pass shard (eval, trajectories) runs its patients in chunks and
appends each finished chunk's rows (and its stats) to `<out>.partial`, flushed and fsynced, so a shard
killed by a time limit, a preemption or a node failure continues after its last whole chunk on the
rerun: at most one chunk's work is redone, no row is lost or written twice.

The file's first line is a fingerprint of everything the rows depend on (config, inputs, code); a file of
another fingerprint is discarded. A torn last line (the kill hit the write) is dropped. Sampling is seeded
per (patient, visit, role) (llmrnn.rnn), so the rows equal those of one uninterrupted pass. The caller
writes the shard's output from the returned rows, then removes the file (`finish`).
"""

from __future__ import annotations

import json
import logging
import os
from collections.abc import Callable, Sequence
from pathlib import Path

from llmrnn import io
from llmrnn.provenance import code_identity

log = logging.getLogger(__name__)

CHUNK_PATIENTS = 64  # patients per forward pass (a visit step batches this many prompts per role: vLLM stays
# busy) and per durable write (a kill redoes at most this many)


def fingerprint(verb: str, *parts) -> str:
    """What a shard's kept rows depend on: `parts` (its config, inputs, patients) and the code identity of
    `llmrnn <verb>` (llmrnn.provenance), as one sha256."""
    return io.sha256_bytes(json.dumps([*parts, code_identity(verb)], sort_keys=True, default=str).encode())


def partial_path(out: str | os.PathLike) -> Path:
    return Path(f"{out}.partial")


def _kept_chunks(partial: Path, fingerprint: str) -> list[dict]:
    if not partial.is_file():
        return []
    lines = io.read_jsonl(partial, skip_bad=True)  # a torn last line (the kill hit the write) is skipped
    header = lines[0] if lines and isinstance(lines[0], dict) else {}
    if header.get("fingerprint") != fingerprint:
        log.warning("%s: written for another config, input or code: starting the shard over", partial)
        partial.unlink()
        return []
    chunks = []
    for i, row in enumerate(lines[1:]):
        if not isinstance(row, dict) or row.get("chunk") != i:
            break
        chunks.append(row)
    return chunks


def _append_durably(path: Path, line: str) -> None:
    with open(path, "a", encoding="utf-8") as fh:
        fh.write(line + "\n")
        fh.flush()
        os.fsync(fh.fileno())


def sum_stats(parts: Sequence[dict]) -> dict:
    """The chunks' stats as one pass's: numbers summed (in nested dicts too), lists concatenated (e.g. the
    backend calls per visit step), anything else the last chunk's."""
    out: dict = {}
    for st in parts:
        for k, v in st.items():
            have = out.get(k)
            if isinstance(v, dict) and isinstance(have, dict):
                out[k] = sum_stats([have, v])
            elif (isinstance(v, list) and isinstance(have, list)) or (_number(v) and _number(have)):
                out[k] = have + v
            else:
                out[k] = v
    return out


def _number(value) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool)


def run_kept(items: Sequence, work: Callable[[list], tuple[list[dict], dict]], out: str | os.PathLike,
             fingerprint: str, label: str, chunk: int | None = None) -> tuple[list[dict], dict]:
    """`work(chunk of items) -> (rows, stats)` over chunks of `items`, kept across a kill (module docstring).
    Returns all rows in order and the chunks' stats summed."""
    chunk = chunk or CHUNK_PATIENTS
    partial = partial_path(out)
    kept = _kept_chunks(partial, fingerprint)
    if not partial.is_file():
        partial.parent.mkdir(parents=True, exist_ok=True)
        _append_durably(partial, json.dumps({"fingerprint": fingerprint}))
    pieces = [list(items[i:i + chunk]) for i in range(0, len(items), chunk)]
    if kept:
        log.info("%s: continuing after %d of %d chunks (%d rows kept from the last attempt)", label, len(kept),
                 len(pieces), sum(len(c["rows"]) for c in kept))
    for i in range(len(kept), len(pieces)):
        rows, stats = work(pieces[i])
        record = {"chunk": i, "rows": rows, "stats": stats}
        _append_durably(partial, json.dumps(record, sort_keys=True, ensure_ascii=False, default=str))
        kept.append(json.loads(json.dumps(record, default=str)))  # as a rerun reads it back
    return [r for c in kept for r in c["rows"]], sum_stats([c["stats"] for c in kept])


def finish(out: str | os.PathLike) -> None:
    """The shard's output is written: its kept rows are no longer needed."""
    partial_path(out).unlink(missing_ok=True)
