"""Why did (or didn't) GRPO move the policy? Numbers from a finished or running training run.

`llmrnn train diagnose --audit RUN/train/audit --adapter RUN/train/adapter --group-size G` prints JSON:
  groups        the reward audit's scored samples of one split (default train), consecutive samples of
                the same prompt cut into groups of G (TRL and verl score a prompt's G rollouts side by
                side): how many groups had any reward spread (a group
                whose rewards are all equal has zero advantage and gives GRPO no gradient), the mean
                within-group std, and the mean |advantage| (reward minus group mean, over the group std as
                GRPO scales it; 0 for flat groups);
  rewards       mean, distribution (value -> count) and the valid-JSON share of all scored samples;
  lora          per adapter: the Frobenius norm of the update scale * B @ A summed in quadrature over
                modules, its largest module, and how many B matrices are still all zero (B starts at 0).
"""

from __future__ import annotations

import argparse
import json
import math
import statistics
from collections import Counter
from pathlib import Path

from llmrnn.errors import InputError


def read_audit(audit_dir: str | Path) -> list[dict]:
    """Scored samples of every calls_<pid>.jsonl in the directory, in file then line order."""
    files = sorted(Path(audit_dir).glob("calls_*.jsonl"))
    if not files:
        raise InputError(f"{audit_dir}: no calls_*.jsonl reward audit files")
    rows = []
    for path in files:
        for lineno, line in enumerate(path.read_text(encoding="utf-8").splitlines(), 1):
            try:
                rows.append(json.loads(line))
            except json.JSONDecodeError:
                raise InputError(f"{path}: line {lineno}: not JSON") from None
    return rows


def _groups(rows: list[dict], group_size: int) -> list[list[float]]:
    """Consecutive samples of the same prompt (extra_info split + index), cut into groups of group_size."""
    groups: list[list[float]] = []
    key = None
    for r in rows:
        info = r.get("extra_info") or {}
        k = (info.get("split"), info.get("index"))
        if k != key or len(groups[-1]) == group_size:
            groups.append([])
            key = k
        groups[-1].append(float(r["score"]))
    return [g for g in groups if len(g) == group_size]


def group_stats(rows: list[dict], group_size: int, split: str | None = "train") -> dict:
    if group_size is None or group_size < 2:
        raise InputError(f"--group-size must be >= 2 (train.group_size), got {group_size}")
    if split:
        rows = [r for r in rows if (r.get("extra_info") or {}).get("split", split) == split]
    scores = [float(r["score"]) for r in rows]
    groups = _groups(rows, group_size)
    advantages, stds, spread = [], [], 0
    for g in groups:
        mean, std = statistics.fmean(g), statistics.pstdev(g)
        stds.append(std)
        if std > 0:
            spread += 1
        advantages += [abs(x - mean) / (std + 1e-4) if std > 0 else 0.0 for x in g]
    return {
        "groups": len(groups),
        "groups_with_spread": spread,
        "share_with_spread": spread / len(groups) if groups else None,
        "mean_within_group_std": statistics.fmean(stds) if stds else None,
        "mean_abs_advantage": statistics.fmean(advantages) if advantages else None,
        "rewards": {
            "n": len(scores),
            "mean": statistics.fmean(scores) if scores else None,
            "distribution": {f"{k:.3f}": v for k, v in sorted(Counter(round(s, 3) for s in scores).items())},
            "valid_json_share": statistics.fmean(bool(r.get("valid_json")) for r in rows) if rows else None,
        },
    }


def lora_update(adapter_dir: str | Path) -> dict:
    """Size of the LoRA update scale * B @ A (what merging adds to the base weights)."""
    import torch
    from safetensors.torch import load_file

    adapter_dir = Path(adapter_dir)
    conf_path, weights = adapter_dir / "adapter_config.json", adapter_dir / "adapter_model.safetensors"
    if not conf_path.is_file() or not weights.is_file():
        raise InputError(f"{adapter_dir}: no adapter_config.json + adapter_model.safetensors")
    conf = json.loads(conf_path.read_text(encoding="utf-8"))
    scale = float(conf["lora_alpha"]) / float(conf["r"])
    tensors = load_file(str(weights))
    norms, zero_b = {}, 0
    for name, a in tensors.items():
        if ".lora_A." not in name:
            continue
        b = tensors[name.replace(".lora_A.", ".lora_B.")]
        zero_b += int(not torch.any(b))
        norms[name.replace(".lora_A.weight", "")] = float(torch.linalg.norm(scale * (b.float() @ a.float())))
    if not norms:
        raise InputError(f"{weights}: no lora_A/lora_B pairs")
    top = max(norms, key=norms.get)
    return {
        "modules": len(norms),
        "update_norm_total": math.sqrt(sum(v * v for v in norms.values())),
        "largest": {"module": top, "norm": norms[top]},
        "zero_b_modules": zero_b,
    }


def cmd_diagnose(args: argparse.Namespace) -> None:
    out: dict = {}
    if args.audit:
        out.update(group_stats(read_audit(args.audit), args.group_size, args.split or None))
    if args.adapter:
        out["lora"] = lora_update(args.adapter)
    print(json.dumps(out, indent=1))


def add_parser(tsub) -> None:
    d = tsub.add_parser("diagnose", help="reward spread per group, advantage, LoRA update size of a run")
    d.add_argument("--audit", default=None, help="RUN/train/audit (the reward's calls_<pid>.jsonl)")
    d.add_argument("--group-size", type=int, default=None, help="rollouts per prompt (train.group_size)")
    d.add_argument("--split", default="train", help="audit samples of this split only ('' = all)")
    d.add_argument("--adapter", default=None, help="RUN/train/adapter")
    d.set_defaults(func=cmd_diagnose)
