"""`llmrnn preflight run`: the reward checks + the training checks -> preflight.json."""

from __future__ import annotations

import json
import logging
from dataclasses import dataclass, field
from pathlib import Path

from llmrnn import io
from llmrnn.errors import CheckFailed
from llmrnn.judge.client import Endpoint
from llmrnn.models import model_folder
from llmrnn.preflight.agreement import agreement_checks
from llmrnn.preflight.reward_checks import custom_checks, judge_checks, outcome_checks
from llmrnn.preflight.rows import load_rows
from llmrnn.preflight.training import training_checks
from llmrnn.reward import RewardMode, Scorer, reward_kwargs, reward_mode, reward_settings
from llmrnn.reward.modes import CustomReward
from llmrnn.runconfig import filled
from llmrnn.settings.evaluation import Preflight, preflight_settings
from llmrnn.train.ray_cluster import judge_layout_problem

log = logging.getLogger(__name__)


# ----------------------------------------------------------------------------- command
def run_preflight(train_parquet: str, endpoint_file: str | None, out: str, audit_dir: str, cfg: dict,
                  val_parquet: str | None = None, tokenizer_dir: str | None = None) -> dict:
    """Reward checks (judge_checks; outcome_checks for a reward mode that asks no judge, which needs no
    endpoint; custom_checks for your own reward, reward.custom) + training checks -> `out`; CheckFailed when a
    problem counts."""
    pcfg = preflight_settings(cfg.get("preflight"))
    rcfg = reward_settings(cfg.get("reward") or {})
    mode = reward_mode(rcfg)
    mode.require_endpoint(endpoint_file, "pass --endpoint")  # before any work: a judged mode checks nothing without
    judge_cfg = cfg.get("judge") or {}
    if tokenizer_dir:
        tokenizer_dir = str(model_folder(tokenizer_dir))
    rows = load_rows(train_parquet, pcfg.rows, pcfg.seed)
    checked = mode.preflight(_RewardChecks(endpoint_file, judge_cfg, audit_dir, pcfg, train_parquet, rows, cfg))
    judge_report, judge_problems, agreement = checked.report, checked.judge_problems, checked.agreement
    log.info("reward preflight: %s", json.dumps({k: judge_report[k] for k in
                                                 ("mode", "parse_methods", "fallback_rate", "reward", "latency_s")}))
    if cfg.get("train") is None or tokenizer_dir is None:
        missing = "train config" if cfg.get("train") is None else "--tokenizer-dir"
        training = {"skipped": f"training checks not run: no {missing} (the preflight rule passes both)",
                    "problems": [], "warnings": [f"training checks skipped (no {missing})"]}
    else:  # the disk check looks where checkpoints go: the folder of preflight.json (RUN/train)
        training = training_checks(cfg["train"], train_parquet, val_parquet, tokenizer_dir,
                                   out_dir=Path(out).parent,
                                   check_gpus=False)  # a 0-GPU job step: `train run` counts them
    problems, warnings = list(checked.problems), []
    if not mode.asks_judge:
        # A reward without a judge scores the fixed reference memories (h_ref, h_prev, empty), which all
        # miss what the policy must learn to carry, so their spread says nothing about the rollouts'
        # spread: report, do not stop (`llmrnn train diagnose` measures the rollouts' spread).
        warnings.extend(f"{mode.key} (no judge): {p}" for p in judge_problems)
    else:
        (problems if pcfg.on_problem == "fail" else warnings).extend(judge_problems + checked.agreement_problems)
        warnings.extend(checked.agreement_warnings)
    problems.extend(f"training: {p}" for p in training.get("problems", []))
    warnings.extend(f"training: {w}" for w in training.get("warnings", []) or [])
    if mode.asks_judge and (reach := _judge_reach_problem(endpoint_file, cfg)):
        problems.append(reach)
    report = {"ok": not problems, "problems": problems, "warnings": warnings, "judge": judge_report,
              "judge_agreement": agreement if agreement is not None else {"skipped": (
                  f"{mode.no_judge_note} (`llmrnn preflight agreement` checks one beside training)"
                  if not mode.asks_judge else "preflight.agreement_pairs is 0")},
              "training": training}
    io.write_json(out, report)
    for w in warnings:
        log.warning("preflight warning: %s", w)
    if problems:
        raise CheckFailed("preflight failed: " + " | ".join(problems))
    return report


@dataclass
class _Checked:
    """What a mode's reward checks found: the judge report, its problems (counted as preflight.on_problem says
    for a judged mode, warnings otherwise), problems that always count (your own reward's) and, for a mode
    that asks the judge, the judge agreement."""

    report: dict
    judge_problems: list[str]
    problems: list[str] = field(default_factory=list)
    agreement: dict | None = None
    agreement_problems: list[str] = field(default_factory=list)
    agreement_warnings: list[str] = field(default_factory=list)


@dataclass
class _RewardChecks:
    """The reward checks over one preflight's rows (reward.modes.PreflightChecks): the mode picks which."""

    endpoint_file: str | None
    judge_cfg: dict
    audit_dir: str
    pcfg: Preflight
    train_parquet: str
    rows: list[dict]
    cfg: dict

    def scorer_checks(self, mode: RewardMode) -> _Checked:
        """The built-in reward's checks (judge_checks, or outcome_checks when the mode asks no judge) and, for a
        mode that asks the judge, the judge agreement."""
        pcfg = self.pcfg
        scorer = Scorer(self.endpoint_file, self.judge_cfg.get("rubric") or None, self.audit_dir, mode.reward)
        try:
            checks = judge_checks if mode.asks_judge else outcome_checks
            checked = _Checked(*checks(scorer, self.rows, pcfg))
            if mode.asks_judge and pcfg.agreement_pairs:
                checked.agreement, checked.agreement_problems, checked.agreement_warnings = agreement_checks(
                    scorer, load_rows(self.train_parquet, pcfg.agreement_pairs, pcfg.seed + 1), pcfg)
        finally:
            scorer.close()
        return checked

    def custom_checks(self, mode: CustomReward) -> _Checked:
        """Your own reward: finite numbers on real rows, no scorer."""
        Path(self.audit_dir).mkdir(parents=True, exist_ok=True)  # the rule's output, though no scorer writes in it
        # the reward settings as training passes them (verl's reward_kwargs), so a reward reading them runs here
        kwargs = reward_kwargs(self.cfg.get("reward"), audit_dir=self.audit_dir)
        report, problems, judge_problems = custom_checks(mode.custom, self.rows, self.pcfg, kwargs)
        return _Checked(report, judge_problems, problems)


def _judge_reach_problem(endpoint_file: str | None, cfg: dict) -> str | None:
    """train.nnodes > 1: verl runs reward workers on every node, so each must reach the judge."""
    nnodes = int(filled("train", cfg.get("train"))["nnodes"])
    if nnodes <= 1 or not endpoint_file:
        return None

    return judge_layout_problem(Endpoint.read(endpoint_file).url, nnodes)
