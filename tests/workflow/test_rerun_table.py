"""Rerun table: after one real run of `all`, each change reruns exactly the stages that
depend on it, and nothing else. Asserted by dry runs with params/code/input/mtime triggers.

Data-driven: a row names its change and the rules that must rerun. A row runs against the baseline of
its reward mode: the demo's outcome reward (no judge), or a judged one (reward.mode scalar: the judge
server, preflight and training ask the judge) for the rows about the judge, which run in
test_rerun_table_judged.py. Expected rules that the
baseline does not run (judge_server in outcome mode) are dropped from the row; a row that names a rule the
workflow does not have, or whose change needs a config key, module or rule missing from the baseline's
`all`, FAILS (a table that skips checks nothing). Every rule in the run that a row does not name must NOT
rerun. test_wrong_expectation_fails shows the check catches a wrong row.
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import sys
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path

import pytest
import yaml

from llmrnn import provenance
from tests.conftest import REPO, WORKFLOW_PARTS
from tests.rules_api import workflow_rules as recipe_rules
from tests.slurm.dag import EXTRA_PARTS, parse_dry_run, run, write_model_layer, write_small_config

pytestmark = [pytest.mark.slow, pytest.mark.e2e]
TRIGGERS = ["--rerun-triggers", "params", "code", "input", "mtime"]
# Snakemake starts every member of the judge/preflight/trainer service group at once: train_grpo then
# waits (up to --latency-wait) for preflight.json, which takes longer than the default 5 s here.
GROUP_WAIT = ["--latency-wait", "180"]
TRAINED_SIDE = {"train_grpo", "train_plots", "merge_model", "release", "eval_shard", "eval_grade", "eval_gather",
                "eval_plots", "report_overview"}
JUDGED = {"judge_server", "preflight"}
# the judge-agreement figure: from preflight.json in judged modes; in outcome mode from its own check (rule
# judge_agreement, with the judge service started for it alone)
AGREEMENT = {"judge_server", "judge_agreement", "judge_agreement_plot"}


@dataclass
class Row:
    name: str
    rerun: set[str]
    config: dict | None = None  # merged over config/config.yaml through an extra --configfile
    edit_file: Callable[[Path, dict], Path] | None = None  # edits a file of the workdir, returns it
    edit_module: str | None = None  # a module of the package whose code changes (e.g. llmrnn.reward)
    needs_rules: set[str] = field(default_factory=set)
    reward_modes: tuple[str, ...] | None = None  # the row holds only for these reward.mode values


def _edit_rubric(work: Path, cfg: dict) -> Path:
    """A real rubric change: reword the first long text of the rubric file named in the config."""
    path = work / cfg["judge"]["rubric"]
    data = yaml.safe_load(path.read_text())

    def reword(node):
        if isinstance(node, dict):
            for key, value in node.items():
                if isinstance(value, str) and len(value) > 40:
                    node[key] = value + "\nBe strict."
                    return True
                if reword(value):
                    return True
        elif isinstance(node, list):
            return any(reword(v) for v in node)
        return False

    assert reword(data), f"no rubric text to change in {path}"
    path.write_text(yaml.safe_dump(data, sort_keys=False))
    return path


ROWS = [
    Row("split seed", config={"split": {"seed": 4242}},
        rerun={"split_cohort", "trajectory_shard", "dump_trajectories"} | JUDGED | TRAINED_SIDE | AGREEMENT),
    Row("rubric change", edit_file=_edit_rubric, needs_rules={"judge_server"},
        rerun=JUDGED | TRAINED_SIDE | {"judge_agreement_plot"}, reward_modes=("scalar", "pairwise")),
    # reward.mode outcome (the embedded default) trains with no judge and its card names none: only the
    # judge-agreement check (and its figure) reruns
    Row("rubric change, outcome reward", edit_file=_edit_rubric, rerun=AGREEMENT, reward_modes=("outcome",)),
    Row("training knob", config={"train": {"lr": 2.5e-6}}, needs_rules={"train_grpo"},
        rerun=JUDGED | TRAINED_SIDE | {"judge_agreement_plot"}, reward_modes=("scalar", "pairwise")),
    Row("training knob, outcome reward", config={"train": {"lr": 2.5e-6}}, needs_rules={"train_grpo"},
        rerun={"preflight"} | TRAINED_SIDE, reward_modes=("outcome",)),
    Row("eval knob", config={"eval": {"stats": {"bootstrap": {"samples": 1999}}}},
        rerun={"eval_gather", "eval_plots", "report_overview"}),
    Row("release knob", config={"release": {"private": False}}, needs_rules={"release"}, rerun={"release"}),
    Row("reward code", edit_module="llmrnn.reward", needs_rules={"preflight"},
        rerun=JUDGED | TRAINED_SIDE | AGREEMENT),
]


def _env(**extra: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("LLMRNN_")}
    env.update(PATH=f"{Path(sys.executable).parent}{os.pathsep}{os.environ['PATH']}", OMP_NUM_THREADS="1",
               HF_HUB_OFFLINE="1", TOKENIZERS_PARALLELISM="false")
    env.update(extra)
    return env


def _snakemake(work: Path, env: dict[str, str], *args: str, timeout: float = 600) -> str:
    proc = run([str(Path(sys.executable).parent / "snakemake"), *GROUP_WAIT, "--cores", "2", *args],
               cwd=work, env=env, timeout=timeout)
    assert proc.returncode == 0, f"snakemake {' '.join(args)}:\n{proc.stdout[-5000:]}\n{proc.stderr[-5000:]}"
    return proc.stdout + proc.stderr


def _rules_to_run(text: str) -> set[str]:
    return {job.rule for job in parse_dry_run(text) if job.shell is not None}


# The judged baseline: the demo's rubric (SmolLM2-135M judging on CPU) scores preflight's rows and every
# rollout. It barely ranks memories, so its preflight warns instead of failing and no fallback rate stops
# training: this run is about what reruns, not about learning.
JUDGED_BASELINE = {"reward": {"mode": "scalar"}, "preflight": {"on_problem": "warn", "max_fallback_rate": 1.0}}


@dataclass
class Baseline:
    work: Path
    ran: set[str]  # rules the real run executed
    config: dict
    src: Path  # the package snapshot every snakemake call imports (PYTHONPATH)
    configfiles: list[str]  # the layers of the baseline config
    mode: str = "outcome"  # its reward.mode
    unchanged: str | None = None  # the output of `all -n -p` with every trigger, right after the run
    observed: dict[str, set[str]] = field(default_factory=dict)  # row name -> the rules its dry run reruns


def make_baseline(tmp_path_factory, mode: str, model: Path | None = None) -> Baseline:
    """One real run of `all` (small config; reward.mode `mode`; `model`, when given, a local HF folder that
    stands in for every role's SmolLM2, judge included). LLMRNN_RERUN_BASELINE (outcome) or
    LLMRNN_RERUN_BASELINE_JUDGED = <dir of an earlier baseline> reuses it (for wiring new rows without a
    half-hour run; the dir is printed in the test's -s output)."""
    reuse = os.environ.get("LLMRNN_RERUN_BASELINE" + ("" if mode == "outcome" else "_JUDGED"))
    if reuse and (Path(reuse) / "ran.json").is_file():
        work = Path(reuse)
        meta = json.loads((work / "ran.json").read_text())
        default = yaml.safe_load((work / "config" / "config.yaml").read_text())
        return Baseline(work, set(meta["ran"]), default, work / ".pkg" / "src", meta["configfiles"], mode)
    work = tmp_path_factory.mktemp(f"rerun-{mode}")
    for part in dict.fromkeys(WORKFLOW_PARTS + EXTRA_PARTS):
        src = REPO / part
        if src.is_dir():
            shutil.copytree(src, work / part)
        elif src.exists():
            shutil.copy2(src, work / part)
    # the package as of now, for every run here (its code hashes must not move under the table)
    snapshot = work / ".pkg" / "src"
    shutil.copytree(REPO / "src", snapshot, ignore=shutil.ignore_patterns("__pycache__", "*.egg-info"))
    env = _env(PYTHONPATH=str(snapshot))
    default = yaml.safe_load((work / "config" / "config.yaml").read_text())
    files = ["config/config.yaml", write_small_config(work)]
    if mode != "outcome":
        (work / "judged.yaml").write_text(yaml.safe_dump({**JUDGED_BASELINE, "reward": {"mode": mode}}))
        files.append("judged.yaml")
    if model is not None:
        files.append(write_model_layer(work, model))
    ran = _rules_to_run(_snakemake(work, env, "-n", "-p", "all", "--configfile", *files))
    _snakemake(work, env, "all", "--configfile", *files, timeout=3000)
    left = _snakemake(work, env, "-n", "-p", "all", *TRIGGERS, "--configfile", *files)
    assert "Nothing to be done" in left, f"a fresh run is not up to date:\n{left[-3000:]}"
    (work / "ran.json").write_text(json.dumps({"ran": sorted(ran), "configfiles": files}))
    print(f"rerun table baseline ({mode}): {work}")
    return Baseline(work, ran, default, snapshot, files, mode, unchanged=left)


@pytest.fixture(scope="module")
def baseline(tmp_path_factory, tiny_model_dir) -> Baseline:
    """The demo's own reward (outcome: no judge), on the tiny model: a row asserts which rules rerun, which
    is the DAG's and the provenance's, not the model's (SmolLM2's 135M parameters in float32 made this run
    the e2e tier's longest item; the judged baseline keeps SmolLM2 as its judge)."""
    return make_baseline(tmp_path_factory, "outcome", model=tiny_model_dir)



def _has_path(cfg: dict, override: dict) -> str | None:
    """The first key of override missing from the config, or None (new keys would fail the schema)."""
    for key, value in override.items():
        if key not in cfg:
            return key
        if isinstance(value, dict):
            if not isinstance(cfg[key], dict):
                return key
            missing = _has_path(cfg[key], value)
            if missing:
                return f"{key}.{missing}"
    return None


@contextlib.contextmanager
def _applied(row: Row, base: Baseline, tmp: Path) -> Iterator[tuple[list[str], dict[str, str]]]:
    args: list[str] = []
    env = _env(PYTHONPATH=str(base.src))
    if row.config is not None:
        override = tmp / "override.yaml"
        override.write_text(yaml.safe_dump(row.config))
        args += [str(override)]
    if row.edit_module is not None:
        src = tmp / "src"
        shutil.copytree(base.src, src)
        module = provenance.module_path(row.edit_module, src / "llmrnn")  # a module or a package's __init__
        module.write_text(module.read_text() + "\n_RERUN_TABLE_EDIT = 1\n")  # code: a comment reruns nothing
        env["PYTHONPATH"] = str(src)
    # file edits touch only config/ (rubrics, prompts): snapshot it and restore content and mtimes
    saved = [(p, p.read_bytes(), p.stat()) for p in (base.work / "config").rglob("*") if p.is_file()]
    try:
        if row.edit_file is not None:
            edited = row.edit_file(base.work, base.config)
            assert base.work / "config" in edited.parents, edited
        yield args, env
    finally:
        for path, data, st in saved:
            if path.read_bytes() != data:
                path.write_bytes(data)
            os.utime(path, ns=(st.st_atime_ns, st.st_mtime_ns))


def observed_reruns(row: Row, base: Baseline, tmp: Path) -> set[str]:
    """The rules a dry run reruns after the row's change; one dry run per row and baseline (the meta-test
    reads the split-seed row's)."""
    if row.name not in base.observed:
        with _applied(row, base, tmp) as (args, env):
            base.observed[row.name] = _rules_to_run(_snakemake(base.work, env, "-n", "-p", "all", *TRIGGERS,
                                                               "--configfile", *base.configfiles, *args))
    return set(base.observed[row.name])


def check_row(row: Row, base: Baseline, observed: set[str]) -> None:
    expected = row.rerun & base.ran
    unexpected = observed - expected
    missing = expected - observed
    assert not unexpected and not missing, (
        f"{row.name}: rules that rerun but should not: {sorted(unexpected)}; "
        f"rules that should rerun but do not: {sorted(missing)}"
    )


def workflow_rules() -> set[str]:
    """Every rule name of the workflow under each recipe, as Snakemake names them (tests.rules_api)."""
    return set(recipe_rules())


def row_problem(row: Row, base: Baseline) -> str | None:
    """Why the row cannot check anything on this baseline (a failure, not a skip), or None."""
    unknown = (row.rerun | row.needs_rules) - workflow_rules()
    if unknown:
        return f"names rules the workflow does not have: {sorted(unknown)}"
    if row.rerun and not row.rerun & base.ran:  # an empty row says "nothing reruns": it always holds
        return f"none of {sorted(row.rerun)} is in the workflow's `all`"
    if row.needs_rules - base.ran:
        return f"stage not in the workflow's `all`: {sorted(row.needs_rules - base.ran)}"
    if row.config is not None and (missing := _has_path(base.config, row.config)):
        return f"config key {missing} not in config/config.yaml"
    if row.edit_file is not None and not base.config.get("judge", {}).get("rubric"):
        return "no judge.rubric in the config"
    if row.edit_module is not None and provenance.module_path(row.edit_module, base.src / "llmrnn") is None:
        return f"module {row.edit_module} does not exist"
    return None


def is_judged_only(row: Row) -> bool:
    """A row that holds for judged reward modes only: it runs against the judged baseline, in
    tests/workflow/test_rerun_table_judged.py (its own file, so pytest-xdist's loadfile runs the two baselines
    on two workers at once)."""
    return row.reward_modes is not None and "outcome" not in row.reward_modes


OUTCOME_ROWS = [row for row in ROWS if not is_judged_only(row)]


@pytest.mark.parametrize("row", OUTCOME_ROWS, ids=[r.name for r in OUTCOME_ROWS])
def test_rerun_table(row: Row, baseline: Baseline, tmp_path):
    problem = row_problem(row, baseline)
    assert problem is None, f"row {row.name!r}: {problem}"
    check_row(row, baseline, observed_reruns(row, baseline, tmp_path))


def test_a_row_that_checks_nothing_fails(baseline: Baseline):
    """A row whose rule is missing from `all` (or from the workflow) is a failure, not a skip."""
    assert row_problem(Row("ghost", rerun={"no_such_rule"}), baseline) == (
        "names rules the workflow does not have: ['no_such_rule']")
    assert row_problem(Row("qa", rerun={"qa_sft"}), baseline) == "none of ['qa_sft'] is in the workflow's `all`"
    assert "does not exist" in row_problem(Row("m", rerun={"preflight"}, edit_module="llmrnn.nope"), baseline)


def test_nothing_reruns_without_a_change(baseline: Baseline):
    """The dry run right after the baseline's run (make_baseline), or a new one on a reused baseline."""
    text = baseline.unchanged
    if text is None:
        text = _snakemake(baseline.work, _env(PYTHONPATH=str(baseline.src)), "-n", "-p", "all", *TRIGGERS,
                          "--configfile", *baseline.configfiles)
    assert _rules_to_run(text) == set()


def test_wrong_expectation_fails(baseline: Baseline, tmp_path):
    """Meta-test: the table's check is not vacuous. A split-seed change claimed to rerun only
    split_cohort (it reruns everything downstream) must fail, and so must a claim of an extra rule."""
    row = ROWS[0]
    observed = observed_reruns(row, baseline, tmp_path)
    assert "split_cohort" in observed and len(observed) > 1, observed
    with pytest.raises(AssertionError, match="should not"):
        check_row(Row("wrong: only splits", rerun={"split_cohort"}), baseline, observed)
    with pytest.raises(AssertionError, match="should rerun but do not"):
        check_row(Row("wrong: cohort too", rerun=row.rerun | {"clean_cohort"}), baseline, observed)
