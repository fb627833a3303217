"""Which checkpoints a training run may resume: only those written for this exact run.

Both engines resume automatically from their latest checkpoint; a rerun after the config, the data,
the base model, the reward or the code changed must start over instead of continuing another run.
"""

from __future__ import annotations

import hashlib
import importlib.util
import json
import logging
import os
import shutil
from pathlib import Path

from llmrnn import io
from llmrnn.reward import ENV_CFG

log = logging.getLogger(__name__)


def run_fingerprint(cfg: dict, train_parquet, model_dir, reward_spec: str, engine_module: str) -> str:
    """What a checkpoint is valid for: knobs, data, base model, reward config and the code that scores
    (llmrnn.reward) and trains (`engine_module`)."""
    digest = hashlib.sha256()
    digest.update(json.dumps(cfg, sort_keys=True).encode())
    digest.update(io.sha256_file(train_parquet).encode())
    digest.update(str(Path(model_dir).resolve()).encode())
    digest.update(reward_spec.encode())
    digest.update(os.environ.get(ENV_CFG, "").encode())  # the scorer settings the reward workers read
    for module in ("llmrnn.reward", engine_module):
        digest.update(Path(importlib.util.find_spec(module).origin).read_bytes())
    return digest.hexdigest()


def discard_stale_checkpoints(out: Path, fingerprint: str) -> None:
    """Keep out/checkpoints and out/state only if they were written for this fingerprint (an unstamped
    checkpoint comes from an older llmrnn and is not trusted either); then stamp the run."""
    stamp = out / "checkpoints" / "RUN_FINGERPRINT"
    if (out / "checkpoints").is_dir() and (not stamp.exists() or stamp.read_text().strip() != fingerprint):
        log.warning("config, data or code changed since the checkpoints were written: starting from step 0")
        shutil.rmtree(out / "checkpoints")
        shutil.rmtree(out / "state", ignore_errors=True)
    io.write_text(stamp, fingerprint + "\n")
