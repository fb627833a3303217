"""The demo's critical path, from a run's `benchmark:` files: where the time of `make demo` goes.

    python3 benchmarks/demo_critical_path.py [--benchmarks logs/demo/benchmarks] [--cores 2] [--measure cpu|wall]

Reads every job's benchmark file (Snakemake's `benchmark:`, llmrnn.benchmarks) and lays the demo's stages out
one after the other as its DAG orders them (the cohort and the model, the trajectory shards, their gather,
preflight, training, merge, the trained model's eval shards, grading, gathering, plots and release); a stage
of several jobs is packed onto `--cores` cores (longest job first). Jobs beside the path (the base model's
eval shards and the judge-agreement check, which run on the other core during training) add to it only where
they outlast the training job. `--measure cpu` (the default) counts each job's CPU time: on a machine
shared with other work a job's wall time is inflated by the others, its CPU time is what a quiet core would
take (the demo's jobs are single-threaded); `--measure wall` counts what this run's wall clock saw.
Prints one line per stage (its jobs, the seconds it adds) and the total.
"""

from __future__ import annotations

import argparse
import csv
import sys
from collections import defaultdict
from pathlib import Path

# (stage, rules, filter on the job's path): the demo's DAG order, memory-head recipe
PATH = [
    ("cohort + base model", ("prepare_base_model", "synth_mimic_iv", "build_cohort", "clean_cohort",
                             "split_cohort"), None),
    ("trajectory shards", ("trajectory_shard",), None),
    ("gather trajectories", ("dump_trajectories",), None),
    ("preflight", ("preflight",), None),
    ("training", ("train_grpo",), None),
    ("merge", ("merge_model",), None),
    ("trained eval shards", ("eval_shard",), "/trained/"),
    ("grade trained", ("eval_grade",), "/trained/"),
    ("gather eval", ("eval_gather",), None),
    ("plots + release", ("eval_plots", "train_plots", "release", "judge_agreement_plot"), None),
]
BESIDE_TRAINING = [("base eval shards", ("eval_shard", "eval_grade"), "/base/"),
                   ("judge agreement", ("judge_agreement",), None)]


def read_jobs(root: Path, measure: str) -> dict[str, list[tuple[str, float]]]:
    """rule -> [(job path, seconds)] of every benchmark file under root (its last row)."""
    jobs: dict[str, list[tuple[str, float]]] = defaultdict(list)
    for path in sorted(root.rglob("*.tsv")):
        with open(path, newline="", encoding="utf-8") as fh:
            rows = list(csv.DictReader(fh, delimiter="\t"))
        if not rows:
            continue
        value = rows[-1].get("cpu_time" if measure == "cpu" else "s")
        try:
            seconds = float(value)
        except (TypeError, ValueError):
            sys.exit(f"{path}: field {'cpu_time' if measure == 'cpu' else 's'} is {value!r}, not a number")
        rel = path.relative_to(root)
        jobs[rel.parts[0]].append((rel.as_posix(), seconds))
    return jobs


def pack(times: list[float], cores: int) -> float:
    """Makespan of jobs on `cores` cores, longest first onto the least loaded core."""
    loads = [0.0] * max(cores, 1)
    for t in sorted(times, reverse=True):
        loads[loads.index(min(loads))] += t
    return max(loads)


def select(jobs: dict, rules: tuple[str, ...], where: str | None) -> list[float]:
    return [s for r in rules for path, s in jobs.get(r, []) if where is None or where in path]


def critical_path(jobs: dict, cores: int) -> list[tuple[str, int, float]]:
    rows = []
    for stage, rules, where in PATH:
        times = select(jobs, rules, where)
        if stage == "cohort + base model":  # the model's conversion runs beside the cohort's chain
            model = sum(select(jobs, ("prepare_base_model",), None))
            seconds = max(model, sum(times) - model)
        else:
            seconds = pack(times, cores)
        rows.append((stage, len(times), seconds))
    training = next(s for name, _, s in rows if name == "training")
    beside = sum(sum(select(jobs, rules, where)) for _, rules, where in BESIDE_TRAINING)
    rows.append(("beside training, past its end", 0, max(0.0, beside - training * (cores - 1))))
    return rows


def minutes(seconds: float) -> str:
    return f"{int(seconds // 60)} min {seconds % 60:.0f} s"


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--benchmarks", default="logs/demo/benchmarks")
    ap.add_argument("--cores", type=int, default=2)
    ap.add_argument("--measure", choices=("cpu", "wall"), default="cpu")
    args = ap.parse_args(argv)
    root = Path(args.benchmarks)
    if not root.is_dir():
        print(f"{root}: no benchmark files (run the demo first)", file=sys.stderr)
        return 2
    rows = critical_path(read_jobs(root, args.measure), args.cores)
    for stage, n, seconds in rows:
        print(f"{stage:<32} {n:>3} jobs  {minutes(seconds):>13}")
    total = sum(s for _, _, s in rows)
    print(f"{'critical path (' + args.measure + ' time, ' + str(args.cores) + ' cores)':<42} {minutes(total):>13}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
