"""qa evaluation: per-question outputs of a real (tiny) model in both modes, then metrics with Wilson CIs
and paired tests per pair of models, and the report files."""

from __future__ import annotations

import json

import pytest

from llmrnn import io
from llmrnn.errors import InputError
from llmrnn.qa import evaluate as E
from llmrnn.stats import wilson_ci
from tests.conftest import llmrnn_in_process

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


def sampled_rows(variant, per_question, split="test", options=True):
    """Eval rows with real samples: per_question = [(greedy letter, [sample letters])], reference always A."""
    opts = {"A": "anemia", "B": "gout", "C": "syncope", "D": "sepsis"} if options else None
    rows = [{"header": {"variant": variant, "split": split}}]
    for i, (g, samples) in enumerate(per_question):
        graded = [{"normalized": s.lower(), "extracted": s, "correct": s == "A"} for s in samples]
        rows.append({"id": f"q{i:03d}", "answer": "A", "options": opts,
                     "greedy": {"correct": g == "A", "extracted": g, "normalized": g.lower()},
                     "samples": graded, "greedy_pass@1": g == "A", "sampling_pass@k": any(s["correct"] for s in graded),
                     "disagrees": any(s != g for s in samples)})
    return rows


def write_rows(path, rows):
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return str(path)


def test_unbiased_pass_at_k_equals_the_average_over_every_k_subset():
    from itertools import combinations

    for n in range(1, 7):
        for c in range(n + 1):
            outcomes = [True] * c + [False] * (n - c)
            for k in range(1, n + 1):
                subsets = list(combinations(outcomes, k))
                brute = sum(any(s) for s in subsets) / len(subsets)
                assert E.pass_at_k(n, c, k) == pytest.approx(brute)
    assert E.pass_at_k(4, 1, 1) == 0.25 and E.pass_at_k(4, 1, 4) == 1.0
    with pytest.raises(ValueError):
        E.pass_at_k(4, 1, 5)


def test_majority_at_k_over_subsets_with_ties_split():
    answers, correct = ["a", "a", "b", "c"], [True, True, False, False]
    assert E.maj_at_k(answers, correct, 4) == 1.0
    assert E.maj_at_k(answers, correct, 1) == 0.5
    # 2 of 4: {a,a} right; {a,b},{a,c} (x2 each) ties -> 1/2; {b,c} tie of wrongs -> 0
    assert E.maj_at_k(answers, correct, 2) == pytest.approx((1 + 4 * 0.5 + 0) / 6)
    assert E.maj_at_k(["", "", "a"], [False, False, True], 3) == 1.0  # an empty answer is no vote
    assert E.maj_at_k(["b", "c"], [False, False], 2) == 0.0


def test_gather_reports_pass_and_maj_for_every_j_with_modes_and_chance(tmp_path):
    per_q = [("A", ["A", "B", "B", "B"]), ("B", ["B", "B", "C", "D"]), ("A", ["A", "A", "A", "C"]),
             ("D", ["D", "D", "D", "D"])]
    files = [write_rows(tmp_path / "base.jsonl", sampled_rows("base", per_q))]
    train = tmp_path / "train.jsonl"
    train.write_text("".join(json.dumps({"id": f"t{i}", "question": "q", "answer": a,
                                         "options": {"A": "x", "B": "y", "C": "z", "D": "w"}}) + "\n"
                             for i, a in enumerate("DDDAB")))
    metrics, _ = E.gather(files, {"k": 4, "temperature": 0.8, "stats": {"bootstrap": {"samples": 200, "seed": 0}}},
                          str(train))
    m = metrics["splits"]["test"]["base"]
    assert metrics["samples_per_question"] == {"test": 4}
    # per question c = 1, 0, 3, 0 of n = 4
    assert m["sampling_pass@1"]["value"] == pytest.approx((0.25 + 0 + 0.75 + 0) / 4)
    assert m["sampling_pass@2"]["value"] == pytest.approx((0.5 + 0 + 1.0 + 0) / 4)
    assert m["sampling_pass@4"]["value"] == m["sampling_pass@k"]["value"] == 0.5
    assert m["sampling_maj@4"]["value"] == pytest.approx(0.25)  # only q2's majority is A
    assert m["sampling_pass@3"]["mode"].startswith("sampling: temperature 0.8") and "n 4" in m["sampling_pass@3"]["mode"]
    assert "majority" in m["sampling_maj@2"]["mode"] and m["greedy_pass@1"]["mode"].startswith("greedy")
    lo, hi = m["sampling_pass@1"]["ci95"]
    assert lo <= m["sampling_pass@1"]["value"] <= hi
    # chance beside every metric: 4 options -> 1/4 greedy, 1-(3/4)^4 = 0.684 for pass@4; train's "D" is right 0/4
    for name, cell in m.items():
        if name != "nondeterminism_proxy":
            assert set(cell["chance"]) >= {"uniform_guess", "most_common_train_answer"}, name
    assert m["greedy_pass@1"]["chance"]["uniform_guess"] == 0.25
    assert m["sampling_pass@4"]["chance"]["uniform_guess"] == pytest.approx(1 - 0.75 ** 4)
    assert m["sampling_maj@4"]["chance"]["uniform_guess"] == 0.25
    assert m["sampling_pass@2"]["chance"]["most_common_train_answer"] == 0.0
    assert m["greedy_pass@1"]["chance"]["most_common_answer"] == "d"
    no_train, _ = E.gather(files, {"stats": {"bootstrap": {"samples": 50, "seed": 0}}})
    assert no_train["splits"]["test"]["base"]["greedy_pass@1"]["chance"]["most_common_train_answer"] is None
    free_text = [write_rows(tmp_path / "free.jsonl", sampled_rows("base", per_q, options=False))]
    free, _ = E.gather(free_text, {"stats": {"bootstrap": {"samples": 50, "seed": 0}}})
    assert free["splits"]["test"]["base"]["greedy_pass@1"]["chance"]["uniform_guess"] is None


def test_gather_refuses_mixed_sample_counts_naming_the_files(tmp_path):
    four = write_rows(tmp_path / "base_test.jsonl", sampled_rows("base", [("A", ["A", "B", "C", "D"])] * 3))
    one = write_rows(tmp_path / "grpo_test.jsonl", sampled_rows("grpo", [("A", ["A"])] * 3))
    with pytest.raises(InputError) as err:
        E.gather([four, one], {"k": 4})
    message = str(err.value)
    assert "\n" not in message and "base_test.jsonl" in message and "grpo_test.jsonl" in message
    assert "1 per question" in message and "4 per question" in message
    # another split may use another n; one file whose rows disagree is refused too
    ood = write_rows(tmp_path / "grpo_ood.jsonl", sampled_rows("grpo", [("A", ["A"])] * 3, split="ood"))
    E.gather([four, ood], {"k": 4, "stats": {"bootstrap": {"samples": 50, "seed": 0}}})
    rows = sampled_rows("base", [("A", ["A", "B", "C", "D"]), ("A", ["A"])])
    with pytest.raises(InputError, match=r"mixed\.jsonl: mixed sample counts"):
        E.gather([write_rows(tmp_path / "mixed.jsonl", rows)], {})


def test_cli_gather_refuses_mixed_counts_in_one_line(tmp_path):
    four = write_rows(tmp_path / "base_test.jsonl", sampled_rows("base", [("A", ["A", "B", "C", "D"])] * 2))
    one = write_rows(tmp_path / "sft_test.jsonl", sampled_rows("sft", [("A", ["A"])] * 2))
    proc = llmrnn_in_process("qa", "gather", "--inputs", four, one, "--metrics", str(tmp_path / "m.json"),
                             "--comparison", str(tmp_path / "c.json"), "--cfg", json.dumps({"eval": {"k": 4}}))
    assert proc.returncode != 0 and not (tmp_path / "m.json").exists()
    lines = [ln for ln in proc.stderr.splitlines() if ln.strip()]
    assert len(lines) == 1 and "sft_test.jsonl" in lines[0] and "base_test.jsonl" in lines[0]


def test_judge_graded_correctness_is_a_second_metric(tmp_path):
    """Free-text answers graded by a judge (a real HTTP server on 127.0.0.1 whose answers are scripted)."""
    import yaml

    from tests.judge_helpers import REPO, ScriptedJudge, write_endpoint

    raw = yaml.safe_load((REPO / "config/rubrics/qa_correctness_smollm2.yaml").read_text())
    raw["request"].update(score_method="text", assistant_prefix="")
    rubric = tmp_path / "rubric.yaml"
    rubric.write_text(yaml.safe_dump(raw))
    rec = {"id": "q1", "question": "Which drug first for stable angina?", "answer": "a beta blocker"}
    graded = [E._graded(t, rec) for t in ("<answer>beta-blockers such as metoprolol</answer>",
                                          "<answer>aspirin only</answer>")]
    graded.append(E._graded("<answer>no idea</answer>", rec))

    def respond(body):
        text = json.dumps(body)
        return "Score: 9" if "metoprolol" in text else "I cannot grade this." if "no idea" in text else "Score: 1"

    with ScriptedJudge(respond) as judge:
        endpoint = write_endpoint(tmp_path, judge.port, rubric)
        E._judge_grades([(rec, g) for g in graded], str(endpoint), None, str(tmp_path / "audit"), 0.5)
    assert [g["correct"] for g in graded] == [False, False, False]  # exact match misses the paraphrase
    assert [g["judge_correct"] for g in graded] == [True, False, False]  # a fallback 0.5 is not "correct"
    assert graded[2]["judge_parse_method"] == "fallback" and graded[2]["judge_score"] == 0.5
    rows = [{"header": {"variant": "base", "split": "test"}}]
    rows.append({"id": "q1", "answer": rec["answer"], "greedy": graded[0], "samples": graded,
                 "greedy_pass@1": False, "sampling_pass@k": False, "disagrees": True})
    metrics, _ = E.gather([write_rows(tmp_path / "j.jsonl", rows)], {"k": 3, "stats": {"bootstrap": {"samples": 50, "seed": 0}}})
    m = metrics["splits"]["test"]["base"]
    assert m["greedy_pass@1"]["value"] == 0.0 and m["judge_greedy_pass@1"]["value"] == 1.0
    assert "judge" in m["judge_greedy_pass@1"]["mode"] and m["judge_sampling_pass@k"]["value"] == 1.0
    assert m["judge_fallback_rate"]["value"] == pytest.approx(1 / 4)  # greedy + 3 samples, one unparsed


@pytest.mark.slow
def test_evaluation_asks_in_the_configured_system_prompt(tmp_path, tiny_model_dir):
    seen = []
    original = E.Generator.generate

    def recording(self, chats, *a, **kw):
        seen.extend(chats)
        return original(self, chats, *a, **kw)

    E.Generator.generate = recording
    try:
        cfg = {"k": 1, "max_new_tokens": 2, "max_questions": 1, "prompt": {"system": "You are QA-bot 7."}}
        head = E.evaluate_model(str(tiny_model_dir), str(write_questions(tmp_path)), str(tmp_path / "o.jsonl"),
                                "base", "test", cfg)
    finally:
        E.Generator.generate = original
    assert head["system_prompt"] == "You are QA-bot 7." and seen
    assert all(chat[0] == {"role": "system", "content": "You are QA-bot 7."} for chat in seen)
    assert E.system_prompt({"system": "eval wins", "prompt": {"system": "x"}}) == "eval wins"
    assert E.system_prompt({}).startswith("You are a careful clinician")


def test_report_puts_chance_beside_every_metric(tmp_path):
    from llmrnn.qa.report import summary_tsv

    per_q = [("A", ["A", "B"]), ("B", ["C", "C"])]
    files = [write_rows(tmp_path / f"{v}.jsonl", sampled_rows(v, per_q)) for v in ("base", "grpo")]
    metrics, comparison = E.gather(files, {"k": 2, "stats": {"bootstrap": {"samples": 50, "seed": 0}}})
    lines = [ln.split("\t") for ln in summary_tsv(metrics, comparison).splitlines()]
    head = lines[0]
    assert head[-2:] == ["chance_uniform_guess", "chance_most_common_train_answer"]
    rows = {(r[1], r[2]): dict(zip(head, r)) for r in lines[1:]}
    assert {"greedy_pass@1", "sampling_pass@1", "sampling_pass@2", "sampling_maj@2"} <= {m for v, m in rows if v == "base"}
    assert rows[("base", "sampling_pass@2")]["chance_uniform_guess"] == f"{1 - 0.75 ** 2:.4f}"
    assert rows[("base", "greedy_pass@1")]["chance_uniform_guess"] == "0.2500"


# ----------------------------------------------------------------------------- judge grading (`qa judge`)
FREE_TEXT = [{"id": f"q{i}", "question": f"What first for stable angina, case {i}?", "answer": "a beta blocker"}
             for i in range(4)]


def _free_text_eval(tmp_path, variant: str, right: set[int]) -> str:
    """An eval file of free-text answers: questions in `right` answered by a paraphrase (exact match misses
    it), the others wrong; 2 samples per question, the same answer as the greedy one."""
    rows = [{"header": {"variant": variant, "split": "test", "samples_per_question": 2}}]
    for i, rec in enumerate(FREE_TEXT):
        text = "<answer>beta-blockers such as metoprolol</answer>" if i in right else "<answer>aspirin only</answer>"
        greedy = E._graded(text, rec)
        rows.append({**rec, "variant": variant, "split": "test", "greedy": greedy, "samples": [dict(greedy)] * 2,
                     "greedy_pass@1": greedy["correct"], "sampling_pass@k": greedy["correct"], "disagrees": False})
    return write_rows(tmp_path / f"{variant}_test.jsonl", rows)


def _qa_judge(tmp_path, endpoint, inputs, outputs, max_rate=0.25):
    cfg = {"eval": {"k": 2, "judge_threshold": 0.5}, "max_fallback_rate": max_rate}
    return llmrnn_in_process("qa", "judge", "--inputs", *inputs, "--outputs", *outputs, "--endpoint", str(endpoint),
                             "--audit-dir", str(tmp_path / "audit"), "--cfg", json.dumps(cfg))


def _qa_rubric(tmp_path):
    import yaml

    from tests.judge_helpers import REPO

    raw = yaml.safe_load((REPO / "config/rubrics/qa_correctness_smollm2.yaml").read_text())
    raw["request"].update(score_method="text", assistant_prefix="")
    rubric = tmp_path / "rubric.yaml"
    rubric.write_text(yaml.safe_dump(raw))
    return rubric


def test_qa_judge_grades_finished_answers_concurrently_into_a_second_compared_metric(tmp_path):
    """`llmrnn qa judge` (the workflow's qa_judge_eval) against a real HTTP judge on 127.0.0.1: judged copies
    of the eval files, the calls in flight together, and gather/report compare the judged outcomes too."""
    from llmrnn.qa.report import summary_tsv
    from tests.judge_helpers import ScriptedJudge, write_endpoint

    base, grpo = _free_text_eval(tmp_path, "base", {0}), _free_text_eval(tmp_path, "grpo", {0, 1, 2, 3})
    outputs = [str(tmp_path / "base_test.judged.jsonl"), str(tmp_path / "grpo_test.judged.jsonl")]

    def respond(body):
        return "Score: 9" if "metoprolol" in json.dumps(body) else "Score: 1"

    with ScriptedJudge(respond, delay_s=0.05) as judge:
        proc = _qa_judge(tmp_path, write_endpoint(tmp_path, judge.port, _qa_rubric(tmp_path)), [base, grpo], outputs)
    assert proc.returncode == 0, proc.stderr
    assert judge.max_inflight > 1  # sent concurrently, not one answer at a time
    head, *rows = io.read_jsonl(outputs[1])
    assert head["header"]["judge"] is True and head["header"]["judge_fallback_rate"] == 0.0
    assert all(r["greedy"]["judge_correct"] and not r["greedy"]["correct"] for r in rows)  # EM misses paraphrases
    assert any((tmp_path / "audit").iterdir())  # every call audited

    metrics, comparison = E.gather(outputs, {"k": 2, "stats": {"bootstrap": {"samples": 100, "seed": 0}}})
    m = metrics["splits"]["test"]
    assert m["grpo"]["greedy_pass@1"]["value"] == 0.0 and m["grpo"]["judge_greedy_pass@1"]["value"] == 1.0
    assert m["base"]["judge_greedy_pass@1"]["value"] == 0.25 and "judge" in m["base"]["judge_greedy_pass@1"]["mode"]
    assert m["base"]["judge_greedy_pass@1"]["chance"] == m["base"]["greedy_pass@1"]["chance"]
    pair = comparison["splits"]["test"]["grpo_vs_base"]
    assert pair["judge_greedy_pass@1"]["mcnemar"]["only_b_correct"] == 3
    assert pair["greedy_pass@1"]["mcnemar"]["only_b_correct"] == 0
    assert "test\tgrpo_vs_base\tjudge_greedy_pass@1" in summary_tsv(metrics, comparison)


def test_qa_judge_that_falls_back_stops_with_one_line_and_writes_nothing(tmp_path):
    """A judge whose answers carry no score (a judged metric of 0.5 fallbacks) fails the grading job above
    preflight's fallback bar: one line naming the file and the share, and no judged copy at all."""
    from tests.judge_helpers import ScriptedJudge, write_endpoint

    base, grpo = _free_text_eval(tmp_path, "base", {0}), _free_text_eval(tmp_path, "grpo", {1})
    outputs = [str(tmp_path / "base.judged.jsonl"), str(tmp_path / "grpo.judged.jsonl")]

    def respond(body):  # the first file is graded fine, the second's answers get no score
        return "I cannot grade this." if "case 1" in json.dumps(body) or "case 2" in json.dumps(body) else "Score: 2"

    with ScriptedJudge(respond) as judge:
        endpoint = write_endpoint(tmp_path, judge.port, _qa_rubric(tmp_path))
        proc = _qa_judge(tmp_path, endpoint, [base, grpo], outputs)
        assert proc.returncode != 0 and not any(tmp_path.glob("*.judged.jsonl*"))
        lines = [ln for ln in proc.stderr.splitlines() if ln.strip() and " INFO " not in ln]
        assert len(lines) == 1 and "base_test.jsonl" in lines[0] and "6 of 12 answers (50%" in lines[0], lines
        assert "preflight.max_fallback_rate" in lines[0]
        # the bar is the config's: at 0.6 the same judge's grades are written, its fallbacks counted as wrong
        proc = _qa_judge(tmp_path, endpoint, [base, grpo], outputs, max_rate=0.6)
    assert proc.returncode == 0, proc.stderr
    metrics, _ = E.gather(outputs, {"k": 2, "stats": {"bootstrap": {"samples": 50, "seed": 0}}})
    assert metrics["splits"]["test"]["base"]["judge_fallback_rate"]["value"] == 0.5
    assert metrics["splits"]["test"]["base"]["judge_greedy_pass@1"]["value"] == 0.0  # a fallback is not correct
