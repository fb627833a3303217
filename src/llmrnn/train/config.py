"""The `train` config section: one set of GRPO knobs, shared by the verl and TRL engines.

Units follow verl (the reference engine): batch sizes count PROMPTS except `micro_per_gpu`, which counts
responses (prompt x one rollout), exactly as verl's `ppo_micro_batch_size_per_gpu`. A "step" is one
rollout batch of `batch.train` prompts x `group_size` rollouts; it makes `batch.train / batch.mini`
optimizer updates (1 in the reference run: 16/16/4).
"""

from __future__ import annotations

import math

from llmrnn.settings.base import parse
from llmrnn.settings.train import Train

# verl loss_agg_mode -> TRL loss_type with the same normalisation: token-mean = every token of the batch
# weighs the same (TRL dapo: over the global accumulated batch); seq-mean-token-mean = each sequence's mean
# token loss, averaged (TRL grpo); seq-mean-token-sum-norm = token sums over a constant (TRL dr_grpo: the
# max completion length). verl's seq-mean-token-sum has no TRL counterpart (settings.train refuses it with trl).
LOSS_TYPES = {"token-mean": "dapo", "seq-mean-token-mean": "grpo", "seq-mean-token-sum-norm": "dr_grpo"}


def settings(train_cfg: Train | dict | None) -> Train:
    """The `train` section as its validated settings model (llmrnn.settings.Train: defaults filled, every
    key and cross-field rule checked, one line per problem; its derived batch geometry is `.geometry`). A
    Train is handed back as it is, so the section is validated once, at the CLI boundary, however many
    functions it passes through."""
    if isinstance(train_cfg, Train):
        return train_cfg
    return parse(Train, train_cfg or {}, "train")


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
