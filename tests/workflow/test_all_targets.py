"""`all` requests every durable output of the planned DAG, so a killed job's missing outputs are replanned.

Snakemake takes a missing file as done while its consumers' outputs are up to date. `snakemake -R
merge_model` removes merged/ and merge_check.json before the job starts; killed then, release's outputs
still exist and, unless `all` asks for the merge's outputs itself, the next `snakemake -n` says "Nothing
to be done". These are real Snakemake dry runs of the shipped configs (no job runs): one checks that
every output of every planned job (services and temp() aside) is an input of `all` and that `all` plans
no job that nothing reads; one touches a finished run in place and deletes what a killed job leaves.
"""

from __future__ import annotations

import os
import re
import shutil
from dataclasses import dataclass, field
from pathlib import Path

import pytest
import yaml

from tests.conftest import copy_workflow, snakemake
from tests.slurm.dag import job_counts, prepare_reproduce_inputs

pytestmark = pytest.mark.slow  # real Snakemake dry runs of the whole DAG (5-15 s each)

SHIPPED = ["config/config.yaml", "config/qa_demo.yaml", "config/reproduce.yaml", "config/qa_reproduce.yaml",
           "config/smoke.yaml"]
# The jobs a run is for: what they write is read by no other job, only requested by `all`.
PRODUCT_RULES = {"release", "train_plots", "eval_plots", "report_overview", "judge_agreement_plot", "qa_report"}

_RULE = re.compile(r"^\s*(?:local)?rule (\w+):\s*$")
_FILES = re.compile(r"^\s+(input|output): (.*)$")
_ANNOTATION = re.compile(r" \(([a-z ]+)\)$")  # "path (service)": the dry run names a file's flag


@dataclass
class Job:
    rule: str
    inputs: list[str] = field(default_factory=list)
    outputs: list[str] = field(default_factory=list)
    services: list[str] = field(default_factory=list)


def parse_jobs(text: str) -> list[Job]:
    """The jobs of a dry run with their input and output files (a service's endpoint apart)."""
    jobs: list[Job] = []
    for line in text.splitlines():
        if m := _RULE.match(line):
            jobs.append(Job(m.group(1)))
        elif jobs and (m := _FILES.match(line)):
            for item in m.group(2).split(", "):
                flag = _ANNOTATION.search(item)
                path = item[: flag.start()] if flag else item
                if m.group(1) == "input":
                    jobs[-1].inputs.append(path)
                elif flag and flag.group(1) == "service":
                    jobs[-1].services.append(path)
                else:
                    jobs[-1].outputs.append(path)
    return jobs


def _stand_in_data(workdir: Path, configfile: str) -> None:
    """The reproductions' data are not shipped (credentialed MIMIC-IV, ECG-Expert-QA): stand-ins at the
    paths they name let a dry run plan their whole DAG."""
    prepare_reproduce_inputs(workdir)
    cfg = yaml.safe_load((workdir / configfile).read_text())
    source = cfg.get("qa", {}).get("source", "synthetic")
    if source != "synthetic" and not source.startswith("hf:") and not (workdir / source).exists():
        (workdir / source).parent.mkdir(parents=True, exist_ok=True)
        (workdir / source).write_text("[]")


def _dry_run(workdir: Path, *args: str) -> str:
    proc = snakemake(workdir, "-n", *args)
    return proc.stdout + proc.stderr


# Variants that take stages out of the plan: the user's own cohort file (no synth_cohort), no judge
# agreement (no judge_server either).
VARIANTS = {
    "own_cohort_no_agreement": {"cohort": {"source": "data/cohort.json"}, "preflight": {"agreement_pairs": 0}},
}


@pytest.mark.parametrize("configfile", [*SHIPPED, *VARIANTS])
def test_all_requests_every_durable_output_of_the_planned_dag(tmp_path, shipped_dry_runs, configfile):
    if configfile in VARIANTS:
        from llmrnn.cohort import dump_cohort, synthesize_cohort

        workflow_dir = copy_workflow(tmp_path)
        (workflow_dir / "data").mkdir()
        (workflow_dir / "data/cohort.json").write_text(dump_cohort(synthesize_cohort(30, seed=3)))
        (workflow_dir / "variant.yaml").write_text(yaml.safe_dump(VARIANTS[configfile]))
        _stand_in_data(workflow_dir, "config/config.yaml")
        jobs = parse_jobs(_dry_run(workflow_dir, "--forceall", "--configfile", "config/config.yaml", "variant.yaml"))
    else:  # a shipped config's `all -n -p --forceall`, planned once per session (tests/test_plan_snapshot.py too)
        jobs = parse_jobs(shipped_dry_runs.text(configfile))
    if configfile in VARIANTS:
        assert not {"synth_cohort", "judge_server", "judge_agreement"} & {j.rule for j in jobs}
    (all_job,) = [j for j in jobs if j.rule == "all"]
    requested = set(all_job.inputs)
    work = [j for j in jobs if j.rule != "all"]
    assert len(work) > 10, [j.rule for j in jobs]
    missing = {(j.rule, f) for j in work for f in j.outputs if f not in requested}
    assert not missing, f"{configfile}: outputs `all` does not request (a killed job would look done): {missing}"
    services = {f for j in work for f in j.services}
    assert not services & requested  # a service's endpoint lives only as long as its consumers
    # ... and nothing more: every job `all` plans is read by another job, or is one of the run's products
    read = {f for j in work for f in j.inputs}
    unread = {j.rule for j in work if not read.intersection(j.outputs + j.services)}
    assert unread <= PRODUCT_RULES, f"{configfile}: jobs planned only because `all` asks: {unread - PRODUCT_RULES}"
    produced = {f for j in work for f in j.outputs}
    assert requested <= produced, requested - produced


def _topological(jobs: list[Job]) -> list[Job]:
    """The jobs in an order where each comes after the jobs whose outputs it reads."""
    producer = {f: j for j in jobs for f in j.outputs + j.services}
    done: list[Job] = []

    def visit(job: Job) -> None:
        if job in done:
            return
        for f in job.inputs:
            if f in producer:
                visit(producer[f])
        done.append(job)

    for job in jobs:
        visit(job)
    return done


def _finished_run(workdir: Path) -> list[Job]:
    """Every output of the demo's DAG made in place, each newer than what it reads: a run Snakemake,
    looking at file times only, takes as done. Returns the jobs."""
    jobs = [j for j in parse_jobs(_dry_run(workdir, "--forceall")) if j.rule != "all"]
    t = 2_000_000_000  # every output newer than the workflow's own files
    for job in _topological(jobs):
        t += 10
        for out in job.outputs:
            path = workdir / out
            if path.suffix or path.name == ".ready":
                path.parent.mkdir(parents=True, exist_ok=True)
                path.touch()
            else:  # a directory() output: merged/, the adapter, audit folders
                path.mkdir(parents=True, exist_ok=True)
            os.utime(path, (t, t))
    return jobs


def _rules_planned(workdir: Path) -> dict[str, int]:
    """rule -> jobs Snakemake plans, deciding by file times only (no job of the touched run left metadata)."""
    return job_counts(_dry_run(workdir, "--rerun-triggers", "mtime"))


def test_outputs_a_killed_job_leaves_missing_are_replanned(workflow_dir):
    """What Snakemake's `-R merge_model` removes before the job (merged/, merge_check.json) and a SIGKILL then
    leaves missing: the next run plans merge_model again, then release. The class: an output no other
    job's rerun would bring back (a report, an audit folder, one shard, the training summary) is replanned
    too, whichever stage made it."""
    jobs = _finished_run(workflow_dir)
    assert _rules_planned(workflow_dir) == {}  # the touched run is complete
    gone = {
        "merge_model": "results/demo/merged",
        "clean_cohort": "results/demo/cohort/cleaning_report.json",
        "preflight": "results/demo/train/preflight_audit",
        "eval_shard": "results/demo/eval/base/shard_1.jsonl",
        "train_grpo": "results/demo/train/summary.json",
    }
    assert all(any(f in j.outputs for j in jobs if j.rule == rule) for rule, f in gone.items()), gone
    for path in [*gone.values(), "results/demo/merge_check.json"]:
        target = workflow_dir / path
        shutil.rmtree(target) if target.is_dir() else target.unlink()
    text = _dry_run(workflow_dir, "--rerun-triggers", "mtime")
    planned = job_counts(text)
    assert planned.get("merge_model") == 1 and planned.get("release") == 1, planned
    for rule, path in gone.items():
        reasons = re.findall(rf"rule {rule}:\n(?:    .*\n)*?    reason: (.*)", text)
        assert any("Missing output files" in r and path in r for r in reasons), (rule, reasons)
