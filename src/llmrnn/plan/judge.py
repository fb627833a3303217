"""The judge and preflight stages' plan: the rubric, whether the reward asks the judge, the judge model's
input and GPUs, the agreement check and preflight's params."""

from __future__ import annotations

from collections.abc import Mapping

from llmrnn.judge.launcher import judge_model_dir
from llmrnn.models import READY
from llmrnn.plan.common import PlanBase, stage_resources, to_json
from llmrnn.plan.models import ModelsPlan
from llmrnn.reward import asks_judge
from llmrnn.rubric import load_rubric
from llmrnn.settings.evaluation import Preflight


def agreement_planned(config: Mapping) -> bool:
    """Whether the judge-agreement check beside training is planned (memory head, a reward that asks no
    judge): unless preflight.agreement_pairs is 0 or your own reward (reward.custom.path) replaces the judge's
    scorer (docs/rewards.md: no judge server is planned for it). The one place the rules and `llmrnn check`
    ask it."""
    if ((config.get("reward") or {}).get("custom") or {}).get("path"):
        return False
    pairs = (config.get("preflight") or {}).get("agreement_pairs")
    return bool(Preflight().agreement_pairs if pairs is None else pairs)


class JudgePlan(PlanBase):
    """The judge and preflight stages' decisions over the config; a `source: local` judge is one of the
    configured models (`models`)."""

    def __init__(self, config: Mapping, *, models: ModelsPlan):
        super().__init__(config)
        self.models = models
        self._rubric = None

    def rubric(self):
        """The rubric named by judge.rubric, parsed by the same code the server and the reward use."""
        if self._rubric is None:
            self._rubric = load_rubric(self.config["judge"]["rubric"])
        return self._rubric

    def planned(self) -> bool:
        """Whether the reward asks the judge (llmrnn.reward.asks_judge: not when reward.mode is outcome);
        without it preflight and training get no endpoint, and judge_server serves only the judge_agreement
        check (where agreement_on)."""
        return asks_judge(self.config)

    def model_input(self, wildcards=None) -> str | list:
        """The .ready marker of the judge model's local copy (the server loads only that copy, offline):
        prepare_base_model for `source: local`, prepare_judge_model for `source: hub`; none for a `path`.
        """
        rubric = self.rubric()
        if rubric.model_source == "local":
            return self.models.ready(rubric.model)
        if rubric.model_source == "path":
            return []
        return str(judge_model_dir(rubric) / READY)

    def model_cfg(self) -> str:
        """What the judge model's download depends on: its hub id (not the rubric's prompts)."""
        rubric = self.rubric()
        return to_json({"model": rubric.model, "source": rubric.model_source})

    def gpus(self) -> int:
        return 1 if self.rubric().needs_gpu else 0

    def server_threads(self) -> int:
        """threads of judge_server: 0, so the service does not take the cores its consumers (same group) need;
        `-n --cores 1` stays valid."""
        return 0

    def resources(self) -> dict:
        """resources of judge_server: judge.resources and the rubric's GPU; its runtime is its consumers' (it
        lives as long as they do), so it does not grow on a retry."""
        return stage_resources(self.config["judge"]["resources"], {"gpu": self.gpus()}, runtime_grows=False)

    def preflight_rubric_input(self) -> dict:
        """The rubric preflight checks, when the reward asks the judge (its endpoint comes beside it)."""
        return {"rubric": self.config["judge"]["rubric"]} if self.planned() else {}

    def agreement_cfg(self) -> str:
        """What the judge-agreement check depends on: the judge, the reward's scorer settings, and preflight's
        agreement keys and seed (not its compliance keys, which rerun only preflight)."""
        pre = {k: v for k, v in self.config["preflight"].items() if k.startswith("agreement_") or k == "seed"}
        return to_json({"judge": self.config["judge"], "reward": self.config["reward"], "preflight": pre})

    def agreement_threads(self) -> int:
        """threads of judge_agreement: a core of its own while the judge service beside it computes (the service
        takes 0)."""
        return 1

    def agreement_on(self) -> bool:
        """The judge-agreement figure is made unless preflight.agreement_pairs is 0 or reward.custom replaces
        the judge (agreement_planned)."""
        return agreement_planned(self.config)

    def preflight_cfg(self) -> str:
        """Preflight depends on the judge (when the reward asks it), reward and preflight sections (+ train:
        its training checks)."""
        sections = ("judge", "reward", "preflight", "train")
        judged = self.planned()
        return self.cfg_json(*[s for s in sections if s in self.config and (s != "judge" or judged)])

    def preflight_threads(self) -> int:
        """Beside the judge service (one group; Snakemake sums a service group's cores) preflight mostly
        waits on the judge: 0 (llmrnn runs a 0-thread job single-threaded: cli.sanitize_thread_env).
        Without a judge it computes: a core of its own (with 0 it ran beside two eval shards on the demo's
        2 cores: 53 s, not ~5)."""
        return 0 if self.planned() else 1
