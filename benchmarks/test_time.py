"""The test tiers' wall times from a fresh clone: `.ci/run` as CI runs it, then `make test` on the warm venv.

    python3 benchmarks/test_time.py [--repo .] [--keep DIR] [--skip-ci]

Clones the repository's committed HEAD into a temporary folder and runs, one after the other:
  1. `.ci/run` (what CI runs on a clean clone: every venv built, the GPU-route tier, then `make test` and
     `make test-e2e` side by side); its own per-tier summary is printed as it prints it;
  2. `make test` again in the same clone, now that its venvs exist: the README's test command on a warm
     venv, the figure the `make test` budget is about.
Prints each wall time and the budgets (docs/results.md#fast-feedback): `.ci/run` under 45 min from a fresh
clone, `make test` under 10 min warm, both on 2 cores. Needs PyPI (or pip's cache) and, for the SLURM
tests, root. Run it on a quiet machine.
"""

from __future__ import annotations

import argparse
import os
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
BUDGETS = {".ci/run (fresh clone)": 45 * 60, "make test (warm venv)": 10 * 60}


def timed(cmd: list[str], cwd: Path, log: Path) -> tuple[float, int]:
    start = time.monotonic()
    with log.open("w") as out:
        rc = subprocess.run(cmd, cwd=cwd, stdout=out, stderr=subprocess.STDOUT, check=False).returncode
    return time.monotonic() - start, rc


def minutes(seconds: float) -> str:
    return f"{int(seconds // 60)} min {int(seconds % 60):02d} s"


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repo", type=Path, default=REPO)
    parser.add_argument("--keep", type=Path, help="clone into DIR and keep it (default: a temporary folder)")
    parser.add_argument("--skip-ci", action="store_true", help="only `make test` (builds the venvs first)")
    args = parser.parse_args()
    work = args.keep or Path(tempfile.mkdtemp(prefix="llmrnn-test-time-"))
    clone = work / "llmrnn"
    subprocess.run(["git", "clone", "-q", str(args.repo.resolve()), str(clone)], check=True)
    head = subprocess.run(["git", "rev-parse", "--short", "HEAD"], cwd=clone, capture_output=True, text=True,
                          check=True).stdout.strip()
    results: dict[str, tuple[float, int]] = {}
    try:
        if not args.skip_ci:
            results[".ci/run (fresh clone)"] = timed(["bash", ".ci/run"], clone, work / "ci.log")
            summary = (work / "ci.log").read_text(errors="replace").split("== .ci/run wall time per tier", 1)
            if len(summary) == 2:
                print("== .ci/run wall time per tier" + summary[1].rstrip())
        else:
            subprocess.run(["make", "venv", "verl-envs"], cwd=clone, check=True, capture_output=True)
        results["make test (warm venv)"] = timed(["make", "test"], clone, work / "make-test.log")
        slowest = (work / "make-test.log").read_text(errors="replace").split("slowest 15 durations", 1)
        if len(slowest) == 2:
            print("== make test: slowest 15 durations" + "\n".join(slowest[1].splitlines()[:17]))
        print(f"== HEAD {head}, {os.cpu_count()} cores, load average {os.getloadavg()[0]:.1f} at the end")
        for name, (wall, rc) in results.items():
            budget = BUDGETS[name]
            print(f"{name:<24} {minutes(wall):>14}  exit {rc}  budget {budget // 60} min "
                  f"({'within' if wall <= budget else 'OVER'})")
    finally:
        if not args.keep:
            shutil.rmtree(work, ignore_errors=True)
    return 0 if all(rc == 0 for _, rc in results.values()) else 1


if __name__ == "__main__":
    sys.exit(main())
