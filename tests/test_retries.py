"""Retries with growing resources: a job killed for memory asks for more on its next attempt.

A real Snakemake run (local executor) of a rule whose mem_mb is llmrnn.plan.common.grows(...), the helper
every heavy rule uses; the job runs under a real address-space limit (`ulimit -v`) of its mem_mb, so the
first attempt dies of memory and the retry, asking for more, finishes.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from llmrnn.plan.common import RETRY_GROWTH, grows

pytestmark = pytest.mark.slow

SNAKEFILE = """
from llmrnn.plan.common import grows

rule hungry:
    output: "done.txt"
    resources:
        mem_mb=grows(256, 2.0),
    shell:
        "echo attempt {{resources.mem_mb}} >> attempts.log; "
        "ulimit -v $(( {{resources.mem_mb}} * 1024 )); "
        "{python} -c 'b = bytearray(384 << 20); open(\\"{{output}}\\", \\"w\\").write(\\"ok\\")'"
"""


def test_grows_by_attempt_and_starts_at_the_configured_value():
    mem = grows(8000)
    assert [mem(None, attempt=a) for a in (1, 2, 3)] == [8000, round(8000 * RETRY_GROWTH),
                                                          round(8000 * RETRY_GROWTH ** 2)]
    assert grows(60, 2.0)({}, 3) == 240


def _snakemake(workdir: Path, *args: str) -> subprocess.CompletedProcess:
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(p for p in sys.path if p))
    exe = Path(sys.executable).with_name("snakemake")
    return subprocess.run([str(exe), "--cores", "1", "--resources", "mem_mb=100000", *args], cwd=workdir,
                          env=env, capture_output=True, text=True, timeout=300, check=False)


def test_a_job_killed_for_memory_retries_with_more(tmp_path):
    (tmp_path / "Snakefile").write_text(SNAKEFILE.format(python=sys.executable))
    proc = _snakemake(tmp_path, "--retries", "2")
    assert proc.returncode == 0, proc.stderr[-3000:]
    # attempt 1 (256 MB) dies of memory (MemoryError under the limit), attempt 2 asks for 512 MB and finishes
    assert (tmp_path / "attempts.log").read_text().split() == ["attempt", "256", "attempt", "512"]
    assert (tmp_path / "done.txt").read_text() == "ok"


def test_without_retries_the_memory_kill_fails_the_run(tmp_path):
    (tmp_path / "Snakefile").write_text(SNAKEFILE.format(python=sys.executable))
    proc = _snakemake(tmp_path, "--retries", "0")
    assert proc.returncode != 0
    assert (tmp_path / "attempts.log").read_text().split() == ["attempt", "256"]
    assert not (tmp_path / "done.txt").exists()


# a job whose environment lacks verl (this venv: the GPU stack is `make gpu-env`'s): the real check the
# training job runs (gpu_stack.require_verl) and the CLI's error path (cli.report_error), under the
# workflow's LLMRNN_NOT_RETRIABLE_DIR (rules/common.smk sets it the same way)
MISSING_PACKAGE = """
import os
os.environ["LLMRNN_NOT_RETRIABLE_DIR"] = os.path.abspath("not_retriable")
from llmrnn.plan.common import grows

rule gpu_job:
    output: "done.txt"
    resources:
        mem_mb=grows(256),
    shell:
        "echo attempt >> attempts.log; "
        "{python} -c 'import sys; from llmrnn import cli, gpu_stack\\n"
        "try: gpu_stack.require_verl()\\n"
        "except Exception as exc: sys.exit(cli.report_error(\\"train run\\", exc))'"
"""


def test_a_missing_package_is_not_retried(tmp_path):
    pytest.importorskip("snakemake")
    if __import__("llmrnn.gpu_stack", fromlist=["installed"]).installed("verl"):
        pytest.skip("verl is installed in this environment")
    (tmp_path / "Snakefile").write_text(MISSING_PACKAGE.format(python=sys.executable))
    proc = _snakemake(tmp_path, "--retries", "2")
    assert proc.returncode != 0
    assert (tmp_path / "attempts.log").read_text().split() == ["attempt"]  # one attempt, not three
    assert "exit status 78" in proc.stderr
    assert "not retried (a retry cannot change it): llmrnn train run: train.engine verl: verl is not installed" \
        in proc.stderr and "make gpu-env" in proc.stderr
