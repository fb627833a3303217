"""The `train` config section: one set of GRPO knobs, shared by the verl and TRL engines.

Units follow verl (the reference engine): batch sizes count PROMPTS except `micro_per_gpu`, which counts
responses (prompt x one rollout), exactly as verl's `ppo_micro_batch_size_per_gpu`. A "step" is one
rollout batch of `batch.train` prompts x `group_size` rollouts; it makes `batch.train / batch.mini`
optimizer updates (1 in the reference run: 16/16/4).
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from llmrnn.settings.base import parse
from llmrnn.settings.train import Train

# verl loss_agg_mode -> TRL loss_type with the same normalisation: token-mean = every token of the batch
# weighs the same (TRL dapo: over the global accumulated batch); seq-mean-token-mean = each sequence's mean
# token loss, averaged (TRL grpo); seq-mean-token-sum-norm = token sums over a constant (TRL dr_grpo: the
# max completion length). verl's seq-mean-token-sum has no TRL counterpart (settings.train refuses it with trl).
LOSS_TYPES = {"token-mean": "dapo", "seq-mean-token-mean": "grpo", "seq-mean-token-sum-norm": "dr_grpo"}


def settings(train_cfg: Train | dict | None) -> Train:
    """The `train` section as its validated settings model (llmrnn.settings.Train: defaults filled, every
    key and cross-field rule checked, one line per problem). A Train is handed back as it is, so the section
    is validated once, at the CLI boundary, however many functions it passes through."""
    if isinstance(train_cfg, Train):
        return train_cfg
    return parse(Train, train_cfg or {}, "train")


@dataclass(frozen=True)
class Geometry:
    """Batch arithmetic both engines share; `problems` is empty when the geometry is possible."""

    n_gpus: int
    prompts_per_step: int
    responses_per_step: int
    updates_per_step: int  # optimizer steps per rollout batch (train / mini)
    responses_per_update_per_gpu: int  # mini x G / n_gpus
    grad_accum: int  # micro batches per optimizer step on each GPU
    problems: tuple[str, ...]

    def as_dict(self) -> dict:
        return {
            "n_gpus": self.n_gpus,
            "prompts_per_step": self.prompts_per_step,
            "responses_per_step": self.responses_per_step,
            "updates_per_step": self.updates_per_step,
            "responses_per_update_per_gpu": self.responses_per_update_per_gpu,
            "grad_accum": self.grad_accum,
        }


def geometry(cfg: Train, engine: str | None = None) -> Geometry:
    """Check train x G vs mini/micro x GPUs the way verl's workers do (and TRL's GRPOConfig)."""
    engine = engine or cfg.engine
    n_gpus = 1 if engine == "trl" else cfg.n_gpus_per_node * cfg.nnodes
    g = cfg.group_size
    train, mini, micro = cfg.batch.train, cfg.batch.mini, cfg.batch.micro_per_gpu
    problems: list[str] = []
    if mini > train:
        problems.append(f"train.batch.mini={mini} is larger than train.batch.train={train} (both count prompts)")
    elif train % mini:
        problems.append(
            f"train.batch.train={train} is not a multiple of train.batch.mini={mini}: each step must split into "
            "whole mini-batches"
        )
    per_gpu = mini * g // n_gpus if (mini * g) % n_gpus == 0 else None
    if per_gpu is None:
        problems.append(
            f"train.batch.mini x group_size = {mini}x{g} = {mini * g} responses cannot be split evenly over "
            f"{n_gpus} GPUs (n_gpus_per_node x nnodes)"
        )
        per_gpu = max(1, mini * g // n_gpus)
    if per_gpu % micro:
        problems.append(
            f"train.batch.micro_per_gpu={micro} does not divide the {per_gpu} responses each GPU gets per "
            f"optimizer step (batch.mini x group_size / GPUs = {mini}x{g}/{n_gpus})"
        )
    if engine == "verl":
        tp = cfg.rollout.tensor_parallel
        if cfg.n_gpus_per_node % tp:
            problems.append(
                f"train.rollout.tensor_parallel={tp} does not divide train.n_gpus_per_node={cfg.n_gpus_per_node}"
            )
        if (train * g) % n_gpus:
            problems.append(
                f"train.batch.train x group_size = {train * g} responses cannot be split evenly over {n_gpus} GPUs"
            )
    return Geometry(
        n_gpus=n_gpus,
        prompts_per_step=train,
        responses_per_step=train * g,
        updates_per_step=max(1, train // mini) if mini <= train else 1,
        responses_per_update_per_gpu=per_gpu,
        grad_accum=max(1, per_gpu // micro),
        problems=tuple(problems),
    )


def steps_per_epoch(cfg: Train, n_rows: int) -> int:
    """verl's train dataloader uses drop_last=True; TRL's RepeatSampler drops the partial batch too."""
    return n_rows // cfg.batch.train


def planned_steps(cfg: Train, n_rows: int) -> int:
    """Total rollout steps the run must reach (verl: len(dataloader) x epochs, capped by total_steps)."""
    total = steps_per_epoch(cfg, n_rows) * cfg.epochs
    if cfg.total_steps:
        total = min(total, cfg.total_steps)
    return total


def lr_at(cfg: Train, step: int, total: int) -> float:
    """Learning rate at optimizer step `step` (1-based) for the configured schedule (verl and TRL agree)."""
    lr, warm = cfg.lr, cfg.warmup_steps
    if warm and step <= warm:
        return lr * step / warm
    if cfg.lr_scheduler == "cosine" and total > warm:
        progress = (step - warm) / max(1, total - warm)
        return lr * 0.5 * (1 + math.cos(math.pi * progress))
    return lr
