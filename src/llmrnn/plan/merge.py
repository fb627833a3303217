"""The merge stage's plan: the base the GRPO adapter is folded into, and merge_model's params."""

from __future__ import annotations

from collections.abc import Mapping

from llmrnn.plan.common import PlanBase, knobs, stage_resources, to_json
from llmrnn.plan.recipe import Recipe
from llmrnn.settings.base import parse
from llmrnn.settings.train import Train
from llmrnn.slurm import gpu_placement


class MergePlan(PlanBase):
    """The merge stage's decisions over the config: the base is the `recipe`'s policy (the memory model, or
    the model the qa recipe's GRPO started from)."""

    def __init__(self, config: Mapping, *, recipe: Recipe):
        super().__init__(config)
        self.recipe = recipe

    def base_input(self) -> str:
        """The base merge_model folds the GRPO adapter into: the model GRPO started from."""
        return self.recipe.policy_input()

    def threads(self) -> int:
        """threads of merge_model and qa_merge_sft: merge.resources.cpus_per_task."""
        return self.config["merge"]["resources"]["cpus_per_task"]

    def resources(self) -> dict:
        """resources of merge_model and qa_merge_sft: merge.resources, whose GPU count also decides the GPU
        request, partition and model (llmrnn.slurm.gpu_placement; the profile does not place these rules)."""
        res = self.config["merge"]["resources"]
        return stage_resources(res, gpu_placement(res["gpu"]))

    def run_cfg(self) -> str:
        """params of merge_model: the merge knobs (not resources) + the LoRA rank/alpha training asked for
        (the adapter is checked against them; an alpha of 0 is repaired from them)."""
        # the values training really uses: its section with the train stage's own defaults filled in
        lora = parse(Train, self.config.get("train") or {}, "train").lora
        wanted = {"rank": lora.rank, "alpha": lora.alpha}
        return to_json({"merge": knobs(self.config["merge"]), "train": {"lora": wanted}})
