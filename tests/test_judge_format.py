"""The scalar judge's format where vLLM can constrain it: its request carries vLLM's structured outputs for the
`Score: N` line (the real vLLM honouring it: tests/test_vllm.py); the parser's first score line is what the
constraint forces. Other engines and the logprob method get no constraint."""

from __future__ import annotations

import re

import yaml

from llmrnn.rubric import load_rubric, parse_scalar, scalar_request
from tests.conftest import REPO
from tests.judge_helpers import make_step


def _rubric(tmp_path, name: str, **request):
    raw = yaml.safe_load((REPO / "config/rubrics" / name).read_text())
    raw["request"].update(request)
    path = tmp_path / name
    path.write_text(yaml.safe_dump(raw))
    return load_rubric(path)


def test_a_vllm_text_judge_is_asked_for_its_score_line(tmp_path):
    rubric = _rubric(tmp_path, "rubric_v2_rubricarm_scalar.yaml")
    req = scalar_request(rubric, make_step(), "CLINICAL HISTORY: CKD 3.")
    regex = req.body["structured_outputs"]["regex"]
    assert "guided_regex" not in req.body  # vLLM >= 0.12 ignores it with a 200
    for answer, n in (("The memory names CKD.\nScore: 7", 7), ("Score: 9", 9), ("a\nb\nScore: 1", 1)):
        assert re.fullmatch(regex, answer), (regex, answer)
        assert parse_scalar(answer, rubric.scale_max).raw_score == n  # the constrained answer always parses
    for free in ("I think it is good.", "Score: 10", "Score: seven", "Score: 0", "score 5"):
        assert not re.fullmatch(regex, free), free


def test_after_a_score_prefix_only_the_number_is_allowed(tmp_path):
    rubric = _rubric(tmp_path, "smoke_smollm2_vllm.yaml", score_method="text", assistant_prefix="Score: ")
    regex = scalar_request(rubric, make_step(), "m").body["structured_outputs"]["regex"]
    assert [x for x in ("1", "5", "9", "10", " 5", "five") if re.fullmatch(regex, x)] == ["1", "5", "9"]


def test_no_constraint_for_logprob_scores_or_other_engines(tmp_path):
    expected = _rubric(tmp_path, "smoke_smollm2_vllm.yaml", score_method="expected")
    assert "structured_outputs" not in scalar_request(expected, make_step(), "m").body  # a mask would skew the digits
    cpu = load_rubric(REPO / "config/rubrics/outcome_v2_smollm2.yaml")  # our CPU server / transformers serve
    assert cpu.serving.engine != "vllm"
    assert "structured_outputs" not in scalar_request(cpu, make_step(), "m").body
