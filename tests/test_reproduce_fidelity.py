"""Golden fidelity: the reproduction configs, resolved the way a run resolves them (llmrnn.runconfig: the
file alone over the schema's defaults, Snakemake's own validate), and the verl overrides rendered from them
by the code that renders them for main_ppo (llmrnn.train.verl_overrides.build_overrides), equal the tables below,
knob by knob. The tables are the spec: a knob that drifts, a demo value that leaks in, and an override that
nobody put in a table all fail.

The reference run (phase1_v2judge_run02, its model card):
  base meta-llama/Llama-3.2-3B-Instruct; LoRA r 16, alpha 32, dropout 0 on q,k,v,o,gate,up,down_proj;
  verl 0.7.1 stock main_ppo, adv_estimator grpo; LR 3e-6 AdamW, no LR schedule; KL beta 0.001 inside the
  actor loss (use_kl_loss true, use_kl_in_reward false), estimator low_var_kl; entropy coef 0; grad clip 1.0;
  G 8 rollouts per prompt; train / ppo_mini / micro-per-GPU batch 16 / 16 / 4 (one update per step);
  rollout T 0.8, top-p 0.95; max prompt / response 3072 / 512 tokens; epochs / save_freq / test_freq
  20 / 20 / 5; 340 optimizer steps = 20 epochs over the train parquet (no step cap); 2 A100 actor+rollout
  (TP 2) + 1 A100 judge; reward = RubricARM-8B scalar judge "Score: N" -> N/9, invalid policy JSON 0.05;
  100 train patients sampled with seed 42. Here validation runs on the val split (val before training,
  every 5 steps), and the held-out eval covers every patient and every visit.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from llmrnn import runconfig
from llmrnn.train import verl_overrides

REPO = Path(__file__).resolve().parents[1]
LORA_TARGETS = ["q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"]
LORA_TARGETS_HYDRA = "[" + ",".join(LORA_TARGETS) + "]"
# the run-specific arguments build_overrides gets from the train rule (paths, names), as placeholders
RUN_ARGS = {"train_parquet": "TRAIN.parquet", "val_parquet": "VAL.parquet", "model_dir": "MODEL",
            "out_dir": "WORK", "experiment_name": "RUN", "endpoint_file": "ENDPOINT.json", "verl_version": "0.7.1"}

# ----------------------------------------------------------------------------- config/reproduce.yaml
# effective config key                 value                          knob of the reference
REPRODUCE_CONFIG = {
    "recipe":                          "memory_head",
    "split.train_size":                100,                           # 100 train patients
    "split.seed":                      42,                            # sampled with seed 42
    "models.llama-3.2-3b-instruct.repo_id": "meta-llama/Llama-3.2-3B-Instruct",
    "roles.memory.model":              "llama-3.2-3b-instruct",       # the policy's base
    "judge.rubric":                    "config/rubrics/rubric_v2_rubricarm_scalar.yaml",  # RubricARM, scalar
    "reward.mode":                     "scalar",                      # Score: N -> N/9
    "reward.outcome_epsilon":          0.0,                           # judge score only
    "reward.invalid_json_score":       0.05,
    "trajectories.max_visits":         None,                          # every visit
    "eval.max_patients":               None,                          # the whole held-out split
    "eval.max_visits":                 None,                          # every visit of each patient
    "train.engine":                    "verl",
    "train.fail_on_zero_gradient":     True,  # a run that never learned fails (no engine-specific reading)
    "train.seed":                      42,
    "train.lora.rank":                 16,
    "train.lora.alpha":                32,
    "train.lora.dropout":              0.0,
    "train.lora.target_modules":       LORA_TARGETS,                  # the 7 projections
    "train.lr":                        3e-6,
    "train.lr_scheduler":              "constant",                    # no LR schedule
    "train.warmup_steps":              0,
    "train.kl.coef":                   0.001,
    "train.kl.estimator":              "low_var_kl",
    "train.kl.in_loss":                True,
    "train.entropy_coef":              0.0,
    "train.grad_clip":                 1.0,
    "train.group_size":                8,
    "train.batch.train":               16,
    "train.batch.mini":                16,
    "train.batch.micro_per_gpu":       4,
    "train.rollout.temperature":       0.8,
    "train.rollout.top_p":             0.95,
    "train.rollout.tensor_parallel":   2,
    "train.rollout.gpu_memory_utilization": 0.6,
    "train.max_prompt_length":         3072,
    "train.max_response_length":       512,
    "train.epochs":                    20,
    "train.total_steps":               None,                          # NO step cap: 340 steps = 20 epochs
    "train.save_freq":                 20,
    "train.test_freq":                 5,
    "train.keep_last":                 None,
    "train.select":                    "last",           # the reference merged its final step
    "train.clip_ratio.low":            0.2,              # the card states no ratio clip ("clip 1.0" is the
    "train.clip_ratio.high":           0.2,              # gradient's): verl's defaults, now explicit
    "train.loss_agg_mode":             "token-mean",     # verl's default (TRL's differs: set on both engines)
    "train.val_before_train":          True,                          # val enabled
    "train.val_generations":           None,                          # verl's own validation
    "train.n_gpus_per_node":           2,
    "train.nnodes":                    1,
    "train.verl.attn_implementation":  "auto",           # flash-attn where it imports (the reference's image), else sdpa
    "train.verl.reward_manager":       "naive",
    "train.verl.reward_num_workers":   8,
    "train.verl.extra_overrides":      [],
}
# train keys deliberately not pinned: where the job runs (SLURM sizing), engines other than verl, log names
# and the trackers watching the run (they change nothing it computes)
TRAIN_UNPINNED = ("train.resources.", "train.trl.", "train.early_stopping.", "train.project_name",
                  "train.min_free_disk_gb", "train.report_to")

# Overrides every verl run renders, whatever the recipe. (Rows that change how verl loads the actor, e.g.
# the attention implementation, belong here.)
VERL_COMMON = {
    "algorithm.adv_estimator":                             "grpo",
    "data.filter_overlong_prompts":                        "true",
    "data.truncation":                                     "error",
    "actor_rollout_ref.rollout.name":                      "vllm",
    "actor_rollout_ref.rollout.load_format":               "safetensors",
    "actor_rollout_ref.rollout.layered_summon":            "true",
    # verl 0.7.1 loads the actor with flash_attention_2 and remove-padding by default; flash-attn is not in
    # the GPU lock, so the actor loads with sdpa and no remove-padding (tests/verl/load_actor.py proves both);
    # train.verl.attn_implementation auto renders these where flash-attn does not import (as here)
    "+actor_rollout_ref.model.override_config.attn_implementation": "sdpa",
    "actor_rollout_ref.model.use_remove_padding":          "false",
    # the ratio clip and loss aggregation, explicit (verl's defaults; the card names neither)
    "actor_rollout_ref.actor.clip_ratio":                  "0.2",
    "actor_rollout_ref.actor.clip_ratio_low":              "0.2",
    "actor_rollout_ref.actor.clip_ratio_high":             "0.2",
    "actor_rollout_ref.actor.loss_agg_mode":               "token-mean",
    "actor_rollout_ref.actor.optim.lr_warmup_steps_ratio": "0.0",
    "trainer.resume_mode":                                 "auto",
    "trainer.logger":                                      "[console,file]",
    "trainer.log_val_generations":                         "0",    # no patient text to a tracker
    "trainer.project_name":                                "llmrnn_grpo",
    "reward.custom_reward_function.name":                  "compute_score",
    "+reward.custom_reward_function.reward_kwargs.numeric_only": "true",
    # the run's own paths and names (placeholders of RUN_ARGS)
    "data.train_files":                                    "TRAIN.parquet",
    "data.val_files":                                      "VAL.parquet",   # the val parquet: val enabled
    "actor_rollout_ref.model.path":                        "MODEL",
    "trainer.default_local_dir":                           "WORK/checkpoints",
    "trainer.rollout_data_dir":                            "WORK/rollouts",
    "trainer.validation_data_dir":                         "WORK/validation",
    "trainer.experiment_name":                             "RUN",
    "+reward.custom_reward_function.reward_kwargs.audit_dir": "WORK/audit",
    "+reward.custom_reward_function.reward_kwargs.endpoint_file": "ENDPOINT.json",
}
# verl override (main_ppo key)                                 rendered value      knob of the reference
REPRODUCE_OVERRIDES = {
    **VERL_COMMON,
    "algorithm.use_kl_in_reward":                          "false",            # KL not in the reward
    "actor_rollout_ref.actor.use_kl_loss":                 "true",             # KL inside the actor loss
    "actor_rollout_ref.actor.kl_loss_coef":                "0.001",
    "actor_rollout_ref.actor.kl_loss_type":                "low_var_kl",
    "actor_rollout_ref.actor.entropy_coeff":               "0.0",
    "actor_rollout_ref.actor.grad_clip":                   "1.0",
    "actor_rollout_ref.actor.optim.lr":                    "3e-06",
    "actor_rollout_ref.actor.optim.lr_scheduler_type":     "constant",
    "actor_rollout_ref.actor.optim.lr_warmup_steps":       "0",
    "actor_rollout_ref.model.lora_rank":                   "16",
    "actor_rollout_ref.model.lora_alpha":                  "32",
    "actor_rollout_ref.model.target_modules":              LORA_TARGETS_HYDRA,
    "actor_rollout_ref.rollout.n":                         "8",                # G
    "data.train_batch_size":                               "16",
    "actor_rollout_ref.actor.ppo_mini_batch_size":         "16",
    "actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu": "4",
    "actor_rollout_ref.rollout.log_prob_micro_batch_size_per_gpu": "4",
    "actor_rollout_ref.ref.log_prob_micro_batch_size_per_gpu": "4",
    "actor_rollout_ref.rollout.temperature":               "0.8",
    "actor_rollout_ref.rollout.top_p":                     "0.95",
    "actor_rollout_ref.rollout.tensor_model_parallel_size": "2",
    "actor_rollout_ref.rollout.gpu_memory_utilization":    "0.6",
    "data.max_prompt_length":                              "3072",
    "data.max_response_length":                           "512",
    "actor_rollout_ref.rollout.max_model_len":             "3584",   # prompt + response: the rollout's context
    "data.seed":                                           "42",   # the reference left it unset (an unseeded
                                                                            # shuffle): stated in the model card
    "actor_rollout_ref.actor.data_loader_seed":            "42",
    "trainer.total_epochs":                                "20",
    "trainer.save_freq":                                   "20",
    "trainer.test_freq":                                   "5",
    "trainer.val_before_train":                            "true",
    "trainer.n_gpus_per_node":                             "2",
    "trainer.nnodes":                                      "1",
    "trainer.max_actor_ckpt_to_keep":                      "null",
    "reward.custom_reward_function.path":                  "pkg://llmrnn.reward",
    "reward.reward_manager.name":                          "naive",
    "reward.num_workers":                                  "8",
    # and NO trainer.total_training_steps (no step cap), NO val_kwargs.n (verl's own validation)
}

# ----------------------------------------------------------------------------- config/qa_reproduce.yaml
# The qa recipe at reference scale (its config's header): ECG-Expert-QA, Llama-3.2-3B-Instruct, a LoRA SFT
# warm start, then verl GRPO with hybrid scoring (exact match + the RubricARM correctness judge), the
# memory head's GRPO knobs except LR 1e-6 cosine with 5 warmup steps, prompts up to 1024 tokens, 5 epochs.
QA_REPRODUCE_CONFIG = {
    "recipe":                          "qa",
    "qa.model":                        "llama-3.2-3b-instruct",
    "models.llama-3.2-3b-instruct.repo_id": "meta-llama/Llama-3.2-3B-Instruct",
    "qa.source":                       "data/ecg_expert_qa/train.json",
    "qa.ood":                          None,
    "qa.split.val_size":               100,
    "qa.split.test_size":              300,
    "qa.split.seed":                   42,
    "qa.reward.weights.exact_match":   0.5,
    "qa.reward.weights.format":        0.1,
    "qa.reward.weights.judge":         0.5,
    "qa.reward.weights.fluency":       0.0,
    "qa.reward.rubric":                "config/rubrics/qa_correctness_rubricarm.yaml",
    "judge.rubric":                    "config/rubrics/qa_correctness_rubricarm.yaml",
    "qa.sft.enabled":                  True,
    "qa.sft.lora.rank":                16,
    "qa.sft.lora.alpha":               32,
    "qa.sft.lora.dropout":             0.05,
    "qa.sft.lr":                       2e-4,
    "qa.sft.epochs":                   3,
    "qa.sft.batch_size":               8,
    "qa.sft.grad_accum":               4,
    "qa.sft.max_length":               2048,
    "qa.sft.max_steps":                None,
    "qa.eval.k":                       8,
    "qa.eval.temperature":             0.8,
    "qa.eval.top_p":                   0.95,
    "qa.eval.max_new_tokens":          512,
    "qa.eval.max_questions":           None,                          # every test question
    "qa.eval.judge":                   "auto",                        # free text: judge-graded too
    "qa.eval.judge_threshold":         0.5,
    "train.engine":                    "verl",
    "train.fail_on_zero_gradient":     True,  # a run that never learned fails (no engine-specific reading)
    "train.seed":                      42,
    "train.lora.rank":                 16,
    "train.lora.alpha":                32,
    "train.lora.dropout":              0.0,
    "train.lora.target_modules":       LORA_TARGETS,
    "train.lr":                        1e-6,
    "train.lr_scheduler":              "cosine",
    "train.warmup_steps":              5,
    "train.kl.coef":                   0.001,
    "train.kl.estimator":              "low_var_kl",
    "train.kl.in_loss":                True,
    "train.entropy_coef":              0.0,
    "train.grad_clip":                 1.0,
    "train.group_size":                8,
    "train.batch.train":               16,
    "train.batch.mini":                16,
    "train.batch.micro_per_gpu":       4,
    "train.rollout.temperature":       0.8,
    "train.rollout.top_p":             0.95,
    "train.rollout.tensor_parallel":   2,
    "train.rollout.gpu_memory_utilization": 0.6,
    "train.max_prompt_length":         1024,
    "train.max_response_length":       512,
    "train.epochs":                    5,
    "train.total_steps":               None,                          # no step cap
    "train.save_freq":                 20,
    "train.test_freq":                 5,
    "train.keep_last":                 None,
    "train.select":                    "last",           # the reference merged its final step
    "train.clip_ratio.low":            0.2,              # the card states no ratio clip ("clip 1.0" is the
    "train.clip_ratio.high":           0.2,              # gradient's): verl's defaults, now explicit
    "train.loss_agg_mode":             "token-mean",     # verl's default (TRL's differs: set on both engines)
    "train.val_before_train":          True,
    "train.val_generations":           None,
    "train.n_gpus_per_node":           2,
    "train.nnodes":                    1,
    "train.verl.attn_implementation":  "auto",           # flash-attn where it imports (the reference's image), else sdpa
    "train.verl.reward_manager":       "naive",
    "train.verl.reward_num_workers":   8,
    "train.verl.extra_overrides":      [],
}
QA_REPRODUCE_OVERRIDES = {
    **REPRODUCE_OVERRIDES,
    "actor_rollout_ref.actor.optim.lr":                    "1e-06",
    "actor_rollout_ref.actor.optim.lr_scheduler_type":     "cosine",
    "actor_rollout_ref.actor.optim.lr_warmup_steps":       "5",
    "data.max_prompt_length":                              "1024",
    "actor_rollout_ref.rollout.max_model_len":             "1536",   # prompt + response
    "trainer.total_epochs":                                "5",
    "reward.custom_reward_function.path":                  "pkg://llmrnn.qa.rewards",  # the qa rule's reward module
}

CASES = {
    "reproduce": ("config/reproduce.yaml", REPRODUCE_CONFIG, REPRODUCE_OVERRIDES, None),
    "qa_reproduce": ("config/qa_reproduce.yaml", QA_REPRODUCE_CONFIG, QA_REPRODUCE_OVERRIDES, "llmrnn.qa.rewards"),
}


def effective(configfile: str) -> tuple[dict, dict]:
    """(config, sources) as a run of `snakemake --configfile <configfile>` resolves them."""
    return runconfig.resolve([runconfig.read_layer(REPO / configfile)], REPO / runconfig.SCHEMA)


def flat(tree: dict) -> dict[str, object]:
    return {".".join(map(str, path)): value for path, value in runconfig.leaves(tree)}


def rendered(config: dict, reward_module: str | None) -> dict[str, str]:
    overrides = verl_overrides.build_overrides(config["train"], **RUN_ARGS,
                                               reward_path=f"pkg://{reward_module}" if reward_module else None)
    pairs = [item.split("=", 1) for item in overrides]
    keys = [k for k, _ in pairs]
    assert len(keys) == len(set(keys)), f"an override is given twice: {keys}"
    return dict(pairs)


def _mismatches(actual: dict, expected: dict) -> list[str]:
    return [f"{key}: expected {want!r}, got {actual.get(key, '(absent)')!r}"
            for key, want in expected.items() if actual.get(key, "(absent)") != want]


@pytest.mark.parametrize("name", sorted(CASES))
def test_effective_config_equals_the_reference_table(name):
    configfile, table, _, _ = CASES[name]
    config, _ = effective(configfile)
    values = flat(config)
    assert _mismatches(values, table) == []
    # every train knob is pinned or deliberately left out: a new train key must be added to the table
    train_keys = {k for k in values if k.startswith("train.")}
    unpinned = {k for k in train_keys if k.startswith(TRAIN_UNPINNED)}
    assert train_keys - unpinned == {k for k in table if k.startswith("train.")}


@pytest.mark.parametrize("name", sorted(CASES))
def test_rendered_verl_overrides_equal_the_reference_table(name):
    configfile, _, table, reward_module = CASES[name]
    config, _ = effective(configfile)
    overrides = rendered(config, reward_module)
    assert _mismatches(overrides, table) == []
    # the whole set: an override that no table names (a step cap, a leaked demo knob, a new default) fails
    assert sorted(set(overrides) - set(table)) == []
    assert "trainer.total_training_steps" not in overrides
    assert not any(k.startswith("actor_rollout_ref.rollout.val_kwargs.") for k in overrides)


@pytest.mark.parametrize("name", sorted(CASES))
def test_no_value_of_the_embedded_demo_reaches_a_reproduction(name):
    configfile = CASES[name][0]
    _, sources = effective(configfile)
    assert set(flat(sources).values()) <= {runconfig.label(REPO / configfile), runconfig.SCHEMA_DEFAULT}


def test_a_step_cap_in_the_reproduction_would_fail_the_table(tmp_path):
    """The tables bite: the demo's leaked knobs of old (total_steps 8, val_generations 2) are caught."""
    import yaml

    cfg = yaml.safe_load((REPO / "config/reproduce.yaml").read_text())
    cfg["train"].update(total_steps=8, val_generations=2)
    leaked = tmp_path / "leaked.yaml"
    leaked.write_text(yaml.safe_dump(cfg))
    config, _ = runconfig.resolve([runconfig.read_layer(leaked)], REPO / runconfig.SCHEMA)
    assert _mismatches(flat(config), REPRODUCE_CONFIG) == [
        "train.total_steps: expected None, got 8", "train.val_generations: expected None, got 2"]
    extra = set(rendered(config, None)) - set(REPRODUCE_OVERRIDES)
    assert extra == {"trainer.total_training_steps", "actor_rollout_ref.rollout.val_kwargs.n",
                     "actor_rollout_ref.rollout.val_kwargs.do_sample"}


# ----------------------------------------------------------------------------- the literal SLURM command
def _cfg_arg(shell: str) -> dict:
    """The JSON of a planned job's `--cfg` argument."""
    import json
    import shlex

    words = shlex.split(shell)
    return json.loads(words[words.index("--cfg") + 1])


@pytest.mark.slow
def test_literal_slurm_dry_run_plans_the_reference(literal_slurm_dry_run):
    """`snakemake --profile profiles/slurm -n all` (the profile names config/reproduce.yaml): the planned
    train_grpo job gets the table's train knobs (no step cap, verl's own validation) and every eval shard
    evaluates every patient's every visit; no job sees a value of config/config.yaml. The dry run is the
    session's (tests/conftest.py; a synthetic stand-in at cohort.source, MIMIC-IV is not shipped)."""
    from tests.slurm.dag import parse_dry_run

    _, _, text = literal_slurm_dry_run
    jobs = parse_dry_run(text)

    (train,) = [j for j in jobs if j.rule == "train_grpo"]
    planned = flat({"train": _cfg_arg(train.shell)["train"]})
    assert _mismatches(planned, {k: v for k, v in REPRODUCE_CONFIG.items() if k.startswith("train.")}) == []
    overrides = rendered(_cfg_arg(train.shell), None)
    assert "trainer.total_training_steps" not in overrides and overrides["trainer.total_epochs"] == "20"

    shards = [j for j in jobs if j.rule == "eval_shard"]
    assert len(shards) == 16 * 4  # base, trained, zero_shot, full_history: 16 shards each
    for shard in shards:
        assert _cfg_arg(shard.shell)["eval"] | {"patient_seed": 0, "seed": 1234} == {
            "max_patients": None, "max_visits": None, "patient_seed": 0, "seed": 1234}
    trajectory_shards = [j for j in jobs if j.rule == "trajectory_shard"]
    assert len(trajectory_shards) == 2 * 4  # train and val, 4 shards each
    for shard in trajectory_shards:
        assert _cfg_arg(shard.shell)["trajectories"]["max_visits"] is None  # every visit
    assert "results/phase1_v2judge_repro/" in text and "results/demo/" not in text
