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
from tests.conftest import llmrnn_in_process


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
    proc = llmrnn_in_process("qa", "data", "--source", str(src), "--cfg", json.dumps(CFG), *args)
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
    proc = llmrnn_in_process("qa", "data", "--source", str(src), "--ood", "--cfg", json.dumps(CFG), *args)
    assert proc.returncode == 0, proc.stderr
    summary = json.loads((tmp_path / "out/splits.json").read_text())
    assert summary["sizes"]["ood"] == 0 and summary["ood_filter"] is None
    assert (tmp_path / "out/ood.jsonl").read_text() == ""


# --------------------------------------------------------------------------- hostile files
def _qa_data_cli(src, out, ood=None):
    """`llmrnn qa data` on src (a regular file: the fifo cases run the command as a process of its own)."""
    paths = D.output_paths(out)
    args = [a for k, v in paths.items() for a in (f"--{k.replace('_', '-')}" if k != "ood" else "--ood-out", v)]
    extra = ["--ood", str(ood)] if ood else []
    return llmrnn_in_process("qa", "data", "--source", str(src), *extra, "--cfg", json.dumps(CFG), *args)


GOOD = json.dumps(records())
HOSTILE = {
    "latin-1 json": ("qa.json", GOOD.replace("which condition", "caf\u00e9 condition").encode("latin-1"),
                     "not UTF-8 text"),
    "latin-1 jsonl": ("qa.jsonl", "\n".join(json.dumps(r) for r in records()).replace(
        "which condition", "caf\u00e9 condition").encode("latin-1"), "line 1: byte"),
    "utf-16": ("qa.json", GOOD.encode("utf-16"), "not UTF-8 text"),
    "100k-deep json": ("qa.json", b"[" * 100_000 + b"]" * 100_000, "nested too deeply"),
    "100k-deep jsonl": ("qa.jsonl", b"[" * 100_000 + b"]" * 100_000 + b"\n", "line 1: not JSON (nested too deeply"),
    "lone surrogate": ("qa.json", GOOD.replace("which condition", "which \\ud800 condition").encode(),
                       "record 0 (id r0): q: lone surrogate"),
    "lone surrogate in an option": ("qa.json", GOOD.replace('"gout"', '"g\\udfffout"', 1).encode(),
                                    "record 0 (id r0): options[1]: lone surrogate"),
    "answer NaN": ("qa.json", GOOD.replace('"a": "A"', '"a": NaN', 1).encode(), "record 0 (id r0): a: nan is not"),
    "answer Infinity": ("qa.json", GOOD.replace('"a": "A"', '"a": Infinity', 1).encode(), "a: inf is not"),
    "nested options": ("qa.json", GOOD.replace('["anemia", "gout"', '[["anemia", "x"], "gout"', 1).encode(),
                       "options[0]: expected text or a number, got list"),
    "nested option in a mapping": ("qa.json", json.dumps(
        [r | {"choices": {"A": {"t": "anemia"}, "B": "gout"}} for r in records()]).encode(),
        "options.A: expected text or a number, got dict"),
    "nested id": ("qa.json", GOOD.replace('"qid": "r0"', '"qid": {"x": 1}', 1).encode(),
                  "record 0: qid: expected text or a number, got dict"),
    "list group": ("qa.json", GOOD.replace('"pid": "p0"', '"pid": ["p", 0]', 1).encode(),
                   "pid: expected text or a number, got list"),
    "5000-digit answer": ("qa.json", GOOD.replace('"a": "A"', '"a": ' + "7" * 5000, 1).encode(), "not JSON"),
    "5000-digit answer jsonl": ("qa.jsonl", json.dumps(records()[0]).replace('"a": "A"', '"a": ' + "7" * 5000)
                                .encode() + b"\n", "line 1: not JSON"),
    "boolean answer": ("qa.json", GOOD.replace('"a": "A"', '"a": true', 1).encode(), "a: expected text or a number"),
}


@pytest.mark.parametrize("case", sorted(HOSTILE))
def test_hostile_files_are_one_line_and_nothing_is_written(tmp_path, case):
    name, data, message = HOSTILE[case]
    src = tmp_path / name
    src.write_bytes(data)
    out = tmp_path / "out"
    proc = _qa_data_cli(src, out)
    lines = [ln for ln in proc.stderr.splitlines() if ln.strip()]
    assert proc.returncode == 2 and len(lines) == 1, proc.stderr[-3000:]
    assert message in lines[0] and str(src) in lines[0], lines
    assert not out.exists() or not list(out.iterdir())


@pytest.mark.parametrize("case", ["fifo json", "fifo jsonl", "fifo ood", "missing json", "missing jsonl"])
def test_a_qa_file_that_is_no_regular_file_is_one_line_not_a_hang(tmp_path, case):
    """The input rule (io.open_regular) for the QA file and the OOD file: a fifo nobody writes is refused as
    not a regular file, before a byte is read (it used to be "not found", or a read that never returns); a
    missing file says it does not exist. The subprocess timeout only guards against the hang."""
    import os

    kind, suffix = case.split()
    good = tmp_path / "good.json"
    good.write_text(GOOD)
    target = tmp_path / f"{'ood' if suffix == 'ood' else 'qa'}.{'json' if suffix == 'ood' else suffix}"
    if kind == "fifo":
        os.mkfifo(target)
    src, ood = (good, target) if suffix == "ood" else (target, None)
    out = tmp_path / "out"
    paths = D.output_paths(out)
    args = [a for k, v in paths.items() for a in (f"--{k.replace('_', '-')}" if k != "ood" else "--ood-out", v)]
    proc = subprocess.run([sys.executable, "-m", "llmrnn.cli", "qa", "data", "--source", str(src),
                           *(["--ood", str(ood)] if ood else []), "--cfg", json.dumps(CFG), *args],
                          check=False, capture_output=True, text=True, timeout=60)
    lines = [ln for ln in proc.stderr.splitlines() if ln.strip()]
    assert proc.returncode == 2 and len(lines) == 1, proc.stderr[-3000:]
    why = "not a regular file (a fifo, socket or device); give the QA file as a file" if kind == "fifo" \
        else "QA file does not exist"
    assert f"{target}: {why}" in lines[0], lines
    assert not out.exists() or not list(out.iterdir())


def test_a_bad_ood_file_leaves_no_split_behind(tmp_path):
    src, ood = tmp_path / "qa.json", tmp_path / "ood.json"
    src.write_text(GOOD)
    ood.write_bytes(GOOD.replace("which condition", "caf\u00e9 x").encode("latin-1"))
    out = tmp_path / "out"
    proc = _qa_data_cli(src, out, ood)
    assert proc.returncode == 2 and "ood.json: byte" in proc.stderr and "Traceback" not in proc.stderr
    assert not out.exists() or not list(out.iterdir())


@pytest.mark.parametrize("suffix", [".json", ".jsonl"])
def test_one_reader_policy_a_bom_is_accepted_by_qa_and_cohort_alike(tmp_path, suffix):
    from llmrnn.cohort import dump_cohort, load_cohort, synthesize_cohort

    text = GOOD if suffix == ".json" else "".join(json.dumps(r) + "\n" for r in records())
    src = tmp_path / f"qa{suffix}"
    src.write_bytes(b"\xef\xbb\xbf" + text.encode())
    assert [r["id"] for r in D.load_records(str(src), FIELDS)] == [r["qid"] for r in records()]
    cohort = tmp_path / "cohort.json"
    patients = synthesize_cohort(4, 1)
    cohort.write_bytes(b"\xef\xbb\xbf" + dump_cohort(patients).encode())
    assert load_cohort(cohort) == patients
    # ... and both refuse the same non-UTF-8 bytes with the same words
    src.write_bytes(text.replace("Question", "Qu\u00e9stion").encode("latin-1"))
    cohort.write_bytes(dump_cohort(patients).replace("a", "\u00e4", 1).encode("latin-1"))
    for load in (lambda: D.load_records(str(src), FIELDS), lambda: load_cohort(cohort)):
        with pytest.raises(InputError, match=r"byte \d+: not UTF-8 text \(invalid continuation byte\)"):
            load()


def _tiny_tmpfs(path, size_kb: int) -> bool:
    """A real full disk: a tmpfs of size_kb (root only, where mounting is allowed)."""
    path.mkdir()
    return subprocess.run(["mount", "-t", "tmpfs", "-o", f"size={size_kb}k", "tmpfs", str(path)],
                          capture_output=True, check=False).returncode == 0


def test_a_full_disk_is_one_line_and_leaves_none_of_the_outputs(tmp_path):
    """Disk full half-way through the nine outputs: one line, and no output (nor temp) is left behind.
    The full disk is real: a tiny tmpfs (skipped where this process may not mount one)."""
    src = tmp_path / "qa.json"
    src.write_text(json.dumps(records(200, 40)))
    free = tmp_path / "free"
    assert _qa_data_cli(src, free).returncode == 0
    sizes = sorted(f.stat().st_size for f in free.iterdir())
    disk = tmp_path / "disk"
    room_kb = sizes[-1] // 1024 + 24  # the largest output fits, all of them do not: the disk fills part-way
    assert room_kb * 1024 < sum(sizes)
    if not _tiny_tmpfs(disk, room_kb):
        pytest.skip("cannot mount a tmpfs here (needs root); test_enospc_stand_in covers the same path")
    try:
        out = disk / "out"
        proc = _qa_data_cli(src, out)
        lines = [ln for ln in proc.stderr.splitlines() if ln.strip()]
        assert proc.returncode == 2 and len(lines) == 1 and "No space left on device" in lines[0], proc.stderr
        assert list(out.iterdir()) == []
    finally:
        subprocess.run(["umount", str(disk)], check=False)


def test_enospc_stand_in_leaves_none_of_the_outputs(tmp_path, monkeypatch):
    """STAND-IN for a full disk where no tmpfs can be mounted: the sixth file write raises ENOSPC."""
    import errno
    from pathlib import Path

    real = Path.write_bytes
    calls = []

    def full(self, data):
        calls.append(self)
        if len(calls) == 6:
            raise OSError(errno.ENOSPC, "No space left on device")
        return real(self, data)

    monkeypatch.setattr(Path, "write_bytes", full)
    out = tmp_path / "out"
    with pytest.raises(InputError, match=r"out/\w+\.jsonl: cannot write \(No space left on device\)"):
        D.prepare(CFG, D.output_paths(out), _write_json(tmp_path / "qa.json", records()))
    assert len(calls) == 6 and list(out.iterdir()) == []


def _write_json(path, data) -> str:
    path.write_text(json.dumps(data))
    return str(path)


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
