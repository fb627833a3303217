"""metrics.jsonl: one row per training step (and one per validation), the same keys from both engines.

Row keys: step, kind ("train" | "val"), engine, reward_mean, reward_std, judge_fallback_rate, kl, entropy,
response_length_mean, truncation_rate (share of responses cut at max_response_length), clip_ratio,
grad_norm, lr, step_time_s (train rows); val_reward_mean, val_reward_std, val_truncation_rate,
val_response_length_mean (val rows; the last two TRL only); raw (the engine's own keys for that step,
numbers only).
"""

from __future__ import annotations

import json
import math
import os
from collections.abc import Iterable
from pathlib import Path
from typing import Any

from llmrnn import io

COMMON_KEYS = (
    "reward_mean",
    "reward_std",
    "judge_fallback_rate",
    "kl",
    "entropy",
    "response_length_mean",
    "truncation_rate",
    "clip_ratio",
    "grad_norm",
    "lr",
    "step_time_s",
)

# engine key -> common key, first match wins
TRL_MAP = {
    "reward_mean": ("reward",),
    "reward_std": ("reward_std",),
    "judge_fallback_rate": ("judge_fallback_rate", "judge/fallback_rate"),
    "kl": ("kl",),
    "entropy": ("entropy",),
    "response_length_mean": ("completions/mean_length",),
    "truncation_rate": ("completions/clipped_ratio",),
    "clip_ratio": ("clip_ratio/region_mean",),
    "grad_norm": ("grad_norm",),
    "lr": ("learning_rate",),
    "step_time_s": ("step_time_s",),
}
TRL_VAL_MAP = {
    "val_reward_mean": ("eval_reward",),
    "val_reward_std": ("eval_reward_std",),
    "val_truncation_rate": ("eval_completions/clipped_ratio",),
    "val_response_length_mean": ("eval_completions/mean_length",),
}

VERL_MAP = {
    "reward_mean": ("critic/score/mean", "critic/rewards/mean"),
    "reward_std": ("critic/score/std", "llmrnn/reward_std"),
    "judge_fallback_rate": ("llmrnn/judge_fallback_rate",),
    "kl": ("actor/kl_loss", "actor/ppo_kl"),
    "entropy": ("actor/entropy",),
    "response_length_mean": ("response_length/mean",),
    "truncation_rate": ("response_length/clip_ratio",),
    "clip_ratio": ("actor/pg_clipfrac",),
    "grad_norm": ("actor/grad_norm",),
    "lr": ("actor/lr",),
    "step_time_s": ("timing_s/step",),
}


def _num(value: Any) -> float | None:
    try:
        out = float(value)
    except (TypeError, ValueError):
        return None
    return out if math.isfinite(out) else None


def _pick(raw: dict, names: Iterable[str]) -> float | None:
    for name in names:
        if name in raw:
            value = _num(raw[name])
            if value is not None:
                return value
    return None


def numeric(raw: dict) -> dict:
    return {k: v for k, v in ((k, _num(v)) for k, v in raw.items()) if v is not None}


def trl_row(step: int, logs: dict) -> dict:
    raw = numeric(logs)
    if any(k.startswith("eval_") for k in raw):
        row = {"step": step, "kind": "val", "engine": "trl"}
        row.update({k: _pick(raw, names) for k, names in TRL_VAL_MAP.items()})
    else:
        row = {"step": step, "kind": "train", "engine": "trl"}
        row.update({k: _pick(raw, names) for k, names in TRL_MAP.items()})
    row["raw"] = raw
    return row


def verl_rows(step: int, data: dict) -> list[dict]:
    """verl logs one dict per step; validation metrics (val-core/..., val-aux/...) ride in the same dict."""
    raw = numeric(data)
    rows = []
    train = {k: v for k, v in raw.items() if not k.startswith("val-")}
    if any(k.startswith(("critic/", "actor/", "timing_s/")) for k in train):
        row = {"step": step, "kind": "train", "engine": "verl"}
        row.update({k: _pick(train, names) for k, names in VERL_MAP.items()})
        row["raw"] = train
        rows.append(row)
    val = {k: v for k, v in raw.items() if k.startswith("val-")}
    if val:
        means = [v for k, v in val.items() if k.startswith("val-core/") and "/reward/mean" in k]
        rows.append(
            {
                "step": step,
                "kind": "val",
                "engine": "verl",
                "val_reward_mean": means[0] if means else None,
                "val_reward_std": None,
                "val_truncation_rate": None,
                "val_response_length_mean": None,
                "raw": val,
            }
        )
    return rows


class MetricsWriter:
    """Appends rows to metrics.jsonl, flushed per row so progress is visible while training runs."""

    def __init__(self, path: str | os.PathLike):
        self.path = Path(path)
        self.path.parent.mkdir(parents=True, exist_ok=True)

    def truncate_after(self, step: int) -> int:
        """Drop rows past `step` (a resumed run redoes them); returns how many were dropped."""
        if not self.path.exists():
            return 0
        written = sum(1 for line in self.path.read_text(encoding="utf-8").splitlines() if line.strip())
        # a line a kill cut off is not JSON: dropped with the rows past `step`
        keep = [row for row in io.read_jsonl(self.path, skip_bad=True) if int(row.get("step", 0)) <= step]
        io.write_jsonl(self.path, keep)
        return written - len(keep)

    def append(self, row: dict) -> None:
        with open(self.path, "a", encoding="utf-8") as fh:
            fh.write(json.dumps(row, sort_keys=True) + "\n")
            fh.flush()


def progress_line(row: dict, total: int) -> str:
    def f(key: str) -> str:
        value = row.get(key)
        return "-" if value is None else f"{value:.4g}"

    if row["kind"] == "val":
        return (f"val   step {row['step']}/{total}: reward {f('val_reward_mean')}, "
                f"truncated {f('val_truncation_rate')}, len {f('val_response_length_mean')}")
    return (
        f"train step {row['step']}/{total}: reward {f('reward_mean')} +- {f('reward_std')}, kl {f('kl')}, "
        f"entropy {f('entropy')}, len {f('response_length_mean')}, grad {f('grad_norm')}, lr {f('lr')}, "
        f"{f('step_time_s')} s"
    )


# ----------------------------------------------------------------------------- the qa recipe's step metrics
# (here, below both engines: TRL's reward wrapper and verl's rollout stats log the same raw keys)
EXTRACT_METHODS = ("tag", "answer_line", "last_line", "none")  # how an answer was found (llmrnn.qa.rewards)
STEP_KEYS = ("correct", *(f"extract_{m}" for m in EXTRACT_METHODS), "high_reward_but_wrong")


def step_metrics(results: list[dict]) -> dict[str, float]:
    """Means of STEP_KEYS over a batch of compute_score results (+ the count of high_reward_but_wrong and,
    when the judge scored, its fallback rate). TRL averages a step's batches; verl's step is one batch."""
    if not results:
        return {}
    out = {f"qa/{k}": sum(float(r[k]) for r in results) / len(results) for k in STEP_KEYS}
    out["qa/high_reward_but_wrong_count"] = float(sum(float(r["high_reward_but_wrong"]) for r in results))
    judged = [bool(r["parse_fallback"]) if "parse_fallback" in r else r["judge_parse_method"] == "fallback"
              for r in results if "parse_fallback" in r or "judge_parse_method" in r]
    if judged:
        out["judge_fallback_rate"] = sum(judged) / len(judged)
    return out


def learning_problem(rows: list[dict], zero_gradient: bool = True) -> str | None:
    """One line when the logged train steps show a run that cannot have learned: no step's mean reward was a
    finite number (rewards that overflowed float32, or NaN), or (`zero_gradient`: train.fail_on_zero_gradient)
    the gradient norm was 0 at every step; such a run ends as a failure, never marked done."""
    steps = [r for r in rows if r.get("kind", "train") == "train"]
    if not steps:
        return None

    def finite(v) -> bool:
        return isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(v)

    if not any(finite(r.get("reward_mean")) for r in steps):
        return (f"train: the mean reward was not a finite number at any of {len(steps)} logged steps (NaN, or a "
                "reward so large it overflowed float32); the run learned nothing and is not complete")
    norms = [r.get("grad_norm") for r in steps if r.get("grad_norm") is not None]
    if zero_gradient and norms and len(norms) == len(steps) and all(finite(g) and g == 0 for g in norms):
        return (f"train: the gradient norm was 0 at every one of {len(steps)} logged steps (the same reward for "
                "every completion of a group gives no advantage); the run learned nothing and is not complete")
    return None
