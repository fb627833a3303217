"""The qa recipe's demo measured: the pass@k table of docs/results.md and paired tests, from one finished run.

    snakemake all --configfile config/qa_demo.yaml      # once (results/qa_demo)
    .venv/bin/python benchmarks/qa_demo.py [--run results/qa_demo]

Prints the QA table of docs/results.md (greedy_pass@1 with its Wilson 95% CI; the unbiased
sampling_pass@1, sampling_pass@k and sampling_maj@k with their bootstrap 95% CIs; per split and model)
and, per split, every pair's difference with its paired-bootstrap 95% CI and McNemar p, all read from the run's eval/metrics.json and eval/comparison.json. The wall time on
that page was taken with `time` around the snakemake command; this script prints none.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
NAMES = {"base": "base", "sft": "SFT", "grpo": "GRPO"}


def cell(metric: dict) -> str:
    lo, hi = metric["ci95"]
    return f"{metric['value']:.3f} [{lo:.3f}, {hi:.3f}]"


def header(k: int) -> list[str]:
    """The table's header for n = k samples per question (docs/results.md holds it with k = 4)."""
    return [f"| split | model | greedy_pass@1 | sampling_pass@1 | sampling_pass@{k} | sampling_maj@{k} |",
            "|---|---|---|---|---|---|"]


def table(metrics: dict) -> list[str]:
    """greedy_pass@1 with its Wilson CI; the unbiased sampling_pass@1 and @k and maj@k with bootstrap CIs."""
    k = metrics["k"]
    rows = header(k)
    for split, variants in metrics["splits"].items():
        for variant in sorted(variants, key=lambda v: list(NAMES).index(v) if v in NAMES else len(NAMES)):
            m = variants[variant]
            cells = [cell(m[name]) if name in m else "-"
                     for name in ("greedy_pass@1", "sampling_pass@1", f"sampling_pass@{k}", f"sampling_maj@{k}")]
            rows.append(f"| {split} | {NAMES.get(variant, variant)} | {' | '.join(cells)} |")
    return rows


def paired(comparison: dict) -> list[str]:
    lines = []
    for split, pairs in comparison["splits"].items():
        for pair, metrics in pairs.items():
            for name, test in metrics.items():
                bs = test["bootstrap"]
                lines.append(f"{split} {pair} {name}: {bs['diff']:+.3f} [{bs['ci95'][0]:.3f}, {bs['ci95'][1]:.3f}], "
                             f"McNemar p = {test['mcnemar']['p_value']:.2g} (n {test['n_pairs']})")
    return lines


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--run", default=str(REPO / "results" / "qa_demo"))
    args = ap.parse_args()
    run = Path(args.run)
    if not (run / "eval" / "comparison.json").is_file():
        sys.exit(f"{run}/eval/comparison.json missing: run `snakemake all --configfile config/qa_demo.yaml` first")
    print("\n".join(table(json.loads((run / "eval" / "metrics.json").read_text()))))
    print()
    print("\n".join(paired(json.loads((run / "eval" / "comparison.json").read_text()))))


if __name__ == "__main__":
    main()
