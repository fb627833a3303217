"""Hostile and careless config input (issue 33): one YAML reader for every config and run file (alias
bombs, duplicate keys, deep nesting, non-UTF-8, fifos and devices refused in one line, fast), `check`
applies each recipe's own checks (every shipped config), the QA data checked before the run, the schema
refusing what only `check` refused, and the run's config file written or refused in one line."""

from __future__ import annotations

import ast
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from llmrnn import io, runconfig
from llmrnn.check import run_checks
from llmrnn.errors import InputError
from tests.conftest import REPO

BOMB = "".join(f"{c}: &{c} [{', '.join([f'*{p}'] * 9) if p else ', '.join(['lol'] * 9)}]\n"
               for p, c in zip(["", *"abcdefgh"], "abcdefghi"))  # 9**9 values from ~800 bytes


def _hostile(tmp_path: Path) -> dict[str, tuple[Path, str]]:
    """name -> (file, what its one line says)."""
    files = {
        "bomb": (BOMB + "run_name: x\n", "aliases"),
        "duplicate": ("run_name: a\ntrain: {lr: 1.0e-5}\nrun_name: b\n", "key 'run_name' appears twice"),
        "deep": ("run_name: x\nx: " + "[" * 5000 + "]" * 5000 + "\n", "nested more than"),
        "latin1": ("run_name: caf\xe9\n".encode("latin-1"), "not UTF-8"),
        "cycle": ("x: &a [*a]\n", "refers to a value that contains it"),
    }
    out = {}
    for name, (text, says) in files.items():
        path = tmp_path / f"{name}.yaml"
        path.write_bytes(text if isinstance(text, bytes) else text.encode())
        out[name] = (path, says)
    fifo = tmp_path / "fifo.yaml"
    os.mkfifo(fifo)
    out["fifo"] = (fifo, "not a regular file")
    out["device"] = (Path("/dev/zero"), "not a regular file")
    return out


def test_one_yaml_reader_refuses_every_hostile_file_in_one_line(tmp_path):
    assert len(BOMB) < 1000
    for name, (path, says) in _hostile(tmp_path).items():
        with pytest.raises(InputError, match=says) as err:
            io.read_yaml(path, "config file")
        assert str(path) in str(err.value) and "\n" not in str(err.value), name
    assert io.loads_yaml("base: &b {x: 1}\nuse: {<<: *b, y: 2}\nlist: [*b, *b]\n", "t") == {
        "base": {"x": 1}, "use": {"x": 1, "y": 2}, "list": [{"x": 1}, {"x": 1}]}  # a few aliases are fine


@pytest.mark.e2e  # a slow tier test (a workflow, CLI or training run of its own): `make test-e2e`
def test_config_show_and_check_refuse_hostile_files_in_one_line_from_outside_the_repository(tmp_path):
    """Run from a folder that is not the workflow's (the schema is found beside the package): each file
    is one line and exit 1 (a fifo and /dev/zero neither hang nor fill memory)."""
    env = {**os.environ, "PYTHONPATH": str(REPO / "src"), "HF_HUB_OFFLINE": "1"}
    good = tmp_path / "good.yaml"
    good.write_text("run_name: outside\n")
    cases = [(good, None), *_hostile(tmp_path).values()]
    for path, says in cases:
        for verb in (["config", "show", "--configfile"], ["check", "--configfile"]):
            proc = subprocess.run([sys.executable, "-m", "llmrnn.cli", *verb, str(path)], cwd=tmp_path, env=env,
                                  capture_output=True, text=True, timeout=60, check=False)
            if says is None:
                assert proc.returncode in (0, 1) and "Traceback" not in proc.stderr, proc.stderr[-800:]
                if verb[0] == "config":
                    assert proc.returncode == 0 and 'run_name: "outside"' in proc.stdout
                continue
            assert proc.returncode != 0 and says in proc.stderr and "Traceback" not in proc.stderr, \
                (verb, path, proc.stderr[-800:])
            if verb[0] == "config":
                assert len(proc.stderr.strip().splitlines()) == 1 and not proc.stdout


def test_rubric_and_prompt_files_use_the_same_reader(tmp_path):
    from llmrnn.prompts import load_prompts
    from llmrnn.release import rubric_info
    from llmrnn.rubric import load_rubric

    bomb = tmp_path / "bomb.yaml"
    bomb.write_text(BOMB)
    dup = tmp_path / "dup.yaml"
    dup.write_text((REPO / "config" / "rubrics" / "qa_correctness_smollm2.yaml").read_text() + "name: again\n")
    for load in (load_rubric, load_prompts, rubric_info):
        for path, says in ((bomb, "aliases"), (dup, "appears twice")):
            with pytest.raises(InputError, match=says):
                load(path)


def test_every_yaml_load_of_the_package_goes_through_the_one_reader():
    """No module but llmrnn.io loads YAML itself (yaml.load/safe_load/full_load, OmegaConf.load)."""
    found = []
    for path in sorted((REPO / "src" / "llmrnn").rglob("*.py")):
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            if (isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute)
                    and node.func.attr in {"load", "safe_load", "full_load", "unsafe_load", "load_all",
                                           "safe_load_all"}
                    and isinstance(node.func.value, ast.Name) and node.func.value.id in {"yaml", "OmegaConf"}):
                found.append(f"{path.relative_to(REPO)}:{node.lineno}")
    assert found == []


def test_a_damaged_run_config_is_one_line(tmp_path):
    run = tmp_path / "config.yaml"
    for text, says in (("configfiles: 5\nconfig: {a: 1}\nsources: {a: x}\n", "configfiles must be a list"),
                       ("configfiles: [a]\nconfig: {a: 2020-01-01}\nsources: {}\n", "not plain data"),
                       ("configfiles: [a]\nconfig: [1]\nsources: {}\n", "must be mappings")):
        run.write_text(text)
        with pytest.raises(InputError, match=says):
            runconfig.show_lines(runconfig.load_any(tmp_path))


def test_an_unwritable_run_config_is_one_line_naming_the_file(tmp_path):
    """The Snakefile's onstart write on a full disk or an unusable folder: the path, not 'OSError'."""
    (tmp_path / "results").write_text("a file where the run folder belongs")
    target = tmp_path / "results" / "run" / "config.yaml"
    with pytest.raises(InputError, match=f"{target}: cannot write the run's config"):
        runconfig.write_run_config(target, {"run_name": "run"}, [])


def test_the_schema_is_found_beside_the_package_outside_the_workflow_folder(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    assert runconfig.find_schema().resolve() == (REPO / runconfig.SCHEMA).resolve()


# ----------------------------------------------------------------------------- check, per recipe
@pytest.fixture
def in_repo(monkeypatch):
    monkeypatch.chdir(REPO)
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    for name in ("LLMRNN_TRAIN_GPUS", "LLMRNN_JUDGE_GPUS", "LLMRNN_TRAIN_NODES"):
        monkeypatch.delenv(name, raising=False)


# what a shipped reproduction config may lack on a machine without its data and models
MISSING_HERE = ("is not downloaded yet and HF_HUB_OFFLINE is set", "data/", "gpu stack", "verl")


# the shipped configs written to be layered on another (docs/compare.md's experiments), checked over it
OVERLAID_ON = {"sweep-cpu.yaml": "config.yaml", "ablations.yaml": "reproduce.yaml"}


def test_check_passes_every_shipped_config_with_its_own_recipe_checks(in_repo):
    """The CPU demos pass whole; a reproduction config is refused only for data and models this machine
    lacks, never by another recipe's check (qa_demo once failed the memory head's split sizes)."""
    shipped = sorted((REPO / "config").glob("*.yaml"))
    assert {p.name for p in shipped} >= {"config.yaml", "qa_demo.yaml", "reproduce.yaml", "qa_reproduce.yaml"}
    for path in shipped:
        layers = [Path("config") / name for name in (OVERLAID_ON.get(path.name), path.name) if name]
        report = run_checks(layers)
        if path.name in ("config.yaml", "qa_demo.yaml", "sweep-cpu.yaml"):
            assert report["ok"], (path.name, report["problems"])
        for problem in report["problems"]:
            assert any(m in problem for m in MISSING_HERE), (path.name, problem)
            assert "split needs" not in problem, (path.name, problem)


def _qa(tmp_path: Path, qa: dict) -> list[str]:
    over = tmp_path / "over.yaml"
    over.write_text(json.dumps({"qa": qa}))
    return run_checks([Path("config/qa_demo.yaml"), over])["problems"]


def test_check_catches_qa_data_that_would_fail_at_run_time(in_repo, tmp_path):
    problems = _qa(tmp_path, {"split": {"val_size": 200}})
    assert len(problems) == 1 and problems[0].startswith("qa.split: val_size 200 + test_size 10"), problems
    empty = tmp_path / "empty.jsonl"
    empty.write_text("")
    assert _qa(tmp_path, {"source": str(empty)}) == [f"qa.source: {empty} holds no QA records (the file is empty)"]
    for odd in ("synthetc", str(tmp_path), "hf:", "data/{x}.json"):
        problems = _qa(tmp_path, {"source": odd})
        assert len(problems) == 1 and problems[0].startswith("qa.source: "), (odd, problems)
    bad = tmp_path / "bad.json"
    bad.write_text('[{"question": 5}]')
    assert _qa(tmp_path, {"source": str(bad)})[0].startswith(f"qa.source: {bad}: record 0")


def test_qa_data_refuses_an_empty_file_for_its_emptiness(tmp_path):
    from llmrnn.qa import data as D

    empty = tmp_path / "qa.jsonl"
    empty.write_text("\n")
    with pytest.raises(InputError, match="holds no QA records"):
        D.prepare({}, D.output_paths(tmp_path / "out"), str(empty))
    assert not (tmp_path / "out").exists()


def test_the_schema_refuses_a_group_of_one_as_snakemake_validates_it():
    """train.group_size: 1 fails Snakemake's own validate() (the Snakefile's parse, `snakemake -n`)."""
    with pytest.raises(InputError, match="group_size"):
        runconfig.with_defaults({"run_name": "x", "train": {"group_size": 1}}, REPO / runconfig.SCHEMA)
    ok = runconfig.with_defaults({"run_name": "x", "train": {"group_size": 2}}, REPO / runconfig.SCHEMA)
    assert ok["train"]["group_size"] == 2
