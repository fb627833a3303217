"""Dry runs: the judge server (and its model's download) is planned only when the reward asks the judge.
reward.mode outcome (the embedded default) plans them only for the judge-agreement check beside training,
and preflight/train_grpo get no --endpoint;
a scalar config and config/reproduce.yaml plan judge_server as before."""

from __future__ import annotations

import pytest
import yaml

from tests.conftest import copy_workflow, snakemake
from tests.slurm.dag import job_counts, parse_dry_run, prepare_reproduce_inputs

JUDGE_RULES = {"judge_server", "prepare_judge_model"}


@pytest.fixture(scope="module")
def workflow_dir(tmp_path_factory):
    """One workflow copy for the module's dry runs (none runs a job), with the reproduction's stand-in cohort."""
    work = copy_workflow(tmp_path_factory.mktemp("judge-plan"))
    prepare_reproduce_inputs(work)
    return work


@pytest.fixture(scope="module")
def planned(workflow_dir):
    """configfiles -> (rule -> job count, rule -> job) of a dry run of `all`, each set of configs (by their
    contents) planned once for the module: several tests plan the demo and its scalar-reward variant."""
    runs: dict[tuple, tuple] = {}

    def plan_jobs(*configfiles: str):
        key = tuple((name, (workflow_dir / name).read_text()) for name in configfiles)
        if key not in runs:
            proc = snakemake(workflow_dir, "-n", "-p", "all", "--configfile", *configfiles)
            text = proc.stdout + proc.stderr
            runs[key] = job_counts(text), {j.rule: j for j in parse_dry_run(text)}
        return runs[key]

    return plan_jobs


def _plan(planned, *configfiles: str) -> tuple[dict[str, int], dict[str, str]]:
    """(rule -> job count, rule -> shell command) of a dry run of `all`."""
    counts, jobs = planned(*configfiles)
    return counts, {rule: j.shell or "" for rule, j in jobs.items()}


def test_training_path_jobs_come_first_and_preflight_gets_a_core_without_a_judge(workflow_dir, planned):
    """On 2 cores preflight took 53 s squeezed beside two base eval shards (0 threads), 6 s with a core of
    its own and priority; beside a judge service it must stay at 0 (Snakemake sums a service group's cores)."""
    _, jobs = planned("config/config.yaml")
    assert jobs["preflight"].threads == 1 and jobs["preflight"].priority == 10
    assert jobs["train_grpo"].priority == 10 and jobs["eval_shard"].priority == 0
    extra = _override(workflow_dir, "scalar.yaml", {"reward": {"mode": "scalar"}})
    _, jobs = planned("config/config.yaml", extra)
    assert jobs["preflight"].threads == 0 and jobs["judge_server"].threads == 0


def _override(workflow_dir, name: str, cfg: dict) -> str:
    (workflow_dir / name).write_text(yaml.safe_dump(cfg))
    return name


def test_outcome_reward_plans_no_judge_for_training(workflow_dir, planned):
    """The embedded default's reward asks no judge: preflight and train_grpo get no endpoint; its judge is
    started only for the judge-agreement check beside the training path (preflight.agreement_pairs 0: none)."""
    default = yaml.safe_load((workflow_dir / "config" / "config.yaml").read_text())
    assert default["reward"]["mode"] == "outcome"  # the embedded default's reward asks no judge
    counts, shells = _plan(planned, "config/config.yaml")
    assert counts["preflight"] == 1 and counts["train_grpo"] == 1
    assert counts["judge_server"] == 1 and counts["judge_agreement"] == 1 and counts["judge_agreement_plot"] == 1
    assert "--endpoint results/demo/judge/endpoint.json" in shells["judge_agreement"]
    off = _override(workflow_dir, "no_agreement.yaml", {"preflight": {"agreement_pairs": 0}})
    counts_off, _ = _plan(planned, "config/config.yaml", off)
    assert not JUDGE_RULES & set(counts_off) and "judge_agreement" not in counts_off, counts_off
    assert "--endpoint" not in shells["preflight"] and "--endpoint" not in shells["train_grpo"]
    assert "--judge-gpus 0" in shells["train_grpo"]
    assert '"judge"' not in shells["preflight"]  # the judge section is no parameter of an outcome preflight
    assert "--rubric" not in shells["release"]  # the card names no judge that scored nothing


@pytest.mark.parametrize("mode", ["scalar", "pairwise"])
def test_judged_reward_plans_the_judge_server(workflow_dir, planned, mode):
    extra = _override(workflow_dir, f"{mode}.yaml", {"reward": {"mode": mode}})
    counts, shells = _plan(planned, "config/config.yaml", extra)
    assert counts["judge_server"] == 1
    endpoint = "--endpoint results/demo/judge/endpoint.json"
    assert endpoint in shells["preflight"] and endpoint in shells["train_grpo"]


def test_reproduce_config_plans_the_judge_server_and_its_model(workflow_dir, planned):
    counts, shells = _plan(planned, "config/reproduce.yaml")
    assert counts["judge_server"] == 1 and counts["prepare_judge_model"] == 1
    run = yaml.safe_load((workflow_dir / "config" / "reproduce.yaml").read_text())["run_name"]
    endpoint = f"--endpoint results/{run}/judge/endpoint.json"
    assert endpoint in shells["preflight"] and endpoint in shells["train_grpo"]
    assert "--judge-gpus 1" in shells["train_grpo"]  # the vLLM judge holds one GPU of the training node
    assert "--rubric config/rubrics/" in shells["release"]


def test_outcome_mode_with_a_hub_judge_downloads_nothing(workflow_dir, planned):
    """reproduce.yaml's RubricARM judge (`source: hub`) with the outcome reward and no judge-agreement check
    (preflight.agreement_pairs 0): no download job either; with the check, the judge is fetched for it alone."""
    extra = _override(workflow_dir, "outcome.yaml", {"reward": {"mode": "outcome"}, "preflight": {"agreement_pairs": 0}})
    counts, shells = _plan(planned, "config/reproduce.yaml", extra)
    assert counts["train_grpo"] == 1 and not JUDGE_RULES & set(counts), counts
    assert "--judge-gpus 0" in shells["train_grpo"]
    extra = _override(workflow_dir, "outcome_checked.yaml", {"reward": {"mode": "outcome"}})
    counts, shells = _plan(planned, "config/reproduce.yaml", extra)
    assert JUDGE_RULES <= set(counts) and counts["judge_agreement"] == 1 and "--judge-gpus 0" in shells["train_grpo"]
