"""Record the GPUs a job of the stand-in group gets: python probe.py judge|train|none OUT."""

import json
import os
import sys

from llmrnn.gpus import assign, visible_devices

role, out = sys.argv[1], sys.argv[2]
seen = visible_devices()
mine = assign(role, judge_gpus=1, train_gpus=2) if role != "none" else seen
record = {"role": role, "visible": seen, "assigned": mine, "host": os.uname().nodename,
          "slurm_job": os.environ.get("SLURM_JOB_ID")}
# a service's output is removed once its consumers are done: keep a copy beside it
for path in [out] + ([os.path.join(os.path.dirname(out), "judge_probe.json")] if role == "judge" else []):
    with open(path + ".tmp", "w") as fh:
        json.dump(record, fh)
    os.replace(path + ".tmp", path)
