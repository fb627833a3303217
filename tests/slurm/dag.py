"""Helpers for tests that read Snakemake's dry-run output and the SLURM profile (no SLURM needed)."""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
from dataclasses import dataclass, field
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
PROFILE = REPO / "profiles" / "slurm" / "config.yaml"
# The SLURM client commands; a PATH without them is what a laptop without SLURM has.
SLURM_COMMANDS = {
    "sinfo", "squeue", "sbatch", "sacct", "scontrol", "srun", "scancel", "sacctmgr", "salloc",
    "sattach", "sbcast", "sstat", "sprio", "sshare", "sreport", "strigger", "sdiag", "scrontab",
}
# Extra parts of the repository a workflow run may need besides conftest.WORKFLOW_PARTS.
EXTRA_PARTS = ["envs", "scripts"]

_RULE = re.compile(r"^\s*(?:local)?rule (\w+):\s*$")  # group members are indented
_JOBID = re.compile(r"^\s+jobid: (\d+)\s*$")
_RES = re.compile(r"^\s+resources: (.*)$")
_INT_FIELD = re.compile(r"^\s+(threads|priority): (\d+)$")  # printed only when not the default (1, 0)


@dataclass
class DryJob:
    rule: str
    jobid: int | None = None
    resources: dict[str, str] = field(default_factory=dict)
    shell: str | None = None
    threads: int = 1
    priority: int = 0


def parse_dry_run(text: str) -> list[DryJob]:
    """The jobs of a `snakemake -n -p` output, with their resources and shell command."""
    jobs: list[DryJob] = []
    current: DryJob | None = None
    for line in text.splitlines():
        m = _RULE.match(line)
        if m:
            current = DryJob(m.group(1))
            jobs.append(current)
            continue
        if current is None:
            continue
        if (m := _JOBID.match(line)) and current.jobid is None:
            current.jobid = int(m.group(1))
        elif m := _INT_FIELD.match(line):
            setattr(current, m.group(1), int(m.group(2)))
        elif m := _RES.match(line):
            for item in m.group(1).split(", "):
                key, _, value = item.partition("=")
                current.resources[key.strip()] = value.strip()
        elif line.startswith("Shell command: "):
            cmd = line[len("Shell command: "):].strip()
            current.shell = None if cmd == "None" else cmd
    return jobs


def job_counts(text: str) -> dict[str, int]:
    """rule -> count from the 'Job stats' table of a dry run ({} when nothing is to be done)."""
    counts: dict[str, int] = {}
    lines = text.splitlines()
    for i, line in enumerate(lines):
        if line.strip().startswith("job") and line.split()[-1:] == ["count"]:
            for row in lines[i + 2:]:
                parts = row.split()
                if len(parts) != 2 or not parts[1].isdigit() or parts[0] == "total":
                    break
                counts[parts[0]] = int(parts[1])
            break
    return counts


def no_slurm_path(tmp: Path) -> str:
    """A PATH with this venv and every command of the current PATH except the SLURM client."""
    shim = tmp / "no-slurm-bin"
    shim.mkdir(exist_ok=True)
    for d in os.environ.get("PATH", "").split(os.pathsep):
        if not d or not Path(d).is_dir():
            continue
        for exe in Path(d).iterdir():
            target = shim / exe.name
            if exe.name in SLURM_COMMANDS or target.exists() or target.is_symlink():
                continue
            if exe.is_file() and os.access(exe, os.X_OK):
                target.symlink_to(exe)
    return f"{Path(sys.executable).parent}{os.pathsep}{shim}"


def load_profile(env: dict[str, str] | None = None) -> dict:
    """profiles/slurm/config.yaml rendered the way Snakemake renders it (YTE), under env."""
    import yte

    saved = dict(os.environ)
    try:
        if env is not None:
            os.environ.clear()
            os.environ.update(env)
        with open(PROFILE) as stream:
            return yte.process_yaml(stream, require_use_yte=True)
    finally:
        os.environ.clear()
        os.environ.update(saved)


def unquote(value):
    return value[1:-1] if isinstance(value, str) and len(value) >= 2 and value[0] == value[-1] == "'" else value


def gpu_rules(profile: dict) -> dict[str, int]:
    """rule -> GPUs requested, for the rules the profile sends to the GPU partition."""
    gpu_partition = None
    out = {}
    for rule, res in profile.get("set-resources", {}).items():
        if "gpu" in res:
            out[rule] = int(res["gpu"])
            gpu_partition = unquote(res.get("slurm_partition"))
    assert gpu_partition, "profile maps no rule to a GPU partition"
    return out


def copy_extra_parts(workdir: Path) -> None:
    for part in EXTRA_PARTS:
        src = REPO / part
        if src.is_dir() and not (workdir / part).exists():
            shutil.copytree(src, workdir / part)


def prepare_reproduce_inputs(workdir: Path) -> None:
    """The reproduction's cohort is credentialed MIMIC-IV; a synthetic file in its place lets a dry run
    of config/reproduce.yaml plan the whole DAG."""
    import yaml

    from llmrnn.cohort import dump_cohort, synthesize_cohort
    from llmrnn.mimic import synth

    cfg = yaml.safe_load((workdir / "config" / "reproduce.yaml").read_text())
    source = cfg.get("cohort", {}).get("source", "synthetic")
    if source == "mimic_iv":  # synthetic PhysioNet files where the user's folders go
        mimic = cfg["cohort"]["mimic_iv"]
        synth.write(synthesize_cohort(30, seed=3), 3, workdir / "_physionet")
        for key in ("hosp", "note"):
            (workdir / mimic[key]).parent.mkdir(parents=True, exist_ok=True)
            (workdir / "_physionet" / key).rename(workdir / mimic[key])
    elif source != "synthetic":
        path = workdir / source
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(dump_cohort(synthesize_cohort(30, seed=3)))


def run(cmd: list[str], cwd: Path, env: dict[str, str], timeout: float = 600) -> subprocess.CompletedProcess:
    return subprocess.run(cmd, check=False, cwd=cwd, env=env, capture_output=True, text=True, timeout=timeout)


# The embedded default shrunk to the fewest rows that still exercise every stage, for the tests that
# run the whole workflow to check WHERE and WHETHER jobs run (not results). Keys the config lacks are
# left out (see present()), so the override never invents a key the schema would reject.
SMALL = {
    "split": {"val_size": 2, "train_size": 4},
    "trajectories": {"shards": 1, "max_visits": 3},
    # one memory-recall transition per evaluated patient (the fewest eval.max_visits allows)
    "eval": {"max_patients": 3, "max_visits": 2, "shards": 1, "baselines": []},
    # GRPO's smallest group (2 rollouts a prompt, one forward pass of the 2 x 2 responses): a third of the
    # demo's 6 rollouts to generate and backpropagate, in training and in its validation
    "train": {"total_steps": 2, "save_freq": 2, "group_size": 2, "batch": {"micro_per_gpu": 4}},
}


def present(cfg: dict, override: dict) -> dict:
    """The part of override whose keys exist in cfg."""
    out = {}
    for key, value in override.items():
        if key not in cfg:
            continue
        if isinstance(value, dict) and isinstance(cfg[key], dict):
            if sub := present(cfg[key], value):
                out[key] = sub
        elif not isinstance(value, dict):
            out[key] = value
    return out


def write_small_config(workdir: Path) -> str:
    """small.yaml in workdir (layer it over config/config.yaml); returns its name."""
    import yaml

    default = yaml.safe_load((workdir / "config" / "config.yaml").read_text())
    small = present(default, SMALL)
    if "train" in small:  # 2 steps on a few rows: plumbing, which may see no reward spread (no learning check)
        small["train"]["fail_on_zero_gradient"] = False
    (workdir / "small.yaml").write_text(yaml.safe_dump(small))
    return "small.yaml"


def write_model_layer(workdir: Path, model: Path) -> str:
    """model.yaml in workdir (layer it over the small config); returns its name. A local HF folder (the tiny
    model of tests/tiny_model.py) stands in for SmolLM2 under SmolLM2's own entry name, so every role, the
    rubric's judge and the release card keep theirs: for the whole runs whose assertions are about which jobs
    run and where, not about what the model answers (SmolLM2 in float32 on CPU made them the e2e tier's longest)."""
    import yaml

    layer = {
        "models": {"smollm2-135m-instruct": {"source": "local", "path": str(model)}},
        # a random model writes no memory that parses: every rollout's reward is the same, and only an entropy
        # bonus gives the adapter a gradient, so the merge finds trained weights (merge_model checks it does)
        "train": {"entropy_coef": 0.01},
    }
    (workdir / "model.yaml").write_text(yaml.safe_dump(layer))
    return "model.yaml"
