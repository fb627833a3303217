"""After an own-reward run the card names the reward file and function (it said "outcome (no judge)") and the
manifest holds the file's sha256 (it held the path alone)."""

from __future__ import annotations

from llmrnn import io
from llmrnn.release.card import memory_reward
from llmrnn.release.manifest import own_reward


def test_the_card_and_manifest_name_the_own_reward_file(tmp_path):
    reward = tmp_path / "my_reward.py"
    reward.write_text("def compute_score(*a, **k):\n    return 0.0\n")
    knobs = {"recipe": "memory_head", "train": {"engine": "trl"},
             "reward": {"mode": "outcome", "custom": {"path": str(reward), "name": "compute_score"}}}
    entry = own_reward(knobs)
    assert entry == {"path": str(reward), "name": "compute_score", "sha256": io.sha256_file(reward)}
    section = memory_reward({"knobs": knobs, "judge": {"rubric_file": None}, "own_reward": entry})
    rows = dict(section["reward_rows"])
    assert rows == {"reward": f"your own reward: compute_score in {reward} (no judge)",
                    "reward file sha256": entry["sha256"]}
    assert "reward.custom" in section["reward_mode"]["how_scored"]


def test_without_an_own_reward_the_card_says_outcome():
    knobs = {"recipe": "memory_head", "train": {"engine": "trl"}, "reward": {"mode": "outcome"}}
    assert own_reward(knobs) is None
    section = memory_reward({"knobs": knobs, "judge": {"rubric_file": None}, "own_reward": None})
    assert dict(section["reward_rows"])["reward"].startswith("outcome (no judge)")
