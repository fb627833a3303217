"""The qa recipe's demo measured: the README's pass@k table and paired tests, from one finished run.

    snakemake all --configfile config/qa_demo.yaml      # once (results/qa_demo)
    .venv/bin/python benchmarks/qa_demo.py [--run results/qa_demo]

Prints the table of "What `config/qa_demo.yaml` measured" (greedy_pass@1 and sampling_pass@k with their
Wilson 95% CIs, per split and model) and, per split, every pair's difference with its paired-bootstrap 95%
CI and McNemar p, all read from the run's eval/metrics.json and eval/comparison.json. The wall times in
that section were taken with `time` around the snakemake command; this script prints none.
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


def table(metrics: dict) -> list[str]:
    first = next(iter(next(iter(metrics["splits"].values())).values()))
    sampling = first["sampling_pass@k"]["mode"].removeprefix("sampling: ")
    head = (f"| split | model | greedy_pass@1 (T 0, n 1), Wilson 95% CI | sampling_pass@{metrics['k']} ({sampling}), "
            "Wilson 95% CI |")
    rows = [head, "|---|---|---|---|"]
    for split, variants in metrics["splits"].items():
        for variant in sorted(variants, key=lambda v: list(NAMES).index(v) if v in NAMES else len(NAMES)):
            m = variants[variant]
            rows.append(f"| {split} | {NAMES.get(variant, variant)} | {cell(m['greedy_pass@1'])} | "
                        f"{cell(m['sampling_pass@k'])} |")
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
