"""MANIFEST.json: the release settings, the code and package versions, the knobs, metrics and rubric a
merged model was made with."""

from __future__ import annotations

import hashlib
import json
import platform
import subprocess
import time
from importlib import metadata
from pathlib import Path
from typing import Any

from llmrnn import io
from llmrnn.errors import InputError
from llmrnn.reward import asks_judge, reward_mode, reward_settings
from llmrnn.rubric import JUDGE_SOURCE
from llmrnn.runconfig import filled

PACKAGES = ("llmrnn", "torch", "transformers", "tokenizers", "peft", "trl", "accelerate", "safetensors",
            "huggingface_hub", "datasets", "snakemake", "verl", "vllm")
# the release section's defaults are the models' (llmrnn.settings.Release); a null value means "the default"
# except for the keys whose null has a meaning of its own
NULL_MEANS_SOMETHING = ("repo_id", "base_model", "endpoint", "commit_message")


def settings(release: dict | None) -> dict:
    given = {k: v for k, v in (release or {}).items() if v is not None or k in NULL_MEANS_SOMETHING}
    return filled("release", given)


def utc(ts: float | None = None) -> str:
    return time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(ts))


# ----------------------------------------------------------------------------- facts gathered
def git_state(*dirs: str | Path) -> dict:
    """SHA and dirty flag of the first folder that is inside a git work tree."""
    for d in dirs:
        try:
            sha = subprocess.run(["git", "-C", str(d), "rev-parse", "HEAD"], capture_output=True, text=True,
                                 timeout=30, check=False)
            if sha.returncode != 0:
                continue
            status = subprocess.run(["git", "-C", str(d), "status", "--porcelain"], capture_output=True,
                                    text=True, timeout=60, check=False)
        except (OSError, subprocess.TimeoutExpired):
            continue
        changed = [line for line in status.stdout.splitlines() if line.strip()]
        return {"sha": sha.stdout.strip(), "dirty": bool(changed), "changed_paths": len(changed), "where": str(d)}
    return {"sha": None, "dirty": None, "note": "not run from a git work tree"}


def package_versions() -> dict:
    out: dict[str, str | None] = {"python": platform.python_version()}
    for name in PACKAGES:
        try:
            out[name] = metadata.version(name)
        except metadata.PackageNotFoundError:
            out[name] = None
    return out


def config_hash(knobs: dict) -> str:
    return hashlib.sha256(json.dumps(knobs, sort_keys=True, separators=(",", ":")).encode()).hexdigest()


def metrics_summary(path: str | Path | None) -> dict:
    """Summary of RUN/train/metrics.jsonl (rows: step, kind train|val, engine, reward_mean, ...)."""
    if not path or not Path(path).is_file():
        return {"rows": 0, "note": "no metrics file"}
    rows = io.read_jsonl(path)
    train = [r for r in rows if r.get("kind", "train") == "train"]
    val = [r for r in rows if r.get("kind") == "val"]

    def series(rs: list[dict], key: str) -> list[tuple[int, float]]:
        return [(int(r.get("step", i)), float(r[key])) for i, r in enumerate(rs) if isinstance(r.get(key), (int, float))]

    out: dict[str, Any] = {
        "rows": len(rows),
        "train_steps": len(train),
        "last_step": max((int(r.get("step", 0)) for r in rows), default=0),
        "engine": next((r.get("engine") for r in rows if r.get("engine")), None),
    }
    for key, rs in (("reward_mean", train), ("kl", train), ("judge_fallback_rate", train),
                    ("val_reward_mean", val)):
        s = series(rs, key)
        if s:
            values = [v for _, v in s]
            out[key] = {"first": values[0], "last": values[-1], "min": min(values), "max": max(values),
                        "mean": sum(values) / len(values), "n": len(values)}
    rewards = series(train, "reward_mean")
    if rewards:
        stride = max(1, len(rewards) // 8)
        picks = rewards[::stride] + ([rewards[-1]] if (len(rewards) - 1) % stride else [])
        out["curve"] = [{"step": s, "reward_mean": round(v, 4)} for s, v in picks]
    return out


def own_reward(knobs: dict) -> dict | None:
    """Your own reward (reward.custom), by file name, function and content hash (the training job's code
    identity hashed the same file: Snakemake reruns training, then release, when it changes); None: none."""
    custom = (knobs.get("reward") or {}).get("custom") or {}
    if not custom.get("path"):
        return None
    path = Path(custom["path"])
    return {"path": str(path), "name": custom.get("name") or "compute_score",
            "sha256": io.sha256_file(path) if path.is_file() else None}


def rubric_info(path: str | Path | None) -> dict:
    """Judge model and rubric identity from the rubric file (the single source of truth for the judge)."""
    if not path:
        return {"rubric_file": None, "model": None, "note": "no rubric file given"}
    p = Path(path)
    raw = io.read_yaml(p, "rubric file") or {}  # the one YAML policy
    if not isinstance(raw, dict):
        raise InputError(f"{p}: expected a mapping at top level")
    judge = raw.get("judge") or {}
    serving = raw.get("serving") or {}
    request = raw.get("request") or {}
    return {
        "rubric_file": str(p),
        "rubric_sha256": io.sha256_file(p),
        "name": raw.get("name"),
        "model": judge.get("model"),
        "model_source": judge.get("source", JUDGE_SOURCE),
        "serving_engine": serving.get("engine"),
        "score_method": request.get("score_method", "text"),
        "scale_max": (raw.get("scale") or {}).get("max", 9),
    }


def judge_entry(rubric: str | Path | None, knobs: dict) -> dict:
    """The manifest's judge: the rubric's, or (none given) the plain reason the reward asked no judge."""
    if rubric is not None or asks_judge(knobs):
        return rubric_info(rubric)
    why = ("the QA reward asks no judge (qa.reward.weights.judge is 0)" if knobs.get("recipe") == "qa"
           else reward_mode(reward_settings(knobs.get("reward") or {})).no_judge_note)
    return {"rubric_file": None, "model": None, "note": why}


def file_hashes(staged: dict[str, dict], enabled: bool) -> dict:
    """The manifest's model_files: size and sha256 of each file as it was copied into the bundle."""
    return {rel: {"bytes": f["bytes"], "sha256": f["sha256"] if enabled else None} for rel, f in sorted(staged.items())}


# ----------------------------------------------------------------------------- manifest + card
def build_manifest(*, run_name: str, knobs: dict, rel: dict, merge_check: dict, splits: dict, metrics: dict,
                   rubric: dict, model_files: dict[str, dict], inputs: dict) -> dict:
    checks = merge_check.get("checks", {})
    adapter = checks.get("adapter_config", {})
    return {
        "schema": "llmrnn.manifest/1",
        "run_name": run_name,
        "timestamps": {
            "created_utc": utc(),
            "merge_checked_utc": merge_check.get("checked_utc"),
            "training_metrics_utc": utc(Path(inputs["metrics"]).stat().st_mtime) if inputs.get("metrics") else None,
            "splits_utc": utc(Path(inputs["splits"]).stat().st_mtime),
        },
        "git": git_state(Path.cwd(), Path(__file__).resolve().parent),
        "config_sha256": config_hash(knobs),
        "knobs": knobs,
        "release": dict(rel),  # token_env is the NAME of the variable; the token itself is never recorded
        "splits": {
            "seed": splits.get("seed"),
            "sizes": splits.get("sizes"),
            "visits": splits.get("visits"),
            "sha256": splits.get("sha256"),
            "source_sha256": splits.get("source_sha256"),
        },
        "judge": rubric,
        "own_reward": own_reward(knobs),
        "base_model": {
            "hub_id": rel.get("base_model"),
            "local_dir": merge_check.get("base"),
        },
        "adapter": {
            "source_kind": merge_check.get("source_kind"),
            "rank": adapter.get("rank"),
            "alpha": adapter.get("alpha"),
            "alpha_repaired": adapter.get("alpha_repaired"),
            "original_alpha": adapter.get("original_alpha"),
            "dropout": adapter.get("dropout"),
            "target_modules": adapter.get("target_modules"),
        },
        "merge_check": {
            "ok": merge_check.get("ok"),
            "dtype": merge_check.get("dtype"),
            "changed_tensors": checks.get("weights_differ", {}).get("changed_tensors"),
            "total_tensors": checks.get("weights_differ", {}).get("total_tensors"),
            "logits_max_abs_diff": checks.get("logits_match", {}).get("max_abs_diff"),
            "logits_tolerance": checks.get("logits_match", {}).get("tolerance"),
            "adapter_effect": checks.get("logits_match", {}).get("adapter_effect"),
            "sha256": io.sha256_file(inputs["merge_check"]),
        },
        "training": metrics,
        "packages": package_versions(),
        "packages_note": "versions in the environment that ran `llmrnn release`; training may use its own env",
        "inputs_sha256": {k: io.sha256_file(v) for k, v in inputs.items() if v and Path(v).is_file()},
        "model_files": file_hashes(model_files, rel["hash_files"]),
    }
