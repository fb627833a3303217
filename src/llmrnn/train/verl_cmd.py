"""verl engine: runs `python -m verl.trainer.main_ppo` with the Hydra overrides of llmrnn.train.verl_overrides
and supervises it: resuming from its latest checkpoint, following its metrics into metrics.jsonl, stopping
it at a signal or the SLURM time limit, checking it finished and copying the chosen checkpoint's adapter.
"""

from __future__ import annotations

import logging
import os
import shlex
import signal
import subprocess
import sys
import time
from pathlib import Path

from llmrnn import io
from llmrnn.errors import CheckFailed, Interrupted
from llmrnn.judge.client import Endpoint
from llmrnn.reward import STOP_REASON_FILE, fallback_rate
from llmrnn.reward import reward_kwargs as default_reward_kwargs
from llmrnn.safe_path import safe_path_env
from llmrnn.settings.train import Train
from llmrnn.train import config as tcfg
from llmrnn.train import ray_cluster
from llmrnn.train.checkpoints import choose_checkpoint, discard_stale_checkpoints, run_fingerprint
from llmrnn.train.metrics import (
    STEP_KEYS,
    MetricsWriter,
    learning_problem,
    progress_line,
    step_metrics,
    verl_rows,
)
from llmrnn.train.outputs import finish_metrics
from llmrnn.train.spec import RunSpec
from llmrnn.train.stop import StopRequest
from llmrnn.train.verl_adapter import adapter_from_checkpoint
from llmrnn.train.verl_attention import resolve_attention
from llmrnn.train.verl_overrides import (
    CUSTOM_ENTRY,
    REWARD_NAME,
    build_overrides,
    command,
    deadline_overrides,
    reward_module_path,
    runtime_env_overrides,
)

log = logging.getLogger(__name__)

POLL_S = 10.0


def latest_step(ckpt_dir: Path) -> int:
    marker = ckpt_dir / "latest_checkpointed_iteration.txt"
    if not marker.is_file():
        return 0
    try:
        return int(marker.read_text().strip())
    except ValueError:
        return 0


def count_rows(path: str) -> int:
    import pyarrow.parquet as pq

    return pq.ParquetFile(path).metadata.num_rows


def _follow_metrics(log_path: Path, writer: MetricsWriter, seen: set[int], total: int,
                    rollout_dir: Path | None = None) -> None:
    """Turn new lines of verl's file logger into metrics.jsonl rows (+ rollout dump stats)."""
    if not log_path.exists():
        return
    for item in io.read_jsonl(log_path, skip_bad=True):  # verl is still writing it
        step = int(item.get("step", 0))
        if step in seen:
            continue
        seen.add(step)
        data = dict(item.get("data") or {})
        if rollout_dir is not None:
            data.update(rollout_stats(rollout_dir, step))
        for row in verl_rows(step, data):
            writer.append(row)
            log.info(progress_line(row, total))


def rollout_stats(rollout_dir: Path, step: int) -> dict:
    """reward std and judge fallback rate of one step from verl's rollout dump ({step}.jsonl), and the qa
    recipe's per-step correctness/extraction stats (the same raw keys TRL logs)."""
    path = rollout_dir / f"{step}.jsonl"
    if not path.is_file():
        return {}
    scores, fallbacks, qa = [], [], []
    for item in io.read_jsonl(path, skip_bad=True):
        if isinstance(item.get("score"), (int, float)):
            scores.append(float(item["score"]))
        if isinstance(item.get("parse_fallback"), (int, float, bool)):  # llmrnn.reward numeric_only flags
            fallbacks.append(item)
        if all(isinstance(item.get(k), (int, float, bool)) for k in STEP_KEYS):  # the qa recipe's rows
            qa.append(item)
    out = {k: v for k, v in step_metrics(qa).items() if k != "judge_fallback_rate"}  # qa/correct ...
    if scores:
        mean = sum(scores) / len(scores)
        out["llmrnn/reward_std"] = (sum((s - mean) ** 2 for s in scores) / len(scores)) ** 0.5
    rate = fallback_rate(fallbacks)  # over judged samples only, as preflight and the guard count it
    if rate is not None:
        out["llmrnn/judge_fallback_rate"] = rate
    return out


def run(spec: RunSpec, *, python: str | None = None, verl_version: str | None = None) -> dict:
    """Run main_ppo (resuming from the latest checkpoint), stream its metrics, verify it finished, copy the adapter.

    `spec`'s work_dir holds verl's checkpoints/, rollouts/, audit/ and state/ (live metrics); its outputs
    (adapter_dir, metrics_path) are written once the run is complete. With your own reward (spec.custom)
    verl calls llmrnn.reward.custom_compute_score (the same contract as check, preflight and TRL: a child
    process, a time limit, one conversion) instead of the compute_score of spec.reward_func's module.
    `python`: the interpreter that runs main_ppo (default this one); `verl_version`: the release the
    overrides are built for (default the installed verl's)."""
    cfg, custom, out = spec.cfg, spec.custom, Path(spec.work_dir)
    train_parquet, model_dir, endpoint_file = spec.train_parquet, spec.model_dir, spec.endpoint_file
    reward_kwargs = spec.reward_kwargs
    if reward_kwargs is None:
        reward_kwargs = default_reward_kwargs(None, audit_dir=out / "audit", endpoint_file=endpoint_file)
    ckpt_dir = out / "checkpoints"
    n_rows = count_rows(train_parquet)
    planned = tcfg.planned_steps(cfg, n_rows)
    if planned < 1:
        raise CheckFailed(f"train: {n_rows} train rows make no full batch of {cfg.batch.train} prompts")
    # resume_mode=auto would resume any checkpoint it finds: keep only those of this exact run
    discard_stale_checkpoints(out, run_fingerprint(cfg, train_parquet, model_dir, spec.reward, reward_kwargs))
    start = latest_step(ckpt_dir)
    writer = MetricsWriter(out / "state" / "metrics.jsonl")  # live; copied to metrics.jsonl at the end
    writer.truncate_after(start)
    log.info("verl: %s from step %d of %d", "resuming" if start else "starting", start, planned)
    attention = resolve_attention(cfg.verl.attn_implementation, python or sys.executable)
    log.info("verl: actor attention %s (%s)", attention["ran"], attention["why"])
    overrides = build_overrides(
        cfg,
        train_parquet=train_parquet,
        val_parquet=spec.val_parquet,
        model_dir=model_dir,
        out_dir=spec.work_dir,
        experiment_name=spec.run_name or "llmrnn",
        endpoint_file=endpoint_file,
        verl_version=verl_version,
        # your own reward: verl calls our wrapper (its child process, time limit, one conversion), never the
        # user's file directly; the wrapper reads reward.custom from reward_kwargs' reward_cfg
        # --reward-func names the TRL function; verl calls compute_score of the same module
        reward_path=reward_module_path() if custom else spec.reward_func.verl_path,
        reward_name=CUSTOM_ENTRY if custom else REWARD_NAME,
        attention=attention["ran"],
        reward_kwargs=reward_kwargs,
    )
    file_log = out / "state" / "verl_metrics.jsonl"
    if file_log.exists():  # verl's FileLogger opens it with "wb": keep the previous attempt's lines
        with open(out / "state" / "verl_metrics.previous.jsonl", "ab") as fh:
            fh.write(file_log.read_bytes())
    env = main_ppo_env(file_log)
    overrides += runtime_env_overrides(env)  # every Ray worker, on every node, gets them (and umask 077)
    # CUDA_VISIBLE_DEVICES was narrowed by llmrnn.gpus.assign("train", ...) in the CLI (judge GPUs taken last)
    seen: set[int] = set(range(1, start + 1))
    follow = lambda: _follow_metrics(file_log, writer, seen, planned, out / "rollouts")
    proc = _launch(cfg, overrides, python, env, out, follow, endpoint_file)
    follow()
    if proc.returncode != 0:
        raise CheckFailed(f"train: verl main_ppo exited with {proc.returncode}{_stop_reason(out / 'audit')}; "
                          "rerun resumes from its last checkpoint")
    reached = latest_step(ckpt_dir)
    if reached != planned:
        raise CheckFailed(
            f"train: verl stopped at step {reached} of {planned} planned "
            f"({ckpt_dir}/latest_checkpointed_iteration.txt); the run is not complete"
        )
    metrics_path = Path(spec.metrics_path)
    finish_metrics(out / "state" / "metrics.jsonl", metrics_path)
    # as under TRL: a run whose rewards were never finite, or whose gradient was 0 at every step, learned
    # nothing and is not complete (no adapter is written)
    if problem := learning_problem(io.read_jsonl(metrics_path), zero_gradient=cfg.fail_on_zero_gradient):
        raise CheckFailed(problem)
    chosen = choose_verl_checkpoint(cfg, ckpt_dir, io.read_jsonl(metrics_path))
    adapter_from_checkpoint(ckpt_dir / f"global_step_{chosen['step']}" / "actor", Path(spec.adapter_dir), cfg,
                            python=python, scratch=out / "state" / "gathered")
    return {"engine": "verl", "steps": reached, "planned_steps": planned, "resumed_from_step": start,
            "train_rows": n_rows, "checkpoint": chosen, "attention": attention}


def choose_verl_checkpoint(cfg: Train, ckpt_dir: Path, rows: list[dict]) -> dict:
    """train.select over verl's saved steps (global_step_N/actor), by verl's own val metrics per step."""
    saved = [int(p.name.rsplit("_", 1)[1]) for p in ckpt_dir.glob("global_step_*")
             if p.name.rsplit("_", 1)[1].isdigit() and (p / "actor").is_dir()]
    return choose_checkpoint(cfg.select, saved, rows)


def main_ppo_env(file_log: Path) -> dict[str, str]:
    """main_ppo's environment: ours, verl's file logger path, and PYTHONSAFEPATH (`python -m` would put the
    working directory first on sys.path, where a stray ./wandb or ./verl shadows the installed package)."""
    return safe_path_env({**os.environ, "VERL_FILE_LOGGER_PATH": str(file_log)})


def _launch(cfg: Train, overrides: list[str], python: str | None, env: dict, out: Path, follow,
            endpoint_file: str | None) -> subprocess.Popen:
    """main_ppo on one node or over the allocation's, until it ends or is stopped: on SIGUSR1/SIGTERM or at the
    SLURM time limit's deadline (which verl also gets, to save before it: deadline_overrides), exit 75."""
    with StopRequest().watch() as stop:
        overrides = overrides + deadline_overrides(stop.deadline)
        if cfg.nnodes > 1:  # a Ray cluster over the allocation's nodes; verl's ray.init() joins it
            with ray_cluster.cluster(nodes=_training_nodes(cfg.nnodes), gpus_per_node=cfg.n_gpus_per_node,
                                     state_dir=out / "state" / "ray", judge_url=_judge_url(endpoint_file)) as rc:
                return _main_ppo(command(overrides, python), {**env, **rc.env}, out, follow, stop)
        # one node: verl starts Ray itself, with the job's CPUs and a temp dir of its own

        return _main_ppo(command(overrides + ray_cluster.single_node_overrides(), python), env, out, follow,
                         stop)


def _main_ppo(cmd: list[str], env: dict, out: Path, follow, stop: StopRequest | None = None) -> subprocess.Popen:
    """Run main_ppo to its end, following its metrics; kill its process group if we are stopped (an
    exception, or `stop` requested: then Interrupted, exit 75, the rerun resuming from verl's last save)."""
    io.write_text(out / "state" / "verl_command.sh", " ".join(_shell_quote(c) for c in cmd) + "\n")
    # verl's console logger prints progress on stdout: send it to our stderr (the rule's log)
    # umask 077: verl's rollout dumps (trainer.rollout_data_dir) hold patient text; its Ray workers inherit it
    proc = subprocess.Popen(cmd, env=env, start_new_session=True, stdout=sys.stderr, umask=0o077)
    try:
        while proc.poll() is None:
            time.sleep(POLL_S)
            follow()
            if stop is not None and proc.poll() is None and stop.requested():
                raise Interrupted(f"train: verl main_ppo stopped on {stop.reason}; its last checkpoint is step "
                                  f"{latest_step(out / 'checkpoints')} ({out / 'checkpoints'}), a rerun continues "
                                  "from it")
    except BaseException:
        os.killpg(proc.pid, signal.SIGTERM)
        proc.wait(timeout=60)
        raise
    return proc


def _training_nodes(nnodes: int) -> list[str]:
    """The allocation's nodes; exactly train.nnodes of them (the profile asks SLURM for that many)."""
    nodes = ray_cluster.allocation_nodes()
    if len(nodes) != nnodes:
        raise CheckFailed(f"train.nnodes is {nnodes} but this job holds {len(nodes)} node(s) "
                          f"({','.join(nodes) or 'no SLURM allocation'}): run it through profiles/slurm with "
                          f"LLMRNN_TRAIN_NODES={nnodes}")
    return nodes


def _judge_url(endpoint_file: str | None) -> str | None:
    if not endpoint_file:
        return None

    return Endpoint.read(endpoint_file).url


def _stop_reason(audit_dir: Path) -> str:
    """Why the reward stopped the run, when it did (the reward workers die inside Ray: their exception
    reaches us only as main_ppo's exit code)."""
    path = audit_dir / STOP_REASON_FILE
    return f": {path.read_text(encoding='utf-8').strip()}" if path.is_file() else ""


def _shell_quote(text: str) -> str:
    return shlex.quote(text)
