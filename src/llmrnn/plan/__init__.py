"""The workflow's plan: every decision the rules take from the config, as plain Python.

`Plan(config)` takes an effective config (schema defaults filled in: Snakemake's `validate`, or
`llmrnn.runconfig.resolve` for the same files) and answers what the rules ask: which targets `all`
builds, which conda env a stage runs in, which GPUs/threads a job gets, the exact config subset each
rule passes as `--cfg` JSON (its params: a change reruns that rule and only it), and which optional
inputs and flags a job has. Nothing here needs Snakemake.

Each stage's decisions are an object of their own over the config, in a module of their own
(llmrnn.plan.cohort, .models, .trajectories, .judge, .train, .evaluate, .merge, .release, .qa; what they
share in llmrnn.plan.common), and it is given the stage plans it reads as constructor arguments
(`TrainPlan(config, judge=..., recipe=...)`). The recipe (llmrnn.plan.recipe: `MemoryHeadRecipe`,
`QaRecipe`) is chosen once, from config `recipe`, and the shared stages ask it what differs instead of
branching. `Plan` builds each once and holds them as attributes: `plan.recipe`, `plan.cohort`,
`plan.models`, `plan.trajectories`, `plan.judge`, `plan.train`, `plan.evaluate`, `plan.merge`,
`plan.release`, `plan.qa`, beside what all stages share (`plan.paths`, `plan.cfg_json`), the run's products
(`plan.products`) and the conda env of each stage (`plan.conda_env`). The rules call
it as written: `threads: plan.train.threads()`, `model=plan.models.memory_model_input()`; the Snakefile's
`plan` (rules/common.smk) is this one, its methods raising a plan error as Snakemake's WorkflowError.
tests/test_plan.py asserts the decisions for the shipped configs and variants.

A config with an `experiment` section plans its members too (`plan.experiment`, an ExperimentPlan: below), and
one member's config (experiment.member set) plans that member on its own folders; `llmrnn plan experiment`
prints which stages the members share.

Methods a rule calls as an input or params function take Snakemake's arguments (`wildcards`, and
`input` for params), read by attribute. A bad config value raises `llmrnn.errors.InputError` (one line).
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
from collections.abc import Mapping

from llmrnn import runconfig
from llmrnn.errors import InputError
from llmrnn.io import deep_merge
from llmrnn.plan.cohort import CohortPlan
from llmrnn.plan.common import (
    Paths,
    PlanBase,
    config_changes,
    input_flag,
    is_model_name,
    model_dir_of,
    schema_error_line,
    to_json,
)
from llmrnn.plan.evaluate import EvaluatePlan
from llmrnn.plan.judge import JudgePlan
from llmrnn.plan.merge import MergePlan
from llmrnn.plan.models import ModelsPlan
from llmrnn.plan.qa import QaPlan
from llmrnn.plan.recipe import RECIPES, MemoryHeadRecipe, QaRecipe, Recipe
from llmrnn.plan.release import ReleasePlan
from llmrnn.plan.train import TrainPlan
from llmrnn.plan.trajectories import TrajectoriesPlan

__all__ = ["ExperimentPlan", "MemoryHeadRecipe", "Paths", "Plan", "PlanBase", "QaRecipe", "Recipe", "config_changes", "input_flag",
           "is_model_name", "model_dir_of", "schema_error_line"]

CONDA_STAGES = ("data", "cpu", "forward", "judge", "train", "sft")
# The stages both recipes run (the memory head's DAG and recipe qa's share cohort, models, judge, merge,
# release, check and cost); the recipe's own rule files come after them (Recipe.rule_files)
SHARED_RULE_FILES = ("rules/cohort.smk", "rules/models.smk", "rules/judge.smk", "rules/merge.smk",
                     "rules/release.smk", "rules/check.smk", "rules/cost.smk")


class Plan(PlanBase):
    """The decisions of one run's config: its stages' plans, each built once (see the module docstring)."""

    def __init__(self, config: Mapping):
        super().__init__(config)
        self.cohort = CohortPlan(config)
        self.models = ModelsPlan(config)
        self.trajectories = TrajectoriesPlan(config)
        self.judge = JudgePlan(config, models=self.models)
        self.qa = QaPlan(config, models=self.models, judge=self.judge)
        self.evaluate = EvaluatePlan(config, models=self.models)
        # chosen once: the stages below ask it what differs between the recipes
        self.recipe = RECIPES[config["recipe"]](config, models=self.models, trajectories=self.trajectories,
                                                judge=self.judge, evaluate=self.evaluate, qa=self.qa)
        self.release = ReleasePlan(config, judge=self.judge, recipe=self.recipe)
        self.train = TrainPlan(config, judge=self.judge, recipe=self.recipe)
        self.merge = MergePlan(config, recipe=self.recipe)
        # one member of an experiment: the shared stages' folders are keyed by what the stages read
        if member_of(config):
            self.use_paths(member_paths(self, member_of(config)))
        self.experiment = ExperimentPlan(config) if is_experiment(config) else None

    def use_paths(self, paths: Paths) -> None:
        """Every stage's plan on `paths` (one member of an experiment: its folders, the experiment, below)."""
        for part in (self, *(v for v in vars(self).values() if isinstance(v, PlanBase))):
            part.paths = paths

    def rule_files(self) -> tuple[str, ...]:
        """The rule files of a run, in the order the Snakefile includes them: the shared stages', the recipe's."""
        return (*SHARED_RULE_FILES, *self.recipe.rule_files)

    def products(self) -> list[str]:
        """What a run is for (`all` requests them, rules/common.smk): the recipe's products, the release and
        the held-out evaluation; an experiment's: every member's and their comparison."""
        if self.experiment is not None:
            return self.experiment.products()
        return [*self.recipe.products(), *self.release.targets(), *self.recipe.heldout_targets()]

    def report_labels(self, figure: str) -> dict | None:
        """Snakemake's report labels of one of a member's own figures (train, eval, overview): which variant and
        seed it shows, so the report's tables tell the members apart; None for a run that is no member."""
        member = member_of(self.config)
        if not member:
            return None
        variant, seed = member_names(self.config["experiment"])[member]
        return {"variant": variant, "seed": "-" if seed is None else str(seed), "figure": figure}

    def heldout_targets(self) -> list[str]:
        """What `eval_heldout` builds: the recipe's held-out evaluation (an experiment's: every member's, and
        their comparison)."""
        if self.experiment is not None:
            return self.experiment.heldout_targets()
        return self.recipe.heldout_targets()

    @classmethod
    def from_configfiles(cls, *configfiles: str | os.PathLike, overrides: dict | None = None,
                         schema_path: str | os.PathLike | None = None) -> Plan:
        """The plan of a run of these config files (config/config.yaml when none is named) and `--config`
        overrides, layered as the Snakefile layers them (llmrnn.runconfig)."""
        layers = [runconfig.read_layer(p) for p in runconfig.configfiles_for(configfiles)]
        if overrides:
            layers.append((runconfig.COMMAND_LINE, overrides))
        config, _ = runconfig.resolve(layers, schema_path or runconfig.SCHEMA)
        return cls(config)

    def conda_env(self, stage: str) -> str:
        """The conda env file (--sdm conda) of every job, chosen in this one place. Stages: data (cohort,
        report), cpu (models, merge, release, preflight), forward (trajectory and eval shards; vllm when a
        role uses the vLLM backend), judge (vllm for a `vllm serve` judge), train (verl or cpu), sft (the qa
        recipe's LoRA SFT: the GPU stack, whose lock holds TRL and PEFT, when the job gets a GPU).
        """
        c = self.config
        if stage == "forward":
            name = "vllm" if any(r.get("backend") == "vllm" for r in c["roles"].values()) else "cpu"
        elif stage == "judge":
            name = "vllm" if self.judge.gpus() else "cpu"
        elif stage == "train":
            name = "verl" if c["train"]["engine"] == "verl" else "cpu"
        elif stage == "sft":
            name = "verl" if c["qa"]["sft"]["resources"]["gpu"] else "cpu"
        elif stage in ("data", "cpu"):
            name = stage
        else:
            raise InputError(f"conda_env: unknown stage {stage!r}; expected one of {', '.join(CONDA_STAGES)}")
        return f"../envs/{name}.yaml"


# ============================================================================= an experiment
# An experiment's plan (config `experiment`): its members (each variant, times each training seed), the config
# each member runs, and the folders of the stages members share.
#
# A stage an experiment's members may share is keyed by what it reads: a hash of the params the plan gives the
# stage's rules (the same `--cfg` subsets a change of which reruns them) and the keys of the stages it reads
# from. Members whose settings agree for a stage get the same key, so the same folder (results/RUN/<stage>-<key>),
# so the same jobs: two variants that differ only in train.lora.rank share the cohort, trajectories, judge and the
# untrained models' evaluation; one that changes cohort.mimic_iv.mode gets its own cohort and everything after
# it. What no key names (preflight, training, merge, the trained model's evaluation, report, release) is the
# member's own, under results/RUN/<member>.
#
# The Snakefile loads rules/experiment.smk for such a config: one Snakemake module per member over that
# member's config, so one DAG; a shared file's rules exist in every member that shares it, and the first
# member's are the ones Snakemake runs (ruleorder), as their outputs and params are the same by construction.

# the stages members may share, in DAG order; the others are each member's own
SHARED_STAGES = ("cohort", "trajectories", "judge", "untrained_eval")
OWN_STAGES = ("train", "merge", "trained_eval", "report")


def is_experiment(config: Mapping) -> bool:
    """Whether the config names variants (and is not already one member's config)."""
    experiment = config.get("experiment") or {}
    return bool(experiment.get("variants")) and not experiment.get("member")


def member_of(config: Mapping) -> str | None:
    """The member a config is (the workflow sets experiment.member for each member's module), or None."""
    return (config.get("experiment") or {}).get("member")


def digest(*parts) -> str:
    """A short stable key of JSON-able parts."""
    return hashlib.sha256(json.dumps(parts, sort_keys=True, default=str).encode()).hexdigest()[:10]


def member_names(experiment: Mapping) -> dict[str, tuple[str, int | None]]:
    """member name -> (variant, seed): each variant once per seed (`<variant>-s<seed>`), or once without seeds."""
    seeds = experiment.get("seeds") or [None]
    return {(variant if seed is None else f"{variant}-s{seed}"): (variant, seed)
            for variant in experiment["variants"] for seed in seeds}


def member_configs(config: Mapping) -> dict[str, dict]:
    """Each member's effective config: the experiment's config, its variant's overrides and its seed (train.seed)
    layered on it, the schema's defaults filled in, and experiment.member naming it."""
    experiment = config["experiment"]
    base = {k: v for k, v in config.items() if k != "experiment"}
    out = {}
    for name, (variant, seed) in member_names(experiment).items():
        layered = deep_merge(base, experiment["variants"][variant])
        if seed is not None:
            layered = deep_merge(layered, {"train": {"seed": seed}})
        member = runconfig.with_defaults(layered)
        member["experiment"] = {**experiment, "member": name}
        out[name] = member
    refuse_unshareable(out)
    return out


def refuse_unshareable(members: Mapping[str, Mapping]) -> None:
    """What every run shares under resources/ (the prepared models, the synthetic cohort its settings make) is
    made once for all members, so they must agree on it: one line naming the key and two members otherwise."""
    seen: dict[str, tuple[str, object]] = {}
    for name, member in members.items():
        shared = {f"models.{model}": spec for model, spec in member["models"].items()}
        shared["cohort.synthetic"] = member["cohort"]["synthetic"]
        for key, value in shared.items():
            first, first_value = seen.setdefault(key, (name, value))
            if first_value != value:
                raise InputError(f"experiment: {key} differs between {first} and {name}; every member shares what "
                                 "resources/ holds (name another model, or give the cohort as a file)")


def stage_keys(plan) -> dict[str, str]:
    """The key of each shared stage of one member's plan: the params its rules get from the plan, and the keys
    of the stages it reads. The judge is shared only when no training job asks it (reward.mode outcome: it
    serves the agreement check); a judge the reward asks is a service of its member's training."""
    c = plan.config
    source = c["cohort"]["source"]
    cohort = {"source": source, "raw_sha256": plan.cohort.raw_sha256(), "split": plan.cohort.split_cfg()}
    if source == "synthetic":
        cohort["synthetic"] = c["cohort"]["synthetic"]
    elif source == "mimic_iv":
        cohort["mimic_iv"] = [plan.cohort.mimic_iv_cfg(), c["cohort"]["mimic_iv"]["hosp"], c["cohort"]["mimic_iv"]["note"]]
    keys = {"cohort": digest(cohort)}
    keys["trajectories"] = digest(keys["cohort"], plan.trajectories.shard_cfg(), c["prompts"]["file"],
                                  plan.models.memory_model_input())
    if not plan.judge.planned():
        keys["judge"] = digest(keys["trajectories"], plan.cfg_json("judge"), plan.judge.agreement_cfg())
    used = {r["model"] for r in c["roles"].values()}
    keys["untrained_eval"] = digest(keys["cohort"], plan.evaluate.forward_cfg(),
                                    plan.evaluate.section_cfg("final_judge", "grade_visits"), c["eval"]["shards"],
                                    c["prompts"]["file"], to_json({n: m for n, m in c["models"].items() if n in used}))
    return keys


def member_paths(plan, member: str) -> Paths:
    """A member's paths: its own folder results/RUN/<member> (logs/RUN/<member>), and each shared stage's
    folder results/RUN/<stage>-<key>."""
    run_name = plan.config["run_name"]
    roots = {stage: f"results/{run_name}/{stage}-{key}" for stage, key in stage_keys(plan).items()}
    return Paths(run=f"results/{run_name}/{member}", logs=f"logs/{run_name}/{member}", stage_roots=roots)


class ExperimentPlan(PlanBase):
    """The plan of a config with an `experiment` section: each member's Plan (`members`), the sharing of stages
    between them (`sharing`), and the comparison of them all (`comparison_*`)."""

    def __init__(self, config: Mapping):
        super().__init__(config)
        self.experiment = config["experiment"]
        self.names = member_names(self.experiment)
        self.members = {name: Plan(cfg) for name, cfg in member_configs(config).items()}
        self.control = self.experiment.get("control") or next(iter(self.experiment["variants"]))

    def rule_prefix(self, member: str) -> str:
        """The prefix of a member's rules in the experiment's DAG (a rule name is an identifier)."""
        return "".join(ch if ch.isalnum() else "_" for ch in member) + "__"

    def sharing(self) -> list[dict]:
        """One row per distinct job group: the stage, its key (a member's name for its own stages), its folder and
        the members that share it, in DAG order."""
        rows = []
        for stage in SHARED_STAGES:
            groups: dict[str, list[str]] = {}
            for name, plan in self.members.items():
                key = plan.paths.stage_roots.get(stage)
                groups.setdefault(key or plan.paths.run, []).append(name)
            for folder, names in groups.items():
                rows.append({"stage": stage, "folder": folder, "members": names})
        for stage in OWN_STAGES:
            rows += [{"stage": stage, "folder": plan.paths.run, "members": [name]} for name, plan in self.members.items()]
        return rows

    def jobs_per_stage(self) -> dict[str, int]:
        """How many distinct job groups each stage plans (1 = every member shares it)."""
        counts: dict[str, int] = {}
        for row in self.sharing():
            counts[row["stage"]] = counts.get(row["stage"], 0) + 1
        return counts

    def sharing_lines(self) -> list[str]:
        """The sharing table as text (`llmrnn plan experiment`)."""
        head = (f"experiment {self.config['run_name']}: {len(self.members)} members "
                f"({', '.join(self.members)}); control {self.control}")
        lines = [head]
        width = max(len(s) for s in (*SHARED_STAGES, *OWN_STAGES))
        for row in self.sharing():
            share = "all" if len(row["members"]) == len(self.members) > 1 else ", ".join(row["members"])
            lines.append(f"  {row['stage']:<{width}}  {row['folder']:<48}  {share}")
        return lines

    # ------------------------------------------------------------------------- the comparison of the members
    def comparison_folder(self) -> str:
        return f"results/{self.config['run_name']}/eval"

    def comparison_targets(self) -> list[str]:
        return [f"{self.comparison_folder()}/comparison.json", f"{self.comparison_folder()}/forest.png"]

    def comparison_runs(self, wildcards=None) -> dict[str, list[str]]:
        """`llmrnn evaluate compare`'s runs, by argument: each member's trained model as VARIANT@SEED, the base and
        the baselines of the control's first member (every member is evaluated on the same test patients)."""
        first = next(name for name, (variant, _) in self.names.items() if variant == self.control)
        control = self.members[first]
        runs: dict[str, list[str]] = {}
        for variant in control.evaluate.variants():
            if variant != "trained":
                runs[variant] = control.evaluate.variant_files(variant)
        own_bases = self.own_bases()
        for name, (variant, seed) in self.names.items():
            plan = self.members[name]
            seed = plan.config["train"]["seed"] if seed is None else seed
            runs[f"{variant}@{seed}"] = plan.evaluate.variant_files("trained")
            if variant in own_bases:
                runs[own_bases[variant]] = plan.evaluate.variant_files("base")
        return runs

    def own_bases(self) -> dict[str, str]:
        """variant -> the name of its own frozen base run, for each variant whose untrained evaluation is not the
        control's (other inputs: another cohort or prompts), so its gain is measured against the model it
        started from, on its own inputs (`llmrnn evaluate compare --base-of`)."""
        untrained = {variant: self.members[name].paths.stage_roots.get("untrained_eval")
                     for name, (variant, _) in self.names.items()}  # a variant's seeds share it
        return {variant: f"base_{variant}" for variant, root in untrained.items() if root != untrained[self.control]}

    def comparison_inputs(self, wildcards=None) -> list[str]:
        return sorted({path for paths in self.comparison_runs().values() for path in paths})

    def comparison_args(self, wildcards=None) -> list[str]:
        """--variant NAME=PATH for every graded shard, a list for `{params.variants:q}`."""
        return [*(arg for name, paths in self.comparison_runs().items() for path in paths
                  for arg in ("--variant", f"{name}={path}")),
                *(arg for variant, own in self.own_bases().items() for arg in ("--base-of", f"{variant}={own}"))]

    def comparison_cfg(self) -> str:
        """params of compare_variants: the statistics knobs of the control (`eval.stats`)."""
        return to_json({"stats": self.config["eval"]["stats"]})

    def products(self) -> list[str]:
        """What `all` builds: every member's products and the comparison."""
        return [*(p for plan in self.members.values() for p in plan.products()), *self.comparison_targets()]

    def heldout_targets(self) -> list[str]:
        return [*(p for plan in self.members.values() for p in plan.recipe.heldout_targets()),
                *self.comparison_targets()]


# ----------------------------------------------------------------------------- llmrnn plan experiment
def experiment_plan(configfiles: list[str | os.PathLike]) -> ExperimentPlan:
    """The experiment of config files layered as the Snakefile layers them; one line when they name none."""
    plan = Plan.from_configfiles(*configfiles)
    if plan.experiment is None:
        raise InputError(f"plan experiment: {' '.join(map(str, configfiles)) or 'config/config.yaml'} has no "
                         "`experiment` section (variants); a config without one is a single run")
    return plan.experiment


def _cmd_plan(args: argparse.Namespace) -> int:
    experiment = experiment_plan(args.configfile)
    if args.json:
        print(json.dumps({"members": list(experiment.members), "control": experiment.control,
                          "jobs_per_stage": experiment.jobs_per_stage(), "sharing": experiment.sharing()}, indent=1))
    else:
        print("\n".join(experiment.sharing_lines()))
    return 0


def register(sub) -> None:
    p = sub.add_parser("plan", help="what the workflow plans from config files, without a Snakemake run")
    verbs = p.add_subparsers(dest="verb", required=True)
    s = verbs.add_parser("experiment", help="an experiment's members and each stage's job groups: which members share each")
    s.add_argument("--configfile", nargs="+", default=[],
                   help="config files layered in order, as snakemake --configfile; none: config/config.yaml")
    s.add_argument("--json", action="store_true", help="print the sharing as JSON")
    s.set_defaults(func=_cmd_plan)
