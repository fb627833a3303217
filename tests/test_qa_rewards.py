"""Edge tables of the qa rewards (llmrnn.qa.rewards): exact match after extraction and normalisation,
format, perplexity fluency under a real (tiny) model, the judge through a real HTTP server on 127.0.0.1,
and the TRL adapter giving compute_score's values."""

from __future__ import annotations

import json

import pytest

from llmrnn.errors import InputError
from llmrnn.qa import rewards as R

OPTS = {"A": "anemia", "B": "gout", "C": "syncope", "D": "hip fracture"}

EXACT_MATCH_TABLE = [
    # (response, reference, options, score, extraction method)
    ("<reasoning>x</reasoning>\n<answer> B </answer>", "B", OPTS, 1.0, "tag"),
    ("<answer>A</answer> then <answer>B</answer>", "B", OPTS, 1.0, "tag"),  # the last tag counts
    ("<answer>C</answer>", "B", OPTS, 0.0, "tag"),
    ("I think so.\nAnswer: (b).", "B", OPTS, 1.0, "answer_line"),
    ("The final answer is b", "B", OPTS, 1.0, "answer_line"),
    ("<answer>Syncope</answer>", "C", OPTS, 1.0, "tag"),  # option text -> its letter
    ("<answer>C) syncope</answer>", "C", OPTS, 1.0, "tag"),
    ("<answer>E</answer>", "E", OPTS, 0.0, "tag"),  # not an option: no letter, and E is never right
    ("1,000.50", "1000.5", None, 1.0, "last_line"),
    ("+3", "3.0", None, 1.0, "last_line"),
    ("50%", "50.0%", None, 1.0, "last_line"),
    ("50", "50%", None, 0.0, "last_line"),
    ("The  Syncope!", "syncope", None, 1.0, "last_line"),
    ("a fever", "fever", None, 1.0, "last_line"),  # an article, not option a
    ("", "B", OPTS, 0.0, "none"),
    ("   \n  ", "B", OPTS, 0.0, "none"),
    ("<answer>  </answer>", "B", OPTS, 0.0, "last_line"),  # empty tag: falls back, still wrong
]


@pytest.mark.parametrize(("response", "reference", "options", "score", "method"), EXACT_MATCH_TABLE)
def test_exact_match_table(response, reference, options, score, method):
    result = R.exact_match(response, reference, options)
    assert result["exact_match"] == score
    assert result["extract_method"] == method


FORMAT_TABLE = [
    ("<reasoning>r</reasoning>\n<answer>a</answer>", 1.0),
    ("<reasoning>\nr\n</reasoning>\n<answer>\na\n</answer>\n  ", 1.0),
    ("<answer>a</answer><reasoning>r</reasoning>", 0.0),  # out of order
    ("<reasoning>r</reasoning><reasoning>r</reasoning><answer>a</answer>", 0.0),  # twice
    ("<reasoning>r</reasoning>", 0.0),  # answer missing
    ("<reasoning>r<answer>a</answer></reasoning>", 0.0),  # nested
    ("<reasoning>r</reasoning><answer>a</answer> trailing words", 0.0),
    ("", 0.0),
]


@pytest.mark.parametrize(("text", "score"), FORMAT_TABLE)
def test_format_table(text, score):
    assert R.format_score(text) == score


def test_format_custom_tags():
    assert R.format_score("<think>x</think><final>y</final>", ["think", "final"]) == 1.0
    assert R.format_score("<think>x</think><final>y</final>") == 0.0


def test_weights_compose_and_unknown_keys_are_refused():
    gt = json.dumps({"answer": "B", "options": OPTS})
    cfg = {"weights": {"exact_match": 1.0, "format": 0.5}}
    good = R.compute_score(R.DATA_SOURCE, "<reasoning>r</reasoning><answer>B</answer>", gt, reward_cfg=cfg)
    assert good["score"] == 1.5 and good["exact_match"] == 1.0 and good["format"] == 1.0
    wrong = R.compute_score(R.DATA_SOURCE, "<reasoning>r</reasoning><answer>A</answer>", gt, reward_cfg=cfg)
    assert wrong["score"] == 0.5
    with pytest.raises(InputError, match="unknown reward"):
        R.reward_config({"weights": {"exactmatch": 1}})
    with pytest.raises(InputError, match="every weight is 0"):
        R.reward_config({"weights": {"exact_match": 0, "format": 0}})  # format defaults to 0.2 (one default)
    with pytest.raises(InputError, match="fluency_model"):
        R.reward_config({"weights": {"fluency": 1}})
    with pytest.raises(InputError, match="no answer"):
        R.compute_score(R.DATA_SOURCE, "x", json.dumps({"options": OPTS}), reward_cfg=cfg)


def test_reward_config_comes_as_an_argument_not_from_the_environment(monkeypatch):
    """The settings arrive as `reward_cfg=` (JSON text as verl's reward_kwargs carry it, or a mapping as
    TRL's arguments); the old LLMRNN_REWARD_CFG environment variable is not read."""
    monkeypatch.setenv("LLMRNN_REWARD_CFG", json.dumps({"weights": {"exact_match": 5.0}}))
    assert R.compute_score(R.DATA_SOURCE, "<answer>B</answer>", "B")["score"] == 1.0
    as_json = json.dumps({"weights": {"exact_match": 2.0}})
    assert R.compute_score(R.DATA_SOURCE, "<answer>B</answer>", "B", reward_cfg=as_json)["score"] == 2.0
    assert R.compute_score(R.DATA_SOURCE, "<answer>B</answer>", "B", reward_cfg=json.loads(as_json))["score"] == 2.0


def test_fluency_is_the_perplexity_under_the_model(tiny_model_dir):
    """The random tiny model has no taste, so the check is the quantity: exp(mean next-token NLL) of the
    response after BOS, computed here by hand from the logits, mapped by 1 - ln(ppl)/ln(max_ppl)."""
    import math

    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    text = "type 2 diabetes mellitus syncope anemia"
    tok = AutoTokenizer.from_pretrained(tiny_model_dir)
    model = AutoModelForCausalLM.from_pretrained(tiny_model_dir).eval()
    ids = tok(text, add_special_tokens=False)["input_ids"]
    ids = ([tok.bos_token_id] if tok.bos_token_id is not None else []) + ids
    with torch.no_grad():
        logp = torch.log_softmax(model(torch.tensor([ids])).logits[0, :-1], -1)
    nll = -logp[torch.arange(len(ids) - 1), torch.tensor(ids[1:])].mean().item()
    score, ppl = R.fluency_score(text, str(tiny_model_dir), 1e6)
    assert ppl == pytest.approx(math.exp(nll), rel=1e-4)
    assert score == pytest.approx(1 - nll / math.log(1e6), rel=1e-4)
    assert R.fluency_score("", str(tiny_model_dir)) == (0.0, None)
    assert R.fluency_score(text, str(tiny_model_dir), 1.5)[0] == 0.0  # ppl above max_ppl clips to 0


def test_trl_adapter_gives_compute_score_values(tiny_model_dir):
    cfg = {"weights": {"exact_match": 1.0, "format": 0.2, "fluency": 0.3}, "fluency_model": str(tiny_model_dir)}
    gts = [json.dumps({"answer": "B", "options": OPTS}), json.dumps({"answer": "1000", "options": None})]
    texts = ["<reasoning>gout</reasoning><answer>B</answer>", "Answer: 1,000", "nonsense", ""]
    rows = [(t, gts[i % 2]) for i, t in enumerate(texts)]
    verl = [R.compute_score(R.DATA_SOURCE, t, gt, {"index": i}, reward_cfg=cfg)["score"]
            for i, (t, gt) in enumerate(rows)]
    completions = [[{"role": "assistant", "content": t}] for t, _ in rows]
    trl = R.trl_reward_func([[{"role": "user", "content": "q"}]] * 4, completions,
                            reward_model=[{"style": "rule", "ground_truth": gt} for _, gt in rows],
                            data_source=[R.DATA_SOURCE] * 4, extra_info=[{"index": i} for i in range(4)],
                            reward_cfg=cfg)
    assert trl == verl
    assert verl[0] > 1.2 and verl[1] > 1.0 and verl[3] == 0.0 and len(set(verl)) == 4


def test_judge_reward_through_the_rubric_service(tmp_path):
    from tests.judge_helpers import REPO, ScriptedJudge, write_endpoint

    seen = []

    def respond(body):
        prompt = json.dumps(body)
        seen.append(prompt)
        return "Score: 9" if "gout" in prompt.split("Candidate", 1)[-1] else "Score: 0"

    import yaml

    # the shipped qa rubric, read as text (the scripted judge returns no logprobs)
    raw = yaml.safe_load((REPO / "config/rubrics/qa_correctness_smollm2.yaml").read_text())
    raw["request"].update(score_method="text", assistant_prefix="")
    rubric = tmp_path / "qa_rubric.yaml"
    rubric.write_text(yaml.safe_dump(raw))
    with ScriptedJudge(respond) as judge:
        endpoint = write_endpoint(tmp_path, judge.port, rubric)
        cfg = {"weights": {"exact_match": 0.0, "judge": 1.0}}
        gt = json.dumps({"answer": "gout", "question": "Which joint disease?"})
        kw = {"endpoint_file": str(endpoint), "audit_dir": str(tmp_path / "audit"), "reward_cfg": cfg}
        right = R.compute_score(R.DATA_SOURCE, "<answer>gout</answer>", gt, **kw)
        wrong = R.compute_score(R.DATA_SOURCE, "<answer>anemia</answer>", gt, **kw)
    assert right["judge"] == 1.0 and wrong["judge"] == 0.0
    assert right["judge_parse_method"] == "score_line"
    assert "Which joint disease?" in seen[0]
    audit = list((tmp_path / "audit").glob("*.jsonl"))
    assert audit and (audit[0].stat().st_mode & 0o777) == 0o600


NUMBER_TABLE = [
    # (answer, reference, score): numbers are compared exactly, every digit counts, the sign of 0 does not
    ("1234567", "1234568", 0.0),
    ("100.0001", "100.0002", 0.0),
    ("0.1", "0.10000001", 0.0),
    ("123456789012345678", "123456789012345679", 0.0),
    ("1234567890123456789012345678901", "1234567890123456789012345678902", 0.0),  # past Decimal's 28 digits
    ("-5", "5", 0.0),
    ("-0", "0", 1.0),
    ("-0.00", "0", 1.0),
    ("1234567", "1234567.0", 1.0),
    ("1e3", "1000", 1.0),
    ("042", "42", 1.0),
    (".5", "0.5", 1.0),
    ("1,234,567", "1234567", 1.0),
]


@pytest.mark.parametrize(("answer", "reference", "score"), NUMBER_TABLE)
def test_numbers_are_compared_exactly(answer, reference, score):
    assert R.exact_match(f"<answer>{answer}</answer>", reference)["exact_match"] == score
    assert R.exact_match(f"<answer>{reference}</answer>", answer)["exact_match"] == score


def test_a_huge_exponent_is_compared_without_expanding_it():
    assert R.normalize_answer("1e999999999") == R.normalize_answer("10e999999998")
    assert len(R.normalize_answer("1e999999999")) < 30


FORMAT_CASE_TABLE = [
    # empty or blank tags earn nothing; tag names count in any case, for format and answer alike
    ("<reasoning></reasoning><answer></answer>", 0.0, 0.0),
    ("<reasoning>  </reasoning><answer>B</answer>", 0.0, 1.0),
    ("<reasoning>gout</reasoning><answer>\n</answer>", 0.0, 0.0),
    ("<reasoning>gout</reasoning><Answer>B</Answer>", 1.0, 1.0),
    ("<REASONING>gout</REASONING>\n<ANSWER>B</ANSWER>", 1.0, 1.0),
    ("<Reasoning>gout</reasoning><answer>B</ANSWER>", 1.0, 1.0),
    ("<reasoning>gout</reasoning><Answer>B</Answer><answer>C</answer>", 0.0, 0.0),  # two answers, last wins
]


@pytest.mark.parametrize(("text", "fmt", "em"), FORMAT_CASE_TABLE)
def test_format_needs_content_and_treats_tag_case_like_the_answer(text, fmt, em):
    assert R.format_score(text) == fmt
    assert R.exact_match(text, "B", OPTS)["exact_match"] == em
    if em:
        assert R.exact_match(text, "B", OPTS)["extract_method"] in ("tag", "answer_line")


def _scripted_qa_judge(tmp_path, respond):
    import yaml

    from tests.judge_helpers import REPO, ScriptedJudge, write_endpoint

    raw = yaml.safe_load((REPO / "config/rubrics/qa_correctness_smollm2.yaml").read_text())
    raw["request"].update(score_method="text", assistant_prefix="")
    rubric = tmp_path / "qa_rubric.yaml"
    rubric.write_text(yaml.safe_dump(raw))
    judge = ScriptedJudge(respond)
    return judge, (lambda port: write_endpoint(tmp_path, port, rubric))


def test_qa_judge_fallbacks_are_counted_logged_and_stop_training(tmp_path, monkeypatch):
    """An unparseable judge answer scores 0.5 as before, but through the memory head's guard: the batch's
    fallback rate reaches TRL's log_metric, and too many fallbacks raise JudgeDegraded with a stop reason."""
    from llmrnn.reward import STOP_REASON_FILE, JudgeDegraded, guard_spec
    judge, endpoint_for = _scripted_qa_judge(tmp_path, lambda body: "I would rather not grade this.")
    cfg = {"weights": {"exact_match": 1.0, "judge": 1.0}}
    gt = json.dumps({"answer": "gout", "question": "Which joint disease?"})
    logged: dict[str, list[float]] = {}
    with judge:
        kw = {"endpoint_file": str(endpoint_for(judge.port)), "audit_dir": str(tmp_path / "audit"), "reward_cfg": cfg,
              "guard": json.dumps(guard_spec(0.25, 4))}
        one = R.compute_score(R.DATA_SOURCE, "<answer>anemia</answer>", gt, **kw)
        assert one["judge"] == 0.5 and one["judge_parse_method"] == "fallback"
        assert R.compute_score(R.DATA_SOURCE, "<answer>x</answer>", gt, numeric_only=True, **kw)["parse_fallback"] == 1.0
        with pytest.raises(JudgeDegraded, match="fell back to 0.5"):
            R.trl_reward_func(["q"] * 2, ["<answer>gout</answer>", "<answer>sepsis</answer>"],
                              reward_model=[{"ground_truth": gt}] * 2, log_metric=lambda k, v: logged.setdefault(k, []).append(v),
                              **kw)
    assert "fell back to 0.5" in (tmp_path / "audit" / STOP_REASON_FILE).read_text()


def test_step_metrics_log_correctness_extraction_and_high_reward_but_wrong(tmp_path):
    """A judge that pays a wrong answer 9/9: exact match says wrong, the reward says great. TRL's logger
    gets correctness, the extraction methods and the high_reward_but_wrong share and count."""
    judge, endpoint_for = _scripted_qa_judge(tmp_path, lambda body: "Score: 9")
    cfg = {"weights": {"exact_match": 0.5, "format": 0.1, "judge": 0.5}}
    gt = json.dumps({"answer": "gout", "question": "Which joint disease?"})
    texts = ["<reasoning>r</reasoning><answer>gout</answer>", "<reasoning>r</reasoning><answer>anemia</answer>",
             "Answer: sepsis", "no idea"]
    logged: dict[str, list[float]] = {}
    with judge:
        kw = {"endpoint_file": str(endpoint_for(judge.port)), "audit_dir": str(tmp_path / "audit"), "reward_cfg": cfg}
        scores = R.trl_reward_func(["q"] * 4, texts, reward_model=[{"ground_truth": gt}] * 4,
                                   log_metric=lambda k, v: logged.setdefault(k, []).append(v), **kw)
        verl = R.compute_score(R.DATA_SOURCE, texts[1], gt, numeric_only=True, **kw)
    assert scores[0] == pytest.approx(1.1) and scores[1] == pytest.approx(0.6)
    assert logged["qa/correct"] == [0.25]
    assert logged["qa/extract_tag"] == [0.5] and logged["qa/extract_answer_line"] == [0.25]
    assert logged["qa/extract_last_line"] == [0.25] and logged["qa/extract_none"] == [0.0]
    # best = 1.1: the wrong answer with format (0.6) is high, the wrong ones without format (0.5) are not
    assert logged["qa/high_reward_but_wrong"] == [0.25] and logged["qa/high_reward_but_wrong_count"] == [1.0]
    assert logged["judge_fallback_rate"] == [0.0]
    # verl: numbers only, the same keys (verl averages them; llmrnn's rollout stats read them per step)
    assert verl["correct"] == 0.0 and verl["high_reward_but_wrong"] == 1.0 and verl["extract_tag"] == 1.0
    assert all(isinstance(v, float) for v in verl.values())


def test_verl_rollout_stats_carry_the_qa_step_metrics(tmp_path):
    from llmrnn.train.verl_cmd import rollout_stats

    gt = json.dumps({"answer": "B", "options": OPTS})
    rows = [R.compute_score(R.DATA_SOURCE, t, gt, numeric_only=True, reward_cfg={"weights": {"exact_match": 1.0}})
            for t in ("<answer>B</answer>", "Answer: C", "", "B")]
    (tmp_path / "3.jsonl").write_text("".join(json.dumps({"input": "p", "output": "o", **r}) + "\n" for r in rows))
    stats = rollout_stats(tmp_path, 3)
    assert stats["qa/correct"] == 0.5 and stats["qa/extract_none"] == 0.25
    assert stats["qa/high_reward_but_wrong_count"] == 0.0


@pytest.mark.slow
def test_trl_training_logs_qa_correctness_per_step(tmp_path, tiny_model_dir):
    """A real TRL GRPO run (tiny model, 2 steps) with the qa reward: every train row of metrics.jsonl carries
    the step's correctness, extraction methods and high_reward_but_wrong (raw keys qa/...)."""
    import os
    import subprocess
    import sys
    from pathlib import Path

    from llmrnn.qa import data as D

    recs = [{"id": f"q{i}", "question": f"Which condition is number {i}?", "answer": "ABCD"[i % 4],
             "options": dict(OPTS), "group": f"g{i}"} for i in range(6)]
    D.write_parquet(tmp_path / "train.parquet", D.rl_rows(recs[:4], "train", D.SYSTEM_PROMPT))
    D.write_parquet(tmp_path / "val.parquet", D.rl_rows(recs[4:], "val", D.SYSTEM_PROMPT))
    train = {"engine": "trl", "seed": 3, "lora": {"rank": 8, "alpha": 16}, "lr": 1e-3, "group_size": 4,
             "batch": {"train": 2, "mini": 2, "micro_per_gpu": 4}, "max_prompt_length": 256,
             "max_response_length": 8, "epochs": 1, "total_steps": 2, "save_freq": 2, "test_freq": 0,
             "keep_last": 1, "fail_on_zero_gradient": False}  # a tiny model scoring 0: plumbing, not learning
    cfg = {"train": train, "reward": {"weights": {"exact_match": 1.0, "format": 0.5}}}
    out = tmp_path / "run"
    llmrnn = str(Path(sys.executable).parent / "llmrnn")
    proc = subprocess.run([llmrnn, "train", "run", "--cfg", json.dumps(cfg), "--train", str(tmp_path / "train.parquet"),
                           "--val", str(tmp_path / "val.parquet"), "--model", str(tiny_model_dir), "--work-dir",
                           str(out), "--adapter", str(out / "adapter"), "--metrics", str(out / "metrics.jsonl"),
                           "--summary", str(out / "summary.json"),
                           "--reward-func", "llmrnn.qa.rewards:trl_reward_func"],
                          env=dict(os.environ, OMP_NUM_THREADS="1"), capture_output=True, text=True, timeout=900,
                          check=False)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    rows = [json.loads(x) for x in (out / "metrics.jsonl").read_text().splitlines()]
    train_rows = [r for r in rows if r["kind"] == "train"]
    assert len(train_rows) == 2
    for row in train_rows:
        raw = row["raw"]
        assert 0.0 <= raw["qa/correct"] <= 1.0 and 0.0 <= raw["qa/high_reward_but_wrong"] <= 1.0
        methods = sum(raw[f"qa/extract_{m}"] for m in R.EXTRACT_METHODS)
        assert methods == pytest.approx(1.0)
