"""One concept, one home: where two stages need the same notion (is this prediction correct? is this a
memory? which shard? read a JSONL file), they call one function, so they cannot disagree."""

from __future__ import annotations

import ast
import functools
import json
import math
from pathlib import Path

import pytest

from llmrnn import evaluate, io, jsonparse, models, preflight, release, rnn, stats, trajectories
from llmrnn.errors import InputError
from llmrnn.matching import Matcher
from llmrnn.reward import outcome_share

SRC = Path(__file__).resolve().parents[1] / "src" / "llmrnn"

# (predicted, ground truth, correct?) in the spellings discharge summaries and small models use
CASES = [
    ("CHF", "Congestive heart failure", True),
    ("1. Sepsis.", "sepsis", True),
    ("Urinary tract infections", "UTI", True),
    ("A-fib", "atrial fibrillation", True),
    ("Essential hypertension", "hypertension", True),
    ("Pneumonia", "pulmonary embolism", False),
    ("COPD exacerbation", "acute kidney injury", False),
    ("", "sepsis", False),
]


@pytest.mark.parametrize("predicted, truth, correct", CASES)
def test_forward_pass_final_judge_and_reward_agree_on_correct_predictions(predicted, truth, correct):
    prediction = {"primary_diagnosis": predicted, "top_5_diagnoses": [predicted] if predicted else []}
    matcher = Matcher()
    held_out = matcher.grade(prediction, [truth])
    forward = rnn.fallback_evaluation(prediction, [truth])
    assert held_out["primary_correct"] is forward["primary_correct"] is correct
    assert held_out["any_top5_correct"] is forward["any_top5_correct"] is correct
    assert forward["missed_diagnoses"] == ([] if correct else [truth])
    # the reward's outcome term: a memory naming the diagnosis anticipates it as the matcher would
    share = outcome_share(predicted, [truth])
    assert share >= matcher.threshold if correct else share == 0.0


OUTPUTS = [
    '{"evolving_summary": "CHF, CKD."}',
    '```json\n{"evolving_summary": "CHF"}\n```',
    'Here it is: {"evolving_summary": "CHF"}',
    '{"evolving_summary": "CHF", "extra": 1',
    '{"evolving_summary": {"problems": ["CHF"]}}',
    '{"evolving_summary": ""}',
    '{"evolving_summary": 3}',
    "[1, 2]",
    "plain prose",
    "",
]


@pytest.mark.parametrize("text", OUTPUTS)
def test_one_parse_memory_whatever_the_reward_accepts_the_forward_pass_accepts_alike(text):
    strict, method = jsonparse.parse_memory(text, strict=True)
    lenient, _ = jsonparse.parse_memory(text)
    if strict:
        assert lenient == strict and method in ("plain", "fenced")
    if strict == "":  # an empty memory: the judge scores it; the forward pass keeps h_{t-1} instead
        assert lenient is None
    assert isinstance(method, str)


def test_strictness_is_the_reward_edge_table():
    accepted = [t for t in OUTPUTS if jsonparse.parse_memory(t, strict=True)[0] is not None]
    assert accepted == [*OUTPUTS[:2], OUTPUTS[5]]  # prose around the JSON, cut off, non-text: "not valid JSON"
    lenient = [t for t in OUTPUTS if jsonparse.parse_memory(t)[0] is not None]
    assert lenient == OUTPUTS[:5]


def test_one_as_bool_and_one_json_scanner_for_the_final_judge():
    verdict = evaluate.parse_judge_verdict('Sure.\n```json\n{"primary_correct": "correct", "any_top5_correct": "no"}\n```')
    assert verdict == {"primary_correct": True, "any_top5_correct": True, "judge_ok": True}
    assert jsonparse.as_bool("incorrect") is False and jsonparse.as_bool("maybe") is None


def test_one_percentile_q_in_0_100():
    assert stats.percentile([], 50) is None
    assert stats.percentile([1.0, 2.0, 3.0, 4.0], 50) == 2.5  # preflight latencies: interpolated
    assert stats.percentile([10, 20, 30, 40], 50, "inverted_cdf") == 20  # token lengths: an observed value
    assert stats.percentile([10, 20, 30, 40], 95, "inverted_cdf") == 40
    assert math.isclose(stats.percentile([0.1, 0.2], 95), 0.195)


def test_one_sharding_policy_for_trajectories_and_eval():
    patients = [{"subject_id": i, "visits": [{}] * (3 + i % 4)} for i in range(11)]
    assert evaluate.shard_of is trajectories.shard_of
    parts = [trajectories.shard_of(patients, k, 3) for k in range(3)]
    assert parts == trajectories.assign_shards(patients, 3)
    with pytest.raises(InputError, match="shard -1 out of range"):
        trajectories.shard_of(patients, -1, 3)


def test_one_jsonl_reader_names_file_and_line(tmp_path):
    path = tmp_path / "metrics.jsonl"
    path.write_text('{"step": 1, "reward_mean": 0.5}\n\n{"step": 2,\n', encoding="utf-8")
    with pytest.raises(InputError, match=r"metrics.jsonl: line 3: not JSON"):
        release.metrics_summary(path)
    assert io.read_jsonl(path, skip_bad=True) == [{"step": 1, "reward_mean": 0.5}]
    io.write_jsonl(path, [{"b": 1, "a": 2}])
    assert path.read_text(encoding="utf-8") == '{"a": 2, "b": 1}\n'


def test_resumed_training_drops_metrics_past_its_step_and_a_cut_off_line(tmp_path):
    from llmrnn.train.metrics import MetricsWriter

    writer = MetricsWriter(tmp_path / "metrics.jsonl")
    for step in (1, 2, 3):
        writer.append({"step": step, "kind": "train"})
    with open(writer.path, "a", encoding="utf-8") as fh:
        fh.write('{"step": 4, "ki')  # killed mid-line
    assert writer.truncate_after(2) == 2
    assert [r["step"] for r in io.read_jsonl(writer.path)] == [1, 2]


def test_ready_marker_stands_for_its_model_folder(tmp_path):
    assert models.model_folder(tmp_path / "m" / ".ready") == tmp_path / "m"
    assert models.model_folder(tmp_path / "m") == tmp_path / "m"
    assert preflight.model_folder is models.model_folder


def test_every_jsonl_file_is_read_through_io():
    spelled = [path.name for path in sorted(SRC.rglob("*.py"))
               if path.name != "io.py" and "json.loads(line" in path.read_text(encoding="utf-8")]
    assert spelled == []


def test_only_models_knows_what_a_ready_marker_is():
    """Every other module asks `models.model_folder`, so a renamed marker can only fail in one place."""
    spelled = [path.name for path in sorted(SRC.rglob("*.py"))
               if path.name != "models.py" and '== ".ready"' in path.read_text(encoding="utf-8")]
    assert spelled == []


def test_deep_merge_keeps_unset_keys_and_replaces_lists():
    merged = io.deep_merge({"a": {"x": 1, "y": [1, 2]}, "b": 1}, {"a": {"y": [3]}, "c": None})
    assert merged == {"a": {"x": 1, "y": [3]}, "b": 1, "c": None}


# --------------------------------------------------------------------------- no second home in src/
ONE_HOME = {
    # concept: the one module allowed to define a function or class of one of these names
    "percentile": ("stats", {"percentile", "_percentile"}),
    "as_bool": ("jsonparse", {"as_bool", "_as_bool"}),
    "json scanner": ("jsonparse", {"JsonScanner", "_first_json_object"}),
    "parse_memory": ("jsonparse", {"parse_memory"}),
    "sharding": ("trajectories", {"shard_of", "assign_shards"}),
    "jsonl": ("io", {"read_jsonl", "write_jsonl", "read_rows", "_truncate_jsonl"}),
    "deep merge": ("io", {"deep_merge", "_merge", "_deep_merge"}),
    # the schema's defaults into a config (check used to keep its own beside runconfig's)
    "schema defaults": ("runconfig", {"fill_defaults", "_fill_defaults", "with_defaults", "filled"}),
    "model folder": ("models", {"model_folder", "_model_dir"}),
    "text normalising": ("matching", {"normalise", "_norm", "_same"}),
    # whether a config's reward asks the judge (rules plan judge_server, check wants its model, only then)
    "asks judge": ("reward.config", {"asks_judge", "needs_judge", "uses_judge", "judge_needed"}),
    # what a reward mode is: the objects every consumer asks (scorer, preflight, train, manifest, report, card)
    "reward mode": ("reward.modes", {"reward_mode", "RewardMode", "mode_named"}),
}


@functools.cache  # the package parsed once for the module, not once per concept (read only)
def _definitions() -> dict[str, list[str]]:
    found: dict[str, list[str]] = {}
    for path in sorted(SRC.rglob("*.py")):
        module = ".".join(path.relative_to(SRC).with_suffix("").parts)
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
                found.setdefault(node.name, []).append(module)
    return found


@pytest.mark.parametrize("concept", sorted(ONE_HOME))
def test_each_concept_is_defined_in_one_module(concept):
    home, names = ONE_HOME[concept]
    defs = _definitions()
    where = {name: defs[name] for name in names if name in defs}
    assert where, f"{concept}: no definition found (renamed? update ONE_HOME)"
    assert all(modules == [home] for modules in where.values()), f"{concept}: defined in {where}"


def test_reward_settings_are_arguments_not_environment_variables():
    """The reward's settings reach the scorer as arguments (verl's reward_kwargs, TRL's reward-function
    arguments): no module spells the old LLMRNN_* reward variables, and no reward module reads the environment."""
    old = ("LLMRNN_JUDGE_ENDPOINT", "LLMRNN_RUBRIC", "LLMRNN_AUDIT_DIR", "LLMRNN_REWARD_CFG", "LLMRNN_FALLBACK_GUARD")
    for path in sorted(SRC.rglob("*.py")):
        text = path.read_text(encoding="utf-8")
        assert not [n for n in old if n in text], f"{path}: spells an old reward variable"
        if "reward" in path.parts or path.name == "rewards.py":
            assert "os.environ" not in text and "getenv" not in text, f"{path}: a reward reads the environment"

def test_memory_json_round_trips_through_both_parsers():
    h = jsonparse.memory_json("CHF; CKD stage 3")
    assert json.loads(h) == {"evolving_summary": "CHF; CKD stage 3"}
    assert jsonparse.parse_memory(h, strict=True) == jsonparse.parse_memory(h) == ("CHF; CKD stage 3", "plain")


# --------------------------------------------------------------------------- defaults: schema == code
SCHEMA = Path(__file__).resolve().parents[1] / "workflow" / "schemas" / "config.schema.yaml"
_NO_DEFAULT = object()


def _schema_defaults(node: dict):
    """The defaults an object schema gives its keys (nested objects recursively); keys without one left out."""
    if node.get("properties"):
        out = {k: _schema_defaults(sub) for k, sub in node["properties"].items()}
        return {k: v for k, v in out.items() if v is not _NO_DEFAULT}
    return node.get("default", _NO_DEFAULT)


def _code_defaults():
    from dataclasses import asdict

    from llmrnn.release.manifest import settings as release_settings

    return {
        "release": release_settings(None),  # read through the models (runconfig.filled)
        "eval.final_judge.matcher": asdict(Matcher()),
    }


@pytest.mark.parametrize("section", sorted(_code_defaults()))
def test_schema_defaults_and_code_defaults_agree(section):
    """The package keeps its own defaults (verl workers import llmrnn.reward where the workflow folder is
    not), so the schema's `default:` values and the code's must be the same, key for key."""
    import yaml

    node = yaml.safe_load(SCHEMA.read_text(encoding="utf-8"))
    for key in section.split("."):
        node = node["properties"][key]
    expected = _schema_defaults(node)
    assert _code_defaults()[section] == expected


# --------------------------------------------------------------------------- GPU counts: profile == config
def test_slurm_profile_gpu_layout_is_the_reproduction_configs(monkeypatch):
    """profiles/slurm selects config/reproduce.yaml; the GPUs and nodes it requests by default for the judge
    and the trainer are the ones that config asks for, and `llmrnn check` knows the same defaults."""
    from llmrnn import check
    from llmrnn.rubric import load_rubric
    from llmrnn.train.config import settings
    from tests.slurm.dag import load_profile

    repo = SRC.parents[1]
    for name in check.PROFILE_GPU_DEFAULTS:
        monkeypatch.delenv(name, raising=False)
    monkeypatch.chdir(repo)
    config, problems = check.load_config([Path("config/config.yaml"), Path("config/reproduce.yaml")])
    assert not [p for p in problems if "cohort" not in p], problems  # the MIMIC cohort is not shipped
    train = settings(config["train"])
    judge_gpus = 1 if load_rubric(config["judge"]["rubric"]).needs_gpu else 0
    requested = load_profile({"PATH": "/usr/bin"})["set-resources"]
    assert (requested["train_grpo"]["gpu"], requested["train_grpo"]["nodes"], requested["judge_server"]["gpu"]) == (
        train.n_gpus_per_node, train.nnodes, judge_gpus)
    assert check.PROFILE_GPU_DEFAULTS == {"LLMRNN_TRAIN_GPUS": train.n_gpus_per_node,
                                          "LLMRNN_JUDGE_GPUS": judge_gpus, "LLMRNN_TRAIN_NODES": train.nnodes}
    assert check.check_profile_gpus(config, train) == []
