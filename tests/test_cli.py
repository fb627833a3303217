"""The CLI's process set-up."""

from __future__ import annotations

import subprocess
import sys


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
