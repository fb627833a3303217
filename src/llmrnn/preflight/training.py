"""Training checks: batch geometry, prompt lengths vs max_prompt_length, LR schedule, GPUs, free disk
(each problem one line saying what to change); `llmrnn preflight training` runs them alone."""

from __future__ import annotations

import logging
import os
import shutil
from pathlib import Path

from llmrnn.gpu_stack import checkpoint_disk_gb
from llmrnn.gpus import visible_gpus
from llmrnn.quota import user_quota
from llmrnn.settings.train import Train
from llmrnn.train import config as tcfg
from llmrnn.train import data as tdata

log = logging.getLogger(__name__)


# ----------------------------------------------------------------------------- training checks
def _split_lengths(split: str, path, tokenizer, limit: int, max_dropped_fraction: float) -> tuple[dict, int, list[str]]:
    """Prompt lengths of one parquet vs max_prompt_length: (report, rows that fit, problems)."""
    rows = tdata.read_trajectory_parquet(path)
    lengths = tdata.prompt_lengths(rows, tokenizer)
    over = [i for i, n in enumerate(lengths) if n > limit]
    report = {
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
    problems = []
    if not rows:
        problems.append(f"{split} parquet {path}: no rows")
    elif over and len(over) / len(rows) > max_dropped_fraction:
        problems.append(
            f"{split} parquet {path}: {len(over)} of {len(rows)} prompts exceed train.max_prompt_length={limit} "
            f"tokens (longest {max(lengths)}); verl would silently drop them: raise max_prompt_length or "
            "shorten the prompts"
        )
    return report, len(rows) - len(over), problems


def _data_checks(cfg: Train, train_parquet, val_parquet, tokenizer_dir, max_dropped_fraction: float):
    """Prompt lengths of both splits and the steps the usable train rows make: (report, problems)."""
    from transformers import AutoTokenizer


    tokenizer = AutoTokenizer.from_pretrained(tokenizer_dir)
    limit = cfg.max_prompt_length
    data: dict = {"max_prompt_length": limit, "val": None}
    data["train"], kept_train, problems = _split_lengths("train", train_parquet, tokenizer, limit,
                                                         max_dropped_fraction)
    if val_parquet is not None:
        data["val"], _, val_problems = _split_lengths("val", val_parquet, tokenizer, limit, max_dropped_fraction)
        problems += val_problems
    elif cfg.test_freq:
        problems.append("no val parquet: validation every train.test_freq steps needs one")
    spe = tcfg.steps_per_epoch(cfg, kept_train)
    data["steps_per_epoch"] = spe
    data["planned_steps"] = tcfg.planned_steps(cfg, kept_train)
    if kept_train and spe == 0:
        problems.append(
            f"train parquet: {kept_train} usable rows are fewer than one batch of train.batch.train="
            f"{cfg.batch.train} prompts (the partial batch is dropped): no step would run"
        )
    return data, problems


LR_CHECK_STEP = 20  # optimizer step at which the LR must have reached LR_MIN_FRACTION of train.lr
LR_MIN_FRACTION = 0.3


def _lr_checks(cfg: Train, planned: int, updates_per_step: int) -> tuple[dict, list[str]]:
    """The optimizer steps the run makes and the LR it sees at the first/last one."""
    updates = planned * updates_per_step
    warm = cfg.warmup_steps
    schedule = {
        "scheduler": cfg.lr_scheduler,
        "peak_lr": cfg.lr,
        "warmup_steps": warm,
        "optimizer_steps": updates,
        "lr_first_step": tcfg.lr_at(cfg, 1, updates) if updates else None,
        "lr_last_step": tcfg.lr_at(cfg, updates, updates) if updates else None,
    }
    problems = []
    if not cfg.lr > 0:
        problems.append(f"train.lr={cfg.lr}: must be > 0")
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
        if cfg.lr > 0 and lr_check < LR_MIN_FRACTION * cfg.lr and warm < updates:
            problems.append(
                f"LR schedule: at optimizer step {check_step} of {updates} the LR is {lr_check:.3g}, below "
                f"{LR_MIN_FRACTION:.0%} of train.lr={cfg.lr}: shorten train.warmup_steps or give the run more steps"
            )
    if cfg.save_freq and planned and cfg.save_freq > planned:
        schedule["note"] = "save_freq > planned steps: only the final checkpoint is written"
    return schedule, problems


def _gpu_checks(cfg: Train, gpus_available: int | None, check_gpus: bool = True) -> tuple[dict, list[str]]:
    engine = cfg.engine
    need = 0 if engine == "trl" else cfg.n_gpus_per_node
    have = visible_gpus() if gpus_available is None else int(gpus_available)
    gpus = {"engine": engine, "requested_per_node": need, "nnodes": cfg.nnodes, "available_here": have}
    problems = []
    if not check_gpus:
        gpus["checked_by"] = "train run (the training job)"
    elif engine == "verl" and have < need:
        problems.append(
            f"train.n_gpus_per_node={need} but {have} GPU(s) are visible here (verl cannot train on CPU; "
            "use train.engine: trl, or run on a GPU node)"
        )
    return gpus, problems


def _disk_checks(cfg: Train, target: Path, model_dir, planned: int) -> tuple[dict, list[str]]:
    """Free disk for checkpoints where they will go (the nearest existing folder of `target`). verl's
    checkpoints hold the full fp32 actor, so its need is sized from the model x checkpoints kept."""
    probe = target
    while not probe.exists() and probe != probe.parent:
        probe = probe.parent
    free_gb = shutil.disk_usage(probe).free / 1e9  # statvfs: blind to the user's quota
    disk = {"path": str(target), "free_gb": round(free_gb, 2)}

    quota = user_quota(probe)
    disk["quota"] = quota.note
    where = f"{free_gb:.1f} GB free at {probe}"
    if quota.left_gb is not None and quota.left_gb < free_gb:
        free_gb, where = quota.left_gb, f"{quota.left_gb:.1f} GB left under your quota at {probe} ({quota.note})"
    need_gb, why = cfg.min_free_disk_gb, f"train.min_free_disk_gb={cfg.min_free_disk_gb}"
    if cfg.engine == "verl":
        ckpt_gb, kept = checkpoint_disk_gb(model_dir, cfg.keep_last, planned, cfg.save_freq)
        disk.update(checkpoints_kept=kept, checkpoints_gb=ckpt_gb)
        if ckpt_gb > need_gb:
            need_gb, why = ckpt_gb, (f"{kept} checkpoint(s) kept (train.keep_last={cfg.keep_last}) x "
                                     f"{ckpt_gb / kept:.1f} GB (fp32 weights of {model_dir})")
    disk["min_free_gb"] = need_gb
    problems = []
    if free_gb < need_gb:
        problems.append(f"only {where}; {need_gb:.1f} GB needed for {why}: free disk, or set train.keep_last "
                        "(verl trainer.max_actor_ckpt_to_keep; the reference kept every checkpoint, train.select "
                        "last needs only the last)")
    return disk, problems


def training_checks(
    train_cfg: dict,
    train_parquet: str | os.PathLike,
    val_parquet: str | os.PathLike | None,
    tokenizer_dir: str | os.PathLike,
    *,
    out_dir: str | os.PathLike | None = None,
    gpus_available: int | None = None,
    max_dropped_fraction: float = 0.0,
    check_gpus: bool = True,
) -> dict:
    """Batch geometry, prompt lengths vs max_prompt_length, LR schedule, GPUs, free disk.

    check_gpus=False where the caller holds no GPU by design (the preflight step of the training group):
    `train run` counts them itself before verl starts.

    Returns {"ok", "problems": [...], "engine", "geometry", "data", "lr_schedule", "gpus", "disk"}."""
    cfg = tcfg.settings(train_cfg)
    geo = cfg.geometry
    data, data_problems = _data_checks(cfg, train_parquet, val_parquet, tokenizer_dir, max_dropped_fraction)
    schedule, lr_problems = _lr_checks(cfg, data["planned_steps"], geo.updates_per_step)
    gpus, gpu_problems = _gpu_checks(cfg, gpus_available, check_gpus)
    disk, disk_problems = _disk_checks(cfg, Path(out_dir) if out_dir else Path(train_parquet).parent,
                                       tokenizer_dir, data["planned_steps"])
    problems = [*geo.problems, *data_problems, *lr_problems, *gpu_problems, *disk_problems]
    return {
        "ok": not problems,
        "problems": problems,
        "engine": cfg.engine,
        "geometry": geo.as_dict(),
        "data": data,
        "lr_schedule": schedule,
        "gpus": gpus,
        "disk": disk,
    }
