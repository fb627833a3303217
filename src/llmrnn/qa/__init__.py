"""Stage `qa`: the second recipe (medical QA with verifiable rewards, optional SFT warm start, pass@k eval).

    llmrnn qa synth   --cohort resources/cohort/synthetic.json --out Q.jsonl --ood O.jsonl --cfg JSON
    llmrnn qa data    --source Q [--ood O] --cfg JSON --train ... --summary splits.json  (every output named)
    llmrnn qa sft     --train sft_train.jsonl --val sft_val.jsonl --model DIR --adapter D --metrics M --summary S
    llmrnn qa eval    --model DIR --questions test.jsonl --variant V --split S --out F --cfg JSON [--endpoint E]
    llmrnn qa judge   --inputs F... --outputs G... --endpoint E --audit-dir A --cfg JSON  (judged copies)
    llmrnn qa gather  --inputs F... --metrics M --comparison C --cfg JSON [--train train.jsonl]
    llmrnn qa report  --metrics M --comparison C --inputs F... --plot P --summary S --questions Q
GRPO uses the shared train stage (`llmrnn train run --reward-func llmrnn.qa.rewards:trl_reward_func`),
merges use `llmrnn merge run`, the release `llmrnn release build`.
"""

from __future__ import annotations

import logging

from llmrnn import io
from llmrnn.cli import json_arg
from llmrnn.cohort import load_cohort
from llmrnn.qa.data import OUTPUTS, prepare, write_hashed
from llmrnn.qa.evaluate import evaluate_model, gather, judge_eval_files
from llmrnn.qa.report import write_report
from llmrnn.qa.sft import train_sft
from llmrnn.qa.synth import questions_from_cohort
from llmrnn.runconfig import filled
from llmrnn.settings.evaluation import Preflight

log = logging.getLogger(__name__)


def _cfg(args, key: str) -> dict:
    cfg = args.cfg or {}
    return cfg.get(key, cfg) if isinstance(cfg.get(key), dict) else cfg


def _eval_cfg(args) -> dict:
    """The eval section plus the qa prompt (the evaluation asks in the system prompt training used)."""
    cfg = dict(_cfg(args, "eval"))
    prompt = (args.cfg or {}).get("prompt")
    if isinstance(prompt, dict):
        cfg["prompt"] = prompt
    return cfg


def cmd_synth(args) -> int:
    cfg = filled("qa.synthetic", _cfg(args, "synthetic"))
    ind, ood = questions_from_cohort(load_cohort(args.cohort), int(cfg["seed"]), cfg["max_questions"])
    write_hashed(args.ood, ood)
    write_hashed(args.out, ind)
    log.info("qa synth: %d questions, %d OOD", len(ind), len(ood))
    return 0


def cmd_data(args) -> int:
    prepare(args.cfg, {k: getattr(args, k) for k in OUTPUTS}, args.source, args.ood_source or None)
    return 0


def cmd_sft(args) -> int:
    train_sft(_cfg(args, "sft"), args.train, args.val, args.model, adapter_dir=args.adapter,
              metrics_path=args.metrics, summary_path=args.summary)
    return 0


def cmd_eval(args) -> int:
    model = args.model.removesuffix("/.ready")
    evaluate_model(model, args.questions, args.out, args.variant, args.split, _eval_cfg(args), args.threads,
                   args.endpoint, args.rubric, (args.cfg or {}).get("reward"))
    return 0


def cmd_judge(args) -> int:
    # the bar preflight and training hold the judge to (preflight.max_fallback_rate)
    max_rate = float((args.cfg or {}).get("max_fallback_rate", Preflight().max_fallback_rate))
    # every wait on the judge is bounded by config section `reward` (its timeouts, retries, budgets)
    judge_eval_files(args.inputs, args.outputs, args.endpoint, args.rubric, _cfg(args, "eval"), max_rate,
                     args.audit_dir, (args.cfg or {}).get("reward"))
    return 0


def cmd_gather(args) -> int:
    metrics, comparison = gather(args.inputs, _cfg(args, "eval"), args.train)
    io.write_json(args.comparison, comparison)
    io.write_json(args.metrics, metrics)
    return 0


def cmd_report(args) -> int:
    for path in write_report(args.metrics, args.comparison, args.inputs, args.plot, args.summary, args.questions):
        log.info("wrote %s", path)
    return 0


def register(sub) -> None:
    p = sub.add_parser("qa", help="the qa recipe: QA data, SFT warm start, pass@k evaluation")
    q = p.add_subparsers(dest="qa_command", required=True)

    s = q.add_parser("synth", help="multiple-choice questions from the synthetic cohort (+ an OOD set)")
    s.add_argument("--cohort", required=True)
    s.add_argument("--out", required=True)
    s.add_argument("--ood", required=True)
    s.add_argument("--cfg", type=json_arg, default={})
    s.set_defaults(func=cmd_synth)

    d = q.add_parser("data", help="filter, split and write the RL parquets + SFT files")
    d.add_argument("--source", required=True, help="JSON / JSONL file, or hf:<dataset name or path>")
    d.add_argument("--ood", nargs="?", const=None, default=None, dest="ood_source",
                   help="optional OOD question set (same fields); empty = none")
    d.add_argument("--cfg", type=json_arg, required=True, help="the qa section (fields, filter, split, prompt)")
    for name in ("train", "val", "test", "ood-out", "train-parquet", "val-parquet", "sft-train", "sft-val",
                 "summary"):
        d.add_argument(f"--{name}", required=True, dest=name.replace("-out", "").replace("-", "_"),
                       help=f"output: {name}")
    d.set_defaults(func=cmd_data)

    f = q.add_parser("sft", help="LoRA SFT warm start (TRL SFTTrainer)")
    f.add_argument("--train", required=True)
    f.add_argument("--val", default=None)
    f.add_argument("--model", required=True, help="base model folder or its .ready marker")
    f.add_argument("--adapter", required=True, help="output: the LoRA adapter folder")
    f.add_argument("--metrics", required=True, help="output: metrics.jsonl")
    f.add_argument("--summary", required=True, help="output: summary.json")
    f.add_argument("--cfg", type=json_arg, required=True)
    f.set_defaults(func=cmd_sft)

    e = q.add_parser("eval", help="greedy and sampled answers of one model on one question set")
    e.add_argument("--model", required=True)
    e.add_argument("--questions", required=True)
    e.add_argument("--variant", required=True)
    e.add_argument("--split", required=True)
    e.add_argument("--out", required=True)
    e.add_argument("--threads", type=int, default=1)
    e.add_argument("--endpoint", default=None, help="judge endpoint.json: also judge-grade every answer")
    e.add_argument("--rubric", default=None, help="the judge's rubric (default: the endpoint's)")
    e.add_argument("--cfg", type=json_arg, required=True)
    e.set_defaults(func=cmd_eval)

    j = q.add_parser("judge", help="judge-grade finished eval files (a second metric beside exact match)")
    j.add_argument("--inputs", nargs="+", required=True, help="eval files of `qa eval`")
    j.add_argument("--outputs", nargs="+", required=True, help="output: one judged copy per input, in order")
    j.add_argument("--endpoint", required=True, help="the judge service's endpoint.json")
    j.add_argument("--rubric", default=None, help="the judge's rubric (default: the endpoint's)")
    j.add_argument("--audit-dir", required=True, help="output: every judge call (0700)")
    j.add_argument("--cfg", type=json_arg, required=True,
                   help='{"eval": {judge_threshold, k}, "max_fallback_rate": x (preflight\'s), '
                        '"reward": {timeout_s, retries, call_budget_s, ...} (the judge waits)}')
    j.set_defaults(func=cmd_judge)

    g = q.add_parser("gather", help="metrics (Wilson CIs) and paired tests over the eval files")
    g.add_argument("--inputs", nargs="+", required=True)
    g.add_argument("--metrics", required=True)
    g.add_argument("--comparison", required=True)
    g.add_argument("--train", default=None, help="train.jsonl: the always-the-most-common-answer baseline")
    g.add_argument("--cfg", type=json_arg, required=True)
    g.set_defaults(func=cmd_gather)

    r = q.add_parser("report", help="pass@k plot, summary.tsv, questions.tsv")
    r.add_argument("--metrics", required=True)
    r.add_argument("--comparison", required=True)
    r.add_argument("--inputs", nargs="+", required=True)
    r.add_argument("--plot", required=True, help="output: pass_at_k.png")
    r.add_argument("--summary", required=True, help="output: summary.tsv")
    r.add_argument("--questions", required=True, help="output: questions.tsv (per-question answers, 0600)")
    r.set_defaults(func=cmd_report)
