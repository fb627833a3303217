"""Trajectory parquets: verl columns and types, scatter/gather invariance, summaries, errors."""

from __future__ import annotations

import json
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from llmrnn import io, trajectories
from llmrnn.cohort import dump_cohort, synthesize_cohort
from llmrnn.errors import InputError

REPO = Path(__file__).resolve().parents[1]
PROMPTS = REPO / "config" / "prompts" / "llmrnn.yaml"


def config(model: Path, shards: int) -> dict:
    role = {"model": str(model), "backend": "transformers", "temperature": 0.7, "top_p": 0.95, "max_tokens": 8}
    return {
        "roles": {r: dict(role) for r in ("prediction", "evaluation", "memory")},
        "trajectories": {"shards": shards, "max_visits": 5, "seed": 3},
    }


@pytest.fixture(scope="module")
def split_file(tmp_path_factory) -> Path:
    path = tmp_path_factory.mktemp("split") / "val.json"
    patients = synthesize_cohort(9, seed=4)
    patients[0]["visits"] = patients[0]["visits"][:2]  # too short for a row
    io.write_text(path, dump_cohort(patients))
    return path


def dump(tmp: Path, split_file: Path, model: Path, shards: int) -> tuple[Path, dict]:
    parts, stats = [], []
    for k in range(shards):
        rows, st = trajectories.run_shard("val", split_file, k, config(model, shards), PROMPTS)
        parts.append(tmp / f"part_{k}.parquet")
        stats.append(tmp / f"part_{k}.stats.json")
        trajectories.write_parquet(parts[-1], rows)
        io.write_json(stats[-1], st)
    rows, summary = trajectories.gather("val", parts, stats, tokenizer_dir=model)
    out = tmp / "val.parquet"
    trajectories.write_parquet(out, rows)
    return out, summary


@pytest.fixture(scope="module")
def dumped(tmp_path_factory, split_file, tiny_model_dir):
    one = dump(tmp_path_factory.mktemp("k1"), split_file, tiny_model_dir, 1)
    three = dump(tmp_path_factory.mktemp("k3"), split_file, tiny_model_dir, 3)
    return one, three


def test_parquet_columns_and_types_match_design(dumped):
    (path, _), _ = dumped
    table = pq.read_table(path)
    assert tuple(table.column_names) == trajectories.PARQUET_COLUMNS
    schema = table.schema
    assert schema.field("prompt").type == pa.list_(pa.struct([("role", pa.string()), ("content", pa.string())]))
    assert schema.field("data_source").type == pa.string() and schema.field("ability").type == pa.string()
    assert schema.field("reward_model").type == pa.struct([("style", pa.string()), ("ground_truth", pa.string())])
    extra = schema.field("extra_info").type
    assert [f.name for f in extra] == list(trajectories.EXTRA_INFO_FIELDS)
    assert extra.field("visit_index").type == pa.int64() and extra.field("index").type == pa.int64()
    rows = table.to_pylist()
    for i, row in enumerate(rows):
        assert row["data_source"] == "llm_as_rnn_memory_update" and row["ability"] == "clinical_summary"
        assert row["reward_model"]["style"] == "rubric"
        assert len(row["prompt"]) == 1 and row["prompt"][0]["role"] == "user"  # llmrnn.yaml has no examples
        assert row["extra_info"]["index"] == i and row["extra_info"]["split"] == "val"
        step = json.loads(row["reward_model"]["ground_truth"])
        assert set(trajectories.TRAJECTORY_STEP_KEYS) <= set(step)
        assert step["update_prompt"] == row["prompt"][0]["content"]
        assert step["patient_id"] == row["extra_info"]["patient_id"]
        assert step["visit_index"] == row["extra_info"]["visit_index"]
        for key in ("h_prev", "h_ref"):
            assert set(json.loads(step[key])) == {"evolving_summary"}
        assert set(step["prediction"]) == {"top_5_diagnoses", "primary_diagnosis"}
        assert {"primary_correct", "any_top5_correct", "missed_diagnoses"} <= set(step["next_evaluation"])
        assert step["ground_truth_diagnoses"] and step["next_ground_truth_diagnoses"]
        assert step["next_visit"]["visit_id"] != step["visit"]["visit_id"]
        assert "discharge_diagnosis" not in step["update_prompt"].lower()


def test_one_row_per_patient_visit_in_0_to_n_minus_3(dumped, split_file):
    (path, summary), _ = dumped
    patients = json.loads(split_file.read_text())
    expected = sorted(
        (str(p["subject_id"]), t) for p in patients for t in range(min(len(p["visits"]), 5) - 2)
    )
    rows = pq.read_table(path).to_pylist()
    keys = [(r["extra_info"]["patient_id"], r["extra_info"]["visit_index"]) for r in rows]
    assert keys == sorted(expected, key=lambda k: (int(k[0]), k[1]))
    assert summary["rows"] == len(rows) and summary["patients_skipped_short"] >= 1


def test_one_and_three_shards_give_identical_rows_in_identical_order(dumped):
    (one, s1), (three, s3) = dumped
    assert pq.read_table(one).to_pylist() == pq.read_table(three).to_pylist()
    assert s1["rows"] == s3["rows"] and s1["unparsable"] == s3["unparsable"]
    assert s3["shards"] == 3


def test_summary_fields(dumped):
    (_, summary), (_, s3) = dumped
    assert summary["patients"] >= 1 and summary["rows"] >= summary["patients"]
    assert set(summary["unparsable"]) == {"prediction", "evaluation", "memory"}
    pl = summary["prompt_length"]
    assert pl["unit"].startswith("tokens") and 0 < pl["p50"] <= pl["p95"] <= pl["max"]
    assert summary["max_calls_per_role_per_step"] == 1 and s3["max_calls_per_role_per_step"] == 1


def test_shard_assignment_is_deterministic_balanced_and_complete():
    patients, _ = trajectories.eligible_patients(synthesize_cohort(30, seed=1), None)
    a = trajectories.assign_shards(patients, 4)
    b = trajectories.assign_shards(list(reversed(patients)), 4)
    ids = lambda parts: [[p["subject_id"] for p in part] for part in parts]
    assert ids(a) == ids(b)
    assert sorted(x for part in ids(a) for x in part) == sorted(p["subject_id"] for p in patients)
    loads = [sum(len(p["visits"]) for p in part) for part in a]
    assert max(loads) - min(loads) <= max(len(p["visits"]) for p in patients)
    with pytest.raises(InputError):
        trajectories.assign_shards(patients, 0)


def test_empty_split_fails_clearly(tmp_path, tiny_model_dir):
    split = tmp_path / "val.json"
    patients = synthesize_cohort(3, seed=2)
    for p in patients:
        p["visits"] = p["visits"][:2]
    io.write_text(split, dump_cohort(patients))
    rows, stats = trajectories.run_shard("val", split, 0, config(tiny_model_dir, 1), PROMPTS)
    assert rows == [] and stats["patients_skipped_short"] == 3
    trajectories.write_parquet(tmp_path / "p.parquet", rows)
    io.write_json(tmp_path / "p.json", stats)
    assert pq.read_table(tmp_path / "p.parquet").schema == trajectories.parquet_schema()
    with pytest.raises(InputError, match="0 rows"):
        trajectories.gather("val", [tmp_path / "p.parquet"], [tmp_path / "p.json"])


def test_read_parquet_rejects_other_schemas(tmp_path):
    pq.write_table(pa.table({"x": [1]}), tmp_path / "x.parquet")
    with pytest.raises(InputError, match="not a trajectory parquet"):
        trajectories.read_parquet(tmp_path / "x.parquet")


def test_every_step_is_written_as_its_model_reads_it(dumped):
    """The writer builds each step through TrajectoryStep: reading a row back through the model and writing
    it again gives the very text in the parquet, and its keys are the model's fields, in order."""
    from llmrnn.settings.trajectory_step import TrajectoryStep, read_step

    (path, _), _ = dumped
    for i, row in enumerate(pq.read_table(path).to_pylist()):
        text = row["reward_model"]["ground_truth"]
        step = read_step(text, f"row {i}")
        assert step.to_ground_truth() == text
        assert list(json.loads(text)) == list(TrajectoryStep.model_fields) == list(trajectories.TRAJECTORY_STEP_KEYS)


def test_a_step_the_model_refuses_is_not_written(tmp_path):
    """A forward-pass record with a field of the wrong type stops the shard with one line naming the patient,
    the visit and the field (not a row the reward fails on hours later)."""
    patient = {"subject_id": "7", "visits": [{"visit_id": f"7-{t}"} for t in range(3)]}

    def record(t: int) -> dict:
        return {"visit_id": f"7-{t}", "update_prompt": "p", "update_messages": [{"role": "user", "content": "p"}],
                "h_prev": '{"evolving_summary": ""}', "h_new": '{"evolving_summary": "x"}',
                "prediction": {"top_5_diagnoses": ["a"], "primary_diagnosis": "a"},
                "evaluation": {"primary_correct": True, "any_top5_correct": True, "missed_diagnoses": [],
                               "why_missed": "", "improvement_suggestions": ""},
                "ground_truth": ["a"], "prediction_ok": True, "evaluation_ok": True, "memory_ok": True}

    good = {"patient_id": "7", "visits": [record(0), record(1), record(2)]}
    assert len(trajectories.trajectory_rows("train", [patient], [good])) == 1
    bad = {"patient_id": "7", "visits": [dict(record(0), memory_ok="yes"), record(1), record(2)]}
    with pytest.raises(InputError, match=r"^trajectories train: patient 7 visit 0: "
                                         r"reward_model\.ground_truth\.parse_ok\.memory: Input should be a valid "
                                         r"boolean \(got 'yes'\)$"):
        trajectories.trajectory_rows("train", [patient], [bad])
