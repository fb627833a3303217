"""`llmrnn <stage> ...`: the one entry point every Snakemake rule calls.

Stage modules register their own subcommands and keep heavy imports (torch, transformers) inside
functions, so `llmrnn --help` and light stages start fast.
"""

from __future__ import annotations

import argparse
import errno
import importlib
import json
import logging
import os
import stat
import sys

from llmrnn import __version__
from llmrnn.errors import NOT_RETRIABLE_DIR, InputError, LlmrnnError, NotRetriable

# `llmrnn <stage>` is served by the module llmrnn.<stage> (MODULE_OF names the exceptions), which exposes
# `register(subparsers)`; its subcommands set `func` (args -> int | None). A command imports only its own
# stage module, so the code a job runs is that module's import closure (llmrnn.provenance hashes it for the
# rules' `code` params).
STAGES = ("cohort", "models", "trajectories", "judge", "preflight", "train", "merge", "release", "evaluate",
          "report", "check", "config", "gpus", "qa", "chat", "reward", "plan")
MODULE_OF = {"config": "llmrnn.runconfig"}


def stage_module(stage: str) -> str:
    """The module that registers `llmrnn <stage>`."""
    if stage not in STAGES:
        raise ValueError(f"no llmrnn stage {stage!r}; stages: {', '.join(STAGES)}")
    return MODULE_OF.get(stage, f"llmrnn.{stage}")


def json_arg(text: str) -> dict:
    """Parse a `--cfg` argument: the JSON config subset a rule passes in its params."""
    try:
        value = json.loads(text)
    except json.JSONDecodeError as exc:
        raise argparse.ArgumentTypeError(f"--cfg is not JSON: {exc}") from exc
    if not isinstance(value, dict):
        raise argparse.ArgumentTypeError("--cfg must be a JSON object")
    # lazy: configcheck loads llmrnn.settings (pydantic, +125 ms): `llmrnn gpus --help` 35 -> 180 ms
    from llmrnn.configcheck import value_problems

    if problems := value_problems(value, secrets=False):  # NaN/Infinity, whoever built the JSON
        raise InputError(f"--cfg: config: {problems[0]}")
    return value


def build_parser(stages: tuple[str, ...] = STAGES) -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="llmrnn", formatter_class=argparse.RawDescriptionHelpFormatter,
        description="Train, merge, evaluate and publish an LLM-as-RNN memory head with GRPO. Commands you run: "
                    f"{', '.join(USER_COMMANDS)}; the workflow's stages (its rules run them, `snakemake` runs the "
                    "rules): the others; [internal]: called by other commands.")
    parser.add_argument("-v", "--verbose", action="store_true", help="debug logging")
    parser.add_argument("--version", action="version", version=f"llmrnn {__version__}")
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")
    for stage in stages:
        importlib.import_module(stage_module(stage)).register(sub)
    _group_help(sub)
    return parser


# what a person runs (the rest is the workflow's: its rules call them), and what other commands call
USER_COMMANDS = ("check", "config", "reward", "report", "chat")
INTERNAL = {("gpus",), ("judge", "serve"), ("judge", "wait"), ("train", "ray-cluster"), ("train", "verl-cmd")}


def _group_help(sub: argparse._SubParsersAction, path: tuple[str, ...] = ()) -> None:
    """--help lists the commands a person runs first, the workflow's stages next, internal ones marked last."""
    def rank(action) -> int:
        name = (*path, action.dest)
        if name in INTERNAL:
            return len(USER_COMMANDS) + 1
        return USER_COMMANDS.index(action.dest) if not path and action.dest in USER_COMMANDS else len(USER_COMMANDS)

    for action in sub._choices_actions:
        if (*path, action.dest) in INTERNAL and not str(action.help or "").startswith("[internal]"):
            action.help = f"[internal] {action.help or ''}".strip()
    sub._choices_actions.sort(key=rank)
    for name, child in sub.choices.items():
        for act in child._actions:
            if isinstance(act, argparse._SubParsersAction):
                _group_help(act, (*path, name))


THREAD_ENV_VARS = ("OMP_NUM_THREADS", "MKL_NUM_THREADS", "OPENBLAS_NUM_THREADS", "GOTO_NUM_THREADS",
                   "VECLIB_MAXIMUM_THREADS", "NUMEXPR_NUM_THREADS")


def sanitize_thread_env() -> None:
    """Snakemake exports OMP_NUM_THREADS=<threads> to every job; a job scheduled with `threads: 0` (the
    judge service and preflight, so they do not take the cores of the trainer in their group) would
    hand libgomp a 0, which it rejects. Run such jobs single-threaded instead; before torch is imported."""
    for var in THREAD_ENV_VARS:
        if os.environ.get(var, "1").strip() in ("0", ""):
            os.environ[var] = "1"


# Stages whose logs can hold patient text (prompts, generations, refusals naming a file of the bundle).
PATIENT_TEXT_COMMANDS = {"cohort", "trajectories", "judge", "preflight", "train", "merge", "release", "evaluate",
                         "report", "qa", "reward"}


def private_log_files() -> None:
    """A rule's `2> {log}` file is created by the shell with the umask (usually world-readable); a stage
    that touches patient text makes the log (and a redirected stdout) it writes to owner-only, 0600."""
    for fd in (1, 2):
        try:
            st = os.fstat(fd)
            if stat.S_ISREG(st.st_mode) and st.st_uid == os.getuid() and st.st_mode & 0o077:
                os.fchmod(fd, 0o600)
        except OSError:
            continue


def main(argv: list[str] | None = None) -> int:
    sanitize_thread_env()
    command = next((a for a in (sys.argv[1:] if argv is None else argv) if not a.startswith("-")), None)
    if command in PATIENT_TEXT_COMMANDS:  # before parsing: a usage error may quote an argument
        private_log_files()
    # a known stage loads its module alone; anything else (--help, a typo) gets the parser of all stages
    parser = build_parser((command,) if command in STAGES else STAGES)
    try:
        args = parser.parse_args(argv)
    except LlmrnnError as exc:  # raised by an argument's type, e.g. json_arg
        print(f"llmrnn {command}: error: {exc}", file=sys.stderr)
        return exc.exit_code
    logging.basicConfig(
        level=logging.DEBUG if args.verbose else logging.INFO,
        format="%(asctime)s %(levelname)s %(name)s: %(message)s",
        stream=sys.stderr,
    )
    try:
        rc = args.func(args)
        sys.stdout.flush()  # here, not at exit: a full disk under `> file` is this command's one line
    except LlmrnnError as exc:
        return report_error(args.command, exc)
    except KeyboardInterrupt:
        print(f"llmrnn {args.command}: interrupted", file=sys.stderr)
        return 130
    except OSError as exc:
        if exc.errno not in (errno.ENOSPC, errno.EDQUOT, errno.EPIPE):
            raise
        _silence_stdout()
        what = "the reader went away" if exc.errno == errno.EPIPE else "no space left on the device"
        print(f"llmrnn {args.command}: error: cannot write {exc.filename or 'the output'}: {what}", file=sys.stderr)
        return 1
    return int(rc or 0)


def report_error(command: str, exc: LlmrnnError) -> int:
    """A failure the user can act on: its one line, and its exit status (a NotRetriable one's line is left
    for the workflow's retry logic too)."""
    print(f"llmrnn {command}: error: {exc}", file=sys.stderr)
    if isinstance(exc, NotRetriable):
        _record_not_retriable(f"llmrnn {command}: {exc}")
    return exc.exit_code


def _record_not_retriable(line: str) -> None:
    """Leave a NotRetriable failure's line where the workflow's retry logic looks (llmrnn.plan.common.grows)."""
    folder = os.environ.get(NOT_RETRIABLE_DIR)
    if not folder:
        return
    try:
        os.makedirs(folder, exist_ok=True)
        with open(os.path.join(folder, f"{os.getpid()}.txt"), "w") as fh:
            fh.write(line + "\n")
    except OSError:
        pass  # the job's own line and exit status still say it


def _silence_stdout() -> None:
    """After a failed write to stdout: drop what is still buffered (the interpreter's flush at exit would
    fail again, with a traceback-like 'Exception ignored' message)."""
    try:
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, sys.stdout.fileno())
        os.close(devnull)
    except (OSError, ValueError):
        pass


if __name__ == "__main__":
    sys.exit(main())
