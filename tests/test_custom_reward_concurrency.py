"""Your own reward under concurrency: verl's reward loop runs each sample's synchronous compute_score in its
event loop's thread pool, so many threads call llmrnn.reward.custom_compute_score at once, all on the one
RewardProcess of that worker. Each row must get its own score: through verl's own RewardLoopWorker (0.7.1 and
0.9.1, in their venvs) and through TRL's reward-function path (trl_reward, bound as trl_engine binds it) from
many threads."""

from __future__ import annotations

import functools
import json
import os
import subprocess
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest

from llmrnn.reward import custom, reward_kwargs
from tests.conftest import REPO
from tests.verl.rows import make_rows, write_parquet

# the score says whose row it is: the row's index (extra_info) and the number in its response; a random pause
# lets the threads' requests overlap
ROW_REWARD = '''import random, re, time


def compute_score(data_source, solution_str, ground_truth, extra_info, **kwargs):
    time.sleep(random.random() * 0.004)
    found = re.findall(r"\\d+", solution_str)
    return extra_info["index"] * 1000 + (int(found[-1]) if found else 999)
'''


def _reward_file(tmp_path: Path) -> Path:
    path = tmp_path / "row_reward.py"
    path.write_text(ROW_REWARD)
    return path


@pytest.mark.verl
@pytest.mark.slow  # two verl venv processes, ~80 s each
@pytest.mark.parametrize("version", ["0.7.1", "0.9.1"])
def test_verls_reward_loop_threads_give_every_row_its_own_score(version, tmp_path, tiny_model_dir):
    """verl's RewardLoopWorker.compute_score_batch over 32 rows (several rounds), with the overrides `train run`
    builds for reward.custom: every row scores index x 1000 + the number in its own response. Before the
    per-child lock and request ids, threads read each other's answers (other rows' scores, OverflowError,
    UnpicklingError)."""
    from llmrnn.train import verl_overrides

    python = REPO / f".venv-verl-{version}" / "bin" / "python"
    if not python.exists():
        pytest.skip(f"no verl {version} venv: run scripts/make_verl_env.sh {version} (make test builds it)")
    parquet = write_parquet(tmp_path / "train.parquet", make_rows(32))
    reward = {"mode": "outcome", "custom": {"path": str(_reward_file(tmp_path))}}
    kwargs = reward_kwargs(reward, audit_dir=tmp_path / "audit", guard={"max_fallback_rate": 0.5, "window": 64})
    overrides = verl_overrides.build_overrides(
        {"n_gpus_per_node": 2, "rollout": {"tensor_parallel": 2}}, train_parquet=parquet, val_parquet=None,
        model_dir=str(tiny_model_dir), out_dir=str(tmp_path / "train"), experiment_name="threads",
        verl_version=version, reward_path=verl_overrides.reward_module_path(), reward_name=verl_overrides.CUSTOM_ENTRY,
        reward_kwargs=kwargs)
    (tmp_path / "overrides.json").write_text(json.dumps(overrides))
    env = dict(os.environ, PYTHONPATH=str(REPO / "src"), HF_HUB_OFFLINE="1", OMP_NUM_THREADS="1")
    proc = subprocess.run([str(python), str(REPO / "tests" / "verl" / "reward_loop_threads.py"), "--overrides",
                           str(tmp_path / "overrides.json"), "--rounds", "4"],
                          capture_output=True, text=True, env=env, timeout=600, check=False)
    assert proc.returncode == 0, proc.stderr[-4000:]
    report = json.loads(proc.stdout.strip().splitlines()[-1])
    assert report["verl"] == version and report["reward_manager"] == "NaiveRewardManager"
    assert report["pool_threads"] and report["pool_threads"] > 1  # more than one sample in flight
    assert report["errors"] == [], report["errors"]
    want = [i * 1000 + i for i in report["indices"]]
    assert len(report["rounds"]) == 4
    for scores in report["rounds"]:
        crossed = [(i, s) for i, (s, w) in enumerate(zip(scores, want)) if s != w]
        assert crossed == [], f"rows given another row's score: {crossed}"


def test_trls_reward_function_from_many_threads_gives_every_row_its_own_score(tmp_path):
    """TRL's path: trl_reward over the RewardProcess, bound with the reward settings as trl_engine binds it
    (functools.partial), called by 8 threads at once, each with its own batch of rows."""
    proc = custom.open_custom({"path": str(_reward_file(tmp_path)), "name": "compute_score"})
    reward = functools.partial(custom.trl_reward(proc), **reward_kwargs({"mode": "outcome"}, audit_dir=tmp_path))
    rows = make_rows(48)

    def batch(start: int) -> list[float]:
        part = rows[start:start + 6]
        return reward(prompts=[r["prompt"] for r in part], completions=[f"answer {start + k}" for k in range(6)],
                      reward_model=[r["reward_model"] for r in part], extra_info=[r["extra_info"] for r in part],
                      data_source=[r["data_source"] for r in part])

    try:
        with ThreadPoolExecutor(8) as pool:
            got = [s for scores in pool.map(batch, range(0, 48, 6)) for s in scores]
    finally:
        proc.close()
    assert got == [i * 1000 + i for i in range(48)]


def test_an_answer_for_another_request_is_refused_not_used(tmp_path):
    """The request id belt: an answer whose id is not the request's is a protocol break in one line (never a
    score handed to the wrong row)."""
    from llmrnn.errors import InputError

    proc = custom.open_custom({"path": str(_reward_file(tmp_path)), "name": "compute_score"})
    try:
        proc._ids = iter([5, 9])  # the next request goes out as 5, the call after as 9: answers echo them
        assert proc("row 0", data_source="d", solution_str="answer 0", ground_truth="g",
                    extra_info={"index": 0}) == 0.0
        proc._ids = iter([7])
        real = custom.frame
        custom.frame = lambda request_id, body: real(request_id + 1, body)  # the child answers 8 to our 7
        try:
            with pytest.raises(InputError, match=r"broke the reward protocol \(the answer to request 8 came for "
                                                 r"request 7\)"):
                proc("row 1", data_source="d", solution_str="answer 1", ground_truth="g", extra_info={"index": 1})
        finally:
            custom.frame = real
    finally:
        proc.close()
