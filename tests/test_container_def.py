"""The GPU route's install paths work where they are meant to: `make gpu-env` checks glibc before anything
else and names the container route in one line (vLLM 0.17.1 ships only manylinux_2_31 wheels), and the
container definition installs the GPU lock as written (verl 0.7.1 + vLLM 0.17.1, numpy<2), every locked
package resolves for the image's platform (uv's resolver; metadata only), and the image checks at build and
test time that verl and vLLM import at the locked versions (scripts/check_gpu_stack.py, run here too)."""

from __future__ import annotations

import re
import shlex
import subprocess
import sys

import pytest

from tests.conftest import REPO
from tests.test_gpu_lock import _pypi_reachable, _uv, pins

DEF = REPO / "profiles" / "slurm" / "llmrnn-verl.def"
CHECK_GLIBC = REPO / "scripts" / "check_glibc.py"
PROJECT = "<the llmrnn project>"


def _section(name: str) -> list[str]:
    text = DEF.read_text()
    match = re.search(rf"^%{name}\n(.*?)(?=^%|\Z)", text, re.MULTILINE | re.DOTALL)
    assert match, f"{DEF.name}: no %{name} section"
    return [line.strip() for line in match.group(1).replace("\\\n", " ").splitlines()
            if line.strip() and not line.strip().startswith("#")]


def installs() -> list[list[str]]:
    """The words of each `pip install` / `uv pip install` in %post, container paths mapped back to the repository."""
    files = {dst: REPO / src for src, dst in (line.split() for line in _section("files"))}
    out = []
    for line in _section("post"):
        words = shlex.split(line)
        if words[:2] == ["uv", "pip"]:
            words = words[1:]
        if words[:2] != ["pip", "install"]:
            continue
        args = []
        for word in words[2:]:
            if any(dst.startswith(word.rstrip("/") + "/") for dst in files):  # the folder holding pyproject.toml
                args.append(PROJECT)
                continue
            path = files.get(word) or next((files[d] / word[len(d) + 1:] for d in files if word.startswith(d + "/")), None)
            args.append(str(path) if path is not None else word)
        out.append(args)
    return out


LOCK = REPO / "envs" / "gpu-lock.txt"
CHECK_STACK = REPO / "scripts" / "check_gpu_stack.py"


def test_container_installs_the_gpu_lock_with_verl_and_vllm_and_checks_them():
    """verl is in the `gpu` extra, not in llmrnn's dependencies: the image installs the GPU lock itself (as
    `make gpu-env` does, --no-deps) and then llmrnn, and its %post and %test import verl and vLLM and
    compare them with the lock's pins (scripts/check_gpu_stack.py)."""
    steps = installs()
    lock_installs = [a for a in steps if "-r" in a and a[a.index("-r") + 1] == str(LOCK)]
    assert lock_installs and "--no-deps" in lock_installs[0], steps
    project = [a for a in steps if PROJECT in a]
    assert project and "--no-deps" in project[0], steps
    assert steps.index(lock_installs[0]) < steps.index(project[0])  # the stack first, then llmrnn on it
    lock = pins(LOCK.read_text())
    assert (lock["verl"], lock["vllm"]) == ("0.7.1", "0.17.1")
    gpu_in = pins("\n".join(line for line in (REPO / "envs" / "gpu.in").read_text().splitlines() if "==" in line))
    assert {k: lock[k] for k in ("verl", "vllm")} == {k: gpu_in[k] for k in ("verl", "vllm")}
    check = "python /opt/llmrnn/scripts/check_gpu_stack.py /opt/llmrnn/envs/gpu-lock.txt"
    assert check in _section("post") and check in _section("test")
    assert "scripts/check_gpu_stack.py /opt/llmrnn/scripts/check_gpu_stack.py" in _section("files")


def test_stack_check_names_what_differs_from_the_lock(tmp_path):
    """The image's check run here: in the verl 0.7.1 venv (verl at the lock's version, no vLLM, CPU torch)
    it passes verl and names vLLM; with a lock pinning the installed versions it passes."""
    python = REPO / ".venv-verl-0.7.1" / "bin" / "python"
    if not python.exists():
        pytest.skip("no verl 0.7.1 venv (scripts/make_verl_env.sh 0.7.1)")
    env = {"PATH": "/usr/bin:/bin", "PYTHONPATH": str(REPO / "src")}
    bad = subprocess.run([str(python), str(CHECK_STACK), str(LOCK)], capture_output=True, text=True, env=env,
                         check=False, timeout=300)
    assert bad.returncode == 1 and len(bad.stderr.strip().splitlines()) == 1, bad.stderr
    assert "vllm does not import" in bad.stderr and "verl " not in bad.stderr.replace("gpu-lock", "")
    versions = "import importlib.metadata as m; print(*(m.version(p) for p in ('verl', 'torch', 'transformers')))"
    have = subprocess.run([str(python), "-c", versions], capture_output=True, text=True, check=True).stdout.split()
    own = tmp_path / "lock.txt"
    own.write_text(f"verl=={have[0]}\ntorch=={have[1]}\ntransformers=={have[2]}\n")
    ok = subprocess.run([str(python), str(CHECK_STACK), str(own), "verl", "torch", "transformers"],  # no vLLM here
                        capture_output=True, text=True, env=env, check=False, timeout=300)
    assert ok.returncode == 0 and ok.stdout.startswith(f"verl {have[0]}"), ok.stderr


@pytest.mark.slow
def test_every_locked_package_resolves_for_the_image_platform(tmp_path):
    """The lock the image installs, package by package (--no-deps, as %post installs it), exists for Linux
    x86_64 glibc 2.31+ and Python 3.11: uv's resolver, metadata only."""
    if not _pypi_reachable():
        pytest.skip("PyPI is unreachable: the resolver needs package metadata")
    proc = subprocess.run(
        [_uv(), "pip", "compile", str(LOCK), "--no-deps", "--python-version", "3.11", "--python-platform",
         "x86_64-manylinux_2_31", "--no-header", "--no-annotate", "--quiet", "--cache-dir", str(tmp_path / "uv-cache")],
        capture_output=True, text=True, check=False, timeout=900,
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    resolved = pins(proc.stdout)
    assert resolved["verl"] == "0.7.1" and resolved["vllm"] == "0.17.1" and resolved["numpy"].startswith("1.")
    assert resolved["transformers"].startswith("4.57")


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


def _tiny_wheel(folder) -> str:
    """A valid, empty wheel (what the installs below are asked to install: only their refusal matters)."""
    import zipfile

    path = folder / "llmrnn_pep668_probe-0.0.1-py3-none-any.whl"
    info = "llmrnn_pep668_probe-0.0.1.dist-info"
    files = {f"{info}/METADATA": "Metadata-Version: 2.1\nName: llmrnn-pep668-probe\nVersion: 0.0.1\n",
             f"{info}/WHEEL": "Wheel-Version: 1.0\nGenerator: test\nRoot-Is-Purelib: true\nTag: py3-none-any\n"}
    with zipfile.ZipFile(path, "w") as zf:
        for name, text in files.items():
            zf.writestr(name, text)
        zf.writestr(f"{info}/RECORD", "".join(f"{n},,\n" for n in files) + f"{info}/RECORD,,\n")
    return str(path)


def test_the_installs_run_on_an_externally_managed_python(tmp_path):
    """Every install of %post, with its own flags and %post's exported environment, against this machine's
    system Python when it is marked externally managed (PEP 668, as on Debian 12 images): pip and uv
    `--system` refused it ("externally-managed-environment") before the flags; a dry run installs nothing."""
    import glob
    import os

    marker = glob.glob("/usr/lib/python3*/EXTERNALLY-MANAGED")
    system = "/usr/bin/python3"
    if not marker or not os.path.exists(system):
        pytest.skip("no externally managed system Python here (/usr/lib/python3*/EXTERNALLY-MANAGED)")
    if subprocess.run([system, "-m", "pip", "--version"], capture_output=True, check=False).returncode:
        pytest.skip("the system Python has no pip")
    env = dict(os.environ)
    for line in _section("post"):
        if line.startswith("export "):
            env.update(word.split("=", 1) for word in shlex.split(line)[1:] if "=" in word)
    wheel = _tiny_wheel(tmp_path)
    ran = 0
    for line in _section("post"):
        words = shlex.split(line)
        uv = words[:2] == ["uv", "pip"]
        if not (uv or words[:2] == ["pip", "install"]):
            continue
        flags = [w for w in words[3 if uv else 2:] if w.startswith("--") and w not in ("--no-deps",)]
        if uv:
            cmd = [_uv(), "pip", "install", "--python", system, *flags]
        else:
            cmd = [system, "-m", "pip", "install", *flags, "--no-index"]
        proc = subprocess.run([*cmd, "--dry-run", "--no-deps", wheel], capture_output=True, text=True, env=env,
                              timeout=120, check=False)
        out = proc.stdout + proc.stderr
        assert "externally" not in out.lower(), (line, out[-1500:])
        assert proc.returncode == 0, (line, out[-1500:])
        ran += 1
    assert ran == 3
