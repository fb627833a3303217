"""Hub upload of a checked release bundle with huggingface_hub (create_repo + upload_folder).

The token comes only from the environment (release.token_env, default HF_TOKEN); it is passed to
huggingface_hub in memory and never written to a file, a log line or an error message.
"""

from __future__ import annotations

import contextlib
import logging
import os
import re
from pathlib import Path
from typing import Any

from llmrnn.constants import URL_USERINFO
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


RELEASE_ID_TRAILER = "llmrnn-release-id"


def redact_credentials(value: Any) -> Any:
    """`value` with the userinfo (`user:password@`) of every URL inside it replaced by `***@`: strings,
    and the keys and values of dicts and lists, recursively. Everything the release puts on disk (MANIFEST.json,
    the model card, the receipt, log lines and errors) goes through this one function."""
    if isinstance(value, str):
        return URL_USERINFO.sub(r"\1***@", value)
    if isinstance(value, dict):
        return {redact_credentials(k): redact_credentials(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [redact_credentials(v) for v in value]
    return value


def without_userinfo(url: str | None) -> str | None:
    """The URL with its `user:password@` (or the `***@` left by redact_credentials) removed."""
    return URL_USERINFO.sub(r"\1", url) if url else url


def _scrub(text: str, token: str) -> str:
    return redact_credentials(text.replace(token, "***") if token else text)


def _release_commit(api: Any, repo_id: str, release_id: str) -> Any:
    """The commit of `repo_id` whose description carries `release_id` (this exact bundle was pushed
    before), or None."""
    from huggingface_hub.errors import HfHubHTTPError

    marker = f"{RELEASE_ID_TRAILER}: {release_id}"
    try:
        commits = api.list_repo_commits(repo_id, repo_type="model")
    except HfHubHTTPError as exc:
        if getattr(exc.response, "status_code", None) != 404:
            raise
        log.warning("%s: its commit history cannot be listed (404); pushing without the rerun check", repo_id)
        return None
    for commit in commits:
        if marker in (commit.message or "") or marker in (commit.title or ""):
            return commit
    return None


def upload_bundle(bundle: str | Path, repo_id: str, *, token: str, files: dict[str, str], release_id: str,
                  private: bool = True, endpoint: str | None = None,
                  commit_message: str = "llmrnn release") -> dict:
    """Upload exactly the files `files` names (path in the bundle -> the sha256 recorded when the PHI guard
    scanned it) in one commit, to a model repo created private unless told otherwise (an existing repo is
    reused). Every file is opened (never through a link) and hashed again first; a changed or missing
    file stops the upload before the repo is touched, the bytes sent are read from those same open files,
    and nothing but the files named is sent. A repo
    whose history already holds a commit of `release_id` (the same bundle) gets no second commit.
    Returns what the receipt records."""
    from huggingface_hub import CommitOperationAdd, HfApi
    from huggingface_hub.errors import HfHubHTTPError

    bundle = Path(bundle)
    where = redact_credentials(endpoint or "the Hub")
    with contextlib.ExitStack() as stack:
        operations = []
        for rel, sha256 in sorted(files.items()):
            try:  # O_NOFOLLOW: a link put in place of a staged file is not followed
                fd = os.open(bundle / rel, os.O_RDONLY | getattr(os, "O_NOFOLLOW", 0))
            except OSError as exc:
                raise CheckFailed(f"{rel}: cannot be opened for the upload ({exc.strerror}); nothing uploaded") from None
            fh = stack.enter_context(os.fdopen(fd, "rb"))
            op = CommitOperationAdd(path_in_repo=rel, path_or_fileobj=fh)
            if op.upload_info.sha256.hex() != sha256:
                raise CheckFailed(f"{rel}: changed after the PHI guard scanned it (sha256 {sha256[:12]} at the "
                                  f"scan, {op.upload_info.sha256.hex()[:12]} now); nothing uploaded")
            operations.append(op)
        api = HfApi(endpoint=endpoint, token=token)
        try:
            url = api.create_repo(repo_id, private=private, exist_ok=True, repo_type="model")
            full_id = getattr(url, "repo_id", None) or repo_id
            previous = _release_commit(api, full_id, release_id)
            if previous is None:
                info = api.create_commit(repo_id=full_id, repo_type="model", operations=operations,
                                         commit_message=commit_message,
                                         commit_description=f"{RELEASE_ID_TRAILER}: {release_id}")
        except (HfHubHTTPError, OSError, ValueError) as exc:
            first = _scrub(str(exc), token).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
            raise CheckFailed(f"upload to {where} repo {repo_id} failed: {first}") from None
    result = {"repo_id": full_id, "repo_url": redact_credentials(str(url)), "private": private,
              "endpoint": redact_credentials(api.endpoint), "release_id": release_id}
    if previous is not None:
        log.info("%s already holds this release (commit %s); nothing pushed again", full_id, previous.commit_id)
        oid = previous.commit_id
        return {**result, "commit_oid": oid, "commit_url": redact_credentials(f"{api.endpoint}/{full_id}/commit/{oid}"),
                "already_uploaded": True}
    log.info("uploaded %s to %s (commit %s)", bundle, full_id, getattr(info, "oid", "?"))
    return {**result, "commit_url": redact_credentials(getattr(info, "commit_url", None)),
            "commit_oid": getattr(info, "oid", None), "already_uploaded": False}
