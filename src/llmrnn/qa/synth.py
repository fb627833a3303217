"""A small multiple-choice QA set made from the project's synthetic cohort (the qa demo's data).

One question per visit with a discharge diagnosis: the chief complaint and history -> the primary
diagnosis among four options (the right one + three distractors from the cohort's vocabulary, seeded).
Questions whose primary diagnosis is an acute, non-recurring condition are held out as the OOD set
(never trained on), so `sampling_pass@k` on them shows transfer rather than recall.
"""

from __future__ import annotations

import random

from llmrnn.cohort import ACUTE, CHRONIC

LETTERS = "ABCD"


def _vocabulary() -> list[str]:
    terms = set(CHRONIC) | set(ACUTE)
    for complications in CHRONIC.values():
        terms.update(complications)
    return sorted(terms)


def questions_from_cohort(patients: list[dict], seed: int, max_questions: int | None = None) -> tuple[list, list]:
    """(in-distribution, ood) lists of records {id, question, options, answer, reasoning, group}."""
    rng = random.Random(seed)
    vocab = _vocabulary()
    acute = set(ACUTE)
    ind, ood = [], []
    for patient in patients:
        for visit in patient["visits"]:
            sections = visit["clinical_sections"]
            lines = [ln.split(". ", 1)[-1].strip() for ln in sections["discharge_diagnosis"].splitlines()]
            if not lines or not lines[0]:
                continue
            primary = lines[0]
            distractors = rng.sample([t for t in vocab if t not in lines], 3)
            choices = [primary, *distractors]
            rng.shuffle(choices)
            letter = LETTERS[choices.index(primary)]
            record = {
                "id": f"{patient['subject_id']}-{visit['visit_number']}",
                "question": (
                    f"A patient with {sections['past_medical_history']} presents with "
                    f"{sections['chief_complaint']}. What is the most likely primary discharge diagnosis?"
                ),
                "options": dict(zip(LETTERS, choices)),
                "answer": letter,
                "reasoning": f"{sections['chief_complaint'].capitalize()} points to {primary}.",
                "group": str(patient["subject_id"]),
            }
            (ood if primary in acute else ind).append(record)
    if max_questions:
        ind = ind[:max_questions]
    return ind, ood
