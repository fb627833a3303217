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
from tests.conftest import llmrnn_in_process

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
    proc = llmrnn_in_process("chat", "--model", str(tmp_path), stdin=b"")
    assert proc.returncode == 2
    want = f"llmrnn chat: error: {tmp_path}: not an HF model folder (no config.json)"
    assert proc.stderr.strip().splitlines() == [want]


# --------------------------------------------------------------------------- hostile input
def _chat(*args: str, stdin: bytes = b"") -> subprocess.CompletedProcess:
    """`llmrnn chat ARGS` reading stdin, through the CLI's main in this process (each process start loaded
    torch and the model again); stdout and stderr as bytes, as a process gives them."""
    proc = llmrnn_in_process("chat", *args, stdin=stdin)
    return subprocess.CompletedProcess(proc.args, proc.returncode, proc.stdout.encode(), proc.stderr.encode())


@pytest.mark.parametrize(("args", "message"), [
    (["--max-new-tokens", "0"], "--max-new-tokens: 0 is out of range (must be >= 1)"),
    (["--max-new-tokens", "-5"], "--max-new-tokens: -5 is out of range (must be >= 1)"),
    (["--max-new-tokens", "many"], "--max-new-tokens: 'many' is not an integer"),
    (["--temperature", "-1"], "--temperature: -1 is out of range (must be >= 0)"),
    (["--temperature", "nan"], "--temperature: nan is out of range (must be >= 0)"),
    (["--temperature", "inf"], "--temperature: inf is out of range (must be >= 0)"),
    (["--top-p", "0"], "--top-p: 0 is out of range (must be > 0 and <= 1)"),
    (["--top-p", "1.5"], "--top-p: 1.5 is out of range (must be > 0 and <= 1)"),
    (["--threads", "0"], "--threads: 0 is out of range (must be >= 1)"),
])
def test_bad_arguments_are_one_line(tmp_path, args, message):
    proc = _chat("--model", str(tmp_path), *args)
    assert proc.returncode == 2
    assert proc.stderr.decode().strip().splitlines() == [f"llmrnn chat: error: {message}"]


def test_a_line_not_utf8_or_longer_than_the_context_is_refused_and_the_chat_goes_on(tiny_model_dir):
    long_line = ("word " * 50_000).encode()  # ~250 KB, far beyond the tiny model's 2048 positions
    proc = _chat("--model", str(tiny_model_dir), "--max-new-tokens", "2",
                 stdin=b"caf\xe9 au lait?\n" + long_line + b"\nhello\n/quit\n")
    err = proc.stderr.decode().strip().splitlines()
    assert len(err) == 2, err
    assert err[0] == "llmrnn chat: input line 1: byte 3: not UTF-8 text (invalid continuation byte); not sent"
    assert err[1].startswith("llmrnn chat: ") and err[1].endswith(
        "exceed the model's context of 2048; not sent (shorten the line)"), err
    out = proc.stdout.decode()
    assert proc.returncode == 2 and "bye" in out and out.count("you> ") == 4  # hello was answered


def test_max_new_tokens_must_leave_room_in_the_context(tiny_model_dir):
    proc = _chat("--model", str(tiny_model_dir), "--max-new-tokens", "2048", stdin=b"hi\n")
    assert proc.returncode == 2 and proc.stderr.decode().strip().splitlines() == [
        ("llmrnn chat: error: --max-new-tokens: 2048 leaves no room for a prompt in the model's context of "
         "2048 tokens")]


def test_compare_base_refuses_a_model_that_would_be_compared_with_itself(tmp_path, tiny_model_dir):
    proc = _chat("--model", str(tiny_model_dir), "--compare", "base", stdin=b"hi\n")
    err = proc.stderr.decode().strip().splitlines()
    assert proc.returncode == 2 and len(err) == 1 and "was never merged" in err[0], err
    copy = chain(tmp_path, tiny_model_dir, tiny_model_dir)  # "merged" = a copy of the base: nothing merged
    proc = _chat("--model", str(copy), "--compare", "base", stdin=b"hi\n")
    err = proc.stderr.decode().strip().splitlines()
    assert proc.returncode == 2 and len(err) == 1 and "has the same weights as its base" in err[0], err


def test_compare_with_the_same_folder_and_a_non_utf8_system_prompt_are_refused(tmp_path, tiny_model_dir):
    proc = _chat("--model", str(tiny_model_dir), "--compare", str(tiny_model_dir), stdin=b"hi\n")
    assert proc.returncode == 2 and proc.stderr.decode().strip().splitlines() == [
        f"llmrnn chat: error: --compare: {tiny_model_dir} is the model itself"]
    proc = subprocess.run([os.fsencode(LLMRNN), b"chat", b"--model", os.fsencode(tmp_path), b"--system", b"caf\xe9"],
                          input=b"", capture_output=True, check=False)
    assert proc.returncode == 2 and proc.stderr.decode().strip().splitlines() == [
        "llmrnn chat: error: --system: character 3: not UTF-8 text"]


def test_a_huge_line_is_refused_before_tokenising_and_the_chat_goes_on(tiny_model_dir):
    """A 13 MB line (main: 2.6 GB and 24 s in the tokenizer; 66 MB aborted it): refused by its bytes against
    a bound from the model's context, read in bounded chunks, then the next line is answered."""
    wrapper = ("import resource, subprocess, sys; p = subprocess.run(sys.argv[1:], stdin=sys.stdin); "
               "print(resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss, p.returncode, file=sys.stderr)")
    huge = b"word " * 2_600_000  # 13 MB, no newline until its end
    proc = subprocess.run([sys.executable, "-c", wrapper, LLMRNN, "chat", "--model", str(tiny_model_dir),
                           "--max-new-tokens", "2"], input=huge + b"\nhello\n/quit\n", capture_output=True,
                          check=False, timeout=120)
    err = proc.stderr.decode().strip().splitlines()
    assert len(err) == 2, err
    assert err[0].startswith("llmrnn chat: input line 1: 13000000 bytes, not tokenised: a line over ") and err[0].endswith(
        "exceed the model's context of 2048; not sent (shorten the line)"), err
    maxrss_kb, rc = map(int, err[1].split())
    assert rc == 2 and maxrss_kb < 1_500_000, err  # the line was never held whole nor tokenised
    out = proc.stdout.decode()
    assert "bye" in out and out.count("you> ") == 3  # hello was answered: the conversation went on


def test_a_system_prompt_longer_than_the_context_is_blamed_on_the_system_prompt(tiny_model_dir):
    proc = _chat("--model", str(tiny_model_dir), "--max-new-tokens", "2", "--system", "word " * 3000,
                 stdin=b"hello\n/quit\n")
    err = proc.stderr.decode().strip().splitlines()
    assert proc.returncode == 2 and len(err) == 1, err
    assert err[0].startswith("llmrnn chat: error: --system: the system prompt takes ") and "shorten the system prompt" in err[0]
    assert "line" not in err[0].split("leaves no room")[0]  # the user's line is not blamed
