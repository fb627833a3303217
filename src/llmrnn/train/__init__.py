"""Stage `train`: GRPO on the trajectory parquets with verl (GPU clusters) or TRL (CPU), one set of knobs.

    llmrnn train run        --cfg JSON --train P --val P --model DIR --out RUN/train [--endpoint F]
    llmrnn train preflight  --cfg JSON --train P --val P --model DIR [--out F]     (training checks only)
    llmrnn train verl-cmd   --cfg JSON --train P --val P --model DIR --out-dir D   (print the main_ppo command)
    llmrnn train plots      --metrics RUN/train/metrics.jsonl --out RUN/train/plots
"""

from __future__ import annotations

import json
import logging
import os
import shlex
import sys
from pathlib import Path

log = logging.getLogger(__name__)


def _cfg(args) -> dict:
    """--cfg carries {"train": {...}} (cfg_json("train")) or the bare section."""
    cfg = args.cfg or {}
    return cfg.get("train", cfg) if isinstance(cfg, dict) else {}


def _assign_gpus(cfg: dict, judge_gpus: int) -> None:
    from llmrnn.gpus import assign

    train_gpus = cfg["n_gpus_per_node"] if cfg["engine"] == "verl" else None
    assign("train", judge_gpus=judge_gpus, train_gpus=train_gpus)


def _model_dir(path: str) -> str:
    """A model folder, or its `.ready` marker (the prepare_base_model output) standing for it."""
    p = Path(path)
    return str(p.parent) if p.name == ".ready" else str(p)


def cmd_run(args) -> int:
    from llmrnn import io
    from llmrnn.errors import CheckFailed, InputError
    from llmrnn.train import config as tcfg

    cfg = tcfg.normalize(_cfg(args))
    if not args.out and not args.metrics:
        raise InputError("train run: give --out DIR or --metrics DIR/metrics.jsonl")
    out = Path(args.out) if args.out else Path(args.metrics).parent
    if args.metrics and Path(args.metrics) != out / "metrics.jsonl":
        raise InputError(f"train run: --metrics must be {out / 'metrics.jsonl'}")
    args.model = _model_dir(args.model)
    out.mkdir(parents=True, exist_ok=True)
    if args.preflight:
        pre = io.read_json(args.preflight)
        if not pre.get("ok", False):
            raise CheckFailed(f"{args.preflight}: preflight failed: " + "; ".join(pre.get("problems", [])))
    os.environ["LLMRNN_AUDIT_DIR"] = str(out / "audit")
    reward_cfg = (args.cfg or {}).get("reward")
    if reward_cfg is not None:  # the reward section travels with the train config (same scorer settings)
        os.environ["LLMRNN_REWARD_CFG"] = json.dumps(reward_cfg, sort_keys=True)
    if args.endpoint:
        os.environ["LLMRNN_JUDGE_ENDPOINT"] = str(args.endpoint)
    _assign_gpus(cfg, args.judge_gpus)
    engine = args.engine or cfg["engine"]
    if engine == "trl":
        from llmrnn.train import trl_engine

        summary = trl_engine.train(
            cfg, args.train, args.val, args.model, out, reward_spec=args.reward_func or trl_engine.DEFAULT_REWARD
        )
    else:
        from llmrnn.train import verl_cmd

        summary = verl_cmd.run(
            cfg,
            train_parquet=args.train,
            val_parquet=args.val,
            model_dir=args.model,
            out_dir=str(out),
            experiment_name=args.experiment or out.parent.name,
            endpoint_file=args.endpoint,
            # --reward-func names the TRL function; verl calls compute_score of the same module
            reward_module=args.reward_func.split(":", 1)[0] if args.reward_func else None,
        )
    from llmrnn.train.metrics import plot

    if (out / "metrics.jsonl").exists():
        plot(out / "metrics.jsonl", out / "plots")
    io.write_json(out / "summary.json", summary)
    return 0


def cmd_preflight(args) -> int:
    from llmrnn import io
    from llmrnn.train.preflight import training_checks

    result = training_checks(
        _cfg(args), args.train, args.val, _model_dir(args.model), out_dir=args.out_dir, gpus_available=args.gpus
    )
    if args.out:
        io.write_json(args.out, result)
    for problem in result["problems"]:
        log.error("preflight: %s", problem)
    print(json.dumps(result, indent=2))
    return 0 if result["ok"] else 3


def cmd_verl_cmd(args) -> int:
    from llmrnn.train import verl_cmd

    overrides = verl_cmd.build_overrides(
        _cfg(args),
        train_parquet=args.train,
        val_parquet=args.val,
        model_dir=args.model,
        out_dir=args.out_dir,
        experiment_name=args.experiment,
        endpoint_file=args.endpoint,
        verl_version=args.verl_version,
    )
    if args.json:
        print(json.dumps(overrides, indent=1))
    else:
        print(" \\\n  ".join(shlex.quote(c) for c in verl_cmd.command(overrides, args.python)))
    return 0


def cmd_plots(args) -> int:
    from llmrnn.train.metrics import plot

    for path in plot(args.metrics, args.out):
        log.info("wrote %s", path)
    return 0


def register(sub) -> None:
    from llmrnn.cli import json_arg

    p = sub.add_parser("train", help="GRPO training (verl or TRL) on the trajectory parquets")
    tsub = p.add_subparsers(dest="train_command", required=True)

    def common(q):
        q.add_argument("--cfg", type=json_arg, required=True, help='JSON {"train": {...}} (config subset)')
        q.add_argument("--train", required=True, help="train parquet")
        q.add_argument("--val", default=None, help="val parquet")
        q.add_argument("--model", required=True, help="base model dir (HF, tokenizer with chat template)")

    r = tsub.add_parser("run", help="train (resuming from the latest checkpoint) and write adapter/ + metrics")
    common(r)
    r.add_argument("--out", default=None, help="RUN/train directory (default: the folder of --metrics)")
    r.add_argument("--metrics", default=None, help="RUN/train/metrics.jsonl (names the output folder)")
    r.add_argument("--endpoint", default=None, help="judge endpoint.json (RUN/judge/endpoint.json)")
    r.add_argument("--preflight", default=None, help="preflight.json that must say ok")
    r.add_argument("--engine", choices=("verl", "trl"), default=None, help="override train.engine")
    r.add_argument("--reward-func", default=None, help="TRL reward 'module:function' (default llmrnn.reward)")
    r.add_argument("--experiment", default=None, help="verl experiment name (default: run name)")
    r.add_argument("--judge-gpus", type=int, default=0, help="GPUs the judge holds on this node (taken last)")
    r.set_defaults(func=cmd_run)

    q = tsub.add_parser("preflight", help="training checks: batch geometry, prompt lengths, LR, GPUs, disk")
    common(q)
    q.add_argument("--out", default=None, help="write the JSON result here")
    q.add_argument("--out-dir", default=None, help="where checkpoints will go (free disk check)")
    q.add_argument("--gpus", type=int, default=None, help="GPUs available (default: detect)")
    q.set_defaults(func=cmd_preflight)

    v = tsub.add_parser("verl-cmd", help="print the verl main_ppo command built from the config")
    common(v)
    v.add_argument("--out-dir", required=True)
    v.add_argument("--experiment", default="llmrnn")
    v.add_argument("--endpoint", default=None)
    v.add_argument("--verl-version", default=None, help="target release (default: installed verl, else 0.7.1)")
    v.add_argument("--python", default=sys.executable)
    v.add_argument("--json", action="store_true", help="print the overrides as a JSON list")
    v.set_defaults(func=cmd_verl_cmd)

    pl = tsub.add_parser("plots", help="reward/KL plots from metrics.jsonl")
    pl.add_argument("--metrics", required=True)
    pl.add_argument("--out", required=True)
    pl.set_defaults(func=cmd_plots)
