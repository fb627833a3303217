"""The rows preflight scores: K train rows and their fixed candidate memories (h_ref, h_prev, empty)."""

from __future__ import annotations

import json
import logging
from pathlib import Path
from typing import Any

from llmrnn.errors import InputError
from llmrnn.train.data import (
    read_trajectory_parquet,  # one reader (and one set of messages) for trajectory parquets
)

log = logging.getLogger(__name__)


CANDIDATES = ("h_ref", "h_prev", "empty")
EMPTY_MEMORY = json.dumps({"evolving_summary": ""})


def load_rows(parquet: str | Path, k: int, seed: int) -> list[dict]:
    import pandas as pd


    path = Path(parquet)
    df = pd.DataFrame(read_trajectory_parquet(path))
    if len(df) == 0:
        raise InputError(f"{path}: no rows")
    if len(df) > k:
        df = df.sample(n=k, random_state=seed).sort_index()
    rows = []
    for idx, row in df.iterrows():
        rm = row["reward_model"]
        gt = rm.get("ground_truth") if isinstance(rm, dict) else None
        if not isinstance(gt, str):
            raise InputError(f"{path}: row {idx}: reward_model.ground_truth: expected a JSON string")
        try:
            step = json.loads(gt)
        except json.JSONDecodeError as exc:
            raise InputError(f"{path}: row {idx}: reward_model.ground_truth: not JSON: {exc}") from exc
        extra = row["extra_info"]
        rows.append({"index": int(idx), "ground_truth": gt, "step": step, "data_source": row["data_source"],
                     "extra_info": dict(extra) if isinstance(extra, dict) else {}})
    return rows


def _as_policy_output(memory: Any) -> str:
    """A memory from the trajectory as the policy would print it (the JSON string)."""
    if isinstance(memory, str):
        return memory
    return json.dumps(memory if isinstance(memory, dict) else {"evolving_summary": str(memory or "")})
