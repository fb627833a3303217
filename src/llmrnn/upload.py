"""Hub upload of a checked release bundle with huggingface_hub (create_repo + upload_folder).

The token comes only from the environment (release.token_env, default HF_TOKEN); it is passed to
huggingface_hub in memory and never written to a file, a log line or an error message.
"""

from __future__ import annotations

import logging
import os
from pathlib import Path

from llmrnn.errors import CheckFailed

log = logging.getLogger(__name__)


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
