"""verl's Hydra overrides: the `python -m verl.trainer.main_ppo` command built from the `train` section, no process
run (llmrnn.train.verl_cmd runs it; `llmrnn train verl-cmd` prints it).

Valid for verl 0.7.1 (the reference container) and 0.9.x; tests/verl/ composes verl's own
`ppo_trainer` config with these overrides in separate venvs of both releases:
- reward goes through `reward.custom_reward_function.{path,name,reward_kwargs}` + `reward.reward_manager.name`
  (the old top-level `custom_reward_function.*` composes in 0.9 but is silently ignored there);
- rollout.name has no default; both log_prob micro batch sizes are required; LoRA wants
  `rollout.load_format=safetensors` (and layered_summon);
- prompts longer than data.max_prompt_length are filtered (filter_overlong_prompts): preflight counts them.
"""

from __future__ import annotations

import re
import sys
from importlib.metadata import version as dist_version
from pathlib import Path

from llmrnn.errors import InputError
from llmrnn.reward import reward_kwargs as default_reward_kwargs
from llmrnn.reward.function import BUILTIN_REWARD
from llmrnn.settings.train import Train
from llmrnn.train import config as tcfg
from llmrnn.train import tracking
from llmrnn.train.stop import env_seconds
from llmrnn.train.verl_attention import resolve_attention

REWARD_NAME = "compute_score"
CUSTOM_ENTRY = "custom_compute_score"  # llmrnn.reward's entry for your own reward (llmrnn.reward.custom)
SUPPORTED = ("0.7", "0.8", "0.9")


def _hydra_value(value) -> str:
    """Render a Python value as a Hydra override value."""
    if value is None:
        return "null"
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, (int, float)):
        return repr(value)
    if isinstance(value, (list, tuple)):
        return "[" + ",".join(_hydra_value(v) for v in value) + "]"
    text = str(value)
    if re.fullmatch(r"[A-Za-z0-9_./@:+-]+", text) and text not in ("true", "false", "null"):
        return text
    return "'" + text.replace("\\", "\\\\").replace("'", "\\'") + "'"


def series(version: str | None) -> str:
    """'0.7.1' -> '0.7'; None -> the installed verl's series (falls back to the reference 0.7)."""
    if version in (None, "", "auto"):
        try:
            version = dist_version("verl")
        except Exception:  # noqa: BLE001 - not installed in this env: build for the reference release
            version = "0.7.1"
    parts = str(version).split(".")
    short = ".".join(parts[:2])
    if short not in SUPPORTED:
        raise InputError(f"verl {version}: unsupported; the overrides are tested for verl {list(SUPPORTED)}")
    return short


def reward_module_path() -> str:
    """`pkg://llmrnn.reward` (RewardFunction.verl_path): the package's reward, which also wraps your own."""
    return BUILTIN_REWARD.verl_path


def _actor_overrides(cfg: Train) -> dict[str, object]:
    """The actor's optimiser and loss: LR schedule, batches, KL in the loss, entropy, clipping, aggregation."""
    b, kl = cfg.batch, cfg.kl
    return {
        "actor_rollout_ref.actor.optim.lr": cfg.lr,
        "actor_rollout_ref.actor.optim.lr_warmup_steps": cfg.warmup_steps,
        "actor_rollout_ref.actor.optim.lr_warmup_steps_ratio": 0.0,
        "actor_rollout_ref.actor.optim.lr_scheduler_type": cfg.lr_scheduler,
        "actor_rollout_ref.actor.ppo_mini_batch_size": b.mini,
        "actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu": b.micro_per_gpu,
        "actor_rollout_ref.actor.use_kl_loss": kl.in_loss,
        "actor_rollout_ref.actor.kl_loss_coef": kl.coef,
        "actor_rollout_ref.actor.kl_loss_type": kl.estimator,
        "actor_rollout_ref.actor.entropy_coeff": cfg.entropy_coef,
        "actor_rollout_ref.actor.grad_clip": cfg.grad_clip,
        # clip_ratio is verl's fallback for an unset low/high: all three set, so none is left to it
        "actor_rollout_ref.actor.clip_ratio": cfg.clip_ratio.low,
        "actor_rollout_ref.actor.clip_ratio_low": cfg.clip_ratio.low,
        "actor_rollout_ref.actor.clip_ratio_high": cfg.clip_ratio.high,
        "actor_rollout_ref.actor.loss_agg_mode": cfg.loss_agg_mode,
        "actor_rollout_ref.actor.data_loader_seed": cfg.seed,
    }


def _optional_overrides(cfg: Train, kl, ver: str) -> dict[str, object]:
    """The overrides that only some settings or verl releases ask for (verl's defaults stand otherwise)."""
    opt: dict[str, object] = {}
    if not kl.in_loss:
        opt["algorithm.kl_penalty"] = kl.estimator
        opt["algorithm.kl_ctrl.kl_coef"] = kl.coef
    if cfg.val_generations:  # unset: verl's own validation (one greedy sample per prompt)
        opt["actor_rollout_ref.rollout.val_kwargs.n"] = cfg.val_generations
        opt["actor_rollout_ref.rollout.val_kwargs.do_sample"] = cfg.val_generations > 1
    if cfg.total_steps:
        opt["trainer.total_training_steps"] = cfg.total_steps
    if ver == "0.9":
        # verl 0.9's main_ppo defaults to its v1 trainer, which imports TransferQueue (verl's `verl-core` extra,
        # not in our verl environment) and runs its own loop; v0 runs RayPPOTrainer with the engine workers,
        # the loop tests/verl/rehearse_fit.py drives on CPU
        opt["trainer.use_v1"] = False
    return opt


def build_overrides(
    cfg: Train,
    *,
    train_parquet: str,
    val_parquet: str | None,
    model_dir: str,
    out_dir: str,
    experiment_name: str,
    endpoint_file: str | None = None,
    verl_version: str | None = None,
    reward_path: str | None = None,
    reward_name: str = REWARD_NAME,
    attention: str | None = None,
    reward_kwargs: dict | None = None,
) -> list[str]:
    """The Hydra overrides for main_ppo (list of 'key=value'), for the given verl release series.
    `attention`: the resolved train.verl.attn_implementation (resolve_attention); None resolves it here.
    `reward_kwargs`: the reward's arguments (llmrnn.reward.kwargs; default: the audit dir under out_dir and
    `endpoint_file`), rendered into reward.custom_reward_function.reward_kwargs.
    `cfg`: the train settings as validated at the CLI boundary (train.config.settings; a library caller's
    raw section is validated here, a Train is used as it is)."""
    cfg = tcfg.settings(cfg)  # a no-op for the Train `llmrnn train run` / `verl-cmd` pass
    ver = series(verl_version)
    out = Path(out_dir)
    b, r, lora, kl = cfg.batch, cfg.rollout, cfg.lora, cfg.kl
    attn = attention or resolve_attention(cfg.verl.attn_implementation)["ran"]
    ov: dict[str, object] = {
        "algorithm.adv_estimator": "grpo",
        "algorithm.use_kl_in_reward": not kl.in_loss,
        "data.train_files": str(train_parquet),
        "data.val_files": str(val_parquet or train_parquet),
        "data.train_batch_size": b.train,
        "data.max_prompt_length": cfg.max_prompt_length,
        "data.max_response_length": cfg.max_response_length,
        "data.filter_overlong_prompts": True,
        "data.truncation": "error",
        "data.seed": cfg.seed,
        "actor_rollout_ref.model.path": str(model_dir),
        "actor_rollout_ref.model.lora_rank": lora.rank,
        "actor_rollout_ref.model.lora_alpha": lora.alpha,
        "actor_rollout_ref.model.target_modules": lora.target_modules,
        # verl 0.7.1 loads the actor with attn_implementation flash_attention_2 unless override_config names
        # one, and use_remove_padding (default true) imports flash_attn.bert_padding in the actor's forward;
        # the GPU lock has no flash-attn, so both follow train.verl.attn_implementation (auto: flash-attn where
        # it imports on the node, else sdpa; resolve_attention)
        "actor_rollout_ref.model.use_remove_padding": attn == "flash_attention_2",
        **_actor_overrides(cfg),
        "actor_rollout_ref.rollout.name": "vllm",
        "actor_rollout_ref.rollout.n": cfg.group_size,
        "actor_rollout_ref.rollout.temperature": r.temperature,
        "actor_rollout_ref.rollout.top_p": r.top_p,
        "actor_rollout_ref.rollout.tensor_model_parallel_size": r.tensor_parallel,
        "actor_rollout_ref.rollout.gpu_memory_utilization": r.gpu_memory_utilization,
        # null would give vLLM the model's max_position_embeddings (131072 for Llama-3.2-3B) and size its KV
        # cache for that, beside the FSDP actor on the same GPU: a rollout is a prompt plus a response, no more
        "actor_rollout_ref.rollout.max_model_len": cfg.max_prompt_length + cfg.max_response_length,
        "actor_rollout_ref.rollout.log_prob_micro_batch_size_per_gpu": b.micro_per_gpu,
        "actor_rollout_ref.rollout.load_format": "safetensors",
        "actor_rollout_ref.rollout.layered_summon": True,
        "actor_rollout_ref.ref.log_prob_micro_batch_size_per_gpu": b.micro_per_gpu,
        "reward.custom_reward_function.path": reward_path or reward_module_path(),
        "reward.custom_reward_function.name": reward_name,
        "reward.reward_manager.name": cfg.verl.reward_manager,
        "reward.num_workers": cfg.verl.reward_num_workers,
        "trainer.n_gpus_per_node": cfg.n_gpus_per_node,
        "trainer.nnodes": cfg.nnodes,
        "trainer.total_epochs": cfg.epochs,
        "trainer.save_freq": cfg.save_freq,
        "trainer.test_freq": cfg.test_freq if val_parquet else -1,
        "trainer.val_before_train": bool(cfg.val_before_train and val_parquet),
        "trainer.resume_mode": "auto",
        "trainer.default_local_dir": str(out / "checkpoints"),
        "trainer.rollout_data_dir": str(out / "rollouts"),
        # verl dumps each validation's generations ({step}.jsonl) here when set; beside the rollouts, under the
        # same umask 077 (patient text)
        "trainer.validation_data_dir": str(out / "validation"),
        "trainer.logger": tracking.verl_loggers(cfg),  # console + file (metrics.jsonl) + train.report_to
        # verl logs val generations (patient text) to the trackers when this is > 0: never
        "trainer.log_val_generations": 0,
        "trainer.project_name": cfg.project_name,
        "trainer.experiment_name": experiment_name,
        "trainer.max_actor_ckpt_to_keep": cfg.keep_last,
    }
    ov.update(_optional_overrides(cfg, kl, ver))
    # reward_kwargs is not in verl's default config: a new key needs Hydra's '+'
    # numeric_only: verl aggregates the extra keys compute_score returns, so they must be numbers
    if reward_kwargs is None:
        reward_kwargs = default_reward_kwargs(None, audit_dir=out / "audit", endpoint_file=endpoint_file)
    kwargs: dict[str, object] = {**reward_kwargs, "numeric_only": True}
    items = [f"{k}={_hydra_value(v)}" for k, v in ov.items()]
    items += [f"+reward.custom_reward_function.reward_kwargs.{k}={_hydra_value(v)}" for k, v in kwargs.items()]
    # override_config is an empty mapping in verl's model config: a new key needs '+'
    items.append(f"+actor_rollout_ref.model.override_config.attn_implementation={attn}")
    items += [str(x) for x in cfg.verl.extra_overrides]
    return items



# What verl's Ray workers need from the training job's environment: verl's file logger path (the metrics; verl's
# FileLogger reads it there, so it stays an environment variable). The reward's settings are not here: they
# are compute_score's arguments (reward_kwargs, llmrnn.reward.kwargs). A worker on another node of a `ray start` cluster gets its raylet's
# environment plus the job's runtime_env, never the driver's: main_ppo merges ray_kwargs.ray_init.runtime_env
# into the runtime_env of its ray.init (verl 0.7.1 trainer/main_ppo.py run_ppo), so they travel there, with
# a setup hook that sets umask 077 in every worker process.
FORWARDED_ENV = ("VERL_FILE_LOGGER_PATH",)
# umask 077 and the LoRA guard (llmrnn.train.lora_guard) in every Ray worker process
WORKER_SETUP_HOOK = "llmrnn.train.lora_guard.worker_setup"


def runtime_env_overrides(env: dict) -> list[str]:
    """Hydra overrides putting FORWARDED_ENV and the trackers' variables (tracking.FORWARDED_ENV: paths and
    modes, never a secret) of those set in `env`, and the umask hook, into verl's runtime_env."""
    names = [k for k in FORWARDED_ENV if env.get(k)]
    names += [k for k in tracking.FORWARDED_ENV if tracking.forwardable(k, str(env.get(k) or ""))]
    # one hook per job (Ray's worker_process_setup_hook): umask 077 and verl's LoRA path guarded
    items = [f"+ray_kwargs.ray_init.runtime_env.env_vars.{k}={_hydra_value(str(env[k]))}" for k in names]
    return items + [f"+ray_kwargs.ray_init.runtime_env.worker_process_setup_hook={WORKER_SETUP_HOOK}"]


# The SLURM time limit. verl (0.7.1, 0.9.1) installs no signal handler, but its fit() saves a checkpoint after
# any step at whose end verl.utils.checkpoint.checkpoint_manager.should_save_ckpt_esi finds the capacity
# block's expiration (a variable of its environment) closer than its longest step + 60 s (the save it
# assumes) + trainer.esi_redundant_time. Our stop deadline (llmrnn.train.stop: the job's end less
# LLMRNN_STOP_MARGIN_S) is that expiration, in every Ray worker's runtime_env (fit() runs in verl's
# TaskRunner, a Ray actor); LLMRNN_VERL_SAVE_S [300], what one save may really take, sets the redundant time.
# So every step that ends within a step + a save of the deadline is saved, and at the deadline run() stops
# main_ppo and exits 75 (continue): at most the step running then is lost.
ESI_ENV = "MLP_CURRENT_CAPACITY_BLOCK_EXPIRATION_TIMESTAMP"
SAVE_ENV = "LLMRNN_VERL_SAVE_S"
DEFAULT_SAVE_S = 300
VERL_ASSUMED_SAVE_S = 60  # should_save_ckpt_esi's save_ckpt_duration, which fit() leaves at its default


def deadline_overrides(deadline: float | None, env: dict | None = None) -> list[str]:
    """The Hydra overrides that make verl save before `deadline` (epoch seconds; None: no time limit, none)."""
    if deadline is None:
        return []
    redundant = max(0, round(env_seconds(SAVE_ENV, DEFAULT_SAVE_S, env)) - VERL_ASSUMED_SAVE_S)
    # quoted: Ray takes only strings as env_vars, and Hydra would read the bare number as an int
    return [f"trainer.esi_redundant_time={redundant}",
            f"+ray_kwargs.ray_init.runtime_env.env_vars.{ESI_ENV}='{deadline:.0f}'"]


def command(overrides: list[str], python: str | None = None) -> list[str]:
    """main_ppo's command line; llmrnn.train.verl_cmd runs it in main_ppo_env (llmrnn.safe_path's)."""
    return [python or sys.executable, "-m", "verl.trainer.main_ppo", *overrides]

