"""Report of the qa recipe: greedy_pass@1 and sampling_pass@k of base vs SFT vs GRPO, for `snakemake --report`.

  pass_at_k.png   both metrics per variant (per split) with Wilson 95% CIs, each labelled with its mode
  summary.tsv     one row per (split, variant, metric): value, CI, mode; then one row per pair and metric:
                  difference, bootstrap CI, McNemar p
  questions.tsv   per question: the greedy answer of each variant (qualitative comparison)
"""

from __future__ import annotations

from llmrnn import io
from llmrnn.qa.evaluate import METRICS, _variant_order
from llmrnn.report import _plt, _save

COLORS = {"base": "#7f7f7f", "sft": "#ff7f0e", "grpo": "#1f77b4"}


def plot_pass(metrics: dict, out: str) -> None:
    plt = _plt()
    splits = sorted(metrics["splits"])
    fig, axes = plt.subplots(1, len(splits), figsize=(5.5 * len(splits), 3.8), squeeze=False)
    for ax, split in zip(axes[0], splits):
        variants = sorted(metrics["splits"][split], key=_variant_order)
        width = 0.38
        for j, name in enumerate(METRICS):
            xs = [i + (j - 0.5) * width for i in range(len(variants))]
            cells = [metrics["splits"][split][v][name] for v in variants]
            vals = [c["value"] or 0.0 for c in cells]
            err = [[max(0.0, v - c["ci95"][0]) for v, c in zip(vals, cells)],
                   [max(0.0, c["ci95"][1] - v) for v, c in zip(vals, cells)]]
            label = name.replace("@k", f"@{metrics['k']}") + f" ({cells[0]['mode'].split(':')[0]})"
            ax.bar(xs, vals, width, yerr=err, capsize=4, label=label, edgecolor="black",
                   color=[COLORS.get(v, "#9467bd") for v in variants], hatch="" if j == 0 else "//")
        ax.set_xticks(range(len(variants)), variants)
        ax.set_ylim(0, 1.05)
        ax.set_title(f"{split} (n={cells[0]['n']})")
        ax.set_ylabel("share correct (exact match)")
        ax.legend(fontsize=7, loc="upper left")
    _save(fig, out)
    plt.close(fig)


def summary_tsv(metrics: dict, comparison: dict) -> str:
    lines = ["split\trow\tmetric\tmode\tvalue\tci95_low\tci95_high\tn\tmcnemar_p"]
    for split, variants in sorted(metrics["splits"].items()):
        for variant in sorted(variants, key=_variant_order):
            for name in METRICS:
                m = variants[variant][name]
                lines.append(f"{split}\t{variant}\t{name}\t{m['mode']}\t{m['value']:.4f}\t{m['ci95'][0]:.4f}\t"
                             f"{m['ci95'][1]:.4f}\t{m['n']}\t")
        for pair, tests in comparison["splits"].get(split, {}).items():
            for name in METRICS:
                t = tests[name]
                b = t["bootstrap"]
                diff = "" if b["diff"] is None else f"{b['diff']:.4f}"
                lo, hi = ("", "") if b["diff"] is None else (f"{b['ci95'][0]:.4f}", f"{b['ci95'][1]:.4f}")
                lines.append(f"{split}\t{pair}\t{name}\t{t['mode']}\t{diff}\t{lo}\t{hi}\t{t['n_pairs']}\t"
                             f"{t['mcnemar']['p_value']:.4g}")
    return "\n".join(lines) + "\n"


def questions_tsv(files: list[str]) -> str:
    answers: dict[tuple[str, str], dict[str, str]] = {}
    variants: set[str] = set()
    for path in files:
        rows = io.read_jsonl(path)
        head = rows[0]["header"]
        variants.add(head["variant"])
        for r in rows[1:]:
            cell = answers.setdefault((head["split"], r["id"]), {"answer": r["answer"]})
            mark = "ok" if r["greedy"]["correct"] else "x"
            cell[head["variant"]] = f"{mark} {r['greedy']['extracted'] or ''}".replace("\t", " ").replace("\n", " ")
    order = sorted(variants, key=_variant_order)
    lines = ["split\tid\treference\t" + "\t".join(order)]
    for (split, qid), cell in sorted(answers.items()):
        lines.append(f"{split}\t{qid}\t{cell['answer']}\t" + "\t".join(cell.get(v, "") for v in order))
    return "\n".join(lines) + "\n"


def write_report(metrics_path: str, comparison_path: str, files: list[str], plot: str, summary: str,
                 questions: str) -> list[str]:
    metrics, comparison = io.read_json(metrics_path), io.read_json(comparison_path)
    plot_pass(metrics, plot)
    io.write_text(summary, summary_tsv(metrics, comparison))
    io.write_text(questions, questions_tsv(files), mode=0o600)  # model answers to (patient-derived) questions
    return [plot, summary, questions]
