"""The conda env files (envs/*.yaml, used with `--sdm conda`) install as written: every pip section, with
LLMRNN_REPO set as rules/common.smk sets it, resolves for Linux x86_64 / Python 3.11 (uv's resolver,
metadata only); the verl env installs the GPU lock in its post-deploy script."""

from __future__ import annotations

import os
import re
import shutil
import subprocess

import pytest
import yaml

from tests.conftest import REPO
from tests.test_gpu_lock import PLATFORM, _pypi_reachable, _uv

ENV_FILES = sorted((REPO / "envs").glob("*.yaml"))


def _pip_lines(path) -> list[str]:
    deps = yaml.safe_load(path.read_text())["dependencies"]
    return [line for d in deps if isinstance(d, dict) for line in d.get("pip", [])]


def test_env_files_use_no_variable_but_llmrnn_repo():
    for path in ENV_FILES:
        used = set(re.findall(r"\$\{(\w+)\}", path.read_text()))
        assert used <= {"LLMRNN_REPO"}, (path.name, used)
    common = (REPO / "rules" / "common.smk").read_text()
    assert 'os.environ.setdefault("LLMRNN_REPO", str(Path(workflow.basedir)))' in common


@pytest.mark.parametrize("path", [p for p in ENV_FILES if _pip_lines(p)], ids=lambda p: p.name)
def test_pip_section_resolves(path, tmp_path):
    if not _pypi_reachable():
        pytest.skip("PyPI is unreachable: the resolver needs package metadata")
    req = tmp_path / "requirements.txt"
    req.write_text("\n".join(line.replace("${LLMRNN_REPO}", str(REPO)) for line in _pip_lines(path)) + "\n")
    proc = subprocess.run([_uv(), "pip", "compile", str(req), "--python-version", "3.11", "--python-platform",
                           PLATFORM, "--quiet", "--cache-dir", str(tmp_path / "uv-cache")],
                          capture_output=True, text=True, check=False, timeout=900)
    assert proc.returncode == 0, f"{path.name} does not resolve:\n{proc.stderr[-3000:]}"
    assert re.search(r"(?m)^-e file://", proc.stdout) or "llmrnn" in proc.stdout


def test_verl_env_installs_the_gpu_lock_as_written():
    conda = yaml.safe_load((REPO / "envs" / "verl.yaml").read_text())["dependencies"]
    assert "uv" in conda and not _pip_lines(REPO / "envs" / "verl.yaml")


def test_verl_post_deploy_installs_the_lock_then_llmrnn_without_resolving(tmp_path):
    """The script run as Snakemake runs it (LLMRNN_REPO set), with a stand-in `uv` that records its
    arguments (the real one would install a GPU stack): the lock as written, then llmrnn, both --no-deps."""
    calls = tmp_path / "calls"
    fake = tmp_path / "bin" / "uv"
    fake.parent.mkdir()
    fake.write_text(f'#!/bin/sh\nprintf "%s\\n" "$*" >> {calls}\n')
    fake.chmod(0o755)
    env = dict(os.environ, LLMRNN_REPO=str(REPO), PATH=f"{fake.parent}{os.pathsep}{os.environ['PATH']}")
    proc = subprocess.run(["bash", str(REPO / "envs" / "verl.post-deploy.sh")], env=env, capture_output=True,
                          text=True, check=False)
    assert proc.returncode == 0, proc.stderr
    python = shutil.which("python", path=env["PATH"])
    assert calls.read_text().splitlines() == [
        f"pip install --python {python} --no-deps -r {REPO}/envs/gpu-lock.txt",
        f"pip install --python {python} --no-deps -e {REPO}",
    ]
    env.pop("LLMRNN_REPO")
    proc = subprocess.run(["bash", str(REPO / "envs" / "verl.post-deploy.sh")], env=env, capture_output=True,
                          text=True, check=False)
    assert proc.returncode != 0 and "LLMRNN_REPO must name the llmrnn repository" in proc.stderr
