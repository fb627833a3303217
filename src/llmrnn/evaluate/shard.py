"""One eval shard: the forward pass of a variant over its patients."""

from __future__ import annotations

from pathlib import Path

from llmrnn.errors import InputError
from llmrnn.evaluate.recall import MEMORY_VARIANTS, REFERENCE, variant_mode


# ----------------------------------------------------------------------------- forward pass
def run_shard(
    patients: list[dict], variant: str, roles_cfg: dict, prompts_file: str, seed: int,
    memory_model: str | None = None, label: str = "eval", memory_adapter: str | None = None,
) -> tuple[list[dict], dict]:
    """The LLM-as-RNN forward pass (llmrnn.rnn.run_forward, batched per visit step) of one variant.

    base/trained: memory = "rnn" and only the memory role's weights differ (`memory_model`); baselines
    use the same prediction/evaluation roles with memory "none" or "full_history". Every variant gets
    the same roles config, prompts and seed, so sampling is paired per (patient, visit, role).
    """
    from llmrnn import rnn
    from llmrnn.prompts import load_prompts

    mode = variant_mode(variant)
    if variant in MEMORY_VARIANTS and variant != REFERENCE and not memory_model:
        raise InputError(f"eval {variant}: needs --memory-model (the merged trained model directory)")
    if memory_model and not (Path(memory_model) / "config.json").is_file():
        raise InputError(f"{memory_model}: not a HF model directory (no config.json); memory model of {variant}")
    prompts = load_prompts(prompts_file)
    if memory_adapter and not (Path(memory_adapter) / "adapter_config.json").is_file():
        raise InputError(f"{memory_adapter}: not a PEFT adapter folder (no adapter_config.json); memory adapter of {variant}")
    # with a vLLM memory role the trained model runs as its adapter on the base engine (one engine per GPU)
    roles = rnn.make_roles(roles_cfg, {"memory": memory_model} if memory_model else None,
                           memory_adapter=memory_adapter if variant == "trained" else None)
    stats: dict = {}
    results = rnn.run_forward(patients, roles, prompts, memory=mode, seed=seed, stats=stats, label=label)
    for rec in results:
        rec["variant"] = variant
    return results, stats


# ----------------------------------------------------------------------------- rows kept across a kill
CHUNK_PATIENTS = 8  # patients per forward pass and per durable write: a kill loses at most this many


def _partial_rows(partial: Path, fingerprint: str) -> list[list[dict]]:
    """The finished chunks of an earlier attempt of this very shard (same fingerprint); a torn last line
    (killed mid-write) is dropped, a file of another config/code is discarded."""
    if not partial.is_file():
        return []
    import json

    lines = partial.read_text(encoding="utf-8").splitlines()
    try:
        header = json.loads(lines[0]) if lines else {}
    except json.JSONDecodeError:
        header = {}
    if header.get("fingerprint") != fingerprint:
        partial.unlink()
        return []
    chunks = []
    for i, line in enumerate(lines[1:]):
        try:
            row = json.loads(line)
        except json.JSONDecodeError:
            break  # the write the kill interrupted: redone
        if row.get("chunk") != i:
            break
        chunks.append(row["rows"])
    return chunks


def _append_durably(path: Path, line: str) -> None:
    import os

    with open(path, "a", encoding="utf-8") as fh:
        fh.write(line + "\n")
        fh.flush()
        os.fsync(fh.fileno())


def run_shard_kept(patients: list[dict], variant: str, roles_cfg: dict, prompts_file: str, seed: int, *,
                   partial: Path, fingerprint: str, chunk: int | None = None, **kw) -> tuple[list[dict], dict]:
    """run_shard over chunks of `chunk` patients, each chunk's rows appended (fsync) to `partial` as it
    finishes; a rerun with the same fingerprint continues after the last whole chunk, so a killed shard
    loses at most one chunk's work and never duplicates or loses a row. Sampling is seeded per (patient,
    visit, role), so the rows equal those of one uninterrupted pass. The caller removes `partial` after
    writing the shard's output."""
    import json
    import logging

    log = logging.getLogger(__name__)
    chunk = chunk or CHUNK_PATIENTS
    done = _partial_rows(partial, fingerprint)
    if not partial.is_file():
        partial.parent.mkdir(parents=True, exist_ok=True)
        _append_durably(partial, json.dumps({"fingerprint": fingerprint}))
    pieces = [patients[i:i + chunk] for i in range(0, len(patients), chunk)]
    if done:
        log.info("%s: continuing after %d of %d chunks (%d rows kept from the last attempt)", kw.get("label", "eval"),
                 len(done), len(pieces), sum(len(c) for c in done))
    rows = [r for c in done for r in c]
    stats: dict = {}
    for i in range(len(done), len(pieces)):
        got, st = run_shard(pieces[i], variant, roles_cfg, prompts_file, seed, **kw)
        _append_durably(partial, json.dumps({"chunk": i, "rows": got}, sort_keys=True, ensure_ascii=False))
        rows += got
        for k, v in st.items():
            stats[k] = stats.get(k, 0) + v if isinstance(v, (int, float)) else v
    return rows, stats
