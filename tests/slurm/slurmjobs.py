"""What SLURM recorded about the jobs of a Snakemake run: partition and GPU request per job, and the
rules each job ran (from the executor's per-job logs under .snakemake/slurm_logs)."""

from __future__ import annotations

import re
import subprocess
from dataclasses import dataclass, field
from pathlib import Path

_RULE_IN_LOG = re.compile(r"^\s*(?:local)?rule (\w+):\s*$", re.MULTILINE)


@dataclass
class SlurmJob:
    jobid: str
    partition: str
    gpus: int
    comment: str
    log: Path
    rules: set[str] = field(default_factory=set)


def _gpu_count(record: dict[str, str]) -> int:
    """GPUs asked for: TresPerJob/TresPerNode like gres:gpu:a100:2 or gres/gpu=2."""
    total = 0
    for key in ("TresPerJob", "TresPerNode", "TresPerTask"):
        for part in record.get(key, "").split(","):
            m = re.match(r"gres[:/]gpu(?::[\w.]+)?[:=](\d+)$", part)
            if m:
                total += int(m.group(1))
    return total


def scontrol_record(jobid: str) -> dict[str, str]:
    out = subprocess.run(["scontrol", "show", "job", "-o", jobid], capture_output=True, text=True,
                         timeout=30, check=True).stdout
    record = {}
    for token in out.split():
        key, sep, value = token.partition("=")
        if sep:
            record[key] = value
    return record


def jobs_of_run(workdir: Path) -> list[SlurmJob]:
    jobs = []
    for log in sorted((workdir / ".snakemake" / "slurm_logs").rglob("*.log")):
        jobid = log.stem.split("_")[0]
        if not jobid.isdigit():
            continue
        rec = scontrol_record(jobid)
        jobs.append(SlurmJob(jobid, rec.get("Partition", ""), _gpu_count(rec), rec.get("Comment", ""), log,
                             set(_RULE_IN_LOG.findall(log.read_text(errors="replace")))))
    return jobs
