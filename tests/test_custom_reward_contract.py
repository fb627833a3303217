"""Your own reward under one contract wherever it runs (check, preflight, TRL, verl): imported and called in
a child process with a time limit, its result converted once (numpy numbers accepted, |r| beyond
reward.custom.max_abs refused with its row), and whatever it raises (SystemExit, KeyboardInterrupt), exits or
hangs on is one line."""

from __future__ import annotations

from pathlib import Path

import pytest

from llmrnn.errors import InputError
from llmrnn.reward import custom

SIGNATURE = "def compute_score(data_source, solution_str, ground_truth, extra_info, **kwargs):\n"
ROW = {"data_source": "d", "solution_str": "s", "ground_truth": "g", "extra_info": {"index": 7}}


def _reward(tmp_path: Path, body: str, head: str = "") -> Path:
    path = tmp_path / "my_reward.py"
    path.write_text(head + SIGNATURE + "".join(f"    {line}\n" for line in body.splitlines()))
    return path


# The child's start counts against the same limit as the call (the import is bounded by reward.custom.timeout_s):
# 1 s failed both "importing it failed" cases on CI's loaded 2 cores (the import alone took longer), so the
# limit is one a loaded machine's interpreter start fits in; only the two hanging cases wait for it.
LIMIT_S = 15.0


@pytest.mark.parametrize(("head", "expected"), [
    ("import sys\nsys.exit(3)\n", "importing it failed: SystemExit(3) (sys.exit)"),
    ("raise KeyboardInterrupt\n", "importing it failed: KeyboardInterrupt"),
    ("import time\ntime.sleep(3600)\n", f"importing it gave no answer within {LIMIT_S:g} s (reward.custom.timeout_s)"),
    ("import os\nos._exit(0)\n", "importing it ended the reward process (exit code 0"),
])
def test_check_reports_an_import_that_exits_or_hangs_in_one_line(tmp_path, head, expected):
    path = _reward(tmp_path, "return 1.0", head)
    line = custom.problem({"reward": {"custom": {"path": str(path), "timeout_s": LIMIT_S}}})
    assert line is not None and line.startswith(f"reward.custom.path: {path}: ") and expected in line, line
    assert "\n" not in line


@pytest.mark.parametrize(("body", "head", "score"), [
    ("return np.float32(0.25)", "import numpy as np\n", 0.25),
    ("return {'score': np.int64(1)}", "import numpy as np\n", 1.0),
    ("return np.array(0.5)", "import numpy as np\n", 0.5),
    ("return -3", "", -3.0),
])
def test_numpy_numbers_are_scores(tmp_path, body, head, score):
    proc = custom.load(str(_reward(tmp_path, body, head)))
    try:
        value = proc("row 7", **ROW)
    finally:
        proc.close()
    assert value == score and type(value) is float


@pytest.mark.parametrize(("body", "expected"), [
    ("return 1e308", "on row 7 returned 1e+308, outside [-1e+06, 1e+06] (reward.custom.max_abs)"),
    ("return -1e7", "on row 7 returned -1e+07, outside"),
    ("return float('inf')", "on row 7 returned inf; expected a finite number"),
    ("return 'high'", "on row 7 returned 'high'; expected a finite number"),
    ("return 10**400", "on row 7 returned 1000"),
    ("raise KeyboardInterrupt", "on row 7 raised KeyboardInterrupt"),
    ("import sys\nsys.exit(0)", "on row 7 raised SystemExit(0) (sys.exit)"),
    ("raise ValueError('bad\\nrow')", "on row 7 raised ValueError: bad row"),
    ("import os\nos._exit(5)", "on row 7 ended the reward process (exit code 5"),
    ("import time\ntime.sleep(3600)", f"on row 7 gave no answer within {LIMIT_S:g} s (reward.custom.timeout_s)"),
])
def test_a_bad_call_is_one_line_naming_the_row(tmp_path, body, expected):
    path = _reward(tmp_path, body)
    proc = custom.open_custom({"path": str(path), "name": "compute_score", "timeout_s": LIMIT_S})
    try:
        with pytest.raises(InputError) as err:
            proc("row 7", **ROW)
    finally:
        proc.close()
    line = str(err.value)
    assert line.startswith(f"reward.custom: {path}:compute_score ") and expected in line and "\n" not in line, line


def test_a_reward_that_reads_or_writes_the_standard_streams_cannot_touch_the_protocol(tmp_path):
    """The requests come on the child's stdin and the answers go out on its stdout: a reward that reads stdin
    finds nothing (it neither hangs nor eats the next request) and one that writes to fd 1 corrupts nothing."""
    body = "import os, sys\nos.write(1, b'noise')\nreturn 0.5 if sys.stdin.read() == '' and os.read(0, 9) == b'' else 1.0"
    proc = custom.load(str(_reward(tmp_path, body)), timeout_s=5)
    try:
        assert [proc(f"row {i}", **ROW) for i in range(3)] == [0.5, 0.5, 0.5]
    finally:
        proc.close()


def test_the_child_survives_a_raising_call_and_scores_the_next(tmp_path):
    proc = custom.load(str(_reward(tmp_path, "if solution_str == 'x':\n    raise SystemExit(1)\nreturn 0.5")))
    try:
        with pytest.raises(InputError, match="SystemExit"):
            proc("row 1", **{**ROW, "solution_str": "x"})
        assert proc("row 2", **ROW) == 0.5
    finally:
        proc.close()


def test_verl_calls_our_wrapper_with_the_same_contract(tmp_path):
    """verl calls pkg://llmrnn.reward:custom_compute_score (never the user's file): the wrapper finds the
    reward in reward_cfg, as verl passes reward_kwargs, and refuses a value beyond the bound in one line."""
    import json

    import llmrnn.reward
    from llmrnn.train import verl_overrides

    path = _reward(tmp_path, "return 2.0 if solution_str == 'big' else 0.75")
    reward_cfg = json.dumps({"mode": "outcome", "custom": {"path": str(path), "max_abs": 1}})
    fn = getattr(llmrnn.reward, verl_overrides.CUSTOM_ENTRY)
    assert fn(**ROW, reward_cfg=reward_cfg) == 0.75
    with pytest.raises(InputError, match=r"compute_score on row 7 returned 2, outside \[-1, 1\]"):
        fn(**{**ROW, "solution_str": "big"}, reward_cfg=reward_cfg)


@pytest.mark.e2e  # a slow tier test (a workflow, CLI or training run of its own): `make test-e2e`
def test_a_trl_run_whose_gradient_was_always_zero_fails_in_one_line(tmp_path, tiny_model_dir):
    """A real `llmrnn train run` (TRL, tiny model, CPU) with a reward that is the same for every completion:
    no advantage, a zero gradient at every step; the run fails with one line and leaves no metrics or adapter
    that look complete."""
    from tests.test_custom_reward import _cli
    from tests.verl.rows import make_rows, write_parquet

    (tmp_path / "my_reward.py").write_text(SIGNATURE + "    return 0.5\n")
    train = write_parquet(tmp_path / "t.parquet", make_rows(8))
    val = write_parquet(tmp_path / "v.parquet", make_rows(2, split="val", seed=1))
    proc, out = _cli(tmp_path, tiny_model_dir, {"mode": "outcome", "custom": {"path": "my_reward.py"}}, train, val)
    assert proc.returncode != 0
    assert "train: the gradient norm was 0 at every one of" in proc.stderr and "Traceback" not in proc.stderr
    assert not (out / "summary.json").exists() and not (out / "metrics.jsonl").exists()
    assert not (out / "adapter").exists()


def test_learning_problem_names_rewards_that_were_never_finite():
    from llmrnn.train.metrics import learning_problem

    never = [{"kind": "train", "step": s, "reward_mean": None, "grad_norm": 0.0} for s in (1, 2)]
    assert learning_problem(never).startswith("train: the mean reward was not a finite number at any of 2")
    flat = [{"kind": "train", "step": s, "reward_mean": 0.5, "grad_norm": 0.0} for s in (1, 2)]
    assert learning_problem(flat).startswith("train: the gradient norm was 0 at every one of 2")
    assert learning_problem(flat, zero_gradient=False) is None  # train.fail_on_zero_gradient: false
    learned = [{"kind": "train", "step": 1, "reward_mean": 0.4, "grad_norm": 0.0},
               {"kind": "train", "step": 2, "reward_mean": 0.5, "grad_norm": 0.3}]
    assert learning_problem(learned) is None


@pytest.mark.parametrize("version", ["0.7.1", "0.9.1"])
def test_verls_own_loader_resolves_our_wrapper(tmp_path, version):
    """verl's get_custom_reward_fn (in its locked venv) loads pkg://llmrnn.reward:custom_compute_score as
    verl_overrides configures it, and the user's function runs under the contract there too."""
    import json
    import os
    import subprocess

    from llmrnn.train import verl_overrides
    from tests.conftest import REPO

    python = REPO / f".venv-verl-{version}" / "bin" / "python"
    if not python.exists():
        pytest.skip(f"no verl {version} venv")
    path = _reward(tmp_path, "return 0.25 if solution_str == 's' else 1e308")
    kwargs = {"reward_cfg": json.dumps({"mode": "outcome", "custom": {"path": str(path)}})}
    fn_cfg = {"path": verl_overrides.reward_module_path(), "name": verl_overrides.CUSTOM_ENTRY, "reward_kwargs": kwargs}
    script = (
        "import json, sys\nfrom omegaconf import OmegaConf\n"
        "from verl.trainer.ppo.reward import get_custom_reward_fn\n"
        "c = json.loads(sys.argv[1])\n"
        "fn = get_custom_reward_fn(OmegaConf.create({'reward': {'custom_reward_function': c}, 'custom_reward_function': c}))\n"
        "print(fn(data_source='d', solution_str='s', ground_truth='g', extra_info={'index': 7}))\n"
        "try:\n    fn(data_source='d', solution_str='big', ground_truth='g', extra_info={'index': 8})\n"
        "except Exception as exc:\n    print(exc)\n"
    )
    env = dict(os.environ, PYTHONPATH=str(REPO / "src"), OMP_NUM_THREADS="1")
    proc = subprocess.run([str(python), "-c", script, json.dumps(fn_cfg)], capture_output=True, text=True,
                          env=env, timeout=300, check=False)
    lines = proc.stdout.strip().splitlines()
    assert proc.returncode == 0 and lines[-2] == "0.25", proc.stderr[-2000:]
    assert lines[-1].startswith(f"reward.custom: {path}:compute_score on row 8 returned 1e+308, outside"), lines
