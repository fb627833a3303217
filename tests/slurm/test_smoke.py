"""config/smoke.yaml, the cluster smoke test run before the reproduction: it plans on the SLURM profile (by
path and by the installed name) as the whole DAG on GPUs with no Hub download, passes `llmrnn check`, its verl
overrides compose in verl 0.7.1, and its CPU-capable stages run here."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from llmrnn.runconfig import SCHEMA_DEFAULT, leaves, read_layer, resolve
from tests.slurm.dag import REPO, copy_extra_parts, gpu_rules, load_profile, parse_dry_run, unquote
from tests.slurm.test_profile import INSTALL_ONE_LINER, _clean_env, _dry_run

SMOKE = "config/smoke.yaml"
# every stage of the reproduction's DAG (reward.mode scalar: the judge's agreement comes from preflight)
STAGES = {"prepare_base_model", "synth_cohort", "clean_cohort", "split_cohort", "trajectory_shard",
          "dump_trajectories", "judge_server", "preflight", "train_grpo", "train_plots", "merge_model",
          "eval_shard", "eval_grade", "eval_gather", "eval_plots", "report_overview", "release",
          "judge_agreement_plot"}


def _check_plan(text: str, profile: dict) -> None:
    jobs = [j for j in parse_dry_run(text) if j.shell is not None]
    rules = {j.rule for j in jobs}
    assert STAGES <= rules, STAGES - rules
    assert not {"prepare_judge_model"} & rules  # no Hub download: nothing needs a token
    by_rule = {j.rule: j for j in jobs}
    gpus = gpu_rules(profile)
    for rule in ("trajectory_shard", "judge_server", "train_grpo", "eval_shard"):
        res = by_rule[rule].resources
        assert unquote(res["slurm_partition"]) == "gpu-a100" and int(res["gpu"]) == gpus[rule] >= 1, (rule, res)
    train = by_rule["train_grpo"]
    cfg = json.loads(train.shell.split("--cfg '", 1)[1].split("'", 1)[0])["train"]
    assert cfg["engine"] == "verl" and 2 <= cfg["total_steps"] <= 4 and cfg["report_to"] == "tensorboard"
    assert cfg["n_gpus_per_node"] == gpus["train_grpo"]  # the profile's default layout, nothing to export
    assert "--endpoint results/smoke/judge/endpoint.json" in train.shell  # the real judge scores the rollouts
    assert sum(j.rule == "eval_shard" for j in jobs) == 4  # base, trained and both baselines
    # each job's runtime (minutes) bounds the run: the longest path stays within the smoke budget
    assert int(train.resources["runtime"]) <= 60


@pytest.mark.slow
def test_smoke_plans_on_the_slurm_profile_by_path_and_by_name(workflow_dir, tmp_path):
    copy_extra_parts(workflow_dir)
    env = _clean_env(tmp_path)
    profile = load_profile(env)
    text = _dry_run(workflow_dir, env, "--profile", "profiles/slurm", "-n", "all", "--configfile", SMOKE)
    _check_plan(text, profile)
    # the documented command, with the profile installed under its bare name
    subprocess.run(["bash", "-c", INSTALL_ONE_LINER], cwd=workflow_dir, env=env, check=True)
    text = _dry_run(workflow_dir, env, "--profile", "slurm", "-n", "all", "--configfile", SMOKE)
    _check_plan(text, profile)
    assert "results/smoke/" in text and "phase1_v2judge_repro" not in text  # smoke.yaml alone, not layered


def test_smoke_is_a_complete_recipe_file_and_passes_llmrnn_check(tmp_path):
    layer = read_layer(REPO / SMOKE)
    config, sources = resolve([layer], REPO / "workflow/schemas/config.schema.yaml")
    assert {s for _, s in leaves(sources)} <= {layer[0], SCHEMA_DEFAULT}
    assert config["recipe"] == "memory_head" and config["train"]["engine"] == "verl"
    assert all(m["source"] != "hub" for m in config["models"].values())
    assert all(r["backend"] == "vllm" for r in config["roles"].values())
    assert config["release"]["upload"] is False and config["reward"]["mode"] == "scalar"
    rubric = yaml.safe_load((REPO / config["judge"]["rubric"]).read_text())
    assert rubric["serving"]["engine"] == "vllm" and rubric["judge"]["source"] == "local"
    llmrnn = str(Path(sys.executable).parent / "llmrnn")
    # the jobs bring the GPU stack (a software-deployment method): this environment need not have it
    proc = subprocess.run([llmrnn, "check", "--configfile", SMOKE], cwd=REPO, capture_output=True, text=True,
                          timeout=120, env=dict(_clean_env(tmp_path), LLMRNN_SDM="apptainer"), check=False)
    assert proc.returncode == 0, proc.stderr
    shown = subprocess.run([llmrnn, "config", "show", "--configfile", SMOKE], cwd=REPO, capture_output=True,
                           text=True, timeout=120, check=True).stdout
    assert 'train.report_to: "tensorboard"  # config/smoke.yaml' in shown
    assert "train.total_steps: 3  # config/smoke.yaml" in shown


def test_llmrnn_check_says_to_run_the_smoke_test_before_a_verl_run(tmp_path):
    llmrnn = str(Path(sys.executable).parent / "llmrnn")
    env = _clean_env(tmp_path)
    for cfg, expect in ((SMOKE, False), ("config/reproduce.yaml", True), ("config/config.yaml", False)):
        proc = subprocess.run([llmrnn, "check", "--configfile", cfg], cwd=REPO, capture_output=True, text=True,
                              timeout=120, env=env, check=False)
        said = "snakemake --profile profiles/slurm all --configfile config/smoke.yaml" in proc.stdout + proc.stderr
        assert said is expect, (cfg, proc.stdout, proc.stderr)


@pytest.mark.verl
def test_smoke_verl_overrides_compose_and_validate_in_verl_071(tmp_path, tiny_model_dir):
    from llmrnn.runconfig import resolve as _resolve
    from tests.test_train_verl import check

    config, _ = _resolve([read_layer(REPO / SMOKE)], REPO / "workflow/schemas/config.schema.yaml")
    proc = check("0.7.1", tmp_path, tiny_model_dir, config["train"])
    assert proc.returncode == 0, proc.stderr[-3000:]
    report = json.loads(proc.stdout.strip().splitlines()[-1])
    assert report["verl"] == "0.7.1" and report["rollout_name"] == "vllm" and report["rollout_n"] == 4
    assert report["logger"] == ["console", "file", "tensorboard"] and report["logger_unsupported"] == []


@pytest.mark.slow
def test_smoke_cpu_stages_run_here(workflow_dir):
    """The stages before the first GPU job run on CPU: the synthetic cohort, its cleaning and the split."""
    from tests.conftest import snakemake

    copy_extra_parts(workflow_dir)
    snakemake(workflow_dir, "results/smoke/splits/splits.json", "--configfile", SMOKE)
    sizes = json.loads((workflow_dir / "results/smoke/splits/splits.json").read_text())["sizes"]
    config = yaml.safe_load((REPO / SMOKE).read_text())
    assert (sizes["train"], sizes["val"]) == (config["split"]["train_size"], config["split"]["val_size"])
    assert sizes["test"] >= config["eval"]["max_patients"]  # the eval's patients exist
