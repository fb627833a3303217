"""`snakemake -n` of the demo and of the reproduction against Snakemake's own start, side by side.

    .venv/bin/python benchmarks/dry_run.py [--runs 5] [--finished DIR]

The floor is `snakemake -n` of a one-rule Snakefile in the same environment: the start no workflow can
go below (Snakemake's imports, its plugin registry, one DAG). Measured in one run, interleaved (floor,
demo, reproduction, floor, ...), so load on the machine moves all of them alike:
  demo:          `snakemake -n` of `all` with the embedded default (config/config.yaml), a fresh workdir;
  reproduction:  `snakemake -n --configfile config/reproduce.yaml` of `all` (~150 jobs), a fresh workdir
                 holding small synthetic MIMIC-IV files where the config names its PhysioNet copy;
  first start:   the reproduction's dry run with an empty code-identity cache (LLMRNN_CACHE_DIR), i.e.
                 the first start after a change to the package's code: it walks the import graph once;
  finished:      with --finished DIR, `snakemake -n` in DIR, a workdir where a run has finished (nothing
                 to be done: Snakemake compares every output's params and code).
Prints the best and the median wall seconds of each, its best CPU seconds (user + system of the process
tree: less moved by other load than wall time) and both ratios to the floor's. The fast-feedback
goal: the reproduction's dry run within 2x of the floor (under 3 s on 2 quiet cores).
"""

from __future__ import annotations

import argparse
import os
import resource
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
BIN = Path(sys.executable).parent
PARTS = ["Snakefile", "rules", "workflow", "config", "profiles", "envs"]
FLOOR = 'rule all:\n    output:\n        "done.txt",\n    shell:\n        "touch {output}"\n'


def workdir(root: Path, name: str) -> Path:
    work = root / name
    work.mkdir()
    for part in PARTS:
        (work / part).symlink_to(REPO / part)
    return work


def _cpu() -> float:
    usage = resource.getrusage(resource.RUSAGE_CHILDREN)
    return usage.ru_utime + usage.ru_stime


def dry_run(cwd: Path, args: list[str], env: dict[str, str]) -> tuple[float, float]:
    """(wall s, CPU s) of one dry run; CPU time moves less than wall time with other load on the machine."""
    start, cpu = time.perf_counter(), _cpu()
    proc = subprocess.run([str(BIN / "snakemake"), "-n", "--cores", "2", *args], cwd=cwd, env=env,
                          capture_output=True, text=True, check=False)
    took = time.perf_counter() - start, _cpu() - cpu
    if proc.returncode != 0:
        sys.exit(f"snakemake -n {' '.join(args)} in {cwd} failed ({proc.returncode}):\n{proc.stderr[-2000:]}")
    return took


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=5, help="timed runs of each (after one warm-up)")
    parser.add_argument("--finished", type=Path, help="also a workdir where a run has finished")
    args = parser.parse_args()
    root = Path(tempfile.mkdtemp(prefix="llmrnn-dry-run-"))
    try:
        cache = root / "cache"
        env = dict(os.environ, PATH=f"{BIN}{os.pathsep}{os.environ['PATH']}", HF_HUB_OFFLINE="1",
                   OMP_NUM_THREADS="1", LLMRNN_CACHE_DIR=str(cache))
        floor = root / "floor"
        floor.mkdir()
        (floor / "Snakefile").write_text(FLOOR)
        demo = workdir(root, "demo")
        repro = workdir(root, "reproduce")
        synth = root / "mimic"
        subprocess.run([str(BIN / "llmrnn"), "cohort", "synth", "--patients", "40", "--seed", "0", "--format",
                        "mimic-iv", "--out", str(synth)], env=env, check=True, capture_output=True)
        for sub, rel in (("hosp", "data/mimiciv/hosp"), ("note", "data/mimic-iv-note/note")):
            (repro / rel).parent.mkdir(parents=True, exist_ok=True)
            (repro / rel).symlink_to(synth / sub)
        cases: dict[str, tuple[Path, list[str]]] = {
            "floor (one-rule Snakefile)": (floor, []),
            "demo (config/config.yaml)": (demo, ["all"]),
            "reproduction (config/reproduce.yaml)": (repro, ["all", "--configfile", "config/reproduce.yaml"]),
        }
        if args.finished:
            cases["finished run (--finished)"] = (args.finished.resolve(), [])
        first = []
        for _ in range(args.runs):  # the first start after a code change: an empty cache each time
            shutil.rmtree(cache, ignore_errors=True)
            first.append(dry_run(*cases["reproduction (config/reproduce.yaml)"], env))
        for cwd, cmd in cases.values():  # warm-up: the OS file cache, the code-identity cache
            dry_run(cwd, cmd, env)
        times: dict[str, list[tuple[float, float]]] = {name: [] for name in cases}
        for _ in range(args.runs):
            for name, (cwd, cmd) in cases.items():
                times[name].append(dry_run(cwd, cmd, env))
        times["reproduction, first start after a code change"] = first
        wall0 = min(w for w, _ in times["floor (one-rule Snakefile)"])
        cpu0 = min(c for _, c in times["floor (one-rule Snakefile)"])
        print(f"snakemake -n, {args.runs} runs each, interleaved; {os.cpu_count()} cores, "
              f"load average {os.getloadavg()[0]:.1f}")
        print(f"{'case':<48} {'best s':>7} {'median s':>9} {'x floor':>8} {'CPU s':>6} {'x floor':>8}")
        for name, runs in times.items():
            wall, cpu = min(w for w, _ in runs), min(c for _, c in runs)
            print(f"{name:<48} {wall:>7.2f} {statistics.median(w for w, _ in runs):>9.2f} {wall / wall0:>7.2f}x "
                  f"{cpu:>6.2f} {cpu / cpu0:>7.2f}x")
    finally:
        shutil.rmtree(root, ignore_errors=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
