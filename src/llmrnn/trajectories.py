"""Stage `trajectories` (Phase B): the LLM-as-RNN forward pass over train/val, dumped as verl parquets.

One row per (patient, visit_index t in [0, n-3]) where n is the patient's number of visits (after
`trajectories.max_visits`); the rubric needs visit t+1's prediction and evaluation, so the forward pass
runs visits 0..n-2 with memory updates at 0..n-3. Patients with fewer than 3 visits give no row and
are skipped (counted in the summary).

Scatter/gather: `llmrnn trajectories shard` runs the forward pass for shard k of K (patients assigned
by a deterministic balanced rule that depends only on the split file and K) and writes a part parquet
plus its stats; `llmrnn trajectories gather` concatenates the parts, orders rows by (patient_id,
visit_index), numbers them (extra_info.index) and writes {split}.parquet + {split}.summary.json
(rows, patients, unparsable outputs per role, prompt token lengths p50/p95/max). An empty split is an
error, so a val parquet with rows always exists when the DAG succeeds.

Row format (verl RLHFDataset): see PARQUET_COLUMNS / parquet_schema().
"""

from __future__ import annotations

import argparse
import logging
import os
import time
from pathlib import Path
from typing import Any

from llmrnn import io, kept
from llmrnn.cli import json_arg
from llmrnn.cohort import load_cohort
from llmrnn.constants import DATA_SOURCE
from llmrnn.errors import InputError
from llmrnn.models import model_folder
from llmrnn.prompts import load_prompts
from llmrnn.rnn import make_roles, run_forward
from llmrnn.runconfig import filled
from llmrnn.settings.trajectory_step import STEP_KEYS, read_step
from llmrnn.stats import percentile

log = logging.getLogger(__name__)

ABILITY = "clinical_summary"
REWARD_STYLE = "rubric"
MIN_VISITS = 3
PARQUET_COLUMNS = ("prompt", "data_source", "ability", "reward_model", "extra_info")
EXTRA_INFO_FIELDS = ("split", "patient_id", "visit_index", "visit_id", "index")
TRAJECTORY_STEP_KEYS = STEP_KEYS  # reward_model.ground_truth's keys, in the order written: the model's fields


def parquet_schema():
    """The exact arrow schema of a trajectory parquet (shards and gathered splits)."""
    import pyarrow as pa

    return pa.schema([
        ("prompt", pa.list_(pa.struct([("role", pa.string()), ("content", pa.string())]))),
        ("data_source", pa.string()),
        ("ability", pa.string()),
        ("reward_model", pa.struct([("style", pa.string()), ("ground_truth", pa.string())])),
        ("extra_info", pa.struct([
            ("split", pa.string()),
            ("patient_id", pa.string()),
            ("visit_index", pa.int64()),
            ("visit_id", pa.string()),
            ("index", pa.int64()),
        ])),
    ])


def patient_key(pid: Any) -> tuple:
    """Stable order of patient ids: numeric ids numerically, then text ids."""
    text = str(pid)
    return (0, int(text), "") if text.isdigit() else (1, 0, text)


def row_key(row: dict) -> tuple:
    return (*patient_key(row["extra_info"]["patient_id"]), int(row["extra_info"]["visit_index"]))


# ----------------------------------------------------------------------------- patients and shards
def eligible_patients(patients: list[dict], max_visits: int | None) -> tuple[list[dict], int]:
    """Patients with >= 3 visits (after truncation to max_visits), in stable id order; + number skipped."""
    kept = []
    for p in patients:
        visits = p["visits"][:max_visits] if max_visits else p["visits"]
        if len(visits) >= MIN_VISITS:
            kept.append({**p, "visits": visits})
    kept.sort(key=lambda p: patient_key(p["subject_id"]))
    return kept, len(patients) - len(kept)


def assign_shards(patients: list[dict], shards: int) -> list[list[dict]]:
    """Balanced, deterministic: longest patients first, each to the shard with the least work so far."""
    if shards < 1:
        raise InputError(f"trajectories.shards must be >= 1, got {shards}")
    parts: list[list[dict]] = [[] for _ in range(shards)]
    load = [0] * shards
    for p in sorted(patients, key=lambda p: (-len(p["visits"]), patient_key(p["subject_id"]))):
        k = min(range(shards), key=lambda i: (load[i], i))
        parts[k].append(p)
        load[k] += len(p["visits"])
    return [sorted(part, key=lambda p: patient_key(p["subject_id"])) for part in parts]


def shard_of(patients: list[dict], shard: int, shards: int) -> list[dict]:
    """Shard `shard` of `shards` (the one sharding policy of the forward pass: trajectories and eval)."""
    if not 0 <= shard < shards:
        raise InputError(f"shard {shard} out of range for {shards} shards")
    return assign_shards(patients, shards)[shard]


# ----------------------------------------------------------------------------- rows
def trajectory_rows(split: str, patients: list[dict], results: list[dict]) -> list[dict]:
    """verl rows for every (patient, t in [0, n-3]) from the forward-pass results of those patients."""
    rows = []
    for patient, res in zip(patients, results):
        visits, recs = patient["visits"], res["visits"]
        n = len(visits)
        for t in range(n - 2):
            cur, nxt = recs[t], recs[t + 1]
            step_fields = {
                "patient_id": res["patient_id"],
                "visit_index": t,
                "visit_id": cur["visit_id"],
                "update_prompt": cur["update_prompt"],
                "h_prev": cur["h_prev"],
                "h_ref": cur["h_new"],
                "visit": visits[t],
                "next_visit": visits[t + 1],
                "prediction": cur["prediction"] or {"top_5_diagnoses": [], "primary_diagnosis": ""},
                "evaluation": cur["evaluation"],
                "next_prediction": nxt["prediction"] or {"top_5_diagnoses": [], "primary_diagnosis": ""},
                "next_evaluation": nxt["evaluation"],
                "ground_truth_diagnoses": cur["ground_truth"],
                "next_ground_truth_diagnoses": nxt["ground_truth"],
                "parse_ok": {
                    "prediction": cur["prediction_ok"],
                    "evaluation": cur["evaluation_ok"],
                    "memory": cur["memory_ok"],
                    "next_prediction": nxt["prediction_ok"],
                    "next_evaluation": nxt["evaluation_ok"],
                },
            }
            # built through the model the reward reads it with: a wrong step stops here, not in training
            step = read_step(step_fields, f"trajectories {split}: patient {res['patient_id']} visit {t}")
            rows.append({
                "prompt": cur["update_messages"],
                "data_source": DATA_SOURCE,
                "ability": ABILITY,
                "reward_model": {"style": REWARD_STYLE, "ground_truth": step.to_ground_truth()},
                "extra_info": {
                    "split": split,
                    "patient_id": res["patient_id"],
                    "visit_index": t,
                    "visit_id": cur["visit_id"],
                    "index": -1,  # numbered at gather time, over the whole split
                },
            })
    return rows


def write_parquet(path: str | Path, rows: list[dict]) -> None:
    import pyarrow as pa
    import pyarrow.parquet as pq

    table = pa.Table.from_pylist(rows, schema=parquet_schema())
    with io.atomic_path(path) as tmp:
        pq.write_table(table, tmp)


def read_parquet(path: str | Path) -> list[dict]:
    import pyarrow.parquet as pq

    table = pq.read_table(path)
    if table.schema != parquet_schema():
        raise InputError(f"{path}: not a trajectory parquet (schema {table.schema.names})")
    return table.to_pylist()


# ----------------------------------------------------------------------------- shard
def run_shard(split: str, split_file: str | Path, shard: int, cfg: dict, prompts_file: str | Path,
              roles: dict | None = None, out: str | Path | None = None) -> tuple[list[dict], dict]:
    """Forward pass over shard `shard` of the split -> (rows, stats). With `out` (the shard's output) the
    finished rows are kept across a kill beside it (llmrnn.kept): a rerun continues after them."""
    tcfg = cfg["trajectories"]
    prompts = load_prompts(prompts_file)
    patients, skipped = eligible_patients(load_cohort(split_file), tcfg.get("max_visits"))
    shards = int(tcfg["shards"])
    mine = shard_of(patients, shard, shards)
    stats: dict = {}
    t0 = time.time()
    if mine:
        roles = roles or make_roles(cfg["roles"])
        log.info("%s shard %d/%d: %d patients, %d visits", split, shard + 1, shards, len(mine),
                 sum(len(p["visits"]) for p in mine))
        label = f"{split} shard {shard}"

        def work(chunk: list[dict]) -> tuple[list[dict], dict]:
            part_stats: dict = {}
            results = run_forward(
                chunk, roles, prompts, memory="rnn", seed=int(filled("trajectories", tcfg)["seed"]),
                last_visit=lambda p: len(p["visits"]) - 2, stats=part_stats, label=label,
            )
            return trajectory_rows(split, chunk, results), part_stats

        if out is None:
            rows, stats = work(mine)
        else:
            fingerprint = kept.fingerprint("trajectories shard", split, shard, cfg, io.sha256_file(prompts_file),
                                           [p.get("subject_id") for p in mine])
            rows, stats = kept.run_kept(mine, work, out, fingerprint, label)
    else:
        log.info("%s shard %d/%d: no patients", split, shard + 1, shards)
        rows = []
    stats.update(
        split=split, shard=shard, shards=shards, patients=len(mine), rows=len(rows),
        patients_skipped_short=skipped if shard == 0 else 0, seconds=round(time.time() - t0, 2),
    )
    return rows, stats


def _cmd_shard(args: argparse.Namespace) -> None:
    import torch

    torch.set_num_threads(max(1, int(args.threads or os.environ.get("OMP_NUM_THREADS") or 1)))
    rows, stats = run_shard(args.split, args.split_file, args.shard, args.cfg, args.prompts, out=args.out)
    write_parquet(args.out, rows)
    io.write_json(args.stats, stats)
    kept.finish(args.out)
    log.info("wrote %d rows to %s", len(rows), args.out)


# ----------------------------------------------------------------------------- gather
def prompt_token_lengths(rows: list[dict], tokenizer_dir: str | Path | None) -> tuple[list[int], str]:
    """Token length of each row's prompt as the trainer sees it (chat template of the memory model)."""
    if tokenizer_dir is None:
        return [len(r["prompt"][0]["content"]) for r in rows], "characters (no tokenizer given)"
    from transformers import AutoTokenizer


    tokenizer_dir = model_folder(tokenizer_dir)  # the rule passes the model's .ready marker
    tok = AutoTokenizer.from_pretrained(str(tokenizer_dir))
    texts = [tok.apply_chat_template(r["prompt"], tokenize=False, add_generation_prompt=True) for r in rows]
    ids = tok(texts, add_special_tokens=False)["input_ids"] if texts else []
    return [len(x) for x in ids], f"tokens ({tokenizer_dir}, chat template applied)"


def gather(split: str, parts: list[str | Path], stats_files: list[str | Path],
           tokenizer_dir: str | Path | None = None) -> tuple[list[dict], dict]:
    rows = [row for part in parts for row in read_parquet(part)]
    rows.sort(key=row_key)
    keys = [(r["extra_info"]["patient_id"], r["extra_info"]["visit_index"]) for r in rows]
    if len(set(keys)) != len(keys):
        raise InputError(f"trajectories {split}: duplicate (patient_id, visit_index) rows across shards")
    for i, row in enumerate(rows):
        row["extra_info"]["index"] = i
        if row["extra_info"]["split"] != split:
            raise InputError(f"trajectories {split}: a shard holds rows of split {row['extra_info']['split']}")
    stats = [io.read_json(s) for s in stats_files]
    if not rows:
        raise InputError(
            f"trajectories {split}: 0 rows; a row needs a patient with >= {MIN_VISITS} visits and this split "
            "has none (raise split sizes or trajectories.max_visits)"
        )
    lengths, unit = prompt_token_lengths(rows, tokenizer_dir)
    roles = ("prediction", "evaluation", "memory")

    def total(key: str, role: str) -> int:
        return sum(s.get(key, {}).get(role, 0) for s in stats)

    summary = {
        "split": split,
        "rows": len(rows),
        "patients": len({k[0] for k in keys}),
        "patients_skipped_short": sum(s.get("patients_skipped_short", 0) for s in stats),
        "shards": len(parts),
        "outputs": {r: total("outputs", r) for r in roles},
        "unparsable": {r: total("unparsable", r) for r in roles},
        "unparsable_rate": {
            r: (total("unparsable", r) / total("outputs", r)) if total("outputs", r) else None for r in roles
        },
        "backend_calls": {r: total("calls", r) for r in roles},
        "max_calls_per_role_per_step": max(
            (max(step.values()) for s in stats for step in s.get("calls_per_step", [])), default=0
        ),
        "prompt_length": {
            "unit": unit,
            "p50": percentile(lengths, 50, "inverted_cdf"),
            "p95": percentile(lengths, 95, "inverted_cdf"),
            "max": max(lengths),
        },
        "rows_with_memory_fallback": sum(
            1 for r in rows if not read_step(r["reward_model"]["ground_truth"], f"trajectories {split}: row "
                                             f"{r['extra_info']['index']}").parse_ok.memory
        ),
        "forward_seconds": round(sum(s.get("seconds", 0.0) for s in stats), 1),
    }
    return rows, summary


def _cmd_gather(args: argparse.Namespace) -> None:
    if len(args.parts) != len(args.stats):
        raise InputError("--parts and --stats must list the same shards")
    rows, summary = gather(args.split, args.parts, args.stats, args.tokenizer)
    write_parquet(args.out, rows)
    io.write_json(args.summary, summary)
    log.info("%s: %d rows from %d patients -> %s (unparsable %s)", args.split, summary["rows"],
             summary["patients"], args.out, summary["unparsable"])


def register(sub: argparse._SubParsersAction) -> None:
    tr = sub.add_parser("trajectories", help="LLM-as-RNN forward pass -> verl trajectory parquets")
    tsub = tr.add_subparsers(dest="trajectories_command", required=True)

    p = tsub.add_parser("shard", help="forward pass over one shard of a split -> part parquet + stats")
    p.add_argument("--split", required=True, choices=["train", "val"])
    p.add_argument("--split-file", required=True, help="the split's cohort JSON")
    p.add_argument("--shard", type=int, required=True)
    p.add_argument("--prompts", required=True, help="prompt template YAML (config prompts.file)")
    p.add_argument("--cfg", type=json_arg, required=True, help="JSON: {roles, models, trajectories}")
    p.add_argument("--threads", type=int, default=None, help="torch CPU threads (default OMP_NUM_THREADS or 1)")
    p.add_argument("--out", required=True, help="output: part_<k>.parquet")
    p.add_argument("--stats", required=True, help="output: part_<k>.stats.json")
    p.set_defaults(func=_cmd_shard)

    p = tsub.add_parser("gather", help="part parquets -> {split}.parquet + {split}.summary.json")
    p.add_argument("--split", required=True, choices=["train", "val"])
    p.add_argument("--parts", nargs="+", required=True)
    p.add_argument("--stats", nargs="+", required=True)
    p.add_argument("--tokenizer", default=None, help="memory model dir, for prompt token lengths")
    p.add_argument("--out", required=True)
    p.add_argument("--summary", required=True)
    p.set_defaults(func=_cmd_gather)
