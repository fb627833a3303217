#!/usr/bin/env bash
# Run by Snakemake inside the new envs/verl.yaml env: the GPU lock as written, then llmrnn itself.
# LLMRNN_REPO: the workflow's folder (rules/common.smk sets it for Snakemake; by hand: export it).
set -euo pipefail
: "${LLMRNN_REPO:?LLMRNN_REPO must name the llmrnn repository (Snakemake sets it)}"
uv pip install --python "$(command -v python)" --no-deps -r "$LLMRNN_REPO/envs/gpu-lock.txt"
uv pip install --python "$(command -v python)" --no-deps -e "$LLMRNN_REPO"
