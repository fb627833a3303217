"""Base models and role models: a local HF folder with a chat template, or a hub id that resolves."""

from __future__ import annotations

import json
import os
from pathlib import Path

from llmrnn.models import READY, model_dir, resolve_model


def _offline() -> bool:
    return os.environ.get("HF_HUB_OFFLINE", "").lower() in ("1", "true", "yes")


def chat_template_problem(path: Path, what: str) -> str | None:
    """None when path is an HF model folder whose tokenizer has a chat template."""
    if not (path / "config.json").is_file():
        return f"{what}: {path} is not a HF model folder (no config.json)"
    if not any(path.glob("*.safetensors")) and not any(path.glob("*.bin")):
        return f"{what}: {path} has no weights (*.safetensors)"
    if (path / "chat_template.jinja").is_file() or (path / "chat_template.json").is_file():
        return None
    tok_cfg = path / "tokenizer_config.json"
    try:
        if tok_cfg.is_file() and json.loads(tok_cfg.read_text()).get("chat_template"):
            return None
    except (json.JSONDecodeError, AttributeError):
        return f"{what}: {tok_cfg} is not valid JSON"
    return f"{what}: the tokenizer in {path} has no chat template (tokenizer_config.json chat_template)"


def hub_problem(repo_id: str, revision: str | None, what: str) -> str | None:
    """None when the hub id resolves (with HF_TOKEN for gated repos)."""
    if _offline():
        return (f"{what}: {repo_id} is not downloaded yet and HF_HUB_OFFLINE is set: unset it on a node "
                "that reaches the Hub, or point the config at a local copy")
    try:
        from huggingface_hub import HfApi

        HfApi().model_info(repo_id, revision=revision)
    except Exception as exc:  # noqa: BLE001 - any hub failure is one problem line
        first = (str(exc).strip().splitlines() or [type(exc).__name__])[0][:160]
        return f"{what}: hub id {repo_id} does not resolve ({type(exc).__name__}: {first}); HF_TOKEN for gated repos"
    return None


def _model_problem(name: str, spec: dict) -> str | None:
    what = f"models.{name}"
    prepared = model_dir(name)
    if (prepared / READY).is_file():
        return chat_template_problem(prepared, what)
    source = spec.get("source")
    if source == "local" or spec.get("path"):
        path = Path(spec.get("path") or "")
        if not spec.get("path") or not path.is_dir():
            return f"{what}: local model folder {spec.get('path')} does not exist"
        return chat_template_problem(path, what)
    if source == "hub":
        if not spec.get("repo_id"):
            return f"{what}: source hub needs repo_id"
        return hub_problem(spec["repo_id"], spec.get("revision"), what)
    return None  # pypi_gguf and the like are built by prepare_base_model from a package


def check_models(config: dict) -> list[str]:
    problems = []
    models = config.get("models") or {}
    for name, spec in models.items():
        if isinstance(spec, dict) and (p := _model_problem(name, spec)):
            problems.append(p)
    for role, rcfg in (config.get("roles") or {}).items():
        ref = (rcfg or {}).get("model")
        if not ref or ref in models:
            continue
        path = resolve_model(ref)
        if path.is_dir():
            if p := chat_template_problem(path, f"roles.{role}.model"):
                problems.append(p)
        elif "/" in ref and not path.exists() and ref.count("/") == 1:
            if p := hub_problem(ref, None, f"roles.{role}.model"):
                problems.append(p)
        else:
            problems.append(f"roles.{role}.model: {ref} is neither a model in `models` nor an existing folder")
    return problems
