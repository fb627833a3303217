"""The cost of each stage of a run, from the `benchmark:` files its jobs wrote.

Every rule that does real work writes `logs/<run>/benchmarks/<rule>/<the log's path>.tsv` (Snakemake's
benchmark directive; the profiles' `benchmark-extended: true` adds the job's resources). A stage is the
rule: its jobs' wall time (sum and longest), peak memory (max_rss, MB) and GPU hours (wall time x the
GPUs the job asked for: `gpu`, or `gres` gpu:<model>:N x nodes). `llmrnn report cost` tables and plots
them; `llmrnn check` warns from the last run's figures.
"""

from __future__ import annotations

import ast
import csv
import math
import re
from dataclasses import dataclass
from pathlib import Path

from llmrnn import html_table
from llmrnn.errors import InputError

BENCHMARKS = "benchmarks"


@dataclass(frozen=True)
class JobCost:
    stage: str
    job: str
    wall_s: float
    max_rss_mb: float | None
    gpus: int
    path: str

    @property
    def gpu_hours(self) -> float:
        return self.wall_s * self.gpus / 3600


def _gpus(resources: dict, path: Path) -> int:
    def count(value, what: str) -> int:
        try:
            return int(value)
        except (TypeError, ValueError):
            raise InputError(f"{path}: field resources: {what} is {value!r}, not a whole number") from None

    if resources.get("gpu") not in (None, ""):
        return count(resources["gpu"], "gpu")
    match = re.search(r"gpu(?::[\w.-]+)?:(\d+)", str(resources.get("gres") or ""))
    return int(match.group(1)) * count(resources.get("nodes") or 1, "nodes") if match else 0


def _number(value: str | None, path: Path, field: str) -> float | None:
    if value is None:  # a row shorter than the header
        raise InputError(f"{path}: field {field} is missing from the last row")
    if value in ("", "NA", "-"):
        return None
    try:
        number = float(value)
    except ValueError:
        raise InputError(f"{path}: field {field} is {value!r}, not a number") from None
    if not math.isfinite(number) or number < 0:
        raise InputError(f"{path}: field {field} is {value!r}, not a finite number >= 0")
    return number


def read_job(path: Path, root: Path) -> JobCost:
    """One benchmark file (its last row: the last attempt or repeat)."""
    try:
        with open(path, newline="", encoding="utf-8") as fh:
            rows = list(csv.DictReader(fh, delimiter="\t"))
    except (UnicodeDecodeError, csv.Error) as exc:
        raise InputError(f"{path}: not a Snakemake benchmark file ({exc})") from None
    if not rows or "s" not in rows[-1]:
        raise InputError(f"{path}: not a Snakemake benchmark file (no row with a field s)")
    row = rows[-1]
    wall = _number(row["s"], path, "s")
    if wall is None:
        raise InputError(f"{path}: field s is empty")
    resources: dict = {}
    if row.get("resources"):
        try:
            resources = ast.literal_eval(row["resources"])
        except (ValueError, SyntaxError, TypeError, MemoryError, RecursionError):
            resources = None
        if not isinstance(resources, dict):
            raise InputError(f"{path}: field resources is not a dict: {row['resources'][:80]!r}") from None
    rel = path.relative_to(root).with_suffix("")
    return JobCost(stage=rel.parts[0], job=str(rel), wall_s=wall,
                   max_rss_mb=_number(row.get("max_rss", ""), path, "max_rss"), gpus=_gpus(resources, path),
                   path=str(path))


def read_benchmarks(root: str | Path) -> list[JobCost]:
    """Every benchmark file under root (logs/<run>/benchmarks), sorted by path; [] when there is none."""
    root = Path(root)
    return [read_job(p, root) for p in sorted(root.rglob("*.tsv"))] if root.is_dir() else []


def stage_costs(jobs: list[JobCost]) -> list[dict]:
    """Per stage (rule): jobs, wall time (sum, longest), peak max_rss, GPU hours; in the order first seen."""
    stages: dict[str, dict] = {}
    for job in jobs:
        s = stages.setdefault(job.stage, {"stage": job.stage, "jobs": 0, "wall_s": 0.0, "longest_s": 0.0,
                                          "max_rss_mb": None, "gpu_hours": 0.0})
        s["jobs"] += 1
        s["wall_s"] += job.wall_s
        s["longest_s"] = max(s["longest_s"], job.wall_s)
        if job.max_rss_mb is not None:
            s["max_rss_mb"] = max(s["max_rss_mb"] or 0.0, job.max_rss_mb)
        s["gpu_hours"] += job.gpu_hours
    return list(stages.values())


def cost_table(stages: list[dict]) -> str:
    """TSV: one row per stage and a total row."""
    head = "stage\tjobs\twall_s\tlongest_job_s\tpeak_max_rss_mb\tgpu_hours\n"
    def rss(v):
        return "" if v is None else f"{v:.1f}"
    body = "".join(f"{s['stage']}\t{s['jobs']}\t{s['wall_s']:.1f}\t{s['longest_s']:.1f}\t{rss(s['max_rss_mb'])}\t"
                   f"{s['gpu_hours']:.3f}\n" for s in stages)
    peak = max((s["max_rss_mb"] for s in stages if s["max_rss_mb"] is not None), default=None)
    total = (f"total\t{sum(s['jobs'] for s in stages)}\t{sum(s['wall_s'] for s in stages):.1f}\t"
             f"{max((s['longest_s'] for s in stages), default=0.0):.1f}\t{rss(peak)}\t"
             f"{sum(s['gpu_hours'] for s in stages):.3f}\n")
    return head + body + total


COLUMNS = ("stage", "jobs", "wall time (h:mm:ss)", "longest job (h:mm:ss)", "peak memory (MB, max_rss)",
           "GPU hours")


def _clock(seconds: float) -> str:
    s = round(seconds)
    return f"{s // 3600}:{s % 3600 // 60:02d}:{s % 60:02d}"


def cost_html(stages: list[dict]) -> str:
    """The same table as cost_table, as a standalone HTML page: Snakemake's report shows an HTML result inline
    (a TSV only as a download), and its landing page takes this one in whole. Stage names are rule names,
    escaped all the same."""
    def cells(s):
        rss = "" if s["max_rss_mb"] is None else f"{s['max_rss_mb']:.0f}"
        return [s["stage"], s["jobs"], _clock(s["wall_s"]), _clock(s["longest_s"]), rss, f"{s['gpu_hours']:.2f}"]

    peak = max((s["max_rss_mb"] for s in stages if s["max_rss_mb"] is not None), default=None)
    total = {"stage": "total", "jobs": sum(s["jobs"] for s in stages), "wall_s": sum(s["wall_s"] for s in stages),
             "longest_s": max((s["longest_s"] for s in stages), default=0.0), "max_rss_mb": peak,
             "gpu_hours": sum(s["gpu_hours"] for s in stages)}
    return html_table.page("Cost per stage", html_table.table(COLUMNS, [*map(cells, stages), cells(total)],
                                                              numbers=True, total=True))


def longest_job_minutes(root: str | Path, stage: str) -> tuple[float, str] | None:
    """The longest measured job of a stage in minutes, with its file; None when the stage has no benchmark."""
    jobs = [j for j in read_benchmarks(root) if j.stage == stage]
    if not jobs:
        return None
    worst = max(jobs, key=lambda j: j.wall_s)
    return worst.wall_s / 60, worst.path
