"""The workflow's plan: every decision the rules take from the config, as plain Python.

`Plan(config)` takes an effective config (schema defaults filled in: Snakemake's `validate`, or
`llmrnn.runconfig.resolve` for the same files) and answers what the rules ask: which targets `all`
builds, which conda env a stage runs in, which GPUs/threads a job gets, the exact config subset each
rule passes as `--cfg` JSON (its params: a change reruns that rule and only it), and which optional
inputs and flags a job has. Nothing here needs Snakemake; rules/common.smk binds the names the rule
files call to one Plan (`Plan.rule_helpers()`) and keeps only what needs Snakemake's `rules` or
`workflow` objects. tests/test_plan.py asserts the decisions for the shipped configs and variants.

Methods a rule calls as an input or params function take Snakemake's arguments (`wildcards`, and
`input` for params), read by attribute. A bad config value raises `llmrnn.errors.InputError` (one
line); common.smk turns it into Snakemake's WorkflowError.
"""

from __future__ import annotations

import json
import os
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from llmrnn.configcheck import SYNTHETIC_MIMIC_IV
from llmrnn.errors import InputError
from llmrnn.models import MODELS_ROOT, READY

EVAL_VARIANT_PATTERN = "base|trained|zero_shot|full_history"
EVAL_ROLES = ("prediction", "evaluation", "memory")
QA_VARIANT_PATTERN = "base|sft|grpo"
TRAJECTORY_SPLITS = ("train", "val")
SYNTHETIC_COHORT = "resources/cohort/synthetic.json"
# Sections whose knobs shaped the released model (recorded in MANIFEST.json); eval/report/slurm/check are
# not among them, so an eval knob never reruns the release.
RELEASE_KNOB_SECTIONS = (
    "cohort", "split", "models", "roles", "prompts", "trajectories", "judge", "reward", "preflight",
    "train", "merge",
)
NOT_A_KNOB = ("resources", "threads")
CONDA_STAGES = ("data", "cpu", "forward", "judge", "train", "sft")


@dataclass(frozen=True)
class Paths:
    """Every path prefix of a run, built here only (rules use RUN, LOGS, MODELS, QA, QA_EVAL, QA_SYNTH)."""

    run: str
    logs: str
    models: str = str(MODELS_ROOT)
    qa_synth: str = "resources/qa"

    @classmethod
    def of(cls, run_name: str) -> Paths:
        return cls(run=f"results/{run_name}", logs=f"logs/{run_name}")

    @property
    def qa(self) -> str:
        return f"{self.run}/qa"

    @property
    def qa_eval(self) -> str:
        return f"{self.run}/eval"


def _json(value: Any) -> str:
    return json.dumps(value, sort_keys=True)


def _knobs(section: Mapping) -> dict:
    return {k: v for k, v in section.items() if k not in NOT_A_KNOB}


def is_model_name(ref: str) -> bool:
    """A role's `model` is a configured model name (prepared under MODELS) unless it looks like a path."""
    return not (os.sep in ref or os.altsep and os.altsep in ref or ref.startswith("."))


def model_dir_of(path: str) -> str:
    """The HF folder of a model input (its .ready marker or the folder itself), for a value in params."""
    return os.path.dirname(path) if os.path.basename(path) == READY else path


def input_flag(flag: str, name: str) -> Callable:
    """A params function: [flag, the job's input `name`] when the job has that optional (unpacked) input,
    else [] (e.g. --endpoint only when the reward asks the judge); a list, so `{params.x:q}` quotes it.
    """

    def arg(wildcards, input):
        # input is a Namedlist (a list): `name in input` would look among the files, not the names
        return [flag, input[name]] if name in input.keys() else []  # noqa: SIM118

    return arg


class Plan:
    """The decisions of one run's config (see the module docstring)."""

    def __init__(self, config: Mapping):
        self.config = config
        self.paths = Paths.of(config["run_name"])
        self._rubric = None

    @classmethod
    def from_configfiles(cls, *configfiles: str | os.PathLike, overrides: dict | None = None,
                         schema_path: str | os.PathLike | None = None) -> Plan:
        """The plan of a run of these config files (config/config.yaml when none is named) and `--config`
        overrides, layered as the Snakefile layers them (llmrnn.runconfig)."""
        from llmrnn import runconfig

        layers = [runconfig.read_layer(p) for p in runconfig.configfiles_for(configfiles)]
        if overrides:
            layers.append((runconfig.COMMAND_LINE, overrides))
        config, _ = runconfig.resolve(layers, schema_path or runconfig.SCHEMA)
        return cls(config)

    # ------------------------------------------------------------------------- shared
    def recipe_is(self, name: str) -> bool:
        return self.config["recipe"] == name

    def cfg_json(self, *sections: str) -> str:
        """The exact config subset a rule depends on, as JSON; in params it makes Snakemake rerun the
        rule when (and only when) that subset changes."""
        return _json({s: self.config[s] for s in sections})

    def conda_env(self, stage: str) -> str:
        """The conda env file (--sdm conda) of every job, chosen in this one place. Stages: data (cohort,
        report), cpu (models, merge, release, preflight), forward (trajectory and eval shards; vllm when a
        role uses the vLLM backend), judge (vllm for a `vllm serve` judge), train (verl or cpu), sft (the qa
        recipe's LoRA SFT: the GPU stack, whose lock holds TRL and PEFT, when the job gets a GPU).
        """
        c = self.config
        if stage == "forward":
            name = "vllm" if any(r.get("backend") == "vllm" for r in c["roles"].values()) else "cpu"
        elif stage == "judge":
            name = "vllm" if self.judge_gpus() else "cpu"
        elif stage == "train":
            name = "verl" if c["train"]["engine"] == "verl" else "cpu"
        elif stage == "sft":
            name = "verl" if c["qa"]["sft"]["resources"]["gpu"] else "cpu"
        elif stage in ("data", "cpu"):
            name = stage
        else:
            raise InputError(f"conda_env: unknown stage {stage!r}; expected one of {', '.join(CONDA_STAGES)}")
        return f"../envs/{name}.yaml"

    # ------------------------------------------------------------------------- cohort
    def raw_cohort_path(self, wildcards=None) -> str:
        """The cohort file clean_cohort reads: made by synth_cohort, or the user's own file."""
        source = self.config["cohort"]["source"]
        if source == "synthetic":
            return SYNTHETIC_COHORT
        if source == "mimic_iv":
            return f"{self.paths.run}/cohort/built.json"
        if "{" in source or "}" in source:
            raise InputError(
                f"cohort.source: {source!r} contains a brace, which Snakemake reads as a wildcard; "
                "rename the file or its folder"
            )
        if not Path(source).exists():
            raise InputError(
                f"cohort.source: {source} does not exist. Expected a JSON list of patients in the LLM-as-RNN "
                "format (see docs/configuration.md). MIMIC-IV is credentialed and never shipped with llmrnn: "
                "build the file from your own PhysioNet copy, or set cohort.source: synthetic."
            )
        return source

    def raw_cohort_sha256(self, wildcards=None) -> str | None:
        """params of clean_cohort: the user's cohort by content, so a replaced file reruns cleaning (and
        splits) even when its mtime is older; None for the synthetic cohort (synth_cohort's params rerun it).
        """
        from llmrnn.cohort import source_sha256

        return source_sha256(self.config["cohort"]["source"])

    def mimic_iv_inputs(self, wildcards=None) -> dict[str, str]:
        """build_cohort's inputs: the PhysioNet files themselves (a new release reruns everything after)."""
        from llmrnn.mimic.build import header_problem, table_paths

        mimic = self.config["cohort"]["mimic_iv"]
        paths = table_paths(mimic["hosp"], mimic["note"], mimic["diagnoses"])
        for table, path in paths.items():
            if "{" in str(path) or "}" in str(path):
                raise InputError(f"cohort.mimic_iv: {path} contains a brace, which Snakemake reads as a wildcard")
            if not str(path).startswith(SYNTHETIC_MIMIC_IV + "/") and (problem := header_problem(path, table)):
                raise InputError(f"cohort.mimic_iv: {problem}")
        return {table: str(path) for table, path in paths.items()}

    def mimic_iv_cfg_json(self) -> str:
        """params of build_cohort: the selection and diagnosis knobs (the folders are its inputs)."""
        return _json({k: v for k, v in self.config["cohort"]["mimic_iv"].items() if k not in ("hosp", "note")})

    def split_cfg_json(self) -> str:
        """params of split_cohort: the split section itself."""
        return _json(self.config["split"])

    # ------------------------------------------------------------------------- models
    def model_ready(self, name: str) -> str:
        if name not in self.config["models"]:
            raise InputError(
                f"model {name!r} is used but not configured: add models.{name} (source: pypi_gguf | hub | local)"
            )
        return f"{self.paths.models}/{name}/{READY}"

    def model_input(self, ref: str) -> str:
        """A model as an input of rules: its .ready marker (a configured name) or its folder (a path)."""
        return self.model_ready(ref) if is_model_name(ref) else ref

    def model_cfg_json(self, wildcards) -> str:
        """params of prepare_base_model: exactly the models.<name> entry it builds."""
        if wildcards.name not in self.config["models"]:
            raise InputError(f"models.{wildcards.name}: not configured")
        return _json(self.config["models"][wildcards.name])

    def model_mem_mb(self, wildcards) -> int:
        source = self.config["models"].get(wildcards.name, {}).get("source")
        return 16000 if source == "pypi_gguf" else 4000

    def _local_roles(self, roles) -> list[dict]:
        """The roles' sections that load a model here (an openai role calls a server instead)."""
        return [r for r in roles if r.get("backend", "transformers") != "openai"]

    def role_model_markers(self) -> list[str]:
        """.ready markers of the local models the forward-pass roles load (openai roles load none)."""
        roles = self._local_roles(self.config["roles"].values())
        names = {r["model"] for r in roles if is_model_name(r["model"])}
        return [self.model_ready(n) for n in sorted(names)]

    def memory_model_input(self) -> str:
        """The base memory model (roles.memory.model) as an input of rules; the CLI takes either form
        (llmrnn.models.model_folder). It is the policy GRPO trains, the base the adapter is merged into
        and eval's `base` variant."""
        return self.model_input(self.config["roles"]["memory"]["model"])

    # ------------------------------------------------------------------------- trajectories
    def trajectories_cfg_json(self) -> str:
        """params of trajectory_shard: roles, the models they use, the trajectories knobs (not resources)."""
        c = self.config
        used = {r["model"] for r in c["roles"].values()}
        return _json({
            "roles": c["roles"],
            "models": {n: m for n, m in c["models"].items() if n in used},
            "trajectories": _knobs(c["trajectories"]),
        })

    def trajectory_shard_files(self, split: str, ext: str) -> list[str]:
        return [
            f"{self.paths.run}/trajectories/shards/{split}/part_{k}.{ext}"
            for k in range(self.config["trajectories"]["shards"])
        ]

    def trajectory_targets(self) -> list[str]:
        return [
            f"{self.paths.run}/trajectories/{s}.{ext}"
            for s in TRAJECTORY_SPLITS
            for ext in ("parquet", "summary.json")
        ]

    # ------------------------------------------------------------------------- judge / preflight
    def judge_rubric(self):
        """The rubric named by judge.rubric, parsed by the same code the server and the reward use."""
        if self._rubric is None:
            from llmrnn.rubric import load_rubric

            self._rubric = load_rubric(self.config["judge"]["rubric"])
        return self._rubric

    def judge_planned(self) -> bool:
        """Whether the reward asks the judge (llmrnn.reward.asks_judge: not when reward.mode is outcome);
        without it judge_server (and the judge model's download) is never planned."""
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

    def train_judge_gpus(self) -> int:
        """GPUs a judge holds beside train_grpo on its node (taken last); 0 without a judge."""
        return self.judge_gpus() if self.judge_planned() else 0

    # ------------------------------------------------------------------------- eval (held-out)
    def eval_variants(self) -> list[str]:
        """base + trained memory model, then the configured baselines."""
        return ["base", "trained", *self.config["eval"]["baselines"]]

    def eval_cfg_json(self, *keys: str) -> str:
        """A subset of the eval section as JSON (params of the grade/gather rules)."""
        return _json({k: self.config["eval"][k] for k in keys})

    def eval_forward_cfg(self) -> str:
        """Everything that changes the forward pass of an eval shard: eval's patient/sampling knobs and the
        roles/prompts sections (models and the prompt file are inputs). Grading and statistics knobs are
        left out, so changing them never reruns the forward pass.
        """
        c = self.config
        subset = {k: c["eval"][k] for k in ("max_patients", "max_visits", "patient_seed", "seed")}
        return _json({"eval": subset, "roles": c.get("roles"), "prompts": c.get("prompts")})

    def eval_role_model_inputs(self, roles) -> list[str]:
        """Files of the roles' models: the .ready marker of a configured model name, the folder itself for
        a path; nothing for an openai endpoint."""
        sections = self._local_roles(self.config["roles"][role] for role in roles)
        return sorted({self.model_input(cfg["model"]) for cfg in sections})

    def eval_trained_model(self) -> str:
        """The trained memory model: this run's merged model, or the HF folder named by eval.trained_model."""
        return self.config["eval"]["trained_model"] or f"{self.paths.run}/merged"

    def eval_shard_inputs(self, wildcards) -> list[str]:
        """Models of an eval shard; the trained variant's memory model is the merged one (and the merge
        check must have passed) or eval.trained_model."""
        if wildcards.variant != "trained":
            return self.eval_role_model_inputs(EVAL_ROLES)
        inputs = self.eval_role_model_inputs(("prediction", "evaluation"))
        trained = self.config["eval"]["trained_model"]
        if trained:
            return [*inputs, f"{trained}/config.json"]
        return [*inputs, f"{self.paths.run}/merged", f"{self.paths.run}/merge_check.json", self.grpo_adapter()]

    def grpo_adapter(self) -> str:
        """The GRPO adapter folder (train_grpo's or qa_train_grpo's output `adapter`)."""
        return f"{self.paths.run}/train/adapter"

    def eval_memory_arg(self, wildcards) -> list[str]:
        """Arguments as a list, so `{params.memory:q}` quotes each one. This run's trained model comes with the
        adapter it was merged from: a vLLM memory role serves it as a LoRA on the base engine (one engine)."""
        if wildcards.variant != "trained":
            return []
        if self.config["eval"]["trained_model"]:
            return ["--memory-model", self.eval_trained_model()]
        return ["--memory-model", self.eval_trained_model(), "--memory-adapter", self.grpo_adapter()]

    def eval_shard_files(self, kind: str) -> list[str]:
        """All shard files of every variant: kind is "shard" (forward pass) or "graded"."""
        return [
            f"{self.paths.run}/eval/{variant}/{kind}_{k}.jsonl"
            for variant in self.eval_variants()
            for k in range(self.config["eval"]["shards"])
        ]

    def eval_heldout_targets(self) -> list[str]:
        if self.recipe_is("qa"):
            return self.qa_eval_targets()
        plots = f"{self.paths.run}/eval/plots"
        return [
            f"{self.paths.run}/eval/metrics.json",
            f"{self.paths.run}/eval/comparison.json",
            f"{plots}/acc_bars.png",
            f"{plots}/acc_by_visit.png",
            f"{plots}/memory_recall.png",
            f"{plots}/memory_specificity.png",
            f"{plots}/summary.tsv",
        ]

    # ------------------------------------------------------------------------- merge / release
    def merge_base_input(self) -> str:
        """The base merge_model folds the GRPO adapter into: the memory model, or (recipe qa) the model
        GRPO started from."""
        return self.qa_policy_input() if self.recipe_is("qa") else self.memory_model_input()

    def merge_cfg_json(self) -> str:
        """params of merge_model: the merge knobs (not resources) + the LoRA rank/alpha training asked for
        (the adapter is checked against them; an alpha of 0 is repaired from them)."""
        # the values training really uses: its section with the train stage's own defaults filled in
        from llmrnn.train.config import normalize

        lora = normalize(self.config.get("train"))["lora"]
        wanted = {k: lora.get(k) for k in ("rank", "alpha")}
        return _json({"merge": _knobs(self.config["merge"]), "train": {"lora": wanted}})

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

    # ------------------------------------------------------------------------- recipe qa
    # recipe: memory_head (the LLM-as-RNN DAG) | qa (rules/qa.smk). Both share cohort, models, judge,
    # merge (merge_model, whose base is the recipe's policy) and release.
    def qa_model_input(self) -> str:
        """The qa base model as an input: its .ready marker (a configured name) or its folder."""
        return self.model_input(self.config["qa"]["model"])

    def qa_sft_enabled(self) -> bool:
        return self.config["qa"]["sft"]["enabled"]

    def qa_policy_input(self) -> str:
        """The model GRPO starts from: the merged SFT model when the warm start is on, else the base."""
        return f"{self.paths.qa}/sft/merged" if self.qa_sft_enabled() else self.qa_model_input()

    def qa_source_path(self, wildcards=None) -> str | list:
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

    def qa_ood_path(self, wildcards=None) -> str | list:
        ood = self.config["qa"]["ood"]
        if ood == "synthetic":
            return f"{self.paths.qa_synth}/synthetic_ood.jsonl"
        return [] if not ood or ood.startswith("hf:") else ood

    def qa_source_param(self, wildcards, input) -> str:
        """--source of `llmrnn qa data`: the tracked file, or the hf: name as configured."""
        return getattr(input, "source", None) or self.config["qa"]["source"]

    def qa_ood_param(self, wildcards, input) -> str:
        """--ood of `llmrnn qa data`: the tracked file, an hf: name, or "" (no OOD set)."""
        return getattr(input, "ood", None) or self.config["qa"]["ood"] or ""

    def qa_synth_cfg(self) -> str:
        return _json({"synthetic": self.config["qa"]["synthetic"]})

    def qa_data_cfg(self) -> str:
        return _json({k: self.config["qa"][k] for k in ("fields", "dataset", "filter", "split", "prompt")})

    def qa_sft_cfg(self) -> str:
        return _json({"sft": self.config["qa"]["sft"]})

    def qa_sft_merge_cfg(self) -> str:
        """params of qa_merge_sft: the merge knobs + the SFT LoRA rank/alpha the adapter is checked against."""
        lora = self.config["qa"]["sft"]["lora"]
        wanted = {k: lora[k] for k in ("rank", "alpha")}
        return _json({"merge": _knobs(self.config["merge"]), "train": {"lora": wanted}})

    def qa_train_cfg(self) -> str:
        """params of qa_train_grpo: the shared train section + the qa reward (the fluency reward scores
        under the qa base model; the judge reward reads qa.reward.rubric or judge.rubric).
        """
        reward = dict(self.config["qa"]["reward"])
        reward["fluency_model"] = model_dir_of(self.qa_model_input())
        reward["rubric"] = reward.get("rubric") or self.config["judge"]["rubric"]
        return _json({"train": self.config["train"], "reward": reward})

    def qa_variants(self) -> list[str]:
        return ["base", *(["sft"] if self.qa_sft_enabled() else []), "grpo"]

    def qa_eval_splits(self) -> list[str]:
        return ["test", *(["ood"] if self.config["qa"]["ood"] else [])]

    def qa_eval_model(self, wildcards) -> dict:
        """Inputs of qa_eval_model: the variant's model (and the merge check it must have passed)."""
        if wildcards.variant == "base":
            return {"model": self.qa_model_input()}
        if wildcards.variant == "sft":
            return {"model": f"{self.paths.qa}/sft/merged", "check": f"{self.paths.qa}/sft/merge_check.json"}
        return {"model": f"{self.paths.run}/merged", "check": f"{self.paths.run}/merge_check.json"}

    def qa_answer_files(self) -> list[str]:
        """What qa_eval_model writes: every variant's answers on every split."""
        return [
            f"{self.paths.qa_eval}/{variant}/{split}.jsonl"
            for variant in self.qa_variants()
            for split in self.qa_eval_splits()
        ]

    def qa_eval_judged(self) -> bool:
        """Whether the answers are judge-graded too (a second metric beside exact match): qa.eval.judge
        auto = where the QA reward asks the judge (free-text answers, e.g. qa_reproduce.yaml), or true/false."""
        judge = self.config["qa"]["eval"].get("judge", "auto")
        return self.judge_planned() if judge == "auto" else bool(judge)

    def qa_judged_files(self) -> list[str]:
        """What qa_judge_eval writes: a judge-graded copy of each of qa_answer_files, in the same order."""
        return [path.removesuffix(".jsonl") + ".judged.jsonl" for path in self.qa_answer_files()]

    def qa_eval_files(self) -> list[str]:
        """What gather and the report read: the judged copies where the answers are judge-graded, else
        qa_eval_model's answers."""
        return self.qa_judged_files() if self.qa_eval_judged() else self.qa_answer_files()

    def qa_grading_rubric(self) -> str:
        """The rubric the QA judge grades by: the reward's (qa.reward.rubric), else judge.rubric."""
        return self.config["qa"]["reward"].get("rubric") or self.config["judge"]["rubric"]

    def qa_judge_cfg(self) -> str:
        """params of qa_judge_eval: the grading threshold and the fallback bar preflight holds the judge to."""
        from llmrnn.reward import judge_wait_cfg

        ev = self.config["qa"]["eval"]
        return _json({"eval": {"k": ev["k"], "judge_threshold": ev["judge_threshold"]},
                      "max_fallback_rate": self.config["preflight"]["max_fallback_rate"],
                      "reward": judge_wait_cfg(self.config.get("reward"))})

    def qa_eval_cfg(self) -> str:
        """The eval knobs + the qa prompt: the evaluation asks in the system prompt training used. The
        judge's knobs are qa_judge_cfg's (a threshold change regrades, it does not regenerate)."""
        skip = {"resources", "judge", "judge_threshold"}
        return _json({"eval": {k: v for k, v in self.config["qa"]["eval"].items() if k not in skip},
                      "prompt": self.config["qa"]["prompt"]})

    def qa_eval_targets(self) -> list[str]:
        qa_eval = self.paths.qa_eval
        return [
            f"{qa_eval}/metrics.json",
            f"{qa_eval}/comparison.json",
            f"{qa_eval}/plots/pass_at_k.png",
            f"{qa_eval}/plots/summary.tsv",
            f"{qa_eval}/plots/questions.tsv",
        ]

    def qa_targets(self) -> list[str]:
        return [f"{self.paths.qa}/splits.json", *self.release_targets(), *self.qa_eval_targets()]

    # ------------------------------------------------------------------------- the rule files' names
    def rule_helpers(self) -> dict[str, Any]:
        """The names rules/*.smk and the Snakefile call, bound to this plan: path prefixes, patterns and
        every helper (`judge_needed` is reward.asks_judge for this config)."""
        helpers: dict[str, Any] = {
            "RUN": self.paths.run,
            "LOGS": self.paths.logs,
            "MODELS": self.paths.models,
            "QA": self.paths.qa,
            "QA_EVAL": self.paths.qa_eval,
            "QA_SYNTH": self.paths.qa_synth,
            "EVAL_VARIANT_PATTERN": EVAL_VARIANT_PATTERN,
            "QA_VARIANT_PATTERN": QA_VARIANT_PATTERN,
            "is_model_name": is_model_name,
            "model_dir_of": model_dir_of,
            "input_flag": input_flag,
            "judge_needed": self.judge_planned,
        }
        for name in dir(type(self)):
            attr = getattr(self, name)
            own = ("rule_helpers", "judge_planned", "from_configfiles")
            if not name.startswith("_") and callable(attr) and name not in own:
                helpers[name] = attr
        return helpers
