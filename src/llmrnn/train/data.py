"""Reading the trajectory parquets (verl RLHFDataset rows) and measuring prompts the way verl's RLHFDataset does."""

from __future__ import annotations

import json
import os
from pathlib import Path

from llmrnn.errors import InputError

REQUIRED_COLUMNS = ("prompt", "data_source", "ability", "reward_model", "extra_info")


def read_trajectory_parquet(path: str | os.PathLike) -> list[dict]:
    """All rows of a trajectory parquet as dicts; a missing file or column is one clear line."""
    import pyarrow.parquet as pq

    p = Path(path)
    if not p.exists():
        raise InputError(f"{p}: trajectory parquet not found")
    try:
        table = pq.read_table(p)
    except Exception as exc:
        raise InputError(f"{p}: not a readable parquet file: {exc}") from exc
    missing = [c for c in REQUIRED_COLUMNS if c not in table.column_names]
    if missing:
        raise InputError(f"{p}: missing column(s) {missing}; expected the verl RLHFDataset layout")
    rows = table.to_pylist()
    for i, row in enumerate(rows):
        prompt = row["prompt"]
        if not isinstance(prompt, list) or not prompt or not all(
            isinstance(m, dict) and isinstance(m.get("content"), str) and m.get("role") for m in prompt
        ):
            raise InputError(f"{p}: row {i}: prompt: expected a non-empty list of chat messages {{role, content}}")
        gt = (row.get("reward_model") or {}).get("ground_truth")
        if not isinstance(gt, str):
            raise InputError(f"{p}: row {i}: reward_model.ground_truth: expected a JSON string")
    return rows


def prompt_lengths(rows: list[dict], tokenizer) -> list[int]:
    """Token count of each templated prompt (chat template + generation prompt), as verl measures it."""
    out = []
    for row in rows:
        ids = tokenizer.apply_chat_template(row["prompt"], add_generation_prompt=True, tokenize=True)
        if isinstance(ids, dict) or hasattr(ids, "keys"):  # transformers 5 may return a BatchEncoding
            ids = ids["input_ids"]
        out.append(len(ids))
    return out


def row_index(row: dict, fallback: int) -> int:
    extra = row.get("extra_info") or {}
    value = extra.get("index")
    return int(value) if value is not None else fallback


def describe(path: str | os.PathLike) -> str:
    rows = read_trajectory_parquet(path)
    return json.dumps({"rows": len(rows)})
