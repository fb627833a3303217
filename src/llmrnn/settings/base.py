"""The base of every config section model: unknown keys refused, Python's re for patterns (the credential
guards use look-aheads), and the reader of a section's defaults."""

from __future__ import annotations

from typing import Any, TypeVar

from pydantic import BaseModel, ConfigDict, ValidationError

from llmrnn.errors import InputError

M = TypeVar("M", bound=BaseModel)

# a NAME of an environment variable, never a value that looks like a key (constants.CREDENTIAL's prefixes)
ENV_NAME = r"^(?!(hf_|sk-|sk_|ghp_|gho_|ghs_|github_pat_|glpat-|AKIA|AIza|eyJ)[A-Za-z0-9_-]{12,})[A-Za-z_][A-Za-z0-9_]*$"
# a path component: starts with a letter or digit (so never '.', '..' or an option-like '-x')
NAME = r"^[A-Za-z0-9][A-Za-z0-9._-]*$"


class Section(BaseModel):
    """One mapping of the config: every key typed, with its default, bounds and one line of help."""

    model_config = ConfigDict(extra="forbid", regex_engine="python-re", validate_default=False)


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
