"""Issue 40: a stray `./wandb` (`./mlflow`, `./tensorboard`) in the working directory. The Python children we start
do not import from their working directory (PYTHONSAFEPATH, llmrnn.safe_path), and `llmrnn check` says which
path shadows a train.report_to tracker instead of passing a folder that is not the package."""

from __future__ import annotations

import json
import re
import sys
import textwrap
from pathlib import Path

import pytest

from llmrnn.check.training import tracker_problems
from llmrnn.settings.train import Train
from tests.conftest import REPO


def _stray_folder(cwd: Path, name: str) -> Path:
    """What W&B leaves where a run starts: a folder of run data, no __init__.py."""
    (cwd / name / "run-20240101_000000-abc").mkdir(parents=True)
    (cwd / name / "debug.log").write_text("a log\n")
    return cwd / name


def test_a_reward_child_does_not_import_from_its_working_directory(tmp_path, monkeypatch):
    from llmrnn.reward.custom import load

    _stray_folder(tmp_path, "wandb")
    (tmp_path / "rewards").mkdir()
    reward = tmp_path / "rewards" / "my_reward.py"
    reward.write_text(textwrap.dedent("""
        import importlib.util, os, sys

        def compute_score(data_source, solution_str, ground_truth, extra_info, **kwargs):
            here = os.path.realpath(os.getcwd())
            on_path = any(os.path.realpath(p or ".") == here for p in sys.path)
            return float(on_path) + 10 * float(importlib.util.find_spec("wandb") is not None)
        """))
    monkeypatch.chdir(tmp_path)
    fn = load(str(reward))
    try:
        score = fn(data_source="d", solution_str="s", ground_truth="g", extra_info={})
    finally:
        fn.close()
    assert score == 0.0, "the child had its working directory on sys.path, or found the stray ./wandb"


def test_a_reward_file_imports_a_helper_module_beside_it(tmp_path, monkeypatch):
    """The working directory is off the child's path, the reward file's own folder is on it (last)."""
    from llmrnn.reward.custom import load

    (tmp_path / "rewards").mkdir()
    (tmp_path / "rewards" / "my_helpers.py").write_text("BONUS = 0.25\n")
    reward = tmp_path / "rewards" / "my_reward.py"
    reward.write_text(textwrap.dedent("""
        from my_helpers import BONUS

        def compute_score(data_source, solution_str, ground_truth, extra_info, **kwargs):
            return 0.5 + BONUS
        """))
    monkeypatch.chdir(tmp_path)
    fn = load(str(reward))
    try:
        assert fn(data_source="d", solution_str="s", ground_truth="g", extra_info={}) == 0.75
    finally:
        fn.close()


MAIN_PPO_RECORDER = textwrap.dedent("""
    import importlib.util, json, os, sys
    spec = importlib.util.find_spec("wandb")
    with open(os.environ["RECORD_TO"], "w") as fh:
        json.dump({"sys_path": sys.path, "wandb": None if spec is None else list(spec.submodule_search_locations or [])}, fh)
    """)


def test_verl_main_ppo_does_not_import_from_its_working_directory(tmp_path, monkeypatch):
    """The command and environment verl_cmd runs main_ppo with (a stand-in main_ppo records what it sees)."""
    from llmrnn.train import verl_cmd, verl_overrides

    fake = tmp_path / "fake"
    (fake / "verl" / "trainer").mkdir(parents=True)
    for init in ("verl/__init__.py", "verl/trainer/__init__.py"):
        (fake / init).write_text("")
    (fake / "verl" / "trainer" / "main_ppo.py").write_text(MAIN_PPO_RECORDER)
    cwd = tmp_path / "cwd"
    cwd.mkdir()
    _stray_folder(cwd, "wandb")
    monkeypatch.chdir(cwd)
    monkeypatch.setenv("PYTHONPATH", str(fake))
    monkeypatch.setenv("RECORD_TO", str(tmp_path / "seen.json"))
    monkeypatch.setattr(verl_cmd, "POLL_S", 0.05)
    out = tmp_path / "train"
    (out / "state").mkdir(parents=True)
    env = verl_cmd.main_ppo_env(out / "state" / "verl_metrics.jsonl")
    verl_cmd._main_ppo(verl_overrides.command([], sys.executable), env, out, follow=lambda: None)
    seen = json.loads((tmp_path / "seen.json").read_text())
    assert str(cwd) not in seen["sys_path"] and "" not in seen["sys_path"], seen["sys_path"]
    assert seen["wandb"] is None, seen  # the stray folder is not found as `wandb`


def test_every_python_child_we_start_gets_the_safe_path_environment():
    """A module that builds a `python -m` / `python -c` command line takes its environment from
    llmrnn.safe_path (the reward child through custom_reward_child.child_env, which does; main_ppo's command
    line, built apart from its launch, through verl_cmd.main_ppo_env)."""
    launch = re.compile(r"(?:sys\.executable|\bpython)\b[^\n\]]*,\s*\"-[mc]\"")
    via = {"reward/custom.py": "child_env()", "train/verl_overrides.py": "main_ppo_env"}
    missing = []
    for path in sorted((REPO / "src" / "llmrnn").rglob("*.py")):
        text = path.read_text()
        rel = str(path.relative_to(REPO / "src" / "llmrnn"))
        if launch.search(text) and "safe_path_env(" not in text and via.get(rel, "\0") not in text:
            missing.append(rel)
    assert missing == [], f"these start a Python child without llmrnn.safe_path.safe_path_env: {missing}"


@pytest.mark.parametrize("tracker", ["wandb", "mlflow"])
def test_a_stray_folder_named_like_a_missing_tracker_is_named_by_the_check(tracker, tmp_path, monkeypatch):
    import importlib.util

    if importlib.util.find_spec(tracker) is not None:
        pytest.skip(f"{tracker} is installed here")
    folder = _stray_folder(tmp_path, tracker)
    monkeypatch.chdir(tmp_path)
    monkeypatch.syspath_prepend(str(tmp_path))  # as `python -m llmrnn.cli check` has it
    problems = tracker_problems(Train(report_to=[tracker]))
    assert len(problems) == 1, problems
    assert problems[0].startswith(f"train.report_to: {tracker} is not installed") and str(folder) in problems[0]
    assert "\n" not in problems[0]


def test_a_stray_tensorboard_folder_does_not_shadow_the_installed_one(tmp_path, monkeypatch):
    """A folder without __init__.py loses to an installed package: no false alarm."""
    _stray_folder(tmp_path, "tensorboard")
    monkeypatch.chdir(tmp_path)
    monkeypatch.syspath_prepend(str(tmp_path))
    assert tracker_problems(Train(report_to="tensorboard")) == []


@pytest.mark.parametrize("shape", ["tensorboard.py", "tensorboard/__init__.py"])
def test_a_tracker_module_in_the_working_directory_is_named_as_shadowing_the_installed_one(shape, tmp_path,
                                                                                          monkeypatch):
    (tmp_path / shape).parent.mkdir(parents=True, exist_ok=True)
    (tmp_path / shape).write_text("# someone's script, not TensorBoard\n")
    monkeypatch.chdir(tmp_path)
    monkeypatch.syspath_prepend(str(tmp_path))
    monkeypatch.delitem(sys.modules, "tensorboard", raising=False)
    problems = tracker_problems(Train(report_to="tensorboard"))
    shadow = tmp_path / shape.split("/")[0]
    assert len(problems) == 1 and problems[0].startswith(f"train.report_to: tensorboard: {shadow} in the working "
                                                         "directory shadows the installed "), problems
    assert "site-packages" in problems[0]


def test_a_package_without_the_api_we_call_is_refused(tmp_path, monkeypatch):
    """A package named like the tracker elsewhere on the path (a stub, a half-removed install)."""
    (tmp_path / "elsewhere" / "wandb").mkdir(parents=True)
    (tmp_path / "elsewhere" / "wandb" / "__init__.py").write_text("# not W&B\n")
    monkeypatch.syspath_prepend(str(tmp_path / "elsewhere"))
    monkeypatch.delitem(sys.modules, "wandb", raising=False)
    try:
        problems = tracker_problems(Train(report_to="wandb"), cwd=tmp_path)
    finally:
        sys.modules.pop("wandb", None)
    init = tmp_path / "elsewhere" / "wandb" / "__init__.py"
    assert problems == [(f"train.report_to: wandb: {init} has no wandb.init (not the wandb package, or a broken "
                         "install): reinstall wandb")], problems
