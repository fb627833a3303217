"""The demo's learning measured over training seeds: trained vs base held-out memory recall per seed.

    PATH=.venv/bin:$PATH .venv/bin/python benchmarks/demo_seeds.py --seeds 42 1 2 [--cores 2] [--dry-run]

Runs the demo as one experiment over the seeds (docs/compare.md): an overlay of `run_name: demo_seeds` and
`experiment: {variants: {demo: {}}, seeds: [...]}` on config/config.yaml, through `snakemake --profile
profiles/local all` in the Makefile's run environment. The cohort, splits, trajectories, the judge's agreement
check and the base model's evaluation do not depend on the training seed, so the members share them (each
runs once); each seed trains, merges and is evaluated on the same held-out patients. Then it prints the seed
table of docs/results.md from the experiment's outputs, one row per seed: base and trained memory recall, the
paired difference with its bootstrap 95% CI, the Wilcoxon p, the patients better / worse (the rows of
results/demo_seeds/eval/comparison.json), the val reward at every validation, the truncation, the
patient-specificity control (each memory's recall against other patients' visits: trained - base on the gap
own - other, with its Wilcoxon p; the member's own eval/comparison.json) and the checkpoint merged (the
member's train/); the wall time of the run goes to stderr. `--dry-run` prints the jobs (snakemake -n) instead.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
RUN = "demo_seeds"
VARIANT = "demo"  # the demo as it is; its members are demo-s<seed>


def overlay(seeds: list[int]) -> dict:
    """The experiment over the demo: one variant (the demo as it is), one member per training seed."""
    return {"run_name": RUN, "experiment": {"variants": {VARIANT: {}}, "seeds": list(seeds)}}


def run_env() -> dict[str, str]:
    """The Makefile's RUNENV: the venv's tools first, one OpenMP thread a process, the hubs offline."""
    return {**os.environ, "PATH": f"{REPO / '.venv' / 'bin'}{os.pathsep}{os.environ['PATH']}",
            "OMP_NUM_THREADS": "1", "HF_HUB_OFFLINE": "1", "TRANSFORMERS_VERBOSITY": "error"}


def snakemake_command(overlay_file: Path, cores: int, dry_run: bool = False) -> list[str]:
    return ["snakemake", "--profile", "profiles/local", "--cores", str(cores), "all",
            "--configfile", "config/config.yaml", str(overlay_file), *(["-n"] if dry_run else [])]


def run_experiment(seeds: list[int], cores: int, dry_run: bool = False) -> float:
    """The experiment's whole DAG (every seed), in the repository; returns its wall time in seconds."""
    import yaml

    overlay_file = REPO / "logs" / RUN / "seeds.yaml"
    overlay_file.parent.mkdir(parents=True, exist_ok=True)
    overlay_file.write_text(yaml.safe_dump(overlay(seeds), sort_keys=False))
    t0 = time.time()
    subprocess.run(snakemake_command(overlay_file, cores, dry_run), cwd=REPO, env=run_env(), check=True)
    return time.time() - t0


# ----------------------------------------------------------------------------- the table, from the run's files
def train_rows(member: Path) -> list[dict]:
    return [json.loads(x) for x in (member / "train" / "metrics.jsonl").read_text().splitlines()]


def val_curve(member: Path) -> list[float]:
    return [r["val_reward_mean"] for r in train_rows(member) if r.get("val_reward_mean") is not None]


def truncation(member: Path) -> tuple[float, float]:
    """Rollouts cut at max_response_length: mean over the training steps, and at the last validation."""
    rows = train_rows(member)
    train = [r["truncation_rate"] for r in rows if r.get("kind") == "train" and r.get("truncation_rate") is not None]
    val = [r["val_truncation_rate"] for r in rows if r.get("val_truncation_rate") is not None]
    return (sum(train) / len(train) if train else float("nan")), (val[-1] if val else float("nan"))


HEADER = ("| seed | base | trained | difference [95% CI] | Wilcoxon p | patients better / worse | "
          "val reward step 0 -> ... -> last | truncated: train mean, val last step | "
          "specificity gap base -> trained, difference (Wilcoxon p) | checkpoint merged |\n"
          "|---|---|---|---|---|---|---|---|---|---|")


def seed_recall(results: Path, variant: str) -> dict[str, dict]:
    """seed -> the variant's held-out memory recall against its frozen base (results/RUN/eval/comparison.json:
    the pair `variant vs base`, one row per seed)."""
    c = json.loads((results / "eval" / "comparison.json").read_text())
    pair = next(p for p in c["comparisons"] if p["b"] == variant and p["against"] == "base")
    return {str(row["seed"]): row["memory_recall"] for row in pair["rows"]}


def table_row(seed: int, recall: dict, member: Path) -> str:
    """One row of the seed table of docs/results.md: the comparison's row of this seed, the member's own files."""
    w = recall["wilcoxon"]
    train_cut, val_cut = truncation(member)
    return (f"| {seed} | {recall['a']:.3f} | {recall['b']:.3f} | {recall['diff']:+.3f} "
            f"[{recall['ci95'][0]:+.3f}, {recall['ci95'][1]:+.3f}] "
            f"| {w['p_value']:.4f} | {w['b_better']} / {w['a_better']} | "
            f"{' -> '.join(f'{v:.3f}' for v in val_curve(member))} | {train_cut:.0%}, {val_cut:.0%} | "
            f"{specificity(member)} | {chosen_step(member)} |")


def table(results: Path, variant: str, seeds: list[int]) -> list[str]:
    """The seed table's rows of one variant of an experiment (results: results/RUN), in the order of seeds."""
    recall = seed_recall(results, variant)
    return [table_row(seed, recall[str(seed)], results / f"{variant}-s{seed}") for seed in seeds]


def specificity(member: Path) -> str:
    """Own- minus other-patient memory recall (the control): base -> trained, and the paired test on the gap
    (the member's own eval/comparison.json)."""
    comparison = json.loads((member / "eval" / "comparison.json").read_text())
    ms = comparison["comparisons"]["trained"].get("memory_specificity")
    if not ms:
        return "n/a"
    return f"{ms['a']:+.3f} -> {ms['b']:+.3f}, {ms['diff']:+.3f} (p {ms['wilcoxon']['p_value']:.4f})"


def chosen_step(member: Path) -> str:
    """The checkpoint merged (train/summary.json `checkpoint`: step and train.select)."""
    path = member / "train" / "summary.json"
    chosen = json.loads(path.read_text()).get("checkpoint") if path.is_file() else None
    return f"step {chosen['step']} ({chosen['select']})" if chosen else "n/a"


def computed_in(results: Path) -> str:
    """What the run computed in, from its own config: a dtype `auto` differs between a CPU with native bf16 and
    one without (the demo names float32, the same on both)."""
    import yaml

    from llmrnn.gpus import cpu_dtype

    run_cfg = yaml.safe_load((results / "config.yaml").read_text())
    run_cfg = run_cfg.get("config", run_cfg)
    dtypes = sorted({cpu_dtype(role["dtype"]) for role in run_cfg["roles"].values()})
    return f"(the roles compute in {', '.join(dtypes)} on this CPU; train.trl.cpu_bf16 {run_cfg['train']['trl']['cpu_bf16']})"


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--seeds", type=int, nargs="+", default=[42, 1, 2])
    ap.add_argument("--cores", type=int, default=2)
    ap.add_argument("--dry-run", action="store_true", help="print the experiment's jobs (snakemake -n), run none")
    args = ap.parse_args()
    if len(set(args.seeds)) != len(args.seeds):
        sys.exit(f"--seeds: each seed once ({' '.join(map(str, args.seeds))})")
    wall = run_experiment(args.seeds, args.cores, args.dry_run)
    if args.dry_run:
        return
    results = REPO / "results" / RUN
    print(computed_in(results), flush=True)
    print(HEADER, flush=True)
    for row in table(results, VARIANT, args.seeds):
        print(row, flush=True)
    print(f"experiment {RUN} (seeds {' '.join(map(str, args.seeds))}): {wall:.0f} s", file=sys.stderr)


if __name__ == "__main__":
    main()
