"""The recipes (config `recipe`): what the memory head's DAG and the qa recipe's differ in, as one object each,
chosen once when the plan is built (`Plan.recipe`). The shared stages ask it instead of branching: the GRPO
rule's name, inputs, params, reward code and flags (plan.train), the base merge_model folds into
(plan.merge), the release's extra knobs, rubric and split format (plan.release), the held-out evaluation
`eval_heldout` builds, the run's products `all` requests, the cost plan's stages (llmrnn.cost_plan), and
the rule files the Snakefile includes for it.

A new recipe is a subclass here, its entry in RECIPES, its rule files and its literal in
`settings.Config.recipe`."""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Mapping
from dataclasses import astuple
from typing import ClassVar

from llmrnn.plan.common import PlanBase, knobs
from llmrnn.plan.evaluate import EvaluatePlan
from llmrnn.plan.judge import JudgePlan
from llmrnn.plan.models import ModelsPlan
from llmrnn.plan.qa import QaPlan
from llmrnn.plan.trajectories import TrajectoriesPlan
from llmrnn.reward.custom import code_files as reward_code_files
from llmrnn.reward.function import BUILTIN_REWARD, RewardFunction


class Recipe(PlanBase, ABC):
    """What a recipe decides for the stages both recipes share. Built over the stage plans it reads (each
    recipe reads some of them); the train, merge and release plans are given it."""

    name: ClassVar[str]
    # the GRPO rule (the recipe's rule files hold it under this name): its log and benchmark are named by it
    train_rule: ClassVar[str]
    train_priority: ClassVar[int]
    # the recipe's own rule files, included by the Snakefile after the shared ones they build on
    rule_files: ClassVar[tuple[str, ...]]
    # the reward `train run` calls (--reward-func): its module is also checked by `llmrnn check` and hashed
    # into the job's code identity
    reward_function: ClassVar[RewardFunction] = BUILTIN_REWARD
    # the GPU-holding stages the cost plan counts (empty: not planned yet), and those on its critical path
    cost_stages: ClassVar[tuple[str, ...]] = ()
    critical_path: ClassVar[tuple[str, ...]] = ()

    def __init__(self, config: Mapping, *, models: ModelsPlan, trajectories: TrajectoriesPlan, judge: JudgePlan,
                 evaluate: EvaluatePlan, qa: QaPlan):
        super().__init__(config)
        self.models = models
        self.trajectories = trajectories
        self.judge = judge
        self.evaluate = evaluate
        self.qa = qa

    @abstractmethod
    def policy_input(self) -> str:
        """The model GRPO starts from, as an input: also the base merge_model folds the GRPO adapter into."""

    @abstractmethod
    def train_inputs(self) -> dict[str, str]:
        """The GRPO job's data, its preflight report (which must say ok) and the policy it trains."""

    @abstractmethod
    def train_cfg(self) -> str:
        """params of the GRPO job: the config subset it depends on, as JSON."""

    @abstractmethod
    def reward_code(self) -> list[str]:
        """What the GRPO job's code hash adds to `llmrnn train run`'s modules: the reward code it loads."""

    @abstractmethod
    def trainer_flags(self, judge_gpus: int) -> list[str]:
        """The GRPO command's last flags (after --preflight and --endpoint), a list for `{params.flags:q}`."""

    @abstractmethod
    def reward_rubric(self) -> str:
        """The rubric the reward asks (the card and manifest name it where the reward asks the judge)."""

    def release_knobs(self) -> dict:
        """Knobs the release records beside the shared model-shaping sections (plan.release.build_cfg)."""
        return {}

    def split_format(self) -> list[str]:
        """--split-format of `llmrnn release build`: [] (cohort, the CLI's default); a list for :q."""
        return []

    @abstractmethod
    def release_reference(self, wildcards=None) -> dict:
        """Inputs of release that say what must not leak from the bundle (its PHI guard's reference): the
        recipe's split files, and the splits.json the manifest records."""

    @abstractmethod
    def heldout_targets(self) -> list[str]:
        """What `eval_heldout` builds: the recipe's held-out evaluation."""

    @abstractmethod
    def products(self) -> list[str]:
        """What the recipe's run makes beside the release and the held-out evaluation (Plan.products)."""


class MemoryHeadRecipe(Recipe):
    """recipe: memory_head (the default DAG): Phase B trajectories, preflight, GRPO of the memory model, its
    held-out evaluation and report."""

    name = "memory_head"
    train_rule = "train_grpo"
    # on the training path: before the base model's eval shards, which only the report waits for
    train_priority = 10
    rule_files = ("rules/trajectories.smk", "rules/preflight.smk", "rules/train.smk", "rules/evaluate.smk",
                  "rules/report.smk")
    # the training group: judge_server, preflight, train_grpo
    cost_stages = ("trajectory_shard", "judge_server", "train_grpo", "merge_model", "eval_shard")
    critical_path = ("trajectory_shard", "train_grpo", "merge_model", "eval_shard")

    def policy_input(self) -> str:
        return self.models.memory_model_input()

    def train_inputs(self) -> dict[str, str]:
        trajectories = self.paths.trajectories
        return {"train": f"{trajectories}/trajectories/train.parquet", "val": f"{trajectories}/trajectories/val.parquet",
                "preflight": f"{self.paths.run}/train/preflight.json", "model": self.policy_input()}

    def train_cfg(self) -> str:
        """The train section + the reward + preflight, whose max_fallback_rate/fallback_window also guard the
        reward during training."""
        return self.cfg_json("train", "reward", "preflight")

    def reward_code(self) -> list[str]:
        """Your own reward's file (reward.custom.path), whose content is code of this job too; else none."""
        return reward_code_files(self.config)

    def trainer_flags(self, judge_gpus: int) -> list[str]:
        """--judge-gpus: the GPUs a judge holds beside the trainer on its node (0 without a judge)."""
        return ["--judge-gpus", str(judge_gpus)]

    def reward_rubric(self) -> str:
        return self.config["judge"]["rubric"]

    def release_reference(self, wildcards=None) -> dict:
        """The cohort's splits (split_cohort's outputs)."""
        splits = f"{self.paths.cohort}/splits"
        return {"splits": f"{splits}/splits.json",
                "split_files": [f"{splits}/{s}.json" for s in ("train", "val", "test")]}

    def heldout_targets(self) -> list[str]:
        return self.evaluate.heldout_targets()

    def products(self) -> list[str]:
        """The splits, the trajectories, preflight's report, the training plots (train_plots) and the judge
        agreement figure (judge_agreement_plot), unless preflight.agreement_pairs is 0."""
        agreement = [self.paths.judge_agreement_plot] if self.judge.agreement_on() else []
        return [
            f"{self.paths.cohort}/splits/splits.json",
            *self.trajectories.targets(),
            self.train_inputs()["preflight"],
            *astuple(self.paths.train_plots),
            *agreement,
        ]


class QaRecipe(Recipe):
    """recipe: qa: QA data, an optional SFT warm start, GRPO with verifiable rewards, pass@k evaluation of base
    vs SFT vs GRPO (rules/qa.smk; its stages' decisions are plan.qa's)."""

    name = "qa"
    train_rule = "qa_train_grpo"
    train_priority = 0  # no eval shards to go before
    rule_files = ("rules/qa.smk",)
    reward_function = RewardFunction("llmrnn.qa.rewards")  # verifiable rewards; the judge, where asked, is theirs

    def policy_input(self) -> str:
        return self.qa.policy_input()

    def train_inputs(self) -> dict[str, str]:
        qa = self.paths.qa
        return {"train": f"{qa}/train.parquet", "val": f"{qa}/val.parquet",
                "preflight": f"{self.paths.run}/train/qa_preflight.json", "model": self.policy_input()}

    def train_cfg(self) -> str:
        return self.qa.train_cfg()

    def reward_code(self) -> list[str]:
        return [self.reward_function.module]

    def trainer_flags(self, judge_gpus: int) -> list[str]:
        """--reward-func: the QA rewards in place of the memory reward (the judge, where asked, is theirs)."""
        return ["--reward-func", str(self.reward_function)]

    def reward_rubric(self) -> str:
        return self.qa.reward_rubric()

    def release_knobs(self) -> dict:
        """The recipe and the qa section's model-shaping knobs (not its eval); only recipe qa records them, so
        the memory head's manifest (and params) stay as they were."""
        qa = {k: v for k, v in self.config["qa"].items() if k != "eval"}
        return {"recipe": self.name, "qa": {**qa, "sft": knobs(self.config["qa"]["sft"])}}

    def split_format(self) -> list[str]:
        return ["--split-format", "qa"]

    def release_reference(self, wildcards=None) -> dict:
        """The QA data stage's records (qa_data's outputs: its questions, contexts and answers came from the
        user's data, for ECG QA from patients)."""
        qa = self.paths.qa
        return {"splits": f"{qa}/splits.json",
                "split_files": [f"{qa}/{s}.jsonl" for s in ("train", "val", "test", "ood")]}

    def heldout_targets(self) -> list[str]:
        return self.qa.eval_targets()

    def products(self) -> list[str]:
        return [f"{self.paths.qa}/splits.json"]


RECIPES: dict[str, type[Recipe]] = {recipe.name: recipe for recipe in (MemoryHeadRecipe, QaRecipe)}
# every recipe's GRPO rule: a job of one resumes from its checkpoint instead of starting over
TRAIN_RULES = tuple(recipe.train_rule for recipe in RECIPES.values())
