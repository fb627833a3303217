"""`make demo` timed from a fresh clone: the wall time, the venv's share, and each rule's job times.

    python3 benchmarks/demo_time.py [--repo .] [--keep DIR]

Clones the repository's committed HEAD into a temporary folder, runs `make demo` there under `time`, and
prints the total wall time, the part before the workflow started (the venv), and per rule the wall time of
its jobs (from Snakemake's own log: each job's start and `Finished jobid` stamps, 1 s resolution). The
demo timings of docs/results.md are these lines. Needs network access to PyPI (or pip's cache).
"""

from __future__ import annotations

import argparse
import re
import subprocess
import sys
import tempfile
import time
from collections import defaultdict
from datetime import datetime
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
STAMP = re.compile(r"^\[(\w{3} \w{3} +\d+ \d\d:\d\d:\d\d \d{4})\]$")
START = re.compile(r"^(?:local)?rule (\w+):$")
JOBID = re.compile(r"^\s+jobid: (\d+)$")
FINISHED = re.compile(r"^Finished jobid: (\d+) \(Rule: (\w+)\)$")


def job_times(log: str) -> dict[str, list[float]]:
    """rule -> wall seconds of each of its jobs, from a Snakemake log."""
    started: dict[str, datetime] = {}
    per_rule: dict[str, list[float]] = defaultdict(list)
    stamp: datetime | None = None
    rule_of_block: str | None = None
    for line in log.splitlines():
        if m := STAMP.match(line):
            stamp, rule_of_block = datetime.strptime(m.group(1), "%a %b %d %H:%M:%S %Y"), None
        elif m := START.match(line):
            rule_of_block = m.group(1)
        elif (m := JOBID.match(line)) and rule_of_block and stamp and m.group(1) not in started:
            started[m.group(1)] = stamp
        elif (m := FINISHED.match(line)) and stamp and m.group(1) in started:
            per_rule[m.group(2)].append((stamp - started[m.group(1)]).total_seconds())
    return dict(per_rule)


def minutes(seconds: float) -> str:
    return f"{int(seconds // 60)} min {seconds % 60:.0f} s"


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--repo", default=str(REPO))
    ap.add_argument("--keep", help="clone here and keep it (default: a temporary folder, removed)")
    args = ap.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        clone = Path(args.keep or tmp) / "llmrnn"
        subprocess.run(["git", "clone", "-q", args.repo, str(clone)], check=True)
        t0 = time.time()
        proc = subprocess.run(["make", "demo"], cwd=clone, check=False)
        wall = time.time() - t0
        if proc.returncode != 0:
            sys.exit(f"make demo failed ({proc.returncode}) after {minutes(wall)}")
        logs = sorted((clone / ".snakemake" / "log").glob("*.snakemake.log"))
        times = job_times(logs[0].read_text()) if logs else {}
        # the log's name is the workflow's start (local time): 2026-11-23T101502.123456.snakemake.log
        name = logs[0].name.removesuffix(".snakemake.log") if logs else None
        workflow_start = datetime.strptime(name, "%Y-%m-%dT%H%M%S.%f").timestamp() if name else t0
        print(f"make demo from a fresh clone: {minutes(wall)}; before the workflow (venv): "
              f"{minutes(workflow_start - t0)}; the workflow: {minutes(t0 + wall - workflow_start)}")
        for rule, jobs in sorted(times.items(), key=lambda kv: -sum(kv[1])):
            print(f"  {rule}: {len(jobs)} job(s), {minutes(sum(jobs))} in all, longest {minutes(max(jobs))}")


if __name__ == "__main__":
    main()
