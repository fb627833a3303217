"""An experiment (config `experiment`): its variants' overrides validated as configs, its members (variant x
seed), the sharing of stages derived from the params each stage reads (llmrnn.plan, ExperimentPlan), and the real
Snakemake DAG planning each shared job once."""

from __future__ import annotations

import re

import pytest

from llmrnn import cli
from llmrnn.configcheck import model_problems
from llmrnn.errors import InputError
from llmrnn.plan import SHARED_STAGES, Plan, member_configs
from llmrnn.settings import Config
from llmrnn.settings.base import parse
from tests.conftest import REPO, copy_workflow, snakemake

RANKS = {"variants": {"rank16": {}, "rank8": {"train": {"lora": {"rank": 8, "alpha": 16}}}}}


def experiment_of(experiment: dict) -> Plan:
    return Plan.from_configfiles(REPO / "config" / "config.yaml", overrides={"experiment": experiment})


def test_a_config_without_experiment_is_one_run_in_one_folder():
    plan = Plan.from_configfiles(REPO / "config" / "config.yaml")
    assert plan.experiment is None
    assert {plan.paths.root(stage) for stage in SHARED_STAGES} == {"results/demo"}
    assert plan.evaluate.shard_files("graded")[0] == "results/demo/eval/base/graded_0.jsonl"
    assert not plan.evaluate.trained_apart()


@pytest.mark.parametrize(("variant", "line"), [
    ({"train": {"lora": {"rnk": 8}}}, "experiment.variants.bad: train.lora.rnk: Extra inputs are not permitted"),
    ({"train": {"lora": {"rank": "8"}}}, "experiment.variants.bad: train.lora.rank: Input should be a valid integer"),
    ({"run_name": "x"}, "experiment.variants.bad.run_name: a variant cannot override run_name"),
])
def test_a_bad_override_is_one_line_naming_the_variant_and_the_key(variant, line):
    config = {"run_name": "r", "experiment": {"variants": {"good": {}, "bad": variant}}}
    with pytest.raises(InputError) as exc:
        parse(Config, config, "config")
    assert str(exc.value) == line
    assert model_problems(config) == [line]  # what the workflow prints (rules/common.smk)


def test_the_control_must_be_a_variant():
    with pytest.raises(InputError, match=r"experiment.control: 'nope' is not a variant; variants: a, b"):
        parse(Config, {"run_name": "r", "experiment": {"variants": {"a": {}, "b": {}}, "control": "nope"}}, "config")


def test_seeds_multiply_every_variant_into_members_with_that_train_seed():
    plan = experiment_of({**RANKS, "seeds": [1, 2]})
    members = plan.experiment.members
    assert list(members) == ["rank16-s1", "rank16-s2", "rank8-s1", "rank8-s2"]
    assert [m.config["train"]["seed"] for m in members.values()] == [1, 2, 1, 2]
    assert [m.config["train"]["lora"]["rank"] for m in members.values()] == [16, 16, 8, 8]
    assert members["rank8-s2"].paths.run == "results/demo/rank8-s2"
    assert plan.experiment.control == "rank16"  # the first variant when none is named


def test_variants_differing_in_lora_rank_share_all_before_training():
    experiment = experiment_of(RANKS).experiment
    assert experiment.jobs_per_stage() == {"cohort": 1, "trajectories": 1, "judge": 1, "untrained_eval": 1,
                                           "train": 2, "merge": 2, "trained_eval": 2, "report": 2}
    rank16, rank8 = experiment.members.values()
    assert rank16.evaluate.variant_files("base") == rank8.evaluate.variant_files("base")
    assert rank16.evaluate.variant_files("trained") != rank8.evaluate.variant_files("trained")
    # the trained models are evaluated on the shared cohort's test split
    assert rank16.paths.cohort == rank8.paths.cohort != rank16.paths.run


def test_a_cohort_knob_gets_its_own_cohort_and_everything_after():
    experiment = experiment_of({"variants": {"admission": {}, "reference": {"cohort": {"mimic_iv": {"mode": "reference"}}}}}).experiment
    assert experiment.jobs_per_stage() == {stage: 2 for stage in (*SHARED_STAGES, "train", "merge", "trained_eval", "report")}
    admission, reference = experiment.members.values()
    assert all(admission.paths.root(s) != reference.paths.root(s) for s in SHARED_STAGES)


def test_an_eval_knob_shares_the_cohort_and_trajectories_but_not_the_evaluation():
    experiment = experiment_of({"variants": {"a": {}, "b": {"eval": {"max_visits": 3}}}}).experiment
    counts = experiment.jobs_per_stage()
    assert (counts["cohort"], counts["trajectories"], counts["judge"], counts["untrained_eval"]) == (1, 1, 1, 2)


def test_members_may_not_differ_in_what_resources_holds_for_all():
    config = Plan.from_configfiles(REPO / "config" / "config.yaml").config
    config = {**config, "experiment": {"variants": {"a": {}, "b": {"models": {"smollm2-135m-instruct": {"dtype": "bfloat16"}}}}}}
    with pytest.raises(InputError, match="experiment: models.smollm2-135m-instruct differs between a and b"):
        member_configs(config)
    config["experiment"] = {"variants": {"a": {}, "b": {"cohort": {"synthetic": {"patients": 30}}}}}
    with pytest.raises(InputError, match="experiment: cohort.synthetic differs between a and b"):
        member_configs(config)


def test_experiment_plan_prints_the_sharing_of_the_cpu_sweep(capsys):
    assert cli.main(["plan", "experiment", "--configfile", "config/config.yaml", "config/sweep-cpu.yaml"]) in (0, None)
    out = capsys.readouterr().out
    shared = re.findall(r"^  (\w+) +results/sweep-cpu/\1-\w+ +all$", out, flags=re.MULTILINE)
    assert shared == list(SHARED_STAGES)
    assert len(re.findall(r"^  train +results/sweep-cpu/(rank\d+-s\d) +\1$", out, flags=re.MULTILINE)) == 4


def job_counts(text: str) -> dict[str, int]:
    """Snakemake's "Job stats" table of a dry run: rule -> jobs."""
    table = text.split("Job stats:", 1)[1].split("\n\n", 1)[0]
    return {m.group(1): int(m.group(2)) for m in re.finditer(r"^(\w+)\s+(\d+)$", table, flags=re.MULTILINE)}


@pytest.mark.slow  # one dry run of a two-member DAG: ~20 s
def test_the_dag_plans_each_shared_job_once_and_each_members_training(tmp_path):
    work = copy_workflow(tmp_path)
    (work / "ranks.yaml").write_text("run_name: ranks\nexperiment:\n  variants:\n    rank16: {}\n"
                                     "    rank8: {train: {lora: {rank: 8, alpha: 16}}}\n")
    proc = snakemake(work, "all", "-n", "-p", "--configfile", "config/config.yaml", "ranks.yaml")
    counts = job_counts(proc.stdout)
    by_rule: dict[str, list[int]] = {}
    for rule, n in counts.items():
        by_rule.setdefault(rule.split("__")[-1], []).append(n)
    shards = Plan.from_configfiles(REPO / "config" / "config.yaml").config["eval"]["shards"]
    # shared: made by one member's rule only
    for rule in ("build_cohort", "split_cohort", "dump_trajectories", "judge_agreement", "eval_shard", "eval_grade"):
        assert len(by_rule[rule]) == 1, (rule, counts)
    assert by_rule["dump_trajectories"] == [2] and by_rule["eval_shard"] == [shards]  # train+val; the base's shards
    # each member's own: training, merge and the trained model's evaluation
    for rule in ("train_grpo", "merge_model", "eval_gather", "release"):
        assert by_rule[rule] == [1, 1], (rule, counts)
    assert by_rule["eval_shard_trained"] == [shards, shards]
    assert counts["compare_variants"] == 1
    compare = next(line for line in proc.stdout.splitlines() if "llmrnn evaluate compare" in line)
    for run in ("base=results/ranks/untrained_eval-", "rank16@42=results/ranks/rank16/eval/trained/",
                "rank8@42=results/ranks/rank8/eval/trained/"):
        assert f"--variant {run}" in compare
    assert "--control rank16" in compare


@pytest.mark.slow  # one dry run of a two-member DAG: ~20 s
def test_check_and_cost_plan_are_the_experiments_own_targets_over_every_member(tmp_path):
    """`snakemake check` and `snakemake cost_plan` of an experiment are one job each, as in one run: llmrnn check
    and llmrnn report cost-plan over the experiment's config files (both read every member) with the
    experiment's logs, the cost plan reading each member's benchmarks under them; no member has its own."""
    work = copy_workflow(tmp_path)
    (work / "ranks.yaml").write_text("run_name: ranks\nexperiment:\n  variants:\n    rank16: {}\n"
                                     "    rank8: {train: {lora: {rank: 8, alpha: 16}}}\n")
    proc = snakemake(work, "check", "cost_plan", "-n", "-p", "--configfile", "config/config.yaml", "ranks.yaml")
    assert job_counts(proc.stdout) == {"check": 1, "cost_plan": 1, "total": 2}
    files = f"--configfile {work}/config/config.yaml {work}/ranks.yaml"
    shell = [line for line in proc.stdout.splitlines() if "umask 077; llmrnn " in line]
    assert len(shell) == 2
    check = next(line for line in shell if "llmrnn check " in line)
    assert files in check and "tee logs/ranks/check.log" in check
    cost = next(line for line in shell if "llmrnn report cost-plan " in line)
    assert files in cost and "--benchmarks logs/ranks/benchmarks " in cost and "tee logs/ranks/cost_plan.log" in cost
    listed = snakemake(work, "-l", "--configfile", "config/config.yaml", "ranks.yaml").stdout.split()
    assert "check" in listed and "cost_plan" in listed
    assert not [r for r in listed if r.endswith(("__check", "__cost_plan"))], listed


def test_llmrnn_check_checks_each_variant_as_it_runs(tmp_path, monkeypatch):
    """`llmrnn check` (so `snakemake check`) of an experiment runs every check over each variant's config: a
    problem of one variant's own settings (a judge rubric that is not there) names that variant; one that every
    variant has is the config's, said once."""
    from llmrnn.check import run_checks

    monkeypatch.chdir(REPO)
    over = tmp_path / "x.yaml"
    over.write_text("run_name: x\nexperiment:\n  variants:\n    a: {}\n"
                    "    b: {judge: {rubric: config/rubrics/nope.yaml}, train: {lora: {rank: 8}}}\n  seeds: [1, 2]\n")
    report = run_checks([REPO / "config" / "config.yaml", over])
    assert report["problems"] == ["experiment.variants.b: judge.rubric: config/rubrics/nope.yaml does not exist"]
    (tmp_path / "gone.yaml").write_text("cohort: {mimic_iv: {hosp: /nonexistent/hosp}}\n")
    report = run_checks([REPO / "config" / "config.yaml", over, tmp_path / "gone.yaml"])
    said = [p for p in report["problems"] if "/nonexistent/hosp" in p]
    assert said and not [p for p in said if p.startswith("experiment.variants.")], report["problems"]
    assert len(said) == len(set(said))


def test_a_members_report_figures_are_labelled_by_its_variant_and_seed():
    """Snakemake's report(..., labels=...) for a member's own figures, so the report's tables tell the members
    apart; a run that is no member keeps its unlabelled report."""
    plan = experiment_of({**RANKS, "seeds": [1, 2]})
    member = Plan(plan.experiment.members["rank8-s2"].config)
    assert member.report_labels("memory recall") == {"variant": "rank8", "seed": "2", "figure": "memory recall"}
    unseeded = Plan(experiment_of(RANKS).experiment.members["rank16"].config)
    assert unseeded.report_labels("KL") == {"variant": "rank16", "seed": "-", "figure": "KL"}
    assert Plan.from_configfiles(REPO / "config" / "config.yaml").report_labels("KL") is None


def test_the_cost_plan_counts_a_shared_job_group_once_and_each_members_own_jobs():
    """`llmrnn report cost-plan` and `llmrnn check` on an experiment: its members' stages, a job group members
    share counted once (the same folder), the members' own (training, merge, the trained model's shards) once
    per member."""
    from llmrnn.cost_plan import plan_stages

    single = {s["stage"]: s for s in plan_stages(Plan.from_configfiles(REPO / "config" / "config.yaml").config)}
    plan = experiment_of({**RANKS, "seeds": [1, 2]})
    swept = {s["stage"]: s for s in plan_stages(plan.config)}
    shards = plan.config["eval"]["shards"]
    assert swept["trajectory_shard"]["jobs"] == single["trajectory_shard"]["jobs"]  # one cohort, one forward pass
    assert swept["train_grpo"]["jobs"] == 4 and swept["merge_model"]["jobs"] == 4
    # the base model's shards once, each member's trained model's shards its own
    assert swept["eval_shard"]["jobs"] == single["eval_shard"]["jobs"] - shards + 4 * shards
    assert swept["train_grpo"]["gpu_hours"] == 4 * single["train_grpo"]["gpu_hours"]
    # a variant with its own cohort: its own forward pass and base evaluation too
    own = {s["stage"]: s for s in plan_stages(experiment_of(
        {"variants": {"a": {}, "b": {"split": {"seed": 4242}}}}).config)}
    assert own["trajectory_shard"]["jobs"] == 2 * single["trajectory_shard"]["jobs"]
    assert own["eval_shard"]["jobs"] == 2 * single["eval_shard"]["jobs"]


def test_a_variant_on_its_own_inputs_is_compared_with_its_own_base():
    """A variant whose untrained evaluation is not the control's (another cohort: cohort.mimic_iv.mode, a split
    seed) brings its own frozen base into the comparison (--base-of); variants on the control's inputs share its
    base."""
    experiment = experiment_of({"variants": {"a": {}, "b": {"split": {"seed": 4242}}, "c": RANKS["variants"]["rank8"]},
                                "control": "a"}).experiment
    assert experiment.own_bases() == {"b": "base_b"}
    args = experiment.comparison_args()
    assert args[-2:] == ["--base-of", "b=base_b"]
    own = [a.split("=", 1)[1] for a in args if a.startswith("base_b=")]
    assert own == experiment.members["b"].evaluate.variant_files("base") and "untrained_eval-" in own[0]
