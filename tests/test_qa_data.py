"""The qa data stage: reading (JSON, JSONL, a `datasets` folder), the filter pipeline, seeded zero-overlap
splits with hashes, verl parquets read back by the train stage's reader, SFT rows, one-line errors."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

from llmrnn import io
from llmrnn.errors import InputError
from llmrnn.qa import data as D
from llmrnn.qa.synth import questions_from_cohort


def records(n=24, groups=12):
    return [
        {"qid": f"r{i}", "q": f"Question number {i}: which condition fits best?", "a": "ABCD"[i % 4],
         "choices": ["anemia", "gout", "syncope", f"cond {i}"], "pid": f"p{i % groups}"}
        for i in range(n)
    ]


FIELDS = {"id": "qid", "question": "q", "answer": "a", "options": "choices", "group": "pid"}
CFG = {"fields": FIELDS, "split": {"val_size": 2, "test_size": 3, "seed": 7}}


def test_filter_pipeline_counts_each_reason():
    recs = [D.normalise_record(r, {**D.FIELD_DEFAULTS, **FIELDS}, "x") for r in records(6)]
    recs[1]["question"] = "short"                      # too short
    recs[2]["answer"] = "x" * 300                      # too long
    recs[3]["question"] = recs[0]["question"].upper()  # duplicate after normalisation (same options)
    recs[3]["options"] = dict(recs[0]["options"])
    recs[4]["answer"] = "E"                            # not one of the options
    kept, counts = D.filter_records(recs)
    assert counts == {"input": 6, "too_short": 1, "too_long": 1, "duplicate": 1, "unparseable_answer": 1,
                      "kept": 2}
    assert [r["id"] for r in kept] == ["r0", "r5"]
    _, no_dedupe = D.filter_records(recs, {"dedupe": False})
    assert no_dedupe["duplicate"] == 0 and no_dedupe["kept"] == 3


def test_splits_are_seeded_grouped_and_disjoint():
    recs, _ = D.filter_records(D.load_records_from(records(), FIELDS))
    a = D.split_records(recs, 2, 3, seed=7)
    b = D.split_records(recs, 2, 3, seed=7)
    c = D.split_records(recs, 2, 3, seed=8)
    assert a == b and a != c
    groups = {name: {r["group"] for r in part} for name, part in a.items()}
    assert len(groups["val"]) == 2 and len(groups["test"]) == 3 and len(groups["train"]) == 7
    assert not (groups["train"] & groups["val"]) and not (groups["train"] & groups["test"])
    assert sum(len(p) for p in a.values()) == len(recs)
    with pytest.raises(InputError, match="leave train groups"):
        D.split_records(recs, 6, 6, seed=7)


def test_prepare_writes_parquets_sft_and_hashes(tmp_path):
    from llmrnn.train.data import read_trajectory_parquet as read_rows

    src = tmp_path / "qa.jsonl"
    src.write_text("".join(json.dumps(r) + "\n" for r in records()))
    ood = tmp_path / "ood.json"
    ood.write_text(json.dumps(records(3) + [{"qid": "o1", "q": "A different question about gout?", "a": "B",
                                             "choices": ["x", "gout"], "pid": "z"}]))
    out = tmp_path / "out"
    summary = D.prepare(CFG, D.output_paths(out), str(src), str(ood))
    assert summary["sizes"] == {"train": 14, "val": 4, "test": 6, "ood": 1}  # OOD repeats of train dropped
    for name in ("train", "val", "test", "ood"):
        assert summary["sha256"][name] == io.sha256_file(out / f"{name}.jsonl")
    rows = read_rows(out / "train.parquet")  # the train stage's own reader (verl RLHFDataset layout)
    assert len(rows) == 14 and rows[0]["data_source"] == "llmrnn_qa"
    gt = json.loads(rows[0]["reward_model"]["ground_truth"])
    assert gt["answer"] in "ABCD" and set(gt["options"]) == {"A", "B", "C", "D"}
    assert "Options:\nA) anemia" in rows[0]["prompt"][1]["content"]
    sft = [json.loads(line) for line in (out / "sft_train.jsonl").read_text().splitlines()]
    assert len(sft) == 14 and sft[0]["messages"][-1]["role"] == "assistant"
    assert sft[0]["messages"][-1]["content"].endswith(f"<answer>\n{gt['answer']}\n</answer>")


def test_datasets_folder_source(tmp_path):
    from datasets import Dataset

    folder = tmp_path / "ds"
    Dataset.from_list(records()).save_to_disk(str(folder))
    recs = D.load_records(f"hf:{folder}", FIELDS)
    assert len(recs) == 24 and recs[0]["options"]["D"] == "cond 0"


BAD = [
    ('[{"qid": 1, "a": "B"}]', "record 0 (id 1): q: missing"),
    ('[{"qid": 1, "q": "what is it?", "a": "B", "choices": 5}]', "record 0 (id 1): options: expected"),
    (('[{"qid": 1, "q": "what is it?", "a": "B", "choices": ["x", "y"]}, '
      '{"qid": 1, "q": "what else?", "a": "A", "choices": ["x", "y"]}]'), "id 1: appears more than once"),
    ('{"qid": 1}', "expected a JSON list"),
    ("[{oops", "not JSON"),
]


@pytest.mark.parametrize(("text", "message"), BAD)
def test_bad_records_are_one_line_and_nothing_is_written(tmp_path, text, message):
    src = tmp_path / "bad.json"
    src.write_text(text)
    out = tmp_path / "out"
    paths = D.output_paths(out)
    args = [a for k, v in paths.items() for a in (f"--{k.replace('_', '-')}" if k != "ood" else "--ood-out", v)]
    proc = subprocess.run([sys.executable, "-m", "llmrnn.cli", "qa", "data", "--source", str(src),
                           "--cfg", json.dumps(CFG), *args], check=False, capture_output=True, text=True)
    assert proc.returncode == 2
    lines = [ln for ln in proc.stderr.splitlines() if ln.strip()]
    assert len(lines) == 1 and message in lines[0] and str(src) in lines[0], proc.stderr
    assert not out.exists()


def test_jsonl_error_names_the_line(tmp_path):
    src = tmp_path / "bad.jsonl"
    src.write_text('{"qid": 1, "q": "what is it?", "a": "B"}\n{nope\n')
    with pytest.raises(InputError, match=r"bad.jsonl: line 2: not JSON"):
        D.load_records(str(src), FIELDS)


def test_synthetic_questions_from_the_cohort():
    from llmrnn.cohort import synthesize_cohort

    ind, ood = questions_from_cohort(synthesize_cohort(12, seed=7), seed=0)
    assert ind and ood
    for rec in ind + ood:
        assert rec["answer"] in rec["options"] and len(set(rec["options"].values())) == 4
    answers = [rec["options"][rec["answer"]] for rec in ood]
    from llmrnn.cohort import ACUTE

    assert set(answers) <= set(ACUTE) and not {rec["options"][rec["answer"]] for rec in ind} & set(ACUTE)
    assert questions_from_cohort(synthesize_cohort(12, seed=7), seed=0) == (ind, ood)


def test_cli_with_an_empty_ood_writes_an_empty_ood_set(tmp_path):
    """`--ood` with no value is how the rule says "no OOD set" (qa.ood: null renders as nothing)."""
    src = tmp_path / "qa.json"
    src.write_text(json.dumps(records()))
    paths = D.output_paths(tmp_path / "out")
    args = [a for k, v in paths.items() for a in (f"--{k.replace('_', '-')}" if k != "ood" else "--ood-out", v)]
    proc = subprocess.run([sys.executable, "-m", "llmrnn.cli", "qa", "data", "--source", str(src), "--ood",
                           "--cfg", json.dumps(CFG), *args], check=False, capture_output=True, text=True)
    assert proc.returncode == 0, proc.stderr
    summary = json.loads((tmp_path / "out/splits.json").read_text())
    assert summary["sizes"]["ood"] == 0 and summary["ood_filter"] is None
    assert (tmp_path / "out/ood.jsonl").read_text() == ""


def test_dedupe_ignores_the_options():
    """The same question with other distractors (or options in another order) is a duplicate."""
    raw = records(3)
    raw[1]["q"] = "  " + raw[0]["q"].upper().replace(":", " ;") + " "
    raw[1]["choices"] = ["sepsis", "gout", "syncope", "cond 0"]  # other distractors, other order
    raw[2]["q"] = "The " + raw[0]["q"]  # an article more: the same normalised text
    kept, counts = D.filter_records(D.load_records_from(raw, FIELDS))
    assert counts["duplicate"] == 2 and [r["id"] for r in kept] == ["r0"]


def test_a_question_shared_by_groups_never_spans_two_splits():
    """With dedupe off, a question asked in two groups joins them: both land in one split."""
    raw = records(24, groups=12)
    for i in range(1, 12):  # every group asks question 0 once more (other options): one unit
        raw[i]["q"] = raw[0]["q"]
    recs, _ = D.filter_records(D.load_records_from(raw, FIELDS), {"dedupe": False})
    with pytest.raises(InputError, match="out of 1 groups"):
        D.split_records(recs, 1, 1, seed=7)
    raw = records(24, groups=12)
    raw[13]["q"] = raw[0]["q"]  # p0 and p1 share a question
    recs, _ = D.filter_records(D.load_records_from(raw, FIELDS), {"dedupe": False})
    for seed in range(20):
        splits = D.split_records(recs, 2, 3, seed)
        where = {r["group"]: name for name, part in splits.items() for r in part}
        assert where["p0"] == where["p1"]
        keys = {name: {D.question_key(r["question"]) for r in part} for name, part in splits.items()}
        assert not keys["train"] & keys["test"] and not keys["train"] & keys["val"]


def test_a_group_field_keeps_a_recording_in_one_split(tmp_path):
    raw = [{"id": f"e{i}", "question": f"ECG {i}: what rhythm is shown in lead II of this recording?",
            "answer": f"rhythm {i % 5}", "recording": f"rec{i // 4}"} for i in range(40)]
    src = tmp_path / "ecg.json"
    src.write_text(json.dumps(raw))
    cfg = {"fields": {"group": "recording"}, "split": {"val_size": 2, "test_size": 3, "seed": 1}}
    summary = D.prepare(cfg, D.output_paths(tmp_path / "out"), str(src))
    assert summary["groups"] == {"train": 5, "val": 2, "test": 3} and summary["sizes"]["test"] == 12
    where: dict[str, set] = {}
    for name in ("train", "val", "test"):
        for rec in io.read_jsonl(tmp_path / f"out/{name}.jsonl"):
            where.setdefault(rec["group"], set()).add(name)
    assert len(where) == 10 and all(len(s) == 1 for s in where.values())


def test_synthetic_questions_do_not_state_their_answer_and_letters_are_balanced():
    from collections import Counter

    from llmrnn.cohort import ACUTE, synthesize_cohort
    from llmrnn.qa.data import correct_option_text, states_answer

    ind, ood = questions_from_cohort(synthesize_cohort(40, seed=3), seed=1)
    assert len(ind) > 40 and len(ood) > 8
    for rec in ind + ood:
        truth = correct_option_text(rec)
        assert not states_answer(rec["question"], truth), rec
        assert rec["options"][rec["answer"]] == truth
    for part in (ind, ood):
        letters = Counter(r["answer"] for r in part)
        assert max(letters.values()) - min(letters.values()) <= 1, letters
    # OOD needs transfer: its answers are never an in-distribution answer, and copying a named
    # condition from an OOD question never finds the right option
    assert not {correct_option_text(r) for r in ind} & set(ACUTE)
    for rec in ood:
        named = [k for k, v in rec["options"].items() if states_answer(rec["question"], v)]
        assert rec["answer"] not in named


def test_splits_json_reports_what_needs_no_skill(tmp_path):
    from llmrnn.cohort import synthesize_cohort

    ind, ood = questions_from_cohort(synthesize_cohort(30, seed=7), seed=0)
    io.write_jsonl(tmp_path / "q.jsonl", ind)
    io.write_jsonl(tmp_path / "o.jsonl", ood)
    cfg = {"split": {"val_size": 2, "test_size": 5, "seed": 42}}
    summary = D.prepare(cfg, D.output_paths(tmp_path / "out"), str(tmp_path / "q.jsonl"), str(tmp_path / "o.jsonl"))
    checks = summary["checks"]
    assert checks["states_correct_option"] == {"train": 0, "val": 0, "test": 0, "ood": 0}
    assert checks["repeats_train_question"] == {"val": 0, "test": 0, "ood": 0}
    common = checks["most_common_train_answer"]
    assert common["answer"] in "abcd" and 0 <= common["share"]["test"] <= 0.5
    assert summary["filter"]["duplicate"] > 0  # the cohort repeats questions; the dedupe drops them
    # a leaking record is counted, not hidden
    leak = {"id": "x", "question": "Which is it: gout or anemia, given gout history?", "answer": "B",
            "options": {"A": "anemia", "B": "gout"}, "group": "g"}
    assert D.data_checks({"train": [], "test": [leak]})["states_correct_option"]["test"] == 1
