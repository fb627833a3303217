"""Training preflight: everything about the GRPO run that can be checked before the expensive step.

`training_checks(...)` returns {"ok", "problems": [...], "geometry", "data", "lr_schedule", "gpus", "disk"};
JUDGE's `llmrnn preflight` puts it under "training" in RUN/train/preflight.json, and
`llmrnn train preflight` runs it standalone. Each problem is one line saying what to change.
"""

from __future__ import annotations

import logging
import os
import shutil
from pathlib import Path

from llmrnn.train import config as tcfg
from llmrnn.train import data as tdata

log = logging.getLogger(__name__)

LR_CHECK_STEP = 20  # optimizer step at which the LR must have reached LR_MIN_FRACTION of train.lr
LR_MIN_FRACTION = 0.3


def visible_gpus() -> int:
    """GPUs this process can use (torch if importable, else CUDA_VISIBLE_DEVICES / nvidia-smi)."""
    try:
        import torch

        return int(torch.cuda.device_count())
    except Exception as exc:  # noqa: BLE001 - no torch: fall back to the environment
        log.debug("torch GPU count unavailable: %s", exc)
    env = os.environ.get("CUDA_VISIBLE_DEVICES")
    if env is not None:
        return len([x for x in env.split(",") if x.strip() and x.strip() != "-1"])
    return 0


def _lengths(path, tokenizer):
    rows = tdata.read_rows(path)
    return rows, tdata.prompt_lengths(rows, tokenizer)


def training_checks(
    train_cfg: dict,
    train_parquet: str | os.PathLike,
    val_parquet: str | os.PathLike | None,
    tokenizer_dir: str | os.PathLike,
    *,
    out_dir: str | os.PathLike | None = None,
    gpus_available: int | None = None,
    max_dropped_fraction: float = 0.0,
) -> dict:
    """Batch geometry, prompt lengths vs max_prompt_length, LR schedule, GPUs, free disk."""
    from transformers import AutoTokenizer

    cfg = tcfg.normalize(train_cfg)
    engine = cfg["engine"]
    problems: list[str] = []

    geo = tcfg.geometry(cfg)
    problems += list(geo.problems)

    tokenizer = AutoTokenizer.from_pretrained(tokenizer_dir)
    limit = cfg["max_prompt_length"]
    data: dict = {"max_prompt_length": limit}
    kept_train = 0
    for split, path in (("train", train_parquet), ("val", val_parquet)):
        if path is None:
            data[split] = None
            continue
        rows, lengths = _lengths(path, tokenizer)
        over = [i for i, n in enumerate(lengths) if n > limit]
        data[split] = {
            "rows": len(rows),
            "prompt_tokens_max": max(lengths) if lengths else 0,
            "prompt_tokens_mean": round(sum(lengths) / len(lengths), 1) if lengths else 0,
            "overlong_rows": len(over),
            "overlong_examples": [
                {"row": i, "tokens": lengths[i], **{k: (rows[i].get("extra_info") or {}).get(k)
                                                    for k in ("patient_id", "visit_index")}}
                for i in over[:5]
            ],
        }
        if split == "train":
            kept_train = len(rows) - len(over)
        if not rows:
            problems.append(f"{split} parquet {path}: no rows")
        elif over and len(over) / len(rows) > max_dropped_fraction:
            problems.append(
                f"{split} parquet {path}: {len(over)} of {len(rows)} prompts exceed train.max_prompt_length={limit} "
                f"tokens (longest {max(lengths)}); verl would silently drop them: raise max_prompt_length or "
                "shorten the prompts"
            )
    if val_parquet is None and cfg["test_freq"]:
        problems.append("no val parquet: validation every train.test_freq steps needs one")

    planned = tcfg.planned_steps(cfg, kept_train)
    spe = tcfg.steps_per_epoch(cfg, kept_train)
    data["steps_per_epoch"] = spe
    data["planned_steps"] = planned
    if kept_train and spe == 0:
        problems.append(
            f"train parquet: {kept_train} usable rows are fewer than one batch of train.batch.train="
            f"{cfg['batch']['train']} prompts (the partial batch is dropped): no step would run"
        )

    # LR schedule: the optimizer steps the run makes and the LR it sees at the first/last one
    updates = planned * geo.updates_per_step
    warm = int(cfg["warmup_steps"] or 0)
    schedule = {
        "scheduler": cfg["lr_scheduler"],
        "peak_lr": float(cfg["lr"]),
        "warmup_steps": warm,
        "optimizer_steps": updates,
        "lr_first_step": tcfg.lr_at(cfg, 1, updates) if updates else None,
        "lr_last_step": tcfg.lr_at(cfg, updates, updates) if updates else None,
    }
    if not float(cfg["lr"]) > 0:
        problems.append(f"train.lr={cfg['lr']}: must be > 0")
    if updates and warm >= updates:
        problems.append(
            f"train.warmup_steps={warm} >= the run's {updates} optimizer steps: the LR never reaches train.lr"
        )
    # the schedule must reach useful values early: a run whose LR is still tiny after LR_CHECK_STEP updates
    # (a long warmup, a cosine decaying over a short budget) spends its step budget learning nothing
    check_step = min(LR_CHECK_STEP, updates)
    if updates:
        lr_check = tcfg.lr_at(cfg, check_step, updates)
        schedule.update(check_step=check_step, lr_at_check_step=lr_check, min_fraction=LR_MIN_FRACTION)
        if float(cfg["lr"]) > 0 and lr_check < LR_MIN_FRACTION * float(cfg["lr"]) and warm < updates:
            problems.append(
                f"LR schedule: at optimizer step {check_step} of {updates} the LR is {lr_check:.3g}, below "
                f"{LR_MIN_FRACTION:.0%} of train.lr={cfg['lr']}: shorten train.warmup_steps or give the run more steps"
            )
    if cfg["save_freq"] and planned and cfg["save_freq"] > planned:
        schedule["note"] = "save_freq > planned steps: only the final checkpoint is written"

    # GPUs
    need = 0 if engine == "trl" else cfg["n_gpus_per_node"]
    have = visible_gpus() if gpus_available is None else int(gpus_available)
    gpus = {"engine": engine, "requested_per_node": need, "nnodes": cfg["nnodes"], "available_here": have}
    if engine == "verl" and have < need:
        problems.append(
            f"train.n_gpus_per_node={need} but {have} GPU(s) are visible here (verl cannot train on CPU; "
            "use train.engine: trl, or run on a GPU node)"
        )

    # disk for checkpoints
    target = Path(out_dir) if out_dir else Path(train_parquet).parent
    probe = target
    while not probe.exists() and probe != probe.parent:
        probe = probe.parent
    free_gb = shutil.disk_usage(probe).free / 1e9
    disk = {"path": str(target), "free_gb": round(free_gb, 2), "min_free_gb": cfg["min_free_disk_gb"]}
    if free_gb < float(cfg["min_free_disk_gb"]):
        problems.append(
            f"only {free_gb:.1f} GB free at {probe}; train.min_free_disk_gb={cfg['min_free_disk_gb']} needed for "
            "checkpoints"
        )

    return {
        "ok": not problems,
        "problems": problems,
        "engine": engine,
        "geometry": geo.as_dict(),
        "data": data,
        "lr_schedule": schedule,
        "gpus": gpus,
        "disk": disk,
    }
