"""docs/rewards.md "Your own reward" as a user follows it: the page's reward is the shipped file, it scores
what the built-in outcome reward scores, `llmrnn check` accepts it over the demo's config, and the page's
`snakemake` line plans the run without a judge (no judge_server, no judge_agreement: the agreement check
asked a judged mode of a reward whose `judged` is false, and the run died in it)."""

from __future__ import annotations

import importlib.util
import json
import re
import shlex
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from llmrnn.reward import compute_score
from tests.conftest import REPO, copy_workflow

PAGE = (REPO / "docs" / "rewards.md").read_text()
SECTION = PAGE.split("## Your own reward", 1)[1].split("\n## ", 1)[0]
SHIPPED = REPO / "config" / "own_reward"


def tried_lines() -> list[str]:
    block = SECTION.split("<!-- tried: tests/test_docs_own_reward.py -->\n```bash\n", 1)[1].split("```", 1)[0]
    return [line for line in block.splitlines() if line.strip()]


def test_the_page_shows_the_shipped_files():
    python = SECTION.split("```python\n", 1)[1].split("```", 1)[0]
    assert python == (SHIPPED / "my_reward.py").read_text()
    shown = yaml.safe_load(SECTION.split("```yaml\n", 1)[1].split("```", 1)[0])
    assert shown == yaml.safe_load((SHIPPED / "my_reward.yaml").read_text())


def _page_step() -> dict:
    """The page's real trajectory step (its json block)."""
    return json.loads(PAGE.split("```json\n", 1)[1].split("```", 1)[0])


@pytest.mark.parametrize("memory", [
    "NSTEMI and afib",                               # abbreviations the built-in expands
    "coronary disease; atrial fibrillations",        # content words and plurals, not exact names
    "non st elevation myocardial infarction, atrial fibrillation, coronary artery disease",
    "gout",
    "",
])
def test_the_example_scores_as_the_builtin_outcome_reward(memory, tmp_path):
    spec = importlib.util.spec_from_file_location("my_reward", SHIPPED / "my_reward.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    step = json.dumps(_page_step())
    for solution in (json.dumps({"evolving_summary": memory}), f"no json: {memory}"):
        builtin = compute_score("llmrnn", solution, step, {}, audit_dir=str(tmp_path),
                                reward_cfg={"mode": "outcome"})["score"]
        assert module.compute_score("llmrnn", solution, step, {}) == pytest.approx(builtin), solution


@pytest.fixture(scope="module")
def workflow(tmp_path_factory) -> Path:
    return copy_workflow(tmp_path_factory.mktemp("own_reward"))


def _run(line: str, cwd: Path, *extra: str) -> subprocess.CompletedProcess:
    argv = shlex.split(line)
    exe = {"llmrnn": [sys.executable, "-m", "llmrnn.cli"], "snakemake": [sys.executable, "-m", "snakemake"]}
    return subprocess.run([*exe[argv[0]], *argv[1:], *extra], cwd=cwd, capture_output=True, text=True,
                          timeout=600, check=False,
                          env={**__import__("os").environ, "PYTHONPATH": str(REPO / "src")})


def test_the_page_snakemake_line_plans_no_judge(workflow):
    line = next(t for t in tried_lines() if t.startswith("snakemake "))
    proc = _run(line, workflow, "--dry-run", "--quiet", "rules")
    assert proc.returncode == 0, proc.stderr[-3000:]
    planned = set(re.findall(r"^(\w+)\s+\d+$", proc.stdout, re.MULTILINE))
    assert "train_grpo" in planned and "preflight" in planned
    assert not planned & {"judge_server", "judge_agreement", "judge_agreement_plot"}, planned


def test_the_page_check_line_passes(workflow):
    line = next(t for t in tried_lines() if t.startswith("llmrnn check"))
    proc = _run(line, workflow)
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-2000:]
