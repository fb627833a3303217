"""Which checkpoints a training run may resume: only those written for this exact run.

Both engines resume automatically from their latest checkpoint; a rerun after the config, the data,
the base model, the reward or the code changed must start over instead of continuing another run.
"""

from __future__ import annotations

import errno
import hashlib
import importlib.util
import json
import logging
import shutil
from pathlib import Path

from llmrnn import io
from llmrnn.errors import CheckFailed
from llmrnn.provenance import code_identity, module_path
from llmrnn.reward import settings_identity
from llmrnn.reward.function import RewardFunction
from llmrnn.settings.train import Train

log = logging.getLogger(__name__)

TRAIN_VERB = "train run"


def job_code(reward: RewardFunction) -> str:
    """The code identity of this training job: the same import-closure hash the rule's `code` param holds
    (llmrnn.provenance.code_identity of `train run`, plus the --reward-func module the rule names: rules
    train_grpo and qa_train_grpo), so a rerun that Snakemake starts for a code change never resumes the
    checkpoints of the old code. A reward outside the package (a file, another package) adds its source."""
    module = reward.module
    if reward.is_builtin:
        return code_identity(TRAIN_VERB)
    if module_path(module) is not None:
        return code_identity(TRAIN_VERB, module)
    if module.endswith(".py") and Path(module).is_file():  # your own reward (reward.custom): as its rule hashes it
        return code_identity(TRAIN_VERB, module)
    found = importlib.util.find_spec(module)
    origin = found.origin if found and found.origin else None
    extra = io.sha256_file(origin) if origin else module
    return f"{code_identity(TRAIN_VERB)}+{extra}"


SMALL_FILE = 16 * 2**20  # config, tokenizer and other small files are hashed whole
SAMPLE = 2**20  # of a weight file: its header and three 1 MiB samples of its data (start, middle, end)


def _weights_identity(path: Path, size: int) -> str:
    """A weight file cheaply: its size, its safetensors header (tensor names, dtypes, shapes, offsets and
    metadata) and three samples of its data; a retrained model of the same shapes differs in every sample."""
    h = hashlib.sha256(str(size).encode())
    with open(path, "rb") as fh:
        head = fh.read(8)
        h.update(head)
        start = 8
        if path.suffix == ".safetensors" and len(head) == 8:
            n = int.from_bytes(head, "little")
            if n <= min(size - 8, 100 * 2**20):
                h.update(fh.read(n))
                start = 8 + n
        for offset in (start, start + max(size - start - SAMPLE, 0) // 2, max(size - SAMPLE, start)):
            fh.seek(offset)
            h.update(fh.read(SAMPLE))
    return h.hexdigest()


def model_identity(model_dir) -> str:
    """What the base model IS, not where it lies: every file at the top of its folder (links followed; no
    dotfiles, such as the .ready marker, no model card) by name with its sha256, or for a file larger than
    SMALL_FILE (the weights) _weights_identity. A base model replaced at the same path (another download,
    a retrained model) so changes the fingerprint, and its old checkpoints are not resumed."""
    folder = Path(model_dir)
    parts: list[str] = []
    if not folder.is_dir():  # nothing to train from (the engine says so): as a folder without files
        return ""
    for path in sorted(folder.iterdir()):
        if path.name.startswith(".") or path.suffix.lower() == ".md" or not path.is_file():
            continue
        size = path.stat().st_size
        ident = io.sha256_file(path) if size <= SMALL_FILE else _weights_identity(path, size)
        parts.append(f"{path.name}:{ident}")
    return "\n".join(parts)


def run_fingerprint(cfg: Train, train_parquet, model_dir, reward: RewardFunction,
                    reward_kwargs: dict | None = None) -> str:
    """What a checkpoint is valid for: knobs, data, base model (its contents: model_identity), the reward's settings (the very arguments
    the scorer gets, llmrnn.reward.kwargs, less where files are) and the job's code identity (job_code:
    every module `llmrnn train run` can run, the reward's included, your own reward's file too)."""
    digest = hashlib.sha256()
    # the trackers watching a run (train.report_to) change nothing it computes: adding one resumes the run
    digest.update(json.dumps(cfg.model_dump(exclude={"report_to"}), sort_keys=True).encode())
    digest.update(io.sha256_file(train_parquet).encode())
    digest.update(model_identity(model_dir).encode())  # the model's contents, not its path
    digest.update(str(reward).encode())
    digest.update(settings_identity(reward_kwargs).encode())  # the settings the scorer gets as arguments
    digest.update(job_code(reward).encode())
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


def choose_checkpoint(select: str, saved_steps: list[int], metrics_rows: list[dict]) -> dict:
    """The saved step whose adapter becomes the run's adapter, and why (train.select).

    `saved_steps`: rollout steps with a checkpoint on disk; `metrics_rows`: metrics.jsonl rows (val rows carry
    val_reward_mean). "last": the newest saved step. "best_val": the saved step with the highest val reward
    (ties: the later step); every saved step must have one (llmrnn.settings.train.Train refuses a config that would not)."""
    if not saved_steps:
        raise CheckFailed("train: no saved checkpoint to choose from")
    steps = sorted({int(s) for s in saved_steps})
    val = {int(r["step"]): float(r["val_reward_mean"]) for r in metrics_rows
           if r.get("kind") == "val" and r.get("val_reward_mean") is not None}
    candidates = {str(s): val.get(s) for s in steps}
    out = {"select": select, "saved_steps": steps, "val_reward_by_step": {str(k): v for k, v in sorted(val.items())},
           "val_reward_of_saved": candidates}
    if select == "last":
        step = steps[-1]
        return {**out, "step": step, "val_reward": val.get(step),
                "why": f"train.select last: the final step {step} (the reference's choice)"}
    missing = [s for s in steps if s not in val]
    if missing:
        raise CheckFailed(f"train.select best_val: saved step(s) {missing} have no val reward in metrics.jsonl "
                          "(save_freq must be a multiple of test_freq)")
    step = max(steps, key=lambda s: (val[s], s))
    last = steps[-1]
    why = (f"train.select best_val: step {step} had the highest val reward ({val[step]:.4g}) of the saved steps "
           f"{steps}" + ("" if step == last else f"; the last step {last} had {val[last]:.4g}"))
    return {**out, "step": step, "val_reward": val[step], "why": why}


# what torch's and the OS's errors say when a checkpoint write runs out of disk: torch's zip writer reports
# ENOSPC as "unexpected pos N vs M" or "file write failed", never naming the disk
DISK_FULL_SIGNS = ("No space left on device", "Disk quota exceeded", "file write failed", "unexpected pos ")


def disk_full_problem(exc: BaseException, folder: Path) -> str | None:
    """One line saying the disk is full, when `exc` (or an error it came from) is a failed write for lack of
    space while saving a checkpoint under `folder`; None for any other error."""
    seen, e = [], exc
    while e is not None and e not in seen:
        seen.append(e)
        if (isinstance(e, OSError) and e.errno in (errno.ENOSPC, errno.EDQUOT)) or any(
                sign in str(e) for sign in DISK_FULL_SIGNS):
            try:
                free = f"{shutil.disk_usage(folder if folder.exists() else folder.parent).free / 2**20:.0f} MiB free now"
            except OSError:
                free = "free space unknown"
            return (f"train: the disk is full: saving a checkpoint under {folder} failed ({free}); free disk or "
                    "set train.keep_last, then rerun: training resumes from the last complete checkpoint")
        e = e.__cause__ or e.__context__
    return None
