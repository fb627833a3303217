"""llmrnn.plan: the decisions of the workflow, asserted for the shipped configs and their variants.

Configs are built the way the workflow builds them (llmrnn.runconfig: the named files layered in
order over the schema's defaults, Snakemake's own validate); an overlay is a `--config`-like layer.
The last tests run the real Snakefile (dry runs) and check that its jobs carry the plan's values."""

from __future__ import annotations

import json
import shlex
from types import SimpleNamespace

import pytest

from llmrnn.errors import InputError
from llmrnn.plan import Plan, input_flag, model_dir_of
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
    assert plan.recipe_is("memory_head") and not plan.judge_planned()
    assert [plan.conda_env(s) for s in ("data", "cpu", "forward", "train")] == [
        "../envs/data.yaml", "../envs/cpu.yaml", "../envs/cpu.yaml", "../envs/cpu.yaml"]
    assert plan.train_gpus() == 0 and plan.train_judge_gpus() == 0
    assert plan.train_threads() == plan.config["train"]["trl"]["num_threads"]
    assert plan.preflight_threads() == 1  # no judge service to share cores with: a core of its own
    assert "judge" not in json.loads(plan.preflight_cfg())
    assert plan.release_rubric_input() == {} and plan.release_split_format() == []


def test_demo_targets_are_the_memory_head_dag_under_its_run():
    plan = plan_of(DEMO)
    assert plan.trajectory_targets() == [
        "results/demo/trajectories/train.parquet", "results/demo/trajectories/train.summary.json",
        "results/demo/trajectories/val.parquet", "results/demo/trajectories/val.summary.json"]
    assert plan.eval_heldout_targets()[:2] == ["results/demo/eval/metrics.json", "results/demo/eval/comparison.json"]
    assert plan.release_targets() == [
        "results/demo/release/README.md", "results/demo/release/MANIFEST.json",
        "results/demo/release/upload_receipt.json"]
    shards = plan.config["eval"]["shards"]
    assert plan.eval_variants() == ["base", "trained"]
    assert len(plan.eval_shard_files("graded")) == 2 * shards
    assert plan.eval_shard_files("graded")[0] == "results/demo/eval/base/graded_0.jsonl"
    assert plan.trajectory_shard_files("val", "parquet")[-1] == (
        f"results/demo/trajectories/shards/val/part_{plan.config['trajectories']['shards'] - 1}.parquet")


def test_demo_models_and_the_trained_variant():
    plan = plan_of(DEMO)
    assert plan.role_model_markers() == [SMOLLM2_READY]  # three roles, one model: one marker
    assert plan.memory_model_input() == SMOLLM2_READY
    assert plan.eval_shard_inputs(wc(variant="base")) == [SMOLLM2_READY]
    assert plan.eval_shard_inputs(wc(variant="trained")) == [
        SMOLLM2_READY, "results/demo/merged", "results/demo/merge_check.json", "results/demo/train/adapter"]
    assert plan.eval_memory_arg(wc(variant="trained")) == ["--memory-model", "results/demo/merged", "--memory-adapter", "results/demo/train/adapter"]
    assert plan.eval_memory_arg(wc(variant="base")) == []
    assert plan.model_mem_mb(wc(name="smollm2-135m-instruct")) == 16000  # a GGUF to dequantise
    assert json.loads(plan.model_cfg_json(wc(name="smollm2-135m-instruct")))["source"] == "pypi_gguf"
    assert plan.raw_cohort_path() == "results/demo/cohort/built.json"  # built from synthetic PhysioNet files
    assert plan.mimic_iv_inputs()["discharge"] == "resources/cohort/mimic_iv_synthetic/note/discharge.csv.gz"


# ----------------------------------------------------------------------------- the reproduction
def test_reproduce_plans_verl_vllm_and_a_gpu_judge(workdir):
    prepare_reproduce_inputs(workdir)  # the credentialed cohort's stand-in at cohort.source
    plan = plan_of(REPRODUCE)
    assert plan.judge_planned()
    assert plan.conda_env("forward") == "../envs/vllm.yaml"  # the roles use the vLLM backend
    assert plan.conda_env("train") == "../envs/verl.yaml"
    assert plan.conda_env("judge") == "../envs/vllm.yaml" and plan.judge_gpus() == 1
    assert plan.train_gpus() == plan.config["train"]["n_gpus_per_node"] == 2
    assert plan.train_threads() == plan.config["train"]["resources"]["cpus_per_task"]
    assert plan.train_judge_gpus() == 1 and plan.preflight_threads() == 0
    assert "judge" in json.loads(plan.preflight_cfg())
    assert plan.preflight_rubric_input() == {"rubric": plan.config["judge"]["rubric"]}
    assert plan.judge_model_input() == RUBRICARM_READY  # `source: hub`: prepare_judge_model's copy
    assert json.loads(plan.judge_model_cfg_json()) == {"model": "OpenRubrics/RubricARM-8B-Judge", "source": "hub"}
    assert plan.release_rubric_input() == {"rubric": plan.config["judge"]["rubric"]}
    assert plan.eval_variants() == ["base", "trained", "zero_shot", "full_history"]
    assert plan.role_model_markers() == [LLAMA_READY]
    assert plan.raw_cohort_path() == "results/phase1_v2judge_repro/cohort/built.json"  # rule build_cohort
    assert json.loads(plan.mimic_iv_cfg_json()) == {
        "diagnoses": "note", "min_visits": 2, "adults_only": False, "mode": "admission_time", "sections": None,
        "max_orphan_share": 0.01, "icd_version": None, "max_visits": None, "max_patients": 6488, "patient_seed": 42}
    assert plan.build_workers() == 2  # the rule's threads, not a param: how fast changes no output


def test_reproduce_without_its_cohort_is_one_line_naming_the_key():
    plan = plan_of(REPRODUCE)
    with pytest.raises(InputError, match=r"^cohort\.mimic_iv: data/mimiciv/hosp/patients\.csv\.gz: missing"):
        plan.mimic_iv_inputs()
    with pytest.raises(InputError, match=r"^cohort\.source: data/mimic_iv_llmrnn\.json does not exist\."):
        plan_of(REPRODUCE, overlay={"cohort": {"source": "data/mimic_iv_llmrnn.json"}}).raw_cohort_path()
    braced = plan_of(REPRODUCE, overlay={"cohort": {"source": "data/{x}.json"}})
    with pytest.raises(InputError, match="contains a brace"):
        braced.raw_cohort_path()


def test_outcome_reward_on_the_reproduction_plans_no_judge():
    plan = plan_of(REPRODUCE, overlay={"reward": {"mode": "outcome"}})
    assert not plan.judge_planned()
    assert plan.train_judge_gpus() == 0 and plan.preflight_threads() == 1
    assert plan.preflight_rubric_input() == {} and plan.release_rubric_input() == {}
    assert "judge" not in json.loads(plan.preflight_cfg())
    assert plan.judge_gpus() == 1  # the rubric still describes a vLLM judge; it is just not planned


@pytest.mark.parametrize("mode", ["scalar", "pairwise"])
def test_judged_reward_on_the_demo_plans_its_cpu_judge(mode):
    plan = plan_of(DEMO, overlay={"reward": {"mode": mode}})
    assert plan.judge_planned() and plan.preflight_threads() == 0
    assert plan.conda_env("judge") == "../envs/cpu.yaml" and plan.train_judge_gpus() == 0
    assert json.loads(plan.preflight_cfg())["judge"] == plan.config["judge"]


# ----------------------------------------------------------------------------- engines, roles, eval
def test_verl_engine_takes_gpus_per_node_unless_resources_name_them():
    plan = plan_of(DEMO, overlay={"train": {"engine": "verl", "n_gpus_per_node": 4}})
    assert plan.conda_env("train") == "../envs/verl.yaml"
    assert plan.train_gpus() == 4
    assert plan.train_threads() == plan.config["train"]["resources"]["cpus_per_task"]
    pinned = plan_of(DEMO, overlay={"train": {"engine": "verl", "resources": {"gpu": 1}}})
    assert pinned.train_gpus() == 1
    assert plan_of(DEMO, overlay={"train": {"resources": {"gpu": 1}}}).train_gpus() == 1  # trl, asked


def test_each_stage_gives_its_resources_in_one_call():
    """A rule's `resources:` is its stage's helper (`**train_resources()`): memory grows on a retry, the
    runtime too unless the job resumes (training) or lives as long as its consumers (the judge); the GRPO
    job's GPUs are train_gpus, merge's are placed from merge.resources.gpu (llmrnn.slurm.gpu_placement)."""
    plan = plan_of(DEMO, overlay={"train": {"engine": "verl", "n_gpus_per_node": 4}, "merge": {"resources": {"gpu": 2}}})
    c = plan.config
    train = plan.train_resources()
    assert list(train) == ["gpu", "mem_mb", "runtime", "cpus_per_task"] and train["gpu"] == 4
    assert train["runtime"] == c["train"]["resources"]["runtime"]  # a number: no growth on a retry
    assert train["mem_mb"](wc(), 1) == c["train"]["resources"]["mem_mb"]
    assert train["mem_mb"](wc(), 2) == round(c["train"]["resources"]["mem_mb"] * 1.5)
    merge = plan.merge_resources()
    assert merge["gpu"] == 2 and merge["slurm_partition"] and list(merge)[-3:] == ["mem_mb", "runtime", "cpus_per_task"]
    assert merge["runtime"](wc(), 2) == round(c["merge"]["resources"]["runtime"] * 1.5)
    assert plan_of(DEMO).merge_resources()["gpu"] == 0 and "slurm_partition" not in plan_of(DEMO).merge_resources()
    for stage, res in (("trajectories", plan.trajectory_resources()), ("eval", plan.eval_resources()),
                       ("qa.sft", plan.qa_sft_resources()), ("qa.eval", plan.qa_eval_resources())):
        section = c
        for key in stage.split("."):
            section = section[key]
        assert res["gpu"] == section["resources"]["gpu"], stage
        assert res["runtime"](wc(), 1) == section["resources"]["runtime"], stage
    assert plan.judge_resources()["gpu"] == plan.judge_gpus()
    assert plan.judge_resources()["runtime"] == c["judge"]["resources"]["runtime"]
    assert plan.qa_judge_resources() == {"runtime": c["qa"]["eval"]["resources"]["runtime"]}


def test_eval_trained_model_replaces_the_merged_model():
    plan = plan_of(DEMO, overlay={"eval": {"trained_model": "elsewhere/trained"}})
    assert plan.eval_trained_model() == "elsewhere/trained"
    inputs = plan.eval_shard_inputs(wc(variant="trained"))
    assert inputs == [SMOLLM2_READY, "elsewhere/trained/config.json"]
    assert not any("merge" in i for i in inputs)
    assert plan.eval_memory_arg(wc(variant="trained")) == ["--memory-model", "elsewhere/trained"]


def test_openai_roles_load_no_local_model():
    served = {"backend": "openai", "model": "served-name", "url": "http://127.0.0.1:8000/v1"}
    plan = plan_of(DEMO, overlay={"roles": {"prediction": served, "evaluation": served}})
    assert plan.role_model_markers() == [SMOLLM2_READY]  # the memory role's model only
    assert plan.eval_shard_inputs(wc(variant="trained")) == ["results/demo/merged", "results/demo/merge_check.json",
                                                               "results/demo/train/adapter"]
    all_openai = plan_of(DEMO, overlay={"roles": {r: served for r in ("prediction", "evaluation", "memory")}})
    assert all_openai.role_model_markers() == [] and all_openai.eval_shard_inputs(wc(variant="base")) == []
    assert all_openai.conda_env("forward") == "../envs/cpu.yaml"


def test_vllm_roles_and_a_model_path():
    plan = plan_of(DEMO, overlay={"roles": {"memory": {"backend": "vllm", "model": "./local/memory"}}})
    assert plan.conda_env("forward") == "../envs/vllm.yaml"  # one vLLM role is enough
    assert plan.memory_model_input() == "./local/memory"  # a path is its own input, no marker
    assert plan.role_model_markers() == [SMOLLM2_READY]
    assert plan.eval_shard_inputs(wc(variant="base")) == ["./local/memory", SMOLLM2_READY]


def test_an_unconfigured_model_or_stage_is_one_line():
    plan = plan_of(DEMO, overlay={"roles": {"prediction": {"model": "not-configured"}}})
    with pytest.raises(InputError, match=r"^model 'not-configured' is used but not configured: add models\."):
        plan.role_model_markers()
    with pytest.raises(InputError, match=r"^models\.nope: not configured"):
        plan.model_cfg_json(wc(name="nope"))
    with pytest.raises(InputError, match="unknown stage 'gpu'"):
        plan.conda_env("gpu")


# ----------------------------------------------------------------------------- params carry exactly what a rule depends on
def test_params_change_with_their_knobs_and_only_with_them():
    base = plan_of(DEMO)
    eval_knobs = plan_of(DEMO, overlay={"eval": {"stats": {"bootstrap": {"seed": 7}}, "resources": {"mem_mb": 1}}})
    assert eval_knobs.eval_forward_cfg() == base.eval_forward_cfg()  # grading/statistics: no forward rerun
    assert eval_knobs.release_cfg_json() == base.release_cfg_json()  # eval never reruns the release
    assert eval_knobs.eval_cfg_json("final_judge", "stats") != base.eval_cfg_json("final_judge", "stats")
    assert plan_of(DEMO, overlay={"eval": {"seed": 9}}).eval_forward_cfg() != base.eval_forward_cfg()
    resources = plan_of(DEMO, overlay={"trajectories": {"resources": {"mem_mb": 1}, "threads": 2},
                                       "merge": {"resources": {"mem_mb": 1}}})
    assert resources.trajectories_cfg_json() == base.trajectories_cfg_json()
    assert resources.merge_cfg_json() == base.merge_cfg_json()
    assert resources.release_cfg_json() == base.release_cfg_json()
    lora = plan_of(DEMO, overlay={"train": {"lora": {"rank": 4, "alpha": 8}}})
    assert json.loads(lora.merge_cfg_json())["train"] == {"lora": {"rank": 4, "alpha": 8}}
    assert lora.release_cfg_json() != base.release_cfg_json()


def test_trajectories_params_name_only_the_models_the_roles_use():
    plan = plan_of(DEMO, overlay={"models": {"unused": {"source": "local", "path": "/x"}}})
    cfg = json.loads(plan.trajectories_cfg_json())
    assert set(cfg["models"]) == {"smollm2-135m-instruct"}
    assert "resources" not in cfg["trajectories"] and "threads" not in cfg["trajectories"]


# ----------------------------------------------------------------------------- recipe qa
def test_qa_demo_plans_sft_then_grpo_on_cpu():
    plan = plan_of(QA_DEMO)
    qa = "results/qa_demo/qa"
    assert plan.recipe_is("qa") and not plan.judge_planned()  # its judge weight is 0
    assert plan.qa_variants() == ["base", "sft", "grpo"]
    assert plan.qa_eval_splits() == ["test", "ood"]  # synthetic OOD questions
    assert plan.qa_policy_input() == plan.merge_base_input() == f"{qa}/sft/merged"
    assert plan.conda_env("sft") == "../envs/cpu.yaml" and plan.conda_env("train") == "../envs/cpu.yaml"
    assert plan.qa_source_path() == "resources/qa/synthetic.jsonl"
    assert plan.qa_ood_path() == "resources/qa/synthetic_ood.jsonl"
    assert plan.eval_heldout_targets() == plan.qa_eval_targets()
    assert plan.qa_targets() == [f"{qa}/splits.json", *plan.release_targets(), *plan.qa_eval_targets()]
    assert len(plan.qa_eval_files()) == 6 and "results/qa_demo/eval/sft/ood.jsonl" in plan.qa_eval_files()
    assert plan.qa_eval_model(wc(variant="sft")) == {"model": f"{qa}/sft/merged", "check": f"{qa}/sft/merge_check.json"}
    assert plan.qa_eval_model(wc(variant="base")) == {"model": SMOLLM2_READY}
    assert plan.release_split_format() == ["--split-format", "qa"]
    assert plan.release_rubric_input() == {}  # its reward asks no judge: the card names none
    assert not plan.qa_eval_judged()  # multiple-choice letters: exact match grades them, no judge started
    reward = json.loads(plan.qa_train_cfg())["reward"]
    assert reward["fluency_model"] == "resources/models/smollm2-135m-instruct"  # the folder, not the marker
    assert reward["rubric"] == plan.config["judge"]["rubric"]  # no qa.reward.rubric: judge.rubric
    release = json.loads(plan.release_cfg_json())["knobs"]
    assert release["recipe"] == "qa" and "eval" not in release["qa"] and "resources" not in release["qa"]["sft"]


def test_qa_without_sft_or_ood_starts_grpo_from_the_base_model():
    plan = plan_of(QA_DEMO, overlay={"qa": {"sft": {"enabled": False}, "ood": None}})
    assert plan.qa_variants() == ["base", "grpo"] and plan.qa_eval_splits() == ["test"]
    assert plan.qa_policy_input() == plan.merge_base_input() == SMOLLM2_READY
    assert plan.qa_ood_path() == [] and plan.qa_ood_param(wc(), SimpleNamespace()) == ""
    assert plan.qa_eval_model(wc(variant="grpo")) == {
        "model": "results/qa_demo/merged", "check": "results/qa_demo/merge_check.json"}


def test_qa_reproduce_plans_gpu_sft_verl_and_the_judge(workdir):
    plan = plan_of(QA_REPRODUCE)
    assert plan.judge_planned()  # hybrid scoring: judge weight 0.5
    assert plan.conda_env("sft") == "../envs/verl.yaml" and plan.conda_env("train") == "../envs/verl.yaml"
    assert plan.qa_model_input() == LLAMA_READY
    assert plan.qa_eval_splits() == ["test"]  # qa.ood: null
    assert json.loads(plan.qa_train_cfg())["reward"]["rubric"] == "config/rubrics/qa_correctness_rubricarm.yaml"
    with pytest.raises(InputError, match=r"^qa\.source: data/ecg_expert_qa/train\.json does not exist"):
        plan.qa_source_path()
    (workdir / "data" / "ecg_expert_qa").mkdir(parents=True)
    (workdir / "data" / "ecg_expert_qa" / "train.json").write_text("[]")
    assert plan.qa_source_path() == "data/ecg_expert_qa/train.json"
    hub = plan_of(QA_REPRODUCE, overlay={"qa": {"source": "hf:some/dataset"}})
    assert hub.qa_source_path() == []  # resolved by the CLI, not a tracked file
    assert hub.qa_source_param(wc(), SimpleNamespace()) == "hf:some/dataset"
    assert hub.qa_source_param(wc(), SimpleNamespace(source="tracked.jsonl")) == "tracked.jsonl"


def test_free_text_answers_are_judge_graded_where_a_judge_is_configured():
    """qa.eval.judge auto: qa_reproduce's free-text answers (judge weight 0.5) are judge-graded by its reward's
    rubric, gather reads the judged copies; the judge knobs stay out of the generation's params (a threshold
    change regrades, it does not regenerate); true/false decide for any config."""
    repro = plan_of(QA_REPRODUCE)
    assert repro.qa_eval_judged() and repro.qa_grading_rubric() == "config/rubrics/qa_correctness_rubricarm.yaml"
    assert repro.qa_eval_files() == repro.qa_judged_files() == ["results/qa_ecg_repro/eval/base/test.judged.jsonl",
                                                                "results/qa_ecg_repro/eval/sft/test.judged.jsonl",
                                                                "results/qa_ecg_repro/eval/grpo/test.judged.jsonl"]
    assert repro.qa_answer_files() == [p.replace(".judged", "") for p in repro.qa_judged_files()]
    judge_cfg = json.loads(repro.qa_judge_cfg())
    assert {k: judge_cfg[k] for k in ("eval", "max_fallback_rate")} == {"eval": {"k": 8, "judge_threshold": 0.5},
                                                                       "max_fallback_rate": 0.25}
    # every wait on the judge is bounded by the config's reward settings (not the library's defaults)
    assert {"timeout_s", "retries", "health_timeout_s", "call_budget_s", "dead_after_s"} <= set(judge_cfg["reward"])
    assert "mode" not in judge_cfg["reward"]  # the judge grades whatever reward.mode trains with
    quick = plan_of(QA_REPRODUCE, overlay={"reward": {"timeout_s": 7}})
    assert json.loads(quick.qa_judge_cfg())["reward"]["timeout_s"] == 7
    assert repro.release_rubric_input() == {"rubric": "config/rubrics/qa_correctness_rubricarm.yaml"}
    stricter = plan_of(QA_REPRODUCE, overlay={"qa": {"eval": {"judge_threshold": 0.8}}})
    assert stricter.qa_eval_cfg() == repro.qa_eval_cfg() and stricter.qa_judge_cfg() != repro.qa_judge_cfg()
    assert not plan_of(QA_REPRODUCE, overlay={"qa": {"eval": {"judge": False}}}).qa_eval_judged()
    demo = plan_of(QA_DEMO, overlay={"qa": {"eval": {"judge": True}}})
    assert demo.qa_eval_judged() and not demo.judge_planned()  # graded by a judge that training never asked
    assert demo.qa_eval_files() == demo.qa_judged_files() and demo.release_rubric_input() == {}


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


def test_every_plan_method_a_rule_file_calls_is_bound_by_name_from_its_stage_class():
    """Grepping a helper a rule calls finds its binding `name = helper(StageClass.name)`, the class imported
    by name from llmrnn.plan.<stage>, and its definition there; nothing is pushed into the globals."""
    import importlib
    import re

    rules = {p.name: p.read_text() for p in (REPO / "rules").glob("*.smk")}
    rules["Snakefile"] = (REPO / "Snakefile").read_text()
    assert not any("globals()" in text for text in rules.values())
    bound = {}
    for name, text in rules.items():
        imported = {cls: mod for mod, names in re.findall(r"^from llmrnn\.plan(\.\w+)? import (.+)$",
                                                               text, re.MULTILINE)
                    for cls in names.split(", ")}
        for helper, cls, method in re.findall(r"^(\w+) = helper\((\w+)\.(\w+)\)", text, re.MULTILINE):
            assert helper not in bound, f"{helper} is bound twice ({bound[helper]}, {name})"
            assert cls in imported, f"{name}: {cls} is not imported by name"
            module = importlib.import_module("llmrnn.plan" + imported[cls])
            assert method in vars(getattr(module, cls)), f"{name}: {cls} does not define {method}"
            bound[helper] = name
    methods = {m for m in dir(Plan) if not m.startswith("_")} - {"from_configfiles"}
    called = {m for m in methods for text in rules.values() if re.search(rf"(?<![\w.]){m}\(", text)}
    assert called and called <= set(bound) | {"judge_planned"}, sorted(called - set(bound))
    helpers = plan_of(DEMO)
    assert helpers.paths.run == "results/demo" and helpers.paths.models == "resources/models"
    assert helpers.paths.qa == "results/demo/qa" and helpers.paths.qa_synth == "resources/qa"
    assert helpers.conda_env("train") == "../envs/cpu.yaml"


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
def test_the_workflow_dry_run_carries_the_plans_values(workflow_dir, configfiles):
    """A real `snakemake -n -p all`: job counts, threads and --cfg JSON are the plan's."""
    proc = snakemake(workflow_dir, "all", "-n", "-p", *(("--configfile", *configfiles) if configfiles else ()))
    text = proc.stdout + proc.stderr
    counts, jobs = job_counts(text), {j.rule: j for j in parse_dry_run(text)}
    plan = plan_of(*(configfiles or (DEMO,)))
    assert _cfg(jobs["release"].shell) == json.loads(plan.release_cfg_json())
    assert _cfg(jobs["merge_model"].shell) == json.loads(plan.merge_cfg_json())
    if plan.recipe_is("qa"):
        assert counts["qa_eval_model"] == len(plan.qa_eval_files())
        assert _cfg(jobs["qa_train_grpo"].shell) == json.loads(plan.qa_train_cfg())
        assert jobs["qa_train_grpo"].threads == plan.train_threads()
        return
    assert counts["eval_shard"] == len(plan.eval_shard_files("shard"))
    assert counts["trajectory_shard"] == 2 * len(plan.trajectory_shard_files("train", "parquet"))
    assert _cfg(jobs["trajectory_shard"].shell) == json.loads(plan.trajectories_cfg_json())
    assert _cfg(jobs["preflight"].shell) == json.loads(plan.preflight_cfg())
    assert jobs["preflight"].threads == plan.preflight_threads()


def test_a_plan_error_stops_the_workflow_with_its_line(workflow_dir):
    """The plan's InputError reaches the user as Snakemake's error, one line naming the key."""
    prepare_reproduce_inputs(workflow_dir)
    (workflow_dir / "missing.yaml").write_text("cohort: {source: data/nowhere.json}\n")
    proc = snakemake(workflow_dir, "all", "-n", "--configfile", REPRODUCE, "missing.yaml", check=False)
    assert proc.returncode != 0
    assert "cohort.source: data/nowhere.json does not exist." in proc.stdout + proc.stderr
