"""`llmrnn check`: the pre-submit check. Runs on a login node (no GPU) and lists ALL problems at once,
before anything is queued: config schema, cohort file, base models + chat templates (or hub ids that
resolve), the judge rubric and model, batch geometry, the verl command composed against the installed
verl config, the Hub token and target repo when upload is on, and the SLURM profile's GPU counts.

    llmrnn check [--configfile config/reproduce.yaml ...] [--out check.json]

Exit 0 when no problem was found, 1 otherwise (every problem on its own line).
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import re
import sys
from collections.abc import Callable
from pathlib import Path

from llmrnn.io import deep_merge, read_yaml

log = logging.getLogger(__name__)



# ----------------------------------------------------------------------------- config
def load_config(paths: list[Path], schema_path: Path | None = None) -> tuple[dict, list[str]]:
    """The merged config with schema defaults, and every schema problem (not just the first)."""
    import jsonschema

    problems: list[str] = []
    config: dict = {}
    layers: list[tuple[str, dict]] = []
    from llmrnn.errors import InputError
    from llmrnn.runconfig import fill_defaults, find_schema, layer_problems, read_layer

    for path in paths:
        try:  # the one YAML policy (llmrnn.io.read_yaml): bombs, fifos, duplicate keys, non-UTF-8 refused
            _, data = read_layer(path)
        except InputError as exc:
            problems.append(f"config: {exc}")
            continue
        config = deep_merge(config, data)
        layers.append((str(path), data))
    problems += layer_problems(layers)  # config layers never cross recipes
    try:
        schema = read_yaml(find_schema(schema_path), "config schema")
    except InputError as exc:
        return config, [*problems, f"{exc}" if str(exc).startswith("config:") else f"config: {exc}"]
    from llmrnn.configcheck import shard_problems, value_findings

    findings = value_findings(config)
    secret_paths = [where for where, _, secret in findings if secret]
    validator = jsonschema.Draft202012Validator(schema)
    invalid: list[list] = []
    for err in sorted(validator.iter_errors(config), key=lambda e: list(e.absolute_path)):
        where = ".".join(str(p) for p in err.absolute_path) or "<top>"
        if where.endswith("_env"):
            continue  # check_env_names says it from the value itself, without echoing a possible secret
        invalid.append(list(err.absolute_path) if err.validator in VALUE_ERRORS else [])
        if where in {f for f, _, _ in findings}:
            continue  # the finding below says it
        # the schema's message would quote the secret
        if any(s == where or s.startswith((f"{where}.", f"{where}[")) for s in secret_paths):
            problems.append(f"config: {where}: not valid for the schema (value not repeated: it holds a credential)")
            continue
        problems.append(f"config: {where}: {err.message}")
    problems += [f"config: {where}: {problem}" for where, problem, _ in findings]
    for path in invalid:  # the other checks see the schema default, not a value of the wrong type
        _drop(config, path)
    fill_defaults(config, schema)  # the one home of filling schema defaults (runconfig)
    if not invalid:
        problems += [f"config: {p}" for p in shard_problems(config)]
    return config, problems


# schema errors about a value itself (not a misspelt or missing key): the value is dropped for the later checks
VALUE_ERRORS = frozenset({"type", "enum", "const", "pattern", "minimum", "maximum", "exclusiveMinimum",
                          "exclusiveMaximum", "minLength", "maxLength", "minItems", "maxItems", "uniqueItems",
                          "multipleOf", "format"})


def _drop(config: dict, path: list) -> None:
    """Remove the value at `path` (a schema error's location; a bad list item removes its whole list) so
    defaults fill it for the later checks."""
    while path and isinstance(path[-1], int):
        path = path[:-1]
    node = config
    for part in path[:-1]:
        try:
            node = node[part]
        except (KeyError, IndexError, TypeError):
            return
    if path and isinstance(node, dict):
        node.pop(path[-1], None)


# ----------------------------------------------------------------------------- helpers
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


def withhold_ids(message: str, source: str | Path) -> str:
    """A cohort problem as check prints it (to the terminal and to logs/RUN/check.log): the patient is
    named by its record number in the file, and no patient or visit id of the file is repeated."""
    try:
        data = json.loads(Path(source).read_bytes().decode("utf-8-sig"))
    except (OSError, ValueError, RecursionError):
        return message  # not JSON: the loader's message names a line and column, no record
    records = [r if isinstance(r, dict) else {} for r in data] if isinstance(data, list) else []
    for n, record in enumerate(records):
        if record.get("subject_id") is not None:
            message = re.sub(rf"\bpatient {re.escape(str(record['subject_id']))}(?=[ :])", f"record {n}", message)
    ids = {str(i) for r in records for i in [r.get("subject_id"), *(v.get("visit_id") for v in r.get("visits") or []
                                                                   if isinstance(v, dict))]
           if i is not None and len(str(i)) >= 3}
    for value in sorted(ids, key=len, reverse=True):
        message = re.sub(rf"(?<![\w-]){re.escape(value)}(?![\w-])", "<id withheld>", message)
    return message


# ----------------------------------------------------------------------------- checks
def check_cohort(config: dict) -> list[str]:
    """The cohort loads, and the split sizes fit the CLEANED cohort (split_cohort's input), so a cohort
    too small for the configured splits fails here, not hours later at split time."""
    from llmrnn.cohort import clean_cohort, load_cohort, synthesize_cohort
    from llmrnn.configcheck import cohort_is_synthetic
    from llmrnn.errors import LlmrnnError

    cohort = config.get("cohort") or {}
    source = cohort.get("source", "synthetic")
    if source == "mimic_iv" and not cohort_is_synthetic(cohort):
        from llmrnn.mimic.build import folder_problems

        mimic = cohort.get("mimic_iv") or {}
        return [f"cohort.mimic_iv: {p}" for p in folder_problems(mimic.get("hosp", ""), mimic.get("note", ""),
                                                                 mimic.get("diagnoses", "note"))]
    if cohort_is_synthetic(cohort):  # also the synthetic PhysioNet files: they build back into this cohort
        synth = cohort.get("synthetic") or {}
        if "patients" not in synth or "seed" not in synth:
            return []  # the schema check names the missing key
        patients = synthesize_cohort(int(synth["patients"]), int(synth["seed"]))
    else:
        if "{" in source or "}" in source:
            return [(f"cohort.source: {source!r} contains a brace, which Snakemake reads as a wildcard; "
                    "rename the file or its folder")]
        if not Path(source).is_file():
            return [f"cohort.source: {source} does not exist (the cleaned cohort JSON in LLM-as-RNN format)"]
        try:
            patients = load_cohort(source)
        except LlmrnnError as exc:
            return [f"cohort.source: {withhold_ids(str(exc), source)}"]
    if config.get("recipe") == "qa":
        return []  # the qa recipe splits questions (qa.split, check_qa_data), not the cohort
    kept, _ = clean_cohort(patients)
    split = config.get("split") or {}
    need = int(split.get("val_size", 0)) + int(split.get("train_size", 0)) + 1
    if len(kept) < need:
        return [(f"cohort.source: {source} has {len(kept)} patients after cleaning ({len(patients)} before); "
                 f"split needs at least {need} (val_size {split.get('val_size', 0)} + train_size "
                 f"{split.get('train_size', 0)} + a test set)")]
    if cohort_is_synthetic(cohort):
        return []  # load_config's shard check already bounds the synthetic test split
    from llmrnn.configcheck import shard_problems

    return [f"config: {p}" for p in shard_problems(config, len(kept) - need + 1) if p.startswith("eval.")]


def _qa_records(config: dict, source: str) -> list[dict] | str | None:
    """The QA records the qa data stage would read from `source` (None: not checkable here, an hf: dataset),
    or why they cannot be read."""
    from llmrnn.errors import LlmrnnError
    from llmrnn.qa.data import load_records, load_records_from

    qa = config.get("qa") or {}
    try:
        if source == "synthetic":  # what qa_synth makes of the synthetic cohort
            from llmrnn.cohort import synthesize_cohort
            from llmrnn.qa.synth import questions_from_cohort

            synth = (config.get("cohort") or {}).get("synthetic") or {}
            qsynth = qa.get("synthetic") or {}
            patients = synthesize_cohort(int(synth.get("patients", 0)), int(synth.get("seed", 0)))
            raw, _ = questions_from_cohort(patients, int(qsynth.get("seed", 0)), qsynth.get("max_questions"))
            return load_records_from(raw, qa.get("fields"), "qa synth")
        if source.startswith("hf:"):
            return "hf: names no dataset" if not source[3:].strip() else None
        if "{" in source or "}" in source:
            return f"{source!r} contains a brace, which Snakemake reads as a wildcard; rename the file"
        if not Path(source).is_file():
            return f"{source} is not a file (a JSON/JSONL QA file, hf:<dataset>, or synthetic)"
        return load_records(source, qa.get("fields"), qa.get("dataset"))
    except LlmrnnError as exc:
        return str(exc)


def check_qa_data(config: dict) -> list[str]:
    """recipe qa: the QA source reads as the qa data stage reads it, and qa.split fits the groups left
    after filtering (so neither fails hours later at run time); the OOD set, when a file, exists."""
    from llmrnn.qa.data import filter_records, split_units

    qa = config.get("qa") or {}
    problems = []
    ood = qa.get("ood")
    if ood and ood != "synthetic" and not ood.startswith("hf:") and not Path(ood).is_file():
        problems.append(f"qa.ood: {ood} is not a file (a JSON/JSONL QA file, hf:<dataset>, synthetic or null)")
    source = str(qa.get("source", "synthetic"))
    records = _qa_records(config, source)
    if records is None:
        return problems
    if isinstance(records, str):
        return [*problems, f"qa.source: {records}"]
    if not records:
        return [*problems, f"qa.source: {source} holds no QA records (the file is empty)"]
    kept, _ = filter_records(records, qa.get("filter"))
    groups = len(set(split_units(kept).values()))
    split = qa.get("split") or {}
    val, test = int(split.get("val_size", 0)), int(split.get("test_size", 0))
    if val + test >= groups:
        problems.append(f"qa.split: val_size {val} + test_size {test} leave no train group: {source} has "
                        f"{groups} groups after filtering ({len(kept)} of {len(records)} records kept)")
    return problems


def _model_problem(name: str, spec: dict) -> str | None:
    from llmrnn.models import READY, model_dir

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
    from llmrnn.models import resolve_model

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


def _judge_in_dag(config: dict) -> bool:
    """Whether a job starts the judge (as llmrnn.plan plans it): the reward asks it, the memory head's
    judge-agreement check beside training (preflight.agreement_pairs > 0), or the QA answers are
    judge-graded (qa.eval.judge: true, or auto where the QA reward asks the judge)."""
    from llmrnn.errors import LlmrnnError
    from llmrnn.reward import asks_judge
    from llmrnn.train.config import PreflightConfig

    try:
        if asks_judge(config):
            return True
    except LlmrnnError:  # a bad reward section is the schema's line; check the judge as if it were asked
        return True
    if config.get("recipe") == "qa":
        return ((config.get("qa") or {}).get("eval") or {}).get("judge") is True
    pairs = (config.get("preflight") or {}).get("agreement_pairs", PreflightConfig.agreement_pairs)
    return bool(pairs)


def _judge_gpus_needed(config: dict) -> int | None:
    if not _judge_in_dag(config):
        return 0  # no judge_server is planned
    try:
        from llmrnn.rubric import load_rubric

        rubric = load_rubric(config["judge"]["rubric"])
    except Exception:  # noqa: BLE001 - reported by check_judge
        return None
    return 1 if rubric.needs_gpu else 0  # as llmrnn.plan.Plan.judge_gpus: one GPU for a vLLM judge


def check_judge(config: dict) -> list[str]:
    from llmrnn.errors import LlmrnnError

    judge = config.get("judge") or {}
    path = judge.get("rubric")
    if not path or not _judge_in_dag(config):  # no judge is started: its model is not needed
        return []
    if not Path(path).is_file():
        return [f"judge.rubric: {path} does not exist"]
    try:
        from llmrnn.rubric import load_rubric

        rubric = load_rubric(path)
    except LlmrnnError as exc:
        return [f"judge.rubric: {exc}"]
    except ImportError:
        return []
    models = config.get("models") or {}
    what = f"judge model of {path}"
    if rubric.model_source == "local":
        if rubric.model not in models:
            return [f"{what}: {rubric.model} is not a model in the config's `models` section"]
        return []
    from llmrnn.judge.launcher import judge_model_dir

    if (judge_model_dir(rubric) / ".ready").is_file():  # prepare_judge_model already made the local copy
        return []
    if rubric.model_source == "path":
        p = Path(rubric.model)
        return [] if p.is_dir() else [f"{what}: folder {rubric.model} does not exist"]
    if rubric.model_source == "hub":
        p = hub_problem(rubric.model, None, what)
        return [p] if p else []
    return []


def check_training(config: dict) -> list[str]:
    """Batch geometry (TRAIN's config.geometry) and, for verl, the command composed against the
    installed verl config (when verl is importable here)."""
    if "train" not in config:
        return []
    try:
        from llmrnn.train import config as tcfg
    except ImportError:
        return []
    from llmrnn.errors import LlmrnnError

    try:
        cfg = tcfg.normalize(config["train"])
        problems = [f"train: {p}" for p in tcfg.geometry(cfg).problems]
    except LlmrnnError as exc:
        return [f"train: {exc}"]
    if cfg.get("engine") == "verl":
        # the qa recipe's reward is llmrnn.qa.rewards.compute_score (same signature, other module)
        problems += check_verl_command(cfg, "llmrnn.qa.rewards" if config.get("recipe") == "qa" else None)
        problems += check_profile_gpus(config, cfg)
        problems += check_attention(cfg)
    return problems


def check_attention(train_cfg: dict) -> list[str]:
    """flash_attention_2 (and the remove-padding it turns on) imports flash-attn in verl's actor: refuse
    it where flash-attn is not importable (the GPU lock does not carry it: a CUDA source build)."""
    import importlib.util

    if train_cfg["verl"]["attn_implementation"] != "flash_attention_2" or importlib.util.find_spec("flash_attn"):
        return []
    return [("train.verl.attn_implementation: flash_attention_2 needs the flash-attn package, which is not "
             "importable here (envs/gpu-lock.txt leaves it out); use sdpa (the default) or install flash-attn")]


def check_verl_command(cfg: dict, reward_module: str | None = None) -> list[str]:
    try:
        import verl  # noqa: F401
    except ImportError:
        log.info("check: verl not importable here; the verl command is checked by preflight on the GPU node")
        return []
    from llmrnn.errors import LlmrnnError
    from llmrnn.train import verl_cmd

    try:
        overrides = verl_cmd.build_overrides(
            cfg, train_parquet="train.parquet", val_parquet="val.parquet", model_dir="model",
            out_dir="out", experiment_name="check",
            reward_path=f"pkg://{reward_module}" if reward_module else None,
        )
    except LlmrnnError as exc:
        return [f"train (verl command): {exc}"]
    return compose_verl(overrides)


def compose_verl(overrides: list[str]) -> list[str]:
    """Compose verl's ppo_trainer config with the overrides (Hydra rejects unknown keys)."""
    try:
        import verl
        from hydra import compose, initialize_config_dir
        from hydra.core.global_hydra import GlobalHydra
    except ImportError as exc:
        return [f"train (verl command): cannot import hydra/verl to compose it: {exc}"]
    config_dir = str(Path(verl.__file__).parent / "trainer" / "config")
    GlobalHydra.instance().clear()
    try:
        with initialize_config_dir(config_dir=config_dir, version_base=None):
            compose(config_name="ppo_trainer", overrides=overrides)
    except Exception as exc:  # noqa: BLE001 - Hydra raises several types; each is a config problem
        first = (str(exc).strip().splitlines() or [type(exc).__name__])[0][:300]
        return [f"train (verl {getattr(verl, '__version__', '?')} command): {first}"]
    finally:
        GlobalHydra.instance().clear()
    return []


# What profiles/slurm requests when these are not exported (its defaults: the reproduction's layout);
# tests/test_shared_concepts.py asserts they equal the rendered profile and config/reproduce.yaml.
PROFILE_GPU_DEFAULTS = {"LLMRNN_TRAIN_GPUS": 2, "LLMRNN_JUDGE_GPUS": 1, "LLMRNN_TRAIN_NODES": 1}


def _profile_value(name: str) -> int:
    return int(os.environ.get(name, PROFILE_GPU_DEFAULTS[name]))


def check_profile_gpus(config: dict, train_cfg: dict) -> list[str]:
    """profiles/slurm asks for LLMRNN_TRAIN_GPUS / LLMRNN_JUDGE_GPUS; they must match the config."""
    problems = []
    profile_train = _profile_value("LLMRNN_TRAIN_GPUS")
    want = int(train_cfg.get("n_gpus_per_node", profile_train))
    if want != profile_train:
        problems.append(f"train.n_gpus_per_node is {want} but profiles/slurm requests {profile_train} GPU(s) for "
                        f"train_grpo: export LLMRNN_TRAIN_GPUS={want}")
    nodes = int(train_cfg.get("nnodes", 1))
    profile_nodes = _profile_value("LLMRNN_TRAIN_NODES")
    if nodes != profile_nodes:
        problems.append(f"train.nnodes is {nodes} but profiles/slurm requests {profile_nodes} node(s): "
                        f"export LLMRNN_TRAIN_NODES={nodes}")
    judge = _judge_gpus_needed(config)
    profile_judge = _profile_value("LLMRNN_JUDGE_GPUS")
    if judge is not None and judge > profile_judge:
        problems.append(f"the judge needs {judge} GPU(s) but profiles/slurm requests {profile_judge}: "
                        f"export LLMRNN_JUDGE_GPUS={judge}")
    return problems


def check_gpu_stack(config: dict) -> list[str]:
    """verl/vLLM releases installed here that the config cannot use; more than one training node."""
    from llmrnn.gpu_stack import stack_problems

    return stack_problems(config)


def check_upload(config: dict) -> list[str]:
    rel = config.get("release") or {}
    if not rel.get("upload"):
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
    from llmrnn.upload import env_problems

    return [f"config: {p}" for p in env_problems(config)]


def _endpoint_problems(where: str, cfg: dict, allowed: bool, opt_in: str) -> list[str]:
    """An OpenAI-compatible endpoint that receives patient text: a url; a host outside the site only with
    the opt-in; and then (or whenever a key variable is named) the key in the environment now, not when
    the job starts hours later."""
    from llmrnn.backends import external_host, external_problem
    from llmrnn.upload import env_name_problem

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
    return problems


def check_engine_budget(config: dict) -> list[str]:
    """The vLLM engines each forward-pass job opens, planned by the code the jobs run
    (llmrnn.backends.plan_engines via rnn.make_roles), fit the GPUs the job asks for: trajectory shards and
    eval shards of the base and the trained memory model (a second model: split budget, or a LoRA)."""
    from llmrnn.backends import gpu_budget_problems, plan_engines

    roles = config.get("roles") or {}
    if not any((r or {}).get("backend") == "vllm" for r in roles.values()):
        return []
    problems = []
    jobs = [("trajectory_shard", "trajectories", None), ("eval_shard (base)", "eval", None),
            ("eval_shard (trained)", "eval", {"memory": "<trained memory model>"})]
    for where, section, paths in jobs:
        gpus = (((config.get(section) or {}).get("resources")) or {}).get("gpu")
        plan = plan_engines(roles, paths)
        problems += gpu_budget_problems(plan, 1 if gpus is None else int(gpus), where)
    return problems


def check_prompt_lengths(config: dict) -> list[str]:
    """The longest prompt each role can render fits its max_model_len (and the policy's prompt
    train.max_prompt_length), counted with the role model's tokenizer (llmrnn.promptfit)."""
    from llmrnn import promptfit
    from llmrnn.cohort import load_cohort

    if config.get("recipe") == "qa":
        return []
    source = (config.get("cohort") or {}).get("source", "synthetic")
    patients = load_cohort(source) if source != "synthetic" and Path(source).is_file() else None
    problems, notes = promptfit.check(config, patients)
    for note in notes:
        log.warning("check: %s", note)
    return problems


CHECKS: list[tuple[str, Callable[[dict], list[str]]]] = [
    ("secrets", check_env_names),
    ("patient text", check_external_endpoints),
    ("cohort", check_cohort),
    ("qa data", check_qa_data),
    ("models", check_models),
    ("judge", check_judge),
    ("training", check_training),
    ("prompt length", check_prompt_lengths),
    ("gpu memory", check_engine_budget),
    ("gpu stack", check_gpu_stack),
    ("upload", check_upload),
]


# checks that belong to one recipe (the rest apply to both)
RECIPE_ONLY = {"qa data": "qa"}


def run_checks(config_paths: list[Path]) -> dict:
    """Every check, each isolated (one crashing check is a problem, not the end of the list)."""
    config, problems = load_config(config_paths)
    schema_ok = not any(p.startswith("config: ") for p in problems)
    ran = ["schema"]
    for name, fn in CHECKS:
        if RECIPE_ONLY.get(name, config.get("recipe")) != config.get("recipe"):
            continue  # each recipe's own checks only
        try:
            problems += fn(config)
        except Exception as exc:  # noqa: BLE001 - report and go on: the point is to list everything
            if schema_ok:
                problems.append(f"{name}: check crashed: {type(exc).__name__}: {exc}")
            else:  # a value the schema already named (e.g. a list where a number belongs) tripped it
                problems.append(f"{name}: not checked: fix the config problems above first")
        ran.append(name)
    return {"ok": not problems, "problems": problems, "checks": ran,
            "configfiles": [str(p) for p in config_paths], "run_name": config.get("run_name"),
            "advice": smoke_advice(config)}


SMOKE_COMMAND = "snakemake --profile slurm all --configfile config/smoke.yaml"


def smoke_advice(config: dict) -> list[str]:
    """A long verl run (more steps than the smoke test's few) gets told to run the cluster smoke test first."""
    train = config.get("train") or {}
    steps = train.get("total_steps")
    if not isinstance(train, dict) or train.get("engine", "verl") != "verl" or (isinstance(steps, int) and steps <= 4):
        return []
    return [(f"first run the cluster smoke test on this cluster ({SMOKE_COMMAND}, about 15 min on one GPU node; "
             "docs/cluster.md 'Smoke test first'): it fails in minutes where this run would fail after hours")]


def _cmd_check(args: argparse.Namespace) -> int:
    # like the Snakefile: the given files alone, config/config.yaml only when none is given
    from llmrnn.runconfig import configfiles_for

    report = run_checks(configfiles_for(args.configfile))
    if args.out:
        from llmrnn.io import write_json

        write_json(args.out, report)
    files = " + ".join(report["configfiles"])
    for advice in report["advice"]:
        print(f"llmrnn check: {advice}", file=sys.stderr)
    if report["ok"]:
        print(f"llmrnn check: OK ({files}; checked {', '.join(report['checks'])})")
        return 0
    print(f"llmrnn check: {len(report['problems'])} problem(s) with {files}:", file=sys.stderr)
    for problem in report["problems"]:
        print(f"  - {problem}", file=sys.stderr)
    return 1


def register(sub) -> None:
    p = sub.add_parser(
        "check",
        help="pre-submit check: list every problem of the config and its inputs before queueing",
        description=__doc__.splitlines()[0],
    )
    p.add_argument("--configfile", nargs="*", default=[],
                   help="config files layered in order, as snakemake --configfile; none: config/config.yaml")
    p.add_argument("--out", help="also write the report as JSON")
    p.set_defaults(func=_cmd_check)
