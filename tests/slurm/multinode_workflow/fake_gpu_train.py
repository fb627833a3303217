"""`llmrnn ...` with a FAKE GPU count: the local SLURM's A100s are character devices with no driver, so
torch sees none; here the training job counts the devices SLURM gave it (CUDA_VISIBLE_DEVICES)."""

import os
import sys

import llmrnn.preflight
from llmrnn.cli import main

llmrnn.preflight.visible_gpus = lambda: len([d for d in os.environ.get("CUDA_VISIBLE_DEVICES", "").split(",") if d])
sys.exit(main(sys.argv[1:]))
