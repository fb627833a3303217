"""The `train` config section: one set of GRPO knobs, shared by the verl and TRL engines.

Units follow verl (the reference engine): batch sizes count PROMPTS except `micro_per_gpu`, which counts
responses (prompt x one rollout), exactly as verl's `ppo_micro_batch_size_per_gpu`. A "step" is one
rollout batch of `batch.train` prompts x `group_size` rollouts; it makes `batch.train / batch.mini`
optimizer updates (1 in the reference run: 16/16/4).
"""

from __future__ import annotations

import math
from dataclasses import dataclass, fields
from typing import Any

from llmrnn.errors import InputError
from llmrnn.io import deep_merge
from llmrnn.settings import section_defaults
from llmrnn.settings.evaluation import Preflight

# Defaults = the reference run (LR 3e-6, KL 0.001 low_var_kl in the loss, G=8, batch 16/16/4, LoRA 16/32),
# kept in ONE place: the `train` model of llmrnn.settings (which also generates the workflow schema)
DEFAULTS: dict[str, Any] = section_defaults("train")
ALL_LINEAR = list(DEFAULTS["lora"]["target_modules"])

ENGINES = ("verl", "trl")
KL_ESTIMATORS = ("kl", "k1", "abs", "mse", "k2", "low_var_kl", "k3", "full")
SCHEDULERS = ("constant", "cosine")
# verl's actor load (fsdp_workers._build_model_optimizer): "flash_attention_2" (verl's default) needs the
# flash-attn package, which the GPU lock leaves out (a CUDA source build); sdpa is torch's own kernel
ATTN_IMPLEMENTATIONS = ("auto", "sdpa", "eager", "flash_attention_2")  # auto: resolved on the node (verl_cmd)
SELECT = ("last", "best_val")
# verl loss_agg_mode -> TRL loss_type with the same normalisation: token-mean = every token of the batch
# weighs the same (TRL dapo: over the global accumulated batch); seq-mean-token-mean = each sequence's mean
# token loss, averaged (TRL grpo); seq-mean-token-sum-norm = token sums over a constant (TRL dr_grpo: the
# max completion length). verl's seq-mean-token-sum has no TRL counterpart.
LOSS_TYPES = {"token-mean": "dapo", "seq-mean-token-mean": "grpo", "seq-mean-token-sum-norm": "dr_grpo",
              "seq-mean-token-sum": None}


class Train(dict):
    """The train section after normalize(): defaults filled, values checked. normalize() hands one back as
    it is, so the section is normalised once, at the CLI boundary, however many functions it passes through
    (train run -> verl_cmd.run -> build_overrides; preflight -> training_checks)."""


def normalize(train_cfg: dict | None) -> Train:
    """Fill defaults and check types/ranges that the schema cannot (one clear line per problem). An already
    normalised section (a Train) is returned unchanged: nothing is filled or checked twice."""
    if isinstance(train_cfg, Train):
        return train_cfg
    cfg = deep_merge(DEFAULTS, train_cfg)
    unknown = sorted(set(cfg) - set(DEFAULTS))
    if unknown:
        raise InputError(f"train: unknown key(s) {unknown}; see docs/configuration.md")
    if cfg["engine"] not in ENGINES:
        raise InputError(f"train.engine: {cfg['engine']!r} is not one of {list(ENGINES)}")
    if cfg["engine"] == "verl" and cfg["early_stopping"]["enabled"]:
        # verl's trainer has no hook we drive between validations: refuse rather than ignore the knob
        raise InputError("train.early_stopping.enabled: true needs train.engine trl (verl runs its planned steps)")
    if cfg["kl"]["estimator"] not in KL_ESTIMATORS:
        raise InputError(f"train.kl.estimator: {cfg['kl']['estimator']!r} is not one of {list(KL_ESTIMATORS)}")
    if cfg["verl"]["attn_implementation"] not in ATTN_IMPLEMENTATIONS:
        raise InputError(f"train.verl.attn_implementation: {cfg['verl']['attn_implementation']!r} is not one of "
                         f"{list(ATTN_IMPLEMENTATIONS)}")
    if cfg["loss_agg_mode"] not in LOSS_TYPES:
        raise InputError(f"train.loss_agg_mode: {cfg['loss_agg_mode']!r} is not one of {list(LOSS_TYPES)}")
    if cfg["engine"] == "trl" and LOSS_TYPES[cfg["loss_agg_mode"]] is None:
        raise InputError(f"train.loss_agg_mode: {cfg['loss_agg_mode']!r} is verl-only (TRL has no such loss_type); "
                         f"use one of {[k for k, v in LOSS_TYPES.items() if v]}")
    for side in ("low", "high"):
        value = cfg["clip_ratio"][side]
        if isinstance(value, bool) or not isinstance(value, (int, float)) or not value > 0:
            raise InputError(f"train.clip_ratio.{side}: expected a number > 0, got {value!r}")
    check_select(cfg)
    from llmrnn.train.tracking import report_to

    report_to(cfg)  # one line for an unknown tracker
    if cfg["trl"]["cpu_bf16"] not in (True, False, "auto"):
        raise InputError(f"train.trl.cpu_bf16: expected true, false or auto, got {cfg['trl']['cpu_bf16']!r}")
    if cfg["lr_scheduler"] not in SCHEDULERS:
        raise InputError(f"train.lr_scheduler: {cfg['lr_scheduler']!r} is not one of {list(SCHEDULERS)}")
    for path in ("group_size", "epochs", "max_prompt_length", "max_response_length", "n_gpus_per_node",
                 "nnodes", "batch.train", "batch.mini", "batch.micro_per_gpu", "lora.rank"):
        value = get(cfg, path)
        if not isinstance(value, int) or isinstance(value, bool) or value < 1:
            raise InputError(f"train.{path}: expected a positive integer, got {value!r}")
    if not cfg["lora"]["target_modules"]:
        raise InputError("train.lora.target_modules: empty list")
    return Train(cfg)


def check_select(cfg: dict) -> None:
    """train.select best_val chooses among SAVED steps by their val reward, so every saved step must be
    validated. TRL validates at every save itself (llmrnn.train.trl_engine) and keeps the best checkpoint
    through save_total_limit; verl validates every test_freq steps and at the last one, so its saves must
    fall on validation steps, and it must keep every checkpoint (it rotates them without regard to val)."""
    if cfg["select"] not in SELECT:
        raise InputError(f"train.select: {cfg['select']!r} is not one of {list(SELECT)}")
    if cfg["select"] != "best_val":
        return
    save, test = int(cfg["save_freq"] or 0), int(cfg["test_freq"] or 0)
    if test < 1:
        raise InputError("train.select: best_val needs validation: set train.test_freq > 0")
    if cfg["engine"] != "verl":
        return
    if save < 1 or save % test:
        raise InputError(
            f"train.select: best_val with engine verl needs every saved step validated, but train.save_freq={save} "
            f"is not a multiple of train.test_freq={test}: set save_freq to a multiple of test_freq"
        )
    if cfg["keep_last"] is not None:
        raise InputError(
            f"train.select: best_val with engine verl needs every checkpoint kept (train.keep_last: null, not "
            f"{cfg['keep_last']}): verl deletes old checkpoints without regard to their val reward"
        )


def get(cfg: dict, dotted: str) -> Any:
    node: Any = cfg
    for part in dotted.split("."):
        node = node[part]
    return node


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


def geometry(cfg: dict, engine: str | None = None) -> Geometry:
    """Check train x G vs mini/micro x GPUs the way verl's workers do (and TRL's GRPOConfig)."""
    engine = engine or cfg["engine"]
    n_gpus = 1 if engine == "trl" else cfg["n_gpus_per_node"] * cfg["nnodes"]
    g = cfg["group_size"]
    train, mini, micro = cfg["batch"]["train"], cfg["batch"]["mini"], cfg["batch"]["micro_per_gpu"]
    problems: list[str] = []
    if engine == "trl" and g < 2:
        problems.append(f"train.group_size={g}: GRPO needs at least 2 rollouts per prompt (TRL refuses 1)")
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
        tp = cfg["rollout"]["tensor_parallel"]
        if cfg["n_gpus_per_node"] % tp:
            problems.append(
                f"train.rollout.tensor_parallel={tp} does not divide train.n_gpus_per_node={cfg['n_gpus_per_node']}"
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


def steps_per_epoch(cfg: dict, n_rows: int) -> int:
    """verl's train dataloader uses drop_last=True; TRL's RepeatSampler drops the partial batch too."""
    return n_rows // cfg["batch"]["train"]


def planned_steps(cfg: dict, n_rows: int) -> int:
    """Total rollout steps the run must reach (verl: len(dataloader) x epochs, capped by total_steps)."""
    total = steps_per_epoch(cfg, n_rows) * cfg["epochs"]
    if cfg.get("total_steps"):
        total = min(total, int(cfg["total_steps"]))
    return total


def lr_at(cfg: dict, step: int, total: int) -> float:
    """Learning rate at optimizer step `step` (1-based) for the configured schedule (verl and TRL agree)."""
    lr, warm = float(cfg["lr"]), int(cfg["warmup_steps"] or 0)
    if warm and step <= warm:
        return lr * step / warm
    if cfg["lr_scheduler"] == "cosine" and total > warm:
        progress = (step - warm) / max(1, total - warm)
        return lr * 0.5 * (1 + math.cos(math.pi * progress))
    return lr


_PF = Preflight().model_dump()  # the defaults' one home: llmrnn.settings


@dataclass(frozen=True)
class PreflightConfig:
    """Config section `preflight` (docs/configuration.md): the preflight's checks, and the fallback guard
    that training keeps with the same threshold (max_fallback_rate over fallback_window)."""

    rows: int = _PF["rows"]
    seed: int = _PF["seed"]
    max_fallback_rate: float = _PF["max_fallback_rate"]
    fallback_window: int = _PF["fallback_window"]  # judged samples the training-time guard looks back over
    min_distinct_rewards: int = _PF["min_distinct_rewards"]
    on_problem: str = _PF["on_problem"]  # fail | warn
    # judge agreement: does the judge's reward rank a patient's reference memory above a wrong one?
    agreement_pairs: int = _PF["agreement_pairs"]
    agreement_warn_below: float = _PF["agreement_warn_below"]  # a warning below this share of pairs ranked right
    agreement_fail_below: float = _PF["agreement_fail_below"]  # a problem (on_problem) below this: a coin

    @classmethod
    def from_dict(cls, value: dict | None) -> PreflightConfig:
        value = dict(value or {})
        allowed = {f.name for f in fields(cls)}
        unknown = set(value) - allowed
        if unknown:
            raise InputError(f"preflight: unknown key(s) {sorted(unknown)}; allowed: {sorted(allowed)}")
        cfg = cls(**value)
        if cfg.on_problem not in ("fail", "warn"):
            raise InputError(f"preflight.on_problem: {cfg.on_problem!r} is not one of fail, warn")
        if cfg.rows < 1:
            raise InputError("preflight.rows: must be >= 1")
        if cfg.fallback_window < 1:
            raise InputError("preflight.fallback_window: must be >= 1")
        if cfg.agreement_pairs < 0:
            raise InputError("preflight.agreement_pairs: must be >= 0 (0 = no agreement check)")
        if not 0 <= cfg.agreement_fail_below <= cfg.agreement_warn_below <= 1:
            raise InputError(
                f"preflight.agreement_fail_below ({cfg.agreement_fail_below}) <= agreement_warn_below "
                f"({cfg.agreement_warn_below}) must both lie in [0, 1]"
            )
        return cfg
