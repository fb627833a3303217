"""What leaves the site: secrets named by variable only, patient text to external endpoints only with the
opt-in (and the key set now), the Hub upload's token and target repo."""

from __future__ import annotations

import os
import re

from llmrnn.backends import external_host, external_problem
from llmrnn.check.models import _offline
from llmrnn.check.skips import unused
from llmrnn.upload import env_name_problem, env_problems


def check_upload(config: dict) -> list[str]:
    rel = config.get("release") or {}
    if not rel.get("upload"):
        unused("release.upload is off")
        return []
    problems = []
    env_name = rel.get("token_env") or "HF_TOKEN"
    token = os.environ.get(env_name) or (os.environ.get("HUGGING_FACE_HUB_TOKEN") if env_name == "HF_TOKEN" else None)
    if not token:
        problems.append(f"release.upload is on but ${env_name} is empty: export a Hub token with write access")
    repo = rel.get("repo_id")
    if repo and not re.fullmatch(r"[\w.-]+/[\w.-]+", repo):
        problems.append(f"release.repo_id: {repo!r} is not owner/name")
    if token and not _offline():
        try:
            from huggingface_hub import HfApi

            who = HfApi(endpoint=rel.get("endpoint"), token=token).whoami()
            owner = (repo or "").split("/")[0]
            names = {who.get("name")} | {o.get("name") for o in who.get("orgs", []) if isinstance(o, dict)}
            if owner and owner not in names:
                problems.append(f"release.repo_id: the token (user {who.get('name')}) cannot write to {owner}/")
        except Exception as exc:  # noqa: BLE001
            first = (str(exc).replace(token, "***").strip().splitlines() or [type(exc).__name__])[0][:160]
            problems.append(f"release: the token in ${env_name} is not accepted by the Hub ({first})")
    return problems


def check_env_names(config: dict) -> list[str]:
    """Every `*_env` value (api_key_env, token_env, ...) must be a variable NAME, never the secret itself."""
    return [f"config: {p}" for p in env_problems(config)]


def _endpoint_problems(where: str, cfg: dict, allowed: bool, opt_in: str) -> list[str]:
    """An OpenAI-compatible endpoint that receives patient text: a url; a host outside the site only with
    the opt-in; and then (or whenever a key variable is named) the key in the environment now, not when
    the job starts hours later."""
    url = cfg.get("url")
    if not url:
        return [f"{where}.url: missing (the endpoint's base URL, e.g. http://host:8000/v1)"]
    if problem := external_problem(url, allowed, f"{where}.url", opt_in):
        return [problem]
    env_name = cfg.get("api_key_env")
    if not env_name:
        host = external_host(url)
        return [f"{where}.api_key_env: {host} is a hosted endpoint: name the variable holding its key"] if host else []
    if env_name_problem(env_name):
        return []  # check_env_names says what is wrong without echoing a possible secret
    if not os.environ.get(env_name):
        return [f"{where}.api_key_env: ${env_name} is not set: export the endpoint's API key before submitting"]
    return []


def check_external_endpoints(config: dict) -> list[str]:
    """Patient text leaves the site only when the config opts in: the final judge (mode llm) and the roles
    on the openai backend, each with its API key checked here."""
    problems = []
    judge = (config.get("eval") or {}).get("final_judge") or {}
    if judge.get("mode") == "llm":
        problems += _endpoint_problems("eval.final_judge.llm", judge.get("llm") or {},
                                       bool(judge.get("allow_external")), "eval.final_judge.allow_external")
    for role, rcfg in (config.get("roles") or {}).items():
        if (rcfg or {}).get("backend") == "openai":
            problems += _endpoint_problems(f"roles.{role}", rcfg, bool(rcfg.get("allow_external")),
                                           f"roles.{role}.allow_external")
    if judge.get("mode") != "llm" and not any((r or {}).get("backend") == "openai"
                                              for r in (config.get("roles") or {}).values()):
        unused("no endpoint outside the job receives patient text")
    return problems
