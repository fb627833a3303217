"""Property: whatever spelling, case, colon, line end, order and sub-labels a discharge summary is written
in, no text written after admission reaches a shown section, and the admission text does.

The notes are assembled from this file's own lists of how MIMIC-IV-Note summaries spell their headers and
sub-labels (not from llmrnn.mimic.sections' tables, nor llmrnn.mimic.synth): LATE is planted in every part
written after admission (discharge-time sections, later exams, later draws, studies, micro, the stay told
inside the HPI, later medication lists), KEEP<section> in admission text that must reach its section.
Bounded and derandomized (a fixed sequence of examples, no example database), so CI sees the same notes.
"""

from __future__ import annotations

import json

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from llmrnn.mimic import sections

CASES = (str, str.upper, str.lower, str.title)
COLONS = (":", " :", "", ":  ", "\t:", ":\t")
TRAILING = ("", " ", "\t", "  ")
LINE_ENDS = ("\n", "\r\n", "\r")

HEADERS = {
    "chief_complaint": ("Chief Complaint", "Chief Complaints", "CC", "Reason for Admission"),
    "history_present_illness": ("History of Present Illness", "HPI", "History of the Present Illness",
                                "Present Illness"),
    "past_medical_history": ("Past Medical History", "PMH", "Past Medical/Surgical History", "Medical History"),
    "social_history": ("Social History", "Social Hx"),
    "family_history": ("Family History", "Family Hx"),
    "physical_exam": ("Physical Exam", "Physical Examination"),
    "pertinent_results": ("Pertinent Results", "Pertinent Labs"),
    "hospital_course": ("Brief Hospital Course", "Hospital Course", "Summary of Hospital Course"),
    "admission_medications": ("Medications on Admission", "Admission Medications", "Meds on Admission",
                              "Home Medications", "Medications Prior to Admission", "Preadmission Medications",
                              "Medication on Admission"),
    "discharge_medications": ("Discharge Medications", "Discharge Medication", "Medications at Discharge",
                              "Medications on Discharge", "Discharge Meds"),
    "discharge_disposition": ("Discharge Disposition", "Disposition"),
    "discharge_diagnosis": ("Discharge Diagnosis", "Discharge Diagnoses", "Diagnoses at Discharge", "Discharge Dx"),
    "discharge_condition": ("Discharge Condition", "Condition at Discharge"),
    "discharge_instructions": ("Discharge Instructions",),
    "followup_instructions": ("Followup Instructions", "Follow-up Instructions", "Follow up Instructions"),
}
ADMISSION_BLOCK = ("chief_complaint", "history_present_illness", "past_medical_history", "social_history",
                   "family_history", "physical_exam", "pertinent_results")
DISCHARGE_BLOCK = ("discharge_medications", "discharge_disposition", "discharge_diagnosis", "discharge_condition",
                   "discharge_instructions", "followup_instructions")

SYSTEMS = ("VS", "Vitals", "GEN", "General", "HEENT", "Neck", "CV", "Cardiac", "Lungs", "Pulm", "Abd", "Abdomen",
           "Ext", "Extremities", "Neuro", "Skin", "Psych", "Rectal exam", "Neuro exam", "Back", "GU")
EXAM_FINDING_TEXTS = ("NAD", "clear to auscultation bilaterally", "soft, non-tender", "RRR, no murmurs", "no edema",
            "A&Ox3", "warm and dry", "supple, no JVD", "guaiac negative", "moving all extremities")
ADMISSION_EXAM_LABELS = ("ADMISSION EXAM", "Admission Physical Exam", "ON ADMISSION", "Exam on admission",
                         "ADMISSION PHYSICAL EXAMINATION", "Physical exam on admission", "Admission", "On presentation")
LATER_EXAM_LABELS = ("DISCHARGE EXAM", "Discharge Physical Exam", "D/C EXAM", "Exam on discharge", "Day of discharge",
                     "TRANSFER EXAM", "Floor admission exam", "MICU admission exam", "Exam at time of death",
                     "Physical exam on day of discharge", "PRIOR TO DISCHARGE", "Upon discharge", "___ exam",
                     "Dischrge exam", "CALLOUT EXAM", "Exam on transfer to floor", "DEATH EXAM")
ADMISSION_LAB_LABELS = ("ADMISSION LABS", "Labs on admission", "Admission labs", "LABS ON ADMISSION",
                        "Admission Laboratory Results", "ADMISSION LABORATORY DATA")
LATER_RESULT_LABELS = ("DISCHARGE LABS", "Labs on discharge", "IMAGING", "MICRO", "Microbiology", "___ CXR",
                       "___ CHEST (PA & LAT)", "GRAM STAIN (Final ___)", "Echocardiogram ___", "TTE ___", "EGD ___",
                       "CT abd/pelvis ___", "PATHOLOGY", "FINDINGS", "IMPRESSION", "Interval labs", "STUDIES",
                       "Labs prior to transfer", "Other labs", "Colonoscopy ___", "Paracentesis ___",
                       "TRANSTHORACIC ECHOCARDIOGRAM", "C. difficile DNA amplification assay (Final ___)",
                       "Blood Culture, Routine (Final ___)", "PERTINENT IMAGING", "Pertinent studies", "ECG",
                       "Urine culture")
STAY_LABELS = ("MICU COURSE", "MICU Course", "Summary of MICU stay", "ICU course", "Hospital Course",
               "Floor course", "CCU COURSE", "Events", "SICU course", "Course in the ICU", "Transfer summary")
LATER_MED_LABELS = ("NEW MEDICATIONS", "CHANGED", "STOPPED", "Inpatient medications", "Medications on transfer",
                    "Medications:", "Discharge meds", "STOP taking")


@st.composite
def header(draw, section: str) -> str:
    spelling = draw(st.sampled_from(CASES))(draw(st.sampled_from(HEADERS[section])))
    return spelling + draw(st.sampled_from(COLONS)) + draw(st.sampled_from(TRAILING))


@st.composite
def label(draw, names: tuple[str, ...], cases=CASES) -> str:
    """A sub-label: alone on its line (colon or none), or with its text after a colon."""
    text = draw(st.sampled_from(cases))(draw(st.sampled_from(names)))
    return text + draw(st.sampled_from((":", "", " :", ":\t"))) + draw(st.sampled_from(TRAILING))


@st.composite
def exam_lines(draw, marker: str) -> list[str]:
    lines = []
    for i in range(draw(st.integers(1, 4))):
        system = draw(st.sampled_from(SYSTEMS))
        finding = draw(st.sampled_from(EXAM_FINDING_TEXTS))
        lines.append(f"{system}: {finding} {marker}" if i == 0 else f"{system}: {finding}")
    return lines


@st.composite
def physical_exam(draw) -> str:
    lines = []
    if draw(st.booleans()):
        lines.append(draw(label(ADMISSION_EXAM_LABELS)))
    lines += draw(exam_lines("KEEPPE"))
    for _ in range(draw(st.integers(0, 3))):
        lines.append(draw(st.sampled_from(("", " "))))
        later = draw(label(LATER_EXAM_LABELS))
        if draw(st.booleans()):
            lines.append(later + " LATE")  # the label with its text on the line
        else:
            lines.append(later)
            lines += [f"{x} LATE" for x in draw(exam_lines(""))]
            if draw(st.booleans()):
                lines.append("Patient seen and examined; lungs clear LATE.")
    return "\n".join(lines)


def _lab_line(stamp: str, values: str) -> str:
    return f"___ {stamp} BLOOD {values}"


@st.composite
def pertinent_results(draw) -> str:
    lines = []
    if draw(st.booleans()):
        lines.append(draw(label(ADMISSION_LAB_LABELS)))
    if draw(st.booleans()):
        lines.append("=" * draw(st.integers(3, 20)))
    first = draw(st.sampled_from(("07:20PM", "11:05AM", "09:45PM")))
    lines.append(_lab_line(first, "WBC-15.2* RBC-4.51 Hgb-13.9* Keeplab-1.0"))
    lines.append("MCH-30.8 MCHC-33.9 RDW-12.9 Plt ___")
    lines.append(_lab_line(first, "Glucose-110* UreaN-14 Creat-0.9 Na-138"))
    if draw(st.booleans()):
        lines.append(_lab_line(draw(st.sampled_from(("06:10AM", "05:30AM", "04:15PM"))), "WBC-8.1 LATE-1"))
        lines.append("Hgb-10.1 LATE-2")  # the later draw's wrapped line
    for _ in range(draw(st.integers(0, 3))):
        lines.append(draw(st.sampled_from(("", " "))))
        later = draw(label(LATER_RESULT_LABELS))
        if draw(st.booleans()):
            lines.append(later + " Interval improvement LATE")
        else:
            lines.append(later)
            lines.append(draw(st.sampled_from(("No growth to date LATE", "___ 06:40AM BLOOD WBC-7.1 LATE-3",
                                               "1. No acute process. LATE", "LVEF 55% LATE", "2+ PMNs LATE"))))
    return "\n".join(lines)


@st.composite
def hpi(draw) -> str:
    lines = ["Ms. ___ is a ___ woman with COPD who presents with dyspnea KEEPHPI.",
             "In the ED, initial vitals were 98.4 102 130/70 24 89% RA."]
    if draw(st.booleans()):
        lines.append(draw(st.sampled_from(("ED Course: given nebs", "ROS:", "REVIEW OF SYSTEMS:"))))
        lines.append("Denies chest pain.")
    if draw(st.booleans()):
        lines.append(draw(st.sampled_from(("", " "))))
        stay = draw(label(STAY_LABELS, cases=(str, str.upper, str.title)))
        lines += [stay + " LATE"] if draw(st.booleans()) else [stay, "She was intubated LATE and extubated."]
    return "\n".join(lines)


@st.composite
def admission_medications(draw) -> str:
    lines = ["The Preadmission Medication list is accurate and complete.",
             "1. Tiotropium 18 mcg IH DAILY KEEPMED", "2. Furosemide 20 mg PO DAILY"]
    if draw(st.booleans()):
        lines.append(draw(st.sampled_from(("", " "))))
        lines.append(draw(label(LATER_MED_LABELS, cases=(str, str.upper, str.title))))
        lines.append("1. PredniSONE 40 mg PO DAILY LATE")
    return "\n".join(lines)


BODIES = {
    "chief_complaint": "shortness of breath KEEPCC",
    "past_medical_history": "- COPD on 2L home O2 KEEPPMH\n- CHF, EF 60%",
    "social_history": "___ KEEPSH",
    "family_history": "Non-contributory KEEPFH",
    "hospital_course": "# COPD exacerbation LATE: treated with steroids.\nPast medical history: LATE",
    "discharge_medications": "1. PredniSONE 40 mg PO DAILY LATE",
    "discharge_disposition": "Home LATE",
    "discharge_diagnosis": "Primary: COPD exacerbation\nSecondary: CHF",
    "discharge_condition": "Stable LATE",
    "discharge_instructions": "Dear Ms. ___, LATE\nMedications on admission: LATE",
    "followup_instructions": "___ LATE",
}
KEEP = {"chief_complaint": "KEEPCC", "history_present_illness": "KEEPHPI", "past_medical_history": "KEEPPMH",
        "social_history": "KEEPSH", "family_history": "KEEPFH", "physical_exam": "KEEPPE",
        "pertinent_results": "Keeplab-1.0", "admission_medications": "KEEPMED"}


@st.composite
def note(draw) -> str:
    bodies = {**BODIES, "history_present_illness": draw(hpi()), "physical_exam": draw(physical_exam()),
              "pertinent_results": draw(pertinent_results()), "admission_medications": draw(admission_medications())}
    order = list(draw(st.permutations(ADMISSION_BLOCK)))
    later = ["hospital_course", "admission_medications"]
    if draw(st.booleans()):
        later.reverse()  # Medications on Admission before the course, as some notes have it
    blank = draw(st.sampled_from(("\n \n", "\n\n", "\n")))
    parts = [(" \nName:  ___                 Unit No:   ___\n \nAdmission Date:  ___     Discharge Date:   ___\n"
             " \nDate of Birth:  ___       Sex:   F\n \nService: MEDICINE\n \nAllergies: \nPenicillins\n \n"
             "Attending: ___.\n \nMajor Surgical or Invasive Procedure:\nIntubation LATE\n")]
    for section in order + later + list(DISCHARGE_BLOCK):
        parts.append(f"{draw(header(section))}\n{bodies[section]}")
    return draw(st.sampled_from(LINE_ENDS)).join(blank.join(parts).split("\n")) + "\n"


@settings(max_examples=150, derandomize=True, database=None, deadline=None,
          suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])
@given(note())
def test_no_later_text_reaches_a_shown_section_and_admission_text_does(text):
    split = sections.split_note(text)
    shown = {k: split.sections.get(k, "") for k in sections.ADMISSION_TIME}
    assert "LATE" not in json.dumps(shown) + (split.sections.get("allergies") or ""), shown
    for section, marker in KEEP.items():
        assert marker in shown[section], (section, shown[section])
    assert sections.diagnosis_target(split.sections.get("discharge_diagnosis")) == (["COPD exacerbation", "CHF"], None)
