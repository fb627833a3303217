"""The reward modes (llmrnn.reward.modes): one object per value of reward.mode, and your own reward, each
saying whether it asks the judge, how it scores, what preflight checks and what the release and report
say; the literal in the settings and the registry name the same modes."""

from __future__ import annotations

import json
import typing

import pytest

from llmrnn.errors import InputError
from llmrnn.release import card
from llmrnn.reward import JUDGED_MODES, MODES, RewardMode, Scorer, asks_judge, mode_named, reward_mode
from llmrnn.reward.config import reward_settings
from llmrnn.reward.modes import CustomReward, OutcomeMode, PairwiseMode, ScalarMode
from llmrnn.rubric import load_rubric
from llmrnn.settings import Reward
from tests.judge_helpers import make_step, memory, write_rubric

DS = "llm_as_rnn_memory_update"


def test_every_literal_value_has_a_mode_and_every_mode_a_literal_value():
    literal = typing.get_args(Reward.model_fields["mode"].annotation)
    assert tuple(MODES) == literal  # the same names, in the literal's order (--mode's choices follow it)
    for name, mode in MODES.items():
        assert issubclass(mode, RewardMode) and mode.name == name
        assert isinstance(reward_mode(Reward(mode=name)), mode)
        assert isinstance(mode_named(name), mode)
    assert mode_named("custom") is None and mode_named(None) is None  # not a value of reward.mode


def test_your_own_reward_is_its_own_mode_whatever_reward_mode_says(tmp_path):
    for name in MODES:
        mode = reward_mode(Reward(mode=name, custom={"path": str(tmp_path / "r.py")}))
        assert isinstance(mode, CustomReward) and not mode.asks_judge
        assert mode.custom["path"] == str(tmp_path / "r.py")
        assert mode.no_judge_note == "reward.custom asks no judge"


def test_which_modes_ask_the_judge():
    assert JUDGED_MODES == ("scalar", "pairwise")
    for name in MODES:
        assert asks_judge({"reward": {"mode": name}}) is (name in JUDGED_MODES)
    assert not asks_judge({"reward": {"mode": "scalar", "custom": {"path": "r.py"}}})


def test_a_mode_that_asks_the_judge_stops_without_an_endpoint_in_one_line_naming_its_key():
    for name in JUDGED_MODES:
        with pytest.raises(InputError, match=rf"^reward\.mode {name} asks the judge but no judge endpoint was "
                                             r"given: pass --endpoint \(RUN/judge/endpoint\.json"):
            reward_mode(Reward(mode=name)).require_endpoint(None, "pass --endpoint")
        reward_mode(Reward(mode=name)).require_endpoint("endpoint.json", "pass --endpoint")
    reward_mode(Reward(mode="outcome")).require_endpoint(None, "pass --endpoint")  # needs none


def test_the_words_name_real_keys():
    outcome = reward_mode(Reward(mode="outcome"))
    assert outcome.no_judge_note == "reward.mode outcome asks no judge"
    assert outcome.agreement_plot_note == "training pays the outcome reward (reward.mode outcome), not this judge"
    assert outcome.why_training_reward.startswith("reward.mode outcome: ")
    for name in JUDGED_MODES:
        mode = reward_mode(Reward(mode=name))
        assert mode.no_judge_note is None and mode.agreement_plot_note is None and mode.why_training_reward is None
    for mode in [*(m(Reward(mode=n)) for n, m in MODES.items()), reward_mode(Reward(custom={"path": "r.py"}))]:
        section, _, rest = mode.key.partition(".")
        field = rest.split()[0]
        assert section == "reward" and field in Reward.model_fields, mode.key


def test_outcome_mode_scores_the_share_of_the_next_visits_diagnoses_without_a_judge(tmp_path):
    scorer = Scorer(None, None, tmp_path / "audit", Reward(mode="outcome"))
    step = json.dumps(make_step())
    truth = make_step()["next_ground_truth_diagnoses"]
    named = scorer.score_samples([{"data_source": DS, "solution_str": memory("; ".join(truth)),
                                   "ground_truth": step, "extra_info": {"index": 0}},
                                  {"data_source": DS, "solution_str": "no memory here",
                                   "ground_truth": step, "extra_info": {"index": 1}}])
    assert named[0]["score"] == 1.0 and named[0]["parse_method"] == "outcome" and named[0]["judge_calls"] == 0
    assert named[1]["score"] == 0.0 and named[1]["parse_method"] == "invalid_json"
    assert scorer.counts["http_calls"] == 0 and scorer.rubric is None


def test_the_judged_modes_plan_their_own_judge_calls(tmp_path):
    rubric = load_rubric(write_rubric(tmp_path, max_tokens=33))
    prepared = [{"step": make_step(0), "memory": "heart failure", "sample": {"group": "g"}},
                {"step": make_step(1), "memory": None, "sample": {"group": "g"}},  # not a memory: never judged
                {"step": make_step(2), "memory": "kidney disease", "sample": {"group": "g"}}]
    scalar = ScalarMode(Reward(mode="scalar")).judge_plan(rubric, prepared, "reference")
    assert [(i, a) for i, _, a in scalar] == [(0, True), (2, True)]
    pairwise = PairwiseMode(Reward(mode="pairwise")).judge_plan(rubric, prepared, "group")
    assert [(i, a) for i, _, a in pairwise] == [(0, True), (0, False), (2, True), (2, False)]  # both orders
    assert OutcomeMode(Reward(mode="outcome")).judge_plan(rubric, prepared, "group") == []
    assert ScalarMode.reference_opponent == "reference" and PairwiseMode.reference_opponent == "group"
    assert ScalarMode(Reward()).max_tokens(rubric) == rubric.request.max_tokens == 33
    assert PairwiseMode(Reward()).max_tokens(rubric) == rubric.pairwise.max_tokens


OWN = {"name": "compute_score", "path": "r.py", "sha256": "0" * 64}  # a manifest's own_reward


@pytest.mark.parametrize("reward", [*({"mode": name} for name in MODES), {"custom": {"path": "r.py"}}],
                         ids=[*MODES, "custom"])
def test_the_card_says_what_the_reward_mode_says(reward):
    """The card's reward sentences are its mode's (release/card.py reads them from the mode), and only a
    mode that asks the judge says the judge scored the rollouts."""
    mode = reward_mode(reward_settings(reward))
    own = OWN if "custom" in reward else None
    section = card.memory_reward({"knobs": {"train": {}, "reward": reward}, "judge": {}, "own_reward": own})
    assert section["reward_mode"]["how_scored"] == mode.card_reward_paragraph.rstrip("\n")
    assert section["reward_mode"]["limit"] == mode.card_limit
    steps = dict(card.workflow_steps({"reward": reward}))
    assert ("the judge scores every rollout" in steps["train_grpo"]) == mode.asks_judge
    assert ("judge_server / preflight" in steps) == mode.asks_judge
    if own:
        assert dict(section["reward_rows"])["reward"] == "your own reward: compute_score in r.py (no judge)"
    elif mode.card_reward_row:
        assert dict(section["reward_rows"])["reward"] == mode.card_reward_row


def test_what_the_reports_first_page_says_each_mode_paid():
    assert reward_mode(Reward(mode="scalar")).report_reward("r.yaml, sha256 ab") == \
        "the judge's scalar score by the rubric r.yaml, sha256 ab"
    assert reward_mode(Reward(mode="pairwise")).report_reward("-").startswith("the judge's pairwise score")
    outcome = reward_mode(Reward(mode="outcome")).report_reward("r.yaml")
    assert "(reward.mode outcome; no judge)" in outcome and "r.yaml" not in outcome
