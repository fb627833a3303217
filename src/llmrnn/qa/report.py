"""Report of the qa recipe: pass@j / maj@j curves and greedy_pass@1 of base vs SFT vs GRPO beside chance,
for `snakemake --report`.

  pass_at_k.png   per split: unbiased sampling_pass@j and sampling_maj@j for j = 1..n per variant, greedy_pass@1
                  at j = 1 (exact match, and judge-graded where a judge is configured), and the two chance
                  baselines (uniform guess, always the train split's most common answer); every line
                  labelled with its mode
  summary.tsv     one row per (split, variant, metric): value, CI, n, mode, both chance baselines; then one
                  row per pair and binary metric: difference, bootstrap CI, McNemar p
  questions.tsv   per question: the greedy answer of each variant (qualitative comparison)
"""

from __future__ import annotations

import re

from llmrnn import io
from llmrnn.plots import pyplot, save_png
from llmrnn.qa.evaluate import _variant_order

COLORS = {"base": "#7f7f7f", "sft": "#ff7f0e", "grpo": "#1f77b4"}
_CURVE = re.compile(r"sampling_(pass|maj)@(\d+)$")


def _curve(cells: dict, kind: str) -> list[tuple[int, dict]]:
    found = [(int(m.group(2)), cell) for name, cell in cells.items()
             if (m := _CURVE.match(name)) and m.group(1) == kind]
    return sorted(found, key=lambda x: x[0])


def plot_pass(metrics: dict, out: str) -> None:
    plt = pyplot()
    splits = sorted(metrics["splits"])
    fig, axes = plt.subplots(1, len(splits), figsize=(6 * len(splits), 5.6), squeeze=False)
    for ax, split in zip(axes[0], splits):
        variants = sorted(metrics["splits"][split], key=_variant_order)
        n = 0
        for i, v in enumerate(variants):
            cells = metrics["splits"][split][v]
            color = COLORS.get(v, "#9467bd")
            for kind, style in (("pass", "-o"), ("maj", "--s")):
                curve = _curve(cells, kind)
                if curve:
                    ax.plot([j for j, _ in curve], [c["value"] or 0.0 for _, c in curve], style, color=color,
                            label=f"{v} sampling {kind}@j", markersize=4)
            x = 1 + 0.06 * (i - (len(variants) - 1) / 2)  # side by side: the CIs stay readable
            for name, fmt, size, what in (("greedy_pass@1", "*", 11, "exact match"),
                                          ("judge_greedy_pass@1", "D", 6, "judge-graded")):
                g = cells.get(name)
                if g is None:  # judge-graded only where a judge is configured
                    continue
                ax.errorbar([x], [g["value"] or 0.0], yerr=[[max(0.0, (g["value"] or 0) - g["ci95"][0])],
                                                             [max(0.0, g["ci95"][1] - (g["value"] or 0))]],
                            fmt=fmt, color=color, markersize=size, capsize=4, label=f"{v} greedy_pass@1 (T=0, {what})")
            n = cells["greedy_pass@1"]["n"]
        first = metrics["splits"][split][variants[0]]
        curve = _curve(first, "pass")
        js = [j for j, _ in curve] or [1]
        chance_cells = [c for _, c in curve] or [first["greedy_pass@1"]]
        uniform = [(c.get("chance") or {}).get("uniform_guess") for c in chance_cells]
        common = [(c.get("chance") or {}).get("most_common_train_answer") for c in chance_cells]
        if all(u is not None for u in uniform):
            ax.plot(js, uniform, ":", color="black", label="chance: uniform guess (pass@j)")
        if all(c is not None for c in common):
            ax.plot(js, common, "-.", color="#d62728", label="chance: always the train's most common answer")
        ax.set_xticks(js)
        ax.set_xlabel("j (samples; unbiased estimate from n samples)")
        ax.set_ylim(0, 1.05)
        ax.set_title(f"{split} (n={n} questions)")
        judged = any("judge_greedy_pass@1" in c for c in metrics["splits"][split].values())
        ax.set_ylabel("share correct (exact match" + ("; diamonds: judge-graded)" if judged else ")"))
        ax.legend(fontsize=6, loc="upper center", bbox_to_anchor=(0.5, -0.16), ncol=2, frameon=False)
    save_png(fig, out)
    plt.close(fig)


def _fmt(value) -> str:
    return "" if value is None else f"{value:.4f}"


def summary_tsv(metrics: dict, comparison: dict) -> str:
    columns = ("split", "row", "metric", "mode", "value", "ci95_low", "ci95_high", "n", "mcnemar_p",
               "chance_uniform_guess", "chance_most_common_train_answer")
    lines = ["\t".join(columns)]
    for split, variants in sorted(metrics["splits"].items()):
        for variant in sorted(variants, key=_variant_order):
            for name, m in variants[variant].items():
                if "ci95" not in m:  # diagnostics (nondeterminism_proxy) are no score
                    continue
                chance = m.get("chance") or {}
                lines.append(f"{split}\t{variant}\t{name}\t{m['mode']}\t{_fmt(m['value'])}\t{_fmt(m['ci95'][0])}\t"
                             f"{_fmt(m['ci95'][1])}\t{m['n']}\t\t{_fmt(chance.get('uniform_guess'))}\t"
                             f"{_fmt(chance.get('most_common_train_answer'))}")
        for pair, tests in comparison["splits"].get(split, {}).items():
            for name, t in tests.items():  # METRICS, then JUDGE_METRICS where both variants were judged
                b = t["bootstrap"]
                diff = "" if b["diff"] is None else f"{b['diff']:.4f}"
                lo, hi = ("", "") if b["diff"] is None else (f"{b['ci95'][0]:.4f}", f"{b['ci95'][1]:.4f}")
                lines.append(f"{split}\t{pair}\t{name}\t{t['mode']}\t{diff}\t{lo}\t{hi}\t{t['n_pairs']}\t"
                             f"{t['mcnemar']['p_value']:.4g}\t\t")
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
