#!/usr/bin/env bash
# Build a separate CPU venv with one verl release, for the tests that compose verl's own Hydra config
# with our overrides and load our parquet through verl's RLHFDataset (tests/verl/). verl cannot train
# on CPU (its rollout needs vllm/sglang on a GPU), but it installs and these parts work. Kept out of the main .venv: verl 0.7.1
# pins numpy<2 (and pyarrow 26 then fails to import).
#
#   scripts/make_verl_env.sh 0.7.1        -> .venv-verl-0.7.1
#   scripts/make_verl_env.sh 0.9.1 DIR    -> DIR
#
# Idempotent: a stamp file holding this script's hash marks a finished build; rerunning is a no-op.
set -euo pipefail
VERSION="${1:?usage: make_verl_env.sh VERSION [VENV_DIR]}"
REPO="$(cd "$(dirname "$0")/.." && pwd)"
VENV="${2:-$REPO/.venv-verl-$VERSION}"
PY="${PYTHON:-python3}"
STAMP="$VENV/.llmrnn-verl-stamp"
LOCK="$REPO/envs/gpu-lock.txt"
# The GPU lock's releases of what verl's LoRA path runs through (peft: verl's layered_summon_lora_params and
# save_checkpoint collect the adapter with it), so the rehearsal runs what the cluster runs.
LOCKED="$(grep -E '^peft==' "$LOCK")"
WANT="verl==$VERSION $LOCKED $(sha256sum "$0" "$(dirname "$0")/venv_lib.sh" | sha256sum | cut -c1-16)"

if [[ -f "$STAMP" && "$(cat "$STAMP")" == "$WANT" ]]; then
  touch "$STAMP"
  echo "verl $VERSION env up to date: $VENV"
  exit 0
fi

case "$VERSION" in
  0.7.*) EXTRA=("numpy<2" "pyarrow>=19,<26") ;;   # verl 0.7.x pins numpy<2; pyarrow 26 needs numpy 2
  *) EXTRA=("pyarrow>=19,<26") ;;
esac

# shellcheck source=scripts/venv_lib.sh
source "$(dirname "$0")/venv_lib.sh"
fresh_venv
# torch first, pinned to the CPU wheel on disk; every later install keeps it (constraint file).
printf 'torch==2.13.0\n%s\n' "$LOCKED" > "$CONS"
pip_install torch==2.13.0
# tenacity: llmrnn.retry, which llmrnn.reward imports (tests/verl/rehearse_reward.py scores through it here);
# cachetools: verl's agent loop imports it (tests/verl/assemble_batch.py runs AgentLoopWorker._postprocess);
# fastapi, uvicorn: verl 0.9's agent loop and trainer import them (vLLM brings them on a GPU node), and the
# CPU rehearsal of RayPPOTrainer.fit (tests/verl/rehearse_fit.py) imports both releases' trainer modules
uv_install -c "$CONS" "verl==$VERSION" "${EXTRA[@]}" "$LOCKED" tenacity cachetools fastapi uvicorn
"$VENV/bin/python" -c "import verl, hydra, omegaconf, peft; print('verl', verl.__version__, 'peft', peft.__version__)"
echo "$WANT" > "$STAMP"
echo "built $VENV"
