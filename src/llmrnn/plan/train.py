"""The train stage's plan: the GRPO job of either recipe (train_grpo, qa_train_grpo: one rule in
rules/train.smk), its inputs, params, flags, GPUs, threads and resources, and the judge's GPUs beside it."""

from __future__ import annotations

from collections.abc import Mapping

from llmrnn.plan.common import PlanBase, input_flag, stage_resources
from llmrnn.plan.judge import JudgePlan
from llmrnn.plan.models import ModelsPlan
from llmrnn.plan.qa import QaPlan
from llmrnn.reward.custom import code_files as reward_code_files

# the QA rewards (recipe qa): the module the trainer imports them from, and its code for the job's code hash
QA_REWARD_MODULE = "llmrnn.qa.rewards"
QA_REWARD_FUNC = f"{QA_REWARD_MODULE}:trl_reward_func"


class TrainPlan(PlanBase):
    """The GRPO job's decisions over the config: the memory head trains the configured memory model
    (`models`), recipe qa its own policy (`qa`); a judge (`judge`) runs beside it when the reward asks."""

    def __init__(self, config: Mapping, *, models: ModelsPlan, judge: JudgePlan, qa: QaPlan):
        super().__init__(config)
        self.models = models
        self.judge = judge
        self.qa = qa

    def rule_name(self) -> str:
        """The GRPO rule's name: its log, benchmark and the rules reading its outputs use it."""
        return "qa_train_grpo" if self.recipe_is("qa") else "train_grpo"

    def inputs(self) -> dict[str, str]:
        """The job's data, its preflight report (which must say ok) and the policy it trains."""
        if self.recipe_is("qa"):
            qa = self.paths.qa
            return {"train": f"{qa}/train.parquet", "val": f"{qa}/val.parquet",
                    "preflight": f"{self.paths.run}/train/qa_preflight.json", "model": self.qa.policy_input()}
        run = self.paths.run
        return {"train": f"{run}/trajectories/train.parquet", "val": f"{run}/trajectories/val.parquet",
                "preflight": f"{run}/train/preflight.json", "model": self.models.memory_model_input()}

    def priority(self) -> int:
        """The memory head's job is on the training path: before the base model's eval shards, which only
        the report waits for (recipe qa has no such shards)."""
        return 0 if self.recipe_is("qa") else 10

    def run_cfg(self) -> str:
        """params of the job: the train section + the reward (qa: its own); the memory head's adds preflight,
        whose max_fallback_rate/fallback_window also guard the reward during training."""
        return self.qa.train_cfg() if self.recipe_is("qa") else self.cfg_json("train", "reward", "preflight")

    def reward_code(self) -> list[str]:
        """What the job's code hash adds to `llmrnn train run`'s modules: the QA rewards (recipe qa), or your
        own reward's file (reward.custom.path), whose content is code of this job too."""
        return [QA_REWARD_MODULE] if self.recipe_is("qa") else reward_code_files(self.config)

    def run_flags(self, wildcards, input) -> list[str]:
        """The flags after --summary, a list for `{params.flags:q}`: --preflight, --endpoint (when the job
        has the judge's endpoint), then --judge-gpus (memory head) or --reward-func (qa)."""
        flags = ["--preflight", input.preflight, *input_flag("--endpoint", "endpoint")(wildcards, input)]
        if self.recipe_is("qa"):
            return [*flags, "--reward-func", QA_REWARD_FUNC]
        return [*flags, "--judge-gpus", str(self.judge_gpus())]

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
