"""Formatting and linting are part of the tests: snakefmt, snakemake --lint, ruff."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
BIN = Path(sys.executable).parent


def run(*cmd: str) -> subprocess.CompletedProcess:
    return subprocess.run(cmd, cwd=REPO, capture_output=True, text=True, check=False)


def test_snakefmt_check():
    proc = run(str(BIN / "snakefmt"), "--check", "Snakefile", "rules")
    assert proc.returncode == 0, proc.stdout + proc.stderr


def test_snakemake_lint():
    proc = run(str(BIN / "snakemake"), "--lint", "--cores", "1")
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "good condition" in proc.stdout + proc.stderr


def test_snakemake_lint_qa_recipe():
    """The qa recipe swaps stage files (rules/qa.smk): its DAG is linted too."""
    proc = run(str(BIN / "snakemake"), "--lint", "--cores", "1", "--configfile", "config/qa_demo.yaml")
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "good condition" in proc.stdout + proc.stderr


def test_ruff():
    proc = run(str(BIN / "ruff"), "check", "src", "tests", "benchmarks")
    assert proc.returncode == 0, proc.stdout + proc.stderr
