"""Admission-time text fails closed: what the splitter cannot place is withheld, never shown.

Notes here are written the way MIMIC-IV-Note discharge summaries are (the `___` blanks, pasted lab dumps,
micro and study reports, sub-labels in any case with or without a colon), not by llmrnn.mimic.synth.
LATE marks text written after admission (it must reach no shown section); KEEP marks admission-time text
(it must reach its section). One test per class of the issue, then layouts of our own.
"""

from __future__ import annotations

import json
import re

import pytest

from llmrnn import cli
from llmrnn.mimic import audit, sections
from tests.test_mimic import _build, _write_tables

SHOWN = sections.ADMISSION_TIME

HEAD = (" \nName:  ___                     Unit No:   ___\n \nAdmission Date:  ___              Discharge Date:   ___\n"
        " \nDate of Birth:  ___             Sex:   F\n \nService: MEDICINE\n \nAllergies: \nPenicillins\n \n"
        "Attending: ___.\n \nChief Complaint:\nshortness of breath\n \n"
        "Major Surgical or Invasive Procedure:\nnone\n \n")
HPI = ("History of Present Illness:\nMs. ___ is a ___ woman with COPD who presents with 3 days of dyspnea KEEP1.\n"
       "In the ED, initial vitals: 98.4 102 130/70 24 89% RA. She was given nebs.\n \n")
HISTORY = ("Past Medical History:\n- COPD on 2L home O2\n- CHF, EF 60%\n \nSocial History:\n___\n"
           "Family History:\nNon-contributory\n \n")
EXAM = ("Physical Exam:\nADMISSION EXAM:\nVS: 98.4 130/70 102 24 89% RA\nGEN: tachypneic KEEP2\n"
        "LUNGS: diffuse wheezes\nEXT: no edema\n \n")
RESULTS = ("Pertinent Results:\nADMISSION LABS:\n___ 09:10PM BLOOD WBC-11.2* RBC-4.01 Hgb-12.2 Hct-37.0 MCV-92\n"
           "MCH-30.4 MCHC-33.0 RDW-13.1 Plt ___\n___ 09:10PM BLOOD Glucose-140* UreaN-18 Creat-0.9 Na-137 K-4.2\n \n")
COURSE = "Brief Hospital Course:\nMs. ___ was treated for a COPD exacerbation LATE1 with steroids.\n \n"
MEDS = "Medications on Admission:\n1. Tiotropium 18 mcg IH DAILY KEEP3\n2. Furosemide 20 mg PO DAILY\n \n"
TAIL = ("Discharge Medications:\n1. PredniSONE 40 mg PO DAILY LATE2\n \nDischarge Disposition:\nHome\n \n"
        "Discharge Diagnosis:\nCOPD exacerbation\n \nDischarge Condition:\nStable LATE3\n \n"
        "Discharge Instructions:\nDear Ms. ___, LATE4\n \nFollowup Instructions:\n___\n")


def _note(hpi: str = HPI, exam: str = EXAM, results: str = RESULTS, course: str = COURSE, meds: str = MEDS,
          tail: str = TAIL) -> str:
    return HEAD + hpi + HISTORY + exam + results + course + meds + tail


def _shown(note: str) -> dict[str, str]:
    split = sections.split_note(note)
    return {k: split.sections[k] for k in SHOWN if k in split.sections}


def _late(shown: dict) -> list[str]:
    return sorted(set(re.findall(r"LATE\d*", json.dumps(shown))))


def _kept(shown: dict) -> list[str]:
    return sorted(set(re.findall(r"KEEP\d*", json.dumps(shown))))


def _assert_fails_closed(note: str, keep=("KEEP1", "KEEP2", "KEEP3")) -> dict[str, str]:
    shown = _shown(note)
    assert _late(shown) == [], (_late(shown), shown)
    assert set(keep) <= set(_kept(shown)), (_kept(shown), shown)
    return shown


def test_the_reference_layout_keeps_its_admission_text():
    shown = _assert_fails_closed(_note())
    assert shown["physical_exam"].splitlines() == ["VS: 98.4 130/70 102 24 89% RA", "GEN: tachypneic KEEP2",
                                                    "LUNGS: diffuse wheezes", "EXT: no edema"]
    assert shown["pertinent_results"].count("09:10PM BLOOD") == 2 and "Plt ___" in shown["pertinent_results"]


# ----------------------------------------------------------------------------- class 1: sub-labels
LATER_EXAMS = {
    "title case, no colon": "Discharge Exam\nGEN: comfortable LATE5\n",
    "day of discharge": "Day of discharge\nVS: 98.0 118/70 76 18 95% RA LATE5\n",
    "lower case with colon": "discharge physical exam:\nLungs: clear LATE5\n",
    "on discharge, label and text": "On discharge: lungs clear LATE5\n",
    "exam on day of transfer": "Exam on day of transfer\nGEN: intubated LATE5\n",
    "prose after the exam": "Patient seen and examined on the day of discharge, LATE5 lungs clear.\n",
    "dated exam": "___ exam:\nLungs: clear LATE5\n",
    "a unit in a system line": "Gen (MICU): sedated LATE5\n",
    "vitals on discharge": "Vitals on discharge: 98.1 LATE5\n",
    "pre-discharge": "PRE-DISCHARGE EXAM:\nGen: LATE5\n",
    "exam on the floor": "Exam on floor:\nLungs: LATE5\n",
    "a numbered later exam": "2) Discharge exam: LATE5\n",
    "last day": "Last day exam:\nGen: LATE5\n",
}
WRAPPED = {
    "a lower-case label wrapped on": "repeat exam the next day: clear LATE5\n",
    "a later day in a system line": "Wound: staples removed on POD 3 LATE5\n",
    "a label with no blank line before": "DISCHARGE:\nGen: LATE5\n",
}


@pytest.mark.parametrize("later", list(WRAPPED.values()), ids=list(WRAPPED))
def test_a_later_line_right_under_the_admission_exam_is_withheld(later):
    _assert_fails_closed(_note(exam=EXAM.rstrip(" \n") + "\n" + later + " \n"))


@pytest.mark.parametrize("later", list(LATER_EXAMS.values()), ids=list(LATER_EXAMS))
def test_a_later_exam_is_withheld_whatever_its_label_looks_like(later):
    _assert_fails_closed(_note(exam=EXAM + later + " \n"))


def test_crlf_line_ends_read_as_lf():
    note = _note(exam=EXAM + "DISCHARGE EXAM\nGEN: comfortable LATE5\n \n")
    crlf = note.replace("\n", "\r\n")
    shown = _assert_fails_closed(crlf)
    assert shown == _shown(note) and "\r" not in json.dumps(shown)
    assert _shown(note.replace("\n", "\r")) == _shown(note)  # old Mac line ends too


LATER_RESULTS = {
    "gram stain pasted": "GRAM STAIN (Final ___): 2+ PMNs LATE5\nRESPIRATORY CULTURE (Final ___): LATE6\n",
    "c difficile assay": "C. difficile DNA amplification assay (Final ___):\nNegative LATE5\n",
    "date before the study": "___ CXR: Interval improvement of the effusion LATE5\n",
    "dated chest film": "___ CHEST (PA & LAT)\nFINDINGS: No focal consolidation LATE5\nIMPRESSION: LATE6\n",
    "echo with a date": "Echocardiogram ___: LVEF 55% LATE5\n",
    "echo in capitals": "TRANSTHORACIC ECHOCARDIOGRAM\nThe left atrium is normal LATE5\n",
    "egd": "EGD ___: Gastritis LATE5\n",
    "colonoscopy": "Colonoscopy ___: Diverticulosis LATE5\n",
    "paracentesis": "Paracentesis ___: 4 L removed LATE5\n",
    "bronchoscopy": "Bronchoscopy ___: mucus plugging LATE5\n",
    "a later draw": "___ 06:05AM BLOOD WBC-7.9 Hgb-11.0 LATE5-1\n",
    "discharge labs lower case": "discharge labs\n___ 06:05AM BLOOD WBC-7.9\n",
    "a study in prose": "CTA was negative for PE LATE5\n",
    "labs without a label": "Na 140 K 4.0\nRepeat lactate 1.1 LATE5\n",
    "mri with a date": "___ MRI HEAD W/O CONTRAST: no infarct LATE5\n",
    "ct, date after": "CT HEAD W/O CONTRAST ___: LATE5\n",
    "portable tte": "Portable TTE (Complete) Done ___ at 10:00 LATE5\n",
    "urine culture": "URINE CULTURE (Final ___): NO GROWTH. LATE5\n",
    "mrsa screen": "MRSA SCREEN (Final ___): No MRSA isolated. LATE5\n",
    "cardiac cath": "Cardiac cath ___: LATE5\n",
    "ercp": "ERCP ___: LATE5\n",
    "a study with a time stamp": "___ 10:15AM CHEST X-RAY LATE5\n",
    "a culture with a time stamp": "___ 07:20PM BLOOD CULTURE positive LATE5\n",
    "a study name and a blank": "CXR ___\nIMPRESSION: LATE5\n",
    "labs prior to discharge": "Labs prior to discharge:\nWBC 8 LATE5\n",
    "a trend": "Trend: Cr 0.9 -> 1.4 LATE5\n",
    "the same clock time another day": "___ 09:10PM BLOOD WBC-3.1 LATE5-1\n",
}


@pytest.mark.parametrize("later", list(LATER_RESULTS.values()), ids=list(LATER_RESULTS))
def test_results_keep_only_the_first_draw_and_withhold_every_study(later):
    shown = _assert_fails_closed(_note(results=RESULTS + later + " \n"))
    assert "Glucose-140*" in shown["pertinent_results"]


# ----------------------------------------------------------------------------- class 2: header spellings
@pytest.mark.parametrize("header", ["Brief Hospital Course", "BRIEF HOSPITAL COURSE", "Hospital Course\t",
                                    "Brief Hospital Course:   ", "brief hospital course :"])
def test_the_course_header_in_any_spelling_ends_the_results(header):
    note = _note(course=COURSE.replace("Brief Hospital Course:", header))
    split = sections.split_note(note)
    assert "LATE1" in split.sections["hospital_course"]
    _assert_fails_closed(note)


@pytest.mark.parametrize("header", ["DISCHARGE MEDICATIONS", "Medications at Discharge:", "Discharge Medication:",
                                    "MEDICATIONS ON DISCHARGE", "Discharge Meds", "Medications upon discharge:"])
def test_the_discharge_medications_header_in_any_spelling_ends_the_admission_list(header):
    note = _note(tail=TAIL.replace("Discharge Medications:", header))
    split = sections.split_note(note)
    assert "LATE2" in split.sections["discharge_medications"]
    assert split.sections["admission_medications"].endswith("Furosemide 20 mg PO DAILY")
    _assert_fails_closed(note)


@pytest.mark.parametrize("header", ["DISCHARGE DIAGNOSES", "Diagnoses at discharge:", "Discharge Diagnosis\t:"])
def test_the_target_header_in_any_spelling_is_found(header):
    split = sections.split_note(_note(tail=TAIL.replace("Discharge Diagnosis:", header)))
    assert sections.diagnosis_target(split.sections.get("discharge_diagnosis")) == (["COPD exacerbation"], None)


# ----------------------------------------------------------------------------- class 3: "admission" that is not
@pytest.mark.parametrize("label", ["FLOOR ADMISSION EXAM:", "Admission exam on arrival to the floor:",
                                   "MICU ADMISSION EXAM", "Exam on admission to CCU:"])
def test_an_admission_exam_of_a_later_unit_is_withheld(label):
    exam = EXAM + f"{label}\nGEN: sleeping LATE5\nLUNGS: clear\n \n"
    _assert_fails_closed(_note(exam=exam))


# ----------------------------------------------------------------------------- class 4: the stay inside the HPI
@pytest.mark.parametrize("stay", [
    "MICU COURSE\nShe was intubated LATE5 and extubated on HD 3.\n",
    "Summary of MICU stay: intubated LATE5, weaned.\n",
    "ICU Course:\nLATE5 pressors.\n",
    "Hospital course:\nLATE5\n",
    "On arrival to the floor: LATE5 saturating well.\n",
    "Since admission: LATE5\n",
    "Overnight events:\nLATE5\n",
    "Clinical course: LATE5\n",
    "micu summary:\nLATE5\n",
    "Upon arrival to the MICU: LATE5\n",
])
def test_the_stay_written_into_the_hpi_is_withheld(stay):
    shown = _assert_fails_closed(_note(hpi=HPI.rstrip(" \n") + "\n" + stay + " \n"))
    assert shown["history_present_illness"].endswith("She was given nebs.")


def test_an_ed_course_and_a_review_of_systems_stay_in_the_hpi():
    hpi = HPI.rstrip(" \n") + "\nED Course: given nebs KEEP4\nREVIEW OF SYSTEMS:\nDenies chest pain KEEP5\n \n"
    _assert_fails_closed(_note(hpi=hpi), keep=("KEEP1", "KEEP4", "KEEP5"))


@pytest.mark.parametrize("label", ["NEW MEDICATIONS:", "CHANGED", "Inpatient medications:", "STOPPED:",
                                   "Medications:", "Medications on Transfer:", "Active Medication list as of ___:",
                                   "Discharge Medications (new)"])
def test_a_medication_list_that_is_not_the_admission_one_ends_it(label):
    _assert_fails_closed(_note(meds=MEDS.rstrip(" \n") + f"\n{label}\nPrednisone LATE5\n \n"))


# ----------------------------------------------------------------------------- class 5: targets
def test_an_abbreviated_genus_is_not_a_list_marker():
    assert sections.diagnosis_target("Primary: E. coli urinary tract infection\nSecondary:\nC. difficile colitis\n"
                                     "H. pylori gastritis") == (
        ["E. coli urinary tract infection", "C. difficile colitis", "H. pylori gastritis"], None)
    assert sections.diagnosis_target("A. Sepsis\nB. Anemia\nc) hypokalemia") == (["Sepsis", "Anemia", "hypokalemia"],
                                                                                 None)


@pytest.mark.parametrize("body", ["Expired", "1. Expired", "Patient expired", "AMA", "Deceased", "Left AMA"])
def test_a_disposition_alone_is_an_empty_target_with_its_reason(body):
    assert sections.diagnosis_target(body) == ([], "only a disposition (Expired, AMA, ...)")


def test_a_disposition_beside_diagnoses_is_dropped_and_counted_in_the_build(tmp_path):
    assert sections.diagnosis_target("Primary:\nSeptic shock\nExpired") == (["Septic shock"], None)
    expired = _note(tail=TAIL.replace("Discharge Diagnosis:\nCOPD exacerbation", "Discharge Diagnosis:\nExpired"))
    _write_tables(tmp_path, [("a", 10, 100, 1, _note()), ("b", 10, 101, 1, expired)])
    rc, _, report, _ = _build(tmp_path, tmp_path, {"min_visits": 1})
    assert rc == 0 and report["targets"]["empty: only a disposition (Expired, AMA, ...)"] == 1


# ----------------------------------------------------------------------------- class 6: over-withholding
def test_system_labels_with_exam_in_them_keep_the_admission_exam():
    exam = ("Physical Exam:\nVS: 98.4 130/70 102 24 89% RA\nGEN: NAD\nRectal exam: guaiac negative KEEP2\n"
            "Neuro exam: A&Ox3, CN II-XII intact KEEP6\nEXT: no edema KEEP7\nskin: warm\n \n")
    shown = _assert_fails_closed(_note(exam=exam), keep=("KEEP2", "KEEP6", "KEEP7"))
    assert shown["physical_exam"].endswith("skin: warm")


# ----------------------------------------------------------------------------- class 7: the audit
def test_the_audit_sees_procedures_studies_and_micro_but_not_a_historys_own_results(tmp_path, capsys):
    cohort = [{"subject_id": 1, "visits": [{"visit_id": 1, "visit_number": 1, "sex": "F", "clinical_sections": {
        "discharge_diagnosis": "1. Sepsis",
        "procedures": "Right heart catheterization\nParacentesis\nIntubation\nPICC line placement",
        "pertinent_results": "GRAM STAIN (Final ___): 2+ PMNs\n___ CXR: Interval improvement\nEGD ___: gastritis",
        "past_medical_history": "CHF, EF 60%\nCOPD",
        "chief_complaint": "fever"}}]}]
    summary = audit.audit_cohort(cohort)
    assert summary["procedures"]["procedure_phrase"] == 1
    assert summary["pertinent_results"]["result_phrase"] == 1
    assert summary["past_medical_history"]["any"] == 0
    for study in ("___ CHEST (PA & LAT)", "FINDINGS: no consolidation", "Colonoscopy ___: polyp",
                  "C. difficile DNA amplification assay (Final ___): negative", "Bronchoscopy ___: plugging"):
        assert audit.visit_signals(study, None, section="pertinent_results") & {"result_phrase",
                                                                                "procedure_phrase"}, study


def test_the_build_counts_the_lines_it_withheld_as_unplaced_per_section(tmp_path):
    odd = _note(exam=EXAM + "Patient seen and examined, lungs clear\nGEN: comfortable\n \n")
    _write_tables(tmp_path, [("a", 10, 100, 1, _note()), ("b", 10, 101, 1, odd)])
    rc, _, report, _ = _build(tmp_path, tmp_path, {"min_visits": 1})
    assert rc == 0
    exam = report["leak_audit"]["physical_exam"]
    assert exam["unplaced_lines"] == 2 and exam["visits_with_unplaced_lines"] == 1
    assert report["withheld_parts"]["physical_exam:unplaced_lines"] == 2
    assert report["leak_audit"]["chief_complaint"]["unplaced_lines"] == 0


def test_the_audit_never_prints_a_section_name_it_does_not_know(tmp_path, capsys):
    """Issue 49: a clinical_sections key can hold patient text; the audit shows it as `other`."""
    name = "Zephyrine Quoxley MRN 40412345"
    cohort = [{"subject_id": 1, "visits": [{"visit_id": 1, "visit_number": 1, "sex": "F", "clinical_sections": {
        "discharge_diagnosis": "1. Sepsis", "chief_complaint": "fever", name: "discharged home"}}]}]
    path = tmp_path / "cohort.json"
    path.write_text(json.dumps(cohort))
    out = tmp_path / "audit.json"
    assert cli.main(["cohort", "audit", "--cohort", str(path), "--out", str(out)]) == 0
    printed = capsys.readouterr().out
    assert "Zephyrine" not in printed and "40412345" not in printed and "Zephyrine" not in out.read_text()
    assert re.search(r"^other\s+1\s+1 \(100%\)", printed, re.MULTILINE), printed


# ----------------------------------------------------------------------------- layouts of our own
MIMIC_DUMP = """Pertinent Results:
ADMISSION LABS
==============
___ 07:15PM BLOOD WBC-8.7 RBC-3.98* Hgb-12.1 Hct-36.5 MCV-92 MCH-30.4
MCHC-33.2 RDW-13.5 RDWSD-45.3 Plt ___
___ 07:15PM BLOOD Neuts-68.4 ___ Monos-7.0 Eos-1.2
Baso-0.5 Im ___ AbsNeut-5.93 AbsLymp-1.97 AbsMono-0.61
___ 07:15PM BLOOD Glucose-101* UreaN-16 Creat-0.8 Na-139
K-4.3 Cl-101 HCO3-24 AnGap-14
___ 07:15PM BLOOD cTropnT-<0.01 proBNP-2450*
___ 07:15PM URINE Color-Yellow Appear-Clear Sp ___
___ 07:15PM URINE Blood-NEG Nitrite-NEG Protein-NEG

IMAGING
=======
___ CTA CHEST:
1. No pulmonary embolism. LATE5

MICROBIOLOGY
============
___ 8:00 pm BLOOD CULTURE      Source: Venipuncture.
   Blood Culture, Routine (Pending): LATE6

DISCHARGE LABS
==============
___ 06:20AM BLOOD WBC-6.5 RBC-3.70* LATE7-1

"""


def test_a_mimic_style_lab_dump_keeps_the_admission_draw_only():
    shown = _assert_fails_closed(_note(results=MIMIC_DUMP))
    results = shown["pertinent_results"]
    assert "AbsMono-0.61" in results and "K-4.3 Cl-101" in results and "Protein-NEG" in results
    split = sections.split_note(_note(results=MIMIC_DUMP))
    assert split.withheld["pertinent_results:imaging"] == 1 and split.withheld["pertinent_results:microbiology"] == 1


TRANSFER_NOTE_EXAM = """Physical Exam:
ADMISSION PHYSICAL EXAM:
========================
Vitals- T 99.1, BP 98/60, HR 110, RR 22, O2 sat 91% 4L NC
General: ill-appearing KEEP2
HEENT: dry mucous membranes
Neck: JVP not elevated
CV: tachycardic, no murmurs
Lungs: rhonchi at the right base
Abdomen: soft, non-tender
GU: foley in place
Ext: warm, 2+ pulses
Neuro: A&Ox2

MICU DISCHARGE / FLOOR TRANSFER EXAM:
Vitals- T 98.0 LATE5
General: comfortable

DISCHARGE PHYSICAL EXAM:
Vitals: 98.2 LATE6
"""


def test_a_micu_to_floor_note_keeps_the_admission_exam_only():
    shown = _assert_fails_closed(_note(exam=TRANSFER_NOTE_EXAM))
    assert shown["physical_exam"].splitlines()[-1] == "Neuro: A&Ox2"


def test_an_expired_patients_note_shows_nothing_from_the_stay():
    exam = EXAM + "Physical exam at time of death:\nNo heart sounds. No spontaneous respirations LATE5\n \n"
    tail = TAIL.replace("Discharge Diagnosis:\nCOPD exacerbation", "Discharge Diagnosis:\nDeceased")
    shown = _assert_fails_closed(_note(exam=exam, tail=tail))
    assert "No heart sounds" not in json.dumps(shown)
    assert sections.diagnosis_target(sections.split_note(_note(tail=tail)).sections["discharge_diagnosis"])[0] == []


WRAPPED_EXAM = """Physical Exam:
ADMISSION PHYSICAL EXAM:
========================
VITALS: 98.2 PO 128 / 72 L Lying 78 18 96 RA
GENERAL: Alert and interactive. In no acute distress.
HEENT: NCAT. PERRL, EOMI. Sclera anicteric and without injection.
MMM.
CARDIAC: Regular rhythm, normal rate. Audible S1 and S2. No
murmurs/rubs/gallops.
LUNGS: Clear to auscultation bilaterally. No wheezes, rhonchi or
rales. No increased work of breathing.
ABDOMEN: Normal bowels sounds, non distended, non-tender to deep
palpation in all four quadrants. No organomegaly.
NEUROLOGIC: AOx3. CN2-12 intact. ___ strength throughout. Normal
sensation. KEEP2

DISCHARGE PHYSICAL EXAM:
VS: 98.0 LATE5
"""


def test_an_exam_wrapped_at_the_note_width_is_kept_whole():
    """Lines wrapped from a long exam line (`MMM.`, `Normal\nsensation.`) continue it; they are no labels."""
    shown = _assert_fails_closed(_note(exam=WRAPPED_EXAM))
    assert shown["physical_exam"].endswith("sensation. KEEP2") and "MMM." in shown["physical_exam"]


def test_a_wrapped_capitalised_word_does_not_end_the_hpi():
    hpi = ("History of Present Illness:\nMs. ___ is a ___ woman with a long history of severe\nCOPD.\n"
           "She presents with dyspnea KEEP1.\n \n")
    _assert_fails_closed(_note(hpi=hpi))
