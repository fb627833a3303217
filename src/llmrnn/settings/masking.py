"""The one detector of a secret in a config value, and its mask: what `llmrnn config show`/`diff` print,
what the config check refuses (llmrnn.configcheck), and so what never reaches a planned `--cfg` (Snakemake's
parse refuses the config first). Secrets come only from the environment, named in `*_env` keys.

A value looks like a secret when it holds
- a string shaped like a key (constants.CREDENTIAL: hf_, sk-, ghp_, AKIA, ... followed by a long run);
- a URL with userinfo (`user:password@host`, or any user of an http(s)/ws(s) URL: a token as its user);
- a URL whose query or fragment carries a parameter named like a credential (`?token=`, `#access_token=`,
  `&api_key=`, `X-Amz-Signature=`) or a value shaped like a key (a long run mixing letters and digits);
- in a key that holds a NAME (`*_env`) or an id (`repo_id`): anything that is not a plain name
  (llmrnn.upload.env_name_problem: a key pasted where the variable's name belongs).
"""

from __future__ import annotations

import re
from typing import Any
from urllib.parse import parse_qsl

from llmrnn.constants import CREDENTIAL, URL_USERINFO
from llmrnn.upload import env_name_problem

MASK = "***"
# a URL and its query (?...) and fragment (#...), up to whitespace or a quote
URL = re.compile(r"(?i)\b[a-z][a-z0-9+.-]*://[^\s\"'<>]+")
# parameter names that carry a credential: token, access_token, api_key, apikey, key, secret, password,
# sig/signature (signed URLs), auth, credential, session, code (OAuth)
SECRET_PARAM = re.compile(r"(?i)(token|key|secret|passw|pwd|sig|auth|credential|session|^code$|^jwt$)")
# a run of 16+ letters and digits (base64/hex alphabets) with both kinds in it: how a key is generated
KEY_RUN = re.compile(r"[A-Za-z0-9+/_=-]{16,}")
REPO_ID = re.compile(r"[\w.-]+(/[\w.-]+)?")


def _key_shaped(value: str) -> bool:
    return any(re.search(r"[A-Za-z]", run) and re.search(r"\d", run) for run in KEY_RUN.findall(value))


def _pairs(part: str) -> list[tuple[str, str]]:
    """The name=value pairs of a query or fragment (a bare fragment is one value without a name)."""
    if "=" not in part:
        return [("", part)] if part else []
    return parse_qsl(part, keep_blank_values=True)


def url_secret(url: str) -> str | None:
    """Why a URL carries a secret (None when it does not); never repeats it."""
    match = URL_USERINFO.match(url)
    userinfo = match.group(2) if match else ""
    # a password, or any user of a web URL (a token as its user); `ssh://git@host` names only a login
    if userinfo and userinfo != MASK and (":" in userinfo or match.group(1).lower().startswith(("http", "ws"))):
        return "a URL with credentials (user:password@ before the host)"
    for sep, what in (("?", "query"), ("#", "fragment")):
        if sep not in url:
            continue
        part = url.split(sep, 1)[1]
        part = part.split("#", 1)[0] if sep == "?" else part
        for name, value in _pairs(part):
            if value and (SECRET_PARAM.search(name) or _key_shaped(value)):
                named = f" ({name}=)" if name and re.fullmatch(r"[\w.-]{1,40}", name) else ""
                return f"a URL with a token in its {what}{named}"
    return None


def name_key_problem(key: str, value: Any) -> str | None:
    """Why the value of a key that holds a NAME (`*_env`) or an id (`repo_id`) looks like a key."""
    if not isinstance(value, str):
        return None
    if key.endswith("_env"):
        problem = env_name_problem(value)
        return problem if problem and "looks like a key" in problem else (
            "is not an environment variable NAME" if problem else None)
    if key == "repo_id" and (not REPO_ID.fullmatch(value) or any(_key_shaped(p) and not re.search(r"[.-]", p)
                                                                   for p in value.split("/"))):
        return "looks like a key, not a Hub repo id (owner/name)"
    return None


def secret_reason(key: str, value: Any) -> str | None:
    """Why the config value `value` under key `key` (its last part) looks like a secret; None when not."""
    if (problem := name_key_problem(key, value)) is not None:
        return problem
    if not isinstance(value, str):
        return None
    if CREDENTIAL.search(value):
        return "holds what looks like a credential"
    for url in URL.findall(value):
        if problem := url_secret(url):
            return problem
    return None


def mask_text(text: str) -> str:
    """`text` with every key-shaped run, URL userinfo and credential of a URL's query or fragment masked."""
    text = CREDENTIAL.sub(lambda m: f"{m.group(1) or 'hf_'}{MASK}", text)
    text = URL_USERINFO.sub(lambda m: f"{m.group(1)}{MASK}@" if m.group(2) else m.group(0), text)

    def url(m: re.Match) -> str:
        value = m.group(0)
        cuts = [i for i in (value.find("?"), value.find("#")) if i >= 0]
        if not cuts or not url_secret(value):
            return value
        return f"{value[:min(cuts) + 1]}{MASK}"  # the whole query and fragment: a name can say what it is

    return URL.sub(url, text)


def mask(value: Any, key: str = "") -> Any:
    """A config value (or tree) as it may be printed: every value that looks like a secret (secret_reason)
    masked, mappings and lists walked, keys kept."""
    if isinstance(value, dict):
        return {k: mask(v, str(k)) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [mask(v, key) for v in value]
    if isinstance(value, str) and secret_reason(key, value):
        masked = MASK if name_key_problem(key, value) else mask_text(value)
        return masked if masked != value and not secret_reason(key, masked) else MASK
    return value
