"""What the workflow asks of SLURM, where the config decides it (the profile's placement defaults live in
profiles/slurm/config.yaml; tests/slurm/test_profile.py keeps the two in step).

- `gpu_placement(n)`: the resources of a rule whose GPU count is a config key (merge.resources.gpu): the
  count, and only when it is above 0 the GPU partition and model. The SLURM executor writes
  `--gpus=<model>:<n>` whenever `gpu_model` is set, so a profile that set it for such a rule would ask for a
  GPU the config said the job does not need (or override the count the config gave).
- `partition_limits()` / `parse_minutes()`: the partitions' MaxTime from `sinfo`, for `llmrnn check`.
- `env_count(name)`: a count the profile reads from the environment (LLMRNN_SLURM_RETRIES, ...), bounded.
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess

# env var -> default: the same names and defaults as the profile's definitions
GPU_PARTITION = ("LLMRNN_SLURM_GPU_PARTITION", "gpu-a100")
CPU_PARTITION = ("LLMRNN_SLURM_CPU_PARTITION", "cpu")
GPU_MODEL = ("LLMRNN_SLURM_GPU_MODEL", "a100")
CONSTRAINT = ("LLMRNN_SLURM_CONSTRAINT", "")


# the profile's counts from the environment: name -> (default, least, most). A value outside is one line naming
# the variable (a million retries would resubmit a failing job for ever; -1 or `abc` was a traceback)
COUNTS = {
    "LLMRNN_SLURM_RETRIES": (2, 0, 20),
    "LLMRNN_SLURM_JOBS": (100, 1, 100_000),
    "LLMRNN_TRAIN_GPUS": (2, 1, 64),
    "LLMRNN_JUDGE_GPUS": (1, 0, 64),
    "LLMRNN_TRAIN_NODES": (1, 1, 4096),
}


def env_count(name: str, environ=None) -> int:
    """The whole number `name` (one of COUNTS) of the environment, its default where unset; anything else
    raises a ValueError whose one line names the variable and its range."""
    default, low, high = COUNTS[name]
    raw = (os.environ if environ is None else environ).get(name)
    if raw is None or raw.strip() == "":
        return default
    text = raw.strip()
    if not re.fullmatch(r"\d{1,9}", text) or not low <= int(text) <= high:
        shown = text[:20] if re.fullmatch(r"[\w.+-]*", text[:20]) else "that value"
        raise ValueError(f"{name}={shown}: expected a whole number from {low} to {high} (default {default})")
    return int(text)


def setting(var: tuple[str, str], environ=None) -> str:
    name, default = var
    value = (os.environ if environ is None else environ).get(name)
    return default if value is None else value


def gpu_placement(n: int, environ=None) -> dict:
    """Rule resources for a job that needs n GPUs (n from the config): n > 0 -> the GPU partition and model
    (and constraint); 0 -> no GPU request at all, the profile's CPU partition (default-resources)."""
    n = int(n)
    if n <= 0:
        return {"gpu": 0}
    res: dict = {"gpu": n, "slurm_partition": setting(GPU_PARTITION, environ)}
    if setting(GPU_MODEL, environ):
        res["gpu_model"] = setting(GPU_MODEL, environ)
    if setting(CONSTRAINT, environ):
        res["constraint"] = setting(CONSTRAINT, environ)
    return res


def parse_minutes(limit: str) -> int | None:
    """A SLURM time limit (`sinfo %l`: MM, MM:SS, HH:MM:SS, D-HH, D-HH:MM, D-HH:MM:SS) in minutes, rounded
    down; None for "infinite"/"UNLIMITED" or anything else sinfo may print."""
    limit = limit.strip()
    m = re.fullmatch(r"(?:(\d+)-)?(\d+)(?::(\d+))?(?::(\d+))?", limit)
    if not m:
        return None
    days, a, b, c = (int(g) if g is not None else None for g in m.groups())
    if days is not None:  # D-HH[:MM[:SS]]
        return days * 1440 + a * 60 + (b or 0)
    if c is not None:  # HH:MM:SS
        return a * 60 + b
    return a  # MM or MM:SS


def partition_limits(timeout_s: float = 30) -> dict[str, int | None] | None:
    """partition -> MaxTime in minutes (None: no limit) from `sinfo -h -o "%P %l"`; None where sinfo is not
    here or does not answer (no cluster to compare with)."""
    exe = shutil.which("sinfo")
    if exe is None:
        return None
    try:
        proc = subprocess.run([exe, "-h", "-o", "%P %l"], capture_output=True, text=True, timeout=timeout_s,
                              check=False)
    except (OSError, subprocess.TimeoutExpired):
        return None
    if proc.returncode != 0:
        return None
    out: dict[str, int | None] = {}
    for line in proc.stdout.splitlines():
        parts = line.split()
        if len(parts) == 2:
            out[parts[0].rstrip("*")] = parse_minutes(parts[1])  # "gpu*": the default partition
    return out
