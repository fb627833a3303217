"""Config rules the schema cannot state (llmrnn.configcheck), applied where a config is validated:
Snakemake's parse, `llmrnn check` and every verb's `--cfg`; and the path-safe names in the schema."""

from __future__ import annotations

import json

import pytest
import yaml

from llmrnn import check
from llmrnn.cli import main
from llmrnn.configcheck import config_problems, shard_problems, value_problems
from tests.conftest import REPO, snakemake

SECRET = "hf_" + "AbCdEf0123456789XyZ" * 2  # shaped like a Hub token, made up
PASSWORD = "s3cr3t-Pa55"


def _check(tmp_path, override: dict) -> list[str]:
    path = tmp_path / "over.yaml"
    path.write_text(yaml.safe_dump(override))
    return check.run_checks([REPO / "config/config.yaml", path])["problems"]


NON_FINITE = [
    ({"train": {"lr": float("inf")}}, "train.lr"),
    ({"eval": {"final_judge": {"matcher": {"threshold": float("nan")}}}}, "eval.final_judge.matcher.threshold"),
    ({"reward": {"outcome_epsilon": float("nan")}}, "reward.outcome_epsilon"),
    ({"qa": {"reward": {"weights": {"format": float("-inf")}}}}, "qa.reward.weights.format"),
    ({"roles": {"memory": {"temperature": float("nan")}}}, "roles.memory.temperature"),
    ({"merge": {"logits_atol": float("inf")}}, "merge.logits_atol"),
]


@pytest.mark.parametrize(("override", "key"), NON_FINITE, ids=[k for _, k in NON_FINITE])
def test_nan_and_infinity_are_refused_for_every_numeric_key(in_workflow, tmp_path, override, key):
    problems = _check(tmp_path, override)
    lines = [p for p in problems if p.startswith(f"config: {key}:")]
    assert len(lines) == 1 and "not a finite number" in lines[0], problems
    assert not any("check crashed" in p for p in problems), problems


def test_the_walk_names_list_items_and_leaves_finite_numbers_alone():
    assert value_problems({"a": [1.5, {"b": float("nan")}], "c": 0.0, "d": 10**30}) == [
        "a[1].b: nan is not a finite number (NaN and infinities are refused for every numeric key)"]
    assert value_problems(yaml.safe_load((REPO / "config/config.yaml").read_text())) == []
    assert value_problems(yaml.safe_load((REPO / "config/reproduce.yaml").read_text())) == []


def test_preflight_training_refuses_an_infinite_learning_rate(tmp_path, capsys):
    """`train.lr: .inf` passed the training preflight: the --cfg JSON (Infinity) is refused on parse."""
    cfg = json.dumps({"train": {"lr": float("inf"), "engine": "trl"}})
    assert "Infinity" in cfg
    rc = main(["preflight", "training", "--cfg", cfg, "--train", str(tmp_path / "t.parquet"),
               "--model", str(tmp_path)])
    err = capsys.readouterr().err.strip().splitlines()
    assert rc == 2 and err == [
        ("llmrnn preflight: error: --cfg: config: train.lr: inf is not a finite number (NaN and infinities are "
        "refused for every numeric key)")]


@pytest.mark.parametrize("name", ["..", ".", "-rf", "a/b", "../escape", "", ".hidden", "x" * 200])
def test_run_name_must_be_a_path_safe_name(in_workflow, tmp_path, name):
    problems = _check(tmp_path, {"run_name": name})
    assert any(p.startswith("config: run_name:") for p in problems), problems


def test_model_names_become_folders_and_must_be_path_safe(in_workflow, tmp_path):
    problems = _check(tmp_path, {"models": {"..": {"source": "local", "path": "/tmp"}}})
    assert any(p.startswith("config: models:") and "'..'" in p for p in problems), problems


@pytest.mark.parametrize(("override", "key"), [
    ({"cohort": {"synthetic": {"patients": "many"}}}, "cohort.synthetic.patients"),
    ({"split": {"val_size": [3]}}, "split.val_size"),
    ({"train": {"batch": {"train": "sixteen"}}}, "train.batch.train"),
    ({"train": "fast"}, "train"),
])
def test_an_invalid_type_is_one_schema_line_not_a_crashed_check(in_workflow, tmp_path, capsys, override, key):
    path = tmp_path / "over.yaml"
    path.write_text(yaml.safe_dump(override))
    assert main(["check", "--configfile", str(path)]) == 1
    err = capsys.readouterr().err
    assert f"  - config: {key}: " in err, err
    assert "crashed" not in err and "Traceback" not in err, err


def test_more_eval_shards_than_test_patients_are_refused(in_workflow, tmp_path):
    problems = _check(tmp_path, {"eval": {"shards": 1000, "max_patients": None}})
    lines = [p for p in problems if p.startswith("config: eval.shards:")]
    assert lines == [("config: eval.shards: 1000 shards for at most 44 test patients (cohort.synthetic.patients 60 - "
                     "split.val_size 4 - split.train_size 12); set eval.shards <= 44")], problems
    assert [p for p in _check(tmp_path, {"eval": {"shards": 21}}) if "eval.shards" in p] == [
        "config: eval.shards: 21 shards for at most 20 test patients (eval.max_patients 20); set eval.shards <= 20"]
    assert not [p for p in _check(tmp_path, {"eval": {"shards": 20}}) if "shards" in p]
    assert shard_problems({"trajectories": {"shards": 13}, "split": {"val_size": 4, "train_size": 12}}) == [
        ("trajectories.shards: 13 shards per split for splits of 4 (val) and 12 (train) patients; "
        "set trajectories.shards <= 12")]


def test_eval_shards_are_checked_against_a_cohort_file(in_workflow, tmp_path):
    from llmrnn.cohort import dump_cohort, synthesize_cohort

    cohort = tmp_path / "cohort.json"
    cohort.write_text(dump_cohort(synthesize_cohort(30, 1)))
    problems = _check(tmp_path, {"cohort": {"source": str(cohort)}, "eval": {"shards": 15, "max_patients": None}})
    lines = [p for p in problems if "eval.shards" in p]
    assert len(lines) == 1 and "set eval.shards <= 14" in lines[0], problems


@pytest.mark.parametrize(("override", "key"), [
    ({"release": {"commit_message": f"release with {SECRET}"}}, "release.commit_message"),
    ({"release": {"tags": ["llmrnn", SECRET]}}, "release.tags[1]"),
    ({"release": {"license": SECRET}}, "release.license"),
    ({"release": {"endpoint": f"https://me:{PASSWORD}@hub.example.org"}}, "release.endpoint"),
    ({"roles": {"memory": {"url": f"http://user:{PASSWORD}@10.0.0.5:8000/v1"}}}, "roles.memory.url"),
    ({"eval": {"final_judge": {"llm": {"url": f"https://{SECRET}@api.example.org/v1"}}}},
     "eval.final_judge.llm.url"),
])
def test_credentials_in_config_values_are_refused_without_being_repeated(in_workflow, tmp_path, override, key):
    problems = _check(tmp_path, override)
    lines = [p for p in problems if p.startswith(f"config: {key}:")]
    assert len(lines) == 1 and ("credential" in lines[0]), problems
    assert not any(SECRET in p or PASSWORD in p for p in problems), problems


def test_credentials_in_a_value_of_the_wrong_type_are_not_repeated_by_the_schema(in_workflow, tmp_path):
    problems = _check(tmp_path, {"release": {"tags": {"first": SECRET}}})  # a mapping where a list belongs
    assert any(p.startswith("config: release.tags:") and "not valid" in p for p in problems), problems
    assert any(p.startswith("config: release.tags.first:") and "credential" in p for p in problems), problems
    assert not any(SECRET in p for p in problems), problems


def test_plain_urls_and_user_at_host_are_fine():
    assert config_problems({"roles": {"memory": {"url": "http://127.0.0.1:8000/v1"}},
                            "release": {"commit_message": "mail me at a@b.org", "endpoint": "https://hub.example"},
                            "cohort": {"source": "ssh://git@example.org/cohort.json"}}) == []


@pytest.mark.slow
def test_snakemake_parse_refuses_nan_credentials_shards_and_unsafe_run_names(workflow_dir):
    cases = {
        "nan": ({"eval": {"final_judge": {"matcher": {"threshold": float("nan")}}}},
                "config: eval.final_judge.matcher.threshold: nan is not a finite number"),
        "url": ({"roles": {"memory": {"url": f"http://u:{PASSWORD}@host:1/v1"}}},
                "config: roles.memory.url: a http URL with credentials"),
        "shards": ({"eval": {"shards": 1000, "max_patients": None}}, "config: eval.shards: 1000 shards for at most 44"),
        "run_name": ({"run_name": ".."}, "run_name"),
    }
    for name, (override, want) in cases.items():
        path = workflow_dir / f"{name}.yaml"
        path.write_text(yaml.safe_dump(override))
        proc = snakemake(workflow_dir, "-n", "--configfile", "config/config.yaml", str(path), check=False)
        out = proc.stdout + proc.stderr
        assert proc.returncode != 0 and want in out, (name, out[-2000:])
        assert PASSWORD not in out
        assert not (workflow_dir / "results").exists()


def test_a_misspelt_key_keeps_its_section_for_the_other_checks(in_workflow, tmp_path):
    """Only a bad VALUE is replaced by its default for the later checks: a typo beside good keys must not
    reset the whole section (the schema defaults, 100 + 100 patients, would not fit the demo cohort)."""
    problems = _check(tmp_path, {"split": {"val_size": 4, "train_size": 12, "val_sise": 3}})
    assert [p for p in problems if "val_sise" in p] and not [p for p in problems if p.startswith("cohort.source")], \
        problems
