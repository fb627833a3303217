"""The qa recipe's plan (rules/qa.smk): its data, SFT, GRPO and evaluation inputs, params and targets."""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path

from llmrnn.errors import InputError
from llmrnn.plan.common import PlanBase, knobs, model_dir_of, stage_resources, to_json
from llmrnn.plan.judge import JudgePlan
from llmrnn.plan.models import ModelsPlan
from llmrnn.reward import judge_wait_cfg
from llmrnn.runconfig import filled


class QaPlan(PlanBase):
    """The qa recipe's stages' decisions over the config: its base model is one of the configured `models`, its
    answers are graded by the `judge` where asked. (Both recipes share cohort, models, judge, train, merge and
    release; what the qa recipe decides in them is llmrnn.plan.recipe.QaRecipe's.)"""

    # qa_eval_model's {variant}: the models compared
    VARIANT_PATTERN = "base|sft|grpo"

    def __init__(self, config: Mapping, *, models: ModelsPlan, judge: JudgePlan):
        super().__init__(config)
        self.models = models
        self.judge = judge

    def model_input(self) -> str:
        """The qa base model as an input: its .ready marker (a configured name) or its folder."""
        return self.models.input_of(self.config["qa"]["model"])

    def sft_enabled(self) -> bool:
        return self.config["qa"]["sft"]["enabled"]

    def policy_input(self) -> str:
        """The model GRPO starts from: the merged SFT model when the warm start is on, else the base."""
        return f"{self.paths.qa}/sft/merged" if self.sft_enabled() else self.model_input()

    def source_path(self, wildcards=None) -> str | list:
        source = self.config["qa"]["source"]
        if source == "synthetic":
            return f"{self.paths.qa_synth}/synthetic.jsonl"
        if source.startswith("hf:"):
            return []  # a datasets name/path: resolved by the CLI, not a file Snakemake tracks
        if not Path(source).exists():
            raise InputError(
                f"qa.source: {source} does not exist (a JSON/JSONL QA file, hf:<dataset>, or synthetic)"
            )
        return source

    def ood_path(self, wildcards=None) -> str | list:
        ood = self.config["qa"]["ood"]
        if ood == "synthetic":
            return f"{self.paths.qa_synth}/synthetic_ood.jsonl"
        return [] if not ood or ood.startswith("hf:") else ood

    def source_param(self, wildcards, input) -> str:
        """--source of `llmrnn qa data`: the tracked file, or the hf: name as configured."""
        return getattr(input, "source", None) or self.config["qa"]["source"]

    def ood_param(self, wildcards, input) -> str:
        """--ood of `llmrnn qa data`: the tracked file, an hf: name, or "" (no OOD set)."""
        return getattr(input, "ood", None) or self.config["qa"]["ood"] or ""

    def synth_cfg(self) -> str:
        return to_json({"synthetic": self.config["qa"]["synthetic"]})

    def data_cfg(self) -> str:
        return to_json({k: self.config["qa"][k] for k in ("fields", "dataset", "filter", "split", "prompt")})

    def sft_cfg(self) -> str:
        return to_json({"sft": self.config["qa"]["sft"]})

    def sft_threads(self) -> int:
        """threads of qa_sft: qa.sft.num_threads (torch's CPU threads)."""
        return self.config["qa"]["sft"]["num_threads"]

    def sft_resources(self) -> dict:
        """resources of qa_sft: qa.sft.resources (a killed SFT starts over: its runtime grows)."""
        return stage_resources(self.config["qa"]["sft"]["resources"])

    def sft_merge_cfg(self) -> str:
        """params of qa_merge_sft: the merge knobs + the SFT LoRA rank/alpha the adapter is checked against."""
        lora = self.config["qa"]["sft"]["lora"]
        wanted = {k: lora[k] for k in ("rank", "alpha")}
        return to_json({"merge": knobs(self.config["merge"]), "train": {"lora": wanted}})

    def train_cfg(self) -> str:
        """params of qa_train_grpo: the shared train section + the qa reward (the fluency reward scores
        under the qa base model; the judge reward reads qa.reward.rubric or judge.rubric).
        """
        reward = dict(self.config["qa"]["reward"])
        reward["fluency_model"] = model_dir_of(self.model_input())
        reward["rubric"] = self.reward_rubric()
        return to_json({"train": self.config["train"], "reward": reward})

    def variants(self) -> list[str]:
        return ["base", *(["sft"] if self.sft_enabled() else []), "grpo"]

    def eval_splits(self) -> list[str]:
        return ["test", *(["ood"] if self.config["qa"]["ood"] else [])]

    def eval_model(self, wildcards) -> dict:
        """Inputs of qa_eval_model: the variant's model (and the merge check it must have passed)."""
        if wildcards.variant == "base":
            return {"model": self.model_input()}
        if wildcards.variant == "sft":
            return {"model": f"{self.paths.qa}/sft/merged", "check": f"{self.paths.qa}/sft/merge_check.json"}
        return {"model": f"{self.paths.run}/merged", "check": f"{self.paths.run}/merge_check.json"}

    def answer_files(self) -> list[str]:
        """What qa_eval_model writes: every variant's answers on every split."""
        return [
            f"{self.paths.qa_eval}/{variant}/{split}.jsonl"
            for variant in self.variants()
            for split in self.eval_splits()
        ]

    def eval_judged(self) -> bool:
        """Whether the answers are judge-graded too (a second metric beside exact match): qa.eval.judge
        auto = where the QA reward asks the judge (free-text answers, e.g. qa_reproduce.yaml), or true/false."""
        judge = filled("qa.eval", self.config["qa"]["eval"])["judge"]
        return self.judge.planned() if judge == "auto" else bool(judge)

    def judged_files(self) -> list[str]:
        """What qa_judge_eval writes: a judge-graded copy of each of answer_files, in the same order."""
        return [path.removesuffix(".jsonl") + ".judged.jsonl" for path in self.answer_files()]

    def eval_files(self) -> list[str]:
        """What gather and the report read: the judged copies where the answers are judge-graded, else
        qa_eval_model's answers."""
        return self.judged_files() if self.eval_judged() else self.answer_files()

    def reward_rubric(self) -> str:
        """The rubric the QA reward asks: qa.reward.rubric, else judge.rubric."""
        return self.config["qa"]["reward"].get("rubric") or self.config["judge"]["rubric"]

    def grading_rubric(self) -> str:
        """The rubric the QA judge grades by: the reward's (reward_rubric)."""
        return self.reward_rubric()

    def judge_cfg(self) -> str:
        """params of qa_judge_eval: the grading threshold and the fallback bar preflight holds the judge to."""
        ev = self.config["qa"]["eval"]
        return to_json({"eval": {"k": ev["k"], "judge_threshold": ev["judge_threshold"]},
                      "max_fallback_rate": self.config["preflight"]["max_fallback_rate"],
                      "reward": judge_wait_cfg(self.config.get("reward"))})

    def eval_threads(self) -> int:
        """threads of qa_eval_model: qa.eval.resources.cpus_per_task (the cores it asks for, all used)."""
        return self.config["qa"]["eval"]["resources"]["cpus_per_task"]

    def eval_resources(self) -> dict:
        """resources of qa_eval_model: qa.eval.resources (a killed evaluation starts over: its runtime grows)."""
        return stage_resources(self.config["qa"]["eval"]["resources"])

    def judge_threads(self) -> int:
        """threads of qa_judge_eval: a core of its own while the judge service beside it computes (the service
        takes 0)."""
        return 1

    def judge_resources(self) -> dict:
        """resources of qa_judge_eval: qa.eval's runtime (its judge service beside it holds the rest)."""
        return {"runtime": self.config["qa"]["eval"]["resources"]["runtime"]}

    def eval_cfg(self) -> str:
        """The eval knobs + the qa prompt: the evaluation asks in the system prompt training used. The
        judge's knobs are judge_cfg's (a threshold change regrades, it does not regenerate)."""
        skip = {"resources", "judge", "judge_threshold"}
        return to_json({"eval": {k: v for k, v in self.config["qa"]["eval"].items() if k not in skip},
                      "prompt": self.config["qa"]["prompt"]})

    def eval_targets(self) -> list[str]:
        qa_eval = self.paths.qa_eval
        return [
            f"{qa_eval}/metrics.json",
            f"{qa_eval}/comparison.json",
            f"{qa_eval}/plots/pass_at_k.png",
            f"{qa_eval}/plots/summary.tsv",
            f"{qa_eval}/plots/questions.tsv",
        ]
