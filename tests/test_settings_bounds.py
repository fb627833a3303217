"""Settings, round 5: every numeric key has the bounds its consumer can honour (the schema `check` and
Snakemake validate against says so), `check` refuses a tracker that is not installed, and its OK line names
only what it checked, listing what it skipped."""

from __future__ import annotations

import pytest

from llmrnn.check.config import load_config
from llmrnn.settings import Config
from llmrnn.settings.render import _leaf_rows
from llmrnn.settings.train import Train
from tests.conftest import REPO


@pytest.mark.parametrize(("overlay", "key"), [
    ("reward: {timeout_s: 1.0e+300}\n", "reward.timeout_s"),
    ("reward: {call_budget_s: 1.0e+300}\n", "reward.call_budget_s"),
    ("train: {seed: 1099511627776}\n", "train.seed"),
    ("train: {seed: -1}\n", "train.seed"),
    ("eval: {stats: {bootstrap: {samples: 1000000000000}}}\n", "eval.stats.bootstrap.samples"),
    ("split: {seed: 4294967296}\n", "split.seed"),
    ("reward: {custom: {path: r.py, max_abs: 1.0e+300}}\n", "reward.custom.max_abs"),
])
def test_a_value_past_its_consumers_limit_is_refused_by_the_schema(tmp_path, overlay, key):
    layer = tmp_path / "layer.yaml"
    layer.write_text(overlay)
    _, problems = load_config([REPO / "config" / "config.yaml", layer], REPO / "workflow/schemas/config.schema.yaml")
    assert any(p.startswith(f"config: {key}: ") for p in problems), problems


def test_every_numeric_setting_has_both_bounds():
    """Not just the examples: every int/float key of every section states a lowest and a highest value."""
    unbounded = []
    for path, info in _leaf_rows(Config):
        kind = str(info.annotation)
        if ("int" not in kind and "float" not in kind) or "Literal" in kind:
            continue
        have = {type(m).__name__ for m in info.metadata}
        if not ({"Ge", "Gt"} & have and {"Le", "Lt"} & have):
            unbounded.append(path)
    assert not unbounded, unbounded


def test_check_refuses_a_tracker_that_is_not_installed(in_workflow, tmp_path):
    import importlib.util

    from llmrnn.check.training import tracker_problems

    missing = next((t for t in ("wandb", "mlflow") if importlib.util.find_spec(t) is None), None)
    if missing is None:
        pytest.skip("wandb and mlflow are both installed here")
    problems = tracker_problems(Train(report_to=[missing]))
    assert len(problems) == 1 and problems[0].startswith(f"train.report_to: {missing} is not installed")
    assert tracker_problems(Train(report_to="tensorboard")) == []  # installed: the tests read its events


@pytest.mark.parametrize("value", [5, {"wandb": True}, [["wandb"]], 1.5])
def test_a_report_to_of_the_wrong_shape_is_one_line_not_a_crash(value):
    from llmrnn.check.training import check_training

    problems = check_training({"train": {"report_to": value}})
    assert len(problems) == 1 and problems[0].startswith("train: train.report_to: "), problems


def test_the_ok_line_lists_what_was_skipped_not_as_checked(in_workflow, monkeypatch, capsys, tmp_path):
    """Without sinfo (no SLURM here) the time limits are skipped, and the OK line says so."""
    from llmrnn import check

    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    for tool in ("python", "python3"):
        (bin_dir / tool).symlink_to(__import__("sys").executable)
    monkeypatch.setenv("PATH", str(bin_dir))
    report = check.run_checks([in_workflow / "config" / "config.yaml"])
    assert report["ok"], report["problems"]
    assert "slurm time limits" not in report["checks"]
    assert any(s.startswith("slurm time limits (no sinfo here") for s in report["skipped"]), report["skipped"]


def test_the_ok_line_names_checks_with_nothing_to_check_as_not_needed(in_workflow, monkeypatch, capsys):
    """The default config has no own reward, no upload, no vLLM role and no outside endpoint: those checks are
    listed as not needed, never as checked; a check whose every item was skipped is not listed as checked."""
    from llmrnn import check

    report = check.run_checks([in_workflow / "config" / "config.yaml"])
    assert report["ok"], report["problems"]
    names = {s.split(" (")[0] for s in report["not_needed"]}
    assert {"own reward", "upload", "gpu memory", "patient text"} <= names, report["not_needed"]
    assert not names & set(report["checks"]), (report["checks"], report["not_needed"])
    assert not (in_workflow / "resources" / "models").exists()  # no role's tokenizer: no prompt was counted
    assert any(s.startswith("prompt length (no role's model folder") for s in report["skipped"]), report["skipped"]
    assert "prompt length" not in report["checks"]
