"""Docs that run: every command of the fenced shell blocks of README.md, config/README.md, CONTRIBUTING.md and
every page of docs/ is exercised, so a documented command that breaks fails here; the measured tables of
docs/results.md are the ones their scripts print.

Each block runs as one bash script (its exports carry to its later lines) in a copy of the workflow, with
a HOME of its own and no SLURM on PATH, where the documented programs stand for a check of themselves:
  - `snakemake ...`: a dry run (`-n` added);
  - `llmrnn ...`: the real CLI parser reads the line (the verb, its subcommand, every option and the
    required ones), nothing runs;
  - `make ...`: `make -n` (what it would run, from the real Makefile);
  - `export`, `mkdir`, `ln`, `cd`, `echo`: run for real, inside the sandbox;
  - `dot` (graphviz, no part of the Python stack) reads its input where graphviz is not installed;
  - ALLOWED: the few commands that cannot run here, each with its reason.
A program the docs name that none of these covers fails the test: teach it here, with a reason.
"""

from __future__ import annotations

import os
import re
import shlex
import shutil
import subprocess
import sys
from dataclasses import dataclass
from itertools import takewhile
from pathlib import Path

import pytest

from tests.conftest import REPO, WORKFLOW_PARTS
from tests.slurm.dag import EXTRA_PARTS, no_slurm_path, prepare_reproduce_inputs

DOCS = ["README.md", "config/README.md", "CONTRIBUTING.md",
        *sorted(p.relative_to(REPO).as_posix() for p in (REPO / "docs").glob("*.md"))]
SHELL_LANGS = {"bash", "sh", "shell", "console", "zsh"}
CHECKED = {"snakemake", "llmrnn", "make"}
RUN_AS_IS = {"export", "mkdir", "ln", "cd", "echo"}
# A documented command that cannot run in a test -> why. Keys are the command as written (comment dropped).
ALLOWED = {
    "source .venv/bin/activate": "activates the user's venv; the test runs in that venv already",
    "source .venv-gpu/bin/activate": "the GPU venv of `make gpu-env` (verl + vLLM + CUDA torch) exists on a GPU "
                                     "login node only",
}
FENCE = re.compile(r"^(\s*)```(\S*)\s*$")
OPERATORS = {"&&", "||", "|", ";", "&"}


@dataclass
class Command:
    file: str
    line: int
    text: str

    @property
    def where(self) -> str:
        return f"{self.file}:{self.line}"


def fenced_blocks(text: str) -> list[tuple[str, int, list[tuple[int, str]]]]:
    """(language, first line, [(line number, line)]) of every fenced block of a markdown text."""
    blocks, current = [], None
    for n, line in enumerate(text.splitlines(), 1):
        m = FENCE.match(line)
        if m and current is None:
            current = (m.group(2).lower(), n, [])
        elif m and current is not None and not m.group(2):
            blocks.append(current)
            current = None
        elif current is not None:
            current[2].append((n, line))
    return blocks


def strip_comment(line: str) -> str:
    """The line without its trailing `# comment` (a # inside quotes or a word stays)."""
    in_single = in_double = False
    for i, ch in enumerate(line):
        if ch == "'" and not in_double:
            in_single = not in_single
        elif ch == '"' and not in_single:
            in_double = not in_double
        elif ch == "#" and not in_single and not in_double and (i == 0 or line[i - 1].isspace()):
            return line[:i].rstrip()
    return line.rstrip()


def commands(file: str, lines: list[tuple[int, str]]) -> list[Command]:
    """The commands of one shell block: comments dropped, `\\` continuations joined, `$ ` prompts removed."""
    out: list[Command] = []
    pending: tuple[int, str] | None = None
    for n, raw in lines:
        text = strip_comment(raw).removeprefix("$ ")
        if pending is not None:
            n, text = pending[0], pending[1] + " " + text.strip()
            pending = None
        if text.endswith("\\"):
            pending = (n, text[:-1].rstrip())
            continue
        if text.strip():
            out.append(Command(file, n, text.strip()))
    return out


def programs(text: str) -> list[str]:
    """The program of each simple command of a shell line (after its VAR=value prefixes)."""
    lexer = shlex.shlex(text, posix=True, punctuation_chars=True)
    lexer.whitespace_split = True
    found, start = [], True
    for tok in lexer:
        if tok in OPERATORS:
            start = True
        elif start and not re.fullmatch(r"[A-Za-z_]\w*=.*", tok):
            found.append(tok)
            start = False
    return found


def documented() -> dict[str, list[Command]]:
    """file -> the commands of its shell blocks."""
    found = {}
    for file in DOCS:
        cmds = []
        for lang, _, lines in fenced_blocks((REPO / file).read_text()):
            if lang in SHELL_LANGS:
                cmds += commands(file, lines)
        found[file] = cmds
    return found


def unchecked(cmd: Command) -> list[str]:
    """The programs of a command that this test cannot exercise (empty: it can)."""
    if cmd.text in ALLOWED:
        return []
    return [p for p in programs(cmd.text) if p not in CHECKED | RUN_AS_IS | {"dot"}]


# ----------------------------------------------------------------------------- unit tests of the reader
def test_the_reader_finds_commands_in_shell_blocks_only():
    text = textwrap_dedent("""
        ```
        cohort JSON ─ clean_cohort   # a diagram
        ```
        ```bash
        make demo   # a comment
        FOO="a b" snakemake --configfile c.yaml \\
            all
        echo '# not a comment' && llmrnn chat --model m | dot -Tpng > x.png
        ```
    """)
    blocks = [(lang, lines) for lang, _, lines in fenced_blocks(text) if lang in SHELL_LANGS]
    assert len(blocks) == 1
    cmds = commands("X.md", blocks[0][1])
    assert [c.text for c in cmds] == ["make demo", 'FOO="a b" snakemake --configfile c.yaml all',
                                      "echo '# not a comment' && llmrnn chat --model m | dot -Tpng > x.png"]
    assert [c.line for c in cmds] == [5, 6, 8]
    assert programs(cmds[1].text) == ["snakemake"]
    assert programs(cmds[2].text) == ["echo", "llmrnn", "dot"]
    assert unchecked(Command("X.md", 1, "pip install llmrnn")) == ["pip"]


def textwrap_dedent(text: str) -> str:
    import textwrap

    return textwrap.dedent(text).lstrip("\n")


def test_every_documented_program_is_one_this_test_exercises():
    docs = documented()
    assert sum(map(len, docs.values())) >= 15, docs  # the reader really found the README's commands
    problems = [f"{c.where}: {c.text!r} runs {unchecked(c)}" for cmds in docs.values() for c in cmds if unchecked(c)]
    assert not problems, ("teach tests/test_docs_commands.py how to exercise these (or add them to ALLOWED "
                          "with the reason they cannot run in a test): " + "; ".join(problems))


def test_no_command_hides_in_an_unmarked_block():
    """A fence without a language is a diagram or an output; a command there would escape this test."""
    for file in DOCS:
        for lang, start, lines in fenced_blocks((REPO / file).read_text()):
            if lang not in SHELL_LANGS:
                hidden = [n for n, line in lines if programs_safe(line)[:1] and programs_safe(line)[0] in CHECKED]
                assert not hidden, f"{file}:{start}: commands in a ```{lang} block (mark it ```bash): {hidden}"


def programs_safe(line: str) -> list[str]:
    try:
        return programs(strip_comment(line))
    except ValueError:  # not shell (a diagram's quote)
        return []


# ----------------------------------------------------------------------------- the commands, exercised
SHIMS = r"""
set -o pipefail
snakemake() {  # as a user's shell runs it: a command that executes jobs must name its cores (or a profile)
  case " $* " in
    *" --profile "*|*" --cores "*|*" -c "*|*" --jobs "*|*" -j "*|*" -n "*|*" --dry-run "*|*" --rulegraph "*|\
    *" --dag "*|*" --summary "*|*" --list-changes "*|*" --lint "*|*" --report "*) ;;
    *) echo "snakemake $*: cores have to be specified (no --profile or --cores)" >&2; return 1 ;;
  esac
  command snakemake --cores 1 -n "$@"
}
make() { command make -n "$@"; }
llmrnn() { python -c 'import sys; from llmrnn import cli; cli.build_parser().parse_args(sys.argv[1:])' "$@"; }
command -v dot >/dev/null || dot() { cat >/dev/null; }
"""


@pytest.fixture(scope="module")
def sandbox(tmp_path_factory) -> tuple[Path, dict[str, str]]:
    """A copy of the repository's workflow, Makefile and package metadata, with a HOME of its own, no SLURM
    commands on PATH and the reproduction's cohort as a synthetic stand-in (its dry run needs the file)."""
    work = tmp_path_factory.mktemp("docs")
    for part in dict.fromkeys([*WORKFLOW_PARTS, *EXTRA_PARTS, "Makefile", "pyproject.toml", "constraints.txt"]):
        (shutil.copytree if (REPO / part).is_dir() else shutil.copy2)(REPO / part, work / part)
    prepare_reproduce_inputs(work)
    stand_in_qa_sources(work)
    home = tmp_path_factory.mktemp("home")
    env = {k: v for k, v in os.environ.items() if not k.startswith(("LLMRNN_", "SNAKEMAKE_"))}
    env.update(HOME=str(home), PATH=no_slurm_path(tmp_path_factory.mktemp("bin")), PYTHONPATH=str(REPO / "src"),
               OMP_NUM_THREADS="1", HF_HUB_OFFLINE="1")
    return work, env


def stand_in_qa_sources(work: Path) -> None:
    """Synthetic questions where a shipped config names a QA file the user brings (ECG-Expert-QA)."""
    import yaml

    from llmrnn import io
    from llmrnn.cohort import synthesize_cohort
    from llmrnn.qa.synth import questions_from_cohort

    for path in sorted((work / "config").glob("*.yaml")):
        source = ((yaml.safe_load(path.read_text()) or {}).get("qa") or {}).get("source")
        if isinstance(source, str) and not source.startswith("hf:") and not (work / source).exists():
            questions, _ = questions_from_cohort(synthesize_cohort(30, seed=3), seed=0)
            io.write_json(work / source, questions)


def _blocks() -> list[tuple[str, int, list[Command]]]:
    out = []
    for file in DOCS:
        for lang, start, lines in fenced_blocks((REPO / file).read_text()):
            if lang in SHELL_LANGS and (cmds := commands(file, lines)):
                out.append((file, start, cmds))
    return out


BLOCKS = _blocks()


def block_script(cmds: list[Command]) -> str:
    lines = [SHIMS]
    for c in cmds:
        if c.text in ALLOWED:
            lines.append(f": {shlex.quote('skipped: ' + ALLOWED[c.text])}")
            continue
        lines.append(f"echo {shlex.quote('@@ ' + c.where)} >&2")
        lines.append(f"{c.text} || {{ echo {shlex.quote('FAILED ' + c.where + ': ' + c.text)} >&2; exit 1; }}")
    return "\n".join(lines) + "\n"


@pytest.mark.e2e  # a slow tier test (a workflow, CLI or training run of its own): `make test-e2e`
@pytest.mark.slow
@pytest.mark.parametrize("block", BLOCKS, ids=[f"{f}:{n}" for f, n, _ in BLOCKS])
def test_documented_commands_run(block, sandbox):
    file, start, cmds = block
    assert not [c for c in cmds if unchecked(c)], "see test_every_documented_program_is_one_this_test_exercises"
    work, env = sandbox
    env = dict(env, PATH=f"{Path(sys.executable).parent}{os.pathsep}{env['PATH']}")
    proc = subprocess.run(["bash", "-c", block_script(cmds)], cwd=work, env=env, capture_output=True, text=True,
                          timeout=900, check=False)
    failed = [line for line in proc.stderr.splitlines() if line.startswith("FAILED ")]
    assert proc.returncode == 0, (f"{failed[-1] if failed else file + ':' + str(start)}\n{proc.stdout[-3000:]}\n"
                                  f"{proc.stderr[-3000:]}")


@pytest.mark.slow
def test_a_broken_command_fails(sandbox):
    """The check is not vacuous: the README's old qa command (`--configfile` swallows `all`) fails."""
    work, env = sandbox
    env = dict(env, PATH=f"{Path(sys.executable).parent}{os.pathsep}{env['PATH']}")

    def runs(text: str) -> bool:
        script = block_script([Command("X.md", 1, text)])
        return subprocess.run(["bash", "-c", script], cwd=work, env=env, capture_output=True, text=True,
                              timeout=600, check=False).returncode == 0

    assert not runs("snakemake --profile profiles/local --configfile config/qa_demo.yaml all")
    assert runs("snakemake --profile profiles/local all --configfile config/qa_demo.yaml")
    assert not runs("llmrnn chat --modle x")  # a misspelt option
    assert not runs("make no-such-target")


def _benchmark(name: str):
    import importlib.util

    spec = importlib.util.spec_from_file_location(name, REPO / "benchmarks" / f"{name}.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def _results() -> list[str]:
    return [line.strip() for line in (REPO / "docs" / "results.md").read_text().splitlines()]


NO_JOBS = {"-n", "--dry-run", "--rulegraph", "--dag", "--summary", "--list-changes", "--lint", "--report"}
NAMES_CORES = {"--profile", "--cores", "-c", "--jobs", "-j"}


def test_every_documented_snakemake_command_names_its_cores():
    """A bare `snakemake all` stops with "cores have to be specified": each documented command that runs jobs
    names a profile or its cores (the docs' shim above refuses it too, in the slow tier)."""
    bare = []
    for cmds in documented().values():
        for c in cmds:
            if "snakemake" in programs(c.text):
                words = {w.split("=")[0] for w in shlex.split(strip_comment(c.text))}
                if not words & (NO_JOBS | NAMES_CORES):
                    bare.append(f"{c.where}: {c.text}")
    assert not bare, bare


def test_the_docs_cover_every_page():
    assert "docs/results.md" in DOCS and "docs/cluster.md" in DOCS and "README.md" in DOCS


def test_the_seed_tables_are_the_ones_their_script_prints():
    """Numbers with their script: docs/results.md's seed tables have the columns benchmarks/demo_seeds.py prints."""
    results = _results()
    header = _benchmark("demo_seeds").HEADER.splitlines()
    tables = [i for i, line in enumerate(results) if line == header[0]]
    # the 8-step demo's float32 and bfloat16 tables (before 2026-12-02), and the 4-step float32 demo's
    assert len(tables) == 3
    for at in tables:
        assert results[at + 1] == header[1]
        assert "benchmarks/demo_seeds.py" in "\n".join(results[max(0, at - 6):at])
        rows = list(takewhile(lambda line: line.startswith("|"), results[at + 2:]))
        assert [row.split("|")[1].strip() for row in rows] == ["42", "1", "2"]
        assert all(row.count("|") == header[0].count("|") for row in rows)


def test_the_qa_table_is_the_one_its_script_prints():
    """benchmarks/qa_demo.py prints the QA table's header and each row's cells in the page's format."""
    qa_demo = _benchmark("qa_demo")
    results = _results()
    header = qa_demo.header(4)
    at = results.index(header[0])
    assert results[at + 1] == header[1]
    assert "benchmarks/qa_demo.py" in "\n".join(results[max(0, at - 6):at])
    metric = {"value": 0.5, "ci95": [0.25, 0.75]}
    metrics = {"k": 4, "splits": {"test": {"grpo": dict.fromkeys(
        ["greedy_pass@1", "sampling_pass@1", "sampling_pass@4", "sampling_maj@4"], metric), "base": {}}}}
    printed = qa_demo.table(metrics)
    assert printed[:2] == header
    assert printed[2:] == ["| test | base | - | - | - | - |",
                           "| test | GRPO |" + " 0.500 [0.250, 0.750] |" * 4]
    rows = list(takewhile(lambda line: line.startswith("|"), results[at + 2:]))
    assert len(rows) == 6 and all(re.fullmatch(r"\| (test|ood) \| (base|SFT|GRPO) \|( [\d.]+ \[[\d.]+, [\d.]+\] \|){4}",
                                                 row) for row in rows), rows


def test_every_results_table_names_its_script_and_when_it_was_measured():
    """Each table of docs/results.md: a benchmarks/ script that exists, and a measurement date, in its section."""
    results = _results()
    section_start = 0
    problems = []
    for i, line in enumerate(results):
        if line.startswith("#"):
            section_start = i
        if line.startswith("|---"):
            before = "\n".join(results[section_start:i])
            scripts = re.findall(r"benchmarks/(\w+\.py)", before)
            if not scripts or not all((REPO / "benchmarks" / s).is_file() for s in scripts):
                problems.append(f"docs/results.md:{i}: no existing benchmarks/ script above the table ({scripts})")
            if not re.search(r"Measured (on )?\d{4}-\d\d-\d\d", before):
                problems.append(f"docs/results.md:{i}: no 'Measured YYYY-MM-DD' above the table")
    assert not problems, problems
