"""The five shipped configs plan the same jobs with the same arguments as the committed snapshot.

The safety net of refactors that must not change what a run does (issue 42: the typed settings are the
config the code runs on): for config/config.yaml alone and for each shipped recipe file the docs name as
runnable (docs/configuration.md "How configs combine": qa_demo, reproduce, qa_reproduce, smoke), one real
`snakemake -n -p --forceall all` in a copy of the workflow. Each job is its rule, threads, priority,
resources and its command as an argument list (the shell's own word splitting, shlex; a JSON argument such as
`--cfg` parsed), so what is compared is what the command receives, not how the string was spelled: spaces
between words or the order of a JSON object's keys change nothing. Jobs sorted, the temporary working
directory replaced, compared with tests/snapshots/plan_<name>.json.

A change that is meant to change the planned commands regenerates the snapshots, and the diff of
tests/snapshots/ is the review of what it changed:

    LLMRNN_UPDATE_SNAPSHOTS=1 pytest -p no:cacheprovider tests/test_plan_snapshot.py
"""

from __future__ import annotations

import json
import os
import shlex

import pytest

from tests.conftest import REPO, ShippedDryRuns
from tests.slurm.dag import parse_dry_run

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


def argument_list(shell: str | None) -> list | None:
    """A job's command as the shell splits it into words (operators such as `;`, `|` and `>` words of their
    own), each word that is a JSON object or array parsed: what the command receives."""
    if shell is None:
        return None
    lexer = shlex.shlex(shell, posix=True, punctuation_chars=True)
    lexer.whitespace_split = True
    words = []
    for word in lexer:
        try:
            value = json.loads(word) if word[:1] in "{[" else word
        except json.JSONDecodeError:
            value = word
        words.append(value)
    return words


def planned(dry_runs: ShippedDryRuns, configfiles: tuple[str, ...]) -> str:
    """The jobs of one dry run, sorted: rule, threads, priority, resources and the command's argument list.
    The dry run is the session's (conftest.ShippedDryRuns: one copy of the workflow for all five, with the
    inputs the reproductions name; tests/workflow/test_all_targets.py reads the same runs)."""
    workdir = str(dry_runs.workdir)
    jobs = [{"rule": job.rule, "threads": job.threads, "priority": job.priority,
             "resources": {k: v for k, v in job.resources.items() if k != "tmpdir"},
             "args": argument_list(job.shell.replace(workdir, "<WORKDIR>") if job.shell else None)}
            for job in parse_dry_run(dry_runs.text(*configfiles))]
    jobs.sort(key=lambda job: json.dumps(job, sort_keys=True))
    return json.dumps(jobs, indent=1, sort_keys=True) + "\n"


@pytest.mark.parametrize("name", list(CONFIGS))
def test_shipped_config_plans_the_snapshot_commands(shipped_dry_runs, name):
    text = planned(shipped_dry_runs, CONFIGS[name])
    golden = SNAPSHOTS / f"plan_{name}.json"
    if UPDATE:
        SNAPSHOTS.mkdir(exist_ok=True)
        golden.write_text(text)
    assert golden.exists(), f"{golden} missing: LLMRNN_UPDATE_SNAPSHOTS=1 writes it"
    jobs, expected = json.loads(text), json.loads(golden.read_text())
    differ = sorted({job["rule"] for job in jobs if job not in expected}
                    | {job["rule"] for job in expected if job not in jobs})
    assert not differ and len(jobs) == len(expected), (
        f"{name}: the jobs of rules {differ} differ from {golden.relative_to(REPO)} ({len(jobs)} jobs planned, "
        f"{len(expected)} in the snapshot); if intended, regenerate with LLMRNN_UPDATE_SNAPSHOTS=1 and review the diff")


def test_an_argument_list_is_what_the_command_receives():
    """Two spellings of one command are one argument list; a changed argument is a changed list."""
    one = argument_list("""umask 077; exec llmrnn train run --cfg '{"a": 1, "b": [2]}'  --x 'p q' 2> >(tee {log})""")
    assert one == argument_list("""umask 077 ;  exec llmrnn train run --cfg '{"b": [2],"a": 1}' --x "p q" 2> >(tee {log})""")
    assert one[:8] == ["umask", "077", ";", "exec", "llmrnn", "train", "run", "--cfg"]
    assert one[8] == {"a": 1, "b": [2]} and one[9:11] == ["--x", "p q"]
    assert one != argument_list("""umask 077; exec llmrnn train run --cfg '{"a": 2, "b": [2]}' --x 'p q' 2> >(tee {log})""")
    assert argument_list(None) is None
