"""One exception type for every user-facing failure; the CLI turns it into one line and an exit code."""


class LlmrnnError(Exception):
    """A failure the user can act on (bad input, failed check). Message is one line, no traceback."""

    exit_code = 2


class InputError(LlmrnnError):
    """Bad input data: the message names file, record and field."""


class CheckFailed(LlmrnnError):
    """A verification (preflight, merge check, PHI guard) failed; the DAG must stop."""

    exit_code = 3
