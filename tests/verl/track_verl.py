"""Runs INSIDE a verl venv: verl's own Tracking with the composed trainer.logger of our overrides, logging
two steps the way RayPPOTrainer.fit does, in the environment llmrnn.train.tracking sets (given as JSON).

    .venv-verl-X/bin/python tests/verl/track_verl.py --overrides o.json --env env.json

Prints one JSON line: the loggers verl started and the files they wrote.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from check_verl import composed


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--overrides", required=True)
    ap.add_argument("--env", required=True)
    args = ap.parse_args()
    with open(args.env, encoding="utf-8") as fh:
        os.environ.update(json.load(fh))
    config = composed(args.overrides)

    from omegaconf import OmegaConf
    from verl.utils.tracking import Tracking

    # as RayPPOTrainer.fit builds it
    tracker = Tracking(project_name=config.trainer.project_name, experiment_name=config.trainer.experiment_name,
                       default_backend=config.trainer.logger, config=OmegaConf.to_container(config, resolve=True))
    for step, reward in ((1, 0.25), (2, 0.5)):
        tracker.log(data={"critic/rewards/mean": reward}, step=step)
    started = sorted(tracker.logger)
    del tracker  # Tracking.__del__ finishes wandb and closes the TensorBoard writer
    scalars = {}
    if os.environ.get("TENSORBOARD_DIR"):  # read back with tensorboard's own reader
        from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

        for path in Path(os.environ["TENSORBOARD_DIR"]).rglob("events.out.tfevents.*"):
            acc = EventAccumulator(str(path))
            acc.Reload()
            for tag in acc.Tags()["scalars"]:
                scalars.setdefault(tag, []).extend([e.step, e.value] for e in acc.Scalars(tag))
    print(json.dumps({"started": started, "tensorboard_scalars": scalars}))
    return 0


if __name__ == "__main__":
    sys.exit(main())
