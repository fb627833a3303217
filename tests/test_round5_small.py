"""Round 5's smaller faults: a full disk while TRL saves a checkpoint says the disk is full; an MLflow URI
with a token in its query or fragment stays off verl's command line; `config show` onto a full disk is one
line, not a traceback."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from llmrnn.train import verl_overrides
from llmrnn.train.checkpoints import disk_full_problem

LLMRNN = str(Path(sys.executable).parent / "llmrnn")


def test_a_checkpoint_write_onto_a_full_disk_says_the_disk_is_full(small_disk):
    """torch's own error for a checkpoint that runs out of space (a 64 KiB tmpfs) never names the disk."""
    import torch

    folder = small_disk / "checkpoints"
    folder.mkdir()
    with pytest.raises((RuntimeError, OSError)) as err:
        torch.save({"w": torch.zeros(1_000_000)}, folder / "optimizer.pt")
    line = disk_full_problem(err.value, folder)
    assert line is not None and line.startswith(f"train: the disk is full: saving a checkpoint under {folder} failed")
    assert "\n" not in line
    assert disk_full_problem(RuntimeError("CUDA out of memory"), folder) is None  # other errors stay themselves


@pytest.mark.parametrize("uri", [
    "https://mlflow.example.org/?token=tok-sentinel",
    "https://mlflow.example.org/api#access_token=tok-sentinel",
    "https://bob:tok-sentinel@mlflow.example.org",
])
def test_an_mlflow_uri_with_a_token_stays_off_verls_command_line(uri):
    items = verl_overrides.runtime_env_overrides({"MLFLOW_TRACKING_URI": uri, "MLFLOW_EXPERIMENT_NAME": "x"})
    assert not [i for i in items if "sentinel" in i], items
    assert any(i.endswith("MLFLOW_EXPERIMENT_NAME=x") for i in items)  # the rest still travels


def test_config_show_onto_a_full_disk_is_one_line(in_workflow):
    with open("/dev/full", "w") as full:
        proc = subprocess.run([LLMRNN, "config", "show"], stdout=full, stderr=subprocess.PIPE, text=True,
                              timeout=300, check=False)
    err = proc.stderr.strip().splitlines()
    assert proc.returncode != 0 and "Traceback" not in proc.stderr and "Exception ignored" not in proc.stderr
    assert err == ["llmrnn config: error: cannot write the output: no space left on the device"], err
