"""QA data stage: read records (JSON / JSONL file or a `datasets` name/path), filter, split, write.

Records are normalised to {id, question, answer, options?, context?, reasoning?, group} with field
names from `qa.fields`. Filter pipeline, in order (counts in splits.json): length (question and answer
chars), dedupe (normalised question text; the first wins), answer parseable (an MC answer must name one
of the options; any answer must survive normalisation). The dedupe key is the normalised question text
alone: the same question with other options or distractors is a duplicate. Splits are seeded, by group
(`qa.fields.group`: e.g. the patient or recording, so all its questions share a split; the patient for
questions made from the cohort; else the record), val then test sampled, train = the rest. Groups that
share a normalised question are split as one unit (so even with dedupe off, no question is in two
splits); zero overlap of ids, groups and normalised questions is asserted; each split's sha256 is recorded.

Outputs: {train,val,test}.jsonl (records), {train,val}.parquet (verl RLHFDataset rows), sft_{train,val}.jsonl
(chat messages with the target answer), ood.jsonl (the optional OOD set, filtered the same way), splits.json.
"""

from __future__ import annotations

import json
import logging
import math
import os
import random
import re
from collections import Counter
from pathlib import Path
from typing import Any

from llmrnn import io
from llmrnn.errors import InputError
from llmrnn.qa.rewards import DATA_SOURCE, normalize_answer, normalize_text
from llmrnn.runconfig import filled
from llmrnn.settings import section_defaults

log = logging.getLogger(__name__)

FIELD_DEFAULTS = section_defaults("qa.fields")  # the one home of config defaults: llmrnn.settings
FILTER_DEFAULTS = section_defaults("qa.filter")
SYSTEM_PROMPT = (
    "You are a careful clinician. Think briefly, then answer. Respond exactly in this format:\n"
    "<reasoning>\n...\n</reasoning>\n<answer>\n...\n</answer>"
)


# ----------------------------------------------------------------------------- reading
def read_source(source: str, dataset: dict | None = None) -> tuple[list[Any], str]:
    """Raw records and a label: a .json list, a .jsonl file, or `hf:<name or path>` through `datasets`."""
    dataset = filled("qa.dataset", dataset)
    if source.startswith("hf:"):
        name = source[3:]
        try:
            from datasets import load_dataset, load_from_disk

            if Path(name).is_dir() and (Path(name) / "dataset_info.json").exists():
                ds = load_from_disk(name)
                ds = ds[dataset["split"]] if hasattr(ds, "keys") else ds
            else:
                ds = load_dataset(name, dataset["config"], split=dataset["split"])
        except Exception as exc:
            raise InputError(f"{source}: cannot load the dataset: {str(exc).splitlines()[0]}") from exc
        return list(ds), source
    path = Path(source)
    # the input rule (io.open_regular): a missing file, a folder, a fifo or a device is one line, never a hang
    if path.suffix == ".jsonl":
        return io.read_jsonl(path, what="QA file"), str(path)
    # the reader policy the cohort loader uses too (UTF-8, optional BOM); deep nesting is one line
    rows = io.loads_input(io.read_input_text(path, "QA file"), str(path))
    if not isinstance(rows, list):
        raise InputError(f"{path}: expected a JSON list of QA records")
    return rows, str(path)


SURROGATE = re.compile("[\ud800-\udfff]")


def _scalar_text(value: Any, where: str, field: str) -> str:
    """A scalar as text: a string, or a finite number (not a bool). Anything else (a nested list or
    object, NaN/Infinity, a lone surrogate that no output file could encode) is one InputError line."""
    if isinstance(value, str):
        if SURROGATE.search(value):
            raise InputError(f"{where}: {field}: lone surrogate (\\ud800-\\udfff escape without its pair): "
                             "not encodable text")
        return value
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise InputError(f"{where}: {field}: expected text or a number, got {type(value).__name__}")
    if isinstance(value, float) and not math.isfinite(value):
        raise InputError(f"{where}: {field}: {value} is not a value (NaN and infinities are refused)")
    return str(value)


def _options(value: Any, where: str, field: str = "options") -> dict | None:
    """Options as {letter: text}: a dict, or a list (lettered a, b, c ...); each option is a scalar."""
    if value in (None, "", [], {}):
        return None
    if isinstance(value, list):
        return {chr(ord("A") + i): _scalar_text(v, where, f"{field}[{i}]") for i, v in enumerate(value)}
    if isinstance(value, dict) and all(isinstance(k, str) and len(k.strip()) == 1 for k in value):
        return {_scalar_text(k, where, f"{field} key").strip().upper(): _scalar_text(v, where, f"{field}.{k}")
                for k, v in value.items()}
    raise InputError(f"{where}: {field}: expected a list or a {{letter: text}} object")


def normalise_record(raw: Any, fields: dict, where: str) -> dict:
    """One record in the common shape; a missing/ill-typed field is one line naming file, record, field."""
    if not isinstance(raw, dict):
        raise InputError(f"{where}: expected an object, got {type(raw).__name__}")
    rid = raw.get(fields["id"])
    rid = _scalar_text(rid, where, fields["id"]) if rid is not None else None
    where = f"{where} (id {rid})" if rid is not None else where
    rec: dict[str, Any] = {"id": rid}
    for key in ("question", "answer"):
        value = raw.get(fields[key])
        if key == "answer" and value is not None and not isinstance(value, str):
            value = _scalar_text(value, where, fields[key])  # 3 -> "3"; NaN, [..], {..} refused
        if not isinstance(value, str) or not value.strip():
            raise InputError(f"{where}: {fields[key]}: missing or not a non-empty string")
        rec[key] = _scalar_text(value, where, fields[key]).strip()
    rec["options"] = _options(raw.get(fields["options"]), where)
    for key in ("context", "reasoning"):
        value = raw.get(fields[key])
        if value is not None and not isinstance(value, str):
            raise InputError(f"{where}: {fields[key]}: expected a string")
        value = _scalar_text(value, where, fields[key]) if value is not None else None
        rec[key] = value.strip() if isinstance(value, str) and value.strip() else None
    group = raw.get(fields["group"])
    rec["group"] = _scalar_text(group, where, fields["group"]) if group is not None else None
    return rec


def generated_id(position: int) -> str:
    """The id of a record that has none: its position (not data: the record is marked `id_generated`, and
    the PHI guard leaves out exactly the ids so marked, never an id by its shape)."""
    return f"q{position:06d}"


def load_records(source: str, fields: dict | None = None, dataset: dict | None = None) -> list[dict]:
    raw, label = read_source(source, dataset)
    return load_records_from(raw, fields, label)


def load_records_from(raw: list, fields: dict | None = None, label: str = "records") -> list[dict]:
    """Normalised records from raw dicts; ids default to the position, groups to the id."""
    fields = {**FIELD_DEFAULTS, **(fields or {})}
    records = [normalise_record(r, fields, f"{label}: record {i}") for i, r in enumerate(raw)]
    for i, rec in enumerate(records):
        if not rec["id"]:  # provenance, recorded: the PHI guard exempts exactly these ids, not their shape
            rec["id"], rec["id_generated"] = generated_id(i), True
        rec["group"] = rec["group"] or rec["id"]
    ids = [r["id"] for r in records]
    if len(set(ids)) != len(ids):
        dup = next(i for i in ids if ids.count(i) > 1)
        raise InputError(f"{label}: id {dup}: appears more than once")
    return records


# ----------------------------------------------------------------------------- filters + splits
def question_key(question: str) -> str:
    """The dedupe / overlap key of a question: its normalised text (case, punctuation, articles)."""
    return normalize_text(question)


def states_answer(question: str, answer_text: str) -> bool:
    """Whether the (normalised) question contains the (normalised) answer text as whole words."""
    q, a = f" {normalize_text(question)} ", f" {normalize_text(answer_text)} "
    return a.strip() != "" and a in q


def correct_option_text(rec: dict) -> str | None:
    """The text of a multiple-choice record's correct option (None for free text)."""
    if not rec.get("options"):
        return None
    letter = normalize_answer(rec["answer"], rec["options"])
    return next((str(v) for k, v in rec["options"].items() if k.lower() == letter), None)


def data_checks(splits: dict[str, list[dict]]) -> dict:
    """What the splits let a model get right without skill (splits.json `checks`): questions that state
    their correct option's text, questions repeating a train question (normalised text), and the share of
    each split whose answer is the train split's most common one."""
    train_keys = {question_key(r["question"]) for r in splits.get("train", [])}
    answers = Counter(normalize_answer(r["answer"], r["options"]) for r in splits.get("train", []))
    common = answers.most_common(1)[0][0] if answers else None
    out: dict[str, Any] = {"states_correct_option": {}, "repeats_train_question": {},
                           "most_common_train_answer": {"answer": common, "share": {}}}
    for name, part in splits.items():
        out["states_correct_option"][name] = sum(
            bool(text) and states_answer(r["question"], text) for r in part for text in [correct_option_text(r)])
        if name != "train":
            out["repeats_train_question"][name] = sum(question_key(r["question"]) in train_keys for r in part)
        hits = [normalize_answer(r["answer"], r["options"]) == common for r in part]
        out["most_common_train_answer"]["share"][name] = sum(hits) / len(hits) if hits else None
    return out


def filter_records(records: list[dict], cfg: dict | None = None) -> tuple[list[dict], dict]:
    cfg = {**FILTER_DEFAULTS, **(cfg or {})}
    counts = {"input": len(records), "too_short": 0, "too_long": 0, "duplicate": 0, "unparseable_answer": 0}
    seen: set[str] = set()
    kept = []
    for rec in records:
        q, a = rec["question"], rec["answer"]
        if len(q) < cfg["min_question_chars"]:
            counts["too_short"] += 1
            continue
        if len(q) > cfg["max_question_chars"] or len(a) > cfg["max_answer_chars"]:
            counts["too_long"] += 1
            continue
        key = question_key(q)  # options ignored: other distractors do not make another question
        if cfg["dedupe"] and key in seen:
            counts["duplicate"] += 1
            continue
        norm = normalize_answer(a, rec["options"])
        if not norm or rec["options"] and norm not in {k.lower() for k in rec["options"]}:
            counts["unparseable_answer"] += 1
            continue
        seen.add(key)
        kept.append(rec)
    counts["kept"] = len(kept)
    return kept, counts


def split_units(records: list[dict]) -> dict[str, str]:
    """group -> its split unit: groups joined when they share a normalised question (union-find), so a
    question asked in two groups cannot land in two splits; the unit is named by its smallest group."""
    parent: dict[str, str] = {}

    def find(g: str) -> str:
        parent.setdefault(g, g)
        while parent[g] != g:
            parent[g] = parent[parent[g]]
            g = parent[g]
        return g

    first_group: dict[str, str] = {}
    for rec in records:
        find(rec["group"])
        other = first_group.setdefault(question_key(rec["question"]), rec["group"])
        a, b = find(other), find(rec["group"])
        if a != b:
            parent[max(a, b)] = min(a, b)
    return {g: find(g) for g in parent}


def split_records(records: list[dict], val_size: int, test_size: int, seed: int) -> dict[str, list[dict]]:
    """val then test sampled by group with the seed; train = the rest. Sizes count groups (groups that share
    a question count as one)."""
    unit_of = split_units(records)
    units = sorted(set(unit_of.values()))
    if val_size < 1 or test_size < 1 or val_size + test_size >= len(units):
        raise InputError(
            f"qa.split: val_size {val_size} + test_size {test_size} must be >= 1 each and leave train groups "
            f"out of {len(units)} groups after filtering")
    rng = random.Random(seed)
    rng.shuffle(units)
    which = {u: "val" for u in units[:val_size]}
    which.update({u: "test" for u in units[val_size:val_size + test_size]})
    splits: dict[str, list[dict]] = {"train": [], "val": [], "test": []}
    for rec in records:
        splits[which.get(unit_of[rec["group"]], "train")].append(rec)
    for key in ("id", "group", "question"):
        sets = {name: {question_key(r[key]) if key == "question" else r[key] for r in part}
                for name, part in splits.items()}
        overlap = (sets["train"] & sets["val"]) | (sets["train"] & sets["test"]) | (sets["val"] & sets["test"])
        assert not overlap, f"qa split overlap on {key}: {sorted(overlap)[:5]}"
    return splits


# ----------------------------------------------------------------------------- prompts + writers
def user_prompt(rec: dict) -> str:
    parts = []
    if rec.get("context"):
        parts.append(f"Context:\n{rec['context']}")
    parts.append(f"Question:\n{rec['question']}")
    if rec.get("options"):
        parts.append("Options:\n" + "\n".join(f"{k}) {v}" for k, v in rec["options"].items()))
        parts.append("Answer with the letter of one option.")
    return "\n\n".join(parts)


def messages(rec: dict, system: str = SYSTEM_PROMPT) -> list[dict]:
    return [{"role": "system", "content": system}, {"role": "user", "content": user_prompt(rec)}]


def target_text(rec: dict) -> str:
    """The SFT target in the rewarded format."""
    reasoning = rec.get("reasoning") or "I compare the question with what I know and pick the best answer."
    return f"<reasoning>\n{reasoning}\n</reasoning>\n<answer>\n{rec['answer']}\n</answer>"


def ground_truth(rec: dict) -> str:
    return json.dumps({"answer": rec["answer"], "options": rec["options"], "question": rec["question"]},
                      sort_keys=True, ensure_ascii=False)


def rl_rows(records: list[dict], split: str, system: str) -> list[dict]:
    return [
        {
            "prompt": messages(rec, system),
            "data_source": DATA_SOURCE,
            "ability": "medical_qa",
            "reward_model": {"style": "rule", "ground_truth": ground_truth(rec)},
            "extra_info": {"split": split, "index": i, "id": rec["id"]},
        }
        for i, rec in enumerate(records)
    ]


def jsonl_bytes(rows: list[dict]) -> bytes:
    """What io.write_jsonl writes, as bytes (hashed into splits.json before anything is written)."""
    return "".join(json.dumps(r, ensure_ascii=False, sort_keys=True) + "\n" for r in rows).encode("utf-8")


def write_hashed(path: str | os.PathLike, rows: list[dict]) -> str:
    """io.write_jsonl, returning the sha256 of what was written (recorded in splits.json)."""
    io.write_jsonl(path, rows)
    return io.sha256_file(path)


def write_parquet(path: str | os.PathLike, rows: list[dict]) -> None:
    if not rows:
        raise InputError(f"{path}: no rows to write")
    with io.atomic_path(path) as tmp:
        _parquet_to(tmp, rows)


def _parquet_to(path: Path, rows: list[dict]) -> None:
    import pyarrow as pa
    import pyarrow.parquet as pq

    pq.write_table(pa.Table.from_pylist(rows), path)


OUTPUTS = ("train", "val", "test", "ood", "train_parquet", "val_parquet", "sft_train", "sft_val", "summary")


def prepare(cfg: dict, outputs: dict[str, str], source: str, ood: str | None = None) -> dict:
    """The whole stage; everything is written only after every record was read and checked.
    `outputs` names each file (keys: OUTPUTS)."""
    missing = [k for k in OUTPUTS if not outputs.get(k)]
    if missing:
        raise InputError(f"qa data: output path(s) missing: {missing}")
    fields, dataset = cfg.get("fields"), cfg.get("dataset")
    raw = load_records(source, fields, dataset)
    if not raw:  # say so, rather than that no split sizes fit 0 groups
        raise InputError(f"{source}: holds no QA records (the file is empty)")
    records, counts = filter_records(raw, cfg.get("filter"))
    if not records:
        raise InputError(f"{source}: no QA record is left after filtering ({counts}); see qa.filter")
    split_cfg = filled("qa.split", cfg.get("split"))
    splits = split_records(records, int(split_cfg["val_size"]), int(split_cfg["test_size"]), int(split_cfg["seed"]))
    ood_records: list[dict] = []
    ood_counts = None
    if ood:
        ood_records, ood_counts = filter_records(load_records(ood, fields, dataset), cfg.get("filter"))
        seen = {question_key(r["question"]) for r in records}
        ood_records = [r for r in ood_records if question_key(r["question"]) not in seen]
    system = (cfg.get("prompt") or {}).get("system") or SYSTEM_PROMPT
    files = {name: jsonl_bytes(part) for name, part in splits.items()} | {"ood": jsonl_bytes(ood_records)}
    hashes = {name: io.sha256_bytes(data) for name, data in files.items()}
    for name in ("train", "val"):
        files[f"sft_{name}"] = jsonl_bytes(
            [{"messages": [*messages(r, system), {"role": "assistant", "content": target_text(r)}]}
             for r in splits[name]])
        if not splits[name]:
            raise InputError(f"{outputs[f'{name}_parquet']}: no rows to write")
    summary = {
        "source": source,
        "filter": counts,
        "sizes": {name: len(part) for name, part in splits.items()} | {"ood": len(ood_records)},
        "groups": {name: len({r["group"] for r in part}) for name, part in splits.items()},
        "seed": int(split_cfg["seed"]),
        "sha256": hashes,
        "overlap": 0,
        "ood_filter": ood_counts,
        "checks": data_checks({**splits, "ood": ood_records}),
    }
    # every output or none (a full disk half-way leaves nothing that looks complete)
    writers = {outputs[name]: (lambda tmp, data=data: tmp.write_bytes(data)) for name, data in files.items()}
    for name in ("train", "val"):
        rows = rl_rows(splits[name], name, system)
        writers[outputs[f"{name}_parquet"]] = lambda tmp, rows=rows: _parquet_to(tmp, rows)
    writers[outputs["summary"]] = lambda tmp: tmp.write_text(io.json_text(summary), encoding="utf-8")
    io.write_all(writers)
    log.info("qa data: %s; checks %s", json.dumps(summary["sizes"]), json.dumps(summary["checks"]))
    return summary


def output_paths(out_dir: str | os.PathLike) -> dict[str, str]:
    """The stage's files under one folder, by the names the rule gives them (for tests and scripts)."""
    out = Path(out_dir)
    names = {"train_parquet": "train.parquet", "val_parquet": "val.parquet", "summary": "splits.json"}
    return {k: str(out / names.get(k, f"{k}.jsonl")) for k in OUTPUTS}
