"""Rubric files: loading/validation, request rendering, and the judge-answer edge table."""

from __future__ import annotations

import math

import pytest

from llmrnn.errors import InputError
from llmrnn.rubric import (
    expected_digit,
    load_rubric,
    pairwise_request,
    parse_scalar,
    parse_verdict,
    response_problem,
    scalar_request,
)
from tests.judge_helpers import REPO, make_step, memory

DEFAULT = REPO / "config/rubrics/outcome_v2_smollm2.yaml"
REPRO = REPO / "config/rubrics/rubric_v2_rubricarm_scalar.yaml"


def test_shipped_rubrics_load_with_their_serving_settings():
    d = load_rubric(DEFAULT)
    assert (d.serving.engine, d.request.score_method, d.model_source) == ("llmrnn", "expected", "local")
    r = load_rubric(REPRO)
    assert r.model == "OpenRubrics/RubricARM-8B-Judge" and r.serving.engine == "vllm" and r.needs_gpu
    assert (r.request.temperature, r.request.max_tokens, r.serving.max_model_len) == (0.0, 1500, 12000)
    assert r.serving.gpu_memory_utilization == 0.9


@pytest.mark.parametrize("edit, message", [
    (("serving:\n  engine: llmrnn", "serving:\n  engine: llamacpp"), "serving.engine"),
    (("serving:\n", "serving:\n  colour: red\n"), "unknown key"),
    (("{candidate_memory}", "{candidate_mem}"), "unknown field"),
    (("host: 127.0.0.1", "host: 0.0.0.0"), "loopback"),
    (("temperature: 0.0", "temperature: 0.7"), "greedily"),
    (("engine: llmrnn ", "engine: transformers "), "serving.engine"),
    (("api: chat", "api: completions"), "completions .* needs serving.engine vllm"),
])
def test_bad_rubric_is_one_clear_error(tmp_path, edit, message):
    text = DEFAULT.read_text()
    assert edit[0] in text
    bad = tmp_path / "bad.yaml"
    bad.write_text(text.replace(edit[0], edit[1], 1))
    with pytest.raises(InputError, match=message) as err:
        load_rubric(bad)
    assert str(bad) in str(err.value) and "\n" not in str(err.value)


def test_interpolation_resolves_and_a_bad_one_is_one_line(tmp_path):
    """OmegaConf's ${...} is read only where a rubric has one (importing it costs every Snakemake start)."""
    text = DEFAULT.read_text()
    name = load_rubric(DEFAULT).name
    interpolated = tmp_path / "interpolated.yaml"
    interpolated.write_text(text.replace(f"name: {name}", "name: ${judge.model}-judge", 1))
    assert load_rubric(interpolated).name == f"{load_rubric(DEFAULT).model}-judge"
    bad = tmp_path / "bad.yaml"
    bad.write_text(text.replace(f"name: {name}", "name: ${no.such.key}", 1))
    with pytest.raises(InputError, match="not a readable rubric YAML") as err:
        load_rubric(bad)
    assert str(bad) in str(err.value) and "\n" not in str(err.value)


def test_scalar_request_shows_candidate_and_next_visit_outcome():
    rubric = load_rubric(DEFAULT)
    req = scalar_request(rubric, make_step(), memory("Known heart failure."))
    assert "Known heart failure." in req.prompt and "Heart failure; CKD stage 3" in req.prompt
    assert "copd" in req.prompt  # next visit's predicted primary
    msgs = req.body["messages"]
    assert msgs[-1] == {"role": "assistant", "content": "Score: "} and req.body["continue_final_message"]
    assert req.body["logprobs"] is True and req.body["top_logprobs"] == 20 and req.body["temperature"] == 0.0
    pair = pairwise_request(rubric, make_step(), memory("AAA"), memory("BBB"))
    assert pair.prompt.index("AAA") < pair.prompt.index("BBB")


# --------------------------------------------------------------------------- the edge table
@pytest.mark.parametrize("answer, score, method", [
    ("The memory keeps the renal history.\nScore: 7", 7 / 9, "score_line"),
    ("**Score:** 3", 3 / 9, "score_line"),
    ("Clinical accuracy score: 2 ... long reasoning\nScore: 8\n", 8 / 9, "score_line"),  # last Score line
    ("6", 6 / 9, "short_digit"),
    ("I'd say 4 or 5", 5 / 9, "short_digit"),  # short (<20 chars): LAST digit
    ("The memory is fine and relevant to the next visit, overall.", 0.5, "fallback"),
    ("Clinical accuracy score: 3; completeness score: 2 and more words", 0.5, "fallback"),  # rubric-v1 bug
    ("great", 0.5, "fallback"),
])
def test_edge_table(answer, score, method):
    parsed = parse_scalar(answer)
    assert parsed.parse_method == method
    assert math.isclose(parsed.score, score)


def test_score_line_continues_the_assistant_prefix():
    assert parse_scalar(" 7", prefix="Score:").parse_method == "score_line"


def _lp(token, logprob, top):
    return {"token": token, "logprob": logprob, "top_logprobs": [{"token": t, "logprob": v} for t, v in top]}


def test_expected_score_from_chat_logprobs_is_probability_weighted():
    payload = {"choices": [{"message": {"content": " 7"}, "logprobs": {"content": [
        _lp(" ", -0.1, [(" ", -0.1), ("x", -3)]),
        _lp("7", math.log(0.5), [("7", math.log(0.5)), ("8", math.log(0.25)), ("3", math.log(0.25)), ("a", -1)]),
    ]}}]}
    value, probs = expected_digit(payload)
    assert math.isclose(value, 0.5 * 7 + 0.25 * 8 + 0.25 * 3)
    parsed = parse_scalar(" 7", payload=payload, prefix="Score:", use_logprobs=True)
    assert parsed.parse_method == "expected" and math.isclose(parsed.score, value / 9)
    assert probs == {"3": 0.25, "7": 0.5, "8": 0.25}


def test_expected_score_from_completions_logprobs_and_no_digit_falls_back_to_text():
    payload = {"choices": [{"text": "5", "logprobs": {"tokens": ["5"], "token_logprobs": [math.log(0.8)],
                                                      "top_logprobs": [{"5": math.log(0.8), "9": math.log(0.2)}]}}]}
    assert math.isclose(expected_digit(payload)[0], 5 * 0.8 + 9 * 0.2)
    no_digit = {"choices": [{"message": {"content": "::"}, "logprobs": {"content": [_lp("::", -0.1, [("::", -0.1)])]}}]}
    parsed = parse_scalar("::", payload=no_digit, prefix="Score:", use_logprobs=True)
    assert parsed.parse_method == "fallback" and parsed.score == 0.5


def test_superscript_and_other_non_ascii_digit_tokens_are_no_score():
    """str.isdigit() accepts '¹' and '²', which int() refuses: SmolLM2's top logprobs after "Score: " held
    '¹', and the judge client crashed grading instead of reading the ASCII digits beside it."""
    payload = {"choices": [{"message": {"content": "8"}, "logprobs": {"content": [
        _lp("8", math.log(0.6), [("8", math.log(0.6)), ("¹", math.log(0.2)), ("²", math.log(0.1)),
                                 ("2", math.log(0.1))]),
    ]}}]}
    value, probs = expected_digit(payload)
    assert probs == {"2": pytest.approx(1 / 7), "8": pytest.approx(6 / 7)} and math.isclose(value, (8 * 6 + 2) / 7)
    only_superscript = {"choices": [{"message": {"content": "¹"}, "logprobs": {"content": [
        _lp("¹", -0.1, [("¹", -0.1), ("³", -3)])]}}]}
    assert expected_digit(only_superscript) is None
    assert parse_scalar("¹", payload=only_superscript, use_logprobs=True).parse_method == "fallback"
    assert parse_scalar("x²").parse_method == "fallback"  # the short-answer digit reader skips it too


@pytest.mark.parametrize("answer, verdict", [
    ("Winner: A", "A"), ("reasoning...\nWinner: **B**", "B"), ("winner: tie", "tie"), ("I like both", None),
    ("Response A is long.\nWinner: Response B", "B"),
])
def test_pairwise_verdicts(answer, verdict):
    assert parse_verdict(answer, load_rubric(REPRO)) == verdict


# --------------------------------------------------------------------------- answers that are no answer
_GOOD_LP = {"content": [_lp("7", -0.1, [("7", -0.1), ("8", -2.5)])]}


@pytest.mark.parametrize("payload, logprobs, problem", [
    ({"choices": []}, False, "no choices"),
    ({"object": "error", "message": "overloaded"}, False, "no choices"),
    ([1, 2], False, "not a JSON object"),
    ({"choices": ["Score: 5"]}, False, "not an object"),
    ({"choices": [{"message": "Score: 5"}]}, False, "message is not an object"),
    ({"choices": [{"message": {"role": "assistant", "content": None}}]}, False, "no text content"),
    ({"choices": [{"message": {"role": "assistant", "content": ""}}]}, False, "content is empty"),
    ({"choices": [{"message": {"role": "assistant", "content": " \n"}}]}, False, "content is empty"),
    ({"choices": [{"text": ""}]}, False, "content is empty"),
    ({"choices": [{"message": {"content": "7"}, "logprobs": None}]}, True, "asked for but the answer has none"),
    ({"choices": [{"message": {"content": "7"}, "logprobs": {"content": []}}]}, True, "content is missing"),
    ({"choices": [{"message": {"content": "7"}, "logprobs": {"content": [{"token": "7"}]}}]}, True,
     "no numeric logprob"),
    ({"choices": [{"message": {"content": "7"}, "logprobs": {"content": [
        {"token": "7", "logprob": -0.1, "top_logprobs": [{"logprob": -0.1}]}]}}]}, True, "top_logprobs"),
    ({"choices": [{"text": "5", "logprobs": {"tokens": ["5"], "token_logprobs": []}}]}, True, "does not match"),
    ({"choices": [{"text": "5", "logprobs": {"tokens": ["5"], "token_logprobs": [-0.2],
                                             "top_logprobs": [{"5": "high"}]}}]}, True, "top_logprobs"),
])
def test_an_answer_without_content_or_usable_logprobs_is_a_problem(payload, logprobs, problem):
    found = response_problem(payload, logprobs=logprobs)
    assert found is not None and problem in found


def test_real_answers_are_no_problem():
    assert response_problem({"choices": [{"message": {"content": "Score: 5"}}]}) is None
    assert response_problem({"choices": [{"message": {"content": "7"}, "logprobs": _GOOD_LP}]}, logprobs=True) is None
    assert response_problem({"choices": [{"text": "5", "logprobs": {
        "tokens": ["5"], "token_logprobs": [-0.2], "top_logprobs": [{"5": -0.2, "9": -1.8}]}}]}, logprobs=True) is None
