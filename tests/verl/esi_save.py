"""Runs INSIDE a verl venv: does verl's own time-limit save see our stop deadline?

    .venv-verl-X/bin/python tests/verl/esi_save.py --overrides o.json --longest-step S [S ...]

verl's main_ppo.run_ppo builds ray.init's arguments from our composed overrides (stopped right at ray.init,
whose arguments are kept, as tests/verl/ray_env.py does); the runtime_env's env_vars are what verl's
TaskRunner (the Ray actor that runs fit()) has in its environment. With them in this process's environment,
verl's own should_save_ckpt_esi is asked, as fit() asks it after each step, with the composed
trainer.esi_redundant_time and each longest step duration given. Prints one JSON line.
"""

from __future__ import annotations

import argparse
import json
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--overrides", required=True)
    ap.add_argument("--longest-step", type=float, nargs="+", required=True)
    args = ap.parse_args()

    from check_verl import composed, ray_init_arguments
    from verl.utils.checkpoint.checkpoint_manager import should_save_ckpt_esi

    config = composed(args.overrides)
    captured = ray_init_arguments(config)
    env_vars = dict(captured["runtime_env"]["env_vars"])
    os.environ.update(env_vars)  # as Ray sets them in the TaskRunner's process (it requires strings)
    redundant = config.trainer.esi_redundant_time
    saves = [should_save_ckpt_esi(max_steps_duration=s, redundant_time=redundant) for s in args.longest_step]
    import verl

    print(json.dumps({"verl": verl.__version__, "esi_redundant_time": redundant,
                      "env_types": sorted({type(v).__name__ for v in env_vars.values()}),
                      "expiration": env_vars.get("MLP_CURRENT_CAPACITY_BLOCK_EXPIRATION_TIMESTAMP"),
                      "saves": saves}))
    return 0


if __name__ == "__main__":
    sys.exit(main())
