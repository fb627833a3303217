"""`llmrnn cohort build` on PhysioNet-shaped files: round trip, header variants, order, leakage, bad input."""

from __future__ import annotations

import csv
import gzip
import io as stdio
import json
import re
import stat
from pathlib import Path

import pytest
import yaml

from llmrnn import cli
from llmrnn.cohort import synthesize_cohort
from llmrnn.mimic import sections, synth
from llmrnn.mimic.tables import folder_problems
from llmrnn.prompts import load_prompts

REPO = Path(__file__).resolve().parents[1]
MARKER = "ZZLEAKZZ"


def _build(tmp_path: Path, root: Path, cfg: dict | None = None) -> tuple[int, list | None, dict | None, str]:
    out, report = tmp_path / "out" / "cohort.json", tmp_path / "out" / "build_report.json"
    argv = ["cohort", "build", "--hosp", str(root / "hosp"), "--note", str(root / "note"), "--out", str(out),
            "--report", str(report), "--cfg", json.dumps(cfg or {})]
    rc = cli.main(argv)
    cohort = json.loads(out.read_text()) if out.exists() else None
    rep = json.loads(report.read_text()) if report.exists() else None
    return rc, cohort, rep, str(out)


def _without(patients: list[dict], drop=("hospital_course", "procedures")) -> list[dict]:
    return [{"subject_id": p["subject_id"],
             "visits": [{**v, "clinical_sections": {k: x for k, x in v["clinical_sections"].items() if k not in drop}}
                        for v in p["visits"]]} for p in patients]


@pytest.mark.parametrize("diagnoses", ["note", "icd"])
def test_round_trip_gives_the_synthetic_cohort_back(tmp_path, diagnoses):
    """Visits (ids, order, numbers), sex, allergies and every section but the withheld hospital course and
    procedures (both written during the stay)."""
    patients = synthesize_cohort(12, seed=7)
    synth.write(patients, 7, tmp_path / "src")
    rc, cohort, report, out = _build(tmp_path, tmp_path / "src", {"diagnoses": diagnoses})
    assert rc == 0
    assert cohort == _without(patients)
    assert stat.S_IMODE(Path(out).stat().st_mode) == 0o600
    counts = report["counts"]
    assert counts["patients_dropped_fewer_than_min_visits"] == 3  # the one-visit patients
    assert counts["notes_unused_later_note_of_admission"] == 1  # the addendum
    assert counts["admissions_without_note"] >= 1
    assert report["patients_out"] == 12 and report["visits_out"] == sum(len(p["visits"]) for p in patients)


def test_demo_config_builds_the_cohort_the_demo_used():
    """config/config.yaml builds from the synthetic PhysioNet files of cohort.synthetic: the same patients."""
    cfg = yaml.safe_load((REPO / "config/config.yaml").read_text())["cohort"]
    assert cfg["source"] == "mimic_iv"
    assert cfg["mimic_iv"]["hosp"] == "resources/cohort/mimic_iv_synthetic/hosp"
    from llmrnn.configcheck import cohort_is_synthetic

    assert cohort_is_synthetic(cfg)


def _note(diagnosis: str = "Primary:\n1. Pneumonia\n\nSecondary:\n- Hypertension\n- CKD", extra: str = "") -> str:
    return (
        " \nName:  ___                     Unit No:   ___\n \nAdmission Date:  ___   Discharge Date:   ___\n \n"
        "Date of Birth:  ___             Sex:   F\n \nService: MEDICINE\n \nAllergies: \nSulfa\n \n"
        "Attending: ___.\n \nCHIEF COMPLAINT:\ncough\n \nMajor Surgical or Invasive Procedure:\nNone\n\n"
        "history  of present illness :\nMs. ___ with cough.\n \nPAST MEDICAL HISTORY:\nHTN\n \n"
        "Social History:\n___\nFamily Hx:\nnone\n \nPhysical Exam:\nADMISSION EXAM:\nrales\n \n"
        f"DISCHARGE EXAM:\n{MARKER} clear\n \nPertinent Results:\nADMISSION LABS:\nWBC 14\n \n"
        f"Labs on discharge:\n{MARKER} WBC 8\n \nBrief Hospital Course:\n{MARKER} treated\n \n"
        f"Medications on Admission:\nlisinopril\n \nDischarge Medications:\n1. {MARKER}\n \n"
        f"Discharge Disposition:\nHome {MARKER}\n \n{extra}"
        f"Discharge Diagnoses:\n{diagnosis}\n \nDischarge Condition:\n{MARKER}\n \n"
        f"Discharge Instructions:\nDear Ms. ___, {MARKER}\n \nFollowup Instructions:\n{MARKER}\n"
    )


def _write_tables(root: Path, notes: list[tuple], admissions=None, patients=None, corrupt=None) -> None:
    """Five tables; notes: (note_id, subject_id, hadm_id, note_seq, text)."""
    admissions = admissions or [(10, 100, "2150-03-01 10:00:00"), (10, 101, "2150-01-01 10:00:00"),
                                (10, 102, "2150-05-01 10:00:00")]
    patients = patients or [(10, "F", 70)]
    tables = {
        "hosp/patients.csv.gz": [("subject_id", "gender", "anchor_age", "anchor_year", "anchor_year_group", "dod"),
                                 *[(s, g, a, 2150, "2014 - 2016", "") for s, g, a in patients]],
        "hosp/admissions.csv.gz": [("subject_id", "hadm_id", "admittime", "dischtime"),
                                   *[(s, h, t, t) for s, h, t in admissions]],
        "hosp/diagnoses_icd.csv.gz": [("subject_id", "hadm_id", "seq_num", "icd_code", "icd_version")],
        "hosp/d_icd_diagnoses.csv.gz": [("icd_code", "icd_version", "long_title")],
        "note/discharge.csv.gz": [("note_id", "subject_id", "hadm_id", "note_type", "note_seq", "charttime",
                                   "storetime", "text"),
                                  *[(n, s, h, "DS", q, "", "", t) for n, s, h, q, t in notes]],
    }
    for name, rows in tables.items():
        buf = stdio.StringIO()
        csv.writer(buf).writerows(rows)
        data = gzip.compress(buf.getvalue().encode())
        if corrupt and name == corrupt[0]:
            data = corrupt[1](data)
        (root / name).parent.mkdir(parents=True, exist_ok=True)
        (root / name).write_bytes(data)


def test_no_discharge_time_text_reaches_what_the_prompts_show(tmp_path):
    """A marker placed only in discharge-time text: absent from every section but the target, and from the
    visit as both prompt sets render it."""
    _write_tables(tmp_path, [("a", 10, 100, 1, _note()), ("b", 10, 101, 1, _note()),
                             ("c", 10, 102, 1, _note(diagnosis=f"{MARKER} sepsis"))])
    rc, cohort, report, _ = _build(tmp_path, tmp_path)
    assert rc == 0
    visits = cohort[0]["visits"]
    for visit in visits:
        shown = {k: v for k, v in visit["clinical_sections"].items() if k != "discharge_diagnosis"}
        assert MARKER not in json.dumps(shown) and MARKER not in str(visit["allergies"])
        for prompts in ("config/prompts/llmrnn.yaml", "config/prompts/demo.yaml"):
            assert MARKER not in load_prompts(REPO / prompts).render_visit(visit)
    assert visits[0]["clinical_sections"]["physical_exam"] == "rales"
    assert visits[0]["clinical_sections"]["pertinent_results"] == "WBC 14"
    assert MARKER in visits[2]["clinical_sections"]["discharge_diagnosis"]  # the target itself is kept
    assert MARKER not in json.dumps(report)  # counts only


def test_header_variants_order_and_diagnosis_sub_lists(tmp_path):
    _write_tables(tmp_path, [("a", 10, 102, 1, _note()), ("b", 10, 100, 1, _note(diagnosis="1) Sepsis\n2) AKI")),
                             ("c", 10, 101, 1, _note(diagnosis="Secondary:\nCKD\nPrimary: Stroke"))])
    rc, cohort, report, _ = _build(tmp_path, tmp_path)
    assert rc == 0
    visits = cohort[0]["visits"]
    assert [v["visit_id"] for v in visits] == [101, 100, 102]  # admittime order, not file order
    assert [v["visit_number"] for v in visits] == [1, 2, 3]
    assert [v["clinical_sections"]["discharge_diagnosis"] for v in visits] == [
        "1. Stroke\n2. CKD", "1. Sepsis\n2. AKI", "1. Pneumonia\n2. Hypertension\n3. CKD"]
    s = visits[0]["clinical_sections"]
    assert (s["chief_complaint"], s["history_present_illness"], s["past_medical_history"], s["family_history"]) == (
        "cough", "Ms. ___ with cough.", "HTN", "none")
    assert visits[0]["sex"] == "F" and visits[0]["allergies"] == "Sulfa"
    assert report["section_coverage"]["discharge_diagnosis"] == 3


@pytest.mark.parametrize("label", ["DISCHARGE LABS:", "Hospital Course by Systems:", "Discharge weight: 80 kg",
                                   "Transitional Issues / Discharge Plan:"])
def test_unknown_discharge_time_label_is_withheld_wherever_it_stands(label):
    """No blank line before it, inside a section whose labels are its own parts, or with text after it."""
    for section in ("History of Present Illness:", "Pertinent Results:", "Past Medical History:"):
        split = sections.split_note(f"{section}\nseen in clinic\n{label}\n{MARKER} text\nSocial History:\nalone\n")
        assert MARKER not in json.dumps({k: v for k, v in split.sections.items() if k in sections.KEPT}), (section, label)
        assert split.sections["social_history"] == "alone"


def test_unknown_header_is_counted_and_not_merged():
    split = sections.split_note("Chief Complaint:\ncough\n \nWeird Section:\nsecret text\n \nSocial History:\nalone\n")
    assert split.sections["chief_complaint"] == "cough"
    assert "secret" not in json.dumps(split.sections)
    assert split.unknown_headers == 1
    # a variant table entry is a header in any case and spacing
    for header in ("PAST MEDICAL HISTORY:", "Past Medical/Surgical History :", "past  medical history:"):
        assert sections.split_note(f"{header}\nHTN\n").sections == {"past_medical_history": "HTN"}


def test_a_note_without_diagnosis_gives_an_empty_diagnosis(tmp_path):
    text = _note().split("Discharge Diagnoses:")[0]
    _write_tables(tmp_path, [("a", 10, 100, 1, text), ("b", 10, 101, 1, _note())])
    rc, cohort, _, _ = _build(tmp_path, tmp_path)
    assert rc == 0 and cohort[0]["visits"][1]["clinical_sections"]["discharge_diagnosis"] == ""


BAD = {
    "missing file": (lambda root: (root / "hosp/patients.csv.gz").unlink(), "patients.csv.gz: missing"),
    "missing column": (lambda root: (root / "hosp/admissions.csv.gz").write_bytes(
        gzip.compress(b"subject_id,hadm_id\n10,100\n")), "row 0: header: column admittime missing"),
    "truncated gzip": (lambda root: (root / "note/discharge.csv.gz").write_bytes(
        (root / "note/discharge.csv.gz").read_bytes()[:-30]), "discharge.csv.gz: row"),
    "non-UTF-8": (lambda root: (root / "note/discharge.csv.gz").write_bytes(gzip.compress(
        b"note_id,subject_id,hadm_id,note_type,note_seq,charttime,storetime,text\n"
        b"a,10,100,DS,1,,,\"ok\"\nb,10,101,DS,1,,,\"caf\xe9\"\n")), "discharge.csv.gz: row 2: text: not UTF-8"),
    "hadm in no admission": (lambda root: _write_tables(root, [("a", 10, 999, 1, "x")]),
                             ("discharge.csv.gz: row 1: hadm_id: 1 of 1 notes (100.0%) have a hadm_id in no row of "
                             "admissions, more than max_orphan_share 0.01: hosp/ and note/ are likely from mismatched "
                             "releases")),
    "duplicate note id": (lambda root: _write_tables(root, [("a", 10, 100, 1, "x"), ("a", 10, 101, 1, "y")]),
                          "discharge.csv.gz: row 2: note_id: a appears twice"),
}


@pytest.mark.parametrize("case", sorted(BAD))
def test_bad_input_is_one_line_and_no_output(tmp_path, capsys, case):
    _write_tables(tmp_path, [("a", 10, 100, 1, _note()), ("b", 10, 101, 1, _note())])
    spoil, expected = BAD[case]
    spoil(tmp_path)
    rc, cohort, report, out = _build(tmp_path, tmp_path)
    err = capsys.readouterr().err.strip().splitlines()
    assert rc != 0 and cohort is None and report is None
    assert expected in err[-1], err
    assert not [p for p in Path(out).parent.iterdir()] if Path(out).parent.exists() else True


def test_check_names_a_missing_file_and_column(tmp_path):
    _write_tables(tmp_path, [("a", 10, 100, 1, "x")])
    assert folder_problems(tmp_path / "hosp", tmp_path / "note") == []
    (tmp_path / "note/discharge.csv.gz").unlink()
    (tmp_path / "hosp/patients.csv.gz").write_bytes(gzip.compress(b"subject_id,gender\n"))
    problems = folder_problems(tmp_path / "hosp", tmp_path / "note")
    assert len(problems) == 2 and "column anchor_age missing" in problems[0] and "discharge.csv.gz: missing" in problems[1]
    assert len(folder_problems(tmp_path / "hosp", tmp_path / "note", "icd")) == 2  # icd tables present here


def test_synth_files_have_the_real_layout(tmp_path):
    synth.write(synthesize_cohort(6, seed=1), 1, tmp_path)
    with gzip.open(tmp_path / "note/discharge.csv.gz", "rt", newline="") as fh:
        rows = list(csv.DictReader(fh))
    assert list(rows[0]) == list(synth.COLUMNS["note/discharge.csv.gz"])
    texts = [r["text"] for r in rows]
    assert all("___" in t for t in texts) and any("DISCHARGE EXAM:" in t for t in texts)
    assert len({t.split("Chief")[0] == t for t in texts}) == 2  # CHIEF COMPLAINT and Chief Complaint both occur


def test_llmrnn_check_reads_the_physionet_folder(tmp_path):
    from llmrnn.check import check_cohort

    _write_tables(tmp_path, [("a", 10, 100, 1, "x")])
    cohort = {"source": "mimic_iv", "mimic_iv": {"hosp": str(tmp_path / "hosp"), "note": str(tmp_path / "nowhere")}}
    expected = f"cohort.mimic_iv: {tmp_path}/nowhere/discharge.csv.gz: missing (MIMIC-IV-Note note/ discharge.csv.gz)"
    assert check_cohort({"cohort": cohort}) == [expected]
    cohort["mimic_iv"]["note"] = str(tmp_path / "note")
    assert check_cohort({"cohort": cohort}) == []


# ----------------------------------------------------------------------------- notes as real ones are written
# Hand-written the way MIMIC-IV-Note discharge summaries are (the `___` blanks, the template's header
# order, capitalised and mixed-case headers, lists), NOT by llmrnn.mimic.synth: the generator and the
# splitter must not share assumptions. LEAK<n> marks text written during the stay or at discharge.
SURGICAL = """ \nName:  ___                    Unit No:   ___
 \nAdmission Date:  ___              Discharge Date:   ___
 \nDate of Birth:  ___             Sex:   M
 \nService: SURGERY
 \nAllergies: \nPatient recorded as having No Known Allergies to Drugs
 \nAttending: ___.
 \nChief Complaint:\nRLQ abdominal pain
 \nMajor Surgical or Invasive Procedure:\n___: Laparoscopic appendectomy LEAK1
 \nHistory of Present Illness:\nMr. ___ is a ___ y/o M who presents with 1 day of periumbilical pain
migrating to the RLQ, anorexia and nausea. In the ED, T 100.9.
 \nPast Medical History:\n1. Hypertension\n2. Hyperlipidemia
 \nSocial History:\n___\nFamily History:\nMother with DM2. Father with CAD.
 \nPhysical Exam:\nADMISSION EXAM:\nVS: 100.9 130/80 98 16 98% RA\nGen: uncomfortable, NAD
Abd: soft, tender at McBurney's point, + rebound
 \nD/C EXAM:\nAbd: lap sites c/d/i LEAK2
 \nPertinent Results:\nADMISSION LABS:
___ 07:20PM BLOOD WBC-15.2* RBC-4.51 Hgb-13.9* Hct-41.0 MCV-91
MCH-30.8 MCHC-33.9 RDW-12.9 Plt ___
___ 07:20PM BLOOD Glucose-110* UreaN-14 Creat-0.9 Na-138
 \n___ 06:10AM BLOOD WBC-8.1 RBC-4.02 Hgb-12.0 LEAK3
 \nIMAGING:\nCT abd/pelvis ___: Dilated appendix with periappendiceal stranding LEAK4
 \nMICRO:\nBlood cultures ___: no growth LEAK5
 \nPATHOLOGY:\nDIAGNOSIS: Appendix, appendectomy: acute suppurative appendicitis LEAK6
 \nBrief Hospital Course:\nMr. ___ was admitted to the surgical service and taken to the OR LEAK7.
Past medical history: LEAK8 hypertension, stable.
Home medications:
LEAK9 lisinopril was held post-operatively.
 \nMedications on Admission:\nlisinopril 10 mg daily\natorvastatin 40 mg daily
 \nDischarge Medications:\n1. OxyCODONE (Immediate Release) 5 mg PO Q4H:PRN pain LEAK10
 \nDischarge Disposition:\nHome
 \nDischarge Diagnosis:\nPRIMARY\n==========\n1. Acute appendicitis\n \nSECONDARY\n==========\n- Hypertension
 \nDischarge Condition:\nMental Status: Clear and coherent.\nActivity Status: Ambulatory - Independent.
 \nDischarge Instructions:\nDear Mr. ___,\nYou were admitted for appendicitis LEAK11.
Allergies: LEAK12 none new.\nReason for admission: LEAK13 appendicitis.
 \nFollowup Instructions:\n___
"""

MEDICINE = """ \nName:  ___                   Unit No:   ___
 \nAdmission Date:  ___              Discharge Date:   ___
 \nDate of Birth:  ___             Sex:   F
 \nService: MEDICINE
 \nAllergies: \nSulfa (Sulfonamide Antibiotics)
 \nAttending: ___.
 \nCHIEF COMPLAINT:\nShortness of breath
 \nMAJOR SURGICAL OR INVASIVE PROCEDURE:\nIntubation LEAK20\nRight IJ central line placement LEAK21
 \nHISTORY OF PRESENT ILLNESS:\nMs. ___ is a ___ woman with CHF (EF 30%) and COPD who presents with
3 days of worsening dyspnea and ___ edema.
 \nPAST MEDICAL HISTORY:\n- CHF, EF 30%\n- COPD on 2L home O2\n- Atrial fibrillation on apixaban
 \nSOCIAL HISTORY:\n___\nFAMILY HISTORY:\nNon-contributory
 \nPHYSICAL EXAM:\nVS: 97.8 150/90 110 28 88% RA\nGEN: tachypneic, speaking in short sentences
Lungs: crackles to mid-fields bilaterally\n \nON ADMISSION:\nExt: 2+ pitting edema to knees
 \nTRANSFER EXAM:\nGEN: intubated, sedated LEAK22\n \nDischrge exam:\nLungs: clear LEAK23
 \nPhysical exam at time of death:\nNo pulse LEAK24
 \nPERTINENT RESULTS:\n___ 09:45PM BLOOD proBNP-12450*
___ 09:45PM BLOOD cTropnT-0.04*\n___ 04:30AM BLOOD proBNP-8010* LEAK25
 \nAdmission labs:\n___ 09:45PM BLOOD Na-131* K-5.1
 \nECHO ___: LVEF 20% LEAK26\n \nD/C LABS:\n___ 05:00AM BLOOD Na-136 LEAK27
 \nBRIEF HOSPITAL COURSE:\n# Acute on chronic systolic heart failure LEAK28: diuresed.
 \nMEDICATIONS ON ADMISSION:\nThe Preadmission Medication list is accurate and complete.
1. Furosemide 40 mg PO DAILY\n2. Apixaban 5 mg PO BID
 \nDISCHARGE MEDICATIONS:\n1. Furosemide 80 mg PO DAILY LEAK29
 \nDISCHARGE DISPOSITION:\nExtended Care\n \nFacility:\n___
 \nDischarge Dx:\nAcute on chronic systolic heart failure\nCOPD exacerbation
 \nDISCHARGE CONDITION:\nStable.
 \nDISCHARGE INSTRUCTIONS:\nDear Ms. ___,\nPast medical history: LEAK30.\nHome medications: LEAK31
 \nFOLLOWUP INSTRUCTIONS:\n___
"""


def _leaks(visit_or_split: dict) -> list[str]:
    return sorted(set(re.findall(r"LEAK\d+", json.dumps(visit_or_split))))


def test_shown_sections_hold_no_text_written_during_the_stay():
    """Classes 1-3 of the issue: procedures, results and exam parts, headers inside narrative."""
    for note in (SURGICAL, MEDICINE):
        split = sections.split_note(note)
        shown = {k: split.sections[k] for k in sections.ADMISSION_TIME if k in split.sections}
        assert _leaks(shown) == [], _leaks(shown)
        assert "LEAK" not in split.sections["allergies"]


def test_mixed_sections_keep_only_their_admission_parts():
    s = sections.split_note(SURGICAL)
    assert s.sections["physical_exam"] == ("VS: 100.9 130/80 98 16 98% RA\nGen: uncomfortable, NAD\n"
                                           "Abd: soft, tender at McBurney's point, + rebound")
    assert s.sections["pertinent_results"].splitlines() == [
        "___ 07:20PM BLOOD WBC-15.2* RBC-4.51 Hgb-13.9* Hct-41.0 MCV-91", "MCH-30.8 MCHC-33.9 RDW-12.9 Plt ___",
        "___ 07:20PM BLOOD Glucose-110* UreaN-14 Creat-0.9 Na-138"]
    assert s.withheld == {"physical_exam:discharge": 1, "pertinent_results:later_draw_lines": 1,
                          "pertinent_results:imaging": 1, "pertinent_results:microbiology": 1,
                          "pertinent_results:pathology": 1}
    m = sections.split_note(MEDICINE)
    # the opening block, then ON ADMISSION; transfer, misspelt discharge and death exams withheld
    assert m.sections["physical_exam"].splitlines() == [
        "VS: 97.8 150/90 110 28 88% RA", "GEN: tachypneic, speaking in short sentences",
        "Lungs: crackles to mid-fields bilaterally", " ", "Ext: 2+ pitting edema to knees"]
    assert {k: v for k, v in m.withheld.items() if k.startswith("physical_exam")} == {
        "physical_exam:transfer": 1, "physical_exam:discharge": 1, "physical_exam:death": 1}
    assert "Na-131* K-5.1" in m.sections["pertinent_results"]  # `Admission labs:` is kept
    assert m.withheld["pertinent_results:echo_ekg"] == 1 and m.withheld["pertinent_results:discharge"] == 1


def test_a_header_inside_narrative_does_not_reopen_a_shown_section():
    s = sections.split_note(SURGICAL)
    assert s.sections["past_medical_history"] == "1. Hypertension\n2. Hyperlipidemia"
    assert s.sections["admission_medications"] == "lisinopril 10 mg daily\natorvastatin 40 mg daily"
    assert s.sections["chief_complaint"] == "RLQ abdominal pain"
    assert s.sections["allergies"] == "Patient recorded as having No Known Allergies to Drugs"
    assert "LEAK8" in s.sections["hospital_course"] and "LEAK9" in s.sections["hospital_course"]
    assert "LEAK12" in s.sections["discharge_instructions"]
    assert s.repeated >= 4  # Past medical history:, Home medications:, Allergies:, Reason for admission:
    # out of the template's order: Medications on Admission before the course still ends at its header
    moved = SURGICAL.replace(" \nMedications on Admission:\nlisinopril 10 mg daily\natorvastatin 40 mg daily\n", "")
    moved = moved.replace(" \nBrief Hospital Course:", " \nMedications on Admission:\nlisinopril 10 mg daily\n"
                                                         " \nBrief Hospital Course:")
    assert sections.split_note(moved).sections["admission_medications"] == "lisinopril 10 mg daily"
    m = sections.split_note(MEDICINE)
    assert m.sections["admission_medications"].startswith("The Preadmission Medication list")
    assert "LEAK" not in m.sections["past_medical_history"] + m.sections["admission_medications"]


def test_procedures_and_hospital_course_are_shown_only_in_reference_mode(tmp_path):
    _write_tables(tmp_path, [("a", 10, 100, 1, SURGICAL), ("b", 10, 101, 1, MEDICINE)])
    rc, cohort, report, _ = _build(tmp_path, tmp_path)
    assert rc == 0 and _leaks(cohort) == []
    assert "procedures" not in report["shown_sections"] and report["leakage"] == []
    assert report["withheld_parts"]["pertinent_results:imaging"] == 1
    rc, ref, ref_report, _ = _build(tmp_path / "ref", tmp_path, {"mode": "reference"})
    assert rc == 0
    visit = ref[0]["visits"][1]["clinical_sections"]  # SURGICAL (admitted later)
    assert {"LEAK1", "LEAK3", "LEAK4", "LEAK7"} <= set(_leaks(visit))
    assert ref_report["leakage"] == ["procedures", "hospital_course", "physical_exam (whole, not cut to admission)",
                                     "pertinent_results (whole, not cut to admission)"]
    assert ref_report["shown_sections"]["hospital_course"].startswith("HIGH")


def test_reference_mode_prompts_show_the_course_and_every_result(tmp_path):
    """The prompts, not only the cohort: in reference mode the prediction prompt and the memory update (the
    policy's training prompt) show the hospital course, the procedures and the results whole, as the
    reference's did; in the default mode neither shows any text written during the stay."""
    from llmrnn.check import check_shown_sections

    _write_tables(tmp_path, [("a", 10, 100, 1, SURGICAL), ("b", 10, 101, 1, MEDICINE)])
    _, cohort, _, _ = _build(tmp_path, tmp_path)
    _, ref, _, _ = _build(tmp_path / "ref", tmp_path, {"mode": "reference"})
    prompts = load_prompts(REPO / "config/prompts/llmrnn.yaml")

    def rendered(visit: dict) -> str:
        x = prompts.render_visit(visit)
        values = {"memory": "none", "visit": x, "visit_number": 1, "prediction": "[]", "evaluation": "{}",
                  "missed_diagnoses": ""}
        return json.dumps(prompts.prediction.messages(values) + prompts.memory_update.policy_messages(values))

    surgical, medicine = (rendered(v) for v in ref[0]["visits"][::-1])  # SURGICAL was admitted later
    for leak in ("HOSPITAL COURSE: Mr. ___ was admitted to the surgical service and taken to the OR LEAK7",
                 "PROCEDURES: ___: Laparoscopic appendectomy LEAK1", "LEAK3", "IMAGING: CT abd/pelvis", "LEAK4"):
        assert surgical.count(leak) == 2, leak  # in the prediction prompt and in the memory update
    assert "PERTINENT RESULTS: ___ 09:45PM BLOOD proBNP-12450*" in medicine and "ECHO ___: LVEF 20% LEAK26" in medicine
    assert all("LEAK" not in rendered(v) for v in cohort[0]["visits"])
    reference = {"cohort": {"source": "mimic_iv", "mimic_iv": {"hosp": str(tmp_path / "hosp"),
                                                               "note": str(tmp_path / "note"), "mode": "reference"}}}
    assert check_shown_sections(reference) == []
    demo = {**reference, "prompts": {"file": str(REPO / "config/prompts/demo.yaml")}}
    assert check_shown_sections(demo) == [
        (f"prompts.file: {REPO}/config/prompts/demo.yaml: visit_sections lacks procedures, hospital_course, "
        "pertinent_results, which cohort.mimic_iv.mode reference shows: the prompts would not show them; add them "
        "to visit_sections")]
    chosen = {"cohort": {**reference["cohort"], "mimic_iv": {**reference["cohort"]["mimic_iv"], "mode": "admission_time",
                                                             "sections": ["chief_complaint", "hospital_course"]}},
              "prompts": demo["prompts"]}
    assert "lacks hospital_course, which cohort.mimic_iv.sections lists" in check_shown_sections(chosen)[0]
    assert check_shown_sections({**demo, "cohort": {**demo["cohort"], "mimic_iv": {
        **demo["cohort"]["mimic_iv"], "mode": "admission_time"}}}) == []  # the demo shows two sections by choice


def test_target_is_the_top_level_discharge_diagnosis_cleaned():
    """Class 4: not the pathology report's DIAGNOSIS:, no list labels or rules as names, Discharge Dx:."""
    s = sections.split_note(SURGICAL)
    assert sections.diagnosis_target(s.sections["discharge_diagnosis"]) == (["Acute appendicitis", "Hypertension"], None)
    m = sections.split_note(MEDICINE)
    assert sections.diagnosis_target(m.sections["discharge_diagnosis"]) == (
        ["Acute on chronic systolic heart failure", "COPD exacerbation"], None)
    assert sections.diagnosis_target("SECONDARY DIAGNOSES\n#1 Anemia\nPRIMARY DIAGNOSIS\n* Sepsis") == (
        ["Sepsis", "Anemia"], None)
    assert sections.diagnosis_target(None) == ([], "no section")
    assert sections.diagnosis_target(" \n") == ([], "empty section")
    assert sections.diagnosis_target("PRIMARY:\n=======\nSECONDARY:\n-----") == ([], "no diagnosis in the section")
    # without a Discharge Diagnosis section, the pathology DIAGNOSIS: inside the results is no target
    no_dx = SURGICAL.split(" \nDischarge Diagnosis:")[0]
    assert "discharge_diagnosis" not in sections.split_note(no_dx).sections


def test_empty_targets_are_counted_with_their_reason_and_cleaning_says_why(tmp_path, caplog):
    no_dx = SURGICAL.split(" \nDischarge Diagnosis:")[0]
    rules_only = SURGICAL.replace("1. Acute appendicitis", "").replace("- Hypertension", "")
    _write_tables(tmp_path, [("a", 10, 100, 1, no_dx), ("b", 10, 101, 1, rules_only), ("c", 10, 102, 1, MEDICINE)])
    rc, cohort, report, _ = _build(tmp_path, tmp_path)
    assert rc == 0
    assert report["targets"] == {"visits": 3, "empty: no section": 1, "empty: no diagnosis in the section": 1}
    import logging

    from llmrnn.cohort import clean_cohort

    with caplog.at_level(logging.INFO, logger="llmrnn.cohort"):
        kept, _ = clean_cohort(cohort)
    assert kept == [] and "patient 10 dropped: visit 0 (visit_id 101): discharge_diagnosis empty" in caplog.text


def test_orphan_notes_are_skipped_and_counted_below_the_limit(tmp_path, capsys):
    """Class 5: hosp/ and note/ of different releases."""
    notes = [("a", 10, 100, 1, SURGICAL), ("b", 10, 101, 1, MEDICINE), ("o", 10, 999, 1, SURGICAL)]
    _write_tables(tmp_path, notes)
    rc, cohort, report, _ = _build(tmp_path, tmp_path, {"max_orphan_share": 0.5})
    assert rc == 0 and report["counts"]["notes_skipped_orphan"] == 1 and report["visits_out"] == 2
    rc, cohort, report, _ = _build(tmp_path / "strict", tmp_path, {"max_orphan_share": 0.2})
    err = capsys.readouterr().err.strip().splitlines()
    assert rc != 0 and cohort is None and report is None
    assert "discharge.csv.gz: row 3: hadm_id: 1 of 3 notes (33.3%)" in err[-1] and "mismatched releases" in err[-1]


def _many(root: Path, n: int) -> None:
    """n patients of 1-4 visits; patient 5 has a visit without a target; icd rows: version 10 but patient 7."""
    notes, admissions, patients, dx = [], [], [], []
    for p in range(n):
        sid = 1000 + p
        patients.append((sid, "F", 60))
        for v in range(1 + p % 4):
            hadm = sid * 10 + v
            admissions.append((sid, hadm, f"2150-0{v + 1}-01 10:00:00"))
            text = SURGICAL.split(" \nDischarge Diagnosis:")[0] if (p, v) == (5, 1) else MEDICINE
            notes.append((f"n{hadm}", sid, hadm, 1, text))
            dx.append((sid, hadm, 1, "I509" if p != 7 else "4280", "10" if p != 7 else "9"))
    _write_tables(root, notes, admissions, patients)
    buf = stdio.StringIO()
    csv.writer(buf).writerows([("subject_id", "hadm_id", "seq_num", "icd_code", "icd_version"), *dx])
    (root / "hosp/diagnoses_icd.csv.gz").write_bytes(gzip.compress(buf.getvalue().encode()))


def test_selection_settings_sample_and_filter_patients(tmp_path):
    """Class 6: seeded max_patients (from patients whose every visit has a target), ICD version, max_visits."""
    _many(tmp_path, 24)
    rc, full, _, _ = _build(tmp_path / "a", tmp_path, {"min_visits": 1})
    assert rc == 0 and len(full) == 24
    ids = lambda cohort: [p["subject_id"] for p in cohort]
    _, one, r1, _ = _build(tmp_path / "b", tmp_path, {"min_visits": 1, "max_patients": 10, "patient_seed": 3})
    _, two, _, _ = _build(tmp_path / "c", tmp_path, {"min_visits": 1, "max_patients": 10, "patient_seed": 3})
    _, other, _, _ = _build(tmp_path / "d", tmp_path, {"min_visits": 1, "max_patients": 10, "patient_seed": 4})
    assert len(one) == 10 and ids(one) == ids(two) != ids(other) and 1005 not in ids(one) + ids(other)
    assert r1["counts"]["patients_not_eligible_for_sample_empty_target"] == 1
    assert r1["counts"]["patients_not_sampled"] == 13
    _, v10, r10, _ = _build(tmp_path / "e", tmp_path, {"min_visits": 1, "icd_version": 10})
    assert 1007 not in ids(v10) and len(v10) == 23 and r10["counts"]["patients_dropped_other_icd_version"] == 1
    _, short, rs, _ = _build(tmp_path / "f", tmp_path, {"min_visits": 2, "max_visits": 3})
    assert {len(p["visits"]) for p in short} == {2, 3} and rs["counts"]["patients_dropped_more_than_max_visits"] == 6


def test_workers_do_not_change_the_cohort(tmp_path):
    _many(tmp_path, 40)
    _, one, r1, out1 = _build(tmp_path / "a", tmp_path, {"workers": 1})
    _, two, r2, out2 = _build(tmp_path / "b", tmp_path, {"workers": 2})
    assert one == two and r1 == r2 | {"settings": r1["settings"]}
    assert Path(out1).read_bytes() == Path(out2).read_bytes()  # byte for byte, not only the same JSON


def test_each_patient_line_is_what_json_dumps_writes(tmp_path):
    """The main process composes a patient's line from the lines the workers encoded: it must be exactly
    json.dumps of the record (quotes, backslashes, tabs, accents, a null allergy and sex)."""
    odd = MEDICINE.replace("Shortness of breath", 'Shortness of "breath" \\ caf\u00e9\tnow').replace(
        " \nAllergies: \nSulfa (Sulfonamide Antibiotics)\n", "")
    _write_tables(tmp_path, [("a", 10, 100, 1, odd), ("b", 10, 101, 1, SURGICAL)], patients=[(10, "", 70)])
    rc, cohort, _, out = _build(tmp_path, tmp_path)
    text = Path(out).read_text(encoding="utf-8")
    assert rc == 0 and text.startswith("[\n") and text.endswith("\n]\n")
    lines = text[2:-3].split(",\n")
    assert len(lines) == len(cohort) == 1
    assert lines[0] == json.dumps(cohort[0], ensure_ascii=False)
    visit = cohort[0]["visits"][1]
    assert visit["sex"] is None and visit["allergies"] is None
    assert visit["clinical_sections"]["chief_complaint"] == 'Shortness of "breath" \\ caf\u00e9\tnow'


def test_audit_counts_discharge_time_signals_per_section(tmp_path, capsys):
    _write_tables(tmp_path, [("a", 10, 100, 1, SURGICAL), ("b", 10, 101, 1, MEDICINE)])
    rc, _, ref_report, ref_out = _build(tmp_path / "ref", tmp_path, {"mode": "reference"})
    _, _, report, _ = _build(tmp_path, tmp_path)
    assert rc == 0
    course = ref_report["leak_audit"]["hospital_course"]
    assert course["visits"] == 2 and course["target_verbatim"] == 2 and course["any"] == 2
    assert ref_report["leak_audit"]["procedures"]["procedure_phrase"] == 2  # appendectomy; intubation, line placement
    assert "hospital_course" not in report["leak_audit"] and "procedures" not in report["leak_audit"]
    assert report["leak_audit"]["pertinent_results"]["any"] == 0
    audit_json = tmp_path / "audit.json"
    assert cli.main(["cohort", "audit", "--cohort", ref_out, str(tmp_path / "out/cohort.json"),
                     "--out", str(audit_json)]) == 0
    printed = capsys.readouterr().out
    assert printed.splitlines()[0] == ref_out and printed.count("hospital_course") == 1
    assert printed.splitlines()[1].split()[:3] == ["section", "visits", "discharge_wording"]
    saved = json.loads(audit_json.read_text())["cohorts"]
    assert saved[ref_out]["hospital_course"]["target_verbatim"] == 2
    assert saved[ref_out]["pertinent_results"]["any"] > saved[str(tmp_path / "out/cohort.json")]["pertinent_results"]["any"] and "LEAK" not in audit_json.read_text()
    assert "LEAK" not in json.dumps(ref_report)
