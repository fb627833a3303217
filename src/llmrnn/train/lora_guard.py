"""Run-time guard of verl's LoRA path: a run whose rollouts come from the initial policy fails in its first step.

verl hands vLLM the actor's LoRA tensors before every rollout (`collect_lora_params`, the weight sync of verl
0.7.1's FSDP worker and of 0.9's FSDP engine) and writes them into each checkpoint's lora_adapter/ (0.7.1's
`save_checkpoint`). Both go through one PEFT call that returns nothing under PEFT releases that match keys by
their path from the model root (peft 0.21.x with verl 0.7.1's layered_summon_lora_params); vLLM then accepts
the empty adapter and samples from the base model for the whole run, and the reward stays flat. Nothing fails.

`worker_setup` is the Ray worker_process_setup_hook `llmrnn train run` gives verl (verl_overrides.runtime_env_overrides):
in every worker process it wraps, in place,
- verl.utils.fsdp_utils.collect_lora_params: the weights handed to the rollout must hold one tensor per LoRA
  slot of the actor, and after an update_actor at least one of them must differ from the previous sync;
- ActorRolloutRefWorker.save_checkpoint (verl 0.7.1's FSDP worker): the lora_adapter/ it wrote must hold one
  tensor per LoRA slot (verl itself logs and swallows a failure there);
- ActorRolloutRefWorker.update_actor (0.7.1's FSDP worker, 0.9's engine worker): counts the updates.
Each failure is one line (LoraGuardError) naming what was counted. `check_adapter_dir` does the saved-adapter
check for `llmrnn train run`'s adapter copy, counting the slots in the base model's weight names.
"""

from __future__ import annotations

import functools
import hashlib
import importlib.abc
import importlib.util
import json
import sys
from pathlib import Path

from safetensors import safe_open

from llmrnn.errors import CheckFailed
from llmrnn.lora_files import is_lora_key, saved_lora_tensors
from llmrnn.train.ray_cluster import private_worker

ADAPTER = "default"
# modules whose wrapping is deferred until they are imported (importing verl's workers costs seconds per process)
_WORKER_MODULES = ("verl.workers.fsdp_workers", "verl.workers.engine_workers")


class LoraGuardError(RuntimeError):
    """The LoRA path lost the adapter: one line, raised in the worker that found it."""


def lora_slots(model, adapter: str = ADAPTER) -> int:
    """How many LoRA tensors the PEFT model holds for `adapter` (A and B of every adapted module), read from
    its module tree, which FSDP keeps."""
    from peft.tuners.lora import LoraLayer

    n = 0
    for module in model.modules():
        if isinstance(module, LoraLayer):
            n += 2 * (adapter in module.lora_A) + 2 * (adapter in getattr(module, "lora_embedding_A", {}))
    return n


def _digest(tensor) -> str:
    """Exact: any changed bit changes it (an update too small for a tolerance still counts)."""
    import torch

    t = tensor.full_tensor() if hasattr(tensor, "full_tensor") else tensor
    t = t.detach().cpu().contiguous().view(-1).view(torch.uint8)
    return hashlib.blake2b(t.numpy().tobytes(), digest_size=16).hexdigest()


class SyncWatch:
    """What the guard remembers in one worker process: the updates it saw and the last sync's digests."""

    def __init__(self):
        self.updates = 0
        self.syncs = 0
        self._last: dict[str, str] | None = None
        self._updates_at_last = 0
        self.changed_checked = False

    def observe(self, params, slots: int) -> dict:
        """Check one sync's tensors (name -> tensor) against the actor's LoRA slots; raises LoraGuardError."""
        items = params.items() if hasattr(params, "items") else params
        lora = {k: v for k, v in items if is_lora_key(k)}
        self.syncs += 1
        if not lora or len(lora) < slots:
            raise LoraGuardError(
                f"LoRA guard: the weights handed to the rollout hold {len(lora)} LoRA tensors of the "
                f"actor's {slots} (sync {self.syncs}); vLLM would sample from the base model all run. "
                f"{_peft_hint()}")
        digests = {k: _digest(v) for k, v in lora.items()} if not self.changed_checked else None
        if digests is not None and self._last is not None and self.updates > self._updates_at_last:
            changed = sum(1 for k, d in digests.items() if self._last.get(k) != d)
            self.changed_checked = True  # once: the first update is what tells a live path from a dead one
            if changed == 0:
                raise LoraGuardError(
                    f"LoRA guard: none of the {len(lora)} LoRA tensors handed to the rollout changed "
                    f"after {self.updates - self._updates_at_last} actor update(s) (sync {self.syncs}); the "
                    "rollout would keep sampling the initial policy")
        if digests is not None:
            self._last, self._updates_at_last = digests, self.updates
        return {"lora_tensors": len(lora), "slots": slots, "sync": self.syncs}


WATCH = SyncWatch()


def _peft_hint() -> str:
    try:
        import peft

        return (f"peft {peft.__version__} is installed; envs/gpu-lock.txt pins the release whose "
                "get_peft_model_state_dict(model, state_dict=<a layer's>) verl's collector relies on")
    except ImportError:
        return ""


def check_saved_adapter(adapter_dir: Path, slots: int, what: str = "saved adapter") -> int:
    n = saved_lora_tensors(Path(adapter_dir))
    if n < slots or n == 0:
        raise LoraGuardError(f"LoRA guard: {adapter_dir}: the {what} holds {n} LoRA tensors of the {slots} "
                             f"LoRA slots it targets (an empty adapter: nothing trained reaches the merge). "
                             f"{_peft_hint()}")
    return n


def base_slots(adapter_conf: dict, base_dir: Path) -> int:
    """The LoRA slots an adapter config targets in a base model: 2 per module PEFT would adapt, matched with
    PEFT's own check_target_module_exists against the base's weight names (read from the safetensors headers,
    no weights loaded)."""
    from peft import LoraConfig
    from peft.tuners.tuners_utils import check_target_module_exists
    files = sorted(Path(base_dir).glob("*.safetensors"))
    if not files:
        raise CheckFailed(f"{base_dir}: no *.safetensors weights to count the adapter's LoRA slots in")
    modules = set()
    for f in files:
        with safe_open(str(f), framework="pt") as fh:
            modules.update(k.rsplit(".", 1)[0] for k in fh.keys() if k.endswith(".weight"))  # noqa: SIM118
    targets = adapter_conf.get("target_modules")
    config = LoraConfig(target_modules=targets, exclude_modules=adapter_conf.get("exclude_modules"),
                        layers_to_transform=adapter_conf.get("layers_to_transform"),
                        layers_pattern=adapter_conf.get("layers_pattern"))
    return 2 * sum(1 for m in modules if check_target_module_exists(config, m))


def check_adapter_dir(adapter_dir: Path, base_dir: Path | None = None) -> dict:
    """`llmrnn train run`'s check of the adapter it copies: one LoRA tensor per slot the config targets (slots
    counted in `base_dir`, else in the config's base_model_name_or_path); CheckFailed in one line otherwise."""
    adapter_dir = Path(adapter_dir)
    conf = json.loads((adapter_dir / "adapter_config.json").read_text(encoding="utf-8"))
    named = base_dir or conf.get("base_model_name_or_path")
    base = Path(named) if named else None
    n = saved_lora_tensors(adapter_dir)
    if n == 0:
        raise CheckFailed(f"{adapter_dir}: the adapter holds no LoRA tensor (an empty adapter: the trainer's "
                          f"LoRA collection wrote nothing; not a reward problem). {_peft_hint()}")
    if base is None or not base.is_dir() or not any(base.glob("*.safetensors")):
        return {"lora_tensors": n, "slots": None}  # the base is not here (a hub id, another node): n > 0 only
    slots = base_slots(conf, base)
    if n < slots:
        raise CheckFailed(f"{adapter_dir}: the adapter holds {n} LoRA tensors of the {slots} LoRA slots it "
                          f"targets in {base}; part of the adapter was not saved")
    return {"lora_tensors": n, "slots": slots}


# ------------------------------------------------------------------------------------------------ verl hooks
def _guarded_collect(orig):
    @functools.wraps(orig)
    def collect_lora_params(module, layered_summon, base_sync_done, *args, **kwargs):
        params = orig(module, layered_summon, base_sync_done, *args, **kwargs)
        if base_sync_done:  # then only the LoRA tensors go to vLLM (else the base weights, lora_ left out)
            WATCH.observe(params, lora_slots(getattr(module, "_fsdp_wrapped_module", module)))
        return params

    collect_lora_params.__llmrnn_guard__ = True
    return collect_lora_params


def _guarded_update(orig):
    @functools.wraps(orig)
    def update_actor(self, *args, **kwargs):
        out = orig(self, *args, **kwargs)
        WATCH.updates += 1
        return out

    update_actor.__llmrnn_guard__ = True
    return update_actor


def _guarded_save(orig):
    @functools.wraps(orig)
    def save_checkpoint(self, local_path, *args, **kwargs):
        out = orig(self, local_path, *args, **kwargs)
        module = getattr(self, "actor_module", None)
        module = getattr(self, "actor_module_fsdp", None) if module is None else module
        adapter = Path(local_path) / "lora_adapter"
        rank0 = getattr(self, "rank", 0) == 0
        if rank0 and getattr(self, "_is_lora", False) and module is not None and local_path:
            check_saved_adapter(adapter, lora_slots(getattr(module, "_fsdp_wrapped_module", module)),
                                "checkpoint's lora_adapter")
        return out

    save_checkpoint.__llmrnn_guard__ = True
    return save_checkpoint


def _wrap(owner, name: str, make) -> None:
    fn = getattr(owner, name, None)
    if fn is not None and not getattr(fn, "__llmrnn_guard__", False):
        setattr(owner, name, make(fn))


def _patch_worker_module(module) -> None:
    if module.__name__ == "verl.workers.engine.fsdp.transformer_impl":
        _wrap(module, "collect_lora_params", _guarded_collect)
        return
    _wrap(module, "collect_lora_params", _guarded_collect)
    cls = getattr(module, "ActorRolloutRefWorker", None)
    if cls is not None:
        _wrap(cls, "update_actor", _guarded_update)
        if module.__name__ == "verl.workers.fsdp_workers":  # 0.9's engine worker writes no lora_adapter/
            _wrap(cls, "save_checkpoint", _guarded_save)


class _AfterImport(importlib.abc.MetaPathFinder):
    """Patches verl's worker modules as they are imported (they bind collect_lora_params at import)."""

    names = (*_WORKER_MODULES, "verl.workers.engine.fsdp.transformer_impl")

    def find_spec(self, name, path, target=None):
        if name not in self.names:
            return None
        sys.meta_path.remove(self)
        try:
            spec = importlib.util.find_spec(name)
        finally:
            sys.meta_path.insert(0, self)
        if spec is None or spec.loader is None:
            return spec
        exec_module = spec.loader.exec_module

        def run(module):
            exec_module(module)
            _patch_worker_module(module)

        spec.loader.exec_module = run
        return spec


def install() -> None:
    """Wrap verl's LoRA collector, update and save in this process (idempotent)."""
    if importlib.util.find_spec("verl") is None:
        return
    from verl.utils import fsdp_utils

    _wrap(fsdp_utils, "collect_lora_params", _guarded_collect)
    for name in _AfterImport.names:
        if name in sys.modules:
            _patch_worker_module(sys.modules[name])
    if not any(isinstance(f, _AfterImport) for f in sys.meta_path):
        sys.meta_path.insert(0, _AfterImport())


def worker_setup() -> None:
    """Ray's worker_process_setup_hook for verl's workers: umask 077 (llmrnn.train.ray_cluster.private_worker)
    and the LoRA guard."""
    private_worker()
    install()
