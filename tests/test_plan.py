"""llmrnn.plan: the decisions of the workflow, asserted for the shipped configs and their variants.

Configs are built the way the workflow builds them (llmrnn.runconfig: the named files layered in
order over the schema's defaults, Snakemake's own validate); an overlay is a `--config`-like layer.
The last tests run the real Snakefile (dry runs) and check that its jobs carry the plan's values."""

from __future__ import annotations

import json
import shlex
from types import SimpleNamespace

import pytest

from llmrnn.errors import InputError, LlmrnnError
from llmrnn.plan import MemoryHeadRecipe, Plan, QaRecipe, input_flag, model_dir_of
from tests.conftest import REPO, snakemake
from tests.slurm.dag import job_counts, parse_dry_run, prepare_reproduce_inputs

DEMO = "config/config.yaml"
QA_DEMO = "config/qa_demo.yaml"
REPRODUCE = "config/reproduce.yaml"
QA_REPRODUCE = "config/qa_reproduce.yaml"
SMOLLM2_READY = "resources/models/smollm2-135m-instruct/.ready"
LLAMA_READY = "resources/models/llama-3.2-3b-instruct/.ready"
RUBRICARM_READY = "resources/judge_models/OpenRubrics--RubricARM-8B-Judge/.ready"


@pytest.fixture(autouse=True)
def workdir(tmp_path, monkeypatch):
    """A working directory like the workflow's: config/ and workflow/ of this repository, and the data
    files the reproduction configs name (relative paths are the workflow's working directory's)."""
    work = tmp_path / "work"
    work.mkdir()
    for part in ("config", "workflow"):
        (work / part).symlink_to(REPO / part)
    monkeypatch.chdir(work)
    return work


def plan_of(*files: str, overlay: dict | None = None) -> Plan:
    return Plan.from_configfiles(*files, overrides=overlay, schema_path=REPO / "workflow" / "schemas" / "config.schema.yaml")


def wc(**values) -> SimpleNamespace:
    """Snakemake's wildcards (read by attribute)."""
    return SimpleNamespace(**values)


# ----------------------------------------------------------------------------- the embedded CPU demo
def test_demo_plans_a_cpu_run_with_trl_and_no_judge():
    plan = plan_of(DEMO)
    assert plan.paths.run == "results/demo" and plan.paths.logs == "logs/demo"
    assert plan.recipe.name == "memory_head" and not plan.judge.planned()
    assert [plan.conda_env(s) for s in ("data", "cpu", "forward", "train")] == [
        "../envs/data.yaml", "../envs/cpu.yaml", "../envs/cpu.yaml", "../envs/cpu.yaml"]
    assert plan.train.gpus() == 0 and plan.train.judge_gpus() == 0
    assert plan.train.threads() == plan.config["train"]["trl"]["num_threads"]
    assert plan.judge.preflight_threads() == 1  # no judge service to share cores with: a core of its own
    assert "judge" not in json.loads(plan.judge.preflight_cfg())
    assert plan.release.rubric_input() == {} and plan.release.split_format() == []


def test_demo_targets_are_the_memory_head_dag_under_its_run():
    plan = plan_of(DEMO)
    assert plan.trajectories.targets() == [
        "results/demo/trajectories/train.parquet", "results/demo/trajectories/train.summary.json",
        "results/demo/trajectories/val.parquet", "results/demo/trajectories/val.summary.json"]
    assert plan.evaluate.heldout_targets()[:2] == ["results/demo/eval/metrics.json", "results/demo/eval/comparison.json"]
    assert plan.release.targets() == [
        "results/demo/release/README.md", "results/demo/release/MANIFEST.json",
        "results/demo/release/upload_receipt.json"]
    shards = plan.config["eval"]["shards"]
    assert plan.evaluate.variants() == ["base", "trained"]
    assert len(plan.evaluate.shard_files("graded")) == 2 * shards
    assert plan.evaluate.shard_files("graded")[0] == "results/demo/eval/base/graded_0.jsonl"
    assert plan.trajectories.shard_files("val", "parquet")[-1] == (
        f"results/demo/trajectories/shards/val/part_{plan.config['trajectories']['shards'] - 1}.parquet")


def test_demo_models_and_the_trained_variant():
    plan = plan_of(DEMO)
    assert plan.models.role_markers() == [SMOLLM2_READY]  # three roles, one model: one marker
    assert plan.models.memory_model_input() == SMOLLM2_READY
    assert plan.evaluate.shard_inputs(wc(variant="base")) == [SMOLLM2_READY]
    # the trained shard replays the base shard of its patients (their first visit step's prompts are the same)
    assert plan.evaluate.shard_inputs(wc(variant="trained", shard="1")) == [
        SMOLLM2_READY, "results/demo/eval/base/shard_1.jsonl", "results/demo/merged", "results/demo/merge_check.json",
        "results/demo/train/adapter"]
    assert plan.evaluate.memory_arg(wc(variant="trained", shard="1")) == [
        "--memory-model", "results/demo/merged", "--memory-adapter", "results/demo/train/adapter",
        "--replay", "results/demo/eval/base/shard_1.jsonl"]
    assert plan.evaluate.memory_arg(wc(variant="base")) == []
    assert plan.models.prepare_mem_mb(wc(name="smollm2-135m-instruct")) == 16000  # a GGUF to dequantise
    assert json.loads(plan.models.prepare_cfg(wc(name="smollm2-135m-instruct")))["source"] == "pypi_gguf"
    assert plan.cohort.raw_path() == "results/demo/cohort/built.json"  # built from synthetic PhysioNet files
    assert plan.cohort.mimic_iv_inputs()["discharge"] == "resources/cohort/mimic_iv_synthetic/note/discharge.csv.gz"


# ----------------------------------------------------------------------------- the reproduction
def test_reproduce_plans_verl_vllm_and_a_gpu_judge(workdir):
    prepare_reproduce_inputs(workdir)  # the credentialed cohort's stand-in at cohort.source
    plan = plan_of(REPRODUCE)
    assert plan.judge.planned()
    assert plan.conda_env("forward") == "../envs/vllm.yaml"  # the roles use the vLLM backend
    assert plan.conda_env("train") == "../envs/verl.yaml"
    assert plan.conda_env("judge") == "../envs/vllm.yaml" and plan.judge.gpus() == 1
    assert plan.train.gpus() == plan.config["train"]["n_gpus_per_node"] == 2
    assert plan.train.threads() == plan.config["train"]["resources"]["cpus_per_task"]
    assert plan.train.judge_gpus() == 1 and plan.judge.preflight_threads() == 0
    assert "judge" in json.loads(plan.judge.preflight_cfg())
    assert plan.judge.preflight_rubric_input() == {"rubric": plan.config["judge"]["rubric"]}
    assert plan.judge.model_input() == RUBRICARM_READY  # `source: hub`: prepare_judge_model's copy
    assert json.loads(plan.judge.model_cfg()) == {"model": "OpenRubrics/RubricARM-8B-Judge", "source": "hub"}
    assert plan.release.rubric_input() == {"rubric": plan.config["judge"]["rubric"]}
    assert plan.evaluate.variants() == ["base", "trained", "zero_shot", "full_history"]
    assert plan.models.role_markers() == [LLAMA_READY]
    assert plan.cohort.raw_path() == "results/phase1_v2judge_repro/cohort/built.json"  # rule build_cohort
    assert json.loads(plan.cohort.mimic_iv_cfg()) == {
        "diagnoses": "note", "min_visits": 2, "adults_only": False, "mode": "admission_time", "sections": None,
        "max_orphan_share": 0.01, "icd_version": None, "max_visits": None, "max_patients": 6488, "patient_seed": 42}
    assert plan.cohort.build_workers() == 2  # the rule's threads, not a param: how fast changes no output


def test_reproduce_without_its_cohort_is_one_line_naming_the_key():
    plan = plan_of(REPRODUCE)
    with pytest.raises(InputError, match=r"^cohort\.mimic_iv: data/mimiciv/hosp/patients\.csv\.gz: missing"):
        plan.cohort.mimic_iv_inputs()
    with pytest.raises(InputError, match=r"^cohort\.source: data/mimic_iv_llmrnn\.json does not exist\."):
        plan_of(REPRODUCE, overlay={"cohort": {"source": "data/mimic_iv_llmrnn.json"}}).cohort.raw_path()
    braced = plan_of(REPRODUCE, overlay={"cohort": {"source": "data/{x}.json"}})
    with pytest.raises(InputError, match="contains a brace"):
        braced.cohort.raw_path()


def test_outcome_reward_on_the_reproduction_plans_no_judge():
    plan = plan_of(REPRODUCE, overlay={"reward": {"mode": "outcome"}})
    assert not plan.judge.planned()
    assert plan.train.judge_gpus() == 0 and plan.judge.preflight_threads() == 1
    assert plan.judge.preflight_rubric_input() == {} and plan.release.rubric_input() == {}
    assert "judge" not in json.loads(plan.judge.preflight_cfg())
    assert plan.judge.gpus() == 1  # the rubric still describes a vLLM judge; it is just not planned


@pytest.mark.parametrize("mode", ["scalar", "pairwise"])
def test_judged_reward_on_the_demo_plans_its_cpu_judge(mode):
    plan = plan_of(DEMO, overlay={"reward": {"mode": mode}})
    assert plan.judge.planned() and plan.judge.preflight_threads() == 0
    assert plan.conda_env("judge") == "../envs/cpu.yaml" and plan.train.judge_gpus() == 0
    assert json.loads(plan.judge.preflight_cfg())["judge"] == plan.config["judge"]


# ----------------------------------------------------------------------------- engines, roles, eval
def test_verl_engine_takes_gpus_per_node_unless_resources_name_them():
    plan = plan_of(DEMO, overlay={"train": {"engine": "verl", "n_gpus_per_node": 4}})
    assert plan.conda_env("train") == "../envs/verl.yaml"
    assert plan.train.gpus() == 4
    assert plan.train.threads() == plan.config["train"]["resources"]["cpus_per_task"]
    pinned = plan_of(DEMO, overlay={"train": {"engine": "verl", "resources": {"gpu": 1}}})
    assert pinned.train.gpus() == 1
    assert plan_of(DEMO, overlay={"train": {"resources": {"gpu": 1}}}).train.gpus() == 1  # trl, asked


def test_each_stage_gives_its_resources_in_one_call():
    """A rule's `resources:` is its stage plan's method (`**plan.train.resources()`): memory grows on a retry,
    the runtime too unless the job resumes (training) or lives as long as its consumers (the judge); the GRPO
    job's GPUs are plan.train.gpus, merge's are placed from merge.resources.gpu (llmrnn.slurm.gpu_placement)."""
    plan = plan_of(DEMO, overlay={"train": {"engine": "verl", "n_gpus_per_node": 4}, "merge": {"resources": {"gpu": 2}}})
    c = plan.config
    train = plan.train.resources()
    assert list(train) == ["gpu", "mem_mb", "runtime", "cpus_per_task"] and train["gpu"] == 4
    assert train["runtime"] == c["train"]["resources"]["runtime"]  # a number: no growth on a retry
    assert train["mem_mb"](wc(), 1) == c["train"]["resources"]["mem_mb"]
    assert train["mem_mb"](wc(), 2) == round(c["train"]["resources"]["mem_mb"] * 1.5)
    merge = plan.merge.resources()
    assert merge["gpu"] == 2 and merge["slurm_partition"] and list(merge)[-3:] == ["mem_mb", "runtime", "cpus_per_task"]
    assert merge["runtime"](wc(), 2) == round(c["merge"]["resources"]["runtime"] * 1.5)
    assert plan_of(DEMO).merge.resources()["gpu"] == 0 and "slurm_partition" not in plan_of(DEMO).merge.resources()
    for stage, res in (("trajectories", plan.trajectories.resources()), ("eval", plan.evaluate.resources()),
                       ("qa.sft", plan.qa.sft_resources()), ("qa.eval", plan.qa.eval_resources())):
        section = c
        for key in stage.split("."):
            section = section[key]
        assert res["gpu"] == section["resources"]["gpu"], stage
        assert res["runtime"](wc(), 1) == section["resources"]["runtime"], stage
    assert plan.judge.resources()["gpu"] == plan.judge.gpus()
    assert plan.judge.resources()["runtime"] == c["judge"]["resources"]["runtime"]
    assert plan.qa.judge_resources() == {"runtime": c["qa"]["eval"]["resources"]["runtime"]}


def test_eval_trained_model_replaces_the_merged_model():
    plan = plan_of(DEMO, overlay={"eval": {"trained_model": "elsewhere/trained"}})
    assert plan.evaluate.trained_model() == "elsewhere/trained"
    inputs = plan.evaluate.shard_inputs(wc(variant="trained", shard="0"))
    assert inputs == [SMOLLM2_READY, "results/demo/eval/base/shard_0.jsonl", "elsewhere/trained/config.json"]
    assert not any("merge" in i for i in inputs)
    assert plan.evaluate.memory_arg(wc(variant="trained", shard="0")) == [
        "--memory-model", "elsewhere/trained", "--replay", "results/demo/eval/base/shard_0.jsonl"]


def test_openai_roles_load_no_local_model():
    served = {"backend": "openai", "model": "served-name", "url": "http://127.0.0.1:8000/v1"}
    plan = plan_of(DEMO, overlay={"roles": {"prediction": served, "evaluation": served}})
    assert plan.models.role_markers() == [SMOLLM2_READY]  # the memory role's model only
    assert plan.evaluate.shard_inputs(wc(variant="trained", shard="0")) == [
        "results/demo/eval/base/shard_0.jsonl", "results/demo/merged", "results/demo/merge_check.json",
        "results/demo/train/adapter"]
    all_openai = plan_of(DEMO, overlay={"roles": {r: served for r in ("prediction", "evaluation", "memory")}})
    assert all_openai.models.role_markers() == [] and all_openai.evaluate.shard_inputs(wc(variant="base")) == []
    assert all_openai.conda_env("forward") == "../envs/cpu.yaml"


def test_vllm_roles_and_a_model_path():
    plan = plan_of(DEMO, overlay={"roles": {"memory": {"backend": "vllm", "model": "./local/memory"}}})
    assert plan.conda_env("forward") == "../envs/vllm.yaml"  # one vLLM role is enough
    assert plan.models.memory_model_input() == "./local/memory"  # a path is its own input, no marker
    assert plan.models.role_markers() == [SMOLLM2_READY]
    assert plan.evaluate.shard_inputs(wc(variant="base")) == ["./local/memory", SMOLLM2_READY]


def test_an_unconfigured_model_or_stage_is_one_line():
    plan = plan_of(DEMO, overlay={"roles": {"prediction": {"model": "not-configured"}}})
    with pytest.raises(InputError, match=r"^model 'not-configured' is used but not configured: add models\."):
        plan.models.role_markers()
    with pytest.raises(InputError, match=r"^models\.nope: not configured"):
        plan.models.prepare_cfg(wc(name="nope"))
    with pytest.raises(InputError, match="unknown stage 'gpu'"):
        plan.conda_env("gpu")


# ----------------------------------------------------------------------------- params carry exactly what a rule depends on
def test_params_change_with_their_knobs_and_only_with_them():
    base = plan_of(DEMO)
    eval_knobs = plan_of(DEMO, overlay={"eval": {"stats": {"bootstrap": {"seed": 7}}, "resources": {"mem_mb": 1}}})
    assert eval_knobs.evaluate.forward_cfg() == base.evaluate.forward_cfg()  # grading/statistics: no forward rerun
    assert eval_knobs.release.build_cfg() == base.release.build_cfg()  # eval never reruns the release
    assert eval_knobs.evaluate.section_cfg("final_judge", "stats") != base.evaluate.section_cfg("final_judge", "stats")
    assert plan_of(DEMO, overlay={"eval": {"seed": 9}}).evaluate.forward_cfg() != base.evaluate.forward_cfg()
    resources = plan_of(DEMO, overlay={"trajectories": {"resources": {"mem_mb": 1}, "threads": 2},
                                       "merge": {"resources": {"mem_mb": 1}}})
    assert resources.trajectories.shard_cfg() == base.trajectories.shard_cfg()
    assert resources.merge.run_cfg() == base.merge.run_cfg()
    assert resources.release.build_cfg() == base.release.build_cfg()
    lora = plan_of(DEMO, overlay={"train": {"lora": {"rank": 4, "alpha": 8}}})
    assert json.loads(lora.merge.run_cfg())["train"] == {"lora": {"rank": 4, "alpha": 8}}
    assert lora.release.build_cfg() != base.release.build_cfg()


def test_trajectories_params_name_only_the_models_the_roles_use():
    plan = plan_of(DEMO, overlay={"models": {"unused": {"source": "local", "path": "/x"}}})
    cfg = json.loads(plan.trajectories.shard_cfg())
    assert set(cfg["models"]) == {"smollm2-135m-instruct"}
    assert "resources" not in cfg["trajectories"] and "threads" not in cfg["trajectories"]


# ----------------------------------------------------------------------------- recipe qa
def test_qa_demo_plans_sft_then_grpo_on_cpu():
    plan = plan_of(QA_DEMO)
    qa = "results/qa_demo/qa"
    assert plan.recipe.name == "qa" and not plan.judge.planned()  # its judge weight is 0
    assert plan.qa.variants() == ["base", "sft", "grpo"]
    assert plan.qa.eval_splits() == ["test", "ood"]  # synthetic OOD questions
    assert plan.qa.policy_input() == plan.merge.base_input() == f"{qa}/sft/merged"
    assert plan.conda_env("sft") == "../envs/cpu.yaml" and plan.conda_env("train") == "../envs/cpu.yaml"
    assert plan.qa.source_path() == "resources/qa/synthetic.jsonl"
    assert plan.qa.ood_path() == "resources/qa/synthetic_ood.jsonl"
    assert plan.recipe.heldout_targets() == plan.qa.eval_targets()
    assert plan.products() == [f"{qa}/splits.json", *plan.release.targets(), *plan.qa.eval_targets()]
    assert plan.recipe.release_reference() == {
        "splits": f"{qa}/splits.json", "split_files": [f"{qa}/{s}.jsonl" for s in ("train", "val", "test", "ood")]}
    assert len(plan.qa.eval_files()) == 6 and "results/qa_demo/eval/sft/ood.jsonl" in plan.qa.eval_files()
    assert plan.qa.eval_model(wc(variant="sft")) == {"model": f"{qa}/sft/merged", "check": f"{qa}/sft/merge_check.json"}
    assert plan.qa.eval_model(wc(variant="base")) == {"model": SMOLLM2_READY}
    assert plan.release.split_format() == ["--split-format", "qa"]
    assert plan.release.rubric_input() == {}  # its reward asks no judge: the card names none
    assert not plan.qa.eval_judged()  # multiple-choice letters: exact match grades them, no judge started
    reward = json.loads(plan.qa.train_cfg())["reward"]
    assert reward["fluency_model"] == "resources/models/smollm2-135m-instruct"  # the folder, not the marker
    assert reward["rubric"] == plan.config["judge"]["rubric"]  # no qa.reward.rubric: judge.rubric
    release = json.loads(plan.release.build_cfg())["knobs"]
    assert release["recipe"] == "qa" and "eval" not in release["qa"] and "resources" not in release["qa"]["sft"]


def test_the_grpo_rule_takes_its_name_inputs_and_flags_from_the_recipe():
    """The GRPO rule of each recipe: train_grpo (rules/train.smk) after preflight, or qa_train_grpo
    (rules/qa.smk) after qa_preflight with the QA rewards; the recipe is chosen once, from config `recipe`."""
    from snakemake.iocontainers import InputFiles as Namedlist  # what a params function gets as `input`

    demo, qa = plan_of(DEMO), plan_of(QA_DEMO)
    assert (type(demo.recipe), type(qa.recipe)) == (MemoryHeadRecipe, QaRecipe)
    assert (demo.train.rule_name(), qa.train.rule_name()) == ("train_grpo", "qa_train_grpo")
    for plan in (demo, qa):  # each GRPO rule is in its recipe's rule files, named as the recipe says
        texts = "".join((REPO / f).read_text() for f in plan.recipe.rule_files)
        assert f"\nrule {plan.train.rule_name()}:\n" in texts
    assert demo.train.inputs() == {"train": "results/demo/trajectories/train.parquet",
                                   "val": "results/demo/trajectories/val.parquet",
                                   "preflight": "results/demo/train/preflight.json", "model": SMOLLM2_READY}
    assert qa.train.inputs() == {"train": "results/qa_demo/qa/train.parquet", "val": "results/qa_demo/qa/val.parquet",
                                 "preflight": "results/qa_demo/train/qa_preflight.json",
                                 "model": "results/qa_demo/qa/sft/merged"}
    alone = Namedlist(fromdict={"preflight": "p.json"})
    judged = Namedlist(fromdict={"preflight": "p.json", "endpoint": "e.json"})
    assert demo.train.run_flags(wc(), alone) == ["--preflight", "p.json", "--judge-gpus", "0"]
    assert demo.train.run_flags(wc(), judged) == ["--preflight", "p.json", "--endpoint", "e.json", "--judge-gpus", "0"]
    assert qa.train.run_flags(wc(), judged) == ["--preflight", "p.json", "--endpoint", "e.json",
                                                "--reward-func", "llmrnn.qa.rewards:trl_reward_func"]
    assert demo.train.reward_code() == [] and qa.train.reward_code() == ["llmrnn.qa.rewards"]
    assert (demo.train.priority(), qa.train.priority()) == (10, 0)
    assert qa.train.run_cfg() == qa.qa.train_cfg()
    assert set(json.loads(demo.train.run_cfg())) == {"train", "reward", "preflight"}


def test_the_recipe_names_the_products_and_the_release_reference_of_its_run():
    """What `all` requests and what the release's PHI guard is held to are the recipe's: the memory head's
    cohort splits, trajectories, preflight, training plots and agreement figure; the QA data for recipe qa.
    The cost plan counts the memory head's GPU stages and refuses recipe qa's (not planned yet)."""
    from llmrnn.cost_plan import plan_stages

    demo, qa = plan_of(DEMO), plan_of(QA_DEMO)
    run = "results/demo"
    assert demo.recipe.release_reference() == {
        "splits": f"{run}/splits/splits.json", "split_files": [f"{run}/splits/{s}.json" for s in ("train", "val", "test")]}
    assert demo.products() == [f"{run}/splits/splits.json", *demo.trajectories.targets(), f"{run}/train/preflight.json",
                               *(f"{run}/train/plots/{p}.png" for p in ("reward", "kl", "truncation")),
                               f"{run}/judge/plots/judge_agreement.png", *demo.release.targets(),
                               *demo.evaluate.heldout_targets()]
    no_pairs = plan_of(DEMO, overlay={"preflight": {"agreement_pairs": 0}})
    assert f"{run}/judge/plots/judge_agreement.png" not in no_pairs.products()
    assert {s["stage"] for s in plan_stages(demo.config)} <= set(demo.recipe.cost_stages)
    with pytest.raises(LlmrnnError, match="recipe qa is not planned yet"):
        plan_stages(qa.config)


def test_qa_without_sft_or_ood_starts_grpo_from_the_base_model():
    plan = plan_of(QA_DEMO, overlay={"qa": {"sft": {"enabled": False}, "ood": None}})
    assert plan.qa.variants() == ["base", "grpo"] and plan.qa.eval_splits() == ["test"]
    assert plan.qa.policy_input() == plan.merge.base_input() == SMOLLM2_READY
    assert plan.qa.ood_path() == [] and plan.qa.ood_param(wc(), SimpleNamespace()) == ""
    assert plan.qa.eval_model(wc(variant="grpo")) == {
        "model": "results/qa_demo/merged", "check": "results/qa_demo/merge_check.json"}


def test_qa_reproduce_plans_gpu_sft_verl_and_the_judge(workdir):
    plan = plan_of(QA_REPRODUCE)
    assert plan.judge.planned()  # hybrid scoring: judge weight 0.5
    assert plan.conda_env("sft") == "../envs/verl.yaml" and plan.conda_env("train") == "../envs/verl.yaml"
    assert plan.qa.model_input() == LLAMA_READY
    assert plan.qa.eval_splits() == ["test"]  # qa.ood: null
    assert json.loads(plan.qa.train_cfg())["reward"]["rubric"] == "config/rubrics/qa_correctness_rubricarm.yaml"
    with pytest.raises(InputError, match=r"^qa\.source: data/ecg_expert_qa/train\.json does not exist"):
        plan.qa.source_path()
    (workdir / "data" / "ecg_expert_qa").mkdir(parents=True)
    (workdir / "data" / "ecg_expert_qa" / "train.json").write_text("[]")
    assert plan.qa.source_path() == "data/ecg_expert_qa/train.json"
    hub = plan_of(QA_REPRODUCE, overlay={"qa": {"source": "hf:some/dataset"}})
    assert hub.qa.source_path() == []  # resolved by the CLI, not a tracked file
    assert hub.qa.source_param(wc(), SimpleNamespace()) == "hf:some/dataset"
    assert hub.qa.source_param(wc(), SimpleNamespace(source="tracked.jsonl")) == "tracked.jsonl"


def test_free_text_answers_are_judge_graded_where_a_judge_is_configured():
    """qa.eval.judge auto: qa_reproduce's free-text answers (judge weight 0.5) are judge-graded by its reward's
    rubric, gather reads the judged copies; the judge knobs stay out of the generation's params (a threshold
    change regrades, it does not regenerate); true/false decide for any config."""
    repro = plan_of(QA_REPRODUCE)
    assert repro.qa.eval_judged() and repro.qa.grading_rubric() == "config/rubrics/qa_correctness_rubricarm.yaml"
    assert repro.qa.eval_files() == repro.qa.judged_files() == ["results/qa_ecg_repro/eval/base/test.judged.jsonl",
                                                                "results/qa_ecg_repro/eval/sft/test.judged.jsonl",
                                                                "results/qa_ecg_repro/eval/grpo/test.judged.jsonl"]
    assert repro.qa.answer_files() == [p.replace(".judged", "") for p in repro.qa.judged_files()]
    judge_cfg = json.loads(repro.qa.judge_cfg())
    assert {k: judge_cfg[k] for k in ("eval", "max_fallback_rate")} == {"eval": {"k": 8, "judge_threshold": 0.5},
                                                                       "max_fallback_rate": 0.25}
    # every wait on the judge is bounded by the config's reward settings (not the library's defaults)
    assert {"timeout_s", "retries", "health_timeout_s", "call_budget_s", "dead_after_s"} <= set(judge_cfg["reward"])
    assert "mode" not in judge_cfg["reward"]  # the judge grades whatever reward.mode trains with
    quick = plan_of(QA_REPRODUCE, overlay={"reward": {"timeout_s": 7}})
    assert json.loads(quick.qa.judge_cfg())["reward"]["timeout_s"] == 7
    assert repro.release.rubric_input() == {"rubric": "config/rubrics/qa_correctness_rubricarm.yaml"}
    stricter = plan_of(QA_REPRODUCE, overlay={"qa": {"eval": {"judge_threshold": 0.8}}})
    assert stricter.qa.eval_cfg() == repro.qa.eval_cfg() and stricter.qa.judge_cfg() != repro.qa.judge_cfg()
    assert not plan_of(QA_REPRODUCE, overlay={"qa": {"eval": {"judge": False}}}).qa.eval_judged()
    demo = plan_of(QA_DEMO, overlay={"qa": {"eval": {"judge": True}}})
    assert demo.qa.eval_judged() and not demo.judge.planned()  # graded by a judge that training never asked
    assert demo.qa.eval_files() == demo.qa.judged_files() and demo.release.rubric_input() == {}


# ----------------------------------------------------------------------------- small pieces
def test_input_flag_passes_an_optional_input_only_when_the_job_has_it():
    from snakemake.iocontainers import InputFiles as Namedlist  # what a params function gets as `input`

    with_endpoint = Namedlist(fromdict={"endpoint": "results/x/judge/endpoint.json", "train": "t.parquet"})
    flag = input_flag("--endpoint", "endpoint")
    assert flag(wc(), with_endpoint) == ["--endpoint", "results/x/judge/endpoint.json"]
    # a file NAMED like the key is no key: the test is on the input's names, not its files
    assert flag(wc(), Namedlist(fromdict={"train": "endpoint"})) == []
    assert model_dir_of("resources/models/m/.ready") == "resources/models/m"
    assert model_dir_of("./my/model") == "./my/model"


STAGES = ("cohort", "models", "trajectories", "judge", "train", "evaluate", "merge", "release", "qa", "recipe")


def test_every_plan_call_in_the_rules_names_what_its_stage_defines():
    """The rules call the plan as written (`plan.train.resources()`, `plan.conda_env("cpu")`): each call
    names a stage of Plan and what that stage's class defines, so grepping it finds the definition; no
    rule file binds plan methods or imports a plan class."""
    import re

    texts = {p.name: p.read_text() for p in (REPO / "rules").glob("*.smk")}
    texts["Snakefile"] = (REPO / "Snakefile").read_text()
    plan = plan_of(DEMO)
    used = set()
    for name, text in texts.items():
        assert "helper(" not in text and "globals()" not in text, name
        assert not re.search(r"^from llmrnn\.plan\.\w+ import", text, re.MULTILINE), name
        for attr, member in re.findall(r"(?<![\w.])plan\.(\w+)(?:\.(\w+))?", text):
            if attr in STAGES and member:  # (a comment may name the stage alone)
                assert member in dir(type(getattr(plan, attr))), f"{name}: plan.{attr}.{member}"
                used.add(attr)
            elif attr not in STAGES:
                assert attr in dir(plan), f"{name}: plan.{attr}"
    assert used == set(STAGES)  # the scan sees every stage's calls
    assert plan.paths.run == "results/demo" and plan.paths.models == "resources/models"
    assert plan.paths.qa == "results/demo/qa" and plan.paths.qa_synth == "resources/qa"


def test_each_stage_reads_other_stages_only_through_the_plans_it_is_given():
    """A stage's method calls on `self` are its own class's (or PlanBase's); another stage is reached through
    the plan passed to its constructor (`self.judge.planned()`), and no module imports another's private
    names."""
    import ast
    import importlib

    for path in sorted((REPO / "src" / "llmrnn" / "plan").glob("*.py")):
        tree = ast.parse(path.read_text())
        for node in ast.walk(tree):
            if isinstance(node, ast.ImportFrom) and (node.module or "").startswith("llmrnn"):
                assert not [a.name for a in node.names if a.name.startswith("_")], f"{path.name}: {node.module}"
        module = importlib.import_module(f"llmrnn.plan.{path.stem}" if path.stem != "__init__" else "llmrnn.plan")
        for cls in (n for n in tree.body if isinstance(n, ast.ClassDef)):
            defined = dir(getattr(module, cls.name))
            called = {node.func.attr for node in ast.walk(cls) if isinstance(node, ast.Call)
                      and isinstance(node.func, ast.Attribute) and isinstance(node.func.value, ast.Name)
                      and node.func.value.id == "self"}
            assert called <= set(defined), f"{path.name}: {cls.name} calls {sorted(called - set(defined))}"
    plan = plan_of(QA_DEMO)
    assert plan.recipe.qa is plan.qa and plan.qa.judge is plan.judge  # built once
    assert plan.train.recipe is plan.recipe and plan.merge.recipe is plan.recipe and plan.release.recipe is plan.recipe


def test_no_configfile_is_the_embedded_demo_and_overrides_layer_last():
    assert Plan.from_configfiles().config == plan_of(DEMO).config  # the Snakefile's rule (runconfig)
    assert plan_of(overlay={"run_name": "other"}).paths.run == "results/other"
    with pytest.raises(InputError, match="never cross recipes"):
        plan_of(REPRODUCE, QA_DEMO)


# ----------------------------------------------------------------------------- the workflow runs this plan
def _cfg(shell: str) -> dict:
    words = shlex.split(shell)
    return json.loads(words[words.index("--cfg") + 1])


@pytest.mark.parametrize("configfiles", [(), (QA_DEMO,)], ids=["demo", "qa_demo"])
def test_the_workflow_dry_run_carries_the_plans_values(shipped_dry_runs, configfiles):
    """A real `snakemake -n -p all`: job counts, threads and --cfg JSON are the plan's (the session's dry
    run of the shipped config, conftest.ShippedDryRuns, which test_plan_snapshot reads too)."""
    text = shipped_dry_runs.text(*configfiles)
    counts, jobs = job_counts(text), {j.rule: j for j in parse_dry_run(text)}
    plan = plan_of(*(configfiles or (DEMO,)))
    assert _cfg(jobs["release"].shell) == json.loads(plan.release.build_cfg())
    assert _cfg(jobs["merge_model"].shell) == json.loads(plan.merge.run_cfg())
    if plan.recipe.name == "qa":
        assert counts["qa_eval_model"] == len(plan.qa.eval_files())
        assert _cfg(jobs["qa_train_grpo"].shell) == json.loads(plan.qa.train_cfg())
        assert jobs["qa_train_grpo"].threads == plan.train.threads()
        return
    assert counts["eval_shard"] == len(plan.evaluate.shard_files("shard"))
    assert counts["trajectory_shard"] == 2 * len(plan.trajectories.shard_files("train", "parquet"))
    assert _cfg(jobs["trajectory_shard"].shell) == json.loads(plan.trajectories.shard_cfg())
    assert _cfg(jobs["preflight"].shell) == json.loads(plan.judge.preflight_cfg())
    assert jobs["preflight"].threads == plan.judge.preflight_threads()


def test_a_plan_error_stops_the_workflow_with_its_line(workflow_dir):
    """The plan's InputError reaches the user as Snakemake's error, one line naming the key."""
    prepare_reproduce_inputs(workflow_dir)
    (workflow_dir / "missing.yaml").write_text("cohort: {source: data/nowhere.json}\n")
    proc = snakemake(workflow_dir, "all", "-n", "--configfile", REPRODUCE, "missing.yaml", check=False)
    assert proc.returncode != 0
    assert "cohort.source: data/nowhere.json does not exist." in proc.stdout + proc.stderr
    assert "llmrnn/plan/" not in proc.stdout + proc.stderr  # the plan's line, not its traceback
    # a stage's method called while the rules are read (plan.models.role_markers() in trajectories.smk)
    (workflow_dir / "unknown.yaml").write_text("roles: {prediction: {model: not-configured}}\n")
    proc = snakemake(workflow_dir, "all", "-n", "--configfile", DEMO, "unknown.yaml", check=False)
    text = proc.stdout + proc.stderr
    assert proc.returncode != 0 and "llmrnn/plan/" not in text
    assert "WorkflowError" in text and "model 'not-configured' is used but not configured" in text


def test_every_baseline_the_settings_allow_is_an_eval_variant_the_rules_match():
    """eval.baselines names a variant eval_shard's {variant} wildcard must match (EvaluatePlan.VARIANT_PATTERN)
    and run_forward a memory mode of (llmrnn.evaluate.recall.BASELINES): memprompt included."""
    import re
    import typing

    from llmrnn.evaluate.recall import BASELINES
    from llmrnn.plan.evaluate import EvaluatePlan
    from llmrnn.settings.evaluation import Eval

    allowed = typing.get_args(typing.get_args(Eval.model_fields["baselines"].annotation)[0])
    assert "memprompt" in allowed and set(allowed) == set(BASELINES)
    plan = plan_of(DEMO, overlay={"eval": {"baselines": list(allowed)}})
    assert plan.evaluate.variants() == ["base", "trained", *allowed]
    assert all(re.fullmatch(EvaluatePlan.VARIANT_PATTERN, v) for v in plan.evaluate.variants())
