"""When a training job must stop early and continue later: SLURM's warning signal, preemption or its time
limit near.

`StopRequest.watch()` installs a handler for SIGUSR1 (what `sbatch --signal=USR1@S` or `scancel --signal=USR1`
sends) and SIGTERM (what SLURM sends a preempted or cancelled job, GraceTime seconds before SIGKILL) and,
inside a SLURM job, reads the job's end time once (squeue); `requested()` is then true from the signal on,
or from LLMRNN_STOP_MARGIN_S seconds before the end (`stop_deadline`). TRL asks at each step boundary,
saves a checkpoint there and exits with llmrnn.errors.Interrupted (75); the rerun resumes from that
checkpoint. verl cannot be asked (llmrnn.train.verl_cmd: its own time-limit save, then a stop at the deadline).
"""

from __future__ import annotations

import logging
import os
import shutil
import signal
import subprocess
import time
from datetime import datetime
from pathlib import Path

from llmrnn import io
from llmrnn.errors import CheckFailed, InputError, Interrupted
from llmrnn.judge.client import JudgeUnavailable
from llmrnn.settings.train import Train
from llmrnn.train.checkpoints import disk_full_problem
from llmrnn.train.metrics import learning_problem

log = logging.getLogger(__name__)

STOP_SIGNALS = (signal.SIGUSR1, signal.SIGTERM)
MARGIN_ENV = "LLMRNN_STOP_MARGIN_S"  # seconds before the SLURM time limit to stop at; default DEFAULT_MARGIN_S
DEFAULT_MARGIN_S = 600


def parse_end_time(text: str) -> float | None:
    """squeue's %e (the job's end time, local time, e.g. 2026-11-27T22:00:00) as epoch seconds; None for
    no limit (Unknown, N/A, empty)."""
    text = text.strip()
    try:
        return datetime.strptime(text, "%Y-%m-%dT%H:%M:%S").timestamp()
    except ValueError:
        return None


def slurm_end_time(env: dict | None = None) -> float | None:
    """The end time of the SLURM job this process runs in (None outside SLURM or where squeue fails)."""
    env = os.environ if env is None else env
    job = env.get("SLURM_JOB_ID")
    if not job or not shutil.which("squeue"):
        return None
    try:
        out = subprocess.run(["squeue", "-h", "-j", job, "-o", "%e"], capture_output=True, text=True,
                             timeout=30, check=False).stdout
    except (OSError, subprocess.TimeoutExpired):
        return None
    return parse_end_time(out.splitlines()[0] if out.strip() else "")


def env_seconds(name: str, default: float, env: dict | None = None) -> float:
    """A number of seconds from the environment (default when unset or empty); anything else is one line."""
    text = ((os.environ if env is None else env).get(name) or "").strip()
    if not text:
        return float(default)
    try:
        value = float(text)
    except ValueError:
        value = -1.0
    if not 0 <= value < float("inf"):
        raise InputError(f"{name}={text!r}: not a number of seconds (>= 0)")
    return value


def stop_deadline(env: dict | None = None) -> float | None:
    """When to stop (epoch seconds): the SLURM job's end time less LLMRNN_STOP_MARGIN_S; None outside SLURM."""
    margin = env_seconds(MARGIN_ENV, DEFAULT_MARGIN_S, env)
    end = slurm_end_time(env)
    if end is None:
        return None
    log.info("SLURM time limit at %s: stopping at the first step boundary after %s",
             datetime.fromtimestamp(end).isoformat(timespec="seconds"),
             datetime.fromtimestamp(end - margin).isoformat(timespec="seconds"))
    return end - margin


class StopRequest:
    """A stop asked by signal or by the clock (see the module docstring)."""

    def __init__(self, deadline: float | None = None):
        self.deadline = deadline
        self.reason: str | None = None
        self._previous: dict = {}

    def _on_signal(self, signum, frame) -> None:
        self.reason = f"signal {signal.Signals(signum).name}"
        log.warning("%s: saving a checkpoint at the next step boundary, then stopping", self.reason)

    def watch(self) -> StopRequest:
        """Install the signal handlers (main thread only) and read the SLURM time limit."""
        for sig in STOP_SIGNALS:
            self._previous[sig] = signal.signal(sig, self._on_signal)
        if self.deadline is None:
            self.deadline = stop_deadline()
        return self

    def release(self) -> None:
        """Put back the handlers watch() replaced (training is over: a signal acts as it did before)."""
        for sig, handler in self._previous.items():
            signal.signal(sig, handler)
        self._previous = {}

    def __enter__(self):
        return self

    def __exit__(self, *exc) -> None:
        self.release()

    def requested(self) -> bool:
        if self.reason is None and self.deadline is not None and time.time() >= self.deadline:
            self.reason = "the SLURM time limit is near"
        return self.reason is not None


# ----------------------------------------------------------------------------- the TRL engine's side
def stop_callback(stop, holder: dict, updates_per_step: int):
    """On a stop request (llmrnn.train.stop: SIGUSR1, the SLURM time limit near) save a checkpoint at the
    next rollout-step boundary and end training there; holder["interrupted"] keeps the step. Runs before
    eval_at_save, so best_val validates that checkpoint too."""
    from transformers import TrainerCallback

    class StopOnRequest(TrainerCallback):
        def on_step_end(self, args, state, control, **kw):
            if state.global_step % updates_per_step == 0 and stop.requested():
                control.should_save = True
                control.should_training_stop = True
                holder["interrupted"] = (state.global_step, stop.reason)

    return StopOnRequest()


def run_trainer(trainer, resume: Path | None, ckpt_dir: Path, stop: StopRequest, holder: dict, upd: int) -> None:
    """trainer.train() from `resume`: a full disk is one line; a judge lost during a stop request (a
    preemption signals the judge too) saves the last step boundary (save_before_the_lost_step)."""
    try:
        trainer.train(resume_from_checkpoint=str(resume) if resume else None)
    except (RuntimeError, OSError) as exc:
        if problem := disk_full_problem(exc, ckpt_dir):
            raise CheckFailed(problem) from None
        raise
    except JudgeUnavailable:
        if not save_before_the_lost_step(trainer, stop, holder, upd):
            raise


def save_before_the_lost_step(trainer, stop, holder: dict, updates_per_step: int) -> bool:
    """The judge went down during a stop request: SLURM signals every process of a preempted job, the judge
    server in its group too, so the rollout step in flight cannot be scored. TRL scores a step's rollouts
    before any of its updates, so the weights, optimizer and data position are still those of the last
    step boundary: save them there as a complete checkpoint (HF's own save) and stop as on a stop request
    (Interrupted, exit 75). False (nothing saved: the caller re-raises) without a stop request, at step 0,
    or off a boundary."""
    step = int(trainer.state.global_step)
    if not stop.requested() or step == 0 or step % updates_per_step:
        return False
    trainer._save_checkpoint(trainer.model, trial=None)  # what TRL's own should_save runs
    why = f"{stop.reason} (the judge went down with the job; step {step // updates_per_step + 1} was not trained"
    holder["interrupted"] = (step, why + " and is redone)")
    return True


def raise_if_interrupted(holder: dict, reached: int, max_steps: int, updates_per_step: int) -> None:
    """After trainer.train(): a run stopped on request (stop_callback) ends with Interrupted (exit 75)."""
    if reached < max_steps and holder.get("interrupted"):
        step, why = holder["interrupted"]
        raise Interrupted(f"train: stopped at step {step // updates_per_step} of {max_steps // updates_per_step} "
                          f"on {why}; checkpoint-{step} saved, a rerun continues from it")


def check_finished(cfg: Train, holder: dict, reached: int, max_steps: int, upd: int, live_metrics: Path) -> None:
    """A run that ends here is complete and learned: a stop before the time limit is Interrupted (exit 75,
    continue); fewer steps than planned (but an early stop), never-finite rewards or a gradient that was 0
    at every step are CheckFailed, so nothing downstream takes the run as done."""
    raise_if_interrupted(holder, reached, max_steps, upd)
    if reached != max_steps and holder.get("early_stopped") != reached:
        raise CheckFailed(f"train: GRPO stopped at step {reached} of {max_steps} planned; the run is not complete")
    problem = learning_problem(io.read_jsonl(live_metrics) if live_metrics.exists() else [],
                               zero_gradient=cfg.fail_on_zero_gradient)
    if problem:
        raise CheckFailed(problem)
