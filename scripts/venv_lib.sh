# Sourced by make_verl_env.sh and make_vllm_env.sh: a fresh venv at $VENV (from $PY), pip_install for the
# torch wheel that lies on disk (pip's find-links; uv does not look there), and uv_install for the rest:
# uv downloads in parallel, which took a verl venv from 16 min to 4.5 min from cold caches on 2 shared
# cores (same 135 distributions, same versions). Both are quiet unless an install fails, then print the
# tail of the log and exit.
fresh_venv() {
  rm -rf "$VENV"
  "$PY" -m venv "$VENV"
  LOG="$(mktemp)"
  CONS="$(mktemp)"
  trap 'rm -f "$CONS" "$LOG"' EXIT
  pip_install uv
}

_quiet() {  # DESCRIPTION CMD...: run CMD with its output in $LOG; on failure print the tail and exit 1
  local what=$1
  shift
  if ! "$@" > "$LOG" 2>&1; then
    grep -v "^WARNING: Location" "$LOG" | tail -40 >&2
    echo "$(basename "$0"): $what failed" >&2
    exit 1
  fi
}

pip_install() {
  _quiet "pip install $*" "$VENV/bin/pip" install -q --disable-pip-version-check "$@"
}

uv_install() {
  _quiet "uv pip install $*" "$VENV/bin/uv" pip install -q --python "$VENV/bin/python" "$@"
}
