"""Config section `train`: one set of GRPO knobs in verl units, shared by the verl and TRL engines."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Literal, get_args

from pydantic import Field, field_validator, model_validator

from llmrnn.settings.base import NAME, Section, job_resources

TRACKERS = ("tensorboard", "wandb", "mlflow")  # train.report_to's trackers
NO_TRACKER = "none"
LossAggMode = Literal['token-mean', 'seq-mean-token-mean', 'seq-mean-token-sum-norm', 'seq-mean-token-sum']
VERL_ONLY_LOSS = "seq-mean-token-sum"  # TRL has no loss_type that normalises so


def trackers(value: Any) -> list[str]:
    """train.report_to as a list of trackers ([] for none); an unknown name is one line (a ValueError)."""
    if not isinstance(value, (str, list, tuple)) and value is not None:
        raise ValueError(f"train.report_to: {str(value)[:40]!r} is not a tracker name nor a list of them "
                         f"({[NO_TRACKER, *TRACKERS]})")
    names = [value] if isinstance(value, str) or value is None else list(value)
    names = [NO_TRACKER if n is None else n for n in names]
    bad = [n for n in names if not isinstance(n, str) or n not in (*TRACKERS, NO_TRACKER)]
    if bad:
        raise ValueError(f"train.report_to: {str(bad[0])[:40]!r} is not one of {[NO_TRACKER, *TRACKERS]}")
    if NO_TRACKER in names and len(names) > 1:
        raise ValueError(f"train.report_to: {NO_TRACKER!r} cannot be listed with trackers ({names})")
    out: list[str] = []
    for n in names:
        if n != NO_TRACKER and n not in out:
            out.append(n)
    return out


class TrainLora(Section):
    """`train.lora`"""

    rank: int = Field(16, le=65536, ge=1, description='LoRA rank')
    alpha: int = Field(32, le=1_000_000, ge=1, description='written into adapter_config.json (merge uses it)')
    dropout: float = Field(0.0, ge=0, le=1, description='LoRA dropout (TRL; verl uses none)')
    target_modules: list[str] = Field(default_factory=lambda: ['q_proj', 'k_proj', 'v_proj', 'o_proj', 'gate_proj', 'up_proj', 'down_proj'], min_length=1, description='modules the LoRA adapts')



class TrainKl(Section):
    """`train.kl`"""

    coef: float = Field(0.001, le=1000, ge=0, description='verl kl_loss_coef / TRL beta')
    estimator: Literal['kl', 'k1', 'abs', 'mse', 'k2', 'low_var_kl', 'k3', 'full'] = Field('low_var_kl', description='verl `kl_loss_type`; TRL always uses k3 (= low_var_kl)')
    in_loss: bool = Field(True, description='KL in the actor loss (true) or in the reward (verl only)')



class TrainClipRatio(Section):
    """`train.clip_ratio`"""

    low: float = Field(0.2, le=10, gt=0, description='PPO ratio clip below: ratio >= 1 - low (verl clip_ratio_low and clip_ratio, TRL epsilon)')
    high: float = Field(0.2, le=10, gt=0, description='PPO ratio clip above: ratio <= 1 + high (verl clip_ratio_high, TRL epsilon_high)')



class TrainBatch(Section):
    """`train.batch`"""

    train: int = Field(16, le=1_000_000_000, ge=1, description='prompts per step (data.train_batch_size)')
    mini: int = Field(16, le=1_000_000_000, ge=1, description='prompts per optimizer update (ppo_mini_batch_size)')
    micro_per_gpu: int = Field(4, le=1_000_000_000, ge=1, description='responses per forward pass per GPU')



class TrainRollout(Section):
    """`train.rollout`"""

    temperature: float = Field(0.8, le=10, gt=0, description='rollout sampling temperature')
    top_p: float = Field(0.95, gt=0, le=1, description='rollout nucleus sampling')
    tensor_parallel: int = Field(1, le=64, ge=1, description='vLLM TP size (verl)')
    gpu_memory_utilization: float = Field(0.6, gt=0, le=1, description="verl's vLLM rollout")



class TrainVerl(Section):
    """`train.verl`"""

    reward_manager: str = Field('naive', description='verl `reward.reward_manager.name`')
    reward_num_workers: int = Field(8, le=1024, ge=1, description='verl `reward.num_workers`')
    attn_implementation: Literal['auto', 'sdpa', 'eager', 'flash_attention_2'] = Field('auto', description="actor attention kernel (verl override_config.attn_implementation); auto = flash_attention_2 where flash-attn imports on the training node, else sdpa (what ran: train summary.json attention, the model card); flash_attention_2 needs flash-attn installed and turns verl's use_remove_padding on")
    extra_overrides: list[str] = Field(default_factory=list, description='extra Hydra overrides for main_ppo, key=value')



class TrainTrl(Section):
    """`train.trl`"""

    num_threads: int = Field(1, le=1024, ge=1, description='torch threads on CPU (1 is the steadiest for small models)')
    logging_steps: int = Field(1, le=1_000_000_000, ge=1, description='TRL log interval')
    stop_at_json: bool = Field(False, description='end a rollout at the token that closes the memory JSON ("}), as the forward pass does')
    cpu_bf16: Literal[True, False, 'auto'] = Field(False, description='CPU only: bfloat16 autocast for rollouts and updates (LoRA weights stay float32); auto = where the CPU computes bf16 natively (AVX512-BF16 or AMX; emulated bf16 is slower than float32). On a GPU TRL uses bf16 when the GPU supports it')
    gradient_checkpointing: bool = Field(False, description="recompute activations during backward (TRL's own default: true): saves memory for big models; on the CPU demo it cost 14% of a step's CPU time for the same rewards")



class TrainEarlyStopping(Section):
    """`train.early_stopping`"""

    enabled: bool = Field(False, description="TRL: stop when the val reward fell `patience` validations in a row (needs test_freq > 0; refused with engine verl); the last step's adapter is kept")
    patience: int = Field(2, le=1_000_000_000, ge=1, description='validations in a row the val reward must fall before TRL stops')



TrainResources = job_resources("TrainResources", "train.resources", "the train_grpo job", gpu=None, mem_mb=8000,
                               runtime=120, cpus_per_task=2,
                               help={"gpu": "GPUs of the job; null = `n_gpus_per_node` for verl, 0 for TRL"})



@dataclass(frozen=True)
class Geometry:
    """Batch arithmetic both engines share; `problems` is empty when the geometry is possible."""

    n_gpus: int
    prompts_per_step: int
    responses_per_step: int
    updates_per_step: int  # optimizer steps per rollout batch (train / mini)
    responses_per_update_per_gpu: int  # mini x G / n_gpus
    grad_accum: int  # micro batches per optimizer step on each GPU
    problems: tuple[str, ...]

    def as_dict(self) -> dict:
        return {
            "n_gpus": self.n_gpus,
            "prompts_per_step": self.prompts_per_step,
            "responses_per_step": self.responses_per_step,
            "updates_per_step": self.updates_per_step,
            "responses_per_update_per_gpu": self.responses_per_update_per_gpu,
            "grad_accum": self.grad_accum,
        }


class Train(Section):
    """`train`"""

    engine: Literal['verl', 'trl'] = Field('verl', description='verl (GPU, python -m verl.trainer.main_ppo) or trl (CPU / one GPU, GRPOTrainer)')
    seed: int = Field(42, le=2**32 - 1, ge=0, description='data order (verl `data.seed`, TRL sampler/seed)')
    lora: TrainLora = Field(default_factory=TrainLora)
    lr: float = Field(3e-06, le=1, gt=0, description='peak learning rate (AdamW)')
    lr_scheduler: Literal['constant', 'cosine'] = Field('constant', description='`constant` or `cosine`')
    warmup_steps: int = Field(0, le=1_000_000_000, ge=0, description='in optimizer steps')
    kl: TrainKl = Field(default_factory=TrainKl)
    entropy_coef: float = Field(0.0, le=1000, ge=0, description='entropy bonus (verl `entropy_coeff`, TRL `entropy_coef`)')
    grad_clip: float = Field(1.0, le=1e6, gt=0, description='max grad norm')
    clip_ratio: TrainClipRatio = Field(default_factory=TrainClipRatio, description='PPO clip range of the policy ratio, [1 - low, 1 + high] (verl actor.clip_ratio_low/high, TRL epsilon/epsilon_high)')
    loss_agg_mode: LossAggMode = Field('token-mean', description='how token losses are averaged (verl actor.loss_agg_mode; TRL loss_type dapo / grpo / dr_grpo; seq-mean-token-sum is verl-only)')
    group_size: int = Field(8, le=4096, ge=2, description='G rollouts per prompt (verl rollout.n, TRL num_generations); GRPO needs at least 2')
    batch: TrainBatch = Field(default_factory=TrainBatch)
    rollout: TrainRollout = Field(default_factory=TrainRollout)
    max_prompt_length: int = Field(3072, le=1 << 24, ge=1, description='longer prompts are dropped by verl; preflight counts them')
    max_response_length: int = Field(512, le=1 << 24, ge=1, description='tokens per rollout')
    epochs: int = Field(20, le=1_000_000_000, ge=1, description='passes over the train parquet (partial last batch dropped)')
    total_steps: int | None = Field(None, le=1_000_000_000, ge=1, description='cap on steps (verl trainer.total_training_steps)')
    save_freq: int = Field(20, le=1_000_000_000, ge=0, description='checkpoint every N steps (and always at the end)')
    test_freq: int = Field(5, le=1_000_000_000, ge=0, description='validate on the val parquet every N steps; 0 = never')
    keep_last: int | None = Field(None, le=1_000_000_000, ge=1, description='checkpoints kept (verl max_actor_ckpt_to_keep, TRL save_total_limit); null = all. Preflight compares their size with the free disk and your quota (lfs quota / quota -w); short of room, set it (select: last needs only the last; the reference kept all)')
    val_before_train: bool = Field(True, description='validate once before the first step')
    val_generations: int | None = Field(None, le=1_000_000_000, ge=1, description="rollouts per val prompt; null = the engine's own (TRL: group_size at the rollout temperature; verl: one greedy sample). Set, verl samples that many (val_kwargs.n)")
    select: Literal['last', 'best_val'] = Field('last', description="which saved checkpoint becomes the adapter: last (the reference's) or best_val (highest val reward among saved steps; needs test_freq > 0; verl also save_freq a multiple of test_freq and keep_last null)")
    n_gpus_per_node: int = Field(1, le=64, ge=1, description="actor+rollout GPUs (verl); the judge's GPU is extra")
    nnodes: int = Field(1, le=4096, ge=1, description='nodes verl trains on: > 1 runs a Ray cluster over that many nodes of one SLURM job (needs judge.host: node and LLMRNN_TRAIN_NODES; docs/cluster.md)')
    project_name: str = Field('llmrnn_grpo', pattern=NAME, description='verl project name (the experiment name is the run name)')
    min_free_disk_gb: float = Field(1.0, le=1e6, ge=0, description='preflight fails with less free disk at RUN/train')
    fail_on_zero_gradient: bool = Field(True, description='a training run (TRL or verl) whose gradient norm was 0 at every logged step (no learning signal: the same reward for every completion of each group) fails instead of being marked done; false only for plumbing runs of a tiny model that cannot learn')
    report_to: Any = Field('none', description='experiment trackers of the training run (verl trainer.logger, TRL report_to), writing into RUN/train/: none, tensorboard, wandb (offline unless WANDB_MODE is set), mlflow, or a list (docs/configuration.md)', json_schema_extra={'oneOf': [{'enum': [NO_TRACKER, *TRACKERS]}, {'type': 'array', 'uniqueItems': True, 'items': {'enum': list(TRACKERS)}}]})
    verl: TrainVerl = Field(default_factory=TrainVerl)
    trl: TrainTrl = Field(default_factory=TrainTrl)
    early_stopping: TrainEarlyStopping = Field(default_factory=TrainEarlyStopping, description='TRL: stop when the val reward fell `patience` validations in a row (needs test_freq > 0)')
    resources: TrainResources = Field(default_factory=TrainResources, description='train_grpo job (gpu = n_gpus_per_node x nnodes for verl, 0 for trl on CPU unless set)')

    @property
    def geometry(self) -> Geometry:
        """The batch geometry of this section on its engine (check, preflight and TRL all read it here): train
        x G vs mini/micro x GPUs checked the way verl's workers do (and TRL's GRPOConfig); TRL runs on one
        device, whatever n_gpus_per_node says."""
        n_gpus = 1 if self.engine == "trl" else self.n_gpus_per_node * self.nnodes
        g = self.group_size
        train, mini, micro = self.batch.train, self.batch.mini, self.batch.micro_per_gpu
        problems: list[str] = []
        if mini > train:
            problems.append(f"train.batch.mini={mini} is larger than train.batch.train={train} (both count prompts)")
        elif train % mini:
            problems.append(
                f"train.batch.train={train} is not a multiple of train.batch.mini={mini}: each step must split into "
                "whole mini-batches"
            )
        per_gpu = mini * g // n_gpus if (mini * g) % n_gpus == 0 else None
        if per_gpu is None:
            problems.append(
                f"train.batch.mini x group_size = {mini}x{g} = {mini * g} responses cannot be split evenly over "
                f"{n_gpus} GPUs (n_gpus_per_node x nnodes)"
            )
            per_gpu = max(1, mini * g // n_gpus)
        if per_gpu % micro:
            problems.append(
                f"train.batch.micro_per_gpu={micro} does not divide the {per_gpu} responses each GPU gets per "
                f"optimizer step (batch.mini x group_size / GPUs = {mini}x{g}/{n_gpus})"
            )
        if self.engine == "verl":
            tp = self.rollout.tensor_parallel
            if self.n_gpus_per_node % tp:
                problems.append(
                    f"train.rollout.tensor_parallel={tp} does not divide train.n_gpus_per_node={self.n_gpus_per_node}"
                )
            if (train * g) % n_gpus:
                problems.append(
                    f"train.batch.train x group_size = {train * g} responses cannot be split evenly over {n_gpus} GPUs"
                )
        return Geometry(
            n_gpus=n_gpus,
            prompts_per_step=train,
            responses_per_step=train * g,
            updates_per_step=max(1, train // mini) if mini <= train else 1,
            responses_per_update_per_gpu=per_gpu,
            grad_accum=max(1, per_gpu // micro),
            problems=tuple(problems),
        )

    @field_validator("report_to")
    @classmethod
    def _known_trackers(cls, value: Any) -> Any:
        trackers(value)
        return value

    @model_validator(mode="after")
    def _engine_rules(self) -> Train:
        """The cross-field rules of the section (check, the docs and the run share them)."""
        if self.engine == "verl" and self.early_stopping.enabled:
            # verl's trainer has no hook we drive between validations: refuse rather than ignore the knob
            raise ValueError("train.early_stopping.enabled: true needs train.engine trl (verl runs its planned steps)")
        if self.engine == "trl" and self.loss_agg_mode == VERL_ONLY_LOSS:
            others = [m for m in get_args(LossAggMode) if m != VERL_ONLY_LOSS]
            raise ValueError(f"train.loss_agg_mode: {self.loss_agg_mode!r} is verl-only (TRL has no such loss_type); "
                             f"use one of {others}")
        self._best_val_rules()
        return self

    def _best_val_rules(self) -> None:
        """train.select best_val chooses among SAVED steps by their val reward, so every saved step must be
        validated. TRL validates at every save itself (llmrnn.train.trl_engine) and keeps the best checkpoint
        through save_total_limit; verl validates every test_freq steps and at the last one, so its saves must
        fall on validation steps, and it must keep every checkpoint (it rotates them without regard to val)."""
        if self.select != "best_val":
            return
        save, test = self.save_freq or 0, self.test_freq or 0
        if test < 1:
            raise ValueError("train.select: best_val needs validation: set train.test_freq > 0")
        if self.engine != "verl":
            return
        if save < 1 or save % test:
            raise ValueError(
                f"train.select: best_val with engine verl needs every saved step validated, but train.save_freq={save} "
                f"is not a multiple of train.test_freq={test}: set save_freq to a multiple of test_freq")
        if self.keep_last is not None:
            raise ValueError(
                f"train.select: best_val with engine verl needs every checkpoint kept (train.keep_last: null, not "
                f"{self.keep_last}): verl deletes old checkpoints without regard to their val reward")
