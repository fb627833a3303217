"""The demo's learning measured over training seeds: trained vs base held-out memory recall per seed.

    PATH=.venv/bin:$PATH .venv/bin/python benchmarks/demo_seeds.py --seeds 42 1 2 [--cores 2]

Needs one finished `make demo` (results/demo). For each seed S it runs the workflow as run `demo_s<S>`
with only `train.seed` changed: the stages that do not depend on the training seed (cohort, splits,
trajectories, the base model's eval shards, the judge-agreement check) are copied from results/demo
with their timestamps, so Snakemake reruns exactly train_grpo onwards (its rerun table), and the
held-out patients are the demo's own, fixed before any result. Seed 42 (the demo's) is read from results/demo itself. Prints one
line per seed: base and trained memory recall, the paired difference with its bootstrap 95% CI, the
Wilcoxon p, the patient-specificity control (each memory's recall against other patients' visits: the
gap own - other for base and trained, and trained - base on the gap with its Wilcoxon p), the val reward
before and after training, the checkpoint merged (train.select) and the wall time of the run.
"""

from __future__ import annotations

import argparse
import json
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
SHARED = ["cohort", "splits", "trajectories", "eval/base", "judge"]  # judge: the agreement check (no train.seed in it)


def seed_run(seed: int, cores: int) -> tuple[str, float]:
    run = f"demo_s{seed}"
    src, dst = REPO / "results" / "demo", REPO / "results" / run
    for part in SHARED:
        if not (dst / part).exists():
            shutil.copytree(src / part, dst / part, copy_function=shutil.copy2)  # copy2 keeps mtimes
    with tempfile.NamedTemporaryFile("w", suffix=".yaml", delete=False) as fh:
        fh.write(f"run_name: {run}\ntrain:\n  seed: {seed}\n")
    t0 = time.time()
    subprocess.run(
        ["snakemake", "--profile", "profiles/local", "--cores", str(cores), "all",
         "--configfile", "config/config.yaml", fh.name],
        cwd=REPO, check=True,
    )
    return run, time.time() - t0


def train_rows(run: str) -> list[dict]:
    return [json.loads(x) for x in (REPO / "results" / run / "train" / "metrics.jsonl").read_text().splitlines()]


def val_curve(run: str) -> list[float]:
    return [r["val_reward_mean"] for r in train_rows(run) if r.get("val_reward_mean") is not None]


def truncation(run: str) -> str:
    """Rollouts cut at max_response_length: mean over the training steps, and at the last validation."""
    rows = train_rows(run)
    train = [r["truncation_rate"] for r in rows if r.get("kind") == "train" and r.get("truncation_rate") is not None]
    val = [r["val_truncation_rate"] for r in rows if r.get("val_truncation_rate") is not None]
    mean = sum(train) / len(train) if train else float("nan")
    return f"truncated: train mean {mean:.0%}, val last {val[-1] if val else float('nan'):.0%}"


def specificity(comparison: dict) -> str:
    """Own- minus other-patient memory recall (the control), base and trained, and the paired test on the gap."""
    ms = comparison["comparisons"]["trained"].get("memory_specificity")
    if not ms:
        return "specificity: n/a"
    return (f"other-patient recall base {ms['a_other_recall']:.3f} trained {ms['b_other_recall']:.3f}; "
            f"specificity gap base {ms['a']:+.3f} trained {ms['b']:+.3f} diff {ms['diff']:+.3f} "
            f"[95% CI {ms['ci95'][0]:+.3f}, {ms['ci95'][1]:+.3f}] Wilcoxon p {ms['wilcoxon']['p_value']:.4f}")


def chosen_step(run: str) -> str:
    """The checkpoint merged (train/summary.json `checkpoint`: step, train.select, its val reward)."""
    path = REPO / "results" / run / "train" / "summary.json"
    chosen = json.loads(path.read_text()).get("checkpoint") if path.is_file() else None
    if not chosen:
        return "checkpoint: n/a"
    val = chosen.get("val_reward")
    return f"checkpoint step {chosen['step']} ({chosen['select']}, val {'n/a' if val is None else f'{val:.3f}'})"


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--seeds", type=int, nargs="+", default=[42, 1, 2])
    ap.add_argument("--cores", type=int, default=2)
    args = ap.parse_args()
    if not (REPO / "results" / "demo" / "eval" / "comparison.json").is_file():
        sys.exit("results/demo/eval/comparison.json missing: run `make demo` first")
    for seed in args.seeds:
        run, wall = ("demo", float("nan")) if seed == 42 else seed_run(seed, args.cores)
        c = json.loads((REPO / "results" / run / "eval" / "comparison.json").read_text())
        mr = c["comparisons"]["trained"]["memory_recall"]
        val = val_curve(run)
        print(
            f"seed {seed}: memory recall base {mr['a']:.3f} trained {mr['b']:.3f} diff {mr['diff']:+.3f} "
            f"[95% CI {mr['ci95'][0]:+.3f}, {mr['ci95'][1]:+.3f}] Wilcoxon p {mr['wilcoxon']['p_value']:.4f} "
            f"(n = {mr['n_pairs']}); {specificity(c)}; val reward {val[0] if val else float('nan'):.3f} -> "
            f"{val[-1] if val else float('nan'):.3f}; {chosen_step(run)}; {truncation(run)}; run {wall:.0f} s",
            flush=True,
        )


if __name__ == "__main__":
    main()
