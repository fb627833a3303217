"""The train stage's plan: GPUs, threads and resources of the GRPO job, and the judge's GPUs beside it."""

from __future__ import annotations

from llmrnn.plan.common import PlanBase, stage_resources


class TrainPlan(PlanBase):
    """The train stage's decisions over self.config (the other stages' methods are reached
    through Plan, which is all of them)."""

    # ------------------------------------------------------------------------- train
    def train_gpus(self) -> int:
        """GPUs of train_grpo: train.resources.gpu, else n_gpus_per_node for verl (per node), 0 for TRL."""
        t = self.config["train"]
        if t["resources"].get("gpu") is not None:
            return t["resources"]["gpu"]
        return t["n_gpus_per_node"] if t["engine"] == "verl" else 0

    def train_threads(self) -> int:
        """TRL on CPU uses train.trl.num_threads (1 thread: 0.13-0.17 s per tiny GRPO step; 2: 0.14-9.7 s)."""
        t = self.config["train"]
        return t["trl"]["num_threads"] if t["engine"] == "trl" else t["resources"]["cpus_per_task"]

    def train_resources(self) -> dict:
        """resources of the GRPO job (train_grpo, qa_train_grpo): train.resources with train_gpus; its runtime
        never grows (a killed run resumes from its checkpoint; a longer request could outgrow the partition)."""
        return stage_resources(self.config["train"]["resources"], {"gpu": self.train_gpus()}, runtime_grows=False)

    def train_judge_gpus(self) -> int:
        """GPUs a judge holds beside train_grpo on its node (taken last); 0 without a judge."""
        return self.judge_gpus() if self.judge_planned() else 0
