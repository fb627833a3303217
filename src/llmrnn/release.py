"""Stage `release`: model card + MANIFEST.json for the merged model, PHI guard, optional Hub upload.

`llmrnn release build` reads only its inputs (merged folder, merge_check.json, splits, training metrics,
the rubric file; eval metrics only when passed explicitly, the DAG keeps release independent of eval) and
writes RUN/release/{README.md, MANIFEST.json, upload_receipt.json}.

The bundle (merged model files + card + manifest, nothing else) is COPIED into a private (0700) temp folder
beside the run's folders, each file read-only and hashed as it is copied; the manifest records those hashes,
the PHI guard scans exactly that copy, and exactly those bytes are uploaded after every hash is checked
again (a file changed since the scan, in the copy or in merged/, stops the release). Links and other
non-regular files are refused, never followed; so are file names that are not plain UTF-8. The release
folder's files are opened before anything is uploaded (an unwritable folder stops the release first), and
the receipt is written last: it says what was uploaded, or that nothing was and why. A rerun finds its own
commit on the Hub (same release id) and does not push a second one.
"""

from __future__ import annotations

import argparse
import contextlib
import hashlib
import json
import logging
import os
import platform
import re
import shutil
import stat
import subprocess
import tempfile
import time
from importlib import metadata
from pathlib import Path
from typing import Any

from llmrnn import io, phi_guard, upload
from llmrnn.configcheck import cohort_is_synthetic
from llmrnn.errors import CheckFailed, InputError

log = logging.getLogger(__name__)

PACKAGES = ("llmrnn", "torch", "transformers", "tokenizers", "peft", "trl", "accelerate", "safetensors",
            "huggingface_hub", "datasets", "snakemake", "verl", "vllm")
DEFAULT_TAGS = ["llmrnn", "llm-as-rnn", "grpo", "lora", "merged", "clinical-summarization", "memory-update"]
DEFAULTS: dict[str, Any] = {
    "upload": False,
    "repo_id": None,
    "private": True,
    "license": "apache-2.0",
    "base_model": None,
    "tags": list(DEFAULT_TAGS),
    "commit_message": None,
    "endpoint": None,
    "token_env": "HF_TOKEN",
    "hash_files": True,
    "phi_guard": {"min_words": 8, "min_id_digits": 5, "min_line_words": 3},
}


def settings(release: dict | None) -> dict:
    out = json.loads(json.dumps(DEFAULTS))
    for key, value in (release or {}).items():
        if key == "phi_guard" and isinstance(value, dict):
            out["phi_guard"].update(value)
        elif value is not None or key in ("repo_id", "base_model", "endpoint", "commit_message"):
            out[key] = value
    return out


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


def outcome_reward(knobs: dict) -> bool:
    """The memory head trained with reward.mode outcome: no judge scored a rollout (the card says so)."""
    from llmrnn.reward import asks_judge

    return knobs.get("recipe") != "qa" and not asks_judge(knobs)


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
        "model_source": judge.get("source", "local"),
        "serving_engine": serving.get("engine"),
        "score_method": request.get("score_method", "text"),
        "scale_max": (raw.get("scale") or {}).get("max", 9),
    }


def judge_entry(rubric: str | Path | None, knobs: dict) -> dict:
    """The manifest's judge: the rubric's, or (none given) the plain reason the reward asked no judge."""
    from llmrnn.reward import asks_judge

    if rubric is not None or asks_judge(knobs):
        return rubric_info(rubric)
    why = ("the QA reward asks no judge (qa.reward.weights.judge is 0)" if knobs.get("recipe") == "qa"
           else "reward.mode outcome asks no judge")
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


def _fmt(value: Any) -> str:
    if value is None:
        return "-"
    if isinstance(value, float):
        return f"{value:.4g}"
    if isinstance(value, (list, tuple)):
        return ", ".join(_fmt(v) for v in value) or "[]"
    if isinstance(value, dict):
        return json.dumps(value, sort_keys=True)
    return str(value).replace("|", "\\|").replace("\n", " ")


def _flatten(d: dict, prefix: str = "") -> list[tuple[str, Any]]:
    out = []
    for key, value in d.items():
        name = f"{prefix}{key}"
        if isinstance(value, dict) and value:
            out += _flatten(value, f"{name}.")
        else:
            out.append((name, value))
    return out


def _table(rows: list[tuple[str, Any]], head: tuple[str, str] = ("setting", "value")) -> str:
    lines = [f"| {head[0]} | {head[1]} |", "|---|---|"]
    lines += [f"| `{k}` | {_fmt(v)} |" for k, v in rows]
    return "\n".join(lines)


def _metadata(rel: dict) -> str:
    from huggingface_hub import ModelCardData

    data = ModelCardData(
        base_model=rel.get("base_model") or None,
        library_name="transformers",
        license=rel.get("license"),
        tags=list(rel.get("tags") or []),
        pipeline_tag="text-generation",
        language=["en"],
    )
    return data.to_yaml()


WORKFLOW_STEPS = [
    ("prepare_base_model", "the base model is put on disk as an HF folder (offline)"),
    ("clean_cohort / split_cohort", ("patients with any visit lacking a discharge diagnosis are dropped; "
     "val and train are drawn with a fixed seed, the rest is the test split; overlap is asserted to be zero")),
    ("dump_trajectories", ("the LLM-as-RNN forward pass (prediction, evaluation and memory models) runs over "
     "each training patient; every visit that has two later visits becomes one memory-update row in a "
     "verl-format parquet, carrying what the judge needs about the next visit")),
    ("judge_server / preflight", ("the judge named in the rubric file is served on 127.0.0.1; preflight "
     "proves it answers and that rewards vary before any GPU time is spent")),
    ("train_grpo", ("GRPO with a LoRA on the memory model: each prompt is rolled out G times, the judge "
     "scores every rollout, advantages are taken relative to the group")),
    ("merge_model", ("the adapter is folded into the base weights with PEFT merge_and_unload and verified "
     "(merge_check.json)")),
    ("release", ("this card and MANIFEST.json are generated, the bundle is scanned for cohort data, and it "
     "is uploaded only when asked")),
]

# reward.mode outcome: no judge server; preflight and training score with the outcome reward
OUTCOME_STEPS = {
    "judge_server / preflight": ("preflight", (
        "no judge is started (reward.mode outcome); preflight scores reference memories with the outcome "
        "reward and checks that the training run is possible")),
    "train_grpo": ("train_grpo", (
        "GRPO with a LoRA on the memory model: each prompt is rolled out G times, each rollout is scored by "
        "the share of the next visit's diagnoses its memory names, advantages are taken relative to the group")),
}


def workflow_steps(outcome: bool) -> list[tuple[str, str]]:
    if not outcome:
        return WORKFLOW_STEPS
    return [OUTCOME_STEPS.get(rule, (rule, text)) for rule, text in WORKFLOW_STEPS]


# recipe qa (rules/qa.smk); the shared steps keep the memory head's words
QA_STEPS = [
    WORKFLOW_STEPS[0],
    ("qa_synth", "one multiple-choice question per visit of the synthetic cohort is written (qa.source synthetic)"),
    ("qa_data", ("the QA records are filtered, de-duplicated and split by group with a fixed seed into train, "
     "val and test (plus an optional OOD set); overlap is asserted to be zero; train and val become "
     "verl-format parquet rows and SFT chat rows")),
    ("qa_sft / qa_merge_sft", ("a LoRA SFT warm start on the train answers, folded into the base model and "
     "verified like the final merge; GRPO starts from it")),
    ("judge_server", "the judge named in the rubric file is served on 127.0.0.1 for the reward's judge term"),
    ("qa_preflight", ("batch geometry, prompt lengths, the learning-rate schedule, GPUs and free disk are "
     "checked before any GPU time is spent")),
    ("qa_train_grpo", ("GRPO with a LoRA on the policy: each question is rolled out G times, each rollout is "
     "scored by the QA reward (see Reward), advantages are taken relative to the group")),
    ("merge_model", ("the GRPO adapter is folded into the weights it was trained on (the SFT-merged model when "
     "SFT ran) with PEFT merge_and_unload and verified (merge_check.json)")),
    ("release", ("this card and MANIFEST.json are generated, the bundle is scanned for the QA data's text and "
     "identifiers, and it is uploaded only when asked")),
]


def qa_weights(knobs: dict) -> dict:
    """The QA reward's weights as training used them (qa.rewards fills in the ones not configured)."""
    from llmrnn.qa.rewards import DEFAULT_WEIGHTS

    return {**DEFAULT_WEIGHTS, **((((knobs.get("qa") or {}).get("reward") or {}).get("weights")) or {})}


def qa_workflow_steps(knobs: dict) -> list[tuple[str, str]]:
    """The QA steps this config ran: qa_synth, the SFT warm start and the judge only where configured."""
    from llmrnn.reward import asks_judge  # the one place that decides whether a reward asks the judge

    qa = knobs.get("qa") or {}
    skipped = {"qa_synth": qa.get("source", "synthetic") != "synthetic",
               "qa_sft / qa_merge_sft": not (qa.get("sft") or {}).get("enabled", True),
               "judge_server": not asks_judge(knobs)}
    return [(rule, text) for rule, text in QA_STEPS if not skipped.get(rule)]


def render_card(manifest: dict, rel: dict, repo_id: str) -> str:
    """The model card: one section per helper below, in reading order."""
    knobs = manifest["knobs"]
    qa = knobs.get("recipe") == "qa"
    # the data the model learned from: the QA source for recipe qa (its questions may come from elsewhere)
    source = (knobs.get("qa") or {}) if qa else knobs.get("cohort", {})
    synthetic = source.get("source", "synthetic") == "synthetic" if qa else cohort_is_synthetic(source)
    parts: list[str] = []
    if qa:
        _card_intro_qa(parts, rel, repo_id, knobs.get("qa", {}))
    else:
        _card_intro(parts, rel, repo_id, synthetic)
    _card_identity(parts, manifest)
    _card_model(parts, manifest)
    _card_grpo_and_reward(parts, manifest)
    _card_divergences(parts, manifest)
    _card_data(parts, manifest, synthetic)
    _card_curve_and_eval(parts, manifest)
    if qa:
        _card_usage_qa(parts, repo_id, knobs)
    else:
        _card_usage(parts, repo_id, outcome_reward(knobs))
    _card_limits(parts, manifest, synthetic)
    return "\n".join(parts)


def _card_intro(parts: list[str], rel: dict, repo_id: str, synthetic: bool) -> None:
    parts.append(f"---\n{_metadata(rel)}\n---\n")
    parts.append(f"# {repo_id.split('/')[-1]}\n")
    parts.append(
        "A memory-update model for the LLM-as-RNN clinical pipeline (arXiv 2601.13352). It reads the "
        "previous memory of a patient, the new visit, the prediction made for that visit and its "
        "evaluation, and writes the next memory as `{\"evolving_summary\": \"...\"}`. It was trained with "
        "GRPO on a LoRA adapter and the adapter is already folded into the weights: load it as a plain "
        "transformers causal LM, no PEFT needed. It is a component of that pipeline, not a chat assistant.\n"
    )
    if synthetic:
        parts.append(
            "> **Demo build.** This model was trained on the SYNTHETIC cohort of the embedded llmrnn "
            "config. The run shows that the whole pipeline works end to end; it says nothing about clinical "
            "quality.\n"
        )


def _card_intro_qa(parts: list[str], rel: dict, repo_id: str, qa: dict) -> None:
    """recipe: qa: a question-answering model (SFT warm start + GRPO on verifiable rewards)."""
    parts.append(f"---\n{_metadata(rel)}\n---\n")
    parts.append(f"# {repo_id.split('/')[-1]}\n")
    sft = "a LoRA SFT warm start, then " if (qa.get("sft") or {}).get("enabled", True) else ""
    weights = ", ".join(f"{k} {v}" for k, v in ((qa.get("reward") or {}).get("weights") or {}).items() if v)
    parts.append(
        "A medical question-answering model trained by the llmrnn `qa` recipe: "
        f"{sft}GRPO with verifiable rewards (weights: {weights or 'see the manifest'}). It answers as "
        "`<reasoning>...</reasoning><answer>...</answer>`. The adapters are folded into the weights: load it "
        "as a plain transformers causal LM.\n"
    )
    if qa.get("source", "synthetic") == "synthetic":
        parts.append(
            "> **Demo build.** Trained on multiple-choice questions made from the SYNTHETIC cohort of llmrnn; "
            "it shows that the pipeline works end to end and says nothing about medical quality.\n"
        )


def _chosen_checkpoint(train_summary: str | Path | None) -> dict | None:
    """The checkpoint the merged adapter came from (train summary.json `checkpoint`: step, select, why)."""
    if not train_summary:
        return None
    if not Path(train_summary).is_file():
        raise InputError(f"{train_summary}: training summary not found")
    chosen = io.read_json(train_summary).get("checkpoint") or {}
    return {k: chosen.get(k) for k in ("step", "select", "why", "val_reward")} if chosen else None


def _ran_attention(train_summary: str | Path | None) -> dict | None:
    """The actor attention verl ran with (train summary.json `attention`, verl_cmd.resolve_attention)."""
    if not train_summary or not Path(train_summary).is_file():
        return None
    return io.read_json(train_summary).get("attention")


def _card_divergences(parts: list[str], manifest: dict) -> None:
    """Where this run knowingly differs from the reference run (verl engine only; its settings are the
    reference's otherwise, tests/test_reproduce_fidelity.py)."""
    train_cfg = manifest["knobs"].get("train", {})
    if (train_cfg.get("engine") or manifest["training"].get("engine")) != "verl":
        return
    attn = manifest["training"].get("attention") or {}
    ran = attn.get("ran") or (train_cfg.get("verl") or {}).get("attn_implementation") or "-"
    rows = [
        ("actor attention", (f"{ran}, remove-padding {'on' if attn.get('use_remove_padding') else 'off'} "
                            f"({attn.get('why') or 'train.verl.attn_implementation'}); the reference's verl+vLLM "
                            "image ran flash_attention_2 with remove-padding: the same model, other kernels "
                            "(numerics differ in the last bits)")),
        ("data.seed", (f"{train_cfg.get('seed')} (train.seed): the reference left verl's data.seed unset, so its "
                      "prompt order was an unseeded shuffle that no rerun reproduces; this run's order is fixed")),
    ]
    parts.append("## Differences from the reference run\n")
    parts.append(_table(rows, ("what", "this run")) + "\n")


def _card_identity(parts: list[str], manifest: dict) -> None:
    git, tr = manifest["git"], manifest["training"]
    train_cfg = manifest["knobs"].get("train", {})
    engine = train_cfg.get("engine") or tr.get("engine") or "-"
    dirty = {True: " (uncommitted changes)", False: " (clean)", None: ""}[git.get("dirty")]
    parts.append("## Run identity\n")
    parts.append(_table([
        ("run_name", manifest["run_name"]),
        ("created", manifest["timestamps"]["created_utc"]),
        ("git commit", f"{git.get('sha') or 'unknown'}{dirty}"),
        ("config sha256", manifest["config_sha256"][:16]),
        ("training engine", engine),
        ("training steps logged", tr.get("train_steps")),
        ("last step", tr.get("last_step")),
        *([("checkpoint merged", f"step {ck['step']} (train.select {ck['select']})"), ("why this step", ck["why"])]
          if (ck := tr.get("checkpoint")) else []),
    ], ("field", "value")) + "\n")


def _card_model(parts: list[str], manifest: dict) -> None:
    mc, ad = manifest["merge_check"], manifest["adapter"]
    parts.append("## Base model and LoRA\n")
    targets = ad.get("target_modules")
    alpha_note = (f"{ad.get('alpha')} (the adapter file said {ad.get('original_alpha')!r}; restored from "
                  "train.lora.alpha)" if ad.get("alpha_repaired") else ad.get("alpha"))
    parts.append(_table([
        ("base model", manifest["base_model"]["hub_id"] or Path(manifest["base_model"]["local_dir"] or "-").name),
        ("adapter source", ad.get("source_kind")),
        ("rank r", ad.get("rank")),
        ("alpha", alpha_note),
        ("dropout", ad.get("dropout")),
        ("target modules", sorted(targets) if isinstance(targets, list) else targets),
        ("saved dtype", mc.get("dtype")),
    ]) + "\n")
    parts.append(
        f"Merge verification (merge_check.json): {mc.get('changed_tensors')} of {mc.get('total_tensors')} "
        "weight tensors differ from the base, all of them inside the adapter's target modules; on the probe "
        f"prompts the merged logits differ from base+adapter by at most {_fmt(mc.get('logits_max_abs_diff'))} "
        f"(tolerance {_fmt(mc.get('logits_tolerance'))}), while the adapter itself moves them by "
        f"{_fmt(mc.get('adapter_effect'))}; the folder reloads and generates. verl's own model merger was not "
        "used for the LoRA: it does not fold the adapter in and records lora_alpha as 0.\n"
    )


def _card_grpo_and_reward(parts: list[str], manifest: dict) -> None:
    knobs, judge = manifest["knobs"], manifest["judge"]
    train_cfg = knobs.get("train", {})
    parts.append("## GRPO settings\n")
    parts.append(_table(_flatten({k: v for k, v in train_cfg.items() if k not in ("lora",)}), ("knob", "value")) + "\n")

    parts.append("## Reward\n")
    if knobs.get("recipe") == "qa":
        _card_reward_qa(parts, knobs, judge)
        return
    if outcome_reward(knobs):
        parts.append(_table([
            ("reward", "outcome (no judge): the share of the next visit's diagnoses the memory names"),
            *[(f"reward.{k}", v) for k, v in _flatten(knobs.get("reward", {}))],
        ], ("field", "value")) + "\n")
        parts.append(
            "Each rollout's memory is parsed from the policy output (output without a memory JSON scores 0) "
            "and scored by the share of the next visit's ground-truth diagnoses it names, matched as the "
            "held-out memory recall matches them. No judge model was asked (reward.mode outcome). Every "
            "scored rollout is kept in a private audit log that is never part of a release.\n"
        )
        return
    parts.append(_table([
        *_judge_rows(judge),
        *[(f"reward.{k}", v) for k, v in _flatten(knobs.get("reward", {}))],
    ], ("field", "value")) + "\n")
    parts.append(
        "Each rollout's memory is parsed from the policy output (unparseable JSON gets a small fixed reward) "
        "and shown to the judge together with what happened at the next visit: the prediction made with "
        "that memory, the ground truth and its evaluation. The judge's score is mapped to [0, 1]. Every "
        "judge call is kept in a private audit log that is never part of a release.\n"
    )


def _judge_rows(judge: dict) -> list[tuple[str, Any]]:
    return [
        ("judge model", judge.get("model")),
        ("rubric", judge.get("name")),
        ("rubric file", judge.get("rubric_file")),
        ("rubric sha256", (judge.get("rubric_sha256") or "-")[:16]),
        ("judge serving", judge.get("serving_engine")),
        ("score method", judge.get("score_method")),
    ]


# what each QA reward term pays (llmrnn.qa.rewards); only the terms with a weight > 0 are described
QA_REWARD_TEXT = {
    "exact_match": ("exact_match is 1 when the answer extracted from the response (the last `<answer>` tag, "
                    "else the last `Answer:` line, else the last line) equals the reference after normalisation "
                    "(case, punctuation, articles; numbers compared exactly; an option's text counts as its "
                    "letter), else 0."),
    "format": ("format is 1 when each required tag pair opens and closes exactly once, in order, around "
               "non-blank text, with nothing after the last closing tag, else 0."),
    "fluency": ("fluency is 1 - ln(perplexity) / ln(max perplexity) of the response under the base model, "
                "clipped to [0, 1]."),
    "judge": ("judge is the score the judge named in the rubric file gives the extracted answer against the "
              "reference, mapped to [0, 1]; every judge call is kept in a private audit log that is never part "
              "of a release."),
}


def _card_reward_qa(parts: list[str], knobs: dict, judge: dict) -> None:
    """recipe qa: the weighted sum of verifiable terms; the judge's rows only when its term is on."""
    weights = qa_weights(knobs)
    terms = " + ".join(f"{weight} x {name}" for name, weight in weights.items() if weight)
    parts.append(_table([
        ("reward", f"QA reward: {terms}"),
        *(_judge_rows(judge) if weights["judge"] else []),
        *[(f"qa.reward.{k}", v) for k, v in _flatten((knobs.get("qa") or {}).get("reward") or {})],
    ], ("field", "value")) + "\n")
    parts.append(" ".join(text for name, text in QA_REWARD_TEXT.items() if weights.get(name)) + "\n")


def _card_data(parts: list[str], manifest: dict, synthetic: bool) -> None:
    splits, knobs = manifest["splits"], manifest["knobs"]
    parts.append("## Data\n")
    sizes = splits.get("sizes") or {}
    sha = splits.get("sha256") or {}
    if knobs.get("recipe") == "qa":  # splits.json of the QA data stage: sizes count questions
        qa_source = str((knobs.get("qa") or {}).get("source", "synthetic"))
        source = ("questions made from the synthetic cohort (`llmrnn qa synth`)" if qa_source == "synthetic"
                  else f"`{Path(qa_source.removeprefix('hf:')).name}`")
        field, names, unit = "QA data", ("train", "val", "test", "ood"), "questions"
    else:
        cohort_source = str(knobs.get("cohort", {}).get("source"))
        source = "synthetic cohort (`llmrnn cohort synth`)" if synthetic else f"`{Path(cohort_source).name}`"
        field, names, unit = "cohort", ("train", "val", "test"), "patients"
    parts.append(_table([
        (field, source),
        ("split seed", splits.get("seed")),
        *[(f"{name} {unit}", f"{sizes.get(name)} (sha256 {str(sha.get(name, '-'))[:12]})") for name in names
          if name in sizes],
    ], ("field", "value")) + "\n")
    parts.append(
        "Training rows come from the train split only; the val split is used for validation during "
        "training and the test split is left for the held-out evaluation. No patient text or identifier is "
        "included in this repository (the release bundle is scanned for both before upload).\n"
    )


QA_EVAL_NOTE = (
    "Not part of this release step. After it, the workflow target `eval_heldout` runs `qa_eval_model`, "
    "`qa_eval_gather` and `qa_report`: greedy_pass@1 and sampling_pass@k of the base model, the SFT model "
    "(when SFT ran) and this model on the test split (and the OOD set, when one is given), with chance "
    "baselines and paired tests, and where a judge is configured (qa.eval.judge) the same outcomes graded "
    "by the judge (`qa_judge_eval`); see results/<run>/eval/.\n"
)


def _card_curve_and_eval(parts: list[str], manifest: dict) -> None:
    tr = manifest["training"]
    rw = tr.get("reward_mean") or {}
    parts.append("## Training curve\n")
    if rw:
        parts.append(
            f"Mean reward per step went from {_fmt(rw['first'])} to {_fmt(rw['last'])} over {rw['n']} logged "
            f"steps (min {_fmt(rw['min'])}, max {_fmt(rw['max'])})."
            + (f" Validation reward: {_fmt(tr['val_reward_mean']['first'])} -> "
               f"{_fmt(tr['val_reward_mean']['last'])}." if tr.get("val_reward_mean") else "")
            + "\n"
        )
        parts.append(_table([(f"step {c['step']}", c["reward_mean"]) for c in tr.get("curve", [])],
                            ("step", "reward_mean")) + "\n")
    else:
        parts.append("No training rewards were logged.\n")

    # The release never waits for (or reruns with) the evaluation, so the card only points at it.
    parts.append("## Held-out evaluation\n")
    if manifest["knobs"].get("recipe") == "qa":
        parts.append(QA_EVAL_NOTE)
        return
    parts.append(
        "Not part of this release step. The workflow target `eval_heldout` compares this model with the "
        "base model (and baselines) as the memory model on the test split; see results/<run>/eval/.\n"
    )


def _numbered(steps: list[tuple[str, str]]) -> str:
    return "\n".join(f"{i}. `{rule}`: {text}." for i, (rule, text) in enumerate(steps, 1))


def _load_code(repo_id: str) -> str:
    return ("from transformers import AutoModelForCausalLM, AutoTokenizer\n"
            f"tok = AutoTokenizer.from_pretrained(\"{repo_id}\")\n"
            f"model = AutoModelForCausalLM.from_pretrained(\"{repo_id}\")\n")


def _card_usage(parts: list[str], repo_id: str, outcome: bool = False) -> None:
    parts.append("## How the workflow made it\n")
    parts.append(_numbered(workflow_steps(outcome)) + "\n")

    parts.append("## Intended use\n")
    parts.append(
        "Use it as the memory model of an LLM-as-RNN run, with the same memory-update prompt it was trained "
        "on (config/prompts in llmrnn). In an llmrnn config:\n\n"
        "```yaml\nmodels:\n  memory: <this repo id or a local copy>\n```\n\n"
        "Or directly:\n\n"
        f"```python\n{_load_code(repo_id)}```\n"
    )


def _card_usage_qa(parts: list[str], repo_id: str, knobs: dict) -> None:
    from llmrnn.qa.data import SYSTEM_PROMPT

    parts.append("## How the workflow made it\n")
    parts.append(_numbered(qa_workflow_steps(knobs)) + "\n")
    parts.append("The evaluation (`qa_eval_model`, `qa_eval_gather`, `qa_report`) runs after the release, not "
                 "before it: see Held-out evaluation.\n")
    system = ((knobs.get("qa") or {}).get("prompt") or {}).get("system") or SYSTEM_PROMPT
    fence = "````" if "```" in system else "```"  # a prompt that holds a fence must not close ours
    parts.append("## Intended use\n")
    parts.append(
        "Ask it medical questions with the system prompt it was trained with; it answers as "
        "`<reasoning>...</reasoning><answer>...</answer>` and the text inside `<answer>` is its answer. "
        f"The system prompt:\n\n{fence}text\n{system}\n{fence}\n\n"
        "The user turn holds the context (if any), the question and, for multiple choice, the options as "
        "`A) ...` lines with \"Answer with the letter of one option.\" (llmrnn.qa.data.user_prompt). With "
        "transformers:\n\n"
        f"```python\n{_load_code(repo_id)}"
        "# system_prompt: the text above; question: the user turn\n"
        "messages = [{\"role\": \"system\", \"content\": system_prompt}, {\"role\": \"user\", \"content\": question}]\n"
        "inputs = tok.apply_chat_template(messages, add_generation_prompt=True, return_tensors=\"pt\")\n```\n"
    )


def _card_limits(parts: list[str], manifest: dict, synthetic: bool) -> None:
    tr, sizes = manifest["training"], manifest["splits"].get("sizes") or {}
    parts.append("## Limitations\n")
    limits = [
        "Research artifact. It must not be used for the care of real patients.",
        *(_limits_qa if manifest["knobs"].get("recipe") == "qa" else _limits_memory)(manifest["knobs"], sizes),
        "No safety tuning was added on top of the base model.",
    ]
    if synthetic:
        limits.insert(0, "Synthetic demo data: the model learned nothing clinical; the run checks the mechanics.")
    if not (tr.get("val_reward_mean")):
        limits.append("No validation reward was logged during training.")
    parts.append("\n".join(f"- {line}" for line in limits) + "\n")

    parts.append("## Reproducibility\n")
    parts.append(
        "`MANIFEST.json` beside this card records the git commit, the sha256 of the configuration and every "
        "knob in it, the sha256 of each split, the judge model and rubric hash, package versions, the merge "
        "check and the sha256 of every model file. Re-running `snakemake --configfile <config> all` in llmrnn at "
        "that commit rebuilds the same pipeline.\n"
    )


def _limits_memory(knobs: dict, sizes: dict) -> list[str]:
    return [
        (
            f"Trained on {sizes.get('train', '?')} patients; how it behaves on other cohorts, hospitals or "
            "note styles is unknown."
        ),
        (
            "The reward is a text match of the memory against the next visit's diagnoses; a memory that names "
            "them is not necessarily a good clinical summary."
            if outcome_reward(knobs) else
            "The reward is the opinion of one judge model under one rubric; a higher reward is not the same "
            "as better downstream predictions unless the held-out evaluation shows it."
        ),
        (
            "Prompts other than the memory-update template it was trained on are unsupported and may yield "
            "output that is not valid JSON."
        ),
    ]


QA_LIMIT_TERMS = {
    "exact_match": "an exact match of the extracted answer against the reference (a correct answer worded "
                   "differently from the reference scores 0)",
    "format": "a format term (the answer tags, not what is inside them)",
    "fluency": "a fluency term (perplexity under the base model, not correctness)",
    "judge": "a judge term",
}

QA_JUDGE_LIMIT = ("The judge term is the opinion of one judge model under one rubric; a higher judge score is "
                  "not the same as a correct answer unless the held-out evaluation shows it.")


def _limits_qa(knobs: dict, sizes: dict) -> list[str]:
    """recipe qa: what its reward measures (only the terms that were on) and the prompt it needs."""
    weights = qa_weights(knobs)
    terms = ", plus ".join(text for name, text in QA_LIMIT_TERMS.items() if weights.get(name))
    return [
        (f"Trained on {sizes.get('train', '?')} questions; how it answers questions from other sources, "
         "specialties or formats is unknown."),
        f"The reward is {terms}; nothing in it checks that the reasoning is right.",
        *([QA_JUDGE_LIMIT] if weights["judge"] else []),
        ("Prompts other than the system prompt it was trained with are unsupported; without it the answer may "
         "not come inside the `<answer>` tags."),
    ]


# ----------------------------------------------------------------------------- staging + upload
STAGE_PREFIX = ".bundle."
STAGE_SUFFIX = ".tmp"
STAGE_NAME = re.compile(re.escape(STAGE_PREFIX) + r"[A-Za-z0-9_]{8}" + re.escape(STAGE_SUFFIX))
COPY_CHUNK = 1 << 20
# the release's own card and manifest; a base model's README.md copied into merged/ is replaced, not merged
RELEASE_TEXTS = ("README.md", "MANIFEST.json")


def printable_name(name: str) -> str:
    """A file name safe to put on one line of an error: undecodable bytes and control characters escaped."""
    text = os.fsencode(name).decode("utf-8", "backslashreplace")
    return "".join(ch if ch.isprintable() else ascii(ch)[1:-1] for ch in text)


def name_problem(rel: str) -> str | None:
    """Why a bundle path cannot go to the Hub as it is (None when it can): it must be UTF-8, printable and
    use / only. Checked while staging, before any repo is created."""
    try:
        rel.encode("utf-8")
    except UnicodeEncodeError:
        return "file name is not UTF-8"
    if any(not ch.isprintable() for ch in rel):
        return "file name holds control or invisible characters"
    if "\\" in rel:
        return "file name holds a backslash"
    return None


def _copy_private(src: Path, dst: Path, shown: str) -> dict:
    """Copy one regular file (never a link, fifo or device: O_NOFOLLOW, then fstat) into the stage as a
    new read-only file; size and sha256 of the bytes copied."""
    flags = os.O_RDONLY | getattr(os, "O_NOFOLLOW", 0) | getattr(os, "O_NONBLOCK", 0)  # a fifo must not block
    try:
        fd = os.open(src, flags)
    except OSError as exc:
        what = "a symbolic link" if src.is_symlink() else f"cannot be read ({exc.strerror})"
        raise InputError(f"{shown}: {what}; a release copies regular files only and never follows a link") from None
    with os.fdopen(fd, "rb") as fh:
        if not stat.S_ISREG(os.fstat(fh.fileno()).st_mode):
            raise InputError(f"{shown}: not a regular file; refused (a release holds regular files only)")
        digest, size = hashlib.sha256(), 0
        with open(os.open(dst, os.O_WRONLY | os.O_CREAT | os.O_EXCL | getattr(os, "O_NOFOLLOW", 0), 0o600),
                  "wb") as out:
            while chunk := fh.read(COPY_CHUNK):
                out.write(chunk)
                digest.update(chunk)
                size += len(chunk)
            os.fchmod(out.fileno(), 0o400)
    return {"bytes": size, "sha256": digest.hexdigest()}


def _walk_regular(folder: Path, shown: str, rel: str = "") -> list[tuple[str, Path]]:
    """(path relative to `folder`, path) of every file under `folder`, hidden names left out; a link, a
    fifo, a device or a socket anywhere is refused (InputError), a name that is not plain UTF-8 too."""
    out = []
    with os.scandir(folder) as entries:
        for entry in sorted(entries, key=lambda e: os.fsencode(e.name)):
            if entry.name.startswith("."):
                continue
            sub = f"{rel}{entry.name}"
            where = f"{shown}/{printable_name(sub)}"
            if problem := name_problem(sub):
                raise InputError(f"{where}: {problem}; rename it (nothing was uploaded)")
            if entry.is_symlink():
                raise InputError(f"{where}: a symbolic link; a release copies regular files only and never "
                                 "follows a link")
            if entry.is_dir(follow_symlinks=False):
                out += _walk_regular(Path(entry.path), shown, f"{sub}/")
            elif entry.is_file(follow_symlinks=False):
                out.append((sub, Path(entry.path)))
            else:
                raise InputError(f"{where}: not a regular file (a fifo, device or socket); refused")
    return out


LOCK_FILE = ".release.lock"


@contextlib.contextmanager
def run_lock(run_dir: Path):
    """An exclusive lock on the run's releases (flock on RUN/.release.lock, never waited for): a second
    release of the same run at the same time stops with one line naming the first's pid, before it stages,
    removes a stage or uploads anything. The lock goes with the process (also when it is killed)."""
    import fcntl

    run_dir.mkdir(parents=True, exist_ok=True)
    path = run_dir / LOCK_FILE
    fd = os.open(path, os.O_RDWR | os.O_CREAT | getattr(os, "O_NOFOLLOW", 0), 0o600)
    try:
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            holder = os.pread(fd, 32, 0).decode(errors="replace").strip() or "?"
            raise CheckFailed(f"another release of {run_dir} is running (pid {holder}); nothing was staged or "
                              "uploaded, rerun when it is done") from None
        os.ftruncate(fd, 0)
        os.pwrite(fd, f"{os.getpid()}\n".encode(), 0)
        yield
    finally:
        os.close(fd)  # releases the lock


def remove_stale_stages(parent: Path) -> None:
    """Stage folders of an earlier release that was killed (each holds a full copy of the model)."""
    for old in parent.glob(f"{STAGE_PREFIX}*{STAGE_SUFFIX}"):
        if STAGE_NAME.fullmatch(old.name) and old.is_dir() and not old.is_symlink():
            shutil.rmtree(old, ignore_errors=True)


def stage_model_files(merged: Path, parent: Path) -> tuple[Path, dict[str, dict]]:
    """A private temp folder (0700) in `parent` holding a read-only copy of every merged model file, and
    the size and sha256 of each copy (what the manifest records, the guard scans and the upload sends)."""
    parent.mkdir(parents=True, exist_ok=True)
    remove_stale_stages(parent)
    files = [(rel, src) for rel, src in _walk_regular(merged, str(merged)) if rel not in RELEASE_TEXTS]
    stage = Path(tempfile.mkdtemp(prefix=STAGE_PREFIX, suffix=STAGE_SUFFIX, dir=parent))  # mode 0700
    try:
        staged = {}
        for rel, src in files:
            dst = stage / rel
            dst.parent.mkdir(parents=True, exist_ok=True, mode=0o700)
            staged[rel] = _copy_private(src, dst, f"{merged}/{rel}")
    except BaseException:
        _remove_stage(stage)
        raise
    return stage, staged


def stage_text(stage: Path, rel: str, text: str) -> dict:
    data = text.encode("utf-8")
    path = stage / rel
    with open(os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL | getattr(os, "O_NOFOLLOW", 0), 0o400), "wb") as fh:
        fh.write(data)
    return {"bytes": len(data), "sha256": io.sha256_bytes(data)}


def _remove_stage(stage: Path) -> None:
    shutil.rmtree(stage, ignore_errors=True)  # read-only files in owner-writable folders: removable


def sources_unchanged(merged: Path, staged: dict[str, dict]) -> None:
    """merged/ still holds exactly what was copied and scanned: no file changed, appeared or vanished
    (else the release would describe a folder that no longer exists); CheckFailed naming the file."""
    now = {rel: src for rel, src in _walk_regular(merged, str(merged)) if rel not in RELEASE_TEXTS}
    for rel in sorted(set(now) | set(staged)):
        if rel not in now or rel not in staged:
            how = "vanished" if rel not in now else "appeared"
            raise CheckFailed(f"{merged}/{printable_name(rel)}: {how} while the release was being checked; "
                              "nothing uploaded, rerun the release")
        if io.sha256_file(now[rel]) != staged[rel]["sha256"]:
            raise CheckFailed(f"{merged}/{printable_name(rel)}: changed after the PHI guard scanned it; nothing "
                              "uploaded, rerun the release")


def release_id(staged: dict[str, dict], manifest: dict, rel: dict, repo_id: str) -> str:
    """What identifies this release on the Hub: the model files' hashes and the card and manifest as they
    would be without their creation time (a rerun of the same release has the same id)."""
    timeless = json.loads(json.dumps(manifest))
    timeless["timestamps"]["created_utc"] = None
    card = render_card(timeless, rel, repo_id)
    identity = {"model_files": {k: v["sha256"] for k, v in sorted(staged.items())},
                "card": io.sha256_bytes(card.encode()), "manifest": config_hash(timeless)}
    return config_hash(identity)


@contextlib.contextmanager
def _release_outputs(*paths: str | Path):
    """Temp files beside each output, created NOW (an unwritable release folder stops the release before
    anything is scanned or uploaded); each is renamed into place only when the block succeeds. On a
    failure, folders this made are removed again when empty: nothing is left half-written."""
    made = [d for d in dict.fromkeys(q for p in paths for q in [Path(p).parent, *Path(p).parent.parents])
            if not d.exists()]
    try:
        with contextlib.ExitStack() as stack:
            temps = []
            for path in paths:
                try:
                    temps.append(stack.enter_context(io.atomic_path(path)))
                except OSError as exc:
                    raise InputError(f"{Path(path).parent}: cannot write the release there ({exc.strerror}); "
                                     "nothing was uploaded") from None
            yield temps
    except BaseException:
        for folder in sorted(made, key=lambda d: len(d.parts), reverse=True):
            with contextlib.suppress(OSError):
                folder.rmdir()
        raise


def build_release(*, merged: str | Path, merge_check: str | Path, splits: str | Path, split_files: list[str],
                  metrics: str | Path | None, rubric: str | Path | None,
                  cfg: dict, card_out: str | Path, manifest_out: str | Path, receipt_out: str | Path,
                  split_format: str = "cohort", train_summary: str | Path | None = None) -> dict:
    """`split_files` are what must not leak: the cohort splits (`split_format` cohort) or the QA data
    stage's record files (qa)."""
    merged = Path(merged)
    secrets = upload.env_problems({"release": cfg.get("release") or {}, "knobs": cfg.get("knobs") or {}})
    if secrets:  # before anything is written: the manifest copies both sections
        raise InputError(f"release --cfg: {secrets[0]}")
    # what is written (manifest, card, receipt, logs) never holds the user:password@ of a URL; the Hub
    # authenticates with the token, so the endpoint is called without them (httpx would log them)
    rel = upload.redact_credentials(settings(cfg.get("release")))
    endpoint = upload.without_userinfo(rel["endpoint"] or os.environ.get("HF_ENDPOINT") or None)
    run_name = cfg.get("run_name") or "run"
    knobs = upload.redact_credentials(cfg.get("knobs") or {})
    if not (merged / "config.json").is_file():
        raise InputError(f"{merged}: merged model folder has no config.json")
    check = io.read_json(merge_check)
    if not check.get("ok"):
        raise InputError(f"{merge_check}: ok is not true; the merge check failed, nothing to release")
    repo_id = rel["repo_id"] or f"llmrnn-{run_name}-merged"
    inputs = {"merge_check": str(merge_check), "splits": str(splits), "metrics": str(metrics) if metrics else None,
              "rubric": str(rubric) if rubric else None}
    chosen = _chosen_checkpoint(train_summary)  # before anything is written: a missing summary is one line
    # the receipt's temp is entered first, so it is renamed into place last
    with _release_outputs(receipt_out, card_out, manifest_out) as (receipt_tmp, card_tmp, manifest_tmp):
        run_dir = Path(card_out).parent.parent
        locked = contextlib.ExitStack()  # the run's lock: from before any stage is made or removed to the end
        try:
            locked.enter_context(run_lock(run_dir))
            stage, staged = stage_model_files(merged, run_dir)
        except BaseException as exc:
            locked.close()
            if not isinstance(exc, OSError):
                raise  # a full disk, an unwritable run folder: nothing was scanned or uploaded
            raise InputError(f"{Path(card_out).parent.parent}: cannot stage the release bundle there "
                             f"({exc.strerror or type(exc).__name__}); nothing was uploaded") from None
        try:
            receipt = _check_and_upload(
                stage, staged, merged=merged, rel=rel, endpoint=endpoint, repo_id=repo_id, run_name=run_name,
                split_files=split_files, split_format=split_format, card_tmp=card_tmp, manifest_tmp=manifest_tmp,
                manifest=upload.redact_credentials(build_manifest(
                    run_name=run_name, knobs=knobs, rel=rel, merge_check=check, splits=io.read_json(splits),
                    metrics={**metrics_summary(metrics), "checkpoint": chosen,
                             "attention": _ran_attention(train_summary)}, model_files=staged, inputs=inputs,
                    rubric=judge_entry(rubric, knobs),
                )),
            )
            try:
                receipt_tmp.write_text(io.json_text(upload.redact_credentials(receipt)), encoding="utf-8")
            except OSError as exc:
                done = ("it was uploaded; a rerun finds that commit and pushes nothing again"
                        if receipt["uploaded"] else "nothing was uploaded")
                raise InputError(f"{receipt_out}: cannot write the receipt ({exc.strerror}); {done}") from None
        finally:
            _remove_stage(stage)
            locked.close()
    log.info("release: card %s, manifest %s, uploaded=%s", card_out, manifest_out, receipt["uploaded"])
    return receipt


def _check_and_upload(stage: Path, staged: dict[str, dict], *, merged: Path, rel: dict, endpoint: str | None,
                      repo_id: str, run_name: str, split_files: list[str], split_format: str, card_tmp: Path,
                      manifest_tmp: Path, manifest: dict) -> dict:
    """Card and manifest into the stage, the PHI guard over the stage, the card and manifest temps filled
    with the staged text, then (when asked) the upload of exactly the staged bytes; returns the receipt."""
    card = upload.redact_credentials(render_card(manifest, rel, repo_id))
    manifest_text = json.dumps(manifest, indent=2) + "\n"
    files = {name: f["sha256"] for name, f in staged.items()}
    files["README.md"] = stage_text(stage, "README.md", card)["sha256"]
    files["MANIFEST.json"] = stage_text(stage, "MANIFEST.json", manifest_text)["sha256"]
    guard = phi_guard.scan_bundle(stage, split_files, **rel["phi_guard"], split_format=split_format)
    phi_guard.enforce(guard, f"{stage.name} (merged model + card + manifest)")
    try:  # before the upload: a full disk stops the release here, not after a push
        card_tmp.write_text(card, encoding="utf-8")
        manifest_tmp.write_text(manifest_text, encoding="utf-8")
    except OSError as exc:
        raise InputError(f"{card_tmp.parent}: cannot write the card and manifest ({exc.strerror}); nothing "
                         "was uploaded") from None
    receipt: dict[str, Any] = {"uploaded": False, "repo_id": repo_id, "private": rel["private"],
                               "created_utc": utc(), "files": sorted(manifest["model_files"]) + ["README.md", "MANIFEST.json"],
                               "sha256": dict(sorted(files.items())), "phi_guard": guard}
    token = upload.token_from_env(rel["token_env"])
    if not rel["upload"]:
        receipt["reason"] = "release.upload is off (set release.upload: true and export a Hub token to upload)"
    elif token is None:
        receipt["reason"] = f"release.upload is on but ${rel['token_env']} is not set; nothing was uploaded"
        log.warning("%s", receipt["reason"])
    elif upload.offline():
        receipt["reason"] = "release.upload is on but HF_HUB_OFFLINE is set; nothing was uploaded"
        log.warning("%s", receipt["reason"])
    else:
        sources_unchanged(merged, staged)  # merged/ is still what was copied and scanned
        result = upload.upload_bundle(
            stage, repo_id, token=token, files=files, release_id=release_id(staged, manifest, rel, repo_id),
            private=rel["private"], endpoint=endpoint,
            commit_message=rel["commit_message"] or f"llmrnn release of run {run_name}",
        )
        receipt.update(uploaded=True, **result)
        receipt["reason"] = ("already uploaded: the repo holds a commit of this release id; nothing pushed again"
                             if result["already_uploaded"] else "uploaded")
    return receipt


# ----------------------------------------------------------------------------- CLI
def _cmd_build(args: argparse.Namespace) -> None:
    build_release(
        merged=args.merged, merge_check=args.merge_check, splits=args.splits, split_files=args.split_files,
        metrics=args.metrics, rubric=args.rubric or None, cfg=args.cfg,
        card_out=args.card, manifest_out=args.manifest, receipt_out=args.receipt, split_format=args.split_format,
        train_summary=args.train_summary,
    )


def _cmd_guard(args: argparse.Namespace) -> None:
    report = phi_guard.scan_bundle(args.bundle, args.split_files, args.min_words, args.min_id_digits,
                                   args.min_line_words, split_format=args.split_format)
    print(json.dumps(report, indent=2))
    phi_guard.enforce(report, args.bundle)


def register(sub: argparse._SubParsersAction) -> None:
    from llmrnn.cli import json_arg

    release = sub.add_parser("release", help="model card, manifest, PHI guard and optional Hub upload")
    rsub = release.add_subparsers(dest="release_command", required=True)
    p = rsub.add_parser("build", help="write README.md (card), MANIFEST.json, upload_receipt.json")
    p.add_argument("--merged", required=True)
    p.add_argument("--merge-check", required=True)
    p.add_argument("--splits", required=True, help="splits.json (sizes, seed, sha256)")
    p.add_argument("--split-files", nargs="+", required=True,
                   help="what must not leak (PHI guard): the cohort's train/val/test split JSONs, or the QA "
                        "data stage's train/val/test/ood JSONL (--split-format qa)")
    p.add_argument("--split-format", choices=sorted(phi_guard.SPLIT_FORMATS), default="cohort")
    p.add_argument("--metrics", help="RUN/train/metrics.jsonl")
    p.add_argument("--train-summary", default=None,
                   help="RUN/train/summary.json (names the checkpoint merged and why)")
    p.add_argument("--rubric", help="the rubric YAML (judge model)")
    p.add_argument("--cfg", type=json_arg, required=True, help='JSON: {"run_name", "release", "knobs"}')
    p.add_argument("--card", required=True)
    p.add_argument("--manifest", required=True)
    p.add_argument("--receipt", required=True)
    p.set_defaults(func=_cmd_build)

    p = rsub.add_parser("guard", help="scan a folder for cohort or QA identifiers/text (exit 3 on a finding)")
    p.add_argument("bundle")
    p.add_argument("--split-files", nargs="+", required=True)
    p.add_argument("--split-format", choices=sorted(phi_guard.SPLIT_FORMATS), default="cohort")
    p.add_argument("--min-words", type=int, default=8)
    p.add_argument("--min-id-digits", type=int, default=5)
    p.add_argument("--min-line-words", type=int, default=3, help="a whole cohort line/list item this long is a finding")
    p.set_defaults(func=_cmd_guard)
