"""The judge call stops at its answer, and the answer's own score is the one read (issue: a runaway
raw-prompt continuation after `Score: N` used to supply the LAST `Score:` line, up to 1500 tokens later)."""

from __future__ import annotations

import json
import math

import pytest
from omegaconf import OmegaConf

from llmrnn.errors import InputError
from llmrnn.reward import compute_score
from llmrnn.rubric import (
    SHORT_ANSWER_MAX_TOKENS,
    load_rubric,
    pairwise_request,
    parse_scalar,
    parse_verdict,
    scalar_request,
)
from tests.judge_helpers import REPO, ScriptedJudge, chat_payload, make_step, memory, write_endpoint

REPRO = REPO / "config/rubrics/rubric_v2_rubricarm_scalar.yaml"
JUDGED_LONG = [REPRO, REPO / "config/rubrics/qa_correctness_rubricarm.yaml"]

# what a raw-prompt judge writes when nothing stops it: its answer, then a made-up next "example"
RUNAWAY = ("The memory keeps the CKD and heart-failure history the next visit needs.\nScore: 8\n\n"
           "### Candidate memory\nPatient seen for cough.\n\n### Next visit (t+1)\nThink briefly...\nScore: 2\n")


def test_first_score_line_is_the_answers_score():
    parsed = parse_scalar(RUNAWAY)
    assert (parsed.parse_method, parsed.raw_score) == ("score_line", 8.0)
    assert math.isclose(parsed.score, 8 / 9)


def test_first_verdict_is_the_answers_verdict():
    text = "A keeps the renal history.\nWinner: A\n\n### Response A\n...\nWinner: B"
    assert parse_verdict(text, load_rubric(REPRO)) == "A"


@pytest.mark.parametrize("path", JUDGED_LONG, ids=lambda p: p.name)
def test_shipped_long_answer_rubrics_stop_at_every_score_line(path):
    rubric = load_rubric(path)
    body = scalar_request(rubric, make_step(), memory("CKD stage 3.")).body
    assert body["include_stop_str_in_output"] is True  # the score line stays in the answer
    assert {f"Score: {n}" for n in range(1, rubric.scale_max + 1)} <= set(body["stop"])
    for text in ("Reasoning.\nScore: 7", RUNAWAY):  # where vLLM would cut the answer: at the first stop
        cut = min(text.find(s) + len(s) for s in body["stop"] if s in text)
        assert parse_scalar(text[:cut], rubric.scale_max).raw_score == parse_scalar(text, rubric.scale_max).raw_score
    if rubric.pairwise.template:
        pair = pairwise_request(rubric, make_step(), memory("A"), memory("B")).body
        assert set(pair["stop"]) == {"Winner: A", "Winner: B"} and pair["include_stop_str_in_output"] is True


@pytest.mark.parametrize("section", ["request", "pairwise"])
def test_a_long_answer_without_a_stop_is_refused(tmp_path, section):
    raw = OmegaConf.to_container(OmegaConf.load(REPRO))
    raw[section].pop("stop")
    path = tmp_path / "no_stop.yaml"
    OmegaConf.save(OmegaConf.create(raw), path)
    with pytest.raises(InputError, match=rf"{section}.max_tokens: 1500 tokens .* {section}.stop") as err:
        load_rubric(path)
    assert "\n" not in str(err.value)
    raw[section]["max_tokens"] = SHORT_ANSWER_MAX_TOKENS  # a short answer needs no stop
    OmegaConf.save(OmegaConf.create(raw), path)
    load_rubric(path)
    raw[section]["stop"] = "Score: 1"  # a string, not a list
    OmegaConf.save(OmegaConf.create(raw), path)
    with pytest.raises(InputError, match=f"{section}.stop: expected a list"):
        load_rubric(path)


def test_reward_sends_the_stops_and_scores_the_answer_not_its_continuation(tmp_path):
    """compute_score with the reproduction rubric against a judge on 127.0.0.1 that ignores the stops
    (the worst case) and answers with a runaway continuation: the request carried the stops, the reward
    is the answer's 8/9, not the continuation's 2/9."""
    # the stand-in answers under the model the request named (the client refuses an answer from another)
    with ScriptedJudge(lambda body: (200, {**chat_payload(RUNAWAY), "model": body["model"]})) as judge:
        endpoint = write_endpoint(tmp_path, judge.port, REPRO)
        r = compute_score("llm_as_rnn_memory_update", memory("CKD stage 3 and heart failure."),
                          json.dumps(make_step()), {"index": 0}, endpoint_file=str(endpoint),
                          audit_dir=str(tmp_path / "audit"))
    assert (r["parse_method"], r["raw_score"]) == ("score_line", 8.0) and math.isclose(r["score"], 8 / 9)
    (body,) = judge.bodies
    assert body["include_stop_str_in_output"] is True and "Score: 8" in body["stop"]
    assert body["max_tokens"] == 1500 and "prompt" in body  # the reference's raw-prompt completions call
