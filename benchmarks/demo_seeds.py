"""The demo's learning measured over training seeds: trained vs base held-out memory recall per seed.

    PATH=.venv/bin:$PATH .venv/bin/python benchmarks/demo_seeds.py --seeds 42 1 2 [--cores 2]

Needs one finished `make demo` (results/demo). For each seed S it runs the workflow as run `demo_s<S>`
with only `train.seed` changed: the stages that do not depend on the training seed (cohort, splits,
trajectories, the base model's eval shards) are copied from results/demo with their timestamps, so
Snakemake reruns exactly train_grpo onwards (its rerun table), and the held-out patients are the
demo's own, fixed before any result. Seed 42 (the demo's) is read from results/demo itself. Prints the
seed table of docs/results.md, one row per seed: base and trained memory recall, the
paired difference with its bootstrap 95% CI, the Wilcoxon p, the patients better / worse, the val reward
at every validation, the truncation, the patient-specificity control (each memory's recall against other
patients' visits: trained - base on the gap own - other, with its Wilcoxon p) and the checkpoint merged; the wall time of each run goes to stderr.
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


def truncation(run: str) -> tuple[float, float]:
    """Rollouts cut at max_response_length: mean over the training steps, and at the last validation."""
    rows = train_rows(run)
    train = [r["truncation_rate"] for r in rows if r.get("kind") == "train" and r.get("truncation_rate") is not None]
    val = [r["val_truncation_rate"] for r in rows if r.get("val_truncation_rate") is not None]
    return (sum(train) / len(train) if train else float("nan")), (val[-1] if val else float("nan"))


HEADER = ("| seed | base | trained | difference [95% CI] | Wilcoxon p | patients better / worse | "
          "val reward step 0 -> ... -> last | truncated: train mean, val last step | "
          "specificity gap base -> trained, difference (Wilcoxon p) | checkpoint merged |\n"
          "|---|---|---|---|---|---|---|---|---|---|")


def table_row(seed: int, run: str) -> str:
    """One row of the seed table of docs/results.md, every column from the run's own files."""
    c = json.loads((REPO / "results" / run / "eval" / "comparison.json").read_text())
    mr = c["comparisons"]["trained"]["memory_recall"]
    w = mr["wilcoxon"]
    train_cut, val_cut = truncation(run)
    return (f"| {seed} | {mr['a']:.3f} | {mr['b']:.3f} | {mr['diff']:+.3f} [{mr['ci95'][0]:+.3f}, {mr['ci95'][1]:+.3f}] "
            f"| {w['p_value']:.4f} | {w['b_better']} / {w['a_better']} | "
            f"{' -> '.join(f'{v:.3f}' for v in val_curve(run))} | {train_cut:.0%}, {val_cut:.0%} | "
            f"{specificity(c)} | {chosen_step(run)} |")


def specificity(comparison: dict) -> str:
    """Own- minus other-patient memory recall (the control): base -> trained, and the paired test on the gap."""
    ms = comparison["comparisons"]["trained"].get("memory_specificity")
    if not ms:
        return "n/a"
    return f"{ms['a']:+.3f} -> {ms['b']:+.3f}, {ms['diff']:+.3f} (p {ms['wilcoxon']['p_value']:.4f})"


def chosen_step(run: str) -> str:
    """The checkpoint merged (train/summary.json `checkpoint`: step and train.select)."""
    path = REPO / "results" / run / "train" / "summary.json"
    chosen = json.loads(path.read_text()).get("checkpoint") if path.is_file() else None
    return f"step {chosen['step']} ({chosen['select']})" if chosen else "n/a"


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--seeds", type=int, nargs="+", default=[42, 1, 2])
    ap.add_argument("--cores", type=int, default=2)
    args = ap.parse_args()
    if not (REPO / "results" / "demo" / "eval" / "comparison.json").is_file():
        sys.exit("results/demo/eval/comparison.json missing: run `make demo` first")
    import yaml

    from llmrnn.gpus import cpu_dtype

    # what the run computed in, from its own config: a dtype `auto` differs between a CPU with native bf16 and
    # one without (the demo names float32, the same on both)
    run_cfg = yaml.safe_load((REPO / "results" / "demo" / "config.yaml").read_text())
    run_cfg = run_cfg.get("config", run_cfg)
    dtypes = sorted({cpu_dtype(role["dtype"]) for role in run_cfg["roles"].values()})
    cpu_bf16 = run_cfg["train"]["trl"]["cpu_bf16"]
    print(f"(the roles compute in {', '.join(dtypes)} on this CPU; train.trl.cpu_bf16 {cpu_bf16})", flush=True)
    print(HEADER, flush=True)
    for seed in args.seeds:
        run, wall = ("demo", float("nan")) if seed == 42 else seed_run(seed, args.cores)
        print(table_row(seed, run), flush=True)
        print(f"seed {seed}: run {run}, {wall:.0f} s", file=sys.stderr)


if __name__ == "__main__":
    main()
