"""Robust JSON extraction from model outputs and the role output shapes."""

from __future__ import annotations

import json

import pytest

from llmrnn import jsonparse
from llmrnn.jsonparse import parse_evaluation, parse_json, parse_memory, parse_prediction


@pytest.mark.parametrize(
    ("text", "expected", "method"),
    [
        ('{"a": 1}', {"a": 1}, "plain"),
        ('  \n{"a": [1, 2]}\n', {"a": [1, 2]}, "plain"),
        ('Here you go:\n```json\n{"a": 1}\n```\nDone.', {"a": 1}, "fenced"),
        ('```\n{"a": "x"}\n```', {"a": "x"}, "fenced"),
        ('Sure! {"a": {"b": 2}} Hope this helps.', {"a": {"b": 2}}, "braces"),
        ('{"a": 1} and then {"b": 2}', {"a": 1}, "balanced"),
        ('text {"a": "a } brace in a string"} tail }', {"a": "a } brace in a string"}, "balanced"),
        ("", None, "unparsable"),
        (None, None, "unparsable"),
        ("no json here", None, "unparsable"),
        ('{"a": 1', None, "unparsable"),
        ('{"evolving_summary": "cut off mid', None, "unparsable"),
        ('{"top_5_diagnoses": ["sepsis", "aki", "pneumo', {"top_5_diagnoses": ["sepsis", "aki"]}, "repaired"),
        ('{"a": "x", "b": {"c": ["d", "e', {"a": "x", "b": {"c": ["d"]}}, "repaired"),
    ],
)
def test_parse_json_cases(text, expected, method):
    assert parse_json(text) == (expected, method)


def test_parse_json_never_raises_on_garbage():
    for text in ["{" * 5000, "}{" * 100, "```json\n{bad}\n```", "\x00\x01{", '{"a": NaN}']:
        _, method = parse_json(text)
        assert method in {"plain", "fenced", "braces", "balanced", "repaired", "unparsable"}


def test_parse_prediction_normalises():
    pred, method = parse_prediction(
        'Answer: {"top_5_diagnoses": ["a", {"diagnosis": "b"}, "c", "d", "e", "f"], "primary_diagnosis": "a"}'
    )
    assert method == "braces"
    assert pred == {"top_5_diagnoses": ["a", "b", "c", "d", "e"], "primary_diagnosis": "a"}
    pred, _ = parse_prediction('{"top_5_diagnoses": ["x", "y"]}')
    assert pred["primary_diagnosis"] == "x"
    assert parse_prediction('{"foo": 1}') == (None, "missing:top_5_diagnoses")
    assert parse_prediction("[1, 2]") == (None, "not_object")
    # a copied format placeholder is no diagnosis
    assert parse_prediction('{"top_5_diagnoses": ["...", "..."], "primary_diagnosis": "..."}')[0] is None


def test_parse_evaluation_booleans_and_nested_shape():
    ev, _ = parse_evaluation('{"primary_correct": "false", "any_top5_correct": true, "missed_diagnoses": "x; y"}')
    assert ev["primary_correct"] is False and ev["any_top5_correct"] is True
    assert ev["missed_diagnoses"] == ["x", "y"]
    nested = {"diagnosis_evaluation": {"primary_correct": True, "any_top5_correct": False}}
    ev, _ = parse_evaluation(json.dumps(nested))
    assert ev["primary_correct"] is True and ev["any_top5_correct"] is True  # primary implies top-5
    assert parse_evaluation('{"primary_correct": "maybe", "any_top5_correct": true}')[0] is None


def test_parse_memory():
    assert parse_memory('{"evolving_summary": " CHF, CKD. "}') == ("CHF, CKD.", "plain")
    assert parse_memory('{"summary": "x"}') == (None, "missing:evolving_summary")
    assert parse_memory('{"evolving_summary": ""}') == (None, "missing:evolving_summary")
    assert parse_memory("plain prose memory") == (None, "unparsable")
    h = jsonparse.memory_json('He said "hi"')
    assert json.loads(h) == {"evolving_summary": 'He said "hi"'}
