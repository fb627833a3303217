"""`llmrnn ...` with a FAKE GPU count: the local SLURM's A100s are character devices with no driver, so
torch sees none; here the training job counts the devices SLURM gave it (CUDA_VISIBLE_DEVICES)."""

import os
import sys

import llmrnn.gpus
import llmrnn.preflight.training
from llmrnn.cli import main


def fake_visible_gpus() -> int:
    return len([d for d in os.environ.get("CUDA_VISIBLE_DEVICES", "").split(",") if d])


# the training stage imports llmrnn.gpus.visible_gpus when it runs; the preflight holds its own name
llmrnn.gpus.visible_gpus = fake_visible_gpus
llmrnn.preflight.training.visible_gpus = fake_visible_gpus
sys.exit(main(sys.argv[1:]))
