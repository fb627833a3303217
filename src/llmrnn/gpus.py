"""Which GPUs a job may use when the judge and the trainer share one node (one SLURM group job).

On SLURM the profile runs judge_server, preflight and train_grpo as one group job on one node; each of
them runs as its own `srun --gpus=N` step, and SLURM usually narrows CUDA_VISIBLE_DEVICES per step. Where
a step sees the whole allocation (older executor plugins, `gres` requests, a workstation with several
GPUs) both would land on GPU 0. `assign(role)` removes that risk with one convention: the judge takes the
LAST `judge_gpus` visible devices, the trainer the ones before them (the reference run: actor+rollout on
cuda:0,1, judge on cuda:2). Call it first thing in the job, before torch/vllm are imported:

    from llmrnn.gpus import assign
    assign("judge", judge_gpus=1)                  # or assign("train", judge_gpus=1, train_gpus=2)

With no visible GPU (CPU runs) it changes nothing and returns [].
"""

from __future__ import annotations

import ipaddress
import logging
import os
import shutil
import socket
import subprocess
from collections.abc import Mapping, MutableMapping

from llmrnn.errors import CheckFailed, InputError

log = logging.getLogger(__name__)

ROLES = ("judge", "train")
# CPU features that compute bfloat16 natively; without them PyTorch emulates bf16 matmuls, several times
# slower than float32 (benchmarks/cpu_bf16.py prints the ratio on the machine it runs on)
NATIVE_BF16_FLAGS = ("avx512_bf16", "amx_bf16")


def cpu_has_native_bf16(cpuinfo: str | None = None) -> bool:
    """Whether this CPU computes bfloat16 natively (its /proc/cpuinfo flags; False where there is none)."""
    if cpuinfo is None:
        try:
            with open("/proc/cpuinfo", encoding="utf-8", errors="replace") as fh:
                cpuinfo = fh.read()
        except OSError:
            return False
    for line in cpuinfo.splitlines():
        if line.startswith("flags"):
            return bool(set(line.partition(":")[2].split()) & set(NATIVE_BF16_FLAGS))
    return False


def cpu_dtype(requested: str, cpuinfo: str | None = None) -> str:
    """The dtype a CPU job computes in: `auto` = bfloat16 where the CPU has it natively, else float32; any
    other value as asked."""
    if requested != "auto":
        return requested
    return "bfloat16" if cpu_has_native_bf16(cpuinfo) else "float32"


def cpu_bf16(requested: bool | str, cpuinfo: str | None = None) -> bool:
    """train.trl.cpu_bf16 resolved: true/false as asked, `auto` = where the CPU has bfloat16 natively."""
    return cpu_dtype("auto", cpuinfo) == "bfloat16" if requested == "auto" else bool(requested)


def visible_devices(env: MutableMapping[str, str] | None = None) -> list[str]:
    """The GPUs this process may use: CUDA_VISIBLE_DEVICES, else SLURM's step/job GPU list."""
    env = os.environ if env is None else env
    for key in ("CUDA_VISIBLE_DEVICES", "SLURM_STEP_GPUS", "SLURM_JOB_GPUS"):
        value = env.get(key)
        if value is not None and value.strip() not in ("", "NoDevFiles"):
            return [d.strip() for d in value.split(",") if d.strip()]
    return []


def split(devices: list[str], role: str, judge_gpus: int = 1, train_gpus: int | None = None) -> list[str]:
    """The devices of `role` out of `devices` (pure function; see the module docstring).

    - judge: all devices when there are at most `judge_gpus` (SLURM already narrowed the step),
      otherwise the last `judge_gpus`.
    - train: all devices when their number equals `train_gpus` (narrowed step) or when no judge
      shares the node (`judge_gpus` 0); otherwise the devices before the judge's, at most `train_gpus`.
    """
    if role not in ROLES:
        raise InputError(f"gpus: role must be one of {', '.join(ROLES)}, not {role!r}")
    if judge_gpus < 0 or (train_gpus is not None and train_gpus < 0):
        raise InputError("gpus: judge_gpus and train_gpus must be >= 0")
    if not devices:
        return []
    if role == "judge":
        if judge_gpus == 0:
            return []
        return list(devices) if len(devices) <= judge_gpus else list(devices[-judge_gpus:])
    if judge_gpus == 0 or (train_gpus is not None and len(devices) == train_gpus):
        return list(devices)
    if len(devices) <= judge_gpus:
        raise InputError(
            f"gpus: {len(devices)} visible GPU(s) ({','.join(devices)}) cannot hold the judge ({judge_gpus}) "
            f"and the trainer ({train_gpus or 'at least 1'}) on disjoint GPUs; request more GPUs for the "
            "training node (LLMRNN_TRAIN_GPUS/LLMRNN_JUDGE_GPUS, docs/cluster.md 'Set up: the GPU stack and the profile')"
        )
    rest = list(devices[: len(devices) - judge_gpus])
    if train_gpus is not None:
        if len(rest) < train_gpus:
            raise InputError(
                f"gpus: the trainer needs {train_gpus} GPU(s) but only {len(rest)} remain beside the judge's "
                f"{judge_gpus} of {','.join(devices)}"
            )
        rest = rest[:train_gpus]
    return rest


def assign(
    role: str,
    judge_gpus: int = 1,
    train_gpus: int | None = None,
    env: MutableMapping[str, str] | None = None,
) -> list[str]:
    """Narrow CUDA_VISIBLE_DEVICES of this process (and its children) to the devices of `role`."""
    env = os.environ if env is None else env
    devices = visible_devices(env)
    mine = split(devices, role, judge_gpus=judge_gpus, train_gpus=train_gpus)
    if devices:
        env["CUDA_VISIBLE_DEVICES"] = ",".join(mine)
        log.info("gpus: %s uses CUDA_VISIBLE_DEVICES=%s (visible: %s)", role, env["CUDA_VISIBLE_DEVICES"],
                 ",".join(devices))
    return mine


def _cmd_assign(args) -> None:
    mine = assign(args.role, judge_gpus=args.judge_gpus, train_gpus=args.train_gpus)
    print(",".join(mine))


def register(sub) -> None:
    p = sub.add_parser(
        "gpus",
        help="print the GPUs a role may use on a shared node (judge: last, trainer: the rest)",
        description="Print the CUDA_VISIBLE_DEVICES value for a role, e.g. "
        "`export CUDA_VISIBLE_DEVICES=$(llmrnn gpus --role judge)`.",
    )
    p.add_argument("--role", choices=ROLES, required=True)
    p.add_argument("--judge-gpus", type=int, default=1)
    p.add_argument("--train-gpus", type=int, default=None)
    p.set_defaults(func=_cmd_assign)


def visible_gpus() -> int:
    """GPUs this process can use (torch if importable, else CUDA_VISIBLE_DEVICES)."""
    try:
        import torch

        return int(torch.cuda.device_count())
    except Exception as exc:  # noqa: BLE001 - no torch: fall back to the environment
        log.debug("torch GPU count unavailable: %s", exc)
    env = os.environ.get("CUDA_VISIBLE_DEVICES")
    if env is not None:
        return len([x for x in env.split(",") if x.strip() and x.strip() != "-1"])
    return 0


# ----------------------------------------------------------------------------- this node (SLURM)
def node_address(node: str) -> str:
    """The IP address SLURM reaches `node` at (NodeAddr, resolved); the hostname's address without SLURM."""
    addr = node
    if shutil.which("scontrol"):
        out = subprocess.run(["scontrol", "show", "node", "-o", node], capture_output=True, text=True,
                             check=False, timeout=60)
        for token in out.stdout.split():
            if token.startswith("NodeAddr="):
                addr = token.split("=", 1)[1]
    try:
        return socket.gethostbyname(addr)
    except OSError as exc:
        raise CheckFailed(f"ray: cannot resolve the address of node {node} ({addr}): {exc}") from None


def is_loopback(host: str) -> bool:
    """Does `host` (a name or an address) resolve to a loopback address? An unresolvable one is not."""
    try:
        return ipaddress.ip_address(socket.gethostbyname(host)).is_loopback
    except (OSError, ValueError):
        return False


def this_node(env: Mapping[str, str] | None = None) -> str:
    env = os.environ if env is None else env
    return env.get("SLURMD_NODENAME") or socket.gethostname()
