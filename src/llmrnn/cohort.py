"""Cohort stage: synthesise, load + validate, clean and split patients in the LLM-as-RNN JSON format.

A cohort file is a JSON list of patients:
    {subject_id, visits: [{visit_id, visit_number, sex, allergies?, clinical_sections: {...}}]}
Every record is checked on load; the first bad one is reported as
    FILE: patient <subject_id> visit <i>: <field>: <problem>
(visit <i> is the 0-based position in the patient's visit list) and nothing is written.
"""

from __future__ import annotations

import argparse
import json
import logging
import math
import random
import re
import unicodedata
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from llmrnn import io
from llmrnn.cli import json_arg
from llmrnn.errors import InputError
from llmrnn.mimic import audit, build, synth
from llmrnn.settings.base import parse
from llmrnn.settings.workflow import CohortMimicIv

log = logging.getLogger(__name__)

SECTION_NAMES = (
    "discharge_diagnosis", "chief_complaint", "history_present_illness", "past_medical_history", "procedures",
    "admission_medications", "hospital_course", "pertinent_results", "physical_exam", "social_history",
    "family_history", "allergies",
)
REAL_DATA_HINT = (
    "the cohort is a JSON list of patients in the LLM-as-RNN format; MIMIC-IV is "
    "credentialed and never shipped with llmrnn: build it from your PhysioNet copy, or set cohort.source: synthetic"
)


# ----------------------------------------------------------------------------- loading + validation
MAX_DEPTH = 32  # a record nests 4 levels; deeper is an error, not a RecursionError later
MAX_ID_CHARS = 128
INT64 = 2**63  # ids end up in parquet int64 columns (trajectories)


class _NonFinite:
    """What json.loads returns for NaN/Infinity: kept as a marker so validation can name the field."""

    def __init__(self, name: str) -> None:
        self.name = name


def _where(pid: Any, visit: int | None = None) -> str:
    return f"patient {pid}" + (f" visit {visit}" if visit is not None else "")


def _is_text_or_none(value: Any) -> bool:
    return value is None or isinstance(value, str)


SURROGATE = re.compile("[\ud800-\udfff]")  # a regex: a real cohort holds hundreds of MB of text


def _text_problem(text: str) -> str | None:
    if SURROGATE.search(text):
        return "lone surrogate (\\ud800-\\udfff escape without its pair): not encodable text"
    return None


def _value_problem(value: Any, leaves: bool = True) -> tuple[str, str] | None:
    """(relative field path, problem) of the first value no later stage can write back, else None.
    leaves=False checks nesting only (load_cohort knows when no leaf can be bad: most of the time of a
    large cohort is its strings)."""
    stack: list[tuple[Any, str, int]] = [(value, "", 0)]
    while stack:
        item, path, depth = stack.pop()
        if depth > MAX_DEPTH:
            return path, f"nested deeper than {MAX_DEPTH} levels"
        if isinstance(item, _NonFinite) or (isinstance(item, float) and not math.isfinite(item)):
            name = item.name if isinstance(item, _NonFinite) else repr(item)
            return path, f"{name} is not a JSON number (NaN/Infinity cannot be written back as JSON)"
        if isinstance(item, str) and (problem := _text_problem(item)):
            return path, problem
        children = item.items() if isinstance(item, dict) else enumerate(item) if isinstance(item, list) else ()
        for key, child in children:
            if isinstance(key, str) and (problem := _text_problem(key)):
                return (f"{path}.<key>" if path else "<key>"), f"{problem} (in a key; not repeated here)"
            if leaves or isinstance(child, (dict, list)):
                stack.append((child, f"{path}.{key}" if path else str(key), depth + 1))
    return None


def _locate(pid: Any, path: str) -> tuple[str, str]:
    """("patient P visit N", "field.sub") from a path "visits.N.field.sub" found by _value_problem."""
    parts = path.split(".")
    if len(parts) > 2 and parts[0] == "visits" and parts[1].isdigit():
        return _where(pid, int(parts[1])), ".".join(parts[2:])
    return _where(pid), path or "patient"


def _id_problem(value: Any, allow_empty: bool = False) -> str | None:
    """Ids are ints that fit int64, or short text whose digits are ASCII (later stages parse them)."""
    if isinstance(value, bool) or not isinstance(value, (int, str)) or (value == "" and not allow_empty):
        return "expected an integer or non-empty text"
    if isinstance(value, int):
        return None if -INT64 <= value < INT64 else "integer does not fit in 64 bits"
    if len(value) > MAX_ID_CHARS:
        return f"{len(value)} characters, more than {MAX_ID_CHARS}"
    if problem := _text_problem(value):
        return problem
    if not value.isprintable():
        return "control or unprintable character (an id is one line of text)"
    for ch in value:
        if not ch.isascii() and unicodedata.category(ch) in ("Nd", "Nl", "No"):
            return f"non-ASCII digit U+{ord(ch):04X} ({unicodedata.name(ch, '?')}); ids use ASCII digits 0-9"
    return None


def _validate_visit(visit: Any, where: str, fail) -> None:
    if not isinstance(visit, dict):
        fail(where, "visit", f"expected an object, got {type(visit).__name__}")
    for key in ("visit_id", "visit_number"):
        if key not in visit:
            fail(where, key, "missing")
    if problem := _id_problem(visit["visit_id"], allow_empty=True):
        fail(where, "visit_id", problem)
    if isinstance(visit["visit_number"], bool) or not isinstance(visit["visit_number"], int):
        fail(where, "visit_number", "expected an integer")
    if not -INT64 <= visit["visit_number"] < INT64:
        fail(where, "visit_number", "integer does not fit in 64 bits")
    for key in ("sex", "allergies"):
        if not _is_text_or_none(visit.get(key)):
            fail(where, key, "expected text")
    sections = visit.get("clinical_sections")
    if "clinical_sections" not in visit:
        fail(where, "clinical_sections", "missing")
    if not isinstance(sections, dict):
        fail(where, "clinical_sections", f"expected an object, got {type(sections).__name__}")
    if "discharge_diagnosis" not in sections:
        fail(where, "clinical_sections.discharge_diagnosis", "missing")
    for key, value in sections.items():
        if not _is_text_or_none(value):
            fail(where, f"clinical_sections.{key}", "expected text")


def _validate_visit_order(visits: list[dict], pid: Any, fail) -> None:
    """The recurrence runs in list order, so the list must BE the visit order: strictly increasing
    visit_number, no visit_id twice."""
    seen_ids: set[str] = set()
    for v_index, visit in enumerate(visits):
        if v_index and visit["visit_number"] <= visits[v_index - 1]["visit_number"]:
            previous = visits[v_index - 1]["visit_number"]
            how = "repeats" if visit["visit_number"] == previous else "is lower than"
            fail(_where(pid, v_index), "visit_number",
                 f"{visit['visit_number']} {how} the previous visit's {previous} (list visits in increasing "
                 "visit_number)")
        if str(visit["visit_id"]) in seen_ids:
            fail(_where(pid, v_index), "visit_id", f"duplicate {visit['visit_id']} within the patient")
        seen_ids.add(str(visit["visit_id"]))


def validate_cohort(data: Any, source: str = "<cohort>", check_leaves: bool = True) -> list[dict]:
    """Check every record; raise InputError naming file, patient, visit and field for the first bad one.
    check_leaves=False: no string or number can be bad (NaN, lone surrogate), only nesting is walked."""

    def fail(where: str, field: str, problem: str) -> None:
        raise InputError(f"{source}: {where}: {field}: {problem}")

    if not isinstance(data, list):
        raise InputError(f"{source}: top level: expected a JSON list of patients, got {type(data).__name__}")
    if not data:
        raise InputError(f"{source}: top level: no patients (empty list)")
    seen: set[str] = set()
    for p_index, patient in enumerate(data):
        if not isinstance(patient, dict):
            fail(f"record {p_index}", "patient", f"expected an object, got {type(patient).__name__}")
        if "subject_id" not in patient:
            fail(f"record {p_index}", "subject_id", "missing")
        pid = patient["subject_id"]
        if problem := _id_problem(pid):
            fail(f"record {p_index}", "subject_id", problem)
        if str(pid) in seen:
            fail(_where(pid), "subject_id", f"duplicate (record {p_index})")
        seen.add(str(pid))
        if bad := _value_problem(patient, check_leaves):
            fail(*_locate(pid, bad[0]), bad[1])
        visits = patient.get("visits")
        if not isinstance(visits, list):
            fail(_where(pid), "visits", f"expected a list, got {type(visits).__name__ if 'visits' in patient else 'nothing'}")
        if not visits:
            fail(_where(pid), "visits", "empty list")
        for v_index, visit in enumerate(visits):
            _validate_visit(visit, _where(pid, v_index), fail)
        _validate_visit_order(visits, pid, fail)
    return data


SURROGATE_ESCAPE = re.compile(r"\\u[dD][89a-fA-F][0-9a-fA-F]{2}")  # the UTF-8 decoder refuses raw ones


def _parse_int(path: Path, text: str):
    def parse(digits: str) -> int:
        if len(digits.lstrip("-")) > MAX_ID_CHARS:
            pos = text.find(digits)
            line = text.count("\n", 0, pos) + 1
            raise InputError(f"{path}: line {line}: a number of {len(digits.lstrip('-'))} digits; no field takes "
                             f"more than {MAX_ID_CHARS}")
        return int(digits)

    return parse


def load_cohort(path: str | Path) -> list[dict]:
    """Read and validate a cohort file; every failure is one InputError line."""
    path = Path(path)
    if not path.exists():
        raise InputError(f"{path}: cohort file not found; {REAL_DATA_HINT}")
    if path.is_dir():
        raise InputError(f"{path}: is a directory, not a cohort file; {REAL_DATA_HINT}")
    # the input rule (llmrnn.io): a regular file (never a fifo or /dev/zero), bounded, read in time
    raw = io.read_regular_bytes(path, "cohort file")
    if not raw.strip():
        raise InputError(f"{path}: empty file; {REAL_DATA_HINT}")
    text = io.decode_text(raw, str(path))  # the reader policy QA data shares: UTF-8, an optional BOM
    non_finite: list[_NonFinite] = []

    def constant(name: str) -> _NonFinite:
        non_finite.append(_NonFinite(name))
        return non_finite[-1]

    def parse_float(literal: str) -> float | _NonFinite:
        value = float(literal)
        return value if math.isfinite(value) else constant(literal)  # 1e999 overflows to inf

    try:
        data = json.loads(text, parse_constant=constant, parse_float=parse_float, parse_int=_parse_int(path, text),
                          object_pairs_hook=io.unique_keys(str(path)))
    except json.JSONDecodeError as exc:
        raise InputError(f"{path}: line {exc.lineno} column {exc.colno}: not JSON ({exc.msg})") from None
    except RecursionError:
        raise InputError(f"{path}: nested too deeply to parse (a record nests {MAX_DEPTH} levels at most)") from None
    return validate_cohort(data, str(path), check_leaves=bool(non_finite or SURROGATE_ESCAPE.search(text)))


def dump_cohort(patients: list[dict]) -> str:
    """Canonical serialisation: same patients, same bytes."""
    return json.dumps(patients, indent=1, ensure_ascii=False, sort_keys=False) + "\n"


# ----------------------------------------------------------------------------- cleaning + splitting
def is_empty_diagnosis(value: Any) -> bool:
    return value is None or not str(value).strip()


def empty_target_reason(patient: dict) -> str | None:
    """Why a patient is dropped by cleaning: its first visit with an empty discharge_diagnosis, or None."""
    for index, visit in enumerate(patient["visits"]):
        value = visit["clinical_sections"].get("discharge_diagnosis")
        if is_empty_diagnosis(value):
            how = "missing" if "discharge_diagnosis" not in visit["clinical_sections"] else "null" if value is None else "empty"
            return f"visit {index} (visit_id {visit['visit_id']}): discharge_diagnosis {how}"
    return None


def clean_cohort(patients: list[dict]) -> tuple[list[dict], dict]:
    """Drop every patient with any visit whose discharge_diagnosis is empty (as the reference did), each
    logged with its reason (the log is private; the report counts); a MIMIC-IV build's `targets` say why."""
    kept = []
    for p in patients:
        if (why := empty_target_reason(p)) is None:
            kept.append(p)
        else:
            log.info("patient %s dropped: %s", p["subject_id"], why)
    report = {
        "patients_in": len(patients),
        "visits_in": sum(len(p["visits"]) for p in patients),
        "patients_dropped_empty_diagnosis": len(patients) - len(kept),
        "patients_out": len(kept),
        "visits_out": sum(len(p["visits"]) for p in kept),
        "rule": "drop a patient if any visit has an empty clinical_sections.discharge_diagnosis (each dropped "
                "patient and its first such visit in the log; a MIMIC-IV build's reasons: build_report targets)",
    }
    return kept, report


@dataclass(frozen=True)
class SplitSizes:
    val: int
    train: int
    seed: int


def split_cohort(patients: list[dict], sizes: SplitSizes) -> dict[str, list[dict]]:
    """val first, then train, each sampled with the seed from what remains; test is the rest.

    Sampling goes through pandas' `sample(random_state=seed)`, like the reference's scripts, so the same
    cleaned cohort gives the same splits.
    """
    import pandas as pd

    if sizes.val < 1 or sizes.train < 1:
        raise InputError(f"split: val_size and train_size must be >= 1 (got {sizes.val}, {sizes.train})")
    if sizes.val + sizes.train >= len(patients):
        raise InputError(
            f"split: val_size {sizes.val} + train_size {sizes.train} leaves no test patients "
            f"out of {len(patients)} cleaned patients"
        )
    pool = pd.Series(range(len(patients)))
    val_idx = pool.sample(n=sizes.val, random_state=sizes.seed)
    rest = pool.drop(val_idx.index)
    train_idx = rest.sample(n=sizes.train, random_state=sizes.seed)
    test_idx = rest.drop(train_idx.index)
    splits = {
        "train": [patients[i] for i in train_idx],
        "val": [patients[i] for i in val_idx],
        "test": [patients[i] for i in test_idx],
    }
    ids = {name: {str(p["subject_id"]) for p in part} for name, part in splits.items()}
    overlap = (ids["train"] & ids["val"]) | (ids["train"] & ids["test"]) | (ids["val"] & ids["test"])
    assert not overlap, f"split overlap: {sorted(overlap)[:5]}"
    return splits


# ----------------------------------------------------------------------------- synthetic cohort
# Longitudinal structure a memory can exploit: chronic conditions recur at later visits, and complications
# follow the diagnoses that cause them (diabetes -> foot ulcer, atrial fibrillation -> stroke, ...). All
# chronic conditions are listed at the first visit only; later visits do not repeat them.
CHRONIC = {
    "type 2 diabetes mellitus": ["diabetic foot ulcer", "diabetic ketoacidosis", "hypoglycemia"],
    "essential hypertension": ["hypertensive emergency", "hypertensive heart disease"],
    "chronic kidney disease stage 3": ["hyperkalemia", "acute kidney injury on chronic kidney disease"],
    "congestive heart failure": ["acute decompensated heart failure", "cardiogenic pulmonary edema"],
    "chronic obstructive pulmonary disease": ["copd exacerbation", "community acquired pneumonia"],
    "atrial fibrillation": ["ischemic stroke", "gastrointestinal bleed on anticoagulation"],
    "alcohol use disorder": ["alcohol withdrawal", "alcoholic pancreatitis", "cirrhosis with ascites"],
    "coronary artery disease": ["non st elevation myocardial infarction", "unstable angina"],
}
ACUTE = [
    "urinary tract infection",
    "cellulitis of lower leg",
    "syncope",
    "small bowel obstruction",
    "anemia",
    "hip fracture",
    "clostridioides difficile colitis",
    "pulmonary embolism",
]
COMPLAINT = {
    "diabetic foot ulcer": "non-healing wound on the left foot",
    "diabetic ketoacidosis": "vomiting and confusion",
    "hypoglycemia": "found unresponsive at home",
    "hypertensive emergency": "severe headache and blurred vision",
    "hypertensive heart disease": "exertional dyspnea",
    "hyperkalemia": "weakness and palpitations",
    "acute kidney injury on chronic kidney disease": "decreased urine output",
    "acute decompensated heart failure": "shortness of breath and leg swelling",
    "cardiogenic pulmonary edema": "acute shortness of breath",
    "copd exacerbation": "worsening cough and wheeze",
    "community acquired pneumonia": "fever and productive cough",
    "ischemic stroke": "sudden right sided weakness",
    "gastrointestinal bleed on anticoagulation": "black stools",
    "alcohol withdrawal": "tremor and agitation",
    "alcoholic pancreatitis": "epigastric pain radiating to the back",
    "cirrhosis with ascites": "abdominal distension",
    "non st elevation myocardial infarction": "chest pressure",
    "unstable angina": "chest pain at rest",
}
SOCIAL = ["lives alone", "lives with spouse", "former smoker, 30 pack-years", "drinks daily", "retired teacher"]
FAMILY = ["father with coronary disease", "mother with diabetes", "noncontributory", "sister with breast cancer"]
RESULTS = ["creatinine 2.1", "potassium 6.2", "troponin elevated", "bnp 1450", "glucose 480", "lactate 3.1", "hgb 7.2"]
PROCEDURES = ["none", "chest x-ray", "echocardiogram", "ct head", "endoscopy", "wound debridement", "paracentesis"]
MEDS = ["metformin", "lisinopril", "furosemide", "apixaban", "tiotropium", "atorvastatin", "insulin glargine"]


def synthesize_cohort(n_patients: int, seed: int, empty_diagnosis_rate: float = 0.08) -> list[dict]:
    """A deterministic synthetic cohort (no real patient): same (n, seed), same records."""
    rng = random.Random(seed)
    patients = []
    for p in range(n_patients):
        subject_id = 90_000_000 + p  # far from MIMIC-IV's id range; marks the record as synthetic too
        sex = rng.choice(["M", "F"])
        chronic = rng.sample(sorted(CHRONIC), k=rng.randint(1, 3))
        n_visits = rng.randint(2, 8)
        history: list[str] = []
        visits = []
        for v in range(n_visits):
            base = rng.choice(chronic)
            roll = rng.random()
            if v > 0 and roll < 0.6:
                primary = rng.choice(CHRONIC[base])  # a complication of an earlier chronic condition
            elif roll < 0.8:
                primary = base
            else:
                primary = rng.choice(ACUTE)
            secondary = [c for c in chronic if c != primary][:2]
            dx_lines = [primary] + secondary
            diagnosis = "\n".join(f"{i + 1}. {d}" for i, d in enumerate(dx_lines))
            if rng.random() < empty_diagnosis_rate / max(n_visits, 1):
                diagnosis = ""
            complaint = COMPLAINT.get(primary, f"symptoms of {primary}")
            # Later visits restate only the condition behind this admission and earlier admissions'
            # diagnoses: the other chronic conditions (named at visit 1, recurring in later discharge
            # diagnoses) are kept only by a memory.
            pmh = ", ".join(sorted(set([base] + history))) if v else ", ".join(chronic)
            sections = {
                "discharge_diagnosis": diagnosis,
                "chief_complaint": complaint,
                "history_present_illness": (
                    f"{'Male' if sex == 'M' else 'Female'} aged {rng.randint(45, 88)} with {pmh} "
                    f"presenting with {complaint}. Visit {v + 1} of a longitudinal course."
                ),
                "past_medical_history": pmh,
                "procedures": rng.choice(PROCEDURES),
                "admission_medications": ", ".join(rng.sample(MEDS, k=rng.randint(1, 3))),
                "hospital_course": f"Treated for {complaint}; improved with supportive care.",
                "pertinent_results": ", ".join(rng.sample(RESULTS, k=2)),
                "physical_exam": rng.choice(["afebrile, alert", "crackles at bases", "edema 2+", "tachycardic"]),
                "social_history": rng.choice(SOCIAL),
                "family_history": rng.choice(FAMILY),
            }
            visits.append(
                {
                    "visit_id": subject_id * 10 + v,
                    "visit_number": v + 1,
                    "sex": sex,
                    "allergies": rng.choice(["no known drug allergies", "penicillin", "sulfa"]),
                    "clinical_sections": sections,
                }
            )
            history.append(primary)
        patients.append({"subject_id": subject_id, "synthetic": True, "visits": visits})
    return patients


# ----------------------------------------------------------------------------- CLI
def _cmd_synth(args: argparse.Namespace) -> None:
    patients = synthesize_cohort(args.patients, args.seed)
    if args.format == "mimic-iv":
        written = {Path(p).resolve() for p in synth.write(patients, args.seed, args.out)}
        if missing := [p for p in args.expect or () if Path(p).resolve() not in written]:
            raise InputError(f"cohort synth: --expect {missing[0]}: not one of the files --format mimic-iv writes "
                             f"under {args.out} ({', '.join(synth.FILES)})")
        log.info("wrote %d synthetic patients as MIMIC-IV files under %s", len(patients), args.out)
        return
    if not args.meta:
        raise InputError("cohort synth: --meta is required with --format json")
    meta = {
        "synthetic": True,
        "generator": "llmrnn cohort synth",
        "patients": args.patients,
        "seed": args.seed,
        "note": "SYNTHETIC cohort for demos and tests; no real patient data.",
    }
    io.write_texts({args.out: dump_cohort(patients), args.meta: io.json_text(meta)})
    log.info("wrote %d synthetic patients to %s", len(patients), args.out)


def _all_dropped(source: str, report: dict) -> InputError:
    return InputError(
        f"{source}: every patient was dropped ({report['patients_dropped_empty_diagnosis']} of "
        f"{report['patients_in']} have a visit with an empty clinical_sections.discharge_diagnosis); nothing to split"
    )


def _cmd_build(args: argparse.Namespace) -> None:
    _distinct_paths(args, ("out", "report"))
    cfg = build_settings(args.cfg)
    if args.workers is not None:
        cfg["workers"] = args.workers
    summary = build.build(args.hosp, args.note, args.out, args.report, cfg)
    log.info("built cohort: %d patients, %d visits", summary["patients_out"], summary["visits_out"])


def build_settings(cfg: dict) -> dict:
    """`cohort build --cfg` through the settings model of cohort.mimic_iv (strict types, bounds, its
    cross-field rules), as the workflow's config is: one line naming the key, never a traceback."""
    try:
        return parse(CohortMimicIv, cfg, "cohort.mimic_iv").model_dump(exclude={"hosp", "note"})
    except InputError as exc:
        raise InputError(f"--cfg: {exc}") from None


def _cmd_audit(args: argparse.Namespace) -> None:
    audit.command(args, load_cohort)


def _cmd_validate(args: argparse.Namespace) -> None:
    patients = load_cohort(args.cohort)
    kept, report = clean_cohort(patients)
    if not kept:  # valid records, yet nothing a later stage could use
        raise _all_dropped(args.cohort, report)
    print(f"{args.cohort}: ok, {len(patients)} patients, {sum(len(p['visits']) for p in patients)} visits, "
          f"{len(kept)} patients after cleaning")


def _distinct_paths(args: argparse.Namespace, names: tuple[str, ...]) -> None:
    """Two arguments naming one file would overwrite each other (or the input) silently."""
    seen: dict[Path, str] = {}
    for name in names:
        path = Path(getattr(args, name)).resolve()
        if path in seen:
            raise InputError(f"--{name} and --{seen[path]} name the same file {getattr(args, name)}; give each its own")
        seen[path] = name


def source_sha256(source: str) -> str | None:
    """sha256 of a user's cohort file, None for the synthetic one (its params rerun it) or a missing file.

    the workflow (llmrnn.plan) passes it as a param of clean_cohort: a cohort replaced by a file with an older mtime
    still reruns cleaning and everything after it.
    """
    if source == "synthetic" or not Path(source).is_file():
        return None
    return io.sha256_file(source)


def _cmd_clean(args: argparse.Namespace) -> None:
    _distinct_paths(args, ("cohort", "out", "report"))
    patients = load_cohort(args.cohort)
    kept, report = clean_cohort(patients)
    if not kept:
        raise _all_dropped(args.cohort, report)
    report["source"] = str(args.cohort)
    report["source_sha256"] = io.sha256_file(args.cohort)
    io.write_texts({args.out: dump_cohort(kept), args.report: io.json_text(report)})
    log.info("cleaned cohort: %d -> %d patients", report["patients_in"], report["patients_out"])


def _cmd_split(args: argparse.Namespace) -> None:
    _distinct_paths(args, ("cohort", "train", "val", "test", "summary"))
    cfg = args.cfg
    patients = load_cohort(args.cohort)
    sizes = SplitSizes(val=int(cfg["val_size"]), train=int(cfg["train_size"]), seed=int(cfg["seed"]))
    splits = split_cohort(patients, sizes)
    texts = {name: dump_cohort(part) for name, part in splits.items()}
    summary = {
        "seed": sizes.seed,
        "sizes": {name: len(part) for name, part in splits.items()},
        "visits": {name: sum(len(p["visits"]) for p in part) for name, part in splits.items()},
        "sha256": {name: io.sha256_bytes(text.encode("utf-8")) for name, text in texts.items()},
        "source_sha256": io.sha256_file(args.cohort),
        "overlap": 0,
        "order": "val sampled first, then train from the remainder; test is the rest",
    }
    files = {getattr(args, name): text for name, text in texts.items()}
    io.write_texts({**files, args.summary: io.json_text(summary)})
    log.info("splits: %s", summary["sizes"])


def register(sub: argparse._SubParsersAction) -> None:
    cohort = sub.add_parser("cohort", help="synthesise, validate, clean and split a cohort")
    csub = cohort.add_subparsers(dest="cohort_command", required=True)

    p = csub.add_parser("synth", help="write a deterministic SYNTHETIC cohort")
    p.add_argument("--patients", type=int, required=True)
    p.add_argument("--seed", type=int, required=True)
    p.add_argument("--format", choices=("json", "mimic-iv"), default="json",
                   help="json: the cohort file; mimic-iv: PhysioNet-shaped files under --out (hosp/, note/)")
    p.add_argument("--out", required=True, help="output: the cohort JSON (a folder with --format mimic-iv)")
    p.add_argument("--meta", help="output: how it was made (generator, patients, seed); --format json")
    p.add_argument("--expect", nargs="+", help="--format mimic-iv: files that must be among those written "
                   "(the rule's outputs)")
    p.set_defaults(func=_cmd_synth)

    p = csub.add_parser("build", help="build the cohort from MIMIC-IV hosp/ and MIMIC-IV-Note note/ files")
    p.add_argument("--hosp", required=True, help="MIMIC-IV hosp/ folder (patients, admissions, ...csv.gz)")
    p.add_argument("--note", required=True, help="MIMIC-IV-Note note/ folder (discharge.csv.gz)")
    p.add_argument("--out", required=True, help="output: the cohort JSON (private, 0600)")
    p.add_argument("--report", required=True, help="output: build_report.json (counts only)")
    p.add_argument("--workers", type=int, choices=range(1, 257), metavar="N", help="processes splitting notes "
                   "(the rule's threads; default: cohort.mimic_iv.workers of --cfg)")
    p.add_argument("--cfg", type=json_arg, default={},
                   help='JSON: cohort.mimic_iv but hosp/note, e.g. {"diagnoses": "note", "mode": "admission_time"}')
    p.set_defaults(func=_cmd_build)

    p = csub.add_parser("audit", help="count discharge-time signals in each shown section of a cohort (no text)")
    p.add_argument("--cohort", required=True, nargs="+", help="cohort JSON files (e.g. a build in each mode)")
    p.add_argument("--out", help="output: the counts as JSON")
    p.set_defaults(func=_cmd_audit)

    p = csub.add_parser("validate", help="check every record of a cohort file")
    p.add_argument("cohort")
    p.set_defaults(func=_cmd_validate)

    p = csub.add_parser("clean", help="drop patients with an empty discharge diagnosis")
    p.add_argument("--cohort", required=True)
    p.add_argument("--out", required=True)
    p.add_argument("--report", required=True)
    p.set_defaults(func=_cmd_clean)

    p = csub.add_parser("split", help="seeded val/train/test split with zero overlap")
    p.add_argument("--cohort", required=True)
    for name in ("train", "val", "test"):
        p.add_argument(f"--{name}", required=True, help=f"output: the {name} split JSON")
    p.add_argument("--summary", required=True, help="output: splits.json (sizes, seed, sha256)")
    p.add_argument("--cfg", type=json_arg, required=True, help='JSON: {"val_size", "train_size", "seed"}')
    p.set_defaults(func=_cmd_split)
