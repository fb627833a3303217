"""The base of every config section model: unknown keys refused, strict types (below), Python's re for
patterns (the credential guards use look-aheads), and the reader of a section's defaults."""

from __future__ import annotations

import types
import typing
from typing import Any, Literal, TypeVar

from pydantic import BaseModel, ConfigDict, ValidationError, ValidationInfo, field_validator
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
