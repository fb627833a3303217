"""PHI guard, issue 40: a patient's SURNAME alone identifies the patient where it is written as a person's name
(after a title, as `SURNAME, J.` / `Surname, Given`, as a possessive), after the guard's canonicalisation;
a surname that is an ordinary English word is flagged only after a title or before an initial, and a bare
surname never (see identifiers.find_surnames)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from llmrnn import cohort
from tests.test_phi_guard import guard, make_bundle, write_splits

# three names from the notes: a rare surname, one that is an ordinary word, one that is a disease's eponym
NOTE_HEADERS = ("Name: Johanna Quist  MRN: 44519023\n", "Patient: Peter White\n", "Name: Anna Parkinson\n")
SURNAME_KIND = "cohort identifier (surname of a name in the clinical text)"


@pytest.fixture(scope="module")
def cohort_splits(tmp_path_factory) -> list[Path]:
    patients = cohort.synthesize_cohort(12, 3)
    for n, header in enumerate(NOTE_HEADERS):
        course = patients[n + 2]["visits"][0]["clinical_sections"]
        course["hospital_course"] = header + course["hospital_course"]
    return write_splits(tmp_path_factory.mktemp("splits"), patients)


@pytest.fixture
def bundle(tiny_model_dir, tmp_path) -> Path:
    return make_bundle(tiny_model_dir, tmp_path, {"run_name": "demo", "seed": 42})


def _card_findings(bundle: Path, files: list[Path], line: str) -> list[str]:
    (bundle / "README.md").write_text(f"# card\n\nTrained with GRPO.\n\n{line}\n")
    return guard(bundle, files)["findings"]


@pytest.mark.parametrize("written", [
    "Mrs. Quist was admitted.",
    "mrs quist was admitted.",
    "Seen by DR. QUIST on the ward.",
    "Discussed with Ms J. Quist.",
    "pt Quist improved.",
    "Sample output: QUIST, J. (re-admitted)",
    "quist, j",
    "Quist, Maria was admitted.",
    "Quist's daughter called.",
    "QUIST\u2019S daughter called.",
    "Mrs. **Quist** was admitted.",  # markup: the rendered page reads `Mrs. Quist`
    "Mrs. Qu<wbr>ist was admitted.",
    "Mrs. Qu\u200bist was admitted.",  # an invisible character inside the name
    "Mrs. Qu\u0456st was admitted.",  # Cyrillic i: a homoglyph
    "Mr. White was admitted.",  # an ordinary word, after a title
    "Sample output: WHITE, P.",  # ... and before an initial
    "Discussed with Patient White.",
    "Mrs Parkinson was admitted.",
])
def test_a_surname_written_as_a_persons_name_is_refused_with_its_line(bundle, cohort_splits, written):
    findings = _card_findings(bundle, cohort_splits, written)
    finding = next((f for f in findings if f.startswith("README.md")), None)
    assert finding and finding.startswith(f"README.md: {SURNAME_KIND}") or \
        finding and finding.startswith(f"README.md (rendered): {SURNAME_KIND}"), findings
    assert finding.endswith("line 5"), findings
    for value in ("quist", "white", "parkinson", "johanna", "peter"):
        assert value not in " ".join(findings).lower()  # the kind and where, never the value


@pytest.mark.parametrize("written", [
    "Quist is not named.",  # a bare surname: no title, initial or possessive makes it a person's name
    "White matter lesions; white, grey and red cells; White's law.",  # an ordinary word, bare/possessive/listed
    "Latency 10 ms. White noise was added.",  # `ms` after a number is milliseconds, not a title
    "The patient white cell count rose.",  # lower case after `patient`: the word, not the name
    "Parkinson's disease and Parkinson's law are named after people, not this patient.",  # an eponym
    "Quistclose trusts; Whiteley, J.",  # another word that merely starts like a surname
])
def test_a_surname_used_as_an_ordinary_word_passes(bundle, cohort_splits, written):
    assert _card_findings(bundle, cohort_splits, written) == []


def test_a_surname_from_a_qa_record_is_refused(bundle, tmp_path):
    record = {"id": "q-1", "id_generated": True, "question": "Name: Johanna Quist. What rhythm is shown?",
              "options": ["sinus rhythm", "atrial flutter"], "answer": "A"}
    split = tmp_path / "train.jsonl"
    split.write_text(json.dumps(record) + "\n")
    (bundle / "README.md").write_text("# card\nAn example answer for Mrs. Quist.\n")
    findings = guard(bundle, [split], split_format="qa")["findings"]
    assert any(f.startswith("README.md: QA data identifier (surname of a name in the question)")
               and f.endswith("line 2") for f in findings), findings
