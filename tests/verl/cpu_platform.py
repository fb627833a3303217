"""STAND-IN for the GPU platform verl 0.9's engine workers run on (verl/plugin/platform), for the CPU rehearsal.

verl 0.9.1 registers only accelerator platforms (nvidia, npu, rocm) and falls back to 'nvidia' without one, so
its engine worker asks CUDA for a device and NCCL for a process group. This platform answers "cpu" and "gloo"
instead, and the memory counters verl logs read 0. Everything above it is verl's own: ActorRolloutRefWorker,
TrainingWorker, the FSDP2 engine (forward, ppo_loss, optimizer, LoRA adapter on/off), its checkpoint manager.

Import it (install()) before anything in verl asks for the platform. verl's engine registry keys its FSDP
engine by device "cuda"/"npu" only: VERL_ENGINE_DEVICE/VERL_ENGINE_VENDOR (verl's own override) pick it.
"""

from __future__ import annotations

import contextlib
import os
import types


def _device_module():
    import torch

    m = types.SimpleNamespace(**{k: getattr(torch.cpu, k) for k in dir(torch.cpu) if not k.startswith("_")})
    zero = lambda *a, **k: 0
    none = lambda *a, **k: None
    m.__dict__.update(
        max_memory_allocated=zero, max_memory_reserved=zero, memory_allocated=zero, memory_reserved=zero,
        reset_peak_memory_stats=none, empty_cache=none, set_device=none, ipc_collect=none,
        mem_get_info=lambda *a, **k: (0, 0), manual_seed=torch.manual_seed, manual_seed_all=torch.manual_seed,
        is_available=lambda: True, device_count=lambda: 1, current_device=lambda: 0,
        get_rng_state=torch.get_rng_state, set_rng_state=torch.set_rng_state,
        get_device_name=lambda *a, **k: "cpu")
    return m


def install() -> None:
    import torch
    from verl.plugin.platform.platform_base import PlatformBase
    from verl.plugin.platform.platform_manager import set_platform

    class StandInCPUPlatform(PlatformBase):
        """STAND-IN: verl's platform interface answered for a CPU (device "cpu", backend gloo)."""

        device_name = "cpu"
        vendor_name = "cpu"
        device_module = _device_module()

        def is_available(self):
            return True

        def current_device(self):
            return torch.device("cpu")  # FSDP's device_id: the module stays on the CPU

        def device_count(self):
            return 1

        def set_device(self, device_index):
            pass

        def synchronize(self, device_index=None):
            pass

        def manual_seed(self, seed):
            torch.manual_seed(seed)

        def manual_seed_all(self, seed):
            torch.manual_seed(seed)

        def set_allocator_settings(self, settings):
            pass

        def empty_cache(self):
            pass

        def get_device_capability(self, device_index=0):
            return (None, None)

        def communication_backend_name(self):
            return "gloo"

        def visible_devices_envvar(self):
            return "CUDA_VISIBLE_DEVICES"

        @contextlib.contextmanager
        def nvtx_range(self, msg):
            yield

        def profiler_start(self):
            pass

        def profiler_stop(self):
            pass

        def ray_resource_name(self):
            return "CPU"

        def ray_noset_envvars(self):
            return []

        def is_ipc_supported(self):
            return False

        def cudart(self):
            return None

    set_platform(StandInCPUPlatform())
    os.environ.setdefault("VERL_ENGINE_DEVICE", "cuda")
    os.environ.setdefault("VERL_ENGINE_VENDOR", "nvidia")
