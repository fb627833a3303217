"""Runs INSIDE the verl 0.7.1 venv: what verl's Ray workers get of the training job's environment.

    env -i PATH=... .venv-verl-0.7.1/bin/python tests/verl/ray_env.py --overrides o.json --probe-dir DIR

Started with an environment that LACKS the training job's variables and with umask 022, like a worker node
of a `ray start` cluster (its raylet was started before the job, by srun). verl's own main_ppo.run_ppo
builds the ray.init arguments from our composed overrides (stopped right at ray.init, whose arguments are
kept); a local Ray is then started with exactly those arguments and a Ray task (a worker process, as
verl's TaskRunner and FSDP workers are) reports the variables it sees and the mode of a file it writes.
Prints one JSON line.
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
    ap.add_argument("--probe-dir", required=True)
    ap.add_argument("--names", required=True, help="comma-separated variables to report")
    args = ap.parse_args()
    os.umask(0o022)

    import ray
    from check_verl import composed, ray_init_arguments

    config = composed(args.overrides)
    captured = ray_init_arguments(config)
    kwargs = dict(captured)
    # The harness's own settings, never verl's (those are `captured`, reported as they are): on a loaded 2-core
    # CI machine a Ray worker can take over Ray's default 60 s to register, and Ray then kills and restarts it
    # without end (CI hung here for 600 s once). A long registration wait and a bounded ray.get turn that
    # into a slow pass or one clear error.
    kwargs.update(num_cpus=1, include_dashboard=False, log_to_driver=False,
                  _system_config={"worker_register_timeout_seconds": 1000})
    ray.init(**kwargs)
    names = args.names.split(",")

    @ray.remote
    def probe(path: str) -> dict:
        with open(path, "w") as fh:
            fh.write("patient text\n")
        return {"env": {n: os.environ.get(n) for n in names}, "mode": oct(os.stat(path).st_mode & 0o777)}

    try:
        # bounded below the test's own 1500 s: a loaded CI (two tiers side by side on 2 cores) took the
        # earlier 480 s bound once
        seen = ray.get(probe.remote(os.path.join(args.probe_dir, "rollout.jsonl")), timeout=1200)
    finally:
        ray.shutdown()
    print(json.dumps({"runtime_env": captured.get("runtime_env"), **seen}, default=str))
    return 0


if __name__ == "__main__":
    try:
        sys.exit(main())
    except Exception as exc:  # the last stderr line names what failed, whatever Ray printed before it
        print(f"ray_env.py: {type(exc).__name__}: {exc}"[:2000], file=sys.stderr)
        raise SystemExit(1) from exc
