"""The held-out evaluation's plan: its variants, params, shard inputs and files, its targets, and the report's
overview of it (what was trained, the headline, what next)."""

from __future__ import annotations

from collections.abc import Mapping

from llmrnn.plan.common import PlanBase, stage_resources, to_json
from llmrnn.plan.models import ModelsPlan
from llmrnn.reward import asks_judge

EVAL_ROLES = ("prediction", "evaluation", "memory")


class EvaluatePlan(PlanBase):
    """The memory head's held-out evaluation's decisions over the config: its roles load configured `models`
    (recipe qa evaluates in its own stage, plan.qa)."""

    # eval_shard's {variant}: the base and trained memory model, and the baselines eval.baselines may name
    VARIANT_PATTERN = "base|trained|zero_shot|full_history|memprompt"

    def __init__(self, config: Mapping, *, models: ModelsPlan):
        super().__init__(config)
        self.models = models

    def variants(self) -> list[str]:
        """base + trained memory model, then the configured baselines."""
        return ["base", "trained", *self.config["eval"]["baselines"]]

    def section_cfg(self, *keys: str) -> str:
        """A subset of the eval section as JSON (params of the grade/gather rules)."""
        return to_json({k: self.config["eval"][k] for k in keys})

    def forward_cfg(self) -> str:
        """Everything that changes the forward pass of an eval shard: eval's patient/sampling knobs and the
        roles/prompts sections (models and the prompt file are inputs). Grading and statistics knobs are
        left out, so changing them never reruns the forward pass.
        """
        c = self.config
        subset = {k: c["eval"][k] for k in ("max_patients", "max_visits", "patient_seed", "seed")}
        return to_json({"eval": subset, "roles": c.get("roles"), "prompts": c.get("prompts")})

    def threads(self) -> int:
        """threads of eval_shard: eval.threads (torch's CPU threads per shard)."""
        return self.config["eval"]["threads"]

    def resources(self) -> dict:
        """resources of eval_shard: eval.resources (a killed shard starts over: its runtime grows)."""
        return stage_resources(self.config["eval"]["resources"])

    def role_model_inputs(self, roles) -> list[str]:
        """Files of the roles' models: the .ready marker of a configured model name, the folder itself for
        a path; nothing for an openai endpoint."""
        sections = self.models.local_roles(self.config["roles"][role] for role in roles)
        return sorted({self.models.input_of(cfg["model"]) for cfg in sections})

    def trained_model(self) -> str:
        """The trained memory model: this run's merged model, or the HF folder named by eval.trained_model."""
        return self.config["eval"]["trained_model"] or f"{self.paths.run}/merged"

    def shard_inputs(self, wildcards) -> list[str]:
        """Models of an eval shard; the trained variant's memory model is the merged one (and the merge
        check must have passed) or eval.trained_model."""
        if wildcards.variant != "trained":
            return self.role_model_inputs(EVAL_ROLES)
        inputs = [*self.role_model_inputs(("prediction", "evaluation")), self.replay_shard(wildcards)]
        trained = self.config["eval"]["trained_model"]
        if trained:
            return [*inputs, f"{trained}/config.json"]
        return [*inputs, f"{self.paths.run}/merged", f"{self.paths.run}/merge_check.json", self.grpo_adapter()]

    def replay_shard(self, wildcards) -> str:
        """The base model's shard of the trained one's patients: the trained shard's first visit step prompts
        the same prediction and evaluation roles with the same initial memory, so it takes those outputs from it
        (`evaluate shard --replay`) instead of computing them again; the base shard runs beside training."""
        return f"{self.shard_root('base')}/eval/base/shard_{wildcards.shard}.jsonl"

    def grpo_adapter(self) -> str:
        """The GRPO adapter folder (train_grpo's output `adapter`)."""
        return self.paths.grpo.adapter

    def memory_arg(self, wildcards) -> list[str]:
        """Arguments as a list, so `{params.memory:q}` quotes each one. This run's trained model comes with the
        adapter it was merged from: a vLLM memory role serves it as a LoRA on the base engine (one engine)."""
        if wildcards.variant != "trained":
            return []
        replay = ["--replay", self.replay_shard(wildcards)]
        if self.config["eval"]["trained_model"]:
            return ["--memory-model", self.trained_model(), *replay]
        return ["--memory-model", self.trained_model(), "--memory-adapter", self.grpo_adapter(), *replay]

    def shard_files(self, kind: str) -> list[str]:
        """All shard files of every variant: kind is "shard" (forward pass) or "graded"."""
        return [path for variant in self.variants() for path in self.variant_files(variant, kind)]

    def variant_files(self, variant: str, kind: str = "graded") -> list[str]:
        """One eval variant's shard files (kind "shard" or "graded"), e.g. an experiment comparison's inputs."""
        root = self.shard_root(variant)
        return [f"{root}/eval/{variant}/{kind}_{k}.jsonl" for k in range(self.config["eval"]["shards"])]

    def shard_root(self, variant: str) -> str:
        """The folder of an eval variant's shards: this run's for the trained model, else the untrained models'
        (which an experiment's variants share where their eval and cohort settings agree)."""
        return self.paths.run if variant == "trained" else self.paths.untrained_eval

    def trained_apart(self) -> bool:
        """Whether the trained model's shards are in another folder than the untrained models' (an experiment's
        member: rules/evaluate.smk's eval_shard_trained, eval_grade_trained make them)."""
        return self.shard_root("trained") != self.paths.untrained_eval

    def shard_variant_pattern(self) -> str:
        """wildcard_constraints of eval_shard/eval_grade's {variant}: every variant, or the untrained ones where
        the trained model's shards are apart."""
        if not self.trained_apart():
            return self.VARIANT_PATTERN
        return "|".join(v for v in self.VARIANT_PATTERN.split("|") if v != "trained")

    def heldout_targets(self) -> list[str]:
        """The memory head's held-out evaluation (what `eval_heldout` builds for it): metrics and plots."""
        plots = f"{self.paths.run}/eval/plots"
        return [
            f"{self.paths.run}/eval/metrics.json",
            f"{self.paths.run}/eval/comparison.json",
            f"{plots}/acc_bars.png",
            f"{plots}/acc_by_visit.png",
            f"{plots}/memory_recall.png",
            f"{plots}/memory_specificity.png",
            f"{plots}/summary.tsv",
            f"{plots}/summary.html",
            self.overview_target(),
        ]

    def overview_target(self) -> str:
        """The report's landing page (rule report_overview; workflow/report/workflow.rst takes it in)."""
        return f"{self.paths.run}/report/overview.html"

    def overview_inputs(self, wildcards=None) -> dict:
        """What the overview reads: the comparison and the split sizes; this run's training summary unless
        eval.trained_model names a model trained elsewhere; the rubric when the reward asked the judge."""
        run = self.paths.run
        inputs = {"comparison": f"{run}/eval/comparison.json", "splits": f"{self.paths.cohort}/splits/splits.json"}
        if not self.config["eval"]["trained_model"]:
            inputs["train_summary"] = f"{run}/train/summary.json"
        if asks_judge(self.config):
            inputs["rubric"] = self.config["judge"]["rubric"]
        return inputs

    def overview_cfg(self) -> str:
        """params of report_overview: the knobs the page names. Each one reruns the training or the evaluation
        too (so the page never reruns alone)."""
        c = self.config
        train = c["train"]
        return to_json({
            "run_name": c["run_name"],
            "memory_model": c["roles"]["memory"]["model"],
            "train": {"engine": train["engine"], "seed": train["seed"], "select": train["select"],
                      "lora": {"rank": train["lora"]["rank"]}},
            "reward": {k: c["reward"][k] for k in ("mode", "custom") if k in c["reward"]},
            "eval": {k: c["eval"][k] for k in ("max_patients", "trained_model")},
        })
