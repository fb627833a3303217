"""Config rules JSON Schema cannot state, checked in ONE walk over the whole config wherever a config is
validated: Snakemake's parse (rules/common.smk), `llmrnn check`, and (numbers) every CLI verb's `--cfg`
(llmrnn.cli.json_arg).

- every number is finite: YAML's `.nan`/`.inf` (and JSON's NaN/Infinity) pass every `minimum:` of the
  schema, since NaN compares false with everything; a NaN threshold or weight would silently turn every
  match false or every reward NaN;
- no credential in any value: a URL with `user:password@` (or a token as its user), or a string shaped
  like a key (constants.CREDENTIAL, the release scanner's detector) in a free-text key such as
  `release.commit_message` or `release.tags`; secrets come only from the environment (`*_env` names,
  which upload.env_problems checks), so this is refused at parse time, before any training;
- shard counts fit the work: no more eval shards than test patients can exist, no more trajectory
  shards than the larger of the two splits (1000 shards for 20 patients would plan thousands of jobs);
- every value of the JSON type its settings model says (model_problems): JSON Schema's `integer` is any
  number with no fraction, so `icd_version: 9.0` or `min_visits: 2.0` passes it; the models (strict, in
  llmrnn.settings.base) refuse them, and state the cross-field rules (min_visits <= max_visits).

Each problem is one line naming the key path and never repeats a secret.
"""

from __future__ import annotations

import math
from typing import Any
from urllib.parse import urlsplit

from pydantic import ValidationError

from llmrnn.constants import CREDENTIAL, URL_USERINFO
from llmrnn.settings import Config, section_defaults
from llmrnn.settings.masking import secret_reason


def _walk(tree: Any, path: str = ""):
    """(key path, value) of every leaf of a config tree; list items are path[i]."""
    if isinstance(tree, dict):
        for key, value in tree.items():
            yield from _walk(value, f"{path}.{key}" if path else str(key))
    elif isinstance(tree, (list, tuple)):
        for i, value in enumerate(tree):
            yield from _walk(value, f"{path}[{i}]")
    else:
        yield path or "<top>", tree


def number_problem(value: Any) -> str | None:
    if isinstance(value, float) and not math.isfinite(value):
        return f"{value} is not a finite number (NaN and infinities are refused for every numeric key)"
    return None


def url_credential_problem(text: str) -> str | None:
    """Why a string holds a URL with credentials in it (None when it does not); never repeats them."""
    for match in URL_USERINFO.finditer(text):
        scheme, userinfo = match.group(1).lower().removesuffix("://"), match.group(2)
        if not userinfo:
            continue
        try:
            parts = urlsplit(match.group(0) + "x")
        except ValueError:
            parts = None
        has_password = ":" in userinfo or (parts is not None and parts.password is not None)
        if has_password or scheme in ("http", "https", "ws", "wss"):
            return (f"a {scheme} URL with credentials (user:password@ before the host); put the secret in an "
                    "environment variable and name it in the matching *_env key")
    return None


def secret_problem(text: str) -> str | None:
    """Why a string looks like it holds a key (the release scanner's detector); never repeats it."""
    match = CREDENTIAL.search(text)
    if match:
        return (f"holds what looks like a credential ({match.group(1) or 'hf_'}...); secrets come only from the "
                "environment, never from the config (it would be copied into logs, the manifest and the Hub)")
    return None


def _masked_problem(where: str, value: str) -> str | None:
    """What the shared detector (llmrnn.settings.masking) finds beyond the two above: a token in a URL's
    query or fragment, a key pasted as a `repo_id`."""
    problem = secret_reason(where.rsplit(".", 1)[-1], value)
    return (f"{problem} (not repeated); secrets come only from the environment: put it in a variable and "
            "name that in the matching *_env key") if problem else None


def value_findings(config: Any, secrets: bool = True) -> list[tuple[str, str, bool]]:
    """(key path, problem, is a secret) for every non-finite number and (with `secrets`) credential in a
    config tree."""
    out = []
    for where, value in _walk(config):
        if where.endswith("_env"):
            continue  # upload.env_problems says what is wrong there without echoing the value
        if problem := number_problem(value):
            out.append((where, problem, False))
        elif secrets and isinstance(value, str) and (problem := url_credential_problem(value)
                                                     or secret_problem(value) or _masked_problem(where, value)):
            out.append((where, problem, True))
    return out


def value_problems(config: Any, secrets: bool = True) -> list[str]:
    """Non-finite numbers and credentials anywhere in a config tree, by key path. `secrets=False` (a
    command's `--cfg`): numbers only; the workflow refused credentials at parse, and the release command
    redacts or refuses what reaches it on its own."""
    return [f"{where}: {problem}" for where, problem, _ in value_findings(config, secrets)]


def _int(value: Any) -> int | None:
    return value if isinstance(value, int) and not isinstance(value, bool) else None


SYNTHETIC_MIMIC_IV = "resources/cohort/mimic_iv_synthetic"  # `llmrnn cohort synth --format mimic-iv` writes here


def cohort_is_synthetic(cohort: Any) -> bool:
    """The cohort comes from `llmrnn cohort synth`: directly (source: synthetic) or as the synthetic
    PhysioNet files rule synth_mimic_iv writes from cohort.synthetic (source: mimic_iv on its folders),
    which build back into the same patients."""
    cohort = cohort if isinstance(cohort, dict) else {}
    source = cohort.get("source", section_defaults("cohort")["source"])
    if source == "synthetic":
        return True
    mimic = cohort.get("mimic_iv") if isinstance(cohort.get("mimic_iv"), dict) else {}
    return source == "mimic_iv" and all(
        str(mimic.get(k, "")).rstrip("/") == f"{SYNTHETIC_MIMIC_IV}/{k}" for k in ("hosp", "note"))


def max_test_patients(config: dict) -> tuple[int, str] | None:
    """An upper bound on the evaluated test patients known from the config alone, and how it was got;
    None when it needs the cohort file (`llmrnn check` counts that one)."""
    ev, cohort, split = (config.get(k) if isinstance(config.get(k), dict) else {} for k in ("eval", "cohort", "split"))
    bounds = []
    if (cap := _int(ev.get("max_patients"))) is not None:
        bounds.append((cap, f"eval.max_patients {cap}"))
    synth = cohort.get("synthetic") if isinstance(cohort.get("synthetic"), dict) else {}
    patients, val, train = (_int(synth.get("patients")), _int(split.get("val_size")), _int(split.get("train_size")))
    if cohort_is_synthetic(cohort) and None not in (patients, val, train):
        bounds.append((max(patients - val - train, 0),
                       f"cohort.synthetic.patients {patients} - split.val_size {val} - split.train_size {train}"))
    return min(bounds) if bounds else None


def shard_problems(config: dict, test_patients: int | None = None) -> list[str]:
    """Shard counts larger than the work they split. `test_patients`: the test split's real size when
    known (llmrnn check loads the cohort)."""
    out = []
    ev = config.get("eval") if isinstance(config.get("eval"), dict) else {}
    shards = _int(ev.get("shards"))
    bound = max_test_patients(config)
    if test_patients is not None:
        cap = _int(ev.get("max_patients"))
        real = min(test_patients, cap) if cap is not None else test_patients
        bound = min(bound, (real, "test patients")) if bound else (real, "test patients")
    if config.get("recipe", Config.model_fields["recipe"].default) == "memory_head" and shards is not None and bound and shards > max(bound[0], 1):
        out.append(f"eval.shards: {shards} shards for at most {bound[0]} test patients ({bound[1]}); "
                   f"set eval.shards <= {max(bound[0], 1)}")
    traj = config.get("trajectories") if isinstance(config.get("trajectories"), dict) else {}
    split = config.get("split") if isinstance(config.get("split"), dict) else {}
    tshards, sizes = _int(traj.get("shards")), [_int(split.get(k)) for k in ("val_size", "train_size")]
    if config.get("recipe", Config.model_fields["recipe"].default) == "memory_head" and tshards is not None and None not in sizes \
            and tshards > max(sizes):
        out.append(f"trajectories.shards: {tshards} shards per split for splits of {sizes[0]} (val) and "
                   f"{sizes[1]} (train) patients; set trajectories.shards <= {max(sizes)}")
    return out


def model_findings(config: Any) -> list[tuple[str, str]]:
    """(key path, problem) for every value the settings models refuse (llmrnn.settings.Config, strict:
    a float or bool where an int belongs, `9.0` for a Literal 9) and every cross-field rule of a model.
    Run after the schema (its defaults filled): it adds what JSON Schema cannot state. The value is
    never repeated (it may be a secret typed in the wrong key)."""
    try:
        Config.model_validate(config)
    except ValidationError as exc:
        out = []
        for err in exc.errors():
            where = _located(config, err["loc"])
            if err["type"] == "value_error":  # a model's own rule: its message names its keys
                out.append((where, str(err["ctx"]["error"])))
            else:
                out.append((where, f"{err['msg']} (a {type(err.get('input')).__name__}; JSON types are not converted)"))
        return out
    return []


def _located(config: Any, loc: tuple) -> str:
    """The dotted key path of a pydantic error location, up to the last part that is a key of the config
    (pydantic appends a union member's tag, e.g. `int`, which no config has)."""
    parts, node = [], config
    for part in loc:
        if isinstance(node, dict) and part in node or isinstance(node, list) and isinstance(part, int) and part < len(node):
            node = node[part]
        else:
            break
        parts.append(f"[{part}]" if isinstance(part, int) else f".{part}")
    return "".join(parts).lstrip(".") or "<top>"


def finding_line(where: str, problem: str) -> str:
    """`key: problem`, or the problem alone where it starts with its key (a model's rule names its keys)."""
    return problem if problem.startswith(where) else f"{where}: {problem}"


def model_problems(config: Any) -> list[str]:
    """model_findings as `key: problem` lines (Snakemake's parse, after validate)."""
    return [finding_line(where, problem) for where, problem in model_findings(config)]


def config_problems(config: dict) -> list[str]:
    """Every problem of a whole (schema-valid or not) workflow config that the schema cannot state."""
    return value_problems(config) + shard_problems(config)
