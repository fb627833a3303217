"""One exception type for every user-facing failure; the CLI turns it into one line and an exit code."""


def doc_summary(doc: str | None) -> str:
    """A module docstring's first paragraph on one line: a command's --help description (its first line
    alone ended mid-sentence)."""
    return " ".join((doc or "").strip().split("\n\n")[0].split())


class LlmrnnError(Exception):
    """A failure the user can act on (bad input, failed check). Message is one line, no traceback."""

    exit_code = 2


class InputError(LlmrnnError):
    """Bad input data: the message names file, record and field."""


class CheckFailed(LlmrnnError):
    """A verification (preflight, merge check, PHI guard) failed; the DAG must stop."""

    exit_code = 3


class NotRetriable(InputError):
    """Bad input no retry can change (a package missing from the job's environment): exit status 78
    (EX_CONFIG). The CLI leaves its line in $LLMRNN_NOT_RETRIABLE_DIR (the workflow sets it), and the
    resources of every rule's next attempt (llmrnn.plan.common.grows) refuse to start it: profiles'
    `retries:` would otherwise queue the same job again for the same GPUs, to fail the same way."""

    exit_code = 78


NOT_RETRIABLE_DIR = "LLMRNN_NOT_RETRIABLE_DIR"


class Interrupted(LlmrnnError):
    """The job stopped on request (SLURM's warning signal, its time limit near) after saving its work: a
    rerun continues from it. Exit status 75 (EX_TEMPFAIL, "try again"): Snakemake's retries (profiles)
    rerun it, and so does the user's next `snakemake` (docs/cluster.md "Long runs")."""

    exit_code = 75
