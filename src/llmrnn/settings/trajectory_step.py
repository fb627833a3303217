"""The trajectory step: what a reward sees of a trajectory parquet row.

Every row of RUN/trajectories/{train,val}.parquet carries one step as JSON text in `reward_model.ground_truth`;
verl and TRL hand that text to the reward as its `ground_truth` argument (llmrnn's own `compute_score`, and
your reward file's). `llmrnn.trajectories` builds each step through this model and the reward reads it back
through it, so a row that lacks a field, or holds one of another type, is one line naming the row and the
field instead of a KeyError (or a silently empty judge prompt) somewhere inside a training step.

The field table of docs/rewards.md is generated from these models (`llmrnn config schema --write`).
"""

from __future__ import annotations

import json
from typing import Any

from pydantic import BaseModel, ConfigDict, Field, ValidationError

from llmrnn.errors import InputError


class _Strict(BaseModel):
    # strict: a visit index "3" or a parse flag "yes" is a wrong row, not something to coerce; forbid: a
    # misspelled key is refused by its name
    model_config = ConfigDict(extra="forbid", strict=True)


class Prediction(_Strict):
    """A parsed diagnosis prediction (llmrnn.jsonparse.parse_prediction); empty when unparsable."""

    top_5_diagnoses: list[str] = Field(description="the prediction model's top diagnoses, at most 5",
                                       examples=[["heart failure", "copd"]])
    primary_diagnosis: str = Field(description="its primary diagnosis", examples=["heart failure"])


class Evaluation(_Strict):
    """A parsed evaluation of a prediction (llmrnn.jsonparse.parse_evaluation, or the matcher's fallback)."""

    primary_correct: bool = Field(description="the primary diagnosis is one of the visit's", examples=[False])
    any_top5_correct: bool = Field(description="one of the top 5 is one of the visit's", examples=[True])
    missed_diagnoses: list[str] = Field(description="the visit's diagnoses the prediction missed",
                                        examples=[["acute kidney injury"]])
    why_missed: str = Field(description="the evaluation model's reason (empty from the fallback matcher)",
                            examples=["the creatinine rise was not weighed"])
    improvement_suggestions: str = Field(description="what the memory should carry (empty from the fallback)",
                                         examples=["track renal function"])


class ParseOk(_Strict):
    """Whether each model output behind the step parsed (False: a fallback was used)."""

    prediction: bool = Field(description="visit t's prediction parsed", examples=[True])
    evaluation: bool = Field(description="visit t's evaluation parsed (else the matcher's)", examples=[True])
    memory: bool = Field(description="the memory update parsed (else h_ref is h_prev)", examples=[True])
    next_prediction: bool = Field(description="visit t+1's prediction parsed", examples=[True])
    next_evaluation: bool = Field(description="visit t+1's evaluation parsed", examples=[False])


class TrajectoryStep(_Strict):
    """One step t of a patient's forward pass: the memory update at visit t and what visit t+1 showed."""

    patient_id: str = Field(description="the patient (also extra_info.patient_id)", examples=["90000000"])
    visit_index: int = Field(ge=0, description="t, the visit whose memory update this row trains (0..n-3)",
                             examples=[0])
    visit_id: str = Field(description="visit t's id (also extra_info.visit_id)", examples=["900000000"])
    update_prompt: str = Field(description="the memory update's user message (the row's prompt, last turn)",
                               examples=["Current memory: ... New visit: ... Answer with JSON"])
    h_prev: str = Field(description='the memory before visit t, as JSON text {"evolving_summary": ...}',
                        examples=['{"evolving_summary": ""}'])
    h_ref: str = Field(description="the reference memory: what the base memory model wrote at visit t "
                                   "(pairwise mode's opponent)",
                       examples=['{"evolving_summary": "CKD stage 3; watch potassium."}'])
    visit: dict[str, Any] = Field(description="visit t's cohort record (llmrnn.cohort)",
                                  examples=[{"visit_id": 900000000, "visit_number": 1,
                                            "clinical_sections": {"chief_complaint": "chest pressure"}}])
    next_visit: dict[str, Any] = Field(description="visit t+1's cohort record", examples=[{"visit_id": 900000001, "visit_number": 2}])
    prediction: Prediction = Field(description="visit t's prediction")
    evaluation: Evaluation = Field(description="visit t's evaluation")
    next_prediction: Prediction = Field(description="visit t+1's prediction (made with h_ref)")
    next_evaluation: Evaluation = Field(description="visit t+1's evaluation")
    ground_truth_diagnoses: list[str] = Field(description="visit t's discharge diagnoses",
                                              examples=[["pneumonia", "hypertension"]])
    next_ground_truth_diagnoses: list[str] = Field(
        description="visit t+1's discharge diagnoses: the outcome reward is the share the memory names",
        examples=[["heart failure", "chronic kidney disease stage 3"]])
    parse_ok: ParseOk = Field(description="which model outputs behind this step parsed")

    def to_ground_truth(self) -> str:
        """The step as the parquet's reward_model.ground_truth (JSON text, non-ASCII kept as is)."""
        return json.dumps(self.model_dump(mode="json"), ensure_ascii=False)


STEP_KEYS: tuple[str, ...] = tuple(TrajectoryStep.model_fields)


def _step_error(exc: ValidationError, where: str) -> InputError:
    """One line for the first problem of a step: `where` (file and row), the field's dotted path, why."""
    err = exc.errors()[0]
    field = ".".join(str(part) for part in err["loc"])
    got = "" if err["type"] == "missing" else f" (got {err.get('input')!r:.80})"
    return InputError(f"{where}: reward_model.ground_truth.{field}: {err['msg']}{got}")


def read_step(ground_truth: Any, where: str) -> TrajectoryStep:
    """The step of a row's ground truth (its JSON text, or the mapping already read), or one InputError line
    naming `where` (the row) and the field."""
    if isinstance(ground_truth, str):
        try:
            ground_truth = json.loads(ground_truth)
        except json.JSONDecodeError as exc:
            raise InputError(f"{where}: reward_model.ground_truth: not JSON: {exc}") from None
    if not isinstance(ground_truth, dict):
        raise InputError(f"{where}: reward_model.ground_truth: expected a JSON object (a trajectory step), "
                         f"got {type(ground_truth).__name__}")
    try:
        return TrajectoryStep.model_validate(ground_truth)
    except ValidationError as exc:
        raise _step_error(exc, where) from None
