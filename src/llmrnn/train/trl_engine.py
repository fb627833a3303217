"""TRL engine: GRPOTrainer on CPU (or one GPU) with the shared knobs, the same parquet and reward.

Mapping (verl units -> TRL, one process): num_generations = G; per_device_train_batch_size = micro;
gradient_accumulation_steps = mini x G / micro; steps_per_generation = train x G / micro (so one
generation batch = `batch.train` prompts x G, and it makes train/mini optimizer steps); beta = KL coef
(TRL's KL is the k3 = low_var_kl estimator, always in the loss); entropy_coef; max_grad_norm = grad
clip. TRL's global step counts OPTIMIZER steps: save_freq/test_freq/total_steps are multiplied by
train/mini (1 in the reference).

Resume: the latest COMPLETE checkpoint (trainer_state.json parses, adapter + optimizer present) is
resumed with resume_from_checkpoint; the train sampler's order is a function of (seed, epoch), so the
resumed run sees exactly the batches the uninterrupted run would (TRL's own sampler restarts its
random stream on resume, which replays/skips prompts past epoch 0).
"""

from __future__ import annotations

import dataclasses
import functools
import importlib
import importlib.util
import itertools
import json
import logging
import os
import re
import shutil
import time
import warnings
from collections.abc import Callable
from pathlib import Path
from typing import Any

from llmrnn import io
from llmrnn.errors import CheckFailed, InputError
from llmrnn.gpus import cpu_bf16
from llmrnn.reward.custom import open_custom, trl_reward
from llmrnn.settings.train import Train
from llmrnn.train import config as tcfg
from llmrnn.train import data as tdata
from llmrnn.train import tracking
from llmrnn.train.checkpoints import (
    choose_checkpoint,
    discard_stale_checkpoints,
    run_fingerprint,
)
from llmrnn.train.metrics import MetricsWriter, progress_line, trl_row
from llmrnn.train.outputs import export_adapter, export_checkpoint_adapter, finish_metrics
from llmrnn.train.spec import RunSpec
from llmrnn.train.stop import StopRequest, check_finished, run_trainer, stop_callback

log = logging.getLogger(__name__)

CKPT_RE = re.compile(r"^checkpoint-(\d+)$")


# ----------------------------------------------------------------------------- reward function
def load_callable(spec: str) -> Callable:
    """'pkg.module:func' or '/path/file.py:func'."""
    if ":" not in spec:
        raise InputError(f"reward function {spec!r}: expected 'module:function' or 'file.py:function'")
    target, name = spec.rsplit(":", 1)
    try:
        if target.endswith(".py"):
            mod_spec = importlib.util.spec_from_file_location(Path(target).stem, target)
            if mod_spec is None or mod_spec.loader is None:
                raise ImportError(target)
            module = importlib.util.module_from_spec(mod_spec)
            mod_spec.loader.exec_module(module)
        else:
            module = importlib.import_module(target)
    except (ImportError, FileNotFoundError) as exc:
        raise InputError(f"reward function {spec!r}: cannot import {target}: {exc}") from exc
    fn = getattr(module, name, None)
    if not callable(fn):
        raise InputError(f"reward function {spec!r}: {target} has no function {name}")
    return fn


def json_close_token_ids(tokenizer) -> list[int]:
    """Vocabulary ids whose text ends with '"}': the token that closes a one-level memory JSON
    {"evolving_summary": "..."}. Used as extra EOS ids (train.trl.stop_at_json) so a rollout ends where
    the forward pass's stop_at_json would end it, instead of running on to max_response_length."""
    ids = []
    for token_id in tokenizer.get_vocab().values():
        text = tokenizer.decode([token_id], skip_special_tokens=True).rstrip()
        if text.endswith('"}') and text.count("{") == 0:
            ids.append(int(token_id))
    return sorted(ids)


# ----------------------------------------------------------------------------- checkpoints
def checkpoint_complete(path: Path) -> bool:
    """HF writes trainer_state.json last (after adapter, optimizer, rng); it must parse and name the step."""
    match = CKPT_RE.match(path.name)
    state = path / "trainer_state.json"
    if not match or not state.is_file() or not (path / "optimizer.pt").is_file():
        return False
    if not any(path.glob("adapter_model.*")):
        return False
    try:
        step = json.loads(state.read_text(encoding="utf-8"))["global_step"]
    except (json.JSONDecodeError, KeyError, OSError):
        return False
    return int(step) == int(match.group(1))


def latest_checkpoint(ckpt_dir: Path, prune: bool = True) -> Path | None:
    """The newest complete checkpoint; incomplete ones (a kill mid-save) are removed when `prune`."""
    if not ckpt_dir.is_dir():
        return None
    found = sorted(
        (p for p in ckpt_dir.iterdir() if p.is_dir() and CKPT_RE.match(p.name)),
        key=lambda p: int(CKPT_RE.match(p.name).group(1)),
    )
    best = None
    for path in found:
        if checkpoint_complete(path):
            best = path
        elif prune:
            log.warning("removing incomplete checkpoint %s (killed while saving)", path)
            shutil.rmtree(path, ignore_errors=True)
    return best


# ----------------------------------------------------------------------------- pieces of a run
def check_knobs(cfg: Train):
    """The batch geometry TRL runs with (the section's own: Train.geometry); knobs TRL cannot honour are errors
    (or a warning for the estimator)."""
    if cfg.engine != "trl":  # the geometry and the section's rules are the engine's: TRL's are those of engine trl
        raise InputError(f"train.engine: {cfg.engine!r}, but the TRL engine was asked to run it (set train.engine: trl)")
    geo = cfg.geometry
    if geo.problems:
        raise CheckFailed("train: " + "; ".join(geo.problems))
    if not cfg.kl.in_loss:
        raise InputError("train.kl.in_loss=false (KL in the reward) is verl-only; TRL puts KL in the loss")
    if cfg.kl.estimator not in ("low_var_kl", "k3"):
        log.warning("TRL's KL is the k3 (low_var_kl) estimator; train.kl.estimator=%s applies to verl only",
                    cfg.kl.estimator)
    return geo


def load_rows(path: str | os.PathLike, split: str, tokenizer, max_prompt_length: int) -> list[dict]:
    """Rows of a trajectory parquet, without prompts over max_prompt_length (dropped, as verl does)."""
    rows = tdata.read_trajectory_parquet(path)
    lengths = tdata.prompt_lengths(rows, tokenizer)
    kept = [r for r, n in zip(rows, lengths) if n <= max_prompt_length]
    if len(kept) < len(rows):
        log.warning("%s: dropped %d of %d rows longer than max_prompt_length=%d (as verl does)",
                    split, len(rows) - len(kept), len(rows), max_prompt_length)
    for i, row in enumerate(kept):
        row["extra_info"] = dict(row.get("extra_info") or {}, index=tdata.row_index(row, i))
    return kept


def grpo_arguments(cfg: Train, geo, ckpt_dir: Path, max_steps: int, validate: bool, run_name: str | None = None):
    """GRPOConfig from the shared knobs (the mapping in the module docstring)."""
    import torch
    from trl import GRPOConfig


    # train.report_to: the trackers, under the run's name; transformers 4.x takes the TensorBoard folder as
    # logging_dir, 5.x from TENSORBOARD_LOGGING_DIR (llmrnn.train.tracking.prepare sets both)
    tb_dir = os.environ.get("TENSORBOARD_LOGGING_DIR")
    logging_dir = ({"logging_dir": tb_dir} if tb_dir and "logging_dir" in {f.name for f in dataclasses.fields(GRPOConfig)}
                   else {})

    cuda = torch.cuda.is_available()
    g = cfg.group_size
    micro = cfg.batch.micro_per_gpu
    upd = geo.updates_per_step
    val_n = cfg.val_generations or g
    return GRPOConfig(
        output_dir=str(ckpt_dir),
        seed=cfg.seed,
        data_seed=cfg.seed,
        use_cpu=not cuda,
        # CPU: bf16 autocast only when asked (train.trl.cpu_bf16; auto: where the CPU has bf16 natively;
        # LoRA weights stay float32)
        bf16=bool(torch.cuda.is_bf16_supported()) if cuda else cpu_bf16(cfg.trl.cpu_bf16),
        fp16=False,
        learning_rate=cfg.lr,
        lr_scheduler_type=cfg.lr_scheduler,
        warmup_steps=cfg.warmup_steps * upd,
        weight_decay=0.0,
        max_grad_norm=cfg.grad_clip,
        beta=cfg.kl.coef,
        entropy_coef=cfg.entropy_coef,
        # set explicitly: TRL's own defaults are not verl's (train.clip_ratio, train.loss_agg_mode)
        epsilon=cfg.clip_ratio.low,
        epsilon_high=cfg.clip_ratio.high,
        loss_type=tcfg.LOSS_TYPES[cfg.loss_agg_mode],
        num_generations=g,
        per_device_train_batch_size=micro,
        gradient_accumulation_steps=geo.grad_accum,
        steps_per_generation=cfg.batch.train * g // micro,
        max_completion_length=cfg.max_response_length,
        temperature=cfg.rollout.temperature,
        top_p=cfg.rollout.top_p,
        num_train_epochs=float(cfg.epochs),
        max_steps=max_steps,
        save_strategy="steps",
        save_steps=cfg.save_freq * upd if cfg.save_freq else max_steps,
        save_total_limit=cfg.keep_last,
        eval_strategy="steps" if validate else "no",
        eval_steps=cfg.test_freq * upd if validate else None,
        eval_on_start=bool(validate and cfg.val_before_train),
        # val rollouts in batches about one training generation batch (batch.train x G), whole prompt groups
        per_device_eval_batch_size=val_n * max(1, cfg.batch.train * g // val_n),
        num_generations_eval=val_n,
        logging_steps=cfg.trl.logging_steps,
        report_to=tracking.report_to(cfg),
        run_name=run_name,
        **logging_dir,
        disable_tqdm=True,
        dataloader_num_workers=0,
        shuffle_dataset=True,
        gradient_checkpointing=cfg.trl.gradient_checkpointing,
        # best_val: HF tracks the best val reward and never rotates that checkpoint away (save_total_limit)
        metric_for_best_model="reward" if cfg.select == "best_val" else None,
        greater_is_better=True if cfg.select == "best_val" else None,
    )


def _tracker_callbacks(cfg: Train, tracked_config: dict | None) -> list:
    """train.report_to's trackers get llmrnn's own config sections too (transformers attaches the GRPOConfig)."""
    trackers = tracking.report_to(cfg)
    return [tracking.config_callback(tracked_config or {"train": cfg.model_dump()}, trackers)] if trackers else []


def lora_config(cfg: Train):
    from peft import LoraConfig

    return LoraConfig(
        r=cfg.lora.rank,
        lora_alpha=cfg.lora.alpha,
        lora_dropout=cfg.lora.dropout,
        target_modules=list(cfg.lora.target_modules),
        bias="none",
        task_type="CAUSAL_LM",
    )


def resume_point(ckpt_dir: Path, writer: MetricsWriter, trace_path: Path, max_steps: int) -> tuple[Path | None, int]:
    """The checkpoint to resume (None: from step 0) and its step; live rows past it are dropped (redone)."""
    resume = latest_checkpoint(ckpt_dir)
    resume_step = 0
    if resume is not None:
        resume_step = json.loads((resume / "trainer_state.json").read_text())["global_step"]
        log.info("resuming from %s (step %d of %d)", resume, resume_step, max_steps)
    else:
        log.info("starting GRPO from step 0 (%d steps planned)", max_steps)
    dropped = writer.truncate_after(resume_step)
    if dropped:
        log.info("metrics.jsonl: dropped %d rows past step %d (they are redone)", dropped, resume_step)
    MetricsWriter(trace_path).truncate_after(resume_step)
    return resume, resume_step


def traced_reward(reward_fn: Callable, trace_path: Path, holder: dict) -> Callable:
    """The reward TRL calls, appending the dataset indices of each TRAINING step to the data trace (the
    resume test compares them with an uninterrupted run)."""

    def judge(prompts, completions, **kw):
        state = kw.get("trainer_state")
        trainer = holder.get("trainer")
        training = bool(trainer is not None and trainer.model.training)
        scores = reward_fn(prompts, completions, **kw)
        if training:  # the latest batch, dumped at the next save (sample_dump_callback)
            extra = kw.get("extra_info") or [{}] * len(prompts)
            holder["samples"] = [
                {"prompt": _text(p), "completion": _text(c), "reward": float(r), "index": int((e or {}).get("index", -1))}
                for p, c, r, e in zip(prompts, completions, scores, extra)
            ]
        if training and state is not None:
            indices = [int((e or {}).get("index", -1)) for e in kw.get("extra_info", [])]
            with open(trace_path, "a", encoding="utf-8") as fh:
                fh.write(json.dumps({"step": state.global_step + 1, "indices": indices}) + "\n")
        return scores

    judge.__name__ = "judge"
    return judge


def resumable_trainer_class():
    """GRPOTrainer whose train sampler's order depends on (seed, epoch) only: resume-safe data order."""
    from trl import GRPOTrainer
    from trl.trainer.utils import RepeatSampler

    class EpochSampler(RepeatSampler):
        def set_epoch(self, epoch: int) -> None:
            self.epoch = int(epoch)

        def __iter__(self):
            if self.shuffle:
                self.generator.manual_seed(int(self.seed or 0) * 1_000_003 + getattr(self, "epoch", 0))
            return super().__iter__()

    class Trainer(GRPOTrainer):
        def _get_train_sampler(self, dataset=None):
            base = super()._get_train_sampler(dataset)
            return EpochSampler(
                data_source=base.data_source,
                mini_repeat_count=base.mini_repeat_count,
                batch_size=base.batch_size,
                repeat_count=base.repeat_count,
                shuffle=base.shuffle,
                seed=base.seed,
            )

    return Trainer


def progress_callback(writer: MetricsWriter, max_steps: int):
    """One metrics.jsonl row and one log line per logged step (with the step's wall time)."""
    from transformers import TrainerCallback

    class Progress(TrainerCallback):
        def __init__(self):
            self.t0 = None
            self.last = None

        def on_step_begin(self, args, state, control, **kw):
            self.t0 = time.perf_counter()

        def on_step_end(self, args, state, control, **kw):
            self.last = time.perf_counter() - self.t0 if self.t0 else None

        def on_log(self, args, state, control, logs=None, **kw):
            logs = dict(logs or {})
            if not any(k in logs for k in ("reward", "eval_reward", "loss")):
                return
            if "eval_reward" not in logs and self.last is not None:
                logs["step_time_s"] = self.last
            row = trl_row(state.global_step, logs)
            writer.append(row)
            log.info(progress_line(row, max_steps))

    return Progress()


def sample_dump_callback(folder: Path, holder: dict, updates_per_step: int):
    """At each save: the latest rollout batch (prompt, completion, reward) to FOLDER/step_N.jsonl, mode 0600
    (prompts can hold patient text); N counts rollout steps like save_freq."""
    from transformers import TrainerCallback

    class SampleDump(TrainerCallback):
        def on_save(self, args, state, control, **kw):
            if holder.get("samples"):
                dump_samples(folder, state.global_step // updates_per_step, holder["samples"])

    return SampleDump()


def early_stop_callback(cfg: Train, holder: dict, updates_per_step: int):
    """Stop when the val reward fell `patience` validations in a row (train.early_stopping); the step is
    kept in holder["early_stopped"] so the run counts as complete."""
    from transformers import TrainerCallback

    settings = cfg.early_stopping

    class EarlyStop(TrainerCallback):
        def __init__(self):
            self.history: list[float] = []

        def on_evaluate(self, args, state, control, metrics=None, **kw):
            value = (metrics or {}).get("eval_reward")
            if value is None or not settings.enabled:
                return
            self.history.append(float(value))
            if falls_in_a_row(self.history, settings.patience):
                holder["early_stopped"] = state.global_step
                log.warning("early stopping at step %d: val reward fell %d times in a row (%s)",
                            state.global_step // updates_per_step, settings.patience, self.history)
                control.should_training_stop = True

    return EarlyStop()


def eval_at_save_callback():
    """train.select best_val: validate at every save (HF evaluates before it saves in the same step), so
    every checkpoint has a val reward to be chosen by, whatever test_freq is."""
    from transformers import TrainerCallback

    class EvalAtSave(TrainerCallback):
        def on_step_end(self, args, state, control, **kw):
            if control.should_save:  # set by DefaultFlowCallback, which runs first
                control.should_evaluate = True

    return EvalAtSave()


def _text(value: Any) -> str:
    """A prompt/completion as text (TRL passes chat message lists for conversational rows)."""
    if isinstance(value, list):
        return "\n".join(f"{m.get('role')}: {m.get('content')}" if isinstance(m, dict) else str(m) for m in value)
    return str(value)


def dump_samples(folder: Path, step: int, samples: list[dict]) -> Path:
    path = folder / f"step_{step:06d}.jsonl"
    folder.mkdir(parents=True, exist_ok=True)
    io.write_text(path, "".join(json.dumps({"step": step, **s}, ensure_ascii=False) + "\n" for s in samples),
                  mode=0o600)
    return path


def falls_in_a_row(history: list[float], patience: int) -> bool:
    """True when each of the last `patience` values is below the one before it."""
    if len(history) <= patience:
        return False
    tail = history[-(patience + 1):]
    return all(b < a for a, b in itertools.pairwise(tail))



def load_policy(model_dir, tokenizer, cfg: Train):
    """The policy model; with train.trl.stop_at_json its rollouts end at the memory JSON's closing token."""
    import torch
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32)
    if cfg.trl.stop_at_json:
        # TRL takes its EOS ids (generation and completion mask) from the model's generation config
        stops = json_close_token_ids(tokenizer)
        model.generation_config.eos_token_id = [tokenizer.eos_token_id, *stops]
        log.info("rollouts stop at the memory JSON's closing token (ids %s) or EOS", stops)
    return model


def _setup_threads(threads: int) -> None:
    import torch

    os.environ.setdefault("OMP_NUM_THREADS", str(threads))
    torch.set_num_threads(threads)
    warnings.filterwarnings("ignore", category=FutureWarning, module="transformers")


# ----------------------------------------------------------------------------- main entry
def train(spec: RunSpec, *, callbacks: list | None = None) -> dict:
    """Run (or resume) GRPO with TRL; returns a summary. Raises CheckFailed if the planned steps were not reached.

    The reward is your own (spec.custom, called through llmrnn.reward.custom.trl_reward) or the function
    spec.reward_func names (default llmrnn.reward's), called with spec.reward_kwargs bound as keyword
    arguments (llmrnn.reward.kwargs). `callbacks`: TrainerCallbacks run after ours.

    spec.work_dir holds checkpoints/ and state/ (live metrics, data trace): Snakemake deletes a rule's outputs
    before rerunning it, and a resumed run must keep the rows of the steps it does not redo; the outputs
    (adapter_dir, metrics_path) are written at the end.
    """
    # your own reward, per sample with verl's signature: TRL calls it through trl_reward
    reward_fn = trl_reward(open_custom(spec.custom), spec.custom["name"]) if spec.custom else None
    cfg, work, model_dir, train_parquet = spec.cfg, Path(spec.work_dir), spec.model_dir, spec.train_parquet
    val_parquet, reward_kwargs = spec.val_parquet, spec.reward_kwargs
    ckpt_dir = work / "checkpoints"
    live_metrics = work / "state" / "metrics.jsonl"
    trace_path = work / "state" / "data_trace.jsonl"
    _setup_threads(cfg.trl.num_threads)
    from datasets import Dataset
    from transformers import AutoTokenizer, PrinterCallback

    geo = check_knobs(cfg)
    tokenizer = AutoTokenizer.from_pretrained(model_dir)
    if tokenizer.pad_token is None:
        tokenizer.pad_token = tokenizer.eos_token
    train_rows = load_rows(train_parquet, "train", tokenizer, cfg.max_prompt_length)
    planned = tcfg.planned_steps(cfg, len(train_rows))
    if planned < 1:
        raise CheckFailed(
            f"train: {len(train_rows)} usable train rows make no full batch of train.batch.train="
            f"{cfg.batch.train} prompts"
        )
    upd = geo.updates_per_step
    max_steps = planned * upd
    val_rows = load_rows(val_parquet, "val", tokenizer, cfg.max_prompt_length) if val_parquet and cfg.test_freq else []

    discard_stale_checkpoints(work, run_fingerprint(cfg, train_parquet, model_dir, spec.reward, reward_kwargs))
    reward = functools.partial(reward_fn or load_callable(str(spec.reward_func)), **(reward_kwargs or {}))
    writer = MetricsWriter(live_metrics)
    resume, resume_step = resume_point(ckpt_dir, writer, trace_path, max_steps)
    holder: dict[str, Any] = {}
    stop = StopRequest().watch()
    trainer = resumable_trainer_class()(
        model=load_policy(model_dir, tokenizer, cfg),
        reward_funcs=[traced_reward(reward, trace_path, holder)],
        args=grpo_arguments(cfg, geo, ckpt_dir, max_steps, validate=bool(val_rows), run_name=spec.run_name),
        train_dataset=Dataset.from_list(train_rows),
        eval_dataset=Dataset.from_list(val_rows) if val_rows else None,
        processing_class=tokenizer,
        peft_config=lora_config(cfg),
        callbacks=[progress_callback(writer, max_steps), sample_dump_callback(work / "samples", holder, upd),
                   early_stop_callback(cfg, holder, upd), stop_callback(stop, holder, upd),
                   *([eval_at_save_callback()] if cfg.select == "best_val" and val_rows else []),
                   *(callbacks or []), *_tracker_callbacks(cfg, spec.tracked_config)],
    )
    trainer.remove_callback(PrinterCallback)  # our Progress callback logs one line per step instead
    holder["trainer"] = trainer
    t0 = time.perf_counter()
    with stop:  # its signal handlers are put back when training ends, however it ends
        run_trainer(trainer, resume, ckpt_dir, stop, holder, upd)
    reached = int(trainer.state.global_step)
    check_finished(cfg, holder, reached, max_steps, upd, live_metrics)
    metrics_path = Path(spec.metrics_path)
    finish_metrics(live_metrics, metrics_path)
    chosen = choose_trl_checkpoint(cfg, ckpt_dir, io.read_jsonl(metrics_path), reached, upd)
    if chosen["checkpoint_dir"] is None:
        export_adapter(trainer.model, tokenizer, Path(spec.adapter_dir), cfg)
    else:
        export_checkpoint_adapter(Path(chosen["checkpoint_dir"]), tokenizer, Path(spec.adapter_dir), cfg)
    log.info("GRPO done: %d/%d steps, adapter of step %d at %s (%s)", reached, max_steps, chosen["step"],
             spec.adapter_dir, chosen["why"])
    return {
        "engine": "trl",
        "steps": reached,
        "planned_steps": max_steps,
        "resumed_from_step": resume_step,
        "early_stopped_at_step": holder["early_stopped"] // upd if holder.get("early_stopped") else None,
        "train_rows": len(train_rows),
        "val_rows": len(val_rows),
        "seconds": round(time.perf_counter() - t0, 2),
        "geometry": geo.as_dict(),
        "checkpoint": chosen,
    }


def choose_trl_checkpoint(cfg: Train, ckpt_dir: Path, rows: list[dict], reached: int, upd: int) -> dict:
    """train.select over the complete checkpoints on disk (TRL steps are optimizer steps, as in
    metrics.jsonl); `step` is in rollout steps (save_freq's unit). checkpoint_dir None = the final model."""
    saved = {int(CKPT_RE.match(p.name).group(1)): p for p in ckpt_dir.iterdir()
             if p.is_dir() and CKPT_RE.match(p.name) and checkpoint_complete(p)} if ckpt_dir.is_dir() else {}
    saved.setdefault(reached, None)  # the model in memory is the final step's
    chosen = choose_checkpoint(cfg.select, sorted(saved), rows)
    path = saved[chosen["step"]] if chosen["step"] != reached else None
    def per_step(values: dict) -> dict:  # keys in rollout steps too
        return {str(int(k) // upd): v for k, v in values.items()}

    return {**chosen, "step": chosen["step"] // upd, "saved_steps": [s // upd for s in chosen["saved_steps"]],
            "val_reward_by_step": per_step(chosen["val_reward_by_step"]),
            "val_reward_of_saved": per_step(chosen["val_reward_of_saved"]),
            "checkpoint_dir": str(path) if path else None}



