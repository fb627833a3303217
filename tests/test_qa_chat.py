"""`llmrnn chat` driven like a user would: in a real terminal (tmux), typing lines and reading the pane.
The merge chain that `--compare base` follows is resolved from merge_check.json files."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import time
from pathlib import Path

import pytest

from llmrnn.chat import resolve_base

LLMRNN = str(Path(sys.executable).parent / "llmrnn")


def chain(tmp_path, base: Path, merged_from: Path) -> Path:
    """RUN/merged + RUN/merge_check.json naming the base it was merged into (what merge_model writes)."""
    run = tmp_path / "results" / "r"
    shutil.copytree(merged_from, run / "merged")
    (run / "merge_check.json").write_text(json.dumps({"ok": True, "base": str(base)}))
    return run / "merged"


def test_resolve_base_follows_the_merge_chain(tmp_path, tiny_model_dir):
    sft = tmp_path / "results/r/qa/sft"
    (sft / "merged").mkdir(parents=True)
    (sft / "merge_check.json").write_text(json.dumps({"base": f"{tiny_model_dir}/.ready"}))
    run = tmp_path / "results/r"
    (run / "merged").mkdir()
    (run / "merge_check.json").write_text(json.dumps({"base": str(sft / "merged")}))
    assert resolve_base(run / "merged") == tiny_model_dir  # GRPO <- SFT <- base (a .ready marker)
    assert resolve_base(tiny_model_dir) == tiny_model_dir


def _pane(session: str) -> str:
    return subprocess.run(["tmux", "capture-pane", "-p", "-S", "-200", "-t", session], capture_output=True,
                          text=True, check=True).stdout


def _wait_for(session: str, predicate, limit_s: float = 240.0) -> str:
    """Poll the pane until predicate(text) holds (a bound on waiting, not a timing assertion)."""
    deadline = time.monotonic() + limit_s
    text = _pane(session)
    while not predicate(text) and time.monotonic() < deadline:
        time.sleep(0.5)
        text = _pane(session)
    return text


@pytest.mark.slow
@pytest.mark.skipif(shutil.which("tmux") is None, reason="tmux not installed")
def test_chat_in_tmux_side_by_side_with_base(tmp_path, tiny_model_dir):
    from tests.tiny_model import build_tiny_model

    merged = chain(tmp_path, tiny_model_dir, build_tiny_model(tmp_path / "other", seed=1))
    session = f"llmrnn-chat-{os.getpid()}-{tmp_path.name}"  # pytest runs side by side share tmux
    cmd = (f"{LLMRNN} chat --model {merged} --compare base --max-new-tokens 8 --temperature 1.0 2> {tmp_path}/chat.err; "
           f"echo CHAT-EXIT=$?; sleep 600")
    subprocess.run(["tmux", "new-session", "-d", "-s", session, "-x", "200", "-y", "50", cmd], check=True)
    try:
        # capture-pane drops trailing blanks: an empty prompt line reads "you>"
        text = _wait_for(session, lambda t: "you>" in t)
        assert f"model={merged}" in text and f"base={tiny_model_dir}" in text, text
        subprocess.run(["tmux", "send-keys", "-t", session, "which condition fits?", "Enter"], check=True)
        text = _wait_for(session, lambda t: t.count("you>") >= 2)
        after = text.split("which condition fits?", 1)[1]
        assert "[model] " in after and "[base] " in after, text
        model_line = next(ln for ln in after.splitlines() if ln.startswith("[model] "))
        base_line = next(ln for ln in after.splitlines() if ln.startswith("[base] "))
        assert after.index("[model] ") < after.index("[base] ")
        assert model_line[8:] != base_line[7:]  # two different weights answered
        subprocess.run(["tmux", "send-keys", "-t", session, "/reset", "Enter"], check=True)
        assert "(conversation cleared)" in _wait_for(session, lambda t: "(conversation cleared)" in t)
        subprocess.run(["tmux", "send-keys", "-t", session, "/quit", "Enter"], check=True)
        text = _wait_for(session, lambda t: "CHAT-EXIT=" in t)
        assert "bye" in text and "CHAT-EXIT=0" in text, text
    finally:
        subprocess.run(["tmux", "kill-session", "-t", session], check=False)


def test_chat_refuses_a_folder_that_is_no_model(tmp_path):
    proc = subprocess.run([LLMRNN, "chat", "--model", str(tmp_path)], input="", capture_output=True, text=True,
                          check=False)
    assert proc.returncode == 2
    want = f"llmrnn chat: error: {tmp_path}: not an HF model folder (no config.json)"
    assert proc.stderr.strip().splitlines() == [want]
