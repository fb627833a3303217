"""benchmarks/demo_seeds.py: the demo over training seeds as one experiment of the workflow (the plan it runs,
a real dry run), and the seed table of docs/results.md printed from an experiment's own files."""

from __future__ import annotations

import importlib.util
import re
import subprocess
from pathlib import Path

import pytest
import yaml

from tests.conftest import REPO, copy_workflow


def load_script():
    spec = importlib.util.spec_from_file_location("demo_seeds", REPO / "benchmarks" / "demo_seeds.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def job_counts(text: str) -> dict[str, int]:
    """Snakemake's "Job stats" table of a dry run: rule -> jobs."""
    table = text.split("Job stats:", 1)[1].split("\n\n", 1)[0]
    return {m.group(1): int(m.group(2)) for m in re.finditer(r"^(\w+)\s+(\d+)$", table, flags=re.MULTILINE)}


@pytest.mark.slow  # one dry run of a three-member DAG: ~5 s of CPU
def test_the_script_runs_the_demo_as_one_experiment_over_the_seeds(tmp_path):
    """What `demo_seeds.py --seeds 42 1 2` runs: the demo's config with one variant (the demo as it is) times
    the seeds, through the Makefile's run environment; the stages no seed changes run once, each seed trains,
    merges and is evaluated, and one comparison holds them all."""
    demo = load_script()
    work = copy_workflow(tmp_path)
    overlay = work / "seeds.yaml"
    overlay.write_text(yaml.safe_dump(demo.overlay([42, 1, 2])))
    env = demo.run_env()
    assert env["OMP_NUM_THREADS"] == "1" and env["HF_HUB_OFFLINE"] == "1"
    proc = subprocess.run(demo.snakemake_command(overlay, 2, dry_run=True) + ["-p"], cwd=work, env=env,
                          capture_output=True, text=True, check=False)
    assert proc.returncode == 0, proc.stderr[-3000:]
    counts = job_counts(proc.stdout)
    members = ("demo_s42", "demo_s1", "demo_s2")
    for rule in ("train_grpo", "merge_model", "eval_gather", "release"):
        assert {m: counts.get(f"{m}__{rule}") for m in members} == dict.fromkeys(members, 1), rule
    for rule in ("build_cohort", "split_cohort", "trajectory_shard", "dump_trajectories", "judge_agreement",
                 "eval_shard"):  # shared: one member's rule only
        assert len([name for name in counts if name.endswith(f"__{rule}")]) == 1, (rule, counts)
    assert counts["compare_variants"] == 1
    compare = next(line for line in proc.stdout.splitlines() if "llmrnn evaluate compare" in line)
    for seed in (42, 1, 2):
        assert f"--variant demo@{seed}=results/demo_seeds/demo-s{seed}/eval/trained/" in compare
    assert "--out results/demo_seeds/eval/comparison.json" in compare


def assert_seed_table(results: Path, variant: str, seeds: list[int]) -> list[str]:
    """The seed table demo_seeds.py prints for `variant` of a finished experiment (results: results/RUN): one
    row per seed with the header's columns; its memory-recall cells are the experiment comparison's row of that
    seed, the very numbers the member's own eval/comparison.json holds (the same patients, the same bootstrap:
    the table the script printed when it read each seed's own run); the rest are the member's train/ files."""
    import json

    demo = load_script()
    rows = demo.table(results, variant, seeds)
    columns = demo.HEADER.splitlines()[0].count("|")
    assert [row.split("|")[1].strip() for row in rows] == [str(s) for s in seeds]
    assert all(row.count("|") == columns for row in rows), rows
    recall = demo.seed_recall(results, variant)
    for seed, row in zip(seeds, rows):
        member = results / f"{variant}-s{seed}"
        own = json.loads((member / "eval" / "comparison.json").read_text())["comparisons"]["trained"]["memory_recall"]
        ours = recall[str(seed)]
        assert {k: ours[k] for k in ("a", "b", "diff", "ci95")} == {k: own[k] for k in ("a", "b", "diff", "ci95")}
        assert ours["wilcoxon"]["p_value"] == own["wilcoxon"]["p_value"]
        cells = [c.strip() for c in row.split("|")[1:-1]]
        assert cells[1:4] == [f"{own['a']:.3f}", f"{own['b']:.3f}",
                              f"{own['diff']:+.3f} [{own['ci95'][0]:+.3f}, {own['ci95'][1]:+.3f}]"]
        assert cells[4] == f"{own['wilcoxon']['p_value']:.4f}"
        assert cells[5] == f"{own['wilcoxon']['b_better']} / {own['wilcoxon']['a_better']}"
        vals = [json.loads(x).get("val_reward_mean") for x in (member / "train" / "metrics.jsonl").read_text().splitlines()]
        assert cells[6] == " -> ".join(f"{v:.3f}" for v in vals if v is not None)
        chosen = json.loads((member / "train" / "summary.json").read_text())["checkpoint"]
        assert cells[9] == f"step {chosen['step']} ({chosen['select']})"
    return rows


# A finished experiment's files, as demo_seeds.py reads them: copied (only the files the table reads) from the
# run of tests/workflow/test_experiment_workflow.py on 2026-12-04 (the CPU sweep with SMALL's rows: rank16's
# seeds 1 and 2, 3 held-out patients; its full-tier test checks the same on its own fresh run)
SWEEP_RESULTS = REPO / "tests" / "data" / "sweep_cpu_results"


def test_the_seed_table_is_printed_from_an_experiments_files():
    rows = assert_seed_table(SWEEP_RESULTS, "rank16", [1, 2])
    # the seeds in the order asked, each from its own member
    assert [row.split("|")[1].strip() for row in assert_seed_table(SWEEP_RESULTS, "rank16", [2, 1])] == ["2", "1"]
    assert rows[0] != rows[1]  # seed 1 and seed 2 trained differently (their val rewards)
