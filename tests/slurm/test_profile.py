"""profiles/slurm without SLURM: the literal dry run maps GPU rules to A100 nodes, CPU rules to CPU nodes.

These run everywhere (no daemons): Snakemake plans the jobs with the slurm executor's resources, on a
PATH from which the SLURM client commands were removed.
"""

from __future__ import annotations

import os
import re
import subprocess
from pathlib import Path

import pytest

from tests.slurm.dag import (
    REPO,
    copy_extra_parts,
    gpu_rules,
    load_profile,
    no_slurm_path,
    parse_dry_run,
    prepare_reproduce_inputs,
    run,
    unquote,
)

pytestmark = pytest.mark.slow

# The documented install (docs/cluster.md "Set up: the GPU stack and the profile"): makes `snakemake --profile slurm all` work.
INSTALL_ONE_LINER = 'mkdir -p ~/.config/snakemake && ln -sfn "$PWD/profiles/slurm" ~/.config/snakemake/slurm'


def _clean_env(tmp_path: Path, **extra: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("LLMRNN_", "SLURM_", "XDG_"))}
    home = tmp_path / "home"
    home.mkdir(exist_ok=True)
    env.update(HOME=str(home), PATH=no_slurm_path(tmp_path), OMP_NUM_THREADS="1", HF_HUB_OFFLINE="1")
    env.update(extra)
    return env


def _dry_run(workdir: Path, env: dict[str, str], *args: str) -> str:
    exe = str(Path(env["PATH"].split(os.pathsep)[0]) / "snakemake")
    proc = run([exe, *args], cwd=workdir, env=env)
    assert proc.returncode == 0, f"snakemake {' '.join(args)} failed:\n{proc.stdout[-4000:]}\n{proc.stderr[-4000:]}"
    return proc.stdout + proc.stderr


def _defined_rules(workdir: Path, env: dict[str, str]) -> set[str]:
    out = _dry_run(workdir, env, "--list-rules", "--configfile", "config/config.yaml")
    return {line.strip() for line in out.splitlines() if re.fullmatch(r"\s*\w+\s*", line)}


def _assert_placement(text: str, profile: dict, gpu_partition: str, cpu_partition: str) -> list[str]:
    jobs = [j for j in parse_dry_run(text) if j.shell is not None]
    assert jobs, f"no job with a command in the dry run:\n{text[-3000:]}"
    gpus = gpu_rules(profile)
    seen_gpu = []
    for job in jobs:
        res = job.resources
        if job.rule in gpus:
            assert res.get("slurm_partition") == gpu_partition, (job.rule, res)
            assert int(res.get("gpu", -1)) == gpus[job.rule], (job.rule, res)
            if gpus[job.rule] > 0:
                assert res.get("gpu_model") == "a100", (job.rule, res)
                seen_gpu.append(job.rule)
        else:
            assert res.get("slurm_partition") == cpu_partition, (job.rule, res)
            assert int(res.get("gpu", 0) or 0) == 0, (job.rule, res)
    return seen_gpu


def test_literal_dry_run_without_slurm_maps_gpu_rules_to_a100(literal_slurm_dry_run):
    workflow_dir, env, text = literal_slurm_dry_run  # the session's (tests/conftest.py), read-only
    assert "This was a dry-run" in text
    profile = load_profile(env)
    seen_gpu = _assert_placement(text, profile, "gpu-a100", "cpu")
    # once the training stage exists, `all` must contain GPU jobs (train_grpo and its group at least)
    if "train_grpo" in _defined_rules(workflow_dir, env):
        assert "train_grpo" in seen_gpu and "judge_server" in seen_gpu, seen_gpu


def test_reproduce_dry_run_plans_build_cohort_first(literal_slurm_dry_run):
    """config/reproduce.yaml reads the user's PhysioNet folders (here synthetic files in their place):
    build_cohort is the DAG's first stage, before cleaning."""
    _, _, text = literal_slurm_dry_run
    jobs = [j.rule for j in parse_dry_run(text) if j.shell is not None]
    # the order among the DAG's roots is the scheduler's tie-break (it moved when merge_model's resources
    # changed): only the model downloads, which need no cohort, may come before build_cohort
    assert set(jobs[:jobs.index("build_cohort")]) <= {"prepare_judge_model", "prepare_base_model"}, jobs[:5]
    assert jobs.index("build_cohort") < jobs.index("clean_cohort") < jobs.index("split_cohort")


def test_env_vars_adapt_the_profile_without_editing_it(workflow_dir, tmp_path):
    env = _clean_env(
        tmp_path,
        LLMRNN_SLURM_CPU_PARTITION="all",  # a name that is also a Python builtin: must stay a string
        LLMRNN_SLURM_GPU_PARTITION="a100-80g",
        LLMRNN_SLURM_ACCOUNT="proj42",
        LLMRNN_SLURM_CONSTRAINT="a100_80gb",
        LLMRNN_CONFIGFILE="config/config.yaml",
    )
    text = _dry_run(workflow_dir, env, "--profile", "profiles/slurm", "-n", "all")
    jobs = [j for j in parse_dry_run(text) if j.shell is not None]
    assert jobs
    for job in jobs:
        assert job.resources.get("slurm_account") == "proj42", job
    profile = load_profile(env)
    assert profile["slurm-no-account"] is False
    assert unquote(profile["set-resources"]["train_grpo"]["constraint"]) == "a100_80gb"
    assert profile["configfile"] == ["config/config.yaml"]
    _assert_placement(text, profile, "a100-80g", "all")


def test_profile_defaults_and_switches():
    profile = load_profile({"PATH": os.environ["PATH"]})
    assert profile["executor"] == "slurm"
    assert profile["configfile"] == ["config/reproduce.yaml"]
    assert profile["slurm-no-account"] is True
    assert "software-deployment-method" not in profile and "slurm-status-command" not in profile
    assert unquote(profile["default-resources"]["slurm_partition"]) == "cpu"
    gpus = gpu_rules(profile)
    assert gpus["train_grpo"] == 2 and gpus["judge_server"] == 1  # the reference layout
    assert {profile["groups"][r] for r in ("judge_server", "preflight", "train_grpo")} == {"train_node"}
    switched = load_profile({"LLMRNN_SDM": "apptainer conda", "LLMRNN_SLURM_STATUS": "squeue",
                             "LLMRNN_TRAIN_GPUS": "4", "LLMRNN_TRAIN_NODES": "2"})
    assert switched["software-deployment-method"] == ["apptainer", "conda"]
    assert switched["slurm-status-command"] == "squeue"
    # several nodes: GPUs per node (--gres), the same on every member of the judge/trainer group
    # (--gpus would spread the total over the nodes unevenly), and the node count on the trainer
    assert switched["set-resources"]["train_grpo"]["nodes"] == 2
    assert "gpu" not in switched["set-resources"]["train_grpo"]
    assert {unquote(switched["set-resources"][r]["gres"]) for r in ("judge_server", "preflight", "train_grpo")} \
        == {"gpu:a100:5"}
    assert "nodes" not in switched["set-resources"]["judge_server"]


def test_retries_by_default_requeue_only_when_asked():
    """Transient failures retry (resources grow per attempt in the rules); requeue is opt-in (preemptible
    partitions, docs/cluster.md "Long runs")."""
    profile = load_profile({"PATH": os.environ["PATH"]})
    assert profile["retries"] == 2 and "slurm-requeue" not in profile
    switched = load_profile({"LLMRNN_SLURM_RETRIES": "0", "LLMRNN_SLURM_REQUEUE": "1"})
    assert switched["retries"] == 0 and switched["slurm-requeue"] is True
    assert "slurm-requeue" not in load_profile({"LLMRNN_SLURM_REQUEUE": "0"})


# every stage's resources.gpu at 1: each rule that can ask for a GPU then does
EVERY_STAGE_ON_A_GPU = {"trajectories": {"resources": {"gpu": 1}}, "eval": {"resources": {"gpu": 1}},
                        "train": {"resources": {"gpu": 1}}, "merge": {"resources": {"gpu": 1}},
                        "qa": {"sft": {"resources": {"gpu": 1}}, "eval": {"resources": {"gpu": 1}}}}


def rule_resources() -> dict[str, dict]:
    """rule -> the resources it declares, as Snakemake builds the workflow of each recipe with every stage on
    a GPU (tests.rules_api; a `use rule` child has its parent's unless it gives its own)."""
    from tests.rules_api import workflow_rules

    return {name: rule.resources for name, rule in workflow_rules(config=EVERY_STAGE_ON_A_GPU).items()}


def test_every_rule_declaring_a_gpu_is_mapped_by_the_profile():
    """A GPU rule the profile does not know would silently land on a CPU node."""
    mapped = set(gpu_rules(load_profile({})))
    resources = rule_resources()
    assert {"train_grpo", "qa_train_grpo", "eval_shard", "merge_model", "qa_merge_sft"} <= \
        {name for name, res in resources.items() if "gpu" in res}  # the scan sees the plan's resources
    unmapped = []
    for name, res in sorted(resources.items()):
        # a rule placing itself from its config's GPU count (llmrnn.slurm.gpu_placement: a partition of
        # its own) must not be overridden by the profile; any other GPU rule is the profile's to place
        if "slurm_partition" in res and name in mapped:
            unmapped.append(f"{name} (gpu_placement and the profile both place it)")
        elif "gpu" in res and "slurm_partition" not in res and name not in mapped:
            unmapped.append(name)
    assert not unmapped, f"GPU rules missing from profiles/slurm set-resources: {unmapped}"


def test_rule_side_placement_uses_the_profiles_defaults_and_variables():
    """llmrnn.slurm.gpu_placement (rules whose GPU count is a config key) reads the profile's variables with
    the profile's defaults: one partition and one GPU model, whichever side places a job."""
    from llmrnn import slurm

    for env in ({}, {"LLMRNN_SLURM_GPU_PARTITION": "a100-80g", "LLMRNN_SLURM_GPU_MODEL": "",
                     "LLMRNN_SLURM_CPU_PARTITION": "short", "LLMRNN_SLURM_CONSTRAINT": "a100_80gb"}):
        profile = load_profile(env)
        theirs = {k: unquote(v) for k, v in profile["set-resources"]["eval_shard"].items()}
        assert slurm.gpu_placement(1, env) == theirs, (env, theirs)
        assert slurm.gpu_placement(0, env) == {"gpu": 0}
        assert slurm.setting(slurm.CPU_PARTITION, env) == unquote(profile["default-resources"]["slurm_partition"])


def test_a_profile_linked_under_the_users_config_makes_the_bare_name_work(workflow_dir, tmp_path):
    env = _clean_env(tmp_path, LLMRNN_CONFIGFILE="config/config.yaml")
    subprocess.run(["bash", "-c", INSTALL_ONE_LINER], cwd=workflow_dir, env=env, check=True)
    assert (Path(env["HOME"]) / ".config/snakemake/slurm/config.yaml").is_file()
    text = _dry_run(workflow_dir, env, "--profile", "slurm", "-n", "all")
    assert "slurm_partition=cpu" in text
    # the docs name the profile one way only, by its folder (the short name above is a user's own choice)
    page = (REPO / "docs" / "cluster.md").read_text()
    assert "--profile profiles/slurm" in page and "--profile slurm" not in page


def test_dry_run_downloads_the_judge_model_once(workflow_dir, tmp_path):
    """The reproduce judge (RubricARM-8B, `source: hub`) is a file-tracked target: the literal dry run plans
    its download job, and judge_server waits for that local copy."""
    copy_extra_parts(workflow_dir)
    prepare_reproduce_inputs(workflow_dir)
    env = _clean_env(tmp_path)
    text = _dry_run(workflow_dir, env, "--profile", "profiles/slurm", "-n", "all",
                    "--configfile", "config/reproduce.yaml")
    jobs = [j for j in parse_dry_run(text) if j.rule == "prepare_judge_model"]
    assert len(jobs) == 1, text[-3000:]
    assert "resources/judge_models/OpenRubrics--RubricARM-8B-Judge/.ready" in text
    assert "llmrnn judge prepare-model" in (jobs[0].shell or "")


def test_qa_reproduce_grades_its_free_text_answers_with_a_judge_of_its_own(workflow_dir, tmp_path):
    """config/qa_reproduce.yaml (free-text answers, judge weight 0.5) on the literal profile: after the three
    evaluations one SLURM job holds a judge instance of its own (training's judge lives in train_node's job,
    and a service runs in its consumers' group) and `llmrnn qa judge`, whose judged copies gather reads."""
    copy_extra_parts(workflow_dir)
    source = workflow_dir / "data/ecg_expert_qa/train.json"  # ECG-Expert-QA is not shipped: a stand-in
    source.parent.mkdir(parents=True)
    source.write_text("[]")
    env = _clean_env(tmp_path)
    text = _dry_run(workflow_dir, env, "--profile", "profiles/slurm", "-n", "all", "--configfile",
                    "config/qa_reproduce.yaml")
    jobs = {j.rule: j for j in parse_dry_run(text)}
    assert {"judge_server", "qa_eval_judge_server", "qa_judge_eval"} <= set(jobs)
    eval_group = text.split("Group job qa_eval_judge ", 1)[1].split("Group job", 1)[0].split("\n[", 1)[0]
    assert "rule qa_eval_judge_server:" in eval_group and "rule qa_judge_eval:" in eval_group
    assert "qa_train_grpo" not in eval_group and "rule judge_server:" not in eval_group
    grader, server = jobs["qa_judge_eval"], jobs["qa_eval_judge_server"]
    assert "--endpoint results/qa_ecg_repro/eval/judge/endpoint.json" in grader.shell
    assert "--rubric config/rubrics/qa_correctness_rubricarm.yaml" in grader.shell
    for variant in ("base", "sft", "grpo"):
        assert f"eval/{variant}/test.jsonl" in grader.shell and f"eval/{variant}/test.judged.jsonl" in grader.shell
        assert f"eval/{variant}/test.judged.jsonl" in jobs["qa_eval_gather"].shell
    assert server.resources["gpu"] == "1" and unquote(server.resources["slurm_partition"]) == "gpu-a100"
    assert unquote(grader.resources["slurm_partition"]) == "gpu-a100"  # one job: the judge's node
    assert "--endpoint" not in jobs["qa_eval_model"].shell  # generation never waits on a judge


@pytest.mark.parametrize("gpus", [0, 1])
def test_merge_job_asks_the_gpus_merge_resources_gpu_names(workflow_dir, tmp_path, gpus):
    """Issue 31 item 7: the profile asked an A100 for merge_model (`--gpus=a100:1` from gpu_model) while
    merge.resources.gpu was 0. The config decides (llmrnn.slurm.gpu_placement): 0 -> the CPU partition and no
    GPU request at all, 1 -> the GPU partition with the profile's GPU model."""
    copy_extra_parts(workflow_dir)
    prepare_reproduce_inputs(workflow_dir)
    (workflow_dir / "merge_gpus.yaml").write_text(f"merge:\n  resources: {{gpu: {gpus}}}\n")
    env = _clean_env(tmp_path, LLMRNN_CONFIGFILE="config/reproduce.yaml merge_gpus.yaml",
                     LLMRNN_SLURM_GPU_PARTITION="a100-80g")
    text = _dry_run(workflow_dir, env, "--profile", "profiles/slurm", "-n", "merge_model")
    (merge,) = [j for j in parse_dry_run(text) if j.rule == "merge_model"]
    res = merge.resources
    assert int(res.get("gpu", 0)) == gpus, res
    if gpus:
        assert res.get("slurm_partition") == "a100-80g" and res.get("gpu_model") == "a100", res
    else:
        assert res.get("slurm_partition") == "cpu" and "gpu_model" not in res, res
