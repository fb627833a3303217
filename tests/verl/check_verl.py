"""Runs INSIDE a verl venv (scripts/make_verl_env.sh): checks our main_ppo overrides against verl itself.

    .venv-verl-X/bin/python tests/verl/check_verl.py --overrides o.json --model DIR [--parquet P]
    .venv-verl-X/bin/python tests/verl/check_verl.py --cases cases.json


1. composes verl/trainer/config `ppo_trainer` with the overrides through Hydra (an unknown key fails:
   "Could not override ..."), then does what main_ppo does before it needs a GPU: migrate the legacy
   reward keys, resolve, and verl's own validate_config (batch divisibility, micro batch sizes, actor
   dataclass checks);
2. checks that the knobs landed where verl reads them (the reward function through verl's own
   get_custom_reward_fn, LoRA rank/alpha, GRPO, rollout n);
3. loads the parquet through verl's RLHFDataset with the tokenizer of --model, with the composed data config.
Prints one JSON line; exits non-zero on any failure.

--cases checks several override sets in one interpreter (a start imports verl, torch and transformers:
20-45 s on 2 loaded cores): cases.json maps a name to {"overrides", "model", "parquet"}; prints one JSON
line mapping each name to {"returncode": 0 or 1, "report": the line above or null, "error": the failure's
traceback or ""}, each case composed on its own as a separate run would compose it.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import traceback


def _vllm_free_lora_rank_check() -> None:
    """validate_config ends with verl's LoRA-rank check, whose module imports vllm at the top; vllm cannot
    be installed on CPU, so load verl's OWN get_vllm_max_lora_rank (it needs no vllm) into that module name."""
    import ast
    import importlib.util
    import types

    spec = importlib.util.find_spec("verl.workers.rollout.vllm_rollout")
    path = os.path.join(os.path.dirname(spec.origin), "utils.py")
    with open(path, encoding="utf-8") as fh:
        source = fh.read()
    tree = ast.parse(source)
    fn = next(n for n in tree.body if isinstance(n, ast.FunctionDef) and n.name == "get_vllm_max_lora_rank")
    module = types.ModuleType("verl.workers.rollout.vllm_rollout.utils")
    code = "from typing import Literal, get_args\n" + ast.get_source_segment(source, fn)
    exec(code, module.__dict__)  # noqa: S102 - verl's own function source, see the docstring
    sys.modules[module.__name__] = module


def _tracking_backends() -> list[str]:
    from verl.utils.tracking import Tracking

    return list(Tracking.supported_backend)


def composed(overrides_file: str):
    """verl's ppo_trainer config with the overrides, as main_ppo prepares it before it needs a GPU."""
    with open(overrides_file, encoding="utf-8") as fh:
        overrides = json.load(fh)

    import verl
    from hydra import compose, initialize_config_dir
    from omegaconf import OmegaConf

    config_dir = os.path.join(os.path.dirname(verl.__file__), "trainer", "config")
    with initialize_config_dir(config_dir=config_dir, version_base=None):
        config = compose(config_name="ppo_trainer", overrides=overrides)

    from verl.experimental.reward_loop import migrate_legacy_reward_impl

    config = migrate_legacy_reward_impl(config)
    OmegaConf.resolve(config)
    return config


def checked(overrides_file: str, model: str, parquet: str | None) -> dict:
    """The report of one override set (steps 1-3 of the docstring); raises on any failure."""
    import verl
    from omegaconf import OmegaConf

    config = composed(overrides_file)

    from verl.trainer.ppo.utils import need_critic, need_reference_policy
    from verl.utils.config import validate_config

    _vllm_free_lora_rank_check()
    use_ref = need_reference_policy(config)
    validate_config(config=config, use_reference_policy=use_ref, use_critic=need_critic(config))

    from verl.trainer.ppo.reward import get_custom_reward_fn

    fn = get_custom_reward_fn(config)
    assert fn is not None, "reward.custom_reward_function did not resolve to a function"
    raw = getattr(fn, "args", [None])[0]
    report = {
        "verl": verl.__version__,
        "adv_estimator": config.algorithm.adv_estimator,
        "lora_rank": config.actor_rollout_ref.model.lora_rank,
        "lora_alpha": config.actor_rollout_ref.model.lora_alpha,
        "target_modules": list(config.actor_rollout_ref.model.target_modules),
        "rollout_n": config.actor_rollout_ref.rollout.n,
        "val_n": config.actor_rollout_ref.rollout.val_kwargs.n,
        "val_do_sample": config.actor_rollout_ref.rollout.val_kwargs.do_sample,
        "rollout_name": config.actor_rollout_ref.rollout.name,
        "load_format": config.actor_rollout_ref.rollout.load_format,
        "max_model_len": config.actor_rollout_ref.rollout.max_model_len,
        "prompt_response": [config.data.max_prompt_length, config.data.max_response_length],
        "use_kl_loss": config.actor_rollout_ref.actor.use_kl_loss,
        "kl_loss_type": config.actor_rollout_ref.actor.kl_loss_type,
        "use_reference_policy": bool(use_ref),
        "reward_fn": f"{getattr(raw, '__module__', '?')}.{getattr(raw, '__name__', '?')}",
        "reward_kwargs": dict(getattr(fn, "args", [None, {}])[1]) if len(getattr(fn, "args", [])) > 1 else {},
        "reward_manager": config.reward.reward_manager.name,
        "default_local_dir": config.trainer.default_local_dir,
        "resume_mode": config.trainer.resume_mode,
        "validation_data_dir": config.trainer.validation_data_dir,
        "use_v1": config.trainer.get("use_v1"),  # verl 0.9 only: main_ppo's v1 trainer (TransferQueue) or v0
        "logger": list(config.trainer.logger),
        # names verl's Tracking would refuse (its __init__ asserts each is in supported_backend)
        "logger_unsupported": [x for x in config.trainer.logger if x not in _tracking_backends()],
        "log_val_generations": config.trainer.log_val_generations,
        # what verl's FSDP worker reads when it loads the actor (tests/verl/load_actor.py mirrors that load)
        "model_override_config": OmegaConf.to_container(config.actor_rollout_ref.model.get("override_config", {})),
        "use_remove_padding": bool(config.actor_rollout_ref.model.get("use_remove_padding", False)),
    }
    if parquet:
        from transformers import AutoTokenizer
        from verl.utils.dataset.rl_dataset import RLHFDataset

        tok = AutoTokenizer.from_pretrained(model)
        ds = RLHFDataset(data_files=[parquet], tokenizer=tok, config=config.data, processor=None)
        item = ds[0]
        report["dataset_rows"] = len(ds)
        report["dataset_keys"] = sorted(item)
        report["item_data_source"] = item.get("data_source")
        report["item_ground_truth_is_json"] = isinstance(
            json.loads(item["reward_model"]["ground_truth"]), dict
        )
    return report


def checked_cases(cases_file: str) -> dict:
    """Each case's outcome, a failing case reported (as its own run's exit status and traceback) beside the rest."""
    with open(cases_file, encoding="utf-8") as fh:
        cases = json.load(fh)
    outcomes = {}
    for name, case in cases.items():
        try:
            outcomes[name] = {"returncode": 0, "error": "",
                              "report": checked(case["overrides"], case["model"], case.get("parquet"))}
        except Exception:  # noqa: BLE001 - reported per case, as a separate run's exit would be
            outcomes[name] = {"returncode": 1, "error": traceback.format_exc(), "report": None}
    return outcomes


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--overrides")
    ap.add_argument("--model")
    ap.add_argument("--parquet", default=None)
    ap.add_argument("--cases", help="a JSON file: name -> {overrides, model, parquet}")
    args = ap.parse_args()
    if args.cases:
        print(json.dumps(checked_cases(args.cases)))
        return 0
    if not (args.overrides and args.model):
        ap.error("--overrides and --model (or --cases) are required")
    print(json.dumps(checked(args.overrides, args.model, args.parquet)))
    return 0


if __name__ == "__main__":
    sys.exit(main())


class _RayInitCaptured(Exception):
    pass


def ray_init_arguments(config) -> dict:
    """The keyword arguments verl's own main_ppo.run_ppo gives ray.init for a composed config: run_ppo is
    stopped right at ray.init (restored afterwards), its arguments kept. verl 0.9.1's run_ppo also asks for
    the TaskRunner class, never reached."""
    import inspect

    from verl.trainer import main_ppo

    captured: dict = {}

    def fake_init(**kwargs):
        captured.update(kwargs)
        raise _RayInitCaptured

    real_init = main_ppo.ray.init
    main_ppo.ray.init = fake_init
    needs_runner = "task_runner_class" in inspect.signature(main_ppo.run_ppo).parameters
    try:
        main_ppo.run_ppo(config, *([None] if needs_runner else []))
    except _RayInitCaptured:
        pass
    finally:
        main_ppo.ray.init = real_init
    return captured
