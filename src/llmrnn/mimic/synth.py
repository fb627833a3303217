"""`llmrnn cohort synth --format mimic-iv`: a synthetic cohort written as PhysioNet files.

The five tables under OUT/hosp/ and OUT/note/ with MIMIC-IV's column names, and discharge summaries in
MIMIC-IV-Note's layout: the `___` header block, header variants in case, spacing and wording, Primary /
Secondary diagnosis sub-lists, ADMISSION / DISCHARGE parts of exam and results, discharge-time sections.
Built back with `llmrnn cohort build`, the cohort has the same patients, visits (ids, order, numbers), sex,
allergies and clinical_sections as `llmrnn cohort synth --format json` with the same --patients/--seed,
except what the build withholds as discharge-time text (hospital_course) and the record's
`synthetic` flag. The files also hold what the build must skip: patients with one visit, an admission
without a note, a later note (addendum) of an admission, notes without a Discharge Diagnosis section.
"""

from __future__ import annotations

import csv
import gzip
import random
from io import StringIO
from pathlib import Path

from llmrnn import io

COLUMNS = {
    "hosp/patients.csv.gz": ("subject_id", "gender", "anchor_age", "anchor_year", "anchor_year_group", "dod"),
    "hosp/admissions.csv.gz": ("subject_id", "hadm_id", "admittime", "dischtime", "deathtime", "admission_type",
                               "admit_provider_id", "admission_location", "discharge_location", "insurance",
                               "language", "marital_status", "race", "edregtime", "edouttime",
                               "hospital_expire_flag"),
    "hosp/diagnoses_icd.csv.gz": ("subject_id", "hadm_id", "seq_num", "icd_code", "icd_version"),
    "hosp/d_icd_diagnoses.csv.gz": ("icd_code", "icd_version", "long_title"),
    "note/discharge.csv.gz": ("note_id", "subject_id", "hadm_id", "note_type", "note_seq", "charttime",
                              "storetime", "text"),
}
FILES = tuple(COLUMNS)
# header spellings the notes use, per section (the build's table knows each of them)
WRITTEN = {
    "chief_complaint": ("Chief Complaint", "CHIEF COMPLAINT", "Chief  Complaint"),
    "procedures": ("Major Surgical or Invasive Procedure", "MAJOR SURGICAL OR INVASIVE PROCEDURE",
                   "Major Surgical or Invasive Procedure(s)"),
    "history_present_illness": ("History of Present Illness", "HISTORY OF PRESENT ILLNESS", "HPI"),
    "past_medical_history": ("Past Medical History", "PAST MEDICAL HISTORY", "Past Medical/Surgical History",
                             "PMH"),
    "social_history": ("Social History", "SOCIAL HISTORY"),
    "family_history": ("Family History", "FAMILY HISTORY", "Family Hx"),
    "physical_exam": ("Physical Exam", "PHYSICAL EXAM", "Physical Examination"),
    "pertinent_results": ("Pertinent Results", "PERTINENT RESULTS"),
    "hospital_course": ("Brief Hospital Course", "BRIEF HOSPITAL COURSE", "Hospital Course"),
    "admission_medications": ("Medications on Admission", "MEDICATIONS ON ADMISSION"),
    "discharge_diagnosis": ("Discharge Diagnosis", "Discharge Diagnoses", "DISCHARGE DIAGNOSIS"),
}


def _header(rng: random.Random, section: str) -> str:
    label = rng.choice(WRITTEN[section])
    return label + rng.choice([":", ":", " :", ":  "])


def _diagnosis(rng: random.Random, diagnosis: str) -> str:
    names = [line.split(". ", 1)[1] for line in diagnosis.splitlines()]
    style = rng.randrange(4)
    if style == 0:
        return diagnosis
    if style == 1:
        return "Primary:\n" + names[0] + ("\n \nSecondary:\n" + "\n".join(names[1:]) if names[1:] else "")
    if style == 2:
        rest = "".join(f"- {n}\n" for n in names[1:])
        return f"PRIMARY DIAGNOSIS:\n- {names[0]}\n" + (f"SECONDARY DIAGNOSES:\n{rest}" if rest else "")
    rest = "".join(f"{i}) {n}\n" for i, n in enumerate(names[1:], 1))
    return f"Primary: {names[0]}\n" + (f"Secondary:\n{rest}" if rest else "")


def note_text(rng: random.Random, visit: dict, sex: str) -> str:
    """One discharge summary in MIMIC-IV-Note's layout; discharge-time text carries `___` like real ones."""
    s = visit["clinical_sections"]
    exam = s["physical_exam"]
    if rng.random() < 0.5:
        exam = f"ADMISSION EXAM:\n{exam}\n \nDISCHARGE EXAM:\nVS: 98.1 120/70 72 18 97% RA; seen ___"
    results = s["pertinent_results"]
    if rng.random() < 0.5:
        results = f"ADMISSION LABS:\n{results}\n \nDISCHARGE LABS:\n___ 06:40AM BLOOD WBC-7.1 Hgb-10.2"
    parts = [
        " \nName:  ___                     Unit No:   ___\n \nAdmission Date:  ___              Discharge Date:   ___\n",
        f" \nDate of Birth:  ___             Sex:   {sex}\n \nService: MEDICINE\n \n",
        f"Allergies: \n{visit['allergies']}\n \nAttending: ___.\n \n",
        f"{_header(rng, 'chief_complaint')}\n{s['chief_complaint']}\n \n",
        f"{_header(rng, 'procedures')}\n{s['procedures']}\n\n",
        f"{_header(rng, 'history_present_illness')}\n{s['history_present_illness']}\n \n",
        f"{_header(rng, 'past_medical_history')}\n{s['past_medical_history']}\n \n",
        f"{_header(rng, 'social_history')}\n{s['social_history']}\n",
        f"{_header(rng, 'family_history')}\n{s['family_history']}\n \n",
        f"{_header(rng, 'physical_exam')}\n{exam}\n \n",
        f"{_header(rng, 'pertinent_results')}\n{results}\n \n",
        f"{_header(rng, 'hospital_course')}\n{s['hospital_course']} Followed by Dr. ___ on ___.\n \n",
        f"{_header(rng, 'admission_medications')}\n{s['admission_medications']}\n \n",
        "Discharge Medications:\n1. Acetaminophen 500 mg PO Q6H:PRN pain\n \nDischarge Disposition:\nHome\n \n",
    ]
    if s["discharge_diagnosis"].strip():  # an empty diagnosis: a note without the section
        parts.append(f"{_header(rng, 'discharge_diagnosis')}\n{_diagnosis(rng, s['discharge_diagnosis'])}\n \n")
    parts.append("Discharge Condition:\nMental Status: Clear and coherent.\n \nDischarge Instructions:\n"
                 f"Dear {'Mr.' if sex == 'M' else 'Ms.'} ___,\nIt was a pleasure caring for you at ___.\n \n"
                 "Followup Instructions:\n___\n")
    return "".join(parts)


def _csv_gz(rows: list[tuple]) -> bytes:
    buf = StringIO()
    csv.writer(buf, lineterminator="\n").writerows(rows)
    return gzip.compress(buf.getvalue().encode("utf-8"), mtime=0)  # same input, same bytes


def _time(day: int, hour: int) -> str:
    """A date-time whose text order is day order (a 336-day year of 12 months of 28 days)."""
    return f"21{50 + day // 336:02d}-{1 + (day % 336) // 28:02d}-{1 + day % 28:02d} {hour:02d}:15:00"


def tables(patients: list[dict], seed: int) -> dict[str, list[tuple]]:
    """The five tables (header row first) of the synthetic patients, plus the cases the build skips."""
    rng = random.Random(f"mimic-iv:{seed}")  # its own stream: the cohort itself comes from synthesize_cohort
    out = {name: [] for name in FILES}
    codes: dict[str, str] = {}
    extras = [{"subject_id": 91_000_000 + k, "visits": [dict(patients[k % len(patients)]["visits"][0],
                                                            visit_id=(91_000_000 + k) * 10, visit_number=1)]}
              for k in range(3)]  # one-visit patients (dropped by min_visits)
    for p_index, patient in enumerate(patients + extras):
        sid = patient["subject_id"]
        sex = patient["visits"][0]["sex"]
        out["hosp/patients.csv.gz"].append((sid, sex, rng.randint(45, 88), 2150, "2014 - 2016", ""))
        day = rng.randint(0, 300)
        for v_index, visit in enumerate(patient["visits"]):
            hadm, hour = visit["visit_id"], rng.randint(0, 23)
            out["hosp/admissions.csv.gz"].append(
                (sid, hadm, _time(day, hour), _time(day + 4, 11), "", "EW EMER.", "P00000", "EMERGENCY ROOM",
                 "HOME", "Medicare", "ENGLISH", "MARRIED", "WHITE", "", "", 0))
            text = note_text(rng, visit, sex)
            if p_index == 1 and v_index == 0:  # the header block also comes without a blank line
                text = text.replace("\n \nAttending", "\nAttending")
            out["note/discharge.csv.gz"].append((f"{sid}-DS-{v_index + 1}", sid, hadm, "DS", v_index + 1,
                                                 _time(day + 4, 10), _time(day + 4, 12), text))
            if p_index == 0 and v_index == 0:  # an addendum: a later note of the same admission
                out["note/discharge.csv.gz"].append((f"{sid}-DS-99", sid, hadm, "DS", 99, _time(day + 9, 9),
                                                     _time(day + 9, 9), "Addendum:\nCultures final; ___.\n"))
            names = [line.split(". ", 1)[1] for line in visit["clinical_sections"]["discharge_diagnosis"].splitlines()]
            for seq, name in enumerate(names, 1):
                code = codes.setdefault(name, f"X{len(codes) + 1:04d}")
                out["hosp/diagnoses_icd.csv.gz"].append((sid, hadm, seq, code, 10))
            if p_index % 5 == 0 and v_index == 0:  # an admission without a note, between two visits
                out["hosp/admissions.csv.gz"].append(
                    (sid, sid * 10 + 9, _time(day + 6, 8), _time(day + 7, 8), "", "OBSERVATION ADMIT", "P00000",
                     "WALK-IN", "HOME", "Medicare", "ENGLISH", "MARRIED", "WHITE", "", "", 0))
            day += rng.randint(20, 200)
    out["hosp/d_icd_diagnoses.csv.gz"] = [(code, 10, name) for name, code in sorted(codes.items())]
    for name in ("hosp/admissions.csv.gz", "note/discharge.csv.gz"):
        rng.shuffle(out[name])  # file order is not visit order
    return {name: [COLUMNS[name], *rows] for name, rows in out.items()}


def write(patients: list[dict], seed: int, out_dir: str | Path) -> list[Path]:
    """Write the five files under out_dir as one step (none is left where one fails)."""
    data = {Path(out_dir) / name: _csv_gz(rows) for name, rows in tables(patients, seed).items()}
    for path in data:
        path.parent.mkdir(parents=True, exist_ok=True)
    io.write_all({path: (lambda tmp, b=blob: tmp.write_bytes(b)) for path, blob in data.items()})
    return list(data)
