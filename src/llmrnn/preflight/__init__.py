"""Stage `preflight`: prove the real judge follows the score format before any GPU hour is spent.

`llmrnn preflight run` scores K rows of the train parquet with the real judge (through the same
llmrnn.reward scorer training uses), three candidates per row: the row's reference memory h_ref, its
previous memory h_prev and an empty memory (different memories of the same patient: GRPO only learns
when the judge tells such candidates apart; a small base model often leaves h_ref == h_prev, the empty
memory keeps a contrast). It writes RUN/train/preflight.json:

    {"ok": bool, "problems": [str], "warnings": [str],
     "judge": {"rows", "calls", "parse_methods": {...}, "fallback_rate", "reward": {mean, std, min, max,
               distinct, values}, "rows_with_spread", "latency_s": {p50, p95}, ...},
     "training": {...}}

Judge problems: a fallback rate above `preflight.max_fallback_rate` (the judge is not printing a
score: the reference authors saw most scalar-coerced rewards fall back to 0.5) or fewer than
`preflight.min_distinct_rewards` distinct rewards (a constant reward trains nothing). With
`preflight.on_problem: fail` they stop the DAG with one line saying why; `warn` records them as
warnings.

A reward mode that asks no judge (reward.mode outcome; llmrnn.reward.modes says which) needs no endpoint
(none is waited on), the same candidates are scored with its reward and "judge" says {"skipped": "reward.mode
outcome asks no judge", "mode",
"rows", "candidates", "parse_methods", "reward": {...}, "rows_with_spread", ...} with fallback_rate None;
its spread problems are warnings (the fixed reference memories all miss what the policy must learn to
carry, so their spread says nothing about the rollouts').

Training problems (`training_checks`: batch geometry, prompt lengths vs max_prompt_length, LR
schedule, GPUs, free disk; each one line saying what to change) always count. `llmrnn preflight
training` runs them alone, without a judge. One concept a module: `rows`, `reward_checks` (judge,
outcome, your own reward), `agreement`, `training`, `run` (the command).
"""

from __future__ import annotations

import json
import logging

from llmrnn import io
from llmrnn.models import model_folder
from llmrnn.preflight.agreement import agreement_checks, agreement_pairs, run_agreement, wrong_memory
from llmrnn.preflight.reward_checks import custom_checks, judge_checks, outcome_checks
from llmrnn.preflight.rows import CANDIDATES, EMPTY_MEMORY, load_rows
from llmrnn.preflight.run import run_preflight
from llmrnn.preflight.training import training_checks
from llmrnn.reward import JUDGED_MODES
from llmrnn.settings.evaluation import Preflight, preflight_settings

log = logging.getLogger(__name__)

__all__ = [
    "CANDIDATES",
    "EMPTY_MEMORY",
    "Preflight",
    "agreement_checks",
    "agreement_pairs",
    "custom_checks",
    "judge_checks",
    "load_rows",
    "model_folder",
    "outcome_checks",
    "preflight_settings",
    "register",
    "run_agreement",
    "run_preflight",
    "training_checks",
    "wrong_memory",
]


def _cmd_agreement(args) -> int:
    run_agreement(args.train_parquet, args.endpoint, args.out, args.audit_dir, args.cfg, args.mode)
    return 0


def _cmd_training(args) -> int:
    from llmrnn.train import config as tcfg

    cfg = args.cfg.get("train", args.cfg)
    result = training_checks(tcfg.settings(cfg), args.train, args.val, model_folder(args.model),
                             out_dir=args.out_dir, gpus_available=args.gpus)
    if args.out:
        io.write_json(args.out, result)
    for problem in result["problems"]:
        log.error("preflight: %s", problem)
    print(json.dumps(result, indent=2))
    return 0 if result["ok"] else 3


def _cmd_run(args) -> int:
    run_preflight(args.train_parquet, args.endpoint, args.out, args.audit_dir, args.cfg, args.val_parquet,
                  args.tokenizer_dir)
    return 0


def register(sub) -> None:
    from llmrnn.cli import json_arg

    p = sub.add_parser("preflight", help="judge compliance + training checks before GRPO")
    psub = p.add_subparsers(dest="preflight_command", required=True)
    r = psub.add_parser("run", help="score K train rows with the reward (the real judge where reward.mode asks "
                                    "one) + training checks; write preflight.json")
    r.add_argument("--train-parquet", required=True)
    r.add_argument("--val-parquet", default=None)
    r.add_argument("--endpoint", default=None,
                   help="RUN/judge/endpoint.json (waits for its health); required where reward.mode asks "
                        f"the judge ({', '.join(JUDGED_MODES)}) and reward.custom.path is unset")
    r.add_argument("--out", required=True, help="RUN/train/preflight.json")
    r.add_argument("--audit-dir", required=True, help="audit JSONL directory for the preflight calls")
    r.add_argument("--tokenizer-dir", default=None, help="policy base model dir (training checks: prompt lengths)")
    r.add_argument("--cfg", type=json_arg, default={}, help="JSON of sections judge, reward, preflight[, train]")
    r.set_defaults(func=_cmd_run)

    a = psub.add_parser("agreement", help="judge agreement alone: does the judge rank a patient's reference "
                                          "memory above another patient's or a corrupted one? (never fails)")
    a.add_argument("--train-parquet", required=True)
    a.add_argument("--endpoint", required=True, help="the judge's endpoint.json (waits for its health)")
    a.add_argument("--out", required=True, help="agreement.json")
    a.add_argument("--audit-dir", required=True)
    a.add_argument("--mode", choices=JUDGED_MODES, default=None,
                   help=f"judge mode checked (default: reward.mode when it asks the judge, else {JUDGED_MODES[0]})")
    a.add_argument("--cfg", type=json_arg, default={}, help="JSON of sections judge, reward, preflight")
    a.set_defaults(func=_cmd_agreement)

    t = psub.add_parser("training", help="training checks only (no judge): batch geometry, prompt lengths, LR, "
                                         "GPUs, disk")
    t.add_argument("--cfg", type=json_arg, required=True, help='JSON {"train": {...}} (config subset)')
    t.add_argument("--train", required=True, help="train parquet")
    t.add_argument("--val", default=None, help="val parquet")
    t.add_argument("--model", required=True, help="policy base model dir (its tokenizer measures the prompts)")
    t.add_argument("--out", default=None, help="write the JSON result here")
    t.add_argument("--out-dir", default=None, help="where checkpoints will go (free disk check)")
    t.add_argument("--gpus", type=int, default=None, help="GPUs available (default: detect)")
    t.set_defaults(func=_cmd_training)
