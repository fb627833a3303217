"""The judge: whether a job starts it (as llmrnn.plan plans it), its rubric and its model."""

from __future__ import annotations

from pathlib import Path

from llmrnn.check.models import hub_problem
from llmrnn.check.skips import unused
from llmrnn.errors import LlmrnnError
from llmrnn.judge.launcher import judge_model_dir
from llmrnn.plan.judge import agreement_planned
from llmrnn.reward import asks_judge
from llmrnn.rubric import load_rubric


def _judge_in_dag(config: dict) -> bool:
    """Whether a job starts the judge (as llmrnn.plan plans it): the reward asks it, the memory head's
    judge-agreement check beside training (llmrnn.plan.judge.agreement_planned), or the QA answers are
    judge-graded (qa.eval.judge: true, or auto where the QA reward asks the judge)."""
    try:
        if asks_judge(config):
            return True
    except LlmrnnError:  # a bad reward section is the schema's line; check the judge as if it were asked
        return True
    if config.get("recipe") == "qa":
        return ((config.get("qa") or {}).get("eval") or {}).get("judge") is True
    return agreement_planned(config)


def _judge_gpus_needed(config: dict) -> int | None:
    if not _judge_in_dag(config):
        return 0  # no judge_server is planned
    try:
        rubric = load_rubric(config["judge"]["rubric"])
    except Exception:  # noqa: BLE001 - reported by check_judge
        return None
    return 1 if rubric.needs_gpu else 0  # as llmrnn.plan.judge.JudgePlan.gpus: one GPU for a vLLM judge


def check_judge(config: dict) -> list[str]:
    judge = config.get("judge") or {}
    path = judge.get("rubric")
    if not _judge_in_dag(config):  # no judge is started: its model is not needed
        unused("this config starts no judge")
        return []
    if not path:
        return ["judge.rubric: not set, but this config starts the judge"]
    if not Path(path).is_file():
        return [f"judge.rubric: {path} does not exist"]
    try:
        rubric = load_rubric(path)
    except LlmrnnError as exc:
        return [f"judge.rubric: {exc}"]
    except ImportError:
        return []
    models = config.get("models") or {}
    what = f"judge model of {path}"
    if rubric.model_source == "local":
        if rubric.model not in models:
            return [f"{what}: {rubric.model} is not a model in the config's `models` section"]
        return []

    if (judge_model_dir(rubric) / ".ready").is_file():  # prepare_judge_model already made the local copy
        return []
    if rubric.model_source == "path":
        p = Path(rubric.model)
        return [] if p.is_dir() else [f"{what}: folder {rubric.model} does not exist"]
    if rubric.model_source == "hub":
        p = hub_problem(rubric.model, None, what)
        return [p] if p else []
    return []
