"""Your own reward (reward.custom): the docs' example runs, a wrong one is refused in one line by `llmrnn
check`, `train run` and preflight, TRL trains with it (the settings reaching it as arguments), and its
file's content is part of the jobs' code identity."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

from llmrnn.errors import CheckFailed, InputError
from llmrnn.reward import custom
from tests.judge_helpers import make_step
from tests.verl.rows import make_rows, write_parquet

REPO = Path(__file__).resolve().parents[1]
LLMRNN = str(Path(sys.executable).parent / "llmrnn")
WRONG = "def compute_score(solution_str, ground_truth):\n    return 1.0\n"


def docs_example() -> str:
    """The Python block of docs/rewards.md's "Your own reward" section, as a user copies it."""
    text = (REPO / "docs" / "rewards.md").read_text(encoding="utf-8")
    section = text.split("## Your own reward", 1)[1]
    return re.search(r"```python\n(.*?)```", section, re.DOTALL).group(1)


@pytest.fixture
def example(tmp_path) -> Path:
    path = tmp_path / "my_reward.py"
    path.write_text(docs_example())
    return path


def test_the_documented_example_is_a_complete_reward_of_ten_lines(example):
    assert len(docs_example().strip().splitlines()) <= 10
    fn = custom.load(str(example), "compute_score")
    step = json.dumps(make_step())
    wanted = json.loads(step)["next_ground_truth_diagnoses"]
    score = fn(data_source="d", solution_str=json.dumps({"evolving_summary": ", ".join(wanted)}),
               ground_truth=step, extra_info={})
    assert score == 1.0 and fn(data_source="d", solution_str="", ground_truth=step, extra_info={}) == 0.0
    assert custom.problem({"reward": {"custom": {"path": str(example)}}}) is None


@pytest.mark.parametrize("source,name,expected", [
    (WRONG, "compute_score", ("has signature (solution_str, ground_truth); verl calls (data_source, solution_str, "
                              "ground_truth, extra_info, **kwargs) (missing data_source, extra_info)")),
    ("def compute_score(data_source, solution_str, ground_truth, extra_info):\n    return 0\n", "compute_score",
     "(no **kwargs)"),
    ("def score(**kw):\n    return 0\n", "compute_score", "defines no 'compute_score'"),
    (None, "compute_score", "no such file"),
])
def test_a_wrong_own_reward_is_refused_by_check_in_one_line(tmp_path, source, name, expected):
    path = tmp_path / "bad_reward.py"
    if source is not None:
        path.write_text(source)
    line = custom.problem({"reward": {"custom": {"path": str(path), "name": name}}})
    assert line is not None and expected in line and "\n" not in line and line.startswith("reward.custom")


def test_llmrnn_check_names_a_wrong_signature(tmp_path):
    """The whole `llmrnn check` (schema: reward.custom is a known key) lists it as one problem line."""
    from llmrnn.check import run_checks

    bad = tmp_path / "bad_reward.py"
    bad.write_text(WRONG)
    config = tmp_path / "c.yaml"
    config.write_text(f"reward:\n  mode: outcome\n  custom: {{path: {bad}}}\n")
    report = run_checks([REPO / "config" / "config.yaml", config])
    mine = [p for p in report["problems"] if "reward.custom" in p]
    assert len(mine) == 1 and "verl calls (data_source, solution_str, ground_truth, extra_info, **kwargs)" in mine[0]
    assert not [p for p in report["problems"] if p.startswith("config:")]  # the schema knows the key


def _cli(tmp_path, model, reward: dict, train, val):
    from tests.test_train_trl import tiny_cfg

    out = tmp_path / "train"
    env = {k: v for k, v in os.environ.items() if not k.startswith("LLMRNN_")} | {"OMP_NUM_THREADS": "1"}
    cfg = {"train": tiny_cfg(epochs=1, test_freq=0, save_freq=4), "reward": reward}
    cmd = [LLMRNN, "train", "run", "--cfg", json.dumps(cfg), "--train", train, "--val", val, "--model", str(model),
           "--work-dir", str(out), "--adapter", str(out / "adapter"), "--metrics", str(out / "metrics.jsonl"),
           "--summary", str(out / "summary.json")]
    return subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=900, check=False, cwd=tmp_path), out


def test_train_run_refuses_a_wrong_signature_in_one_line(tmp_path, tiny_model_dir):
    (tmp_path / "bad_reward.py").write_text(WRONG)
    train = write_parquet(tmp_path / "t.parquet", make_rows(8))
    proc, _ = _cli(tmp_path, tiny_model_dir, {"custom": {"path": "bad_reward.py"}}, train, train)
    assert proc.returncode == 2 and "Traceback" not in proc.stderr
    last = proc.stderr.strip().splitlines()[-1]
    assert last.startswith("llmrnn train: error: reward.custom: ") and "bad_reward.py:compute_score has signature" in last
    assert "verl calls (data_source" in last


RECORDING = '''import json, os


def compute_score(data_source, solution_str, ground_truth, extra_info, **kwargs):
    with open(os.path.join(os.path.dirname(__file__), "calls.jsonl"), "a") as fh:
        fh.write(json.dumps({"index": extra_info.get("index"), "kwargs": sorted(kwargs),
                             "reward_cfg": json.loads(kwargs["reward_cfg"])}) + "\\n")
    return len(solution_str) % 7 / 7
'''


@pytest.mark.slow
def test_trl_trains_with_your_own_reward_and_its_settings_as_arguments(tmp_path, tiny_model_dir):
    """A real `llmrnn train run` (TRL, tiny model, CPU) with reward.custom: the file (relative to the working
    directory, as the workflow gives it) is called for every completion with verl's arguments, plus the
    reward settings as keyword arguments; no judge is asked and no endpoint is needed."""
    (tmp_path / "my_reward.py").write_text(RECORDING)
    train = write_parquet(tmp_path / "t.parquet", make_rows(8))
    val = write_parquet(tmp_path / "v.parquet", make_rows(2, split="val", seed=1))
    proc, out = _cli(tmp_path, tiny_model_dir, {"mode": "scalar", "custom": {"path": "my_reward.py"}}, train, val)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert json.loads((out / "summary.json").read_text())["steps"] == 4
    calls = [json.loads(x) for x in (tmp_path / "calls.jsonl").read_text().splitlines()]
    assert len(calls) >= 4 * 2 * 4  # steps x prompts x group (validation adds its own)
    assert {"audit_dir", "guard", "reward_cfg"} <= set(calls[0]["kwargs"]) and "endpoint_file" not in calls[0]["kwargs"]
    assert calls[0]["reward_cfg"]["custom"]["path"] == str(tmp_path / "my_reward.py")  # made absolute once


def test_preflight_calls_your_own_reward_on_real_rows(tmp_path, example):
    from llmrnn.preflight import run_preflight

    train = write_parquet(tmp_path / "t.parquet", make_rows(6))
    cfg = {"reward": {"custom": {"path": str(example)}}, "preflight": {"rows": 3}}
    report = run_preflight(train, None, str(tmp_path / "pre.json"), str(tmp_path / "audit"), cfg)
    assert report["ok"] and report["judge"]["custom"] == f"{example}:compute_score"
    assert report["judge"]["candidates"] == 9 and report["judge"]["reward"]["max"] <= 1.0
    nan = tmp_path / "nan_reward.py"
    nan.write_text("def compute_score(data_source, solution_str, ground_truth, extra_info, **kwargs):\n"
                   "    return float('nan')\n")
    cfg["reward"]["custom"]["path"] = str(nan)
    with pytest.raises(CheckFailed, match=r"reward.custom: .*nan_reward.py:compute_score on row \d+ \(h_ref\) "
                                          r"returned nan; expected a finite number"):
        run_preflight(train, None, str(tmp_path / "pre2.json"), str(tmp_path / "audit2"), cfg)


def test_your_own_reward_file_is_part_of_the_code_identity(tmp_path, example):
    """The rule's code param and the checkpoint fingerprint's job_code change with the file's content."""
    from llmrnn.provenance import code_identity
    from llmrnn.reward.function import RewardFunction
    from llmrnn.train.checkpoints import job_code

    before = code_identity("train run", str(example))
    assert before == job_code(RewardFunction(str(example), "compute_score")) and before.startswith(code_identity("train run") + "+")
    example.write_text(docs_example().replace("0.0", "0.5"))
    assert code_identity("train run", str(example)) != before
    assert custom.code_files({"reward": {"custom": {"path": str(example)}}}) == [str(example)]
    assert custom.code_files({"reward": {"mode": "outcome"}}) == []
    with pytest.raises(InputError):
        custom.load(str(tmp_path / "absent.py"))


@pytest.mark.slow
@pytest.mark.e2e  # a whole-workflow run: `make test-e2e` (the fast-feedback tiers)
def test_a_workflow_run_trains_with_your_own_reward(workflow_dir, tiny_model_dir):
    """`snakemake` up to train_grpo on CPU (tiny model, synthetic cohort) with reward.custom set in a config
    layer: preflight and training call your file (named relative to the workflow directory) with verl's
    arguments and the reward settings; a wrong signature stops the run before any job, in one line."""
    import yaml

    from tests.conftest import snakemake

    (workflow_dir / "my_reward.py").write_text(RECORDING)
    role = {"model": "tiny", "backend": "transformers", "temperature": 0.7, "top_p": 0.95, "max_tokens": 8}
    layer = {
        "run_name": "own",
        "cohort": {"source": "synthetic", "synthetic": {"patients": 16, "seed": 7}},
        "split": {"val_size": 2, "train_size": 8, "seed": 42},
        "models": {"tiny": {"source": "local", "path": str(tiny_model_dir)}},
        "roles": {r: dict(role) for r in ("prediction", "evaluation", "memory")},
        "trajectories": {"shards": 1, "max_visits": 3, "seed": 0},
        "reward": {"mode": "outcome", "custom": {"path": "my_reward.py"}},
        "preflight": {"agreement_pairs": 0},
        "train": {"group_size": 4, "batch": {"train": 2, "mini": 2, "micro_per_gpu": 4}, "max_response_length": 12,
                  "total_steps": 2, "save_freq": 2, "test_freq": 0,
                  "val_before_train": False},
    }
    (workflow_dir / "own.yaml").write_text(yaml.safe_dump(layer))
    run = workflow_dir / "results" / "own"
    args = ("results/own/train/summary.json", "--configfile", "config/config.yaml", "own.yaml")
    snakemake(workflow_dir, *args)

    assert json.loads((run / "train" / "summary.json").read_text())["steps"] == 2
    calls = [json.loads(x) for x in (workflow_dir / "calls.jsonl").read_text().splitlines()]
    preflight = [c for c in calls if "guard" not in c["kwargs"]]  # its rows get the settings, not the guard
    assert len(preflight) == 4 * 3 and preflight == calls[:12]  # preflight.rows x (h_ref, h_prev, empty)
    assert len(calls) - len(preflight) >= 2 * 2 * 4  # steps x prompts x group
    assert {"audit_dir", "guard", "reward_cfg"} <= set(calls[-1]["kwargs"])
    assert calls[-1]["reward_cfg"]["custom"]["path"] == str(workflow_dir / "my_reward.py")
    assert "my_reward.py:compute_score" in (run / "train" / "preflight.json").read_text()

    (workflow_dir / "my_reward.py").write_text(WRONG)  # its content is the jobs' code: they rerun, and stop
    proc = snakemake(workflow_dir, *args, check=False)
    assert proc.returncode != 0 and "Error in rule preflight" in proc.stderr, proc.stderr[-3000:]
    log = (workflow_dir / "logs" / "own" / "preflight.log").read_text().strip().splitlines()
    assert len(log) == 1 and log[0].startswith("llmrnn preflight: error: reward.custom: my_reward.py:compute_score "
                                               "has signature (solution_str, ground_truth); verl calls"), log
