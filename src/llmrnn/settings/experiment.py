"""The `experiment` section: named variants of one config (each a mapping of overrides of the ordinary
settings) and the training seeds that multiply them, run as one DAG that shares what the variants share
(llmrnn.plan.experiment) and compared with paired tests (`llmrnn evaluate compare`). No section: one run."""

from __future__ import annotations

from typing import Any

from pydantic import Field, model_validator

from llmrnn.settings.base import NAME, Section

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
