"""The train stage's plan: the GRPO job of either recipe (train_grpo in rules/train.smk, qa_train_grpo in
rules/qa.smk), its outputs, GPUs, threads and resources, and the judge's GPUs beside it; what differs between
the recipes (its name, inputs, params, reward code, flags) is the recipe's (llmrnn.plan.recipe)."""

from __future__ import annotations

from collections.abc import Mapping

from llmrnn.plan.common import GrpoOutputs, PlanBase, TrainPlots, input_flag, stage_resources
from llmrnn.plan.judge import JudgePlan
from llmrnn.plan.recipe import Recipe


class TrainPlan(PlanBase):
    """The GRPO job's decisions over the config: the `recipe` says what it trains on and how it is rewarded; a
    judge (`judge`) runs beside it when the reward asks."""

    def __init__(self, config: Mapping, *, judge: JudgePlan, recipe: Recipe):
        super().__init__(config)
        self.judge = judge
        self.recipe = recipe

    def rule_name(self) -> str:
        """The GRPO rule's name (train_grpo | qa_train_grpo): its log and benchmark are named by it."""
        return self.recipe.train_rule

    def outputs(self) -> GrpoOutputs:
        return self.paths.grpo

    def plots(self) -> TrainPlots:
        """The plots of its metrics (train_plots' outputs, rules/report.smk; memory_head only)."""
        return self.paths.train_plots

    def inputs(self) -> dict[str, str]:
        """The job's data, its preflight report (which must say ok) and the policy it trains."""
        return self.recipe.train_inputs()

    def priority(self) -> int:
        return self.recipe.train_priority

    def run_cfg(self) -> str:
        """params of the job: the recipe's config subset (the train section + its reward)."""
        return self.recipe.train_cfg()

    def reward_code(self) -> list[str]:
        """What the job's code hash adds to `llmrnn train run`'s modules (the recipe's reward code)."""
        return self.recipe.reward_code()

    def run_flags(self, wildcards, input) -> list[str]:
        """The flags after --summary, a list for `{params.flags:q}`: --preflight, --endpoint (when the job
        has the judge's endpoint), then the recipe's (--judge-gpus | --reward-func)."""
        flags = ["--preflight", input.preflight, *input_flag("--endpoint", "endpoint")(wildcards, input)]
        return [*flags, *self.recipe.trainer_flags(self.judge_gpus())]

    def gpus(self) -> int:
        """GPUs of the job: train.resources.gpu, else n_gpus_per_node for verl (per node), 0 for TRL."""
        t = self.config["train"]
        if t["resources"].get("gpu") is not None:
            return t["resources"]["gpu"]
        return t["n_gpus_per_node"] if t["engine"] == "verl" else 0

    def threads(self) -> int:
        """TRL on CPU uses train.trl.num_threads (1 thread: 0.13-0.17 s per tiny GRPO step; 2: 0.14-9.7 s)."""
        t = self.config["train"]
        return t["trl"]["num_threads"] if t["engine"] == "trl" else t["resources"]["cpus_per_task"]

    def resources(self) -> dict:
        """resources of the job: train.resources with its gpus; its runtime never grows (a killed run resumes
        from its checkpoint; a longer request could outgrow the partition)."""
        return stage_resources(self.config["train"]["resources"], {"gpu": self.gpus()}, runtime_grows=False)

    def judge_gpus(self) -> int:
        """GPUs a judge holds beside the job on its node (taken last); 0 without a judge."""
        return self.judge.gpus() if self.judge.planned() else 0
