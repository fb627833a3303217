"""What `llmrnn check` could not check here (a model folder not downloaded yet, no sinfo, a GPU package not
installed on this login node): each check says it with `skip`, and the OK line lists it as skipped instead of
checked; a check with nothing to check in this config (no own reward, no judge, no upload) says it with `unused`
and is listed as not needed."""

from __future__ import annotations

SKIPPED: list[tuple[str, str]] = []  # (check name, why), filled while run_checks runs
_current = [""]


def skip(why: str) -> None:
    """The running check could not check `why` (one short phrase: what, and why not)."""
    SKIPPED.append((_current[0], why))


def unused(why: str) -> None:
    """The running check had nothing to check: this config does not use what it checks (`why`, one short
    phrase). The OK line names it as not needed, never as checked."""
    SKIPPED.append((_current[0], f"{UNUSED}{why}"))


UNUSED = "unused:"


def start(name: str) -> None:
    _current[0] = name


def reset() -> None:
    SKIPPED.clear()
    _current[0] = ""
