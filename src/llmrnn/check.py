"""Stage `check` (not implemented yet: filled in by its issue)."""


def register(sub) -> None:  # noqa: ARG001 - the stage adds its subcommands here
    return None
