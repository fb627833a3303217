"""Hub upload of a checked release bundle with huggingface_hub (create_repo + upload_folder).

The token comes only from the environment (release.token_env, default HF_TOKEN); it is passed to
huggingface_hub in memory and never written to a file, a log line or an error message.
"""

from __future__ import annotations

import logging
import os
import re
from pathlib import Path
from typing import Any

from llmrnn.errors import CheckFailed

log = logging.getLogger(__name__)


ENV_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")
# prefixes of common credentials (Hub, OpenAI, GitHub, GitLab, Slack, AWS, Google, JWT)
KEY_PREFIX = re.compile(r"(hf_|sk-|sk_|ghp_|gho_|ghs_|github_pat_|glpat-|xox[abprs]-|AKIA|AIza|eyJ)[A-Za-z0-9_-]{12,}")


def env_name_problem(value: Any) -> str | None:
    """Why `value` cannot be the NAME of an environment variable (None when it can). The message never
    repeats the value: a key typed in place of the name must not reach a log or a file."""
    if value is None:
        return None
    if not isinstance(value, str) or not ENV_NAME.fullmatch(value):
        return "is not an environment variable NAME ([A-Za-z_][A-Za-z0-9_]*)"
    mixed = any(c.islower() for c in value) and any(c.isupper() for c in value) and any(c.isdigit() for c in value)
    # names are words joined by _; a key is a long run where letters and digits alternate at random
    random_run = any(re.search(r"[A-Za-z]", run) and re.search(r"\d", run)
                     for run in re.findall(r"[A-Za-z0-9]{16,}", value))
    if KEY_PREFIX.match(value) or (len(value) >= 20 and mixed) or random_run or len(value) > 64:
        return "looks like a key, not the NAME of the variable that holds it"
    return None


def env_problems(tree: Any, path: str = "") -> list[str]:
    """Every `*_env` value anywhere in a config tree that is not a plain variable name, by config path."""
    out: list[str] = []
    if isinstance(tree, dict):
        for key, value in tree.items():
            where = f"{path}.{key}" if path else str(key)
            problem = env_name_problem(value) if str(key).endswith("_env") else None
            if problem:
                out.append(f"{where} {problem}; export the secret and put the variable's name here")
            elif not str(key).endswith("_env"):
                out += env_problems(value, where)
    elif isinstance(tree, list):
        for i, value in enumerate(tree):
            out += env_problems(value, f"{path}[{i}]")
    return out


def token_from_env(env_name: str = "HF_TOKEN") -> str | None:
    """The token, or None; HUGGING_FACE_HUB_TOKEN is accepted as the older name of HF_TOKEN."""
    value = os.environ.get(env_name) or (os.environ.get("HUGGING_FACE_HUB_TOKEN") if env_name == "HF_TOKEN" else None)
    return value.strip() if value and value.strip() else None


def offline() -> bool:
    """huggingface_hub's offline switch (HF_HUB_OFFLINE, read when it was imported)."""
    from huggingface_hub import constants

    return bool(constants.is_offline_mode())


def _scrub(text: str, token: str) -> str:
    return text.replace(token, "***") if token else text


def upload_bundle(bundle: str | Path, repo_id: str, *, token: str, private: bool = True,
                  endpoint: str | None = None, commit_message: str = "llmrnn release") -> dict:
    """Create the model repo (private unless told otherwise; an existing repo is reused) and upload the
    bundle folder in one commit. Returns what the receipt records."""
    from huggingface_hub import HfApi
    from huggingface_hub.errors import HfHubHTTPError

    api = HfApi(endpoint=endpoint, token=token)
    try:
        url = api.create_repo(repo_id, private=private, exist_ok=True, repo_type="model")
        full_id = getattr(url, "repo_id", None) or repo_id
        info = api.upload_folder(
            folder_path=str(bundle), repo_id=full_id, repo_type="model", commit_message=commit_message
        )
    except (HfHubHTTPError, OSError, ValueError) as exc:
        first = _scrub(str(exc), token).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
        raise CheckFailed(f"upload to {endpoint or 'the Hub'} repo {repo_id} failed: {first}") from None
    log.info("uploaded %s to %s (commit %s)", bundle, full_id, getattr(info, "oid", "?"))
    return {
        "repo_id": full_id,
        "repo_url": str(url),
        "private": private,
        "endpoint": api.endpoint,
        "commit_url": getattr(info, "commit_url", None),
        "commit_oid": getattr(info, "oid", None),
    }
