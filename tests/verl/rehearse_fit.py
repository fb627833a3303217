"""Runs INSIDE a verl venv: verl's own RayPPOTrainer.fit() on CPU, for our overrides, data and reward.

    .venv-verl-X/bin/python tests/verl/rehearse_fit.py --overrides o.json --out REPORT.json

Real: the composed config (check_verl.composed: Hydra + validate_config), verl's RayPPOTrainer (its
dataloaders over our parquet with RLHFDataset, fit(), _validate, advantage, metrics, the rollout and
validation dumps, _save_checkpoint/_load_checkpoint with the dataloader state, latest_checkpointed_iteration),
verl's RewardLoopWorker + reward manager calling our compute_score, verl's AgentLoopWorker._postprocess
packing each rollout, and the actor: under verl 0.7.1 its DataParallelPPOActor (the log-prob and
policy-update code the FSDP worker wraps) on a tiny real PEFT LoRA model; under verl 0.9 (engine workers, no
dp_actor) its own engine ActorRolloutRefWorker (role "actor": init_model, compute_log_prob with and without
the adapter, update_actor with ppo_loss, save/load_checkpoint, the FSDP2 engine's get_per_tensor_param).

Stand-ins, only for what needs a GPU (named STAND-IN below):
- StandInActorRolloutWG (0.7.1): the FSDP worker group (ActorRolloutRefWorker). Same methods and return
  values (compute_log_prob / compute_ref_log_prob / update_actor / save_checkpoint / load_checkpoint), one CPU
  process, no FSDP; the LoRA adapter saved as verl 0.7.1 saves it (tests/verl/verl_lora.py).
- StandInEngineWG (0.9): the RayWorkerGroup's dispatch over one in-process engine worker (TensorDict in and
  out, as 0.9.1's fit() calls it); tests/verl/cpu_platform.py stands in for the GPU platform, and the caller
  sets actor/ref strategy fsdp2 (FSDP1 refuses a CPU module with sync_module_states).
- StandInRollout: the agent-loop manager with its vLLM servers. A tiny model generates with transformers'
  generate (0.7.1: the actor's module; 0.9: a replica, as vLLM holds one); every sample is scored by verl's
  RewardLoopWorker and packed by verl's AgentLoopWorker._postprocess, as the agent loop does.
- StandInCheckpointEngine: the weight sync to the vLLM replicas (0.9: the engine's exported adapter tensors
  loaded into the replica, every one of them used; 0.7.1: verl's collect_lora_params on the actor's module).
  Both go through llmrnn's LoRA guard (llmrnn.train.lora_guard, installed as the Ray hook installs it): an
  empty or unmoved sync fails the run. verl 0.7.1's FSDP worker itself (2 ranks over gloo, its collector and
  save/load_checkpoint) runs in tests/verl/fsdp_lora.py.
Two runs: `--steps-first` steps (stops there, as a killed job would, after its checkpoint), then a second
trainer that resumes from the checkpoint and finishes. Writes a JSON report.
"""

from __future__ import annotations

import argparse
import json
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--overrides", required=True)
    ap.add_argument("--out", required=True)
    ap.add_argument("--stop-after", type=int, default=0, help="first run: stop after this step (0: run all)")
    args = ap.parse_args()

    os.environ.setdefault("MASTER_ADDR", "127.0.0.1")
    os.environ.setdefault("MASTER_PORT", str(29500 + os.getpid() % 1000))
    os.environ.setdefault("RANK", "0")
    os.environ.setdefault("WORLD_SIZE", "1")
    os.environ.setdefault("LOCAL_RANK", "0")
    import importlib.util

    engine = importlib.util.find_spec("verl.workers.actor") is None  # verl 0.9: engine workers, no dp_actor
    if engine:
        import cpu_platform

        cpu_platform.install()  # STAND-IN platform: before verl asks for one
    from llmrnn.train import lora_guard

    lora_guard.install()  # as `llmrnn train run`'s Ray worker hook does (verl_overrides.WORKER_SETUP_HOOK)
    import numpy as np
    import torch
    import torch.distributed as dist
    import verl
    from check_verl import _vllm_free_lora_rank_check, composed
    from transformers import AutoModelForCausalLM
    from verl import DataProto
    from verl.experimental.agent_loop.agent_loop import AgentLoopWorker, _InternalAgentLoopOutput
    from verl.experimental.reward_loop.reward_loop import RewardLoopWorker
    from verl.trainer.ppo.ray_trainer import RayPPOTrainer
    from verl.trainer.ppo.utils import Role
    from verl.utils import hf_tokenizer
    from verl.utils.model import compute_position_id_with_mask
    from verl.utils.ray_utils import get_event_loop

    if not dist.is_initialized():
        dist.init_process_group("gloo", rank=0, world_size=1)
    config = composed(args.overrides)
    _vllm_free_lora_rank_check()
    torch.manual_seed(0)
    tok = hf_tokenizer(config.actor_rollout_ref.model.path)
    mcfg = config.actor_rollout_ref.model
    steps_reached: list[int] = []

    class StandInActorRolloutWG:
        """STAND-IN for verl's FSDP ActorRolloutRefWorker group: the same calls, verl's DataParallelPPOActor."""

        def __init__(self):
            from peft import LoraConfig, TaskType, get_peft_model
            from verl.utils.config import omega_conf_to_dataclass
            from verl.workers.actor.dp_actor import DataParallelPPOActor

            base = AutoModelForCausalLM.from_pretrained(mcfg.path, dtype=torch.float32)
            # the LoraConfig verl 0.7.1's worker builds (fsdp_workers.py _build_model_optimizer)
            self.module = get_peft_model(base, LoraConfig(
                task_type=TaskType.CAUSAL_LM, r=mcfg.lora_rank, lora_alpha=mcfg.lora_alpha,
                target_modules=list(mcfg.target_modules), bias="none"))
            acfg = config.actor_rollout_ref.actor
            self.optimizer = torch.optim.AdamW([p for p in self.module.parameters() if p.requires_grad],
                                               lr=acfg.optim.lr)
            self.actor = DataParallelPPOActor(omega_conf_to_dataclass(acfg), self.module, self.optimizer)
            self.world_size = 1
            self._dispatch_info = {"actor": [0]}  # one data-parallel rank (verl's _get_dp_size reads it)

        def _log_prob(self, data: DataProto, ref: bool) -> DataProto:
            from contextlib import nullcontext

            src = config.actor_rollout_ref.ref if ref else config.actor_rollout_ref.rollout
            data.meta_info.update(micro_batch_size=src.log_prob_micro_batch_size_per_gpu,
                                  max_token_len=src.log_prob_max_token_len_per_gpu,
                                  use_dynamic_bsz=src.log_prob_use_dynamic_bsz,
                                  temperature=config.actor_rollout_ref.rollout.temperature)
            data.meta_info.setdefault("pad_token_id", tok.pad_token_id)
            with self.module.disable_adapter() if ref else nullcontext():
                out = self.actor.compute_log_prob(data=data, calculate_entropy=not ref)
            if ref:
                return DataProto.from_dict(tensors={"ref_log_prob": out["log_probs"]})
            return DataProto.from_dict(tensors={"old_log_probs": out["log_probs"], "entropys": out["entropys"]},
                                       meta_info={"temperature": config.actor_rollout_ref.rollout.temperature})

        def compute_log_prob(self, data):
            return self._log_prob(data, ref=False)

        def compute_ref_log_prob(self, data):
            return self._log_prob(data, ref=True)

        def update_actor(self, data):
            data.meta_info.setdefault("pad_token_id", tok.pad_token_id)
            metrics = self.actor.update_policy(data=data)
            lora_guard.WATCH.updates += 1  # what the guard counts in the FSDP worker's update_actor
            metrics["actor/lr"] = self.optimizer.param_groups[0]["lr"]
            return DataProto(meta_info={"metrics": metrics})

        def save_checkpoint(self, local_path, hdfs_path=None, global_step=0, max_ckpt_to_keep=None):
            os.makedirs(local_path, exist_ok=True)
            # the FSDP checkpoint manager's file names for one rank; our merge reads only lora_adapter/
            torch.save(self.module.state_dict(), os.path.join(local_path, "model_world_size_1_rank_0.pt"))
            torch.save(self.optimizer.state_dict(), os.path.join(local_path, "optim_world_size_1_rank_0.pt"))
            from verl_lora import save_like_verl_071

            save_like_verl_071(self.module, os.path.join(local_path, "lora_adapter"))
            steps_reached.append(global_step)

        def load_checkpoint(self, local_path, hdfs_path=None, del_local_after_load=False):
            if local_path is None:
                return
            self.module.load_state_dict(torch.load(os.path.join(local_path, "model_world_size_1_rank_0.pt")))
            self.optimizer.load_state_dict(torch.load(os.path.join(local_path, "optim_world_size_1_rank_0.pt")))

    class StandInEngineWG:
        """STAND-IN for verl 0.9's RayWorkerGroup of engine ActorRolloutRefWorker's: one in-process worker,
        called as the group's dispatch calls it (TensorDict in, TensorDict out). The worker is verl's own
        (verl/workers/engine_workers.py, role "actor": the rollout is the vLLM part), with its FSDP2 engine,
        ppo_loss, optimizer and checkpoint manager on the CPU platform stand-in."""

        def __init__(self):
            from verl.workers.engine_workers import ActorRolloutRefWorker

            self.worker = ActorRolloutRefWorker(config.actor_rollout_ref, role="actor")
            self.worker.init_model()
            self.module = self.worker.actor.engine.module
            self.world_size = 1
            self._dispatch_info = {"actor": [0]}

        def compute_log_prob(self, data):
            return self.worker.compute_log_prob(data)

        def update_actor(self, data):
            return self.worker.update_actor(data)

        def save_checkpoint(self, local_path, hdfs_path=None, global_step=0, max_ckpt_to_keep=None):
            self.worker.save_checkpoint(local_path, hdfs_path, global_step, max_ckpt_to_keep)
            steps_reached.append(global_step)

        def load_checkpoint(self, local_path, hdfs_path=None, del_local_after_load=False):
            self.worker.load_checkpoint(local_path, hdfs_path, del_local_after_load)

    class StandInRollout:
        """STAND-IN for verl's AgentLoopManager + vLLM servers: transformers generate on the actor's module,
        then verl's reward loop and agent-loop packing."""

        def __init__(self, wg):
            self.reward = RewardLoopWorker(config)
            self.calls = 0
            self.model = wg.module  # verl 0.7.1 (dp_actor): the actor's own PEFT module
            if engine:  # verl 0.9: a replica of the policy, as vLLM holds one; StandInCheckpointEngine syncs it
                from peft import LoraConfig, TaskType, get_peft_model

                self.model = get_peft_model(
                    AutoModelForCausalLM.from_pretrained(mcfg.path, dtype=torch.float32),
                    LoraConfig(task_type=TaskType.CAUSAL_LM, r=mcfg.lora_rank, lora_alpha=mcfg.lora_alpha,
                               target_modules=list(mcfg.target_modules), bias="none"))
                self.synced = 0

        def load_adapter(self, params: dict) -> None:
            """What vLLM's LoRA load takes from the weight sync: PEFT-named adapter tensors, all of them used."""
            from peft.utils import set_peft_model_state_dict

            result = set_peft_model_state_dict(self.model, params)
            if result.unexpected_keys:
                raise RuntimeError(f"weight sync: {len(result.unexpected_keys)} tensors fit no LoRA slot, "
                                   f"e.g. {result.unexpected_keys[:3]}")
            self.synced += 1

        def generate_sequences(self, prompts: DataProto) -> DataProto:
            rcfg = config.actor_rollout_ref.rollout
            plen, rlen = config.data.max_prompt_length, config.data.max_response_length
            validate = bool(prompts.meta_info.get("validate"))
            do_sample = bool(prompts.meta_info.get("do_sample", True))
            outs = []
            model = self.model
            model.eval()
            for i in range(len(prompts)):
                messages = list(prompts.non_tensor_batch["raw_prompt"][i])
                ids = tok.apply_chat_template(messages, add_generation_prompt=True, tokenize=True)
                ids = list(ids["input_ids"]) if hasattr(ids, "keys") else list(ids)
                with torch.no_grad():
                    gen = model.generate(input_ids=torch.tensor([ids]), attention_mask=torch.ones(1, len(ids), dtype=torch.long),
                                         max_new_tokens=rlen, do_sample=do_sample,
                                         temperature=float(rcfg.temperature) if do_sample else None,
                                         top_p=float(rcfg.top_p) if do_sample else None,
                                         pad_token_id=tok.pad_token_id, eos_token_id=tok.eos_token_id)
                resp = gen[0, len(ids):].tolist()
                p_ids = torch.tensor([[tok.pad_token_id] * (plen - len(ids)) + ids])
                r_ids = torch.tensor([resp + [tok.pad_token_id] * (rlen - len(resp))])
                p_mask = torch.tensor([[0] * (plen - len(ids)) + [1] * len(ids)])
                r_mask = torch.tensor([[1] * len(resp) + [0] * (rlen - len(resp))])
                mask = torch.cat([p_mask, r_mask], dim=1)
                one = DataProto.from_dict(
                    tensors={"prompts": p_ids, "responses": r_ids, "attention_mask": mask,
                             "input_ids": torch.cat([p_ids, r_ids], dim=1)},
                    non_tensors={k: np.array([prompts.non_tensor_batch[k][i]], dtype=object)
                                 for k in ("data_source", "reward_model", "extra_info")})
                scored = get_event_loop().run_until_complete(self.reward.compute_score_batch(one))[0]
                outs.append(_InternalAgentLoopOutput(
                    prompt_ids=p_ids, response_ids=r_ids, input_ids=torch.cat([p_ids, r_ids], dim=1),
                    position_ids=compute_position_id_with_mask(mask), response_mask=r_mask, attention_mask=mask,
                    reward_score=scored["reward_score"], num_turns=2, metrics={}, multi_modal_inputs={},  # text: {} as the agent loop gives
                    extra_fields={"reward_extra_info": scored["reward_extra_info"]}))
            self.calls += 1
            worker = type("W", (), {"reward_loop_worker_handles": [object()]})()  # rewards came from the loop
            batch = AgentLoopWorker._postprocess(worker, outs)
            batch.meta_info["timing"] = {}
            del validate
            return batch

    class StandInResourcePool:
        """STAND-IN for the Ray resource pool manager: one device (fit() divides throughput by it)."""

        def get_n_gpus(self):
            return 1

    class StandInCheckpointEngine:
        """STAND-IN for the actor -> vLLM weight sync. verl 0.7.1: the rollout generates with the actor's own
        module. verl 0.9: what the engine worker's update_weights sends, from the engine's own
        get_per_tensor_param (LoRA: the adapter tensors and their peft_config), loaded into the replica."""

        def __init__(self, wg, rollout):
            self.wg, self.rollout = wg, rollout

        def update_weights(self, step):
            if not engine:  # verl 0.7.1's collector on the actor's module (no FSDP here: its whole-model branch)
                from verl.utils import fsdp_utils

                fsdp_utils.collect_lora_params(module=self.wg.module, base_sync_done=True,
                                               layered_summon=config.actor_rollout_ref.rollout.layered_summon)
                return
            params, peft_config = self.wg.worker.actor.engine.get_per_tensor_param(
                layered_summon=config.actor_rollout_ref.rollout.layered_summon, base_sync_done=True)
            assert peft_config is not None and peft_config["r"] == mcfg.lora_rank, peft_config
            self.rollout.load_adapter({k: v.detach().float() for k, v in params})

        def sleep_replicas(self):
            pass

    report = {"verl": verl.__version__, "worker": "engine" if engine else "dp_actor", "runs": []}
    for run in (1, 2):
        log = os.environ.get("VERL_FILE_LOGGER_PATH")
        if run == 2 and log and os.path.exists(log):  # as `llmrnn train run` does: verl's FileLogger opens "wb"
            with open(log, "rb") as src, open(log.replace(".jsonl", ".previous.jsonl"), "ab") as dst:
                dst.write(src.read())
        trainer = RayPPOTrainer(config=config, tokenizer=tok,
                                role_worker_mapping={Role.ActorRollout: object},
                                resource_pool_manager=StandInResourcePool())
        wg = StandInEngineWG() if engine else StandInActorRolloutWG()
        trainer.actor_rollout_wg = wg
        trainer.ref_policy_wg = wg
        trainer.async_rollout_manager = StandInRollout(wg)
        trainer.checkpoint_manager = StandInCheckpointEngine(wg, trainer.async_rollout_manager)
        if run == 1 and args.stop_after:
            trainer.total_training_steps = args.stop_after  # a job killed after this step's checkpoint
        before = len(steps_reached)
        trainer.fit()
        report["runs"].append({"saved_steps": steps_reached[before:], "global_steps": trainer.global_steps,
                               "total_training_steps": trainer.total_training_steps,
                               "rollout_calls": trainer.async_rollout_manager.calls,
                               "weight_syncs": getattr(trainer.async_rollout_manager, "synced", None),
                               "guard": {"syncs": lora_guard.WATCH.syncs, "updates": lora_guard.WATCH.updates,
                                         "changed_checked": lora_guard.WATCH.changed_checked}})
        if not args.stop_after:
            break
    with open(args.out, "w", encoding="utf-8") as fh:
        json.dump(report, fh)
    print(json.dumps(report))
    return 0


if __name__ == "__main__":
    sys.exit(main())
