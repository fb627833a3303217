"""Grading: each prediction graded against the gold diagnoses by matching, and by the final judge."""

from __future__ import annotations

import json
import logging

from llmrnn import backends, jsonparse
from llmrnn.backends import external_problem
from llmrnn.errors import InputError
from llmrnn.matching import Matcher, diagnosis_name
from llmrnn.runconfig import filled

log = logging.getLogger(__name__)


# ----------------------------------------------------------------------------- grading
def grade_records(records: list[dict], judge: FinalJudge, visits: str = "all") -> list[dict]:
    """Add `grade` = {primary_correct, any_top5_correct, judge_ok} to the graded visits of every patient."""
    todo: list[tuple[dict, dict]] = []
    for rec in records:
        vs = rec["visits"]
        for i, v in enumerate(vs):
            if visits == "all" or i == len(vs) - 1:
                todo.append((rec, v))
            else:
                v["grade"] = None
    grades = judge.grade_many([(v.get("prediction"), v.get("ground_truth") or []) for _, v in todo])
    for (_, v), g in zip(todo, grades):
        v["grade"] = g
    return records


class FinalJudge:
    """Grades (parsed prediction, ground-truth list) pairs -> {primary_correct, any_top5_correct, judge_ok}."""

    def __init__(self, cfg: dict):
        cfg = filled("eval.final_judge", cfg)  # a library caller's partial section over the models' defaults
        self.mode = cfg["mode"]
        if self.mode == "matcher":
            m = cfg["matcher"]
            self.matcher = Matcher(
                threshold=float(m["threshold"]),
                primary_target=m["primary_target"],
                synonyms=m["synonyms"],
            )
        elif self.mode == "llm":
            self.llm_cfg = dict(cfg["llm"])
            # test-patient text goes to this endpoint: a host outside the site only with the explicit opt-in

            problem = external_problem(self.llm_cfg.get("url"), bool(cfg["allow_external"]),
                                       "eval.final_judge.llm.url", "eval.final_judge.allow_external")
            if problem:
                raise InputError(problem)
            self.llm_cfg.update(allow_external=bool(cfg["allow_external"]),
                                opt_in_key="eval.final_judge.allow_external", stall_key="eval.final_judge.llm.stall_s")
            self.primary_target = cfg["matcher"]["primary_target"]
            self._backend = None
        else:
            raise InputError(f"eval.final_judge.mode: expected 'matcher' or 'llm', got {self.mode!r}")

    def describe(self) -> dict:
        if self.mode == "matcher":
            return {
                "mode": "matcher",
                "threshold": self.matcher.threshold,
                "primary_target": self.matcher.primary_target,
                "synonym_groups": len(self.matcher.synonyms),
            }
        return {"mode": "llm", "model": self.llm_cfg.get("model"), "url": self.llm_cfg.get("url")}

    def grade_many(self, items: list[tuple[dict | None, list[str]]]) -> list[dict]:
        if self.mode == "matcher":
            return [{**self.matcher.grade(pred, gt), "judge_ok": True} for pred, gt in items]
        return self._grade_llm(items)

    # -- LLM judge through the openai backend ----------------------------------------------------
    def _messages(self, prediction: dict | None, ground_truth: list[str]) -> list[dict]:
        pred = prediction or {}
        top5 = pred.get("top_5_diagnoses") or []
        shown = {
            "top_5_diagnoses": [diagnosis_name(x) for x in (top5 if isinstance(top5, list) else [top5])][:5],
            "primary_diagnosis": diagnosis_name(pred.get("primary_diagnosis")),
        }
        target = (
            "the FIRST ground-truth diagnosis (the principal one)"
            if self.primary_target == "first"
            else "any ground-truth diagnosis"
        )
        template = self.llm_cfg.get("prompt") or FINAL_JUDGE_PROMPT
        text = template.format(
            prediction=json.dumps(shown, indent=2, ensure_ascii=False),
            ground_truth="\n".join(f"{i + 1}. {d}" for i, d in enumerate(ground_truth)),
            primary_target=target,
        )
        return [{"role": "user", "content": text}]

    def _grade_llm(self, items: list[tuple[dict | None, list[str]]]) -> list[dict]:
        if self._backend is None:
            role_cfg = {**self.llm_cfg, "backend": "openai"}
            self._backend = backends.make_backend(role_cfg, self.llm_cfg.get("model"))
        out: list[dict | None] = [None] * len(items)
        asks = []
        for i, (pred, gt) in enumerate(items):
            if not isinstance(pred, dict) or not gt:
                # nothing to grade: an unparsable prediction is wrong, without asking the judge
                out[i] = {"primary_correct": False, "any_top5_correct": False, "judge_ok": True}
            else:
                asks.append(i)
        batch = int(self.llm_cfg["batch_size"])
        for start in range(0, len(asks), batch):
            idx = asks[start : start + batch]
            texts = self._backend.generate(
                [self._messages(*items[i]) for i in idx],
                temperature=float(self.llm_cfg["temperature"]),
                top_p=float(self.llm_cfg["top_p"]),
                max_tokens=int(self.llm_cfg["max_tokens"]),
            )
            for i, text in zip(idx, texts):
                out[i] = parse_judge_verdict(text)
            log.info("final judge: %d/%d graded", min(start + batch, len(asks)), len(asks))
        return out  # type: ignore[return-value]


FINAL_JUDGE_PROMPT = """You grade predicted discharge diagnoses against the ground truth of one hospital visit.
Use SEMANTIC matching: broader or narrower terms count as correct when clinically equivalent.

PREDICTION (JSON):
{prediction}

GROUND-TRUTH DISCHARGE DIAGNOSES:
{ground_truth}

primary_correct: is the predicted primary diagnosis the same condition as {primary_target}?
any_top5_correct: does any of the top five predictions match any ground-truth diagnosis?
Answer with JSON only: {{"primary_correct": true or false, "any_top5_correct": true or false}}"""


def parse_judge_verdict(text: str) -> dict:
    """{"primary_correct", "any_top5_correct"} from a judge answer; unparsable -> both False, judge_ok False."""
    obj, _method = jsonparse.parse_json(text)
    if isinstance(obj, dict):
        obj = obj.get("diagnosis_evaluation", obj)
    if isinstance(obj, dict) and "primary_correct" in obj and "any_top5_correct" in obj:
        p1, p5 = jsonparse.as_bool(obj["primary_correct"]), jsonparse.as_bool(obj["any_top5_correct"])
        if p1 is not None and p5 is not None:
            return {"primary_correct": p1, "any_top5_correct": p5 or p1, "judge_ok": True}
    return {"primary_correct": False, "any_top5_correct": False, "judge_ok": False}
