"""The GPU stack's lock (envs/gpu-lock.txt) resolves: uv's resolver, run from this CPU machine for Linux
x86_64 and each supported Python, accepts the locked set together with llmrnn's own ranges
(pyproject.toml) and asks for nothing outside it. No CUDA wheel is downloaded (metadata only)."""

from __future__ import annotations

import re
import subprocess

import httpx
import pytest
from packaging.markers import default_environment
from packaging.requirements import Requirement

from tests.conftest import REPO

LOCK = REPO / "envs" / "gpu-lock.txt"
OVERRIDE = REPO / "envs" / "gpu-override.txt"
PLATFORM = "x86_64-manylinux_2_28"


def _uv() -> str:
    try:
        from uv import find_uv_bin
    except ImportError:
        pytest.fail("uv is not installed in this environment: pip install -c constraints.txt -e '.[dev]'")
    return find_uv_bin()


def _pypi_reachable() -> bool:
    try:
        return httpx.head("https://pypi.org/simple/uv/", timeout=10, follow_redirects=True).status_code < 500
    except httpx.HTTPError:
        return False


def _linux_env(python: str) -> dict:
    env = default_environment()
    env.update(sys_platform="linux", platform_system="Linux", platform_machine="x86_64", os_name="posix",
               implementation_name="cpython", platform_python_implementation="CPython",
               python_version=python, python_full_version=f"{python}.0")
    return env


def pins(text: str, python: str | None = None) -> dict[str, str]:
    """name -> version of every `name==version [; marker]` line (markers evaluated for Linux x86_64)."""
    out = {}
    for line in text.splitlines():
        line = line.split("#", 1)[0].strip()
        if not line or line.startswith("-"):
            continue
        req = Requirement(line)
        if python and req.marker is not None and not req.marker.evaluate(_linux_env(python)):
            continue
        (spec,) = req.specifier
        assert spec.operator == "==", f"{LOCK.name}: {line} is not an exact pin"
        out[req.name.lower().replace("_", "-")] = spec.version
    return out


def test_lock_holds_the_reference_pair():
    locked = pins(LOCK.read_text())
    assert locked["verl"] == "0.7.1"
    assert locked["vllm"] == "0.17.1"
    assert locked["transformers"].startswith("4.")  # vllm 0.17.1 needs transformers<5
    assert re.match(r"2\.10\.", locked["torch"])
    assert locked["numpy"].startswith("1.")  # verl 0.7.1 pins numpy<2 (envs/gpu-override.txt)


@pytest.mark.parametrize("python", ["3.11", "3.12"])
def test_gpu_lock_resolves(python, tmp_path):
    if not _pypi_reachable():
        pytest.skip("PyPI is unreachable: the resolver needs package metadata")
    proc = subprocess.run(
        [_uv(), "pip", "compile", str(REPO / "pyproject.toml"), str(LOCK), "--override", str(OVERRIDE),
         "--python-version", python, "--python-platform", PLATFORM, "--no-header", "--no-annotate",
         "--quiet", "--cache-dir", str(tmp_path / "uv-cache")],
        capture_output=True, text=True, check=False, timeout=600,
    )
    assert proc.returncode == 0, f"the GPU lock does not resolve for Python {python}:\n{proc.stderr[-3000:]}"
    resolved = pins(proc.stdout)
    locked = pins(LOCK.read_text(), python)
    extra = {k: v for k, v in resolved.items() if locked.get(k) != v}
    assert not extra, f"the resolver needs packages the lock lacks or pins differently: {extra}"
    assert resolved.keys() == locked.keys() - {"llmrnn"}


def test_lock_conflicts_without_the_override(tmp_path):
    """Why envs/gpu-override.txt exists: verl 0.7.1 + vllm 0.17.1 are unsatisfiable as published."""
    if not _pypi_reachable():
        pytest.skip("PyPI is unreachable: the resolver needs package metadata")
    proc = subprocess.run(
        [_uv(), "pip", "compile", str(LOCK), "--python-version", "3.11", "--python-platform", PLATFORM,
         "--quiet", "--cache-dir", str(tmp_path / "uv-cache")],
        capture_output=True, text=True, check=False, timeout=600,
    )
    assert proc.returncode != 0
    assert "numpy" in proc.stderr


# numpy<2 overrides only these declarations (envs/gpu-override.txt says why each is safe); vllm is left
# out with them because it is what requires opencv.
NUMPY2_DECLARED = ("opencv-python-headless", "snakemake-executor-plugin-slurm", "vllm")


@pytest.mark.parametrize("python", ["3.11", "3.12"])
def test_no_other_locked_package_needs_numpy_2(python, tmp_path):
    """Every other locked release accepts the locked numpy 1.26 (one built for numpy 2 only would not
    import), so the lock resolves WITHOUT the override once the three are set aside."""
    if not _pypi_reachable():
        pytest.skip("PyPI is unreachable: the resolver needs package metadata")
    rest = [line for line in LOCK.read_text().splitlines()
            if line.strip() and not line.lstrip().startswith("#") and not line.startswith(
                tuple(f"{name}==" for name in NUMPY2_DECLARED))]
    req = tmp_path / "rest.txt"
    req.write_text("\n".join(rest) + "\n")
    proc = subprocess.run(
        [_uv(), "pip", "compile", str(req), "--python-version", python, "--python-platform", PLATFORM,
         "--quiet", "--cache-dir", str(tmp_path / "uv-cache")],
        capture_output=True, text=True, check=False, timeout=600,
    )
    assert proc.returncode == 0, f"a locked package needs numpy>=2 on Python {python}:\n{proc.stderr[-2000:]}"
