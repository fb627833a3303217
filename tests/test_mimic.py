"""`llmrnn cohort build` on PhysioNet-shaped files: round trip, header variants, order, leakage, bad input."""

from __future__ import annotations

import csv
import gzip
import io as stdio
import json
import stat
from pathlib import Path

import pytest
import yaml

from llmrnn import cli
from llmrnn.cohort import synthesize_cohort
from llmrnn.mimic import sections, synth
from llmrnn.mimic.build import folder_problems
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
                             "discharge.csv.gz: row 1: hadm_id: 1 of 1 notes (100.0%) have a hadm_id in no row of "
                             "admissions, more than max_orphan_share 0.01: hosp/ and note/ are likely from mismatched "
                             "releases"),
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
