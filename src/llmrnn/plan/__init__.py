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

Methods a rule calls as an input or params function take Snakemake's arguments (`wildcards`, and
`input` for params), read by attribute. A bad config value raises `llmrnn.errors.InputError` (one line).
"""

from __future__ import annotations

import os
from collections.abc import Mapping

from llmrnn import runconfig
from llmrnn.errors import InputError
from llmrnn.plan.cohort import CohortPlan
from llmrnn.plan.common import (
    Paths,
    PlanBase,
    config_changes,
    input_flag,
    is_model_name,
    model_dir_of,
    schema_error_line,
)
from llmrnn.plan.evaluate import EvaluatePlan
from llmrnn.plan.experiment import ExperimentPlan, is_experiment, member_of, member_paths
from llmrnn.plan.judge import JudgePlan
from llmrnn.plan.merge import MergePlan
from llmrnn.plan.models import ModelsPlan
from llmrnn.plan.qa import QaPlan
from llmrnn.plan.recipe import RECIPES, MemoryHeadRecipe, QaRecipe, Recipe
from llmrnn.plan.release import ReleasePlan
from llmrnn.plan.train import TrainPlan
from llmrnn.plan.trajectories import TrajectoriesPlan

__all__ = ["MemoryHeadRecipe", "Paths", "Plan", "PlanBase", "QaRecipe", "Recipe", "config_changes", "input_flag",
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
        """Every stage's plan on `paths` (one member of an experiment: its folders, llmrnn.plan.experiment)."""
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
