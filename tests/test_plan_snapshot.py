"""The five shipped configs plan the same commands as the committed snapshot, byte for byte.

The safety net of refactors that must not change what a run does (issue 42: the typed settings are the
config the code runs on): for config/config.yaml alone and for each shipped recipe file the docs name as
runnable (docs/configuration.md "How configs combine": qa_demo, reproduce, qa_reproduce, smoke), one real
`snakemake -n -p --forceall all` in a copy of the workflow, its jobs normalized (sorted; the temporary
working directory and the machine's tmpdir replaced) and compared with tests/snapshots/plan_<name>.txt.

A change that is meant to change the planned commands regenerates the snapshots, and the diff of
tests/snapshots/ is the review of what it changed:

    LLMRNN_UPDATE_SNAPSHOTS=1 pytest -p no:cacheprovider tests/test_plan_snapshot.py
"""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from tests.conftest import REPO, copy_workflow, snakemake
from tests.slurm.dag import parse_dry_run, prepare_reproduce_inputs

pytestmark = pytest.mark.slow  # five dry runs of the whole DAG: ~5-10 s each

SNAPSHOTS = REPO / "tests" / "snapshots"
CONFIGS = {
    "demo": (),
    "qa_demo": ("config/qa_demo.yaml",),
    "reproduce": ("config/reproduce.yaml",),
    "qa_reproduce": ("config/qa_reproduce.yaml",),
    "smoke": ("config/smoke.yaml",),
}
UPDATE = os.environ.get("LLMRNN_UPDATE_SNAPSHOTS") == "1"


@pytest.fixture(scope="module")
def workdir(tmp_path_factory) -> Path:
    """One copy of the workflow for all five dry runs, with the inputs the reproductions name: the
    credentialed cohort's synthetic stand-in and an (empty) ECG-Expert-QA file at qa.source."""
    work = copy_workflow(tmp_path_factory.mktemp("snapshot"))
    prepare_reproduce_inputs(work)
    (work / "data" / "ecg_expert_qa").mkdir(parents=True)
    (work / "data" / "ecg_expert_qa" / "train.json").write_text("[]")
    return work


def planned(workdir: Path, configfiles: tuple[str, ...]) -> str:
    """The jobs of one dry run as sorted text blocks: rule, threads, resources, shell command."""
    args = ("--configfile", *configfiles) if configfiles else ()
    proc = snakemake(workdir, "all", "-n", "-p", "--forceall", *args)
    blocks = []
    for job in parse_dry_run(proc.stdout + proc.stderr):
        resources = ", ".join(f"{k}={v}" for k, v in job.resources.items() if k != "tmpdir")
        blocks.append(f"rule {job.rule} threads={job.threads} priority={job.priority}\n"
                      f"  resources: {resources}\n  shell: {job.shell}\n")
    return "".join(sorted(blocks)).replace(str(workdir), "<WORKDIR>")


@pytest.mark.parametrize("name", list(CONFIGS))
def test_shipped_config_plans_the_snapshot_commands(workdir, name):
    text = planned(workdir, CONFIGS[name])
    golden = SNAPSHOTS / f"plan_{name}.txt"
    if UPDATE:
        SNAPSHOTS.mkdir(exist_ok=True)
        golden.write_text(text)
    assert golden.exists(), f"{golden} missing: LLMRNN_UPDATE_SNAPSHOTS=1 writes it"
    assert text == golden.read_text(), (
        f"{name}: the planned commands differ from {golden.relative_to(REPO)}; if intended, regenerate "
        "with LLMRNN_UPDATE_SNAPSHOTS=1 and review the diff")
