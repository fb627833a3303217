"""One object per reward mode (config key `reward.mode`, plus your own reward, reward.custom.path): whether
it asks the judge, how it scores a candidate, what preflight checks for it, and the words the manifest,
report and model card say about it. Everything else asks the mode (`reward_mode(settings)`) instead of
comparing its name.

Adding a mode: a class here with its `name`, listed in MODES, and the name in the `reward.mode` literal of
llmrnn.settings.Reward (tests/test_reward_modes.py holds the two to each other)."""

from __future__ import annotations

from typing import Any, ClassVar, Protocol

from llmrnn import jsonparse
from llmrnn.errors import InputError
from llmrnn.matching import anticipated_share
from llmrnn.rubric import (
    FALLBACK_SCORE,
    JudgeRequest,
    Rubric,
    memory_text,
    pairwise_request,
    parse_scalar,
    parse_verdict,
    scalar_request,
)
from llmrnn.settings import Reward

# (sample index, request, candidate is in position A): the judge calls one batch plans
JudgePlan = list[tuple[int, JudgeRequest, bool]]


def finish_reason(payload: dict) -> str | None:
    """The OpenAI finish_reason of a judge answer ("length": it hit max_tokens)."""
    try:
        return (payload.get("choices") or [{}])[0].get("finish_reason")
    except AttributeError:
        return None


class PreflightChecks(Protocol):
    """The reward checks preflight can run (llmrnn.preflight.run); each mode picks its own (RewardMode.preflight),
    so preflight never asks which mode it checks."""

    def scorer_checks(self, mode: RewardMode) -> Any: ...

    def custom_checks(self, mode: CustomReward) -> Any: ...


class RewardMode:
    """What every reward mode answers; a mode that asks no judge plans no call and says so in its words."""

    name: ClassVar[str]
    asks_judge: ClassVar[bool] = False
    # preflight: what its fixed candidates meet when the mode compares memories (pairwise), and what the
    # "no candidate is a memory" problem adds
    reference_opponent: ClassVar[str] = "reference"
    unparsed_consequence: ClassVar[str] = "so every reward is 0"
    # the model card's rows, by rule, that replace the judged workflow's (release/card.py WORKFLOW_STEPS)
    card_steps: ClassVar[dict[str, tuple[str, str]]] = {}
    card_reward_row: ClassVar[str | None] = None  # the card's "reward" row, when the mode names no judge rows
    card_reward_paragraph: ClassVar[str]
    card_limit: ClassVar[str]

    def __init__(self, reward: Reward):
        self.reward = reward

    @property
    def key(self) -> str:
        """The config words that name this mode in a message."""
        return f"reward.mode {self.name}"

    # -- whether it asks the judge
    @property
    def no_judge_note(self) -> str | None:
        """Why no judge was asked (preflight's "skipped", the manifest's judge note); None: it asks one."""
        return None if self.asks_judge else f"{self.key} asks no judge"

    def require_endpoint(self, endpoint: Any, how: str) -> None:
        """A mode that asks the judge stops with one line when no endpoint is given (`how`: where the caller
        names it); the others need none."""
        if self.asks_judge and not endpoint:
            raise InputError(f"{self.key} asks the judge but no judge endpoint was given: {how} "
                             "(RUN/judge/endpoint.json; reward.mode outcome needs none)")

    # -- scoring (llmrnn.reward.scorer.Scorer delegates here)
    def judge_plan(self, rubric: Rubric | None, prepared: list[dict], opponent: str) -> JudgePlan:
        """The judge calls of one batch (`prepared`: {"step", "memory", "sample"} per sample)."""
        del rubric, prepared, opponent
        return []

    def score(self, rubric: Rubric | None, p: dict, calls: list, result: dict) -> str | None:
        """Fill one sample's `result` (score, judge_score, outcome, parse_method, ...) from its judge calls
        [(JudgeCall, candidate is A)]; returns the candidate memory the audit records."""
        raise NotImplementedError

    # -- preflight
    def preflight(self, checks: PreflightChecks) -> Any:
        """Preflight's reward checks for this mode (llmrnn.preflight.run implements them): the scorer's, on
        the judge's answers (judged modes) or the outcome reward's."""
        return checks.scorer_checks(self)

    def max_tokens(self, rubric: Rubric) -> int | None:
        """The rubric's max_tokens that a judge answer cut off before its score hit."""
        del rubric
        return None

    @property
    def why_training_reward(self) -> str | None:
        """What a judge-agreement check beside training says the training reward is (None: the judge's)."""
        return None

    # -- report
    @property
    def agreement_plot_note(self) -> str | None:
        """The judge-agreement plot's second title line: what training paid instead (None: this judge)."""
        return None

    def report_reward(self, rubric: str) -> str:
        """The report's first page: what training paid (`rubric`: the rubric file and its hash, for a mode
        that asks the judge)."""
        del rubric
        return f"the {self.name} reward ({self.key}; no judge)"

    # -- model card
    def card_workflow_steps(self, steps: list[tuple[str, str]]) -> list[tuple[str, str]]:
        """The card's workflow steps (rule, what it did) with this mode's own rows in place."""
        return [self.card_steps.get(rule, (rule, text)) for rule, text in steps]


class JudgedMode(RewardMode):
    """A mode whose score is the judge's (mapped to [0, 1]) plus reward.outcome_epsilon x the outcome share."""

    asks_judge = True
    unparsed_consequence = "so the judge was never asked"
    card_reward_paragraph = (
        "Each rollout's memory is parsed from the policy output (unparseable JSON gets a small fixed reward) "
        "and shown to the judge together with what happened at the next visit: the prediction made with "
        "that memory, the ground truth and its evaluation. The judge's score is mapped to [0, 1]. Every "
        "judge call is kept in a private audit log that is never part of a release.\n"
    )
    card_limit = ("The reward is the opinion of one judge model under one rubric; a higher reward is not the same "
                  "as better downstream predictions unless the held-out evaluation shows it.")

    def report_reward(self, rubric: str) -> str:
        return f"the judge's {self.name} score by the rubric {rubric}"

    def judge_result(self, rubric: Rubric, p: dict, calls: list) -> tuple[dict, list]:
        """(the judge's part of a valid memory's result, the calls that gave no score)."""
        raise NotImplementedError

    def score(self, rubric: Rubric | None, p: dict, calls: list, result: dict) -> str | None:
        cfg = self.reward
        memory, truth = p["memory"], p["step"]["next_ground_truth_diagnoses"]
        if memory is not None:
            judged, unscored = self.judge_result(rubric, p, calls)
            result.update(judged)
            result["outcome"] = anticipated_share(memory, truth)
            result["score"] = result["judge_score"] + cfg.outcome_epsilon * result["outcome"]
            # answers cut off by max_tokens before any score (e.g. a thinking judge): preflight fails on them
            result["truncated_calls"] = sum(1 for c in unscored if finish_reason(c.payload) == "length")
        elif cfg.outcome_epsilon:
            # The outcome term reads the raw text when it is not JSON: a small policy that rarely writes
            # valid JSON still gets a within-group signal. With epsilon 0 (the reference) this stays 0.05.
            result["outcome"] = anticipated_share(p["sample"]["solution_str"], truth)
            result["score"] = cfg.invalid_json_score + cfg.outcome_epsilon * result["outcome"]
        return memory


class ScalarMode(JudgedMode):
    """The judge scores each memory alone (rubric.parse_scalar's edge table)."""

    name = "scalar"

    def judge_plan(self, rubric: Rubric | None, prepared: list[dict], opponent: str) -> JudgePlan:
        return [(i, scalar_request(rubric, p["step"], p["memory"]), True)
                for i, p in enumerate(prepared) if p["memory"] is not None]

    @staticmethod
    def read_answer(rubric: Rubric, call) -> dict:
        """The score of one scalar judge answer by the rubric's edge table (the QA judge reward reads its
        answers so too)."""
        parsed = parse_scalar(call.response, rubric.scale_max, call.payload, call.request.prefix,
                              rubric.request.score_method == "expected")
        return {"judge_score": parsed.score, "parse_method": parsed.parse_method, "raw_score": parsed.raw_score,
                "digit_probs": parsed.digit_probs}

    def judge_result(self, rubric: Rubric, p: dict, calls: list) -> tuple[dict, list]:
        call = calls[0][0]
        result = self.read_answer(rubric, call)
        return result, [call] if result["parse_method"] == "fallback" else []

    def max_tokens(self, rubric: Rubric) -> int | None:
        return rubric.request.max_tokens


class PairwiseMode(JudgedMode):
    """The judge compares the memory with an opponent in both orders (A/B then B/A, cancelling position
    bias): its prompt group's other memories (reward.pairwise_opponent group) or the reference memory."""

    name = "pairwise"
    reference_opponent = "group"

    def judge_plan(self, rubric: Rubric | None, prepared: list[dict], opponent: str) -> JudgePlan:
        plan: JudgePlan = []
        groups: dict[str, list[int]] = {}
        for i, p in enumerate(prepared):
            if p["memory"] is not None:
                groups.setdefault(str(p["sample"].get("group", i)), []).append(i)
        for members in groups.values():
            distinct = {memory_text(prepared[i]["memory"]) for i in members}
            use_group = opponent == "group" and len(members) > 1 and len(distinct) > 1
            for i in members:
                p = prepared[i]
                cand = p["memory"]
                if use_group:
                    others = [prepared[j]["memory"] for j in members if j != i]
                else:
                    others = [memory_text(p["step"]["h_ref"])]
                p["opponents"] = len(others)
                for other in others:
                    if memory_text(other) == memory_text(cand):
                        p.setdefault("identical", 0)
                        p["identical"] += 1
                        continue
                    plan.append((i, pairwise_request(rubric, p["step"], cand, other), True))
                    plan.append((i, pairwise_request(rubric, p["step"], other, cand), False))
        return plan

    @staticmethod
    def _verdict_points(rubric: Rubric, call, candidate_is_a: bool) -> tuple[float, str]:
        """The candidate's points from one answer: 1 win, 0.5 tie or unparsed, 0 loss."""
        verdict = parse_verdict(call.response, rubric)
        if verdict is None:
            return FALLBACK_SCORE, "unparsed"
        if verdict == "tie":
            return 0.5, "tie"
        won = (verdict == "A") == candidate_is_a
        return (1.0 if won else 0.0), ("win" if won else "loss")

    def judge_result(self, rubric: Rubric, p: dict, calls: list) -> tuple[dict, list]:
        points, outcomes, unscored = [], [], []
        for call, cand_a in calls:
            pts, what = self._verdict_points(rubric, call, cand_a)
            points.append(pts)
            outcomes.append(what)
            if what == "unparsed":
                unscored.append(call)
        ident = p.get("identical", 0)  # an opponent identical to the candidate: a tie, both orders, never asked
        points += [0.5, 0.5] * ident
        outcomes += ["identical", "identical"] * ident
        unparsed = outcomes.count("unparsed")
        parse_method = ("fallback" if points and unparsed == len(points)
                        else "identical" if outcomes and set(outcomes) == {"identical"} else "pairwise")
        return {"judge_score": sum(points) / len(points) if points else 0.5, "parse_method": parse_method,
                "pairwise": {k: outcomes.count(k) for k in ("win", "loss", "tie", "unparsed", "identical")}}, unscored

    def max_tokens(self, rubric: Rubric) -> int | None:
        return rubric.pairwise.max_tokens


class OutcomeMode(RewardMode):
    """No judge (for a judge too weak to rank memories, e.g. the CPU demo's): the score is the share of the
    next visit's diagnoses named by the memory the forward pass would carry."""

    name = "outcome"
    card_steps: ClassVar[dict[str, tuple[str, str]]] = {
        "judge_server / preflight": ("preflight", (
            "no judge is started (reward.mode outcome); preflight scores reference memories with the outcome "
            "reward and checks that the training run is possible")),
        "train_grpo": ("train_grpo", (
            "GRPO with a LoRA on the memory model: each prompt is rolled out G times, each rollout is scored by "
            "the share of the next visit's diagnoses its memory names, advantages are taken relative to the group")),
    }
    card_reward_row = "outcome (no judge): the share of the next visit's diagnoses the memory names"
    card_reward_paragraph = (
        "Each rollout's memory is parsed from the policy output (output without a memory JSON scores 0) "
        "and scored by the share of the next visit's ground-truth diagnoses it names, matched as the "
        "held-out memory recall matches them. No judge model was asked (reward.mode outcome). Every "
        "scored rollout is kept in a private audit log that is never part of a release.\n"
    )
    card_limit = ("The reward is a text match of the memory against the next visit's diagnoses; a memory that names "
                  "them is not necessarily a good clinical summary.")

    def score(self, rubric: Rubric | None, p: dict, calls: list, result: dict) -> str | None:
        # the forward pass's lenient parser (the eval's memory recall reads the same h_t); output with no
        # memory JSON scores 0, below any memory
        memory, _ = jsonparse.parse_memory(p["sample"]["solution_str"])
        result["valid_json"] = memory is not None
        result["outcome"] = anticipated_share(memory, p["step"]["next_ground_truth_diagnoses"]) if memory else 0.0
        result["score"] = result["outcome"]
        result["parse_method"] = "outcome" if memory is not None else "invalid_json"
        return memory

    @property
    def why_training_reward(self) -> str | None:
        return ("reward.mode outcome: the training reward is the share of the next visit's diagnoses a memory names, "
                "not the judge's score; this check measures the judge the config names (judge.rubric) beside the "
                "training path, so the choice is shown, not assumed")

    @property
    def agreement_plot_note(self) -> str | None:
        return "training pays the outcome reward (reward.mode outcome), not this judge"

    def report_reward(self, rubric: str) -> str:
        del rubric
        return ("the outcome reward: the share of the next visit's diagnoses the memory names "
                "(reward.mode outcome; no judge)")


class CustomReward(RewardMode):
    """Your own reward (reward.custom.path) in place of the judge's scorer, whatever reward.mode says: its
    function scores each rollout (llmrnn.reward.custom), and preflight calls it on real rows."""

    name = "custom"
    card_steps: ClassVar[dict[str, tuple[str, str]]] = {
        "judge_server / preflight": ("preflight", (
            "no judge is started (reward.custom); preflight calls your reward on real rows and checks that "
            "the training run is possible")),
        "train_grpo": ("train_grpo", (
            "GRPO with a LoRA on the memory model: each prompt is rolled out G times, your reward function "
            "scores every rollout, advantages are taken relative to the group")),
    }
    card_reward_row = "your own reward: {name} in {path} (no judge)"  # formatted with the manifest's own_reward
    card_reward_paragraph = ("Every rollout was scored by that function (reward.custom); the manifest holds its file's "
                             "hash. No judge model was asked.\n")
    card_limit = ("The reward is your own function's score (reward.custom); a higher reward is not the same as better "
                  "downstream predictions unless the held-out evaluation shows it.")

    @property
    def key(self) -> str:
        return "reward.custom"

    @property
    def custom(self) -> dict:
        """reward.custom as a dict (llmrnn.settings.Reward.custom_reward)."""
        return self.reward.custom_reward

    def score(self, rubric: Rubric | None, p: dict, calls: list, result: dict) -> str | None:
        raise InputError("reward.custom: your own reward is called through llmrnn.reward.custom, not the judge's scorer")

    def preflight(self, checks: PreflightChecks) -> Any:
        """Your function called on real rows (finite numbers in time), never the scorer."""
        return checks.custom_checks(self)

    @property
    def why_training_reward(self) -> str | None:
        return ("reward.custom: the training reward is your own function's score, not the judge's; this check "
                "measures the judge the config names (judge.rubric) beside the training path, so the choice is "
                "shown, not assumed")


# reward.mode's values, in the order of its literal (llmrnn.settings.Reward.mode), -> their mode
MODES: dict[str, type[RewardMode]] = {mode.name: mode for mode in (ScalarMode, PairwiseMode, OutcomeMode)}
# the modes a judge-agreement check can score in (`llmrnn preflight agreement --mode`)
JUDGED_MODES = tuple(name for name, mode in MODES.items() if mode.asks_judge)


def reward_mode(reward: Reward) -> RewardMode:
    """The mode of config section `reward` (its settings model): your own reward when reward.custom.path is
    set, else reward.mode's."""
    if reward.custom_reward is not None:
        return CustomReward(reward)
    return MODES[reward.mode](reward)


def mode_named(name: Any) -> RewardMode | None:
    """The mode a run's files name by reward.mode (e.g. agreement.json's training_reward_mode); None: no
    such mode."""
    return MODES[name](Reward(mode=name)) if name in MODES else None
