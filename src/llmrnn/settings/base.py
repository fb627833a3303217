"""The base of every config section model: unknown keys refused, strict types (below), Python's re for
patterns (the credential guards use look-aheads), the reader of a section's defaults, and the one model of
a job's resources that every stage's `resources` section is made from (`job_resources`)."""

from __future__ import annotations

import sys
import types
import typing
from typing import Any, Literal, TypeVar

from pydantic import (
    BaseModel,
    ConfigDict,
    Field,
    ValidationError,
    ValidationInfo,
    create_model,
    field_validator,
)
from pydantic.fields import FieldInfo
from pydantic_core import PydanticCustomError

from llmrnn.errors import InputError

M = TypeVar("M", bound=BaseModel)

# a NAME of an environment variable, never a value that looks like a key (constants.CREDENTIAL's prefixes)
ENV_NAME = r"^(?!(hf_|sk-|sk_|ghp_|gho_|ghs_|github_pat_|glpat-|AKIA|AIza|eyJ)[A-Za-z0-9_-]{12,})[A-Za-z_][A-Za-z0-9_]*$"
# a path component: starts with a letter or digit (so never '.', '..' or an option-like '-x')
NAME = r"^[A-Za-z0-9][A-Za-z0-9._-]*$"


class Section(BaseModel):
    """One mapping of the config: every key typed, with its default, bounds and one line of help."""

    # strict: a value of another JSON type is refused, never converted. Lax pydantic reads `true` as 1,
    # `2.0` as 2 and `"5"` as 5 for an int (and `1` as true for a bool), so `max_patients: true` built a
    # one-patient cohort and `icd_version: 9.0` kept nobody; an int is still a float (JSON has one number).
    model_config = ConfigDict(extra="forbid", regex_engine="python-re", validate_default=False, strict=True)

    @field_validator("*", mode="before")
    @classmethod
    def _literal_types(cls, value: Any, info: ValidationInfo) -> Any:
        """A Literal's values by type as well: pydantic matches them by equality even when strict, so
        `icd_version: 9.0` passed as 9 and `cpu_bf16: 1` as true."""
        field = cls.model_fields.get(info.field_name or "")
        choices = _literal_values(field.annotation) if field is not None else ()
        if (isinstance(value, (bool, int, float)) and value in choices
                and not any(type(c) is type(value) and c == value for c in choices)):
            raise PydanticCustomError("literal_error", "Input should be {expected}",
                                      {"expected": " or ".join(repr(c) for c in choices)})
        return value


def _literal_values(tp: Any) -> tuple:
    """Every value of the Literals in an annotation (through Optional/Union), () when it has none."""
    if typing.get_origin(tp) is Literal:
        return typing.get_args(tp)
    if typing.get_origin(tp) in (typing.Union, types.UnionType):
        return tuple(v for arg in typing.get_args(tp) for v in _literal_values(arg))
    return ()


def parse(model: type[M], data: Any, where: str) -> M:
    """`data` validated by `model` (a section's settings as the code receives them), or an InputError whose
    one line names the first bad key by its dotted path under `where`."""
    try:
        return model.model_validate(data)
    except ValidationError as exc:
        err = exc.errors()[0]
        if err["type"] == "value_error":  # a model validator's rule: its own line, naming its keys
            raise InputError(str(err["ctx"]["error"])) from None
        key = ".".join([where, *(str(part) for part in err["loc"])])
        raise InputError(f"{key}: {err['msg']} (got {err.get('input')!r})") from None


def defaults(model: type[BaseModel]) -> dict[str, Any]:
    """The defaults of a section as plain data (a fresh copy each call): what Snakemake fills in."""
    return model().model_dump(mode="json")


class Resources(Section):
    """What a stage's job asks the scheduler for (rules' `resources:`, llmrnn.plan.common.stage_resources):
    every stage's `resources` section has these fields, with its own defaults (`job_resources`)."""

    mem_mb: int = Field(8000, le=16 * 1024 * 1024, ge=1, description="memory of the job (MB)")
    runtime: int = Field(120, le=366 * 24 * 60, ge=1, description="time limit of the job (minutes)")
    cpus_per_task: int = Field(2, le=4096, ge=1, description="CPU cores of the job")


class GpuCount(Section):
    """The GPUs of a job, where its stage's config sets them (the judge's come from its rubric)."""

    gpu: int = Field(0, le=64, ge=0, description="GPUs of the job")


class GpuResources(Resources, GpuCount):
    """Resources of a job whose GPUs its stage's config sets. GpuCount is the last base so that `gpu` is the
    first key (pydantic orders fields from the last base up), where the schema and docs have always had it."""


def job_resources(model_name: str, section: str, job: str, *, base: type[Resources] = GpuResources,
                  help: dict[str, str] | None = None, **defaults: int | None) -> type[Resources]:
    """The `resources` model of one stage: `base`'s fields (their types and bounds defined once, above) with
    this stage's `defaults` and help naming its `job` ("memory of each eval_shard job (MB)"; `help` replaces
    a field's whole line). A default of None makes the field nullable (train.resources.gpu: the engine
    decides)."""
    unknown = set(defaults) - set(base.model_fields) or set(help or {}) - set(base.model_fields)
    if unknown:
        raise TypeError(f"{section}: {base.__name__} has no field {sorted(unknown)}")
    fields: dict[str, Any] = {}
    for name, info in base.model_fields.items():
        default = defaults.get(name, info.default)
        annotation = info.annotation if default is not None else info.annotation | None
        description = (help or {}).get(name) or info.description.replace("the job", job)
        fields[name] = (annotation, FieldInfo.merge_field_infos(info, default=default, description=description))
    # the module that names the model (as pydantic's create_model does by default), so an instance pickles
    caller = sys._getframe(1).f_globals["__name__"]
    return create_model(model_name, __base__=base, __doc__=f"`{section}`", __module__=caller, **fields)
