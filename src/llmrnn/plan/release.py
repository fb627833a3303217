"""The release stage's plan: its params (every model-shaping knob), targets, rubric and split format."""

from __future__ import annotations

from llmrnn.plan.common import PlanBase, _json, _knobs

# Sections whose knobs shaped the released model (recorded in MANIFEST.json); eval/report/slurm/check are
# not among them, so an eval knob never reruns the release.
RELEASE_KNOB_SECTIONS = (
    "cohort", "split", "models", "roles", "prompts", "trajectories", "judge", "reward", "preflight",
    "train", "merge",
)


class ReleasePlan(PlanBase):
    """The release stage's decisions over self.config (the other stages' methods are reached
    through Plan, which is all of them)."""

    def release_cfg_json(self) -> str:
        """params of release: its own section + every model-shaping knob (for the manifest and card)."""
        c = self.config
        knobs = {
            s: _knobs(c[s]) if isinstance(c[s], dict) else c[s]
            for s in RELEASE_KNOB_SECTIONS
            if s in c
        }
        if self.recipe_is("qa"):  # only then: the memory head's manifest (and params) stay as they were
            knobs["recipe"] = c["recipe"]
            knobs["qa"] = {k: v for k, v in c["qa"].items() if k != "eval"}
            knobs["qa"]["sft"] = _knobs(c["qa"]["sft"])
        return _json({"run_name": c["run_name"], "release": c["release"], "knobs": knobs})

    def release_targets(self) -> list[str]:
        release = f"{self.paths.run}/release"
        return [f"{release}/README.md", f"{release}/MANIFEST.json", f"{release}/upload_receipt.json"]

    def release_rubric_input(self, wildcards=None) -> dict:
        """The rubric the card and manifest describe: the one the reward asked (the QA reward's for recipe
        qa); none where the reward asks no judge (memory head reward.mode outcome, a QA reward without
        judge weight), so they do not name a judge that scored nothing."""
        if not self.judge_planned():
            return {}
        return {"rubric": self.qa_grading_rubric() if self.recipe_is("qa") else self.config["judge"]["rubric"]}

    def release_split_format(self) -> list[str]:
        """--split-format of `llmrnn release build`: [] (cohort, the CLI's default) or qa; a list for :q."""
        return ["--split-format", "qa"] if self.recipe_is("qa") else []
