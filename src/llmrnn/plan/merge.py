"""The merge stage's plan: the base the GRPO adapter is folded into, and merge_model's params."""

from __future__ import annotations

from llmrnn.plan.common import PlanBase, _json, _knobs, stage_resources
from llmrnn.slurm import gpu_placement


class MergePlan(PlanBase):
    """The merge stage's decisions over self.config (the other stages' methods are reached
    through Plan, which is all of them)."""

    # ------------------------------------------------------------------------- merge / release
    def merge_base_input(self) -> str:
        """The base merge_model folds the GRPO adapter into: the memory model, or (recipe qa) the model
        GRPO started from."""
        return self.qa_policy_input() if self.recipe_is("qa") else self.memory_model_input()

    def merge_resources(self) -> dict:
        """resources of merge_model and qa_merge_sft: merge.resources, whose GPU count also decides the GPU
        request, partition and model (llmrnn.slurm.gpu_placement; the profile does not place these rules)."""
        res = self.config["merge"]["resources"]
        return stage_resources(res, gpu_placement(res["gpu"]))

    def merge_cfg_json(self) -> str:
        """params of merge_model: the merge knobs (not resources) + the LoRA rank/alpha training asked for
        (the adapter is checked against them; an alpha of 0 is repaired from them)."""
        # the values training really uses: its section with the train stage's own defaults filled in
        from llmrnn.settings.base import parse
        from llmrnn.settings.train import Train

        lora = parse(Train, self.config.get("train") or {}, "train").lora
        wanted = {"rank": lora.rank, "alpha": lora.alpha}
        return _json({"merge": _knobs(self.config["merge"]), "train": {"lora": wanted}})
