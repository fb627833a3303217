"""A training job at its SLURM time limit (docs/cluster.md "Long runs"): on the real local SLURM, the TRL
engine reads its job's end time (squeue), saves a checkpoint at the first step boundary past the margin,
exits 75 ("continue"), and the rerun trains the remaining steps, each once."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from llmrnn.errors import Interrupted
from llmrnn.train.trl_engine import checkpoint_complete
from tests.test_train_trl import LLMRNN, STANDIN, tiny_cfg
from tests.verl.rows import make_rows, write_parquet

pytestmark = [pytest.mark.slurm, pytest.mark.slow, pytest.mark.e2e]


def train_command(cfg: dict, train: Path, val: Path, model: Path, out: Path) -> list[str]:
    return [LLMRNN, "train", "run", "--cfg", json.dumps({"train": cfg}), "--train", str(train), "--val", str(val),
            "--model", str(model), "--work-dir", str(out), "--adapter", str(out / "adapter"),
            "--metrics", str(out / "metrics.jsonl"), "--summary", str(out / "summary.json"),
            "--reward-func", STANDIN]


def test_training_at_its_time_limit_checkpoints_and_the_rerun_continues(slurm_cluster, tmp_path, tiny_model_dir):
    train = write_parquet(tmp_path / "train.parquet", make_rows(8))
    val = write_parquet(tmp_path / "val.parquet", make_rows(2, split="val", seed=1))
    cfg = tiny_cfg(epochs=6, test_freq=0, save_freq=100, keep_last=None)  # 24 steps, no periodic save
    out = tmp_path / "train"
    command = " ".join(f"'{a}'" for a in train_command(cfg, train, val, tiny_model_dir, out))
    env = dict(os.environ, OMP_NUM_THREADS="1", PYTHONPATH=os.pathsep.join(p for p in sys.path if p),
               LLMRNN_STOP_MARGIN_S="150")  # more than the 2-minute limit: the stop is due when the job reads
    # its end time, so it stops at the first step boundary whatever this machine's speed (no timing here)
    proc = subprocess.run(["sbatch", "--wait", "-p", "cpu", "--time=2", "--mem=4000", "-o", str(tmp_path / "job.log"),
                           "--wrap", command], env=env, cwd=tmp_path, capture_output=True, text=True,
                          timeout=400, check=False)
    log = (tmp_path / "job.log").read_text()
    assert proc.returncode == Interrupted.exit_code, (proc.stderr, log[-3000:])
    assert "SLURM time limit at" in log and "the SLURM time limit is near" in log
    trace = [json.loads(x)["step"] for x in (out / "state" / "data_trace.jsonl").read_text().splitlines()]
    stopped = max(trace)
    assert stopped == 1  # the first step boundary after the stop came due
    assert checkpoint_complete(out / "checkpoints" / f"checkpoint-{stopped}")  # saved at the stop, not at save_freq
    assert not (out / "adapter").exists()

    rerun = subprocess.run(train_command(cfg, train, val, tiny_model_dir, out), env=dict(env, LLMRNN_STOP_MARGIN_S=""),
                           capture_output=True, text=True, timeout=900, check=False)
    assert rerun.returncode == 0, rerun.stderr[-3000:]
    summary = json.loads((out / "summary.json").read_text())
    assert summary["resumed_from_step"] == stopped and summary["steps"] == 24  # at most the running step lost
    steps = [json.loads(x)["step"] for x in (out / "metrics.jsonl").read_text().splitlines()
             if json.loads(x)["kind"] == "train"]
    assert steps == list(range(1, 25))
