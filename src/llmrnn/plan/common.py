"""What every stage's plan shares: the run's path prefixes, the params JSON of a config subset (`to_json`,
`knobs`), the small params and resources functions, and `PlanBase` (the config and its paths)."""

from __future__ import annotations

import json
import os
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from llmrnn.errors import NOT_RETRIABLE_DIR, NotRetriable
from llmrnn.models import MODELS_ROOT, READY
from llmrnn.runconfig import diff_lines, load_any, resolve

NOT_A_KNOB = ("resources", "threads")


@dataclass(frozen=True)
class GrpoOutputs:
    """What the GRPO rule of either recipe writes; merge_model, release and the eval of the trained model read
    them (by these paths, as the rule that writes them is the recipe's)."""

    adapter: str
    metrics: str
    summary: str


@dataclass(frozen=True)
class TrainPlots:
    """The training plots of the memory head's GRPO run (train_plots, rules/report.smk); `all` requests them
    (MemoryHeadRecipe.products)."""

    reward: str
    kl: str
    truncation: str


@dataclass(frozen=True)
class Paths:
    """Every path prefix of a run, built here only (rules use RUN, LOGS, SHARED_LOGS, MODELS, QA, QA_EVAL,
    QA_SYNTH)."""

    run: str
    logs: str
    models: str = str(MODELS_ROOT)
    qa_synth: str = "resources/qa"
    # the logs of jobs whose outputs every run shares (under resources/: the synthetic cohort, models, QA
    # questions), so not under one run's logs
    shared_logs: str = "logs"
    # an experiment's variant (llmrnn.plan, ExperimentPlan): the folder of each stage its variants may share,
    # keyed by the settings the stage reads; a stage not named here (and every stage of one run) is under `run`
    stage_roots: Mapping[str, str] = field(default_factory=dict)

    @classmethod
    def of(cls, run_name: str) -> Paths:
        return cls(run=f"results/{run_name}", logs=f"logs/{run_name}")

    def root(self, stage: str) -> str:
        """The folder a stage writes under (its cohort/, splits/, trajectories/, ... as in one run's folder)."""
        return self.stage_roots.get(stage, self.run)

    @property
    def cohort(self) -> str:
        """The cohort and its splits (rules/cohort.smk)."""
        return self.root("cohort")

    @property
    def trajectories(self) -> str:
        return self.root("trajectories")

    @property
    def judge(self) -> str:
        """The judge's endpoint and agreement check (rules/judge.smk, judge_agreement)."""
        return self.root("judge")

    @property
    def untrained_eval(self) -> str:
        """The held-out evaluation of the base model and the baselines (eval_shard, eval_grade)."""
        return self.root("untrained_eval")

    @property
    def grpo(self) -> GrpoOutputs:
        train = f"{self.run}/train"
        return GrpoOutputs(adapter=f"{train}/adapter", metrics=f"{train}/metrics.jsonl", summary=f"{train}/summary.json")

    @property
    def train_plots(self) -> TrainPlots:
        plots = f"{self.run}/train/plots"
        return TrainPlots(reward=f"{plots}/reward.png", kl=f"{plots}/kl.png", truncation=f"{plots}/truncation.png")

    @property
    def judge_agreement_plot(self) -> str:
        """The judge-agreement figure (judge_agreement_plot, rules/report.smk); `all` requests it (products)."""
        return f"{self.judge}/judge/plots/judge_agreement.png"

    @property
    def qa(self) -> str:
        return f"{self.run}/qa"

    @property
    def qa_eval(self) -> str:
        return f"{self.run}/eval"


def to_json(value: Any) -> str:
    """A params value as JSON with sorted keys: the same config gives the same text (no spurious rerun)."""
    return json.dumps(value, sort_keys=True)


def knobs(section: Mapping) -> dict:
    """A config section without its resources/threads: how a job runs, which changes no result."""
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


# Retries (profiles `retries:`): a job killed for memory or time asks for more on its next attempt.
RETRY_GROWTH = 1.5


def schema_error_line(config: Mapping, schema_path: str | os.PathLike) -> str:
    """A config the schema refuses, as one line (Snakemake's `validate` message prints the whole schema, ~1,000
    lines): the first problem's key and jsonschema's message, and how many more `llmrnn check` lists."""
    import jsonschema

    schema = json.loads(Path(schema_path).read_text())
    errors = sorted(jsonschema.validators.validator_for(schema)(schema).iter_errors(config),
                    key=lambda e: [str(p) for p in e.absolute_path])
    if not errors:
        return "config: refused by the schema (llmrnn check --configfile ... says why)"
    first = errors[0]
    where = ".".join(str(p) for p in first.absolute_path) or "(top level)"
    more = f"; {len(errors) - 1} more" if len(errors) > 1 else ""
    return f"config: {where}: {first.message}{more} (llmrnn check --configfile ... lists every problem)"


def config_changes(run_config: str | os.PathLike, layers: list, limit: int = 8) -> list[str]:
    """What Snakemake's rerun reason "Params have changed" means, in config keys: the values that differ
    between the run's recorded RUN/config.yaml and this invocation's layers (llmrnn.runconfig.diff_lines, as
    `llmrnn config diff` prints them), at most `limit` lines and a pointer to the command that prints all."""
    if not Path(run_config).is_file():
        return []
    try:
        old = load_any(run_config)
        config, sources = resolve(layers)
    except Exception:  # noqa: BLE001 - a hint only: the run's own checks report a bad config
        return []
    lines = diff_lines(old, {"config": config, "sources": sources})
    if not lines:
        return []
    files = [str(name) for name, _ in layers]
    every = (f"llmrnn config diff {run_config} {files[0]}" if len(files) == 1
             else f"llmrnn config show --configfile {' '.join(files)}")
    head = (f"config keys changed since {run_config} was written ({len(lines)}; Snakemake's \"Params have changed\" "
            f"reasons are these; all: {every}):")
    return [head, *(f"  {line}" for line in lines[:limit]), *(["  ..."] if len(lines) > limit else [])]


def refuse_not_retriable(folder: str | None = None) -> None:
    """Before a job's next attempt: stop when an earlier attempt failed for a reason no retry changes
    (llmrnn.errors.NotRetriable, exit 78: its line is in $LLMRNN_NOT_RETRIABLE_DIR). Snakemake then stops
    the run with that line instead of queueing the job again (profiles' `retries:`)."""
    folder = folder or os.environ.get(NOT_RETRIABLE_DIR)
    if not folder or not os.path.isdir(folder):
        return
    lines = sorted({p.read_text().strip() for p in Path(folder).glob("*.txt")})
    if lines:
        raise NotRetriable(f"not retried (a retry cannot change it): {lines[0]}")


def grows(base: float, factor: float = RETRY_GROWTH) -> Callable:
    """A resources function: `base` on the first attempt, `base x factor^(attempt-1)` on a retry
    (Snakemake passes `attempt`, 1 on the first run). For mem_mb (an OOM kill) and the runtime of jobs
    that start over (a shard killed at its time limit); never a training job's runtime, which resumes
    from its checkpoint instead (a longer request could outgrow the partition's limit)."""
    base = float(base)

    def value(wildcards, attempt):
        if int(attempt) > 1:
            refuse_not_retriable()
        return round(base * factor ** (max(int(attempt), 1) - 1))

    value.__name__ = f"grows_{int(base)}"
    return value


def stage_resources(resources: Mapping, gpu: Mapping | None = None, *, runtime_grows: bool = True) -> dict:
    """A rule's `resources:` from its stage's config `resources` section, in one call (each stage's plan has
    one method over this: plan.train.resources, plan.merge.resources, ...): the GPU request (`gpu`: its own keys, e.g.
    llmrnn.slurm.gpu_placement's; else resources.gpu as it is), mem_mb that grows on a retry, the runtime
    (growing too, unless the job resumes instead of starting over: see `grows`) and cpus_per_task. In the
    order the rules wrote them, which is the order Snakemake prints them in (tests/snapshots/plan_*.json)."""
    runtime = grows(resources["runtime"]) if runtime_grows else resources["runtime"]
    return {
        **({"gpu": resources["gpu"]} if gpu is None else gpu),
        "mem_mb": grows(resources["mem_mb"]),
        "runtime": runtime,
        "cpus_per_task": resources["cpus_per_task"],
    }


class PlanBase:
    """The config of one run and its paths: what every stage's plan (llmrnn.plan.<stage>), the recipe
    (llmrnn.plan.recipe) and llmrnn.plan.Plan, which composes them, are built over."""

    def __init__(self, config: Mapping):
        self.config = config
        self.paths = Paths.of(config["run_name"])

    def cfg_json(self, *sections: str) -> str:
        """The exact config subset a rule depends on, as JSON; in params it makes Snakemake rerun the
        rule when (and only when) that subset changes."""
        return to_json({s: self.config[s] for s in sections})
