"""The release stage's plan: its params (every model-shaping knob), targets, rubric and split format."""

from __future__ import annotations

from collections.abc import Mapping

from llmrnn.plan.common import PlanBase, knobs, to_json
from llmrnn.plan.judge import JudgePlan
from llmrnn.plan.recipe import Recipe

# Sections whose knobs shaped the released model (recorded in MANIFEST.json); eval/report/slurm/check are
# not among them, so an eval knob never reruns the release.
RELEASE_KNOB_SECTIONS = (
    "cohort", "split", "models", "roles", "prompts", "trajectories", "judge", "reward", "preflight",
    "train", "merge",
)


class ReleasePlan(PlanBase):
    """The release stage's decisions over the config; the card names the `judge` the reward asked, the
    `recipe` adds its knobs and its split format."""

    def __init__(self, config: Mapping, *, judge: JudgePlan, recipe: Recipe):
        super().__init__(config)
        self.judge = judge
        self.recipe = recipe

    def build_cfg(self) -> str:
        """params of release: its own section + every model-shaping knob (for the manifest and card)."""
        c = self.config
        shaping = {
            s: knobs(c[s]) if isinstance(c[s], dict) else c[s]
            for s in RELEASE_KNOB_SECTIONS
            if s in c
        }
        return to_json({"run_name": c["run_name"], "release": c["release"],
                        "knobs": {**shaping, **self.recipe.release_knobs()}})

    def targets(self) -> list[str]:
        release = f"{self.paths.run}/release"
        return [f"{release}/README.md", f"{release}/MANIFEST.json", f"{release}/upload_receipt.json"]

    def rubric_input(self, wildcards=None) -> dict:
        """The rubric the card and manifest describe: the one the reward asked (the QA reward's for recipe
        qa); none where the reward asks no judge (memory head reward.mode outcome, a QA reward without
        judge weight), so they do not name a judge that scored nothing."""
        return {"rubric": self.recipe.reward_rubric()} if self.judge.planned() else {}

    def split_format(self) -> list[str]:
        """--split-format of `llmrnn release build`: the recipe's ([] for the cohort's, the CLI's default)."""
        return self.recipe.split_format()
