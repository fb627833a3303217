"""`llmrnn reward try` and the trajectory step's docs: docs/rewards.md's three lines run for real on a parquet
written by llmrnn.trajectories, in a run folder whose config.yaml llmrnn.runconfig wrote; bad input is one line."""

from __future__ import annotations

import json
import re
import shlex
from pathlib import Path

import pytest

from llmrnn import cli, trajectories
from llmrnn.reward import compute_score
from llmrnn.runconfig import read_layer, resolve, write_run_config
from llmrnn.settings import render
from llmrnn.settings.trajectory_step import TrajectoryStep, read_step

REPO = Path(__file__).resolve().parents[1]
DOCS = (REPO / "docs" / "rewards.md").read_text()
NEXT = ["heart failure", "chronic kidney disease"]
# each patient's reference memory names all, one or none of the next visit's diagnoses
MEMORIES = {"1": "heart failure and chronic kidney disease", "2": "heart failure", "3": "gout"}


def tried_lines() -> list[str]:
    """The shell block of docs/rewards.md marked as tried here."""
    block = DOCS.split("<!-- tried: tests/test_reward_try.py -->\n```bash\n", 1)[1].split("```", 1)[0]
    return [line for line in block.splitlines() if line.strip()]


def my_reward_text() -> str:
    """docs/rewards.md's complete own reward (the python block after its `my_reward.py` line)."""
    return DOCS.split("(`my_reward.py`)", 1)[1].split("```python\n", 1)[1].split("```", 1)[0]


def forward_records(pid: str) -> dict:
    """A forward pass's records of one patient with three visits, as llmrnn.rnn leaves them."""
    def record(t: int, truth: list[str]) -> dict:
        return {"visit_id": f"{pid}{t}", "update_prompt": f"update {pid} {t}",
                "update_messages": [{"role": "user", "content": f"update {pid} {t}"}],
                "h_prev": json.dumps({"evolving_summary": ""}),
                "h_new": json.dumps({"evolving_summary": MEMORIES[pid]}),
                "prediction": {"top_5_diagnoses": ["copd"], "primary_diagnosis": "copd"},
                "evaluation": {"primary_correct": False, "any_top5_correct": False, "missed_diagnoses": truth,
                               "why_missed": "", "improvement_suggestions": ""},
                "ground_truth": truth, "prediction_ok": True, "evaluation_ok": True, "memory_ok": True}

    return {"patient_id": pid, "visits": [record(0, ["pneumonia"]), record(1, NEXT), record(2, ["gout"])]}


@pytest.fixture
def run_folder(tmp_path, monkeypatch) -> Path:
    """results/demo as a run leaves it: config.yaml (config/config.yaml's, written by runconfig) and the train
    parquet (written by trajectories), plus docs/rewards.md's my_reward.py in the working directory."""
    patients = [{"subject_id": pid, "visits": [{"visit_id": f"{pid}{t}"} for t in range(3)]} for pid in MEMORIES]
    rows = trajectories.trajectory_rows("train", patients, [forward_records(pid) for pid in MEMORIES])
    for i, row in enumerate(rows):
        row["extra_info"]["index"] = i
    run = tmp_path / "results" / "demo"
    trajectories.write_parquet(run / "trajectories" / "train.parquet", rows)
    layers = [read_layer(REPO / "config" / "config.yaml")]
    write_run_config(run / "config.yaml", resolve(layers)[0], layers)
    (tmp_path / "config").mkdir()  # the workflow folder a user runs in: --parquet alone reads its config.yaml
    (tmp_path / "config" / "config.yaml").write_text((REPO / "config" / "config.yaml").read_text())
    (tmp_path / "config" / "own_reward").mkdir()  # where the repository ships it (docs/rewards.md)
    (tmp_path / "config" / "own_reward" / "my_reward.py").write_text(my_reward_text())
    monkeypatch.chdir(tmp_path)
    return run


def run_cli(line: str, capsys) -> tuple[int, list[str], str]:
    argv = shlex.split(line)
    assert argv[0] == "llmrnn"
    rc = cli.main(argv[1:])
    out, err = capsys.readouterr()
    return rc, out.splitlines(), err


def column(lines: list[str], name: str) -> list[str]:
    header = lines[0].split()
    return [line.split()[header.index(name)] for line in lines[1:]]


def test_the_docs_three_lines_score_real_rows(run_folder, capsys):
    configured, own, previous = tried_lines()
    rc, lines, err = run_cli(configured, capsys)
    assert rc == 0, err
    assert lines[0].split()[:5] == ["row", "patient_id", "visit_index", "score", "judge_score"]
    assert column(lines, "patient_id") == ["1", "2", "3"] and column(lines, "parse_method") == ["outcome"] * 3
    # the demo's outcome reward: the share of the next visit's diagnoses the reference memory names
    assert column(lines, "score") == ["1.0000", "0.5000", "0.0000"]
    rc, lines, err = run_cli(own, capsys)
    assert rc == 0, err
    assert lines[0].split() == ["row", "patient_id", "visit_index", "score"]
    assert column(lines, "score") == ["1.0000", "0.5000", "0.0000"]  # the docs' reward reads the same step
    rc, lines, err = run_cli(previous, capsys)
    assert rc == 0, err
    assert column(lines, "score") == ["0.0000"] * 3  # the empty previous memories name nothing


def test_the_scores_are_the_rewards_own(run_folder, capsys):
    """The table prints what verl's entry returns for the same rows (one row, its diagnostics too)."""
    rows = trajectories.read_parquet(run_folder / "trajectories" / "train.parquet")
    want = compute_score(rows[1]["data_source"], read_step(rows[1]["reward_model"]["ground_truth"], "row 1").h_ref,
                         rows[1]["reward_model"]["ground_truth"], rows[1]["extra_info"],
                         audit_dir=str(run_folder / "audit"), reward_cfg={"mode": "outcome"})
    rc, lines, _ = run_cli(f"llmrnn reward try --parquet {run_folder}/trajectories/train.parquet --rows 2", capsys)
    assert rc == 0 and len(lines) == 3
    assert column(lines, "outcome")[1] == f"{want['outcome']:.4f}" and column(lines, "judge_calls")[1] == "0"


def test_bad_input_is_one_line(run_folder, tmp_path, capsys):
    rc, lines, err = run_cli("llmrnn reward try --parquet nowhere.parquet", capsys)
    assert (rc, lines, err) == (2, [], "llmrnn reward: error: nowhere.parquet: trajectory parquet not found\n")
    rows = trajectories.read_parquet(run_folder / "trajectories" / "train.parquet")
    step = json.loads(rows[1]["reward_model"]["ground_truth"])
    del step["next_ground_truth_diagnoses"]
    rows[1]["reward_model"]["ground_truth"] = json.dumps(step)
    trajectories.write_parquet(tmp_path / "bad.parquet", rows)
    rc, lines, err = run_cli("llmrnn reward try --parquet bad.parquet --rows 3", capsys)
    assert (rc, lines) == (2, []) and err == (
        "llmrnn reward: error: bad.parquet: row 1: reward_model.ground_truth.next_ground_truth_diagnoses: "
        "Field required\n")
    rc, lines, err = run_cli("llmrnn reward try --parquet bad.parquet --rows 1", capsys)
    assert rc == 0 and len(lines) == 2  # only the rows asked for are read
    rc, lines, err = run_cli("llmrnn reward try --run results/demo --configfile config.yaml", capsys)
    assert rc == 2 and err == "llmrnn reward: error: reward try: give --run or --configfile, not both\n"


def test_a_judged_mode_asks_for_the_judges_endpoint(run_folder, capsys):
    (run_folder.parent / "scalar.yaml").write_text("run_name: scalar\nreward: {mode: scalar}\n")
    rc, lines, err = run_cli("llmrnn reward try --parquet results/demo/trajectories/train.parquet "
                             "--configfile results/scalar.yaml", capsys)
    assert rc == 2 and lines == [] and err.count("\n") == 1
    assert "reward.mode scalar asks the judge but no judge endpoint was given: pass --endpoint" in err


def test_the_docs_step_and_table_are_the_models():
    """The printed row is a step the model reads; the field table is the one the model generates; every
    field's example is a value of its type (an example of another type would fail here)."""
    row = re.search(r"printed with\n`[^`]+`:\n\n```json\n(.*?)\n```", DOCS, re.DOTALL).group(1)
    step = read_step(row, "docs/rewards.md")
    assert list(json.loads(row)) == list(TrajectoryStep.model_fields) and step.visit_index == 0
    assert render.step_table() in DOCS
    assert render.render_docs(DOCS, {"trajectory_step": render.step_table()}) == DOCS
    example = {}
    for name, info in TrajectoryStep.model_fields.items():
        nested = info.annotation if isinstance(info.annotation, type) and hasattr(info.annotation, "model_fields") else None
        example[name] = ({k: f.examples[0] for k, f in nested.model_fields.items()} if nested else info.examples[0])
    assert TrajectoryStep.model_validate(example).to_ground_truth() == json.dumps(example, ensure_ascii=False)


def _deep_json(n: int) -> str:
    return "[" * n + "]" * n


@pytest.mark.parametrize(("field", "value", "expected"), [
    ("extra_info", None, "row 1: extra_info: expected a mapping (split, index, patient_id, visit_index), got null"),
    ("reward_model", None, "row 1: reward_model: expected a mapping with ground_truth (the step's JSON), got null"),
    ("ground_truth", _deep_json(20_000), "row 1: reward_model.ground_truth: nested too deeply to read"),
])
def test_a_hostile_row_is_one_line_naming_the_row_and_field(run_folder, tmp_path, capsys, field, value, expected):
    """A row 20,000 levels deep, or with a null where a mapping belongs: one line naming the row and the field,
    never a traceback (RecursionError, TypeError before)."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    rows = trajectories.read_parquet(run_folder / "trajectories" / "train.parquet")
    if field == "ground_truth":
        rows[1]["reward_model"]["ground_truth"] = value
    else:
        rows[1][field] = value
    pq.write_table(pa.Table.from_pylist(rows), tmp_path / "hostile.parquet")
    rc, lines, err = run_cli("llmrnn reward try --parquet hostile.parquet --custom my_reward.py --rows 3", capsys)
    assert (rc, lines) == (2, []) and err == f"llmrnn reward: error: hostile.parquet: {expected}\n", err


def test_only_the_columns_and_rows_scored_are_read(tmp_path):
    """`--rows 1` on a parquet whose rows carry 2 MB prompts (a column scoring never reads): the read's peak
    memory stays far below the 80 MB of prompts (the whole table was read before)."""
    import random
    import string
    import subprocess
    import sys

    import pyarrow as pa
    import pyarrow.parquet as pq

    from tests.verl.rows import make_rows

    rng = random.Random(0)
    rows = make_rows(40)
    for row in rows:  # incompressible text: the file is as large as the text
        row["prompt"][0]["content"] = "".join(rng.choices(string.ascii_letters, k=2_000_000))
    pq.write_table(pa.Table.from_pylist(rows), tmp_path / "large.parquet")
    # the peak of this process's own memory (VmHWM; ru_maxrss would carry pytest's, inherited over fork)
    script = ("import re, sys\nfrom pathlib import Path\nimport pyarrow.parquet\n"
              "from llmrnn.reward.trial import first_rows\n"
              "peak = lambda: int(re.search(r'VmHWM:\\s+(\\d+)', open('/proc/self/status').read()).group(1))\n"
              "before = peak()\n"
              "rows = first_rows(Path(sys.argv[1]), 1)\n"
              "print(len(rows), (peak() - before) // 1024)\n")
    done = subprocess.run([sys.executable, "-c", script, str(tmp_path / "large.parquet")], capture_output=True,
                          text=True, timeout=300, check=True)
    n, grown_mb = map(int, done.stdout.split())
    assert n == 1 and grown_mb < 40, f"reading one row grew the peak by {grown_mb} MB"


def test_a_raising_reward_names_where_it_raised_and_v_shows_the_traceback(run_folder, capsys):
    (run_folder.parent.parent / "raising.py").write_text(
        "def compute_score(data_source, solution_str, ground_truth, extra_info, **kwargs):\n"
        "    return 1 / 0\n")
    parquet = "results/demo/trajectories/train.parquet"
    rc, _, err = run_cli(f"llmrnn reward try --parquet {parquet} --custom raising.py --rows 1", capsys)
    assert rc == 2 and err.count("\n") == 1 and "Traceback" not in err
    assert err.rstrip().endswith("row 0 raised ZeroDivisionError: division by zero (raising.py:2)") or \
        err.rstrip().endswith(f"row 0 raised ZeroDivisionError: division by zero ({Path('raising.py').resolve()}:2)"), err
    import subprocess
    import sys

    # -v as a user types it, in a process of its own (pytest's log capture takes the debug lines in this one)
    done = subprocess.run([str(Path(sys.executable).parent / "llmrnn"), "-v", "reward", "try", "--parquet", parquet,
                           "--custom", "raising.py", "--rows", "1"], capture_output=True, text=True, timeout=300,
                          check=False)
    rc, err = done.returncode, done.stderr
    assert rc == 2 and "Traceback (most recent call last)" in err and 'line 2, in compute_score' in err
