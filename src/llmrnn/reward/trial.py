"""`llmrnn reward try` (llmrnn.reward.trial): a reward on the first rows of a run's trajectory parquet, before any training.

    llmrnn reward try --run results/RUN [--split train] [--rows 5]          # the reward RUN/config.yaml names
    llmrnn reward try --run results/RUN --custom my_reward.py                # your own reward file instead
    llmrnn reward try --parquet P [--configfile F ...] --endpoint E          # a judged mode needs the judge

Each row's candidate memory (`--memory`: the row's reference memory h_ref by default) is scored as the
policy's output, by the reward training would use: the built-in one through verl's per-sample entry
(llmrnn.reward.compute_score, with the settings `train run` passes), or your file under the same contract
as training (llmrnn.reward.custom: its child process, time limit, one conversion). One line a row: its score
and the reward's diagnostics. A missing parquet, a row whose step lacks a field or holds a wrong type
(llmrnn.settings.trajectory_step) or a reward that fails is one line and a non-zero exit. The reward's audit
(the rows' text) goes to a private temporary folder unless `--audit-dir` names one.
"""

from __future__ import annotations

import argparse
import json
import tempfile
from pathlib import Path
from typing import Any

from llmrnn.errors import InputError, doc_summary
from llmrnn.reward.config import reward_settings
from llmrnn.reward.custom import custom_of, field_problem, open_custom
from llmrnn.reward.entry import PUBLIC_KEYS, compute_score
from llmrnn.reward.kwargs import reward_kwargs
from llmrnn.reward.modes import reward_mode
from llmrnn.runconfig import configfiles_for, load_any, read_layer, resolve
from llmrnn.settings.trajectory_step import read_step

EMPTY_MEMORY = json.dumps({"evolving_summary": ""})
MEMORIES = ("h_ref", "h_prev", "empty")
ROW_COLUMNS = ("row", "patient_id", "visit_index")
COLUMNS = ("data_source", "reward_model", "extra_info")  # what scoring a row reads


def run_config(run: str | None, configfiles: list[str]) -> dict:
    """The effective config: the run's (RUN/config.yaml) or the named files layered (none: config/config.yaml)."""
    if run and configfiles:
        raise InputError("reward try: give --run or --configfile, not both")
    if run:
        return load_any(run)["config"]
    config, _ = resolve([read_layer(p) for p in configfiles_for(configfiles)])
    return config


def parquet_of(parquet: str | None, run: str | None, split: str) -> Path:
    if parquet:
        return Path(parquet)
    if not run:
        raise InputError("reward try: name the rows: --run results/RUN or --parquet FILE")
    folder = Path(run).parent if Path(run).is_file() else Path(run)  # a run's folder or its config.yaml
    return folder / "trajectories" / f"{split}.parquet"


def first_rows(path: Path, n: int) -> list[dict]:
    """The first n rows, each step read through its model (a bad one is one line naming the row and field).
    Read here with pyarrow, not llmrnn.train.data's reader: the reward sits below the training stage. Only the
    columns scoring reads, in batches of at most n rows, until n are read: a large parquet is never decoded
    whole (a 2 GB-decoded parquet peaks near what its first n rows need)."""
    import pyarrow.parquet as pq

    if not path.is_file():
        raise InputError(f"{path}: trajectory parquet not found")
    try:
        parquet = pq.ParquetFile(path)
        names = parquet.schema_arrow.names
    except Exception as exc:  # noqa: BLE001 - whatever arrow says of a file that is not a parquet
        raise InputError(f"{path}: not a readable parquet file: {_one_line(exc)}") from None
    missing = [c for c in COLUMNS if c not in names]
    if missing:
        raise InputError(f"{path}: missing column(s) {missing}; expected a trajectory parquet")
    rows: list[dict] = []
    try:
        for batch in parquet.iter_batches(batch_size=n, columns=list(COLUMNS), use_threads=False):
            rows += batch.to_pylist()[: n - len(rows)]
            if len(rows) >= n:
                break
    except Exception as exc:  # noqa: BLE001 - a damaged file: arrow's own words, one line
        raise InputError(f"{path}: not a readable parquet file: {_one_line(exc)}") from None
    if not rows:
        raise InputError(f"{path}: no rows")
    for i, row in enumerate(rows):
        row["step"] = _row_step(row, f"{path}: row {i}")
    return rows


def _one_line(exc: BaseException) -> str:
    return " ".join(str(exc).split())[:300] or type(exc).__name__


def _row_step(row: dict, where: str):
    """The row's trajectory step, its fields checked first: each problem is one line naming the row and field."""
    if not isinstance(row.get("data_source"), str):
        raise InputError(f"{where}: data_source: expected text, got {_kind(row.get('data_source'))}")
    info = row.get("extra_info")
    if not isinstance(info, dict):
        raise InputError(f"{where}: extra_info: expected a mapping (split, index, patient_id, visit_index), "
                         f"got {_kind(info)}")
    if (problem := field_problem(info)) is not None:
        raise InputError(f"{where}: extra_info {problem}")
    reward_model = row.get("reward_model")
    if not isinstance(reward_model, dict) or reward_model.get("ground_truth") is None:
        raise InputError(f"{where}: reward_model: expected a mapping with ground_truth (the step's JSON), "
                         f"got {_kind(reward_model)}")
    try:
        return read_step(reward_model["ground_truth"], where)
    except RecursionError:
        raise InputError(f"{where}: reward_model.ground_truth: nested too deeply to read") from None


def _kind(value: Any) -> str:
    return "null" if value is None else type(value).__name__


def candidate(row: dict, memory: str) -> str:
    """The memory scored as the policy's output: the row's h_ref or h_prev (JSON text), or an empty memory."""
    return EMPTY_MEMORY if memory == "empty" else getattr(row["step"], memory)


def score_rows(rows: list[dict], config: dict, memory: str, endpoint: str | None, audit_dir: str,
               where: Path) -> tuple[list[str], list[dict]]:
    """(diagnostic columns, one result a row) of the configured reward on the rows."""
    reward = dict(config.get("reward") or {})
    kwargs = reward_kwargs(reward, audit_dir=audit_dir)
    custom = custom_of(reward)
    if custom:  # your own reward: called as training calls it (the reward settings as keyword arguments)
        fn = open_custom(custom)
        try:
            scores = [fn(f"{where}: row {i}", data_source=row["data_source"], solution_str=candidate(row, memory),
                         ground_truth=row["reward_model"]["ground_truth"], extra_info=dict(row["extra_info"]),
                         **kwargs) for i, row in enumerate(rows)]
        finally:
            fn.close()
        return ["score"], [{"score": s} for s in scores]
    mode = reward_mode(reward_settings(reward))
    if mode.asks_judge:
        mode.require_endpoint(endpoint, "pass --endpoint")
        kwargs["endpoint_file"] = str(endpoint)
        if (config.get("judge") or {}).get("rubric"):
            kwargs["rubric_file"] = str(config["judge"]["rubric"])
    results = [compute_score(row["data_source"], candidate(row, memory), row["reward_model"]["ground_truth"],
                             dict(row["extra_info"]), **kwargs) for row in rows]
    return list(PUBLIC_KEYS), results


def _text(value: Any) -> str:
    if isinstance(value, float):
        return f"{value:.4f}"
    return "-" if value is None else str(value)


def table(rows: list[dict], columns: list[str], results: list[dict]) -> list[str]:
    """Aligned lines: the header, then one line a row (its place in the parquet, patient, visit, results)."""
    body = [[str(i), str(row["extra_info"].get("patient_id")), str(row["extra_info"].get("visit_index")),
             *(_text(result.get(c)) for c in columns)] for i, (row, result) in enumerate(zip(rows, results))]
    header = [*ROW_COLUMNS, *columns]
    widths = [max(len(line[k]) for line in [header, *body]) for k in range(len(header))]
    return ["  ".join(cell.ljust(w) for cell, w in zip(line, widths)).rstrip() for line in [header, *body]]


def _cmd_try(args: argparse.Namespace) -> int:
    path = parquet_of(args.parquet, args.run, args.split)
    rows = first_rows(path, args.rows)
    config = run_config(args.run, args.configfile)
    if args.custom:  # your own file instead of the config's reward, loaded as the workflow loads reward.custom
        custom = {"path": args.custom, **({"name": args.name} if args.name else {})}
        config = {**config, "reward": {**(config.get("reward") or {}), "custom": custom}}
    with tempfile.TemporaryDirectory(prefix="llmrnn-reward-try-") as tmp:
        columns, results = score_rows(rows, config, args.memory, args.endpoint, args.audit_dir or tmp, path)
    print("\n".join(table(rows, columns, results)))
    return 0


def _positive(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"--rows: expected a whole number, got {text!r}") from None
    if value < 1:
        raise argparse.ArgumentTypeError(f"--rows: expected at least 1, got {value}")
    return value


def register(sub) -> None:
    p = sub.add_parser("reward", help="try the reward on real trajectory rows",
                       description=doc_summary(__doc__))
    verbs = p.add_subparsers(dest="verb", required=True)
    t = verbs.add_parser("try", help="score the first rows of a trajectory parquet and print each row's score "
                                     "and diagnostics")
    t.add_argument("--run", help="a results/RUN folder (or its config.yaml): its config and trajectory parquet")
    t.add_argument("--parquet", help="a trajectory parquet (default: RUN/trajectories/SPLIT.parquet of --run)")
    t.add_argument("--split", choices=("train", "val"), default="train", help="the split of --run")
    t.add_argument("--configfile", nargs="+", default=[],
                   help="config files layered in order, as snakemake --configfile (not with --run); "
                        "none: config/config.yaml")
    t.add_argument("--rows", type=_positive, default=5, help="how many rows, from the first")
    t.add_argument("--memory", choices=MEMORIES, default="h_ref",
                   help="the memory scored as the policy's output: the row's reference or previous memory, or empty")
    t.add_argument("--custom", help="your own reward file (default: the config's reward.custom.path)")
    t.add_argument("--name", help="its function (default: reward.custom.name, compute_score)")
    t.add_argument("--endpoint", default=None,
                   help="RUN/judge/endpoint.json (waits for its health); required unless reward.mode is outcome "
                        "or a reward file is tried")
    t.add_argument("--audit-dir", default=None, help="keep the reward's audit here (default: a temporary folder)")
    t.set_defaults(func=_cmd_try)
