"""A small multiple-choice QA set made from the project's synthetic cohort (the qa demo's data).

One question per visit with a discharge diagnosis: the patient's OTHER conditions and a clinical clue ->
the primary diagnosis among four options (the right one + three distractors from the cohort's
vocabulary, seeded). What the demo's data must not measure:
- copying: a question never contains the text of its correct option (the primary is left out of the
  history, and the clue describes findings, never the diagnosis' name; `states_answer` checks every
  question and such a question is dropped);
- a letter habit: the correct letter cycles A, B, C, D over the questions, so always answering one
  letter is right about a quarter of the time (the evaluation reports that baseline beside every metric).
Questions whose primary diagnosis is an acute, non-recurring condition are held out as the OOD set
(never trained on): their clues are findings the model must map to a diagnosis it never saw as an
answer (transfer), and no question in the OOD set names its answer.
"""

from __future__ import annotations

import random

from llmrnn.cohort import ACUTE, CHRONIC, COMPLAINT
from llmrnn.qa.data import states_answer

LETTERS = "ABCD"

# Findings that point to a diagnosis without naming it (the cohort's own complaint for an acute or a
# chronic primary is "symptoms of <diagnosis>", which would hand over the answer).
CLUES = {
    "urinary tract infection": "dysuria, urinary frequency and suprapubic tenderness",
    "cellulitis of lower leg": "a red, warm, tender and swollen shin with fever",
    "syncope": "a brief loss of consciousness while standing, with full recovery within a minute",
    "small bowel obstruction": "colicky abdominal pain, bilious vomiting and no passage of flatus",
    "anemia": "fatigue, pallor and a hemoglobin of 7.9 g/dL",
    "hip fracture": "a fall onto the side with a shortened, externally rotated leg",
    "clostridioides difficile colitis": "profuse watery diarrhea a week after a course of clindamycin",
    "pulmonary embolism": "sudden pleuritic chest pain, tachycardia and hypoxia after a long flight",
    "type 2 diabetes mellitus": "polyuria, polydipsia and an HbA1c of 9.1%",
    "essential hypertension": "repeated blood pressures of 170/100 mmHg without end-organ damage",
    "chronic kidney disease stage 3": "a creatinine stable near 1.9 mg/dL for a year, eGFR 40",
    "congestive heart failure": "orthopnea, raised jugular venous pressure and an ejection fraction of 30%",
    "chronic obstructive pulmonary disease": "a long smoking history and fixed airflow obstruction on spirometry",
    "atrial fibrillation": "an irregularly irregular pulse without P waves on the ECG",
    "alcohol use disorder": "daily heavy drinking despite repeated harm and failed attempts to cut down",
    "coronary artery disease": "exertional chest tightness relieved by rest",
}


def _vocabulary() -> list[str]:
    terms = set(CHRONIC) | set(ACUTE)
    for complications in CHRONIC.values():
        terms.update(complications)
    return sorted(terms)


def clue_for(diagnosis: str) -> str | None:
    """What the question shows of the diagnosis: findings, never its name (None: no such clue)."""
    clue = CLUES.get(diagnosis) or COMPLAINT.get(diagnosis)
    return clue if clue and not states_answer(clue, diagnosis) else None


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
            clue = clue_for(primary)
            if clue is None:
                continue
            history = [c.strip() for c in sections["past_medical_history"].split(",")
                       if c.strip() and c.strip() != primary]
            known = f"a history of {', '.join(history)}" if history else "no known chronic conditions"
            question = (f"A patient with {known} presents with {clue}. "
                        "What is the most likely primary discharge diagnosis?")
            if states_answer(question, primary):
                continue
            distractors = rng.sample([t for t in vocab if t not in lines], 3)
            part = ood if primary in acute else ind
            letter = LETTERS[len(part) % len(LETTERS)]  # balanced letters: no always-"D" habit pays
            others = list(distractors)
            rng.shuffle(others)
            others.insert(LETTERS.index(letter), primary)
            record = {
                "id": f"{patient['subject_id']}-{visit['visit_number']}",
                "question": question,
                "options": dict(zip(LETTERS, others)),
                "answer": letter,
                "reasoning": f"{clue[0].upper()}{clue[1:]} points to {primary}.",
                "group": str(patient["subject_id"]),
            }
            part.append(record)
    if max_questions:
        ind = ind[:max_questions]
    return ind, ood
