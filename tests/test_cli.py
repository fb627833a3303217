"""The CLI's process set-up."""

from __future__ import annotations

import re
import subprocess
import sys

import pytest

from llmrnn import cli


def test_zero_thread_job_runs_single_threaded():
    # Snakemake exports OMP_NUM_THREADS=0 for a `threads: 0` job; torch must still start (libgomp rejects 0).
    code = "import os, llmrnn.cli as c; c.sanitize_thread_env(); import torch; print(os.environ['OMP_NUM_THREADS'], torch.get_num_threads())"
    proc = subprocess.run(
        [sys.executable, "-c", code], env={"OMP_NUM_THREADS": "0", "MKL_NUM_THREADS": "0", "PATH": "/usr/bin"},
        capture_output=True, text=True, check=False,
    )
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.split() == ["1", "1"]
    assert "Invalid value" not in proc.stderr


# ----------------------------------------------------------------------------- the first hour's --help
def _out(argv: list[str], capsys) -> str:
    with pytest.raises(SystemExit) as exc:
        cli.main(argv)
    assert exc.value.code == 0
    return capsys.readouterr().out


def test_version(capsys):
    from llmrnn import __version__

    assert _out(["--version"], capsys).strip() == f"llmrnn {__version__}"


@pytest.mark.parametrize("command", ["check", "config", "reward"])
def test_a_commands_description_is_whole_sentences(command, capsys):
    text = _out([command, "--help"], capsys)
    description = text.split("\n\n")[1].strip()
    assert description.endswith((".", ")")), description


def test_help_lists_user_commands_first_and_marks_internal_ones(capsys):
    text = _out(["--help"], capsys)
    listed = [line.split()[0] for line in text.splitlines() if line.startswith("    ") and not line.startswith("     ")]
    assert listed[: len(cli.USER_COMMANDS)] == list(cli.USER_COMMANDS)
    assert re.search(r"gpus\s+\[internal\]", text)
    assert re.search(r"serve\s+\[internal\]", _out(["judge", "--help"], capsys))
    assert re.search(r"ray-cluster\s+\[internal\]", _out(["train", "--help"], capsys))
