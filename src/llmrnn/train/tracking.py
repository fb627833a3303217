"""Experiment trackers of a training run (`train.report_to`): the one place that maps the config to verl's
`trainer.logger` and TRL's `report_to`, and that points each tracker into the run folder.

    train.report_to: none | tensorboard | wandb | mlflow, or a list of them

Where each one writes (RUN/train/ = the rule's work dir; a variable the user exported wins):
- tensorboard: RUN/train/tensorboard/ (verl reads TENSORBOARD_DIR, transformers 5 TENSORBOARD_LOGGING_DIR,
  transformers 4 `logging_dir`); `tensorboard --logdir results/RUN/train/tensorboard`.
- wandb: offline into RUN/train/wandb/ (WANDB_MODE=offline, WANDB_DIR): compute nodes often have no
  internet. Sync it from a login node with `wandb sync results/RUN/train/wandb/offline-run-*`, or export
  WANDB_MODE=online where the nodes reach W&B. WANDB_CONSOLE=off: the run's stdout (which may quote
  patient text) is never copied into the W&B run.
- mlflow: a SQLite store RUN/train/mlflow.db (MLFLOW_TRACKING_URI; verl's own default is one file under
  /tmp shared by every user of the node); `mlflow ui --backend-store-uri sqlite:///results/RUN/train/mlflow.db`.

Secrets (WANDB_API_KEY, MLflow credentials) are read by the trackers from the environment only: no config
key holds one, and nothing here writes the environment anywhere.
"""

from __future__ import annotations

import importlib
import json
import os
import sys
from collections.abc import Mapping
from importlib.machinery import PathFinder
from pathlib import Path
from urllib.parse import urlsplit

from llmrnn.errors import CheckFailed, InputError
from llmrnn.settings.train import Train, trackers

# what verl's Tracking always gets besides the trackers: progress on the console, and the JSONL file that
# llmrnn.train.verl_cmd follows into metrics.jsonl
VERL_BASE_LOGGERS = ["console", "file"]
TENSORBOARD_SUBDIR = "tensorboard"
MLFLOW_DB = "mlflow.db"


def report_to(cfg: Train) -> list[str]:
    """train.report_to as a list of trackers ([] for none; llmrnn.settings.train.trackers)."""
    try:
        return trackers(cfg.report_to)
    except ValueError as exc:  # a model built without validation (model_construct)
        raise InputError(str(exc)) from None


def verl_loggers(cfg: Train) -> list[str]:
    """verl's trainer.logger: console + file (always) and the trackers."""
    return [*VERL_BASE_LOGGERS, *report_to(cfg)]


def tensorboard_dir(work_dir: str | os.PathLike) -> Path:
    return Path(work_dir).resolve() / TENSORBOARD_SUBDIR


def tracking_env(cfg: Train, work_dir: str | os.PathLike, environ: Mapping[str, str] | None = None) -> dict:
    """The environment variables that put the configured trackers into the run folder (absolute paths:
    verl's trainer runs in a Ray actor). Variables already in `environ` are kept (the user's choice)."""
    environ = os.environ if environ is None else environ
    work = Path(work_dir).resolve()
    trackers = report_to(cfg)
    want: dict[str, str] = {}
    if "tensorboard" in trackers:
        tb = str(tensorboard_dir(work))
        want.update(TENSORBOARD_DIR=tb, TENSORBOARD_LOGGING_DIR=tb)
    if "wandb" in trackers:
        want.update(WANDB_MODE="offline", WANDB_DIR=str(work), WANDB_CONSOLE="off",
                    WANDB_PROJECT=cfg.project_name)
    if "mlflow" in trackers:
        want.update(MLFLOW_TRACKING_URI=f"sqlite:///{work / MLFLOW_DB}",
                    MLFLOW_EXPERIMENT_NAME=cfg.project_name)
    return {k: v for k, v in want.items() if not environ.get(k)}


# What tracking_env may set: the variables verl's Ray workers need too (verl_overrides.runtime_env_overrides puts
# them into the job's runtime_env, which reaches workers on every node). Paths, modes and names only: a
# secret (WANDB_API_KEY, MLFLOW_TRACKING_PASSWORD/TOKEN...) is never one of them.
FORWARDED_ENV = ("TENSORBOARD_DIR", "TENSORBOARD_LOGGING_DIR", "WANDB_MODE", "WANDB_DIR", "WANDB_CONSOLE",
                 "WANDB_PROJECT", "MLFLOW_TRACKING_URI", "MLFLOW_EXPERIMENT_NAME")


def forwardable(name: str, value: str) -> bool:
    """Whether a tracker variable may travel on verl's command line (visible in `ps`): one of FORWARDED_ENV, and
    no URI that may carry a credential: a user:password@ part, or a query or fragment (`?token=...`,
    `#access_token=...`); such a MLFLOW_TRACKING_URI stays in the environment, which main_ppo inherits."""
    if name not in FORWARDED_ENV or not value:
        return False
    if not name.endswith("_URI"):
        return True
    try:
        parts = urlsplit(value)
    except ValueError:  # not a URL we can read: keep it off the command line
        return False
    return not ("@" in parts.netloc or parts.query or parts.fragment or "?" in value or "#" in value)


def tracker_problems(cfg: Train, cwd: str | os.PathLike | None = None) -> list[str]:
    """One line per train.report_to tracker not importable as itself in a training process started in `cwd`
    (default: here): transformers' callback (TRL) or verl's Tracking (in main_ppo) would fail at training start.
    `llmrnn check` lists them; the training job refuses the first (require_trackers)."""
    here = Path.cwd() if cwd is None else Path(cwd)
    out = []
    for tracker in report_to(cfg):
        module, api = TRACKER_API.get(tracker, (tracker, None))
        if problem := tracker_import_problem(tracker, module, api, here):
            out.append(f"train.report_to: {tracker}{problem}")
    return out


def require_trackers(cfg: Train, cwd: str | os.PathLike | None = None) -> None:
    """Every train.report_to tracker importable as itself in this process, or one line (CheckFailed) before the
    model loads: `llmrnn check` says the same where it runs; this is the guard of the environment that trains
    (another venv, a conda env, an image)."""
    if problems := tracker_problems(cfg, cwd):
        raise CheckFailed(problems[0])


def prepare(cfg: Train, work_dir: str | os.PathLike) -> dict:
    """Set tracking_env in this process (TRL trains here; verl's main_ppo inherits it) and make the folders
    the trackers expect; returns what was set. Both engines import the trackers in this Python (TRL in this
    process, verl in main_ppo, which verl_cmd starts with sys.executable from this working directory), so
    require_trackers comes first: a missing tracker is one line, not a traceback once the model is loaded."""
    require_trackers(cfg)
    env = tracking_env(cfg, work_dir)
    os.environ.update(env)
    for key in ("TENSORBOARD_DIR", "WANDB_DIR"):
        if key in env:
            Path(env[key]).mkdir(parents=True, exist_ok=True)
    return env


def config_callback(config: Mapping, trackers: list[str]):
    """A TRL/transformers callback that attaches llmrnn's effective training config (the config sections
    the trainer got) to each tracker when training starts, beside the GRPOConfig that transformers attaches
    itself: TensorBoard text `llmrnn/config`, W&B run config key `llmrnn`, MLflow artifact llmrnn_config.json."""
    from transformers import TrainerCallback

    text = json.dumps(config, indent=1, sort_keys=True, default=str)

    class AttachConfig(TrainerCallback):
        def on_train_begin(self, args, state, control, **kwargs):
            if not state.is_world_process_zero:
                return
            if "tensorboard" in trackers:
                from torch.utils.tensorboard import SummaryWriter

                logdir = os.environ.get("TENSORBOARD_LOGGING_DIR") or getattr(args, "logging_dir", None)
                if logdir:
                    with SummaryWriter(log_dir=logdir) as writer:
                        writer.add_text("llmrnn/config", f"```\n{text}\n```")
            if "wandb" in trackers:
                import wandb

                if wandb.run is not None:
                    wandb.run.config.update({"llmrnn": json.loads(text)}, allow_val_change=True)
            if "mlflow" in trackers:
                import mlflow

                if mlflow.active_run() is not None:
                    mlflow.log_dict(json.loads(text), "llmrnn_config.json")

    return AttachConfig()


# the module each train.report_to tracker needs in the training environment, and what of it the trainers call:
# a folder or file of that name without it is not the tracker (torch's SummaryWriter, which verl and
# transformers log to TensorBoard with, refuses a tensorboard without __version__)
TRACKER_API = {"tensorboard": ("tensorboard", "__version__"), "wandb": ("wandb", "init"),
               "mlflow": ("mlflow", "start_run")}


def tracker_import_problem(tracker: str, module: str, api: str | None, cwd: Path) -> str | None:
    """Why `import <module>` in a training process would not give the tracker, or None. Such a process looks in
    its working directory first (verl's Ray workers put the driver's there; `python -c` does), so a file or a
    package there shadows the installed one, and a folder there without __init__.py (W&B writes ./wandb/
    where a run starts) is what `import` returns when the tracker is not installed. The package found
    elsewhere is imported and must have the API we call."""
    here = cwd.resolve()
    rest = [p for p in sys.path if Path(p or os.curdir).resolve() != here]
    spec = PathFinder.find_spec(module, [str(here), *rest])
    if spec is None:
        return (f" is not installed in this environment (pip install {module}); training would fail at its "
                "start: install it or drop it from train.report_to")
    if spec.origin in (None, "namespace"):  # folders named like it, no package
        folders = ", ".join(spec.submodule_search_locations or [])
        return (f" is not installed in this environment, and `import {module}` finds the folder {folders} "
                f"instead (no __init__.py, no {module}.{api}), so training would fail at its start: "
                f"pip install {module}, and move that folder away")
    found = Path(spec.origin)
    top = found.parent if found.name == "__init__.py" else found
    if top.parent == here:
        installed = PathFinder.find_spec(module, rest)
        behind = f"the installed {installed.origin}" if installed and installed.origin else "the package"
        return (f": {top} in the working directory shadows {behind} (a training process imports from there "
                "first): move it away or run from another folder")
    try:
        loaded = importlib.import_module(module)
    except Exception as exc:  # noqa: BLE001 - any failure of the import is the finding
        return f": `import {module}` ({spec.origin}) fails: {type(exc).__name__}: {exc}"[:400]
    if getattr(loaded, "__file__", None) is None or (api and not hasattr(loaded, api)):
        return (f": {getattr(loaded, '__file__', None) or spec.origin} has no {module}.{api} (not the {tracker} "
                f"package, or a broken install): reinstall {module}")
    return None
