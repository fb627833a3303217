"""The qa configs: schema-valid (recipe is an enum, the qa section closed), and the reproduction's verl
command composes against verl's own config (0.7.1 / 0.9.x venvs) with the qa reward module."""

from __future__ import annotations

import json
import os
import subprocess
from pathlib import Path

import pytest
import yaml

from llmrnn import check

REPO = Path(__file__).resolve().parents[1]
LAYERS = {
    "demo": [REPO / "config/qa_demo.yaml"],  # each recipe file runs alone (llmrnn.runconfig)
    "reproduce": [REPO / "config/qa_reproduce.yaml"],
}


@pytest.mark.parametrize("name", sorted(LAYERS))
def test_qa_configs_are_schema_valid(name):
    config, problems = check.load_config(LAYERS[name])
    assert problems == [] and config["recipe"] == "qa"
    assert config["qa"]["sft"]["enabled"] and config["qa"]["eval"]["k"] >= 2


def test_recipe_and_qa_keys_are_checked(tmp_path):
    bad = tmp_path / "bad.yaml"
    bad.write_text(yaml.safe_dump({"recipe": "qa_recipe", "qa": {"sft": {"lora_rank": 8}}}))
    _, problems = check.load_config([REPO / "config/config.yaml", bad])
    assert problems and any("qa_recipe" in p or "lora_rank" in p for p in problems), problems


def test_memory_head_is_the_default_recipe():
    config, problems = check.load_config([REPO / "config/config.yaml"])
    assert problems == [] and config["recipe"] == "memory_head"


VERL_ENVS = sorted(REPO.glob(".venv-verl-*/bin/python"))
PROBE = """
import json, sys
from llmrnn import check
config, problems = check.load_config([__import__("pathlib").Path(p) for p in sys.argv[1:]])
print(json.dumps(problems + check.check_training(config)))
"""


@pytest.mark.skipif(not VERL_ENVS, reason="no verl env (scripts/make_verl_env.sh makes .venv-verl-<version>)")
@pytest.mark.parametrize("python", VERL_ENVS, ids=[p.parts[-3] for p in VERL_ENVS])
def test_qa_reproduce_verl_command_composes(python, tmp_path):
    env = dict(os.environ, PYTHONPATH=str(REPO / "src"), LLMRNN_TRAIN_GPUS="2")
    proc = subprocess.run([str(python), "-c", PROBE, *map(str, LAYERS["reproduce"])], capture_output=True,
                          text=True, env=env, timeout=300, check=False)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert json.loads(proc.stdout.strip().splitlines()[-1]) == []
    # the composed command really names the qa reward (not the memory head's)
    from llmrnn.train import verl_overrides

    config, _ = check.load_config(LAYERS["reproduce"])
    overrides = verl_overrides.build_overrides(config["train"], train_parquet="t", val_parquet="v", model_dir="m",
                                               out_dir=str(tmp_path), experiment_name="x",
                                               reward_path="pkg://llmrnn.qa.rewards")
    assert "reward.custom_reward_function.path=pkg://llmrnn.qa.rewards" in overrides
