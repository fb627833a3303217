"""Stage `report`: every plot of the workflow, for `snakemake --report`.

`llmrnn report plots` (rule eval_plots), from RUN/eval/metrics.json + comparison.json:
  acc_bars.png        Acc@1 / Acc@5 per variant with Wilson 95% CIs
  acc_by_visit.png    accuracy by visit index per variant (does memory help as visits accumulate?)
  memory_recall.png   memory recall of the next visit's diagnoses per variant and by visit, with the paired
                      trained-vs-base difference (bootstrap CI, Wilcoxon p) in the title
  memory_specificity.png  memory recall against the patient's own visits vs other patients' (the control),
                      with the trained-vs-base test on the gap in the title
  summary.tsv         one row per variant: Acc@1/Acc@5 with CIs and, vs base, the difference, CI and McNemar p
  summary.html        the same table as a page (the report shows HTML inline, a TSV only as a download)
`llmrnn report overview` (rule report_overview): the report's landing page (llmrnn.overview)
`llmrnn report agreement` (rule judge_agreement_plot), from RUN/judge/agreement.json:
  judge_agreement.png how often the judge ranks a patient's reference memory above a wrong one (Wilson CI)
`llmrnn report training` (rule train_plots), from RUN/train/metrics.jsonl (llmrnn.train.metrics rows):
  reward.png          train reward mean +- within-step std, the val reward, and the chosen checkpoint (summary.json)
  kl.png              KL of the policy to the frozen base (a note instead when the loss has no KL term)
  truncation.png      share of rollouts cut at max_response_length (train and val) and mean response length
"""

from __future__ import annotations

import argparse
import logging
import sys
from pathlib import Path
from typing import Any

from llmrnn import html_table, io
from llmrnn.benchmarks import cost_html, cost_table, read_benchmarks, stage_costs
from llmrnn.check import load_config
from llmrnn.cli import json_arg
from llmrnn.cost_plan import plan_stages, plan_table, summary_line
from llmrnn.errors import InputError
from llmrnn.overview import headline, write_overview
from llmrnn.plots import pyplot, save_png
from llmrnn.reward import mode_named
from llmrnn.runconfig import configfiles_for
from llmrnn.stats import wilson_ci

log = logging.getLogger(__name__)

COLORS = {"base": "#7f7f7f", "trained": "#1f77b4", "zero_shot": "#ff7f0e", "full_history": "#2ca02c",
          "memprompt": "#d62728"}


def plot_accuracy(metrics: dict, out: str | Path) -> None:
    plt = pyplot()
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
    save_png(fig, out)
    plt.close(fig)


def plot_by_visit(metrics: dict, out: str | Path) -> None:
    plt = pyplot()
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
    save_png(fig, out)
    plt.close(fig)


def plot_memory_recall(metrics: dict, comparison: dict, out: str | Path) -> None:
    plt = pyplot()
    fig, axes = plt.subplots(1, 2, figsize=(9, 3.6))
    recall = {v: m.get("memory_recall") for v, m in metrics["variants"].items()}
    shown = [v for v, r in recall.items() if r]
    axes[0].bar(range(len(shown)), [recall[v]["value"] for v in shown], color=[COLORS.get(v, "#9467bd") for v in shown],
                edgecolor="black", alpha=0.8)
    for i, v in enumerate(shown):
        axes[0].text(i, recall[v]["value"] + 0.02, f"{recall[v]['value']:.2f}", ha="center", fontsize=8)
    axes[0].set_xticks(range(len(shown)), shown)
    axes[0].set_ylim(0, 1.05)
    axes[0].set_ylabel("share of next-visit diagnoses named")
    for v in shown:
        pts = sorted((int(t), x) for t, x in recall[v]["by_visit_index"].items())
        axes[1].plot([t + 1 for t, _ in pts], [x for _, x in pts], marker="o", label=v, color=COLORS.get(v))
    axes[1].set_xlabel("visit number (memory written before it)")
    axes[1].set_ylim(-0.05, 1.05)
    axes[1].grid(alpha=0.3)
    axes[1].legend(fontsize=8)
    fig.suptitle(_tested_title("Held-out memory recall", comparison, "memory_recall", ": trained - base"),
                 fontsize=9)
    save_png(fig, out)
    plt.close(fig)


def _tested_title(title: str, comparison: dict, metric: str, lead: str) -> str:
    """A plot title with the trained-vs-base paired test of `metric` (comparison.json), when there is one."""
    c = (comparison.get("comparisons", {}).get("trained") or {}).get(metric)
    if not c:
        return title
    lo, hi = c["ci95"]
    return (f"{title}{lead} = {_fmt(c['diff'])} [95% CI {_fmt(lo)}, {_fmt(hi)}], "
            f"Wilcoxon p = {_fmt(c['wilcoxon']['p_value'], 4)}, n = {c['n_pairs']}")


def plot_specificity(metrics: dict, comparison: dict, out: str | Path) -> None:
    """Memory recall against the patient's own next visits vs against other patients' (the control), per
    variant, with the trained-vs-base test on the gap in the title."""
    plt = pyplot()
    spec = {v: m.get("memory_specificity") for v, m in metrics["variants"].items()}
    shown = [v for v, s in spec.items() if s]
    fig, ax = plt.subplots(figsize=(max(4.5, 1.8 * len(shown) + 2), 3.6))
    width = 0.38
    for j, (key, label) in enumerate((("own_recall", "own patient's next visits"),
                                      ("other_recall", "other patients' visits (control)"))):
        xs = [i + (j - 0.5) * width for i in range(len(shown))]
        vals = [spec[v][key] for v in shown]
        ax.bar(xs, vals, width, label=label, color=[COLORS.get(v, "#9467bd") for v in shown],
               alpha=0.85 if j == 0 else 0.35, hatch="" if j == 0 else "//", edgecolor="black")
        for x, v in zip(xs, vals):
            ax.text(x, v + 0.02, f"{v:.2f}", ha="center", va="bottom", fontsize=8)
    for i, v in enumerate(shown):
        ax.text(i, -0.12, f"gap {spec[v]['gap']:+.2f}", ha="center", fontsize=8, transform=ax.get_xaxis_transform())
    ax.set_xticks(range(len(shown)), shown)
    ax.set_ylim(0, 1.1)
    ax.set_ylabel("share of visit diagnoses named")
    ax.legend(loc="upper left", fontsize=8)
    ax.set_title(_tested_title("Memory specificity: own vs other patients' visits", comparison,
                               "memory_specificity", "\ngap trained - base"), fontsize=9)
    save_png(fig, out)
    plt.close(fig)


def plot_reward(rows: list[dict], out: str | Path, checkpoint: dict | None = None) -> None:
    """Train reward mean +- within-step std, and the val reward, per step; the chosen checkpoint marked."""
    plt = pyplot()
    train = [r for r in rows if r["kind"] == "train" and r.get("reward_mean") is not None]
    val = [r for r in rows if r["kind"] == "val" and r.get("val_reward_mean") is not None]
    fig, ax = plt.subplots(figsize=(6, 3.5))
    if train:
        xs = [r["step"] for r in train]
        ys = [r["reward_mean"] for r in train]
        sd = [r.get("reward_std") or 0.0 for r in train]
        ax.plot(xs, ys, marker=".", label="train reward (mean)")
        ax.fill_between(xs, [y - s for y, s in zip(ys, sd)], [y + s for y, s in zip(ys, sd)], alpha=0.2,
                        label="+- std within step")
    if val:
        ax.plot([r["step"] for r in val], [r["val_reward_mean"] for r in val], marker="o", label="val reward")
    title = "GRPO reward"
    if checkpoint and checkpoint.get("step") is not None:
        ax.axvline(checkpoint["step"], color="black", linestyle="--", alpha=0.6,
                   label=f"chosen checkpoint: step {checkpoint['step']} ({checkpoint.get('select')})")
        title += f"\n{checkpoint.get('why', '')}"
    ax.set_xlabel("step")
    ax.set_ylabel("reward")
    ax.set_title(title, fontsize=8)
    ax.legend(fontsize=8)
    save_png(fig, out)
    plt.close(fig)


def plot_kl(rows: list[dict], out: str | Path) -> None:
    plt = pyplot()
    kl = [(r["step"], r["kl"]) for r in rows if r["kind"] == "train" and r.get("kl") is not None]
    fig, ax = plt.subplots(figsize=(6, 3.5))
    if kl:
        ax.plot(*zip(*kl), marker=".", color="tab:red")
    else:  # TRL logs no KL when train.kl.coef is 0 (no reference-model forward)
        ax.text(0.5, 0.5, "no KL logged: the loss has no KL term (train.kl.coef 0)", ha="center",
                va="center", transform=ax.transAxes)
    ax.set_xlabel("step")
    ax.set_ylabel("KL to reference")
    ax.set_title("KL (policy vs frozen base)")
    save_png(fig, out)
    plt.close(fig)


def plot_truncation(rows: list[dict], out: str | Path) -> None:
    """Truncation rate (rollouts cut at max_response_length) of train and val rollouts, and the mean
    response length on a second axis: memories that never end never parse."""
    plt = pyplot()
    series = [("train", "truncation_rate", "response_length_mean"),
              ("val", "val_truncation_rate", "val_response_length_mean")]
    fig, ax = plt.subplots(figsize=(6, 3.5))
    length_ax = ax.twinx()
    for kind, rate_key, len_key in series:
        picked = [r for r in rows if r["kind"] == kind and r.get(rate_key) is not None]
        if picked:
            xs = [r["step"] for r in picked]
            ax.plot(xs, [r[rate_key] for r in picked], marker="o" if kind == "val" else ".",
                    label=f"{kind} truncation rate")
            lengths = [(r["step"], r[len_key]) for r in picked if r.get(len_key) is not None]
            if lengths:
                length_ax.plot(*zip(*lengths), linestyle=":", alpha=0.6, label=f"{kind} mean length")
    ax.set_ylim(0, 1)
    ax.set_xlabel("step")
    ax.set_ylabel("truncated share")
    length_ax.set_ylabel("tokens")
    ax.set_title("Rollouts cut at max_response_length")
    handles = ax.get_legend_handles_labels()[0] + length_ax.get_legend_handles_labels()[0]
    if handles:
        ax.legend(handles=handles, fontsize=8)
    save_png(fig, out)
    plt.close(fig)


def plot_agreement(agreement: dict, out: str | Path) -> None:
    """Judge agreement: the share of pairs where the judge scored a patient's reference memory above a wrong
    one, overall and by kind of wrong memory, with the Wilson 95% interval and the warn/fail thresholds."""
    plt = pyplot()
    kinds = agreement.get("by_kind") or {}
    labels = ["all", *kinds]
    counts = [(agreement.get("agreed", 0), agreement.get("pairs", 0))] + [(k["agreed"], k["pairs"]) for k in kinds.values()]
    vals = [a / n if n else 0.0 for a, n in counts]
    cis = [wilson_ci(a, n) for a, n in counts]
    fig, ax = plt.subplots(figsize=(6, 3.6))
    err = [[max(0.0, v - c[0]) for v, c in zip(vals, cis)], [max(0.0, c[1] - v) for v, c in zip(vals, cis)]]
    ax.bar(range(len(labels)), vals, yerr=err, capsize=4, edgecolor="black",
           color=["#1f77b4"] + ["#aec7e8"] * len(kinds))
    for i, ((a, n), v) in enumerate(zip(counts, vals)):
        ax.text(i, v + 0.02, f"{a}/{n}", ha="center", va="bottom", fontsize=8)
    for key, style, name in (("warn_below", ":", "warn below"), ("fail_below", "--", "fail below")):
        if agreement.get(key) is not None:
            ax.axhline(agreement[key], linestyle=style, color="tab:red", alpha=0.7, label=f"{name} {agreement[key]:.0%}")
    ax.set_xticks(range(len(labels)), [x.replace("_", "\n") for x in labels], fontsize=8)
    ax.set_ylim(0, 1.1)
    ax.set_ylabel("reference memory ranked above the wrong one")
    ax.legend(fontsize=7, loc="upper left", bbox_to_anchor=(1.0, 1.0))  # off the bars and their labels
    title = (f"Judge agreement ({agreement.get('mode')}, {agreement.get('judge_model') or 'judge'}): "
             f"{_fmt(agreement.get('rate'), 2)} [95% CI {_fmt(agreement['ci95'][0], 2)}, {_fmt(agreement['ci95'][1], 2)}], "
             f"ties {agreement.get('ties', 0)}: {agreement.get('verdict')}")
    training = mode_named(agreement.get("training_reward_mode"))
    if training is not None and training.agreement_plot_note:  # training paid another reward than this judge
        title += "\n" + training.agreement_plot_note
    ax.set_title(title, fontsize=8)
    save_png(fig, out)
    plt.close(fig)


def _fmt(x: Any, digits: int = 3) -> str:
    return "" if x is None else f"{x:.{digits}f}"


def summary_rows(metrics: dict, comparison: dict) -> tuple[list[str], list[list[str]]]:
    """The summary table's header and one row per variant (summary.tsv and summary.html)."""
    head = ["variant", "n", "acc@1", "acc@1 95% CI", "acc@5", "acc@5 95% CI",
            "acc@1 diff vs base", "diff 95% CI", "McNemar p (acc@1)",
            "acc@5 diff vs base", "diff 95% CI", "McNemar p (acc@5)",
            "memory recall", "recall diff vs base", "diff 95% CI", "Wilcoxon p (recall)",
            "other-patient recall", "specificity gap", "gap diff vs base", "diff 95% CI", "Wilcoxon p (gap)"]
    rows = []
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
        row.append(_fmt((m.get("memory_recall") or {}).get("value")))
        mr = (c or {}).get("memory_recall")
        row += ([_fmt(mr["diff"]), f"[{_fmt(mr['ci95'][0])}, {_fmt(mr['ci95'][1])}]", _fmt(mr["wilcoxon"]["p_value"], 4)]
                if mr else ["", "", ""])
        spec = m.get("memory_specificity") or {}
        row += [_fmt(spec.get("other_recall")), _fmt(spec.get("gap"))]
        ms = (c or {}).get("memory_specificity")
        row += ([_fmt(ms["diff"]), f"[{_fmt(ms['ci95'][0])}, {_fmt(ms['ci95'][1])}]", _fmt(ms["wilcoxon"]["p_value"], 4)]
                if ms else ["", "", ""])
        rows.append(row)
    return head, rows


def summary_table(metrics: dict, comparison: dict) -> str:
    head, rows = summary_rows(metrics, comparison)
    return "".join("\t".join(r) + "\n" for r in (head, *rows))


def summary_html(metrics: dict, comparison: dict) -> str:
    """The summary table as a page: the report shows it inline (summary.tsv only as a download)."""
    head, rows = summary_rows(metrics, comparison)
    return html_table.page("Held-out evaluation: summary", html_table.table(head, rows, numbers=True))


def _cmd_plots(args: argparse.Namespace) -> None:
    for path in (args.metrics, args.comparison):
        if not Path(path).is_file():
            raise InputError(f"{path}: not found (run the evaluation first: snakemake eval_heldout)")
    metrics = io.read_json(args.metrics)
    comparison = io.read_json(args.comparison)
    plot_accuracy(metrics, args.bars)
    plot_by_visit(metrics, args.by_visit)
    plot_memory_recall(metrics, comparison, args.memory_recall)
    if args.specificity:
        plot_specificity(metrics, comparison, args.specificity)
    io.write_text(args.summary, summary_table(metrics, comparison))
    if args.summary_html:
        io.write_text(args.summary_html, summary_html(metrics, comparison))
    log.info("wrote %s, %s, %s, %s, %s, %s", args.bars, args.by_visit, args.memory_recall, args.specificity,
             args.summary, args.summary_html)


def _cmd_training(args: argparse.Namespace) -> None:
    if not Path(args.metrics).is_file():
        raise InputError(f"{args.metrics}: not found (run the training first: snakemake train_grpo)")
    rows = io.read_jsonl(args.metrics)
    checkpoint = None
    if args.summary:
        if not Path(args.summary).is_file():
            raise InputError(f"{args.summary}: not found (the training summary names the chosen checkpoint)")
        checkpoint = io.read_json(args.summary).get("checkpoint")
    plot_reward(rows, args.reward, checkpoint)
    plot_kl(rows, args.kl)
    plot_truncation(rows, args.truncation)
    log.info("wrote %s, %s, %s", args.reward, args.kl, args.truncation)


def _cmd_agreement(args: argparse.Namespace) -> None:
    if not Path(args.agreement).is_file():
        raise InputError(f"{args.agreement}: not found (run the judge agreement check first: snakemake judge_agreement)")
    data = io.read_json(args.agreement)
    data = data.get("judge_agreement", data)  # preflight.json carries it under judge_agreement
    if "pairs" not in data:
        raise InputError(f"{args.agreement}: no judge agreement in it ({data.get('skipped', 'no pairs key')})")
    plot_agreement(data, args.plot)
    log.info("wrote %s", args.plot)


def plot_costs(stages: list[dict], out: str | Path) -> None:
    """Cost per stage: wall time (h), peak memory (GB) and GPU hours, one bar panel each."""
    plt = pyplot()
    names = [s["stage"] for s in stages]
    panels = [("wall time (h, all jobs)", [s["wall_s"] / 3600 for s in stages]),
              ("peak memory (GB, max_rss)", [(s["max_rss_mb"] or 0) / 1024 for s in stages]),
              ("GPU hours", [s["gpu_hours"] for s in stages])]
    fig, axes = plt.subplots(1, 3, figsize=(13, 0.45 * len(names) + 1.5), sharey=True)
    for ax, (title, values) in zip(axes, panels):
        ax.barh(names, values, color="#1f77b4")
        ax.set_title(title)
    axes[0].invert_yaxis()  # the stages top-down in DAG order (shared y axis)
    fig.suptitle("Cost per stage (benchmark files of the last run)")
    save_png(fig, out)
    plt.close(fig)


def _cmd_cost(args: argparse.Namespace) -> None:
    jobs = read_benchmarks(args.benchmarks)
    if not jobs:
        raise InputError(f"{args.benchmarks}: no benchmark files (run the workflow first)")
    stages = stage_costs(jobs)
    io.write_text(args.table, cost_table(stages))
    if args.html:
        io.write_text(args.html, cost_html(stages))
    plot_costs(stages, args.plot)
    log.info("wrote %s, %s%s (%d stages, %d jobs)", args.table, args.plot, f" and {args.html}" if args.html else "",
             len(stages), len(jobs))


def _cmd_headline(args: argparse.Namespace) -> None:
    print(f"report: {Path(args.report).resolve()}")
    print(headline(io.read_json(args.comparison)))


def _cmd_cost_plan(args: argparse.Namespace) -> None:
    config, problems = load_config(configfiles_for(args.configfile))
    if problems:
        raise InputError(f"{problems[0]} (llmrnn check lists them all)")
    benchmarks = args.benchmarks or f"logs/{config['run_name']}/benchmarks"
    stages = plan_stages(config, benchmarks)
    sys.stdout.write(plan_table(stages))
    print(summary_line(stages))


def register(sub: argparse._SubParsersAction) -> None:
    rep = sub.add_parser("report", help="plots and tables for the Snakemake report")
    rsub = rep.add_subparsers(dest="report_command", required=True)
    p = rsub.add_parser("plots", help="held-out evaluation: accuracy bars, accuracy by visit, summary table")
    p.add_argument("--metrics", required=True, help="RUN/eval/metrics.json")
    p.add_argument("--comparison", required=True, help="RUN/eval/comparison.json")
    p.add_argument("--bars", required=True, help="output: accuracy bars (png)")
    p.add_argument("--by-visit", required=True, help="output: accuracy by visit (png)")
    p.add_argument("--memory-recall", required=True, help="output: memory recall per variant and by visit (png)")
    p.add_argument("--summary", required=True, help="output: summary table (tsv)")
    p.add_argument("--summary-html", default=None, help="output: the summary table as an HTML page (the report shows "
                                                        "it inline)")
    p.add_argument("--specificity", default=None,
                   help="output: memory recall against own vs other patients' visits (png)")
    p.set_defaults(func=_cmd_plots)
    a = rsub.add_parser("agreement", help="judge agreement: reference memory ranked above wrong ones (png)")
    a.add_argument("--agreement", required=True, help="RUN/judge/agreement.json (or a preflight.json)")
    a.add_argument("--plot", required=True, help="output: judge_agreement.png")
    a.set_defaults(func=_cmd_agreement)
    t = rsub.add_parser("training", help="training curves: reward, KL and truncation per step")
    t.add_argument("--metrics", required=True, help="RUN/train/metrics.jsonl")
    t.add_argument("--summary", default=None, help="RUN/train/summary.json (marks the chosen checkpoint)")
    t.add_argument("--reward", required=True, help="output: reward curve (png)")
    t.add_argument("--kl", required=True, help="output: KL curve (png)")
    t.add_argument("--truncation", required=True, help="output: truncation rate and response length (png)")
    t.set_defaults(func=_cmd_training)
    c = rsub.add_parser("cost", help="cost per stage: wall time, peak memory, GPU hours (tsv + png)")
    c.add_argument("--benchmarks", required=True, help="logs/RUN/benchmarks (the rules' benchmark files)")
    c.add_argument("--table", required=True, help="output: cost per stage (tsv)")
    c.add_argument("--plot", required=True, help="output: cost per stage (png)")
    c.add_argument("--html", default=None, help="output: cost per stage as an HTML table (shown in the report)")
    c.set_defaults(func=_cmd_cost)
    o = rsub.add_parser("overview", help="the report's landing page: what was trained, the headline result with "
                                         "its CI and what it rests on, what to do next (html)")
    o.add_argument("--comparison", required=True, help="RUN/eval/comparison.json")
    o.add_argument("--splits", required=True, help="RUN/splits/splits.json (the split sizes)")
    o.add_argument("--train-summary", default=None,
                   help="RUN/train/summary.json (steps, checkpoint); none with eval.trained_model")
    o.add_argument("--rubric", default=None, help="the rubric file a judged reward asked (its sha256 is shown)")
    o.add_argument("--cfg", type=json_arg, required=True, help="the config subset the page reads (JSON)")
    o.add_argument("--out", required=True, help="output: overview.html")
    o.set_defaults(func=write_overview)
    h = rsub.add_parser("headline", help="the report's path and the run's headline result, one line each")
    h.add_argument("--comparison", required=True, help="RUN/eval/comparison.json")
    h.add_argument("--report", default="report.html", help="the report snakemake --report wrote")
    h.set_defaults(func=_cmd_headline)
    cp = rsub.add_parser("cost-plan", help="before submitting: GPU-hours and wall time per stage and in all, from "
                                           "the rules' resources and earlier runs' benchmark files")
    cp.add_argument("--configfile", nargs="*", default=[],
                    help="config files layered in order, as snakemake --configfile; none: config/config.yaml")
    cp.add_argument("--benchmarks", default=None,
                    help="an earlier run's benchmark files (default: logs/<run_name>/benchmarks, where they exist)")
    cp.set_defaults(func=_cmd_cost_plan)
