"""The judge and preflight stages' plan: the rubric, whether the reward asks the judge, the judge model's
input and GPUs, the agreement check and preflight's params."""

from __future__ import annotations

from llmrnn.models import READY
from llmrnn.plan.common import PlanBase, _json, stage_resources


class JudgePlan(PlanBase):
    """The judge and preflight stages' decisions over self.config (the other stages' methods are reached
    through Plan, which is all of them)."""

    # ------------------------------------------------------------------------- judge / preflight
    def judge_rubric(self):
        """The rubric named by judge.rubric, parsed by the same code the server and the reward use."""
        if self._rubric is None:
            from llmrnn.rubric import load_rubric

            self._rubric = load_rubric(self.config["judge"]["rubric"])
        return self._rubric

    def judge_planned(self) -> bool:
        """Whether the reward asks the judge (llmrnn.reward.asks_judge: not when reward.mode is outcome);
        without it preflight and training get no endpoint, and judge_server serves only the judge_agreement
        check (where judge_agreement_on)."""
        from llmrnn.reward import asks_judge

        return asks_judge(self.config)

    def judge_model_input(self, wildcards=None) -> str | list:
        """The .ready marker of the judge model's local copy (the server loads only that copy, offline):
        prepare_base_model for `source: local`, prepare_judge_model for `source: hub`; none for a `path`.
        """
        rubric = self.judge_rubric()
        if rubric.model_source == "local":
            return self.model_ready(rubric.model)
        if rubric.model_source == "path":
            return []
        from llmrnn.judge.launcher import judge_model_dir

        return str(judge_model_dir(rubric) / READY)

    def judge_model_cfg_json(self) -> str:
        """What the judge model's download depends on: its hub id (not the rubric's prompts)."""
        rubric = self.judge_rubric()
        return _json({"model": rubric.model, "source": rubric.model_source})

    def judge_gpus(self) -> int:
        return 1 if self.judge_rubric().needs_gpu else 0

    def judge_resources(self) -> dict:
        """resources of judge_server: judge.resources and the rubric's GPU; its runtime is its consumers' (it
        lives as long as they do), so it does not grow on a retry."""
        return stage_resources(self.config["judge"]["resources"], {"gpu": self.judge_gpus()}, runtime_grows=False)

    def preflight_rubric_input(self) -> dict:
        """The rubric preflight checks, when the reward asks the judge (its endpoint comes beside it)."""
        return {"rubric": self.config["judge"]["rubric"]} if self.judge_planned() else {}

    def judge_agreement_cfg(self) -> str:
        """What the judge-agreement check depends on: the judge, the reward's scorer settings, and preflight's
        agreement keys and seed (not its compliance keys, which rerun only preflight)."""
        pre = {k: v for k, v in self.config["preflight"].items() if k.startswith("agreement_") or k == "seed"}
        return _json({"judge": self.config["judge"], "reward": self.config["reward"], "preflight": pre})

    def judge_agreement_on(self) -> bool:
        """The judge-agreement figure is made unless preflight.agreement_pairs is 0."""
        return bool(self.config["preflight"]["agreement_pairs"])

    def preflight_cfg(self) -> str:
        """Preflight depends on the judge (when the reward asks it), reward and preflight sections (+ train:
        its training checks)."""
        sections = ("judge", "reward", "preflight", "train")
        judged = self.judge_planned()
        return self.cfg_json(*[s for s in sections if s in self.config and (s != "judge" or judged)])

    def preflight_threads(self) -> int:
        """Beside the judge service (one group; Snakemake sums a service group's cores) preflight mostly
        waits on the judge: 0 (llmrnn runs a 0-thread job single-threaded: cli.sanitize_thread_env).
        Without a judge it computes: a core of its own (with 0 it ran beside two eval shards on the demo's
        2 cores: 53 s, not ~5)."""
        return 0 if self.judge_planned() else 1
