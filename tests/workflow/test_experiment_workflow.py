"""The CPU sweep (config/sweep-cpu.yaml: two variants x two training seeds over the demo) run end to end: the
stages its members share ran once, every member's trained model was evaluated on the same test patients, the
comparison holds every pair with Holm-corrected p-values, and a change of one variant's training knob reruns
that variant's training onwards only."""

from __future__ import annotations

import json
import re
import shutil
from pathlib import Path

import pytest
import yaml

from llmrnn import io
from tests.conftest import REPO, snakemake
from tests.slurm.dag import parse_dry_run, write_small_config
from tests.test_demo_seeds import assert_seed_table

# the e2e tier (in .ci/run since 2026-12-04): four trainings, merges and evaluations of the demo model took 9.7 min
# of CPU (user + sys, 2026-12-04; 27 min over the sweep as shipped, before write_small), 300 s of wall on a quiet
# 2-core machine; tests/test_experiment.py plans the same sweep (the plan and a real dry run) in the unit tier
pytestmark = [pytest.mark.slow, pytest.mark.e2e]
SWEEP = ("config/config.yaml", "config/sweep-cpu.yaml")


def write_small(workdir: Path) -> str:
    """The shipped sweep shrunk by tests/slurm/dag.py's SMALL (3 test patients of one memory-recall transition
    each, no baselines, 2 steps): the same DAG and sharing, fewer rows in each job. Not SMALL's GRPO group of 2:
    at 2 rollouts a prompt both seed-2 members drew reward 0 for all 4 rollouts (grad 0), and their unmoved
    adapters fail the merge check; the demo's 6 a prompt is what the shipped sweep trains with."""
    name = write_small_config(workdir)
    small = yaml.safe_load((workdir / name).read_text())
    small["train"].pop("group_size")
    small["train"].pop("batch")
    (workdir / name).write_text(yaml.safe_dump(small))
    return name
MEMBERS = ("rank16_s1", "rank16_s2", "rank8_s1", "rank8_s2")
SHARED = ("build_cohort", "split_cohort", "trajectory_shard", "dump_trajectories", "judge_agreement",
          "eval_shard", "eval_grade")
OWN = ("preflight", "train_grpo", "merge_model", "eval_shard_trained", "eval_grade_trained", "eval_gather")


def job_counts(text: str) -> dict[str, int]:
    """Snakemake's "Job stats" table: rule -> jobs."""
    table = text.split("Job stats:", 1)[1].split("\n\n", 1)[0]
    return {m.group(1): int(m.group(2)) for m in re.finditer(r"^(\w+)\s+(\d+)$", table, flags=re.MULTILINE)}


def test_cpu_sweep_shares_stages_compares_every_pair_and_reruns_one_variant(workflow_dir: Path, monkeypatch):
    # the package as of now for every run here: the jobs' code hashes must not move under the rerun check
    snapshot = workflow_dir / ".pkg" / "src"
    shutil.copytree(REPO / "src", snapshot, ignore=shutil.ignore_patterns("__pycache__", "*.egg-info"))
    monkeypatch.setenv("PYTHONPATH", str(snapshot))
    files = ("--configfile", *SWEEP, write_small(workflow_dir))
    run = snakemake(workflow_dir, "all", "--latency-wait", "60", *files)
    counts = job_counts(run.stdout + run.stderr)
    for rule in SHARED:  # one member's rule ran each shared job (dump_trajectories: train and val)
        made = {name: n for name, n in counts.items() if name.endswith(f"__{rule}")}
        assert len(made) == 1 and sum(made.values()) == (2 if rule in ("trajectory_shard", "dump_trajectories") else 1), made
    for rule in OWN:
        assert {m: counts.get(f"{m}__{rule}") for m in MEMBERS} == dict.fromkeys(MEMBERS, 1), rule
    assert counts["compare_variants"] == 1

    results = workflow_dir / "results" / "sweep-cpu"
    base = [r["patient_id"] for r in io.read_jsonl(next(results.glob("untrained_eval-*/eval/base/graded_0.jsonl")))]
    assert base
    for member in ("rank16-s1", "rank16-s2", "rank8-s1", "rank8-s2"):
        trained = io.read_jsonl(results / member / "eval" / "trained" / "graded_0.jsonl")
        assert [r["patient_id"] for r in trained] == base, member

    comparison = json.loads((results / "eval" / "comparison.json").read_text())
    assert comparison["control"] == "rank16" and comparison["n_patients"] == len(base)
    pairs = {(c["a"], c["b"]) for c in comparison["comparisons"]}
    assert pairs == {("base", "rank16"), ("base", "rank8"), ("rank16", "rank8")}
    assert all({row["seed"] for row in c["rows"]} == {"1", "2"} for c in comparison["comparisons"])
    tests = comparison["family"]["tests"]
    assert comparison["family"]["method"] == "holm" and len(tests) == comparison["family"]["size"] > 0
    assert all(t["p_value"] <= t["p_holm"] <= 1 for t in tests)
    assert (results / "eval" / "forest.png").stat().st_size > 0
    # benchmarks/demo_seeds.py's seed table, printed from these files (the script runs the demo the same way)
    for variant in ("rank16", "rank8"):
        assert_seed_table(results, variant, [1, 2])

    # one variant's training knob: that variant's members rerun from training on (and the comparison), no other
    sweep = workflow_dir / "config" / "sweep-cpu.yaml"
    config = yaml.safe_load(sweep.read_text())
    config["experiment"]["variants"]["rank8"]["train"]["lr"] = 1.0e-4
    sweep.write_text(yaml.safe_dump(config))
    dry = snakemake(workflow_dir, "all", "-n", "-p", "--rerun-triggers", "params", *files)
    rerun = {job.rule for job in parse_dry_run(dry.stdout + dry.stderr) if job.shell is not None}
    assert "rank8_s1__train_grpo" in rerun and "rank8_s2__train_grpo" in rerun
    assert "compare_variants" in rerun
    assert not {r for r in rerun if r.startswith("rank16_")}, rerun
    assert not {r for r in rerun if r.split("__")[-1] in SHARED}, rerun
