"""qa evaluation: per-question outputs of a real (tiny) model in both modes, then metrics with Wilson CIs
and paired tests per pair of models, and the report files."""

from __future__ import annotations

import json

import pytest

from llmrnn import io
from llmrnn.errors import InputError
from llmrnn.qa import evaluate as E
from llmrnn.stats import wilson_ci

QUESTIONS = [
    {"id": f"q{i}", "question": f"Which condition is number {i}?", "answer": "ABCD"[i % 4],
     "options": {"A": "anemia", "B": "gout", "C": "syncope", "D": "sepsis"}, "group": f"g{i}"}
    for i in range(5)
]


def write_questions(tmp_path):
    path = tmp_path / "test.jsonl"
    path.write_text("".join(json.dumps(q) + "\n" for q in QUESTIONS))
    return path


@pytest.mark.slow
def test_evaluate_model_writes_both_modes_per_question(tmp_path, tiny_model_dir):
    out = tmp_path / "base_test.jsonl"
    cfg = {"k": 3, "temperature": 1.0, "max_new_tokens": 8, "batch_size": 2}
    head = E.evaluate_model(str(tiny_model_dir), str(write_questions(tmp_path)), str(out), "base", "test", cfg)
    rows = io.read_jsonl(out)
    assert head["questions"] == 5 and rows[0]["header"]["variant"] == "base"
    for row in rows[1:]:
        assert len(row["samples"]) == 3 and row["greedy"]["text"] is not None
        assert row["sampling_pass@k"] == any(s["correct"] for s in row["samples"])
        assert row["greedy_pass@1"] == row["greedy"]["correct"]
    # greedy is deterministic: a second run gives the same greedy answers; samples follow the seed
    E.evaluate_model(str(tiny_model_dir), str(write_questions(tmp_path)), str(tmp_path / "again.jsonl"), "base",
                     "test", cfg)
    again = io.read_jsonl(tmp_path / "again.jsonl")
    assert [r["greedy"]["text"] for r in rows[1:]] == [r["greedy"]["text"] for r in again[1:]]
    assert [r["samples"] for r in rows[1:]] == [r["samples"] for r in again[1:]]
    with pytest.raises(InputError, match="temperature > 0"):
        E.evaluate_model(str(tiny_model_dir), str(write_questions(tmp_path)), str(out), "b", "t",
                         {"temperature": 0})


def fake_rows(variant, greedy, sampled, split="test"):
    """Per-question files as evaluate_model writes them, with chosen outcomes (for the statistics)."""
    rows = [{"header": {"variant": variant, "split": split}}]
    for i, (g, s) in enumerate(zip(greedy, sampled)):
        rows.append({"id": f"q{i:03d}", "answer": "A", "greedy": {"correct": g, "extracted": "A" if g else "B"},
                     "greedy_pass@1": g, "sampling_pass@k": s, "disagrees": g != s, "samples": []})
    return rows


def test_gather_metrics_cis_and_paired_tests(tmp_path):
    n = 30
    base = ([True] * 6 + [False] * 24, [True] * 12 + [False] * 18)
    grpo = ([True] * 20 + [False] * 10, [True] * 25 + [False] * 5)
    files = []
    for name, (g, s) in (("base", base), ("grpo", grpo)):
        path = tmp_path / f"{name}.jsonl"
        path.write_text("".join(json.dumps(r) + "\n" for r in fake_rows(name, g, s)))
        files.append(str(path))
    metrics, comparison = E.gather(files, {"k": 4, "temperature": 0.8,
                                           "stats": {"bootstrap": {"samples": 500, "seed": 0}}})
    m = metrics["splits"]["test"]
    assert m["base"]["greedy_pass@1"]["value"] == pytest.approx(6 / n)
    assert m["base"]["greedy_pass@1"]["ci95"] == pytest.approx(list(wilson_ci(6, n)))
    assert m["grpo"]["sampling_pass@k"]["value"] == pytest.approx(25 / n)
    assert m["base"]["greedy_pass@1"]["mode"] == "greedy: temperature 0, n 1"
    assert m["base"]["sampling_pass@k"]["mode"] == "sampling: temperature 0.8, top_p 0.95, n 4"
    assert m["base"]["nondeterminism_proxy"]["mode"].startswith("diagnostic")
    test = comparison["splits"]["test"]["grpo_vs_base"]["greedy_pass@1"]
    assert test["mcnemar"]["only_b_correct"] == 14 and test["mcnemar"]["only_a_correct"] == 0
    assert test["mcnemar"]["p_value"] < 0.001
    assert test["bootstrap"]["diff"] == pytest.approx(14 / n) and test["bootstrap"]["ci95"][0] > 0


def test_report_files(tmp_path):
    from llmrnn.qa.report import write_report

    files = []
    for name, g in (("base", [True, False, False]), ("sft", [True, True, False]), ("grpo", [True, True, True])):
        path = tmp_path / f"{name}.jsonl"
        path.write_text("".join(json.dumps(r) + "\n" for r in fake_rows(name, g, g)))
        files.append(str(path))
    metrics, comparison = E.gather(files, {"stats": {"bootstrap": {"samples": 100, "seed": 0}}})
    (tmp_path / "m.json").write_text(json.dumps(metrics))
    (tmp_path / "c.json").write_text(json.dumps(comparison))
    plots = tmp_path / "plots"
    write_report(str(tmp_path / "m.json"), str(tmp_path / "c.json"), files, str(plots / "pass_at_k.png"),
                 str(plots / "summary.tsv"), str(plots / "questions.tsv"))
    assert (tmp_path / "plots/pass_at_k.png").read_bytes().startswith(b"\x89PNG")
    summary = (tmp_path / "plots/summary.tsv").read_text().splitlines()
    assert summary[1].startswith("test\tbase\tgreedy_pass@1\tgreedy: temperature 0, n 1\t0.3333")
    assert any(line.startswith("test\tgrpo_vs_base\tgreedy_pass@1") for line in summary)
    questions = (tmp_path / "plots/questions.tsv").read_text().splitlines()
    assert questions[0] == "split\tid\treference\tbase\tsft\tgrpo" and questions[2].endswith("x B\tok A\tok A")
    assert (tmp_path / "plots/questions.tsv").stat().st_mode & 0o777 == 0o600


def test_gather_refuses_a_file_without_header(tmp_path):
    path = tmp_path / "x.jsonl"
    path.write_text('{"id": "q1"}\n')
    with pytest.raises(InputError, match="not a qa eval file"):
        E.gather([str(path)], {})
