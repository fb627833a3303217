"""The rerun table's rows that hold for judged reward modes only (the judge server runs, preflight and training
ask it), against their own baseline run. A file of its own so that pytest-xdist (--dist loadfile) runs this
baseline and the outcome one (tests/workflow/test_rerun_table.py) on two workers at once; the rows, the check
and its meta-tests live there."""

from __future__ import annotations

import pytest

from tests.workflow.test_rerun_table import (
    ROWS,
    Baseline,
    Row,
    check_row,
    is_judged_only,
    make_baseline,
    observed_reruns,
    row_problem,
)

# a second whole `all` baseline (judged), in a file of its own so that it runs beside the outcome table
pytestmark = [pytest.mark.slow, pytest.mark.e2e]
JUDGED_ROWS = [row for row in ROWS if is_judged_only(row)]


@pytest.fixture(scope="module")
def judged_baseline(tmp_path_factory) -> Baseline:
    """A judged reward: the judge server runs, preflight and training ask it."""
    base = make_baseline(tmp_path_factory, "scalar")
    assert {"judge_server", "preflight", "train_grpo"} <= base.ran, base.ran
    return base


def test_the_table_has_judged_rows():
    assert JUDGED_ROWS, "no row of the table holds for judged modes only: the judged baseline checks nothing"


@pytest.mark.parametrize("row", JUDGED_ROWS, ids=[r.name for r in JUDGED_ROWS])
def test_rerun_table_judged(row: Row, judged_baseline: Baseline, tmp_path):
    problem = row_problem(row, judged_baseline)
    assert problem is None, f"row {row.name!r}: {problem}"
    check_row(row, judged_baseline, observed_reruns(row, judged_baseline, tmp_path))
