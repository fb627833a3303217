"""The GPU route's install paths work where they are meant to: `make gpu-env` checks glibc before anything
else and names the container route in one line (vLLM 0.17.1 ships only manylinux_2_31 wheels), and the
container definition's install set resolves against the image's stack (the GPU lock: numpy<2) as pip
would resolve it inside the image, without the lock's override (uv's resolver; metadata only)."""

from __future__ import annotations

import re
import shlex
import subprocess
import sys

import pytest

from tests.conftest import REPO
from tests.test_gpu_lock import PLATFORM, _pypi_reachable, _uv, pins

DEF = REPO / "profiles" / "slurm" / "llmrnn-verl.def"
CHECK_GLIBC = REPO / "scripts" / "check_glibc.py"
PROJECT = "<the llmrnn project>"


def _section(name: str) -> list[str]:
    text = DEF.read_text()
    match = re.search(rf"^%{name}\n(.*?)(?=^%|\Z)", text, re.MULTILINE | re.DOTALL)
    assert match, f"{DEF.name}: no %{name} section"
    return [line.strip() for line in match.group(1).replace("\\\n", " ").splitlines()
            if line.strip() and not line.strip().startswith("#")]


def pip_installs() -> list[list[str]]:
    """The arguments of each `pip install` in %post, container paths mapped back to the repository (%files)."""
    files = {dst: REPO / src for src, dst in (line.split() for line in _section("files"))}
    installs = []
    for line in _section("post"):
        words = shlex.split(line)
        if words[:2] != ["pip", "install"]:
            continue
        args = []
        for word in words[2:]:
            if any(dst.startswith(word.rstrip("/") + "/") for dst in files):  # the folder holding pyproject.toml
                args.append(PROJECT)
                continue
            path = files.get(word) or next((files[d] / word[len(d) + 1:] for d in files if word.startswith(d + "/")), None)
            args.append(str(path) if path is not None else word)
        installs.append(args)
    return installs


@pytest.mark.parametrize("python", ["3.11"])
def test_container_install_set_resolves_against_the_image_stack(python, tmp_path):
    installs = pip_installs()
    assert installs, f"{DEF.name}: no pip install in %post"
    assert "snakemake-executor-plugin-slurm" not in DEF.read_text()  # numpy>=2.4: Snakemake runs outside
    if not _pypi_reachable():
        pytest.skip("PyPI is unreachable: the resolver needs package metadata")
    for args in installs:
        constraints, reqs, i = [], [], 0
        while i < len(args):
            word = args[i]
            if word in ("-c", "--constraint"):
                constraints += ["-c", args[i + 1]]
                i += 2
                continue
            if word.startswith("-"):
                assert word in ("--no-cache-dir",), f"{DEF.name}: pip flag {word} is not modelled by this test"
            elif word == PROJECT:
                reqs.append(str(REPO / "pyproject.toml"))  # the llmrnn project itself, with its dependencies
            else:
                (tmp_path / "extra.in").write_text(word + "\n")
                reqs.append(str(tmp_path / "extra.in"))
            i += 1
        assert constraints, f"{DEF.name}: pip install {args} is not constrained by the GPU lock"
        proc = subprocess.run(
            [_uv(), "pip", "compile", *reqs, *constraints, "--python-version", python, "--python-platform", PLATFORM,
             "--no-header", "--no-annotate", "--quiet", "--cache-dir", str(tmp_path / "uv-cache")],
            capture_output=True, text=True, check=False, timeout=600,
        )
        assert proc.returncode == 0, f"{DEF.name}: pip install {args} does not resolve:\n{proc.stderr[-3000:]}"
        resolved = pins(proc.stdout)
        assert resolved["numpy"].startswith("1.") and resolved["transformers"].startswith("4.57"), resolved


def test_glibc_check_names_the_container_route():
    old = subprocess.run([sys.executable, str(CHECK_GLIBC), "2.28"], capture_output=True, text=True, check=False)
    assert old.returncode == 1
    lines = old.stderr.strip().splitlines()
    assert len(lines) == 1 and "glibc 2.28" in lines[0] and "manylinux_2_31" in lines[0]
    assert "apptainer build llmrnn-verl.sif profiles/slurm/llmrnn-verl.def" in lines[0]
    for version in ("2.31", "2.36", None):
        ok = subprocess.run([sys.executable, str(CHECK_GLIBC), *([version] if version else [])],
                            capture_output=True, text=True, check=False)
        assert ok.returncode == 0 and not ok.stderr, (version, ok.stderr)


def test_make_gpu_env_checks_glibc_before_building_anything(tmp_path):
    venv = tmp_path / "gpu-venv"
    # --no-print-directory: under `make test` MAKELEVEL is set and make prints "Entering directory" first
    dry = subprocess.run(["make", "--no-print-directory", "-n", "gpu-env", f"GPU_VENV={venv}"], cwd=REPO,
                         capture_output=True, text=True,
                         check=True)
    assert dry.stdout.splitlines()[0].startswith("python3 scripts/check_glibc.py"), dry.stdout
    run = subprocess.run(["make", "gpu-env", f"GPU_VENV={venv}", "GLIBC=2.28"], cwd=REPO, capture_output=True,
                         text=True, check=False, timeout=120)
    assert run.returncode != 0 and "use the container instead" in run.stderr
    assert not venv.exists()  # nothing was built
