"""Stage `report`: plots of the held-out evaluation and of training, for `snakemake --report`.

  acc_bars.png        Acc@1 / Acc@5 per variant with Wilson 95% CIs (from RUN/eval/metrics.json)
  acc_by_visit.png    accuracy by visit index per variant (does memory help as visits accumulate?)
  training.png        reward and KL per training step (from RUN/train/metrics.jsonl; keys read defensively)
  summary.tsv         one row per variant: Acc@1/Acc@5 with CIs and, vs base, the difference, CI and McNemar p
"""

from __future__ import annotations

import argparse
import logging
import math
from pathlib import Path
from typing import Any

from llmrnn import io
from llmrnn.errors import InputError

log = logging.getLogger(__name__)

# Accepted spellings of each training curve in metrics.jsonl (TRL and verl name them differently).
TRAIN_KEYS = {
    "step": ["step", "global_step", "training/global_step"],
    "reward": ["reward_mean", "reward", "critic/score/mean", "critic/rewards/mean", "rewards/mean"],
    "kl": ["kl", "actor/kl_loss", "actor/ppo_kl", "objective/kl", "kl_mean"],
}
COLORS = {"base": "#7f7f7f", "trained": "#1f77b4", "zero_shot": "#ff7f0e", "full_history": "#2ca02c"}


def _plt():
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt


def _save(fig, path: str | Path) -> None:
    with io.atomic_path(path) as tmp:
        fig.savefig(tmp, format="png", dpi=120, bbox_inches="tight")


def plot_accuracy(metrics: dict, out: str | Path) -> None:
    plt = _plt()
    variants = list(metrics["variants"])
    fig, ax = plt.subplots(figsize=(max(4.5, 1.6 * len(variants) + 2), 3.6))
    width = 0.38
    for j, (metric, label) in enumerate((("acc_at_1", "Acc@1"), ("acc_at_5", "Acc@5"))):
        xs = [i + (j - 0.5) * width for i in range(len(variants))]
        vals = [metrics["variants"][v][metric]["value"] or 0.0 for v in variants]
        cis = [metrics["variants"][v][metric]["ci95"] for v in variants]
        err = [[max(0.0, v - c[0]) for v, c in zip(vals, cis)], [max(0.0, c[1] - v) for v, c in zip(vals, cis)]]
        ax.bar(xs, vals, width, yerr=err, capsize=4, label=label, alpha=0.85 if j else 0.6,
               color=[COLORS.get(v, "#9467bd") for v in variants], hatch="" if j == 0 else "//",
               edgecolor="black")
        for x, v in zip(xs, vals):
            ax.text(x, v + 0.02, f"{v:.2f}", ha="center", va="bottom", fontsize=8)
    n = {metrics["variants"][v]["n_patients"] for v in variants}
    ax.set_xticks(range(len(variants)), variants)
    ax.set_ylim(0, 1.1)
    ax.set_ylabel("accuracy at the last visit")
    ax.set_title(f"Held-out accuracy (n = {', '.join(map(str, sorted(n)))} patients, 95% Wilson CI)")
    ax.legend(loc="upper left", fontsize=8)
    _save(fig, out)
    plt.close(fig)


def plot_by_visit(metrics: dict, out: str | Path) -> None:
    plt = _plt()
    fig, axes = plt.subplots(1, 2, figsize=(9, 3.6), sharey=True)
    for ax, (metric, label) in zip(axes, (("acc_at_1", "Acc@1"), ("acc_at_5", "Acc@5"))):
        for variant, m in metrics["variants"].items():
            rows = [r for r in m["by_visit_index"] if r[metric] is not None]
            ax.plot([r["visit_index"] + 1 for r in rows], [r[metric] for r in rows], marker="o", label=variant,
                    color=COLORS.get(variant))
        ax.set_xlabel("visit number")
        ax.set_title(f"{label} by visit")
        ax.set_ylim(-0.05, 1.05)
        ax.grid(alpha=0.3)
    axes[0].set_ylabel("accuracy")
    axes[1].legend(fontsize=8)
    _save(fig, out)
    plt.close(fig)


def _pick(row: dict, names: list[str]) -> float | None:
    for name in names:
        value = row.get(name)
        if isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value):
            return float(value)
    return None


def read_training_curves(path: str | Path | None) -> dict[str, list[tuple[float, float]]]:
    """{reward: [(step, value)], kl: [...]} from metrics.jsonl; missing file, bad lines or keys are skipped."""
    curves: dict[str, list[tuple[float, float]]] = {"reward": [], "kl": []}
    if path is None or not Path(path).is_file():
        return curves
    for index, row in enumerate(io.read_jsonl(path, skip_bad=True)):
        if not isinstance(row, dict):
            continue
        step = _pick(row, TRAIN_KEYS["step"])
        step = float(index) if step is None else step
        for name in ("reward", "kl"):
            value = _pick(row, TRAIN_KEYS[name])
            if value is not None:
                curves[name].append((step, value))
    return curves


def plot_training(metrics_jsonl: str | Path | None, out: str | Path) -> None:
    plt = _plt()
    curves = read_training_curves(metrics_jsonl)
    fig, axes = plt.subplots(1, 2, figsize=(9, 3.4))
    for ax, (name, label) in zip(axes, (("reward", "mean reward"), ("kl", "KL to reference"))):
        points = curves[name]
        if points:
            ax.plot([p[0] for p in points], [p[1] for p in points], marker="." if len(points) < 50 else None)
        else:
            ax.text(0.5, 0.5, f"no {name} values in\n{metrics_jsonl}", ha="center", va="center",
                    transform=ax.transAxes, fontsize=8)
        ax.set_xlabel("training step")
        ax.set_title(label)
        ax.grid(alpha=0.3)
    _save(fig, out)
    plt.close(fig)


def _fmt(x: Any, digits: int = 3) -> str:
    return "" if x is None else f"{x:.{digits}f}"


def summary_table(metrics: dict, comparison: dict) -> str:
    head = ["variant", "n", "acc@1", "acc@1 95% CI", "acc@5", "acc@5 95% CI",
            "acc@1 diff vs base", "diff 95% CI", "McNemar p (acc@1)",
            "acc@5 diff vs base", "diff 95% CI", "McNemar p (acc@5)"]
    lines = ["\t".join(head)]
    for v, m in metrics["variants"].items():
        row = [v, str(m["n_patients"])]
        for metric in ("acc_at_1", "acc_at_5"):
            row += [_fmt(m[metric]["value"]), f"[{_fmt(m[metric]['ci95'][0])}, {_fmt(m[metric]['ci95'][1])}]"]
        c = comparison.get("comparisons", {}).get(v)
        for metric in ("acc_at_1", "acc_at_5"):
            if c:
                lo, hi = c[metric]["ci95"]
                row += [_fmt(c[metric]["diff"]), f"[{_fmt(lo)}, {_fmt(hi)}]", _fmt(c[metric]["mcnemar"]["p_value"], 4)]
            else:
                row += ["", "", ""]
        lines.append("\t".join(row))
    return "\n".join(lines) + "\n"


def _cmd_plots(args: argparse.Namespace) -> None:
    for path in (args.metrics, args.comparison):
        if not Path(path).is_file():
            raise InputError(f"{path}: not found (run the evaluation first: snakemake eval_heldout)")
    metrics = io.read_json(args.metrics)
    comparison = io.read_json(args.comparison)
    out = Path(args.outdir)
    out.mkdir(parents=True, exist_ok=True)
    plot_accuracy(metrics, out / "acc_bars.png")
    plot_by_visit(metrics, out / "acc_by_visit.png")
    plot_training(args.train_metrics, out / "training.png")
    io.write_text(out / "summary.tsv", summary_table(metrics, comparison))
    log.info("wrote plots and summary to %s", out)


def register(sub: argparse._SubParsersAction) -> None:
    rep = sub.add_parser("report", help="plots and tables for the Snakemake report")
    rsub = rep.add_subparsers(dest="report_command", required=True)
    p = rsub.add_parser("plots", help="accuracy bars, accuracy by visit, training curves, summary table")
    p.add_argument("--metrics", required=True, help="RUN/eval/metrics.json")
    p.add_argument("--comparison", required=True, help="RUN/eval/comparison.json")
    p.add_argument("--train-metrics", default=None, help="RUN/train/metrics.jsonl (optional)")
    p.add_argument("--outdir", required=True, help="writes acc_bars.png, acc_by_visit.png, training.png, summary.tsv")
    p.set_defaults(func=_cmd_plots)
