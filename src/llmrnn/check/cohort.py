"""The cohort (memory head) and the QA data (recipe qa) load as their stages read them, and the splits fit;
no patient or visit id of the file is repeated in a problem line."""

from __future__ import annotations

import json
import re
from pathlib import Path

from llmrnn.cohort import clean_cohort, load_cohort, synthesize_cohort
from llmrnn.configcheck import cohort_is_synthetic, shard_problems
from llmrnn.errors import LlmrnnError
from llmrnn.io import read_regular_bytes
from llmrnn.mimic.tables import folder_problems
from llmrnn.qa.data import filter_records, load_records, load_records_from, split_units
from llmrnn.qa.synth import questions_from_cohort
from llmrnn.runconfig import filled


def withhold_ids(message: str, source: str | Path) -> str:
    """A cohort problem as check prints it (to the terminal and to logs/RUN/check.log): the patient is
    named by its record number in the file, and no patient or visit id of the file is repeated."""
    try:  # the input rule (llmrnn.io): a fifo or device here is refused, not read
        data = json.loads(read_regular_bytes(source, "cohort file").decode("utf-8-sig"))
    except (LlmrnnError, ValueError, RecursionError):
        return message  # not JSON: the loader's message names a line and column, no record
    records = [r if isinstance(r, dict) else {} for r in data] if isinstance(data, list) else []
    for n, record in enumerate(records):
        if record.get("subject_id") is not None:
            message = re.sub(rf"\bpatient {re.escape(str(record['subject_id']))}(?=[ :])", f"record {n}", message)
    ids = {str(i) for r in records for i in [r.get("subject_id"), *(v.get("visit_id") for v in r.get("visits") or []
                                                                   if isinstance(v, dict))]
           if i is not None and len(str(i)) >= 3}
    for value in sorted(ids, key=len, reverse=True):
        message = re.sub(rf"(?<![\w-]){re.escape(value)}(?![\w-])", "<id withheld>", message)
    return message


def check_cohort(config: dict) -> list[str]:
    """The cohort loads, and the split sizes fit the CLEANED cohort (split_cohort's input), so a cohort
    too small for the configured splits fails here, not hours later at split time."""
    cohort = filled("cohort", config.get("cohort"))
    source = cohort["source"]
    if source == "mimic_iv" and not cohort_is_synthetic(cohort):
        mimic = cohort["mimic_iv"]
        return [f"cohort.mimic_iv: {p}" for p in folder_problems(mimic["hosp"], mimic["note"], mimic["diagnoses"],
                                                                            mimic.get("icd_version"))]
    if cohort_is_synthetic(cohort):  # also the synthetic PhysioNet files: they build back into this cohort
        synth = cohort["synthetic"]
        if synth.get("patients") is None or synth.get("seed") is None:
            return []  # the schema check names the missing key
        patients = synthesize_cohort(int(synth["patients"]), int(synth["seed"]))
    else:
        if "{" in source or "}" in source:
            return [(f"cohort.source: {source!r} contains a brace, which Snakemake reads as a wildcard; "
                    "rename the file or its folder")]
        if not Path(source).exists():
            return [f"cohort.source: {source} does not exist (the cleaned cohort JSON in LLM-as-RNN format)"]
        try:
            patients = load_cohort(source)
        except LlmrnnError as exc:
            return [f"cohort.source: {withhold_ids(str(exc), source)}"]
    if config.get("recipe") == "qa":
        return []  # the qa recipe splits questions (qa.split, check_qa_data), not the cohort
    kept, _ = clean_cohort(patients)
    split = filled("split", config.get("split"))
    need = int(split["val_size"]) + int(split["train_size"]) + 1
    if len(kept) < need:
        return [(f"cohort.source: {source} has {len(kept)} patients after cleaning ({len(patients)} before); "
                 f"split needs at least {need} (val_size {split['val_size']} + train_size "
                 f"{split['train_size']} + a test set)")]
    if cohort_is_synthetic(cohort):
        return []  # load_config's shard check already bounds the synthetic test split

    return [f"config: {p}" for p in shard_problems(config, len(kept) - need + 1) if p.startswith("eval.")]


def _qa_records(config: dict, source: str) -> list[dict] | str | None:
    """The QA records the qa data stage would read from `source` (None: not checkable here, an hf: dataset),
    or why they cannot be read."""
    qa = config.get("qa") or {}
    try:
        if source == "synthetic":  # what qa_synth makes of the synthetic cohort
            synth = filled("cohort.synthetic", (config.get("cohort") or {}).get("synthetic"))
            qsynth = filled("qa.synthetic", qa.get("synthetic"))
            patients = synthesize_cohort(int(synth["patients"]), int(synth["seed"]))
            raw, _ = questions_from_cohort(patients, int(qsynth["seed"]), qsynth["max_questions"])
            return load_records_from(raw, qa.get("fields"), "qa synth")
        if source.startswith("hf:"):
            return "hf: names no dataset" if not source[3:].strip() else None
        if "{" in source or "}" in source:
            return f"{source!r} contains a brace, which Snakemake reads as a wildcard; rename the file"
        if not Path(source).is_file():
            return f"{source} is not a file (a JSON/JSONL QA file, hf:<dataset>, or synthetic)"
        return load_records(source, qa.get("fields"), qa.get("dataset"))
    except LlmrnnError as exc:
        return str(exc)


def check_qa_data(config: dict) -> list[str]:
    """recipe qa: the QA source reads as the qa data stage reads it, and qa.split fits the groups left
    after filtering (so neither fails hours later at run time); the OOD set, when a file, exists."""
    qa = config.get("qa") or {}
    problems = []
    ood = qa.get("ood")
    if ood and ood != "synthetic" and not ood.startswith("hf:") and not Path(ood).is_file():
        problems.append(f"qa.ood: {ood} is not a file (a JSON/JSONL QA file, hf:<dataset>, synthetic or null)")
    source = str(filled("qa", qa)["source"])
    records = _qa_records(config, source)
    if records is None:
        return problems
    if isinstance(records, str):
        return [*problems, f"qa.source: {records}"]
    if not records:
        return [*problems, f"qa.source: {source} holds no QA records (the file is empty)"]
    kept, _ = filter_records(records, qa.get("filter"))
    groups = len(set(split_units(kept).values()))
    split = filled("qa.split", qa.get("split"))
    val, test = int(split["val_size"]), int(split["test_size"])
    if val + test >= groups:
        problems.append(f"qa.split: val_size {val} + test_size {test} leave no train group: {source} has "
                        f"{groups} groups after filtering ({len(kept)} of {len(records)} records kept)")
    return problems
