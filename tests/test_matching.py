"""Deterministic final judge: normalisation, synonyms, overlap threshold, Acc@1/Acc@5 grading."""

from __future__ import annotations

import pytest

from llmrnn.matching import Matcher, diagnosis_name, normalise


def test_normalise_numbering_case_punctuation_and_abbreviations():
    assert normalise("1. Congestive Heart-Failure.") == "congestive heart failure"
    assert normalise("CHF") == "congestive heart failure"
    assert normalise("Primary: A-fib") == "atrial fibrillation"
    assert normalise("  - Urinary tract infection (UTI)") == "urinary tract infection urinary tract infection"


@pytest.mark.parametrize(
    ("pred", "truth", "expected"),
    [
        ("CHF", "congestive heart failure", True),  # abbreviation
        ("Essential Hypertension", "essential hypertension", True),  # case
        ("hypertension", "essential hypertension", True),  # narrower term, Jaccard 1/2
        ("diabetic foot ulcers", "diabetic foot ulcer", True),  # plural
        ("pneumonia", "urinary tract infection", False),
        ("anemia", "", False),
        ("heart failure", "hip fracture", False),
    ],
)
def test_match(pred, truth, expected):
    assert Matcher().match(pred, truth) is expected


def test_threshold_is_configurable():
    assert not Matcher(threshold=0.6).match("hypertension", "essential hypertension")
    assert Matcher(threshold=0.5).match("hypertension", "essential hypertension")


def test_synonym_groups_from_config():
    m = Matcher(synonyms=[["myocardial infarction", "heart attack"]])
    assert m.match("heart attack", "MI")
    assert not Matcher().match("heart attack", "MI")


def test_grade_primary_target_first_vs_any():
    pred = {"primary_diagnosis": "hypertension", "top_5_diagnoses": ["anemia", "hypertension"]}
    truth = ["type 2 diabetes mellitus", "essential hypertension"]
    assert Matcher(primary_target="first").grade(pred, truth) == {"primary_correct": False, "any_top5_correct": True}
    assert Matcher(primary_target="any").grade(pred, truth) == {"primary_correct": True, "any_top5_correct": True}


def test_grade_reference_object_format_and_only_five_count():
    pred = {
        "primary_diagnosis": {"name": "COPD"},
        "top_5_diagnoses": [{"name": x} for x in ("a", "b", "c", "d", "e", "syncope")],
    }
    assert Matcher().grade(pred, ["chronic obstructive pulmonary disease"])["primary_correct"] is True
    assert Matcher().grade({**pred, "primary_diagnosis": "x"}, ["syncope"])["any_top5_correct"] is False


def test_grade_unparsable_prediction_is_wrong():
    assert Matcher().grade(None, ["anemia"]) == {"primary_correct": False, "any_top5_correct": False}
    assert diagnosis_name({"foo": 1}) == ""
