"""`llmrnn cohort build`: MIMIC-IV hosp/ + MIMIC-IV-Note note/ -> the LLM-as-RNN cohort + build_report.json.

One patient per subject_id, one visit per admission with a discharge note (visit_id = hadm_id), visits
ordered by admittime (ties by hadm_id) and numbered 1, 2, ...; sex from patients.gender; allergies from
the note's header block; clinical_sections from the note (llmrnn.mimic.sections), without discharge-time
text; discharge_diagnosis from the note's Discharge Diagnosis section (`diagnoses: note`) or from
diagnoses_icd long titles in seq_num order (`diagnoses: icd`), written as `1. name` lines.
Several notes of one admission: the discharge summary (note_type DS) with the lowest note_seq is the
visit's note; later ones (addenda) are counted and not used, as they are written after discharge.
The note file is streamed: each parsed note goes to a spool file beside the output and only its offset
stays in memory. Any bad input is one InputError line (file, row, field) and no output is left.
"""

from __future__ import annotations

import errno
import json
import multiprocessing as mp
import os
import random
import re
import sys
import tempfile
from collections.abc import Iterator
from dataclasses import dataclass
from datetime import date, datetime
from pathlib import Path
from typing import Any

from llmrnn import io
from llmrnn.errors import InputError
from llmrnn.mimic import sections as sec
from llmrnn.mimic.audit import Audit, possible_rules, target_pattern, visit_signals
from llmrnn.mimic.tables import header_problem, rows, table_paths
from llmrnn.settings import section_defaults

DEFAULTS = {k: v for k, v in section_defaults("cohort.mimic_iv").items() if k not in ("hosp", "note")}
INT64 = (-(2**63), 2**63 - 1)
_ADMITTIME = re.compile(r"\d{4}-\d{2}-\d{2}([ T]\d{2}:\d{2}(:\d{2}(\.\d+)?)?)?")
MAX_AGE = 130
GENDERS = frozenset({"F", "M", ""})


def _int(path: Path, row: int, column: str, value: str) -> int:
    """A MIMIC-IV id or count: ASCII digits only (no sign, no spaces, no other script's digits)."""
    if not re.fullmatch(r"[0-9]+", value):
        raise InputError(f"{path}: row {row}: {column}: {value[:40]!r} is not a non-negative integer "
                         "(ASCII digits only)")
    number = int(value)
    if not INT64[0] <= number <= INT64[1]:
        raise InputError(f"{path}: row {row}: {column}: {value.strip()[:40]} is beyond a 64-bit integer "
                         "(MIMIC-IV ids have 8 digits)")
    return number


@dataclass
class Admission:
    subject_id: int
    admittime: str


def read_patients(path: Path) -> dict[int, tuple[str, int | None]]:
    out: dict[int, tuple[str, int | None]] = {}
    for row, r in rows(path, "patients"):
        sid = _int(path, row, "subject_id", r["subject_id"])
        if sid in out:
            raise InputError(f"{path}: row {row}: subject_id: {sid} appears twice")
        age = _int(path, row, "anchor_age", r["anchor_age"]) if r["anchor_age"].strip() else None
        if age is not None and age > MAX_AGE:
            raise InputError(f"{path}: row {row}: anchor_age: {age} is not an age (0 to {MAX_AGE})")
        gender = r["gender"].strip()
        if gender not in GENDERS:
            raise InputError(f"{path}: row {row}: gender: {gender[:40]!r} is not one of F, M or empty (MIMIC-IV's "
                             "values)")
        out[sid] = (sys.intern(gender), age)
    return out


def read_admissions(path: Path, patients: dict) -> dict[int, Admission]:
    out: dict[int, Admission] = {}
    for row, r in rows(path, "admissions"):
        hadm = _int(path, row, "hadm_id", r["hadm_id"])
        sid = _int(path, row, "subject_id", r["subject_id"])
        if hadm in out:
            raise InputError(f"{path}: row {row}: hadm_id: {hadm} appears twice")
        if sid not in patients:
            raise InputError(f"{path}: row {row}: subject_id: {sid} is in no row of patients")
        if not _ADMITTIME.fullmatch(r["admittime"].strip()):
            raise InputError(f"{path}: row {row}: admittime: {r['admittime'][:40]!r} is not a date-time "
                             "(YYYY-MM-DD HH:MM:SS)")
        try:  # the shape is right; the calendar must be too (month 13, February 30, hour 25)
            datetime.fromisoformat(r["admittime"].strip().replace(" ", "T"))
        except ValueError as exc:
            raise InputError(f"{path}: row {row}: admittime: {r['admittime'][:40]!r} is not a valid date-time "
                             f"({exc})") from None
        out[hadm] = Admission(sid, r["admittime"].strip().replace("T", " "))
    return out


def read_icd(dx_path: Path, titles_path: Path, wanted: set[int]) -> dict[int, list[str]]:
    """hadm_id -> long titles in seq_num order, for the admissions in `wanted` only."""
    titles: dict[tuple[str, str], str] = {}
    for _, r in rows(titles_path, "d_icd_diagnoses"):
        titles[(r["icd_code"].strip(), r["icd_version"].strip())] = r["long_title"].strip()
    coded: dict[int, list[tuple[int, str]]] = {}
    for row, r in rows(dx_path, "diagnoses_icd"):
        hadm = _int(dx_path, row, "hadm_id", r["hadm_id"])
        if hadm not in wanted:
            continue
        key = (r["icd_code"].strip(), r["icd_version"].strip())
        if key not in titles:
            raise InputError(f"{dx_path}: row {row}: icd_code: {key[0]} (version {key[1]}) is in no row of "
                             f"{titles_path.name}")
        coded.setdefault(hadm, []).append((_int(dx_path, row, "seq_num", r["seq_num"]), titles[key]))
    return {h: [t for _, t in sorted(v)] for h, v in coded.items()}


class Counts(dict):
    def add(self, key: str, n: int = 1) -> None:
        self[key] = self.get(key, 0) + n


@dataclass(frozen=True)
class Shown:
    """What a note shows: the sections, and whether exam and results are cut to their admission parts."""
    sections: tuple[str, ...]
    cut_mixed: bool

    @classmethod
    def of(cls, cfg: dict) -> Shown:
        if cfg["mode"] not in sec.MODES:
            raise InputError(f"cfg: mode: {cfg['mode']!r}; expected one of {', '.join(sec.MODES)}")
        shown = tuple(cfg["sections"]) if cfg.get("sections") is not None else sec.MODES[cfg["mode"]]
        if bad := [s for s in shown if s not in sec.RISK]:
            raise InputError(f"cfg: sections: {bad[0]!r} is not a section the build can show "
                             f"({', '.join(sec.RISK)})")
        return cls(tuple(s for s in sec.KEPT if s in shown), cfg["mode"] == "admission_time")

    def leakage(self) -> list[str]:
        """The shown sections that hold discharge-time text by design."""
        high = [s for s in self.sections if sec.RISK[s].startswith("HIGH")]
        if not self.cut_mixed:
            high += [f"{s} (whole, not cut to admission)" for s in sec.ADMISSION_AND_DISCHARGE if s in self.sections]
        return high


# json.dumps(x, ensure_ascii=False) builds a JSONEncoder per call (a non-default option); one encoder writes
# the same text (twice a note, in the workers)
_ENCODE = json.JSONEncoder(ensure_ascii=False).encode


def note_record(text: str, shown: Shown, admitted: date | None = None) -> tuple[bytes, dict[str, int], str | None]:
    """One note -> (its spool record as JSON bytes, its counts, why its target is empty or None). The
    record holds the leak audit's signals of each shown section (against the note's own target)."""
    split = sec.split_note(text)
    # a plain dict: a Counter costs more to build, pickle and merge (the main process merges one per note)
    counts = {f"withheld_parts:{k}": v for k, v in split.withheld.items()}
    counts["unknown_headers"] = split.unknown_headers
    counts["notes_with_unknown_headers"] = int(bool(split.unknown_headers))
    counts["headers_in_narrative"] = split.repeated
    body = split.sections if shown.cut_mixed else {**split.sections, **split.full}
    body_full = split.full
    names, why = sec.diagnosis_target(split.sections.get("discharge_diagnosis"))
    kept = {k: body[k] for k in shown.sections if body.get(k)}
    pattern = target_pattern(names)
    lows = {k: v.lower() for k, v in kept.items() if v.strip()}
    rules = possible_rules(lows.values())
    meta = {"allergies": split.sections.get("allergies") or None,
            "has": sorted(split.sections),
            "signals": {k: sorted(visit_signals(kept[k], pattern, admitted, rules, low, k)) for k, low in lows.items()},
            # lines of each shown section withheld because the splitter could not place them (the audit's)
            "unplaced": {k: split.withheld[f"{k}:unplaced_lines"] for k in shown.sections
                         if split.withheld.get(f"{k}:unplaced_lines") and (shown.cut_mixed or k not in body_full)}}
    # the visit's clinical_sections as the cohort writes them (the note's target), encoded here in the worker:
    # the main process copies this line into the cohort (json escapes every newline, so it is one line)
    clinical = {"discharge_diagnosis": sec.numbered(names), **{k: body[k] for k in shown.sections if k in body}}
    return ((_ENCODE(meta) + "\n" + _ENCODE(clinical) + "\n").encode("utf-8", "surrogatepass"), counts, why)


_WORKER_SHOWN: Shown | None = None


def _init_worker(shown: Shown) -> None:
    global _WORKER_SHOWN
    _WORKER_SHOWN = shown


def _records(items: list[tuple[str, str]], shown: Shown | None = None) -> list[tuple[bytes, dict[str, int], str | None]]:
    """(text, admittime) of notes -> their note_record (in a worker: its admission date parsed there too)."""
    shown = shown or _WORKER_SHOWN
    return [note_record(text, shown, _admitted(admittime)) for text, admittime in items]


def _kept_rows(path: Path, admissions: dict[int, Admission], counts: Counts) -> Iterator[tuple[int, str, tuple]]:
    """(hadm_id, text, choice key) of every note of an admission; orphans (hadm_id in no admission) counted."""
    seen_ids: set[str] = set()
    for row, r in rows(path, "discharge"):
        counts.add("notes_read")
        note_id = r["note_id"].strip()
        if not note_id:
            raise InputError(f"{path}: row {row}: note_id: empty")
        if note_id in seen_ids:
            raise InputError(f"{path}: row {row}: note_id: {note_id} appears twice")
        seen_ids.add(note_id)
        hadm = _int(path, row, "hadm_id", r["hadm_id"])
        sid = _int(path, row, "subject_id", r["subject_id"])
        adm = admissions.get(hadm)
        if adm is None:
            counts.add("notes_skipped_orphan")  # hosp/ and note/ are released separately
            counts.setdefault("first_orphan_row", row)
            continue
        if adm.subject_id != sid:
            raise InputError(f"{path}: row {row}: subject_id: {sid}, but admissions gives hadm_id {hadm} to "
                             f"subject_id {adm.subject_id}")
        seq = _int(path, row, "note_seq", r["note_seq"]) if r["note_seq"].strip() else 0
        yield hadm, (r["text"], adm.admittime), (r["note_type"].strip().upper() != "DS", seq, note_id)


def stream_notes(path: Path, admissions: dict[int, Admission], spool, counts: Counts, shown: Shown,
                 workers: int = 1, max_orphan_share: float = 1.0) -> dict[int, tuple]:
    """Parse every note into the spool (on `workers` processes, in file order); hadm_id -> (choice key,
    offset, length, why its target is empty or None) of the note it keeps."""
    chosen: dict[int, tuple] = {}
    batch_size = 64

    def batches() -> Iterator[list[tuple[int, str, tuple]]]:
        batch: list = []
        for item in _kept_rows(path, admissions, counts):
            batch.append(item)
            if len(batch) == batch_size:
                yield batch
                batch = []
        if batch:
            yield batch

    def take(batch, results) -> None:
        for (hadm, _, key), (data, note_counts, why) in zip(batch, results):
            if hadm in chosen:
                counts.add("notes_unused_later_note_of_admission")
                if chosen[hadm][0] <= key:
                    continue
            for k, v in note_counts.items():
                counts[k] = counts.get(k, 0) + v
            offset = spool.tell()
            spool.write(data)
            chosen[hadm] = (key, offset, len(data), why)

    if workers <= 1:
        for batch in batches():
            take(batch, _records([item for _, item, _ in batch], shown))
    else:
        pending: list = []
        with mp.get_context("spawn" if sys.platform == "darwin" else "fork").Pool(
                workers, initializer=_init_worker, initargs=(shown,)) as pool:
            for batch in batches():
                pending.append((batch, pool.apply_async(_records, ([item for _, item, _ in batch],))))
                while len(pending) > 4 * workers or (pending and pending[0][1].ready()):
                    done, result = pending.pop(0)
                    take(done, result.get())
            for done, result in pending:
                take(done, result.get())
    orphans, read = counts.get("notes_skipped_orphan", 0), counts.get("notes_read", 0)
    first = counts.pop("first_orphan_row", None)
    if orphans and orphans > max_orphan_share * read:
        raise InputError(f"{path}: row {first}: hadm_id: {orphans} of {read} notes ({orphans / read:.1%}) have a "
                         f"hadm_id in no row of "
                         f"admissions, more than max_orphan_share {max_orphan_share}: hosp/ and note/ are likely "
                         "from mismatched releases (MIMIC-IV and MIMIC-IV-Note versions)")
    return chosen


def read_icd_versions(path: Path, wanted: set[int]) -> dict[int, set[str]]:
    """hadm_id -> the ICD versions of its diagnoses_icd rows, for the admissions in `wanted` only."""
    out: dict[int, set[str]] = {}
    for row, r in rows(path, "diagnoses_icd"):
        hadm = _int(path, row, "hadm_id", r["hadm_id"])
        if hadm in wanted:
            out.setdefault(hadm, set()).add(r["icd_version"].strip())
    return out


def _drop(counts: Counts, why: str, visits: list) -> None:
    counts.add(f"patients_dropped_{why}")
    counts.add(f"visits_dropped_{why}", len(visits))


def _select(chosen, admissions, patients, cfg, counts: Counts, versions=None) -> dict[int, list[int]]:
    """subject_id -> its kept hadm_ids in visit order, after the selection rules (counted)."""
    by_subject: dict[int, list[int]] = {}
    for hadm in chosen:
        by_subject.setdefault(admissions[hadm].subject_id, []).append(hadm)
    counts["admissions_read"] = len(admissions)
    counts["admissions_without_note"] = len(admissions) - len(chosen)
    counts["patients_read"] = len(patients)
    counts["patients_without_note"] = len(patients) - len(by_subject)
    kept: dict[int, list[int]] = {}
    for sid in sorted(by_subject):
        visits = sorted(by_subject[sid], key=lambda h: (admissions[h].admittime, h))
        age = patients[sid][1]
        if cfg["adults_only"] and (age is None or age < 18):
            _drop(counts, "not_adult", visits)
        elif versions is not None and any(versions.get(h, set()) != {str(cfg["icd_version"])} for h in visits):
            _drop(counts, "other_icd_version", visits)
        elif len(visits) < cfg["min_visits"]:
            _drop(counts, "fewer_than_min_visits", visits)
        elif cfg["max_visits"] is not None and len(visits) > cfg["max_visits"]:
            _drop(counts, "more_than_max_visits", visits)
        else:
            kept[sid] = visits
    return kept


def _sample(kept: dict[int, list[int]], has_target, cfg, counts: Counts) -> dict[int, list[int]]:
    """max_patients: a seeded sample from the patients whose every visit has a target."""
    if cfg["max_patients"] is None:
        return kept
    pool = [sid for sid, visits in kept.items() if all(has_target(h) for h in visits)]
    counts["patients_not_eligible_for_sample_empty_target"] = len(kept) - len(pool)
    if len(pool) > cfg["max_patients"]:
        pool = sorted(random.Random(cfg["patient_seed"]).sample(pool, cfg["max_patients"]))
    counts["patients_not_sampled"] = len(kept) - counts["patients_not_eligible_for_sample_empty_target"] - len(pool)
    return {sid: kept[sid] for sid in pool}


def _admitted(admittime: str) -> date | None:
    try:
        return date.fromisoformat(admittime[:10])
    except ValueError:
        return None


def _patient_json(sid: int, hadms: list[int], chosen, spool, patients, icd, coverage: Counts, targets: Counts,
                  leak: Audit) -> str:
    """The patient's line of the cohort: what json.dumps of its record writes, composed from the lines the
    workers encoded (json's ", " and ": " separators, ensure_ascii off), decoding only the small meta line."""
    visits = []
    sex = json.dumps(patients[sid][0] or None, ensure_ascii=False)
    for number, hadm in enumerate(hadms, 1):
        _, offset, length, why = chosen[hadm]
        spool.seek(offset)
        meta_line, clinical = spool.read(length).decode("utf-8", "surrogatepass").rstrip("\n").split("\n", 1)
        meta = json.loads(meta_line)
        for name in meta["has"]:
            coverage[name] = coverage.get(name, 0) + 1
        signals = meta["signals"]
        if icd is not None:  # the icd titles are the target; the audit's target_verbatim is against them
            sections = json.loads(clinical)
            del sections["discharge_diagnosis"]
            names = icd.get(hadm, [])
            why = None if names else "no diagnoses_icd row"
            pattern = target_pattern(names)
            for name, kinds in signals.items():
                kinds[:] = [k for k in kinds if k not in ("target_verbatim", "any")]
                if pattern is not None and pattern.search(sections[name]):
                    kinds.append("target_verbatim")
                if kinds:
                    kinds.append("any")
            clinical = json.dumps({"discharge_diagnosis": sec.numbered(names), **sections}, ensure_ascii=False)
        targets.add("visits")
        if why:
            targets.add(f"empty: {why}")
        leak.add_signals(signals)
        leak.add_unplaced(meta["unplaced"])
        visits.append(f'{{"visit_id": {hadm}, "visit_number": {number}, "sex": {sex}, '
                      f'"allergies": {json.dumps(meta["allergies"], ensure_ascii=False)}, "clinical_sections": {clinical}}}')
    return f'{{"subject_id": {sid}, "visits": [{", ".join(visits)}]}}'


def build(hosp: str | Path, note: str | Path, out: str | Path, report: str | Path, cfg: dict | None = None
          ) -> dict:
    """The cohort JSON and its report from a PhysioNet folder; a full disk (the spool or the outputs) is one
    line, and nothing is left that looks complete (outputs are written atomically, the spool is anonymous)."""
    try:
        return _build(hosp, note, out, report, cfg)
    except OSError as exc:
        if exc.errno in (errno.ENOSPC, errno.EDQUOT):
            raise InputError(f"{Path(out).parent}: no space left on the device while building the cohort "
                             f"({os.strerror(exc.errno)}); free disk and rerun") from None
        raise


def _build(hosp: str | Path, note: str | Path, out: str | Path, report: str | Path, cfg: dict | None = None
           ) -> dict:
    cfg = {**DEFAULTS, **(cfg or {})}
    if unknown := sorted(set(cfg) - set(DEFAULTS) - {"hosp", "note"}):
        raise InputError(f"cfg: {unknown[0]}: not a setting of cohort.mimic_iv ({', '.join(DEFAULTS)})")
    if cfg["diagnoses"] not in ("note", "icd"):
        raise InputError(f"cfg: diagnoses: {cfg['diagnoses']!r}; expected note or icd")
    if cfg["icd_version"] not in (None, 9, 10):
        raise InputError(f"cfg: icd_version: {cfg['icd_version']!r}; expected 9, 10 or null")
    shown = Shown.of(cfg)
    paths = table_paths(hosp, note, cfg["diagnoses"], cfg["icd_version"])
    for table, path in paths.items():  # every file and header before the long stream
        if problem := header_problem(path, table):
            raise InputError(problem)
    counts, coverage, targets, leak = Counts(), Counts(), Counts(), Audit()
    patients = read_patients(paths["patients"])
    admissions = read_admissions(paths["admissions"], patients)
    Path(out).parent.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryFile(dir=Path(out).parent, prefix=f".{Path(out).name}.spool.") as spool:
        chosen = stream_notes(paths["discharge"], admissions, spool, counts, shown, cfg["workers"],
                              cfg["max_orphan_share"])
        versions = None if cfg["icd_version"] is None else read_icd_versions(paths["diagnoses_icd"], set(chosen))
        kept = _select(chosen, admissions, patients, cfg, counts, versions)
        icd = None
        if cfg["diagnoses"] == "icd":
            icd = read_icd(paths["diagnoses_icd"], paths["d_icd_diagnoses"], {h for v in kept.values() for h in v})
        kept = _sample(kept, (lambda h: bool(icd.get(h))) if icd is not None else (lambda h: chosen[h][3] is None),
                       cfg, counts)
        if not kept:
            raise InputError(f"{paths['discharge']}: no patient is left after selection "
                             f"({counts.get('patients_dropped_fewer_than_min_visits', 0)} have fewer than "
                             f"min_visits {cfg['min_visits']} visits with a note)")

        def write_cohort(tmp: Path) -> None:
            os.chmod(tmp, 0o600)
            with open(tmp, "w", encoding="utf-8", errors="surrogatepass") as fh:
                fh.write("[\n")
                fh.writelines((",\n" if i else "") + _patient_json(sid, hadms, chosen, spool, patients, icd, coverage,
                                                                     targets, leak)
                              for i, (sid, hadms) in enumerate(kept.items()))
                fh.write("\n]\n")

        summary: dict = {}

        def write_report(tmp: Path) -> None:  # after the cohort: coverage, targets and the audit are filled
            summary.update(_report(cfg, counts, coverage, kept, hosp, note, shown, targets, leak))
            tmp.write_text(io.json_text(summary))

        io.write_all({out: write_cohort, report: write_report})
    return summary


def _report(cfg, counts: Counts, coverage: Counts, kept, hosp, note, shown: Shown, targets: Counts, leak: Audit
            ) -> dict[str, Any]:
    """Counts only, never text."""
    withheld = {k.split(":", 1)[1]: v for k, v in sorted(counts.items()) if k.startswith("withheld_parts:")}
    return {
        "hosp": str(hosp), "note": str(note),
        "settings": {k: cfg[k] for k in DEFAULTS if k != "workers"},
        "mode": cfg["mode"],
        "shown_sections": {s: sec.RISK[s] for s in shown.sections},
        "leakage": shown.leakage(),
        "counts": {k: v for k, v in counts.items() if not k.startswith("withheld_parts:")},
        "withheld_parts": withheld,
        "targets": dict(targets),
        "patients_out": len(kept),
        "visits_out": sum(len(v) for v in kept.values()),
        "section_coverage": coverage,
        "leak_audit": leak.summary(),
        "withheld_discharge_time_text": [s for s in sec.DISCHARGE_TIME if s not in shown.sections + ("discharge_diagnosis",)]
        + ([f"{s}: every part not labelled admission (withheld_parts)" for s in sec.ADMISSION_AND_DISCHARGE]
           if shown.cut_mixed else []),
        "rules": [
            ("one visit per admission with a discharge note; the DS note with the lowest note_seq is used, "
             "later notes of the admission (addenda) are counted and not used"),
            ("notes whose hadm_id is in no admission are skipped (counts.notes_skipped_orphan), up to "
            f"{cfg['max_orphan_share']:.1%} of the notes"),
            "visits ordered by admittime, ties by hadm_id, numbered from 1",
            f"patients with fewer than {cfg['min_visits']} visits dropped",
            f"patients with more than {cfg['max_visits']} visits dropped" if cfg["max_visits"] else "no visit cap",
            "patients with anchor_age under 18 dropped" if cfg["adults_only"] else "no age rule",
            f"patients with a visit not coded in ICD-{cfg['icd_version']} dropped" if cfg["icd_version"]
            else "any ICD version",
            (f"a sample of {cfg['max_patients']} patients (seed {cfg['patient_seed']}) from those whose every "
             "visit has a target" if cfg["max_patients"] else "every patient kept"),
            "section_coverage: how many kept notes had each section (before withholding)",
            ("targets: visits written, and the visits whose target is empty by reason (clean_cohort drops "
            "their patients)"),
            "leak_audit: per shown section, visits holding each discharge-time signal (llmrnn.mimic.audit)",
        ],
    }
