"""Stage `train`: GRPO on the trajectory parquets with verl (GPU clusters) or TRL (CPU), one set of knobs.

    llmrnn train run        --cfg JSON --train P --val P --model DIR --work-dir RUN/train --adapter D
                            --metrics F --summary F [--endpoint F] [--preflight F]
    llmrnn train verl-cmd   --cfg JSON --train P --val P --model DIR --out-dir D   (print the main_ppo command)
    llmrnn train ray-cluster node|stop|probe   (per-node steps of a multi-node run: llmrnn.train.ray_cluster)
"""

from __future__ import annotations

import json
import logging
import shlex
import sys
from pathlib import Path

from llmrnn.models import model_folder
from llmrnn.reward.function import BUILTIN_REWARD, RewardFunction
from llmrnn.settings.train import Train

log = logging.getLogger(__name__)


def _cfg(args) -> dict:
    """--cfg carries {"train": {...}} (cfg_json("train")) or the bare section."""
    cfg = args.cfg or {}
    return cfg.get("train", cfg) if isinstance(cfg, dict) else {}


def _assign_gpus(cfg: Train, judge_gpus: int) -> None:
    from llmrnn.gpus import assign

    train_gpus = cfg.n_gpus_per_node if cfg.engine == "verl" else None
    assign("train", judge_gpus=judge_gpus, train_gpus=train_gpus)


def _reward_kwargs(args, work: Path) -> dict:
    """The reward's settings as its arguments (llmrnn.reward.kwargs), built once here: config section
    `reward` (your own reward's file made absolute: verl's reward workers run elsewhere), the judge's
    endpoint, the audit dir, and the fallback guard at preflight's threshold (training only). The stop
    reason of an earlier attempt is forgotten."""
    from llmrnn.reward import STOP_REASON_FILE, guard_spec, reward_kwargs
    from llmrnn.settings.evaluation import preflight_settings

    cfg = args.cfg or {}
    reward = cfg.get("reward")
    custom = (reward or {}).get("custom") if isinstance(reward, dict) else None
    if custom and custom.get("path"):
        reward = {**reward, "custom": {**custom, "path": str(Path(custom["path"]).resolve())}}
    pre = preflight_settings(cfg.get("preflight"))
    (work / "audit" / STOP_REASON_FILE).unlink(missing_ok=True)
    return reward_kwargs(reward, audit_dir=work / "audit", endpoint_file=args.endpoint,
                         guard=guard_spec(pre.max_fallback_rate, pre.fallback_window))


def _custom_reward(kwargs: dict, engine: str) -> dict | None:
    """{"path", "name"} of your own reward (reward.custom). TRL's engine opens it first thing and keeps it;
    verl's reward workers open theirs in processes of their own, later: for verl it is opened once here, so
    a wrong one stops before Ray and the model load."""
    from llmrnn.reward.custom import custom_of, open_custom

    custom = custom_of(kwargs.get("reward_cfg"))
    if custom and engine == "verl":
        open_custom(custom).close()
    return custom


def _require_endpoint(args) -> None:
    """A reward mode of llmrnn.reward that asks the judge needs its endpoint: say so before anything is
    loaded (llmrnn.reward.modes). Another reward module (recipe qa's) checks its own."""
    from llmrnn.reward import reward_mode, reward_settings

    if not args.reward_func.is_builtin:
        return
    reward_mode(reward_settings((args.cfg or {}).get("reward") or {})).require_endpoint(args.endpoint, "pass --endpoint")


def cmd_run(args) -> int:
    from llmrnn import io
    from llmrnn.errors import CheckFailed
    from llmrnn.train import config as tcfg

    # --engine is part of the one parse: the section's rules and its derived values (the batch geometry) are
    # those of the engine that runs
    cfg = tcfg.settings({**_cfg(args), "engine": args.engine} if args.engine else _cfg(args))
    _require_endpoint(args)
    args.model = str(model_folder(args.model))
    work = Path(args.work_dir)
    work.mkdir(parents=True, exist_ok=True)
    if args.preflight:
        pre = io.read_json(args.preflight)
        if not pre.get("ok", False):
            raise CheckFailed(f"{args.preflight}: preflight failed: " + "; ".join(pre.get("problems", [])))
    reward_kwargs = _reward_kwargs(args, work)  # verl's reward_kwargs, TRL's reward-function arguments
    custom = _custom_reward(reward_kwargs, cfg.engine)
    _assign_gpus(cfg, args.judge_gpus)
    from llmrnn.train import tracking
    from llmrnn.train.spec import RunSpec

    tracking.prepare(cfg, work)  # train.report_to's trackers write into the run folder
    spec = RunSpec(cfg=cfg, train_parquet=args.train, val_parquet=args.val, model_dir=args.model,
                   work_dir=str(work), adapter_dir=args.adapter, metrics_path=args.metrics,
                   run_name=args.experiment or work.parent.name, reward_func=args.reward_func,
                   reward_kwargs=reward_kwargs, custom=custom, endpoint_file=args.endpoint, tracked_config=args.cfg)
    if cfg.engine == "verl":  # here, in the job that holds the GPUs (preflight's step holds none)
        from llmrnn import gpu_stack
        from llmrnn.gpus import visible_gpus
        from llmrnn.train import verl_cmd

        gpu_stack.require_verl()
        gpu_stack.require_gpus(cfg.n_gpus_per_node, visible_gpus())
        summary = verl_cmd.run(spec)
    else:
        from llmrnn.train import trl_engine

        summary = trl_engine.train(spec)
    io.write_json(args.summary, summary)
    return 0


def cmd_verl_cmd(args) -> int:
    from llmrnn.reward import reward_kwargs
    from llmrnn.train import config as tcfg
    from llmrnn.train import verl_overrides

    overrides = verl_overrides.build_overrides(
        tcfg.settings(_cfg(args)),
        train_parquet=args.train,
        val_parquet=args.val,
        model_dir=args.model,
        out_dir=args.out_dir,
        experiment_name=args.experiment,
        reward_kwargs=reward_kwargs(((args.cfg or {}).get("reward") if isinstance(args.cfg, dict) else None),
                                    audit_dir=Path(args.out_dir) / "audit", endpoint_file=args.endpoint),
        verl_version=args.verl_version,
    )
    if args.json:
        print(json.dumps(overrides, indent=1))
    else:
        print(" \\\n  ".join(shlex.quote(c) for c in verl_overrides.command(overrides, args.python)))
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

    r = tsub.add_parser("run", help="train (resuming from the latest checkpoint) and write the adapter, metrics and summary")
    common(r)
    r.add_argument("--work-dir", required=True,
                   help="checkpoints/, state/ and audit/ (kept across reruns, so a killed run resumes)")
    r.add_argument("--adapter", required=True, help="output: the LoRA adapter folder")
    r.add_argument("--metrics", required=True, help="output: metrics.jsonl (one row per step)")
    r.add_argument("--summary", required=True, help="output: summary.json (steps, resume point, rows)")
    # nargs="?": an empty value means "no judge", as leaving the flag out does (the rules leave it out)
    r.add_argument("--endpoint", nargs="?", const=None, default=None,
                   help="judge endpoint.json (RUN/judge/endpoint.json); not needed when reward.mode is outcome")
    r.add_argument("--preflight", default=None, help="preflight.json that must say ok")
    r.add_argument("--engine", choices=("verl", "trl"), default=None, help="override train.engine")
    r.add_argument("--reward-func", type=RewardFunction.parse, default=BUILTIN_REWARD,
                   help=f"TRL reward 'module:function' (default {BUILTIN_REWARD}); verl calls compute_score of its module")
    r.add_argument("--experiment", default=None, help="verl experiment name (default: run name)")
    r.add_argument("--judge-gpus", type=int, default=0, help="GPUs the judge holds on this node (taken last)")
    r.set_defaults(func=cmd_run)

    v = tsub.add_parser("verl-cmd", help="print the verl main_ppo command built from the config")
    common(v)
    v.add_argument("--out-dir", required=True)
    v.add_argument("--experiment", default="llmrnn")
    v.add_argument("--endpoint", default=None)
    v.add_argument("--verl-version", default=None, help="target release (default: installed verl, else 0.7.1)")
    v.add_argument("--python", default=sys.executable)
    v.add_argument("--json", action="store_true", help="print the overrides as a JSON list")
    v.set_defaults(func=cmd_verl_cmd)

    from llmrnn.train import diagnose, ray_cluster

    diagnose.add_parser(tsub)
    ray_cluster.add_parser(tsub)
