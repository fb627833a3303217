# Sourced by make_verl_env.sh and make_vllm_env.sh: a fresh venv at $VENV (from $PY) and a quiet
# pip_install that prints the tail of pip's log and exits when an install fails.
fresh_venv() {
  rm -rf "$VENV"
  "$PY" -m venv "$VENV"
  LOG="$(mktemp)"
  CONS="$(mktemp)"
  trap 'rm -f "$CONS" "$LOG"' EXIT
}

pip_install() {  # quiet unless it fails
  if ! "$VENV/bin/pip" install -q --disable-pip-version-check "$@" > "$LOG" 2>&1; then
    grep -v "^WARNING: Location" "$LOG" | tail -40 >&2
    echo "$(basename "$0"): pip install $* failed" >&2
    exit 1
  fi
}
