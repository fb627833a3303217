"""The base of every config section model: unknown keys refused, Python's re for patterns (the credential
guards use look-aheads), and the reader of a section's defaults."""

from __future__ import annotations

from typing import Any

from pydantic import BaseModel, ConfigDict

# a NAME of an environment variable, never a value that looks like a key (constants.CREDENTIAL's prefixes)
ENV_NAME = r"^(?!(hf_|sk-|sk_|ghp_|gho_|ghs_|github_pat_|glpat-|AKIA|AIza|eyJ)[A-Za-z0-9_-]{12,})[A-Za-z_][A-Za-z0-9_]*$"
# a path component: starts with a letter or digit (so never '.', '..' or an option-like '-x')
NAME = r"^[A-Za-z0-9][A-Za-z0-9._-]*$"


class Section(BaseModel):
    """One mapping of the config: every key typed, with its default, bounds and one line of help."""

    model_config = ConfigDict(extra="forbid", regex_engine="python-re", validate_default=False)


def defaults(model: type[BaseModel]) -> dict[str, Any]:
    """The defaults of a section as plain data (a fresh copy each call): what Snakemake fills in."""
    return model().model_dump(mode="json")
