"""The workflow's plan: every decision the rules take from the config, as plain Python.

`Plan(config)` takes an effective config (schema defaults filled in: Snakemake's `validate`, or
`llmrnn.runconfig.resolve` for the same files) and answers what the rules ask: which targets `all`
builds, which conda env a stage runs in, which GPUs/threads a job gets, the exact config subset each
rule passes as `--cfg` JSON (its params: a change reruns that rule and only it), and which optional
inputs and flags a job has. Nothing here needs Snakemake.

Each stage's decisions live in a module of their own (llmrnn.plan.cohort, .models, .trajectories, .judge,
.train, .evaluate, .merge, .release, .qa; what they share in llmrnn.plan.common), as a class of methods
on the config; `Plan` is all of them over one config. A rule file imports the stage classes it uses by
name and binds each method it calls to the run's one Plan (rules/common.smk `helper`), so grepping a
helper a rule calls finds its import and its definition. rules/common.smk keeps only what needs
Snakemake's `rules` or `workflow` objects. tests/test_plan.py asserts the decisions for the shipped configs and variants.

Methods a rule calls as an input or params function take Snakemake's arguments (`wildcards`, and
`input` for params), read by attribute. A bad config value raises `llmrnn.errors.InputError` (one
line); common.smk turns it into Snakemake's WorkflowError.
"""

from __future__ import annotations

import os

from llmrnn.plan.cohort import CohortPlan
from llmrnn.plan.common import Paths, PlanBase, input_flag, is_model_name, model_dir_of
from llmrnn.plan.evaluate import EvaluatePlan
from llmrnn.plan.judge import JudgePlan
from llmrnn.plan.merge import MergePlan
from llmrnn.plan.models import ModelsPlan
from llmrnn.plan.qa import QaPlan
from llmrnn.plan.release import ReleasePlan
from llmrnn.plan.train import TrainPlan
from llmrnn.plan.trajectories import TrajectoriesPlan

__all__ = ["Paths", "Plan", "PlanBase", "input_flag", "is_model_name", "model_dir_of"]


class Plan(CohortPlan, ModelsPlan, TrajectoriesPlan, JudgePlan, TrainPlan, EvaluatePlan, MergePlan, ReleasePlan,
           QaPlan):
    """The decisions of one run's config (see the module docstring)."""

    @classmethod
    def from_configfiles(cls, *configfiles: str | os.PathLike, overrides: dict | None = None,
                         schema_path: str | os.PathLike | None = None) -> Plan:
        """The plan of a run of these config files (config/config.yaml when none is named) and `--config`
        overrides, layered as the Snakefile layers them (llmrnn.runconfig)."""
        from llmrnn import runconfig

        layers = [runconfig.read_layer(p) for p in runconfig.configfiles_for(configfiles)]
        if overrides:
            layers.append((runconfig.COMMAND_LINE, overrides))
        config, _ = runconfig.resolve(layers, schema_path or runconfig.SCHEMA)
        return cls(config)

