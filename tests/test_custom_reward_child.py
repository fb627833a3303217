"""Your own reward's child is bounded: what it starts or forks ends with it, it may not run too many processes
or hold too much memory, its output is capped in the log, its protocol survives a reward that patches the
serialiser and is named in one line when the reward closes or replaces the protocol's descriptors, hostile
rows are one line naming the row and field, and a raising reward shows where it raised (its traceback under
-v)."""

from __future__ import annotations

import json
import logging
import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest

from llmrnn.errors import InputError
from llmrnn.reward import custom
from tests.test_custom_reward_contract import ROW, _reward


def _alive(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat", "rb") as fh:
            return fh.read().rsplit(b")", 1)[1].split()[0] != b"Z"
    except OSError:
        return False


def test_what_the_reward_starts_or_forks_ends_with_its_process(tmp_path):
    """40 subprocesses and 20 forks, left running by the reward: all gone once its process is closed."""
    pids = tmp_path / "pids.txt"
    head = f"import os, subprocess, time\nPIDS = {str(pids)!r}\n"
    body = ("if not os.path.exists(PIDS):\n"
            "    kids = [subprocess.Popen(['sleep', '3600']).pid for _ in range(40)]\n"
            "    for _ in range(20):\n"
            "        pid = os.fork()\n"
            "        if pid == 0:\n"
            "            time.sleep(3600)\n"
            "            os._exit(0)\n"
            "        kids.append(pid)\n"
            "    open(PIDS, 'w').write(' '.join(map(str, kids)))\n"
            "return 0.5")
    proc = custom.load(str(_reward(tmp_path, body, head)))
    try:
        assert proc("row 7", **ROW) == 0.5
        kids = [int(p) for p in pids.read_text().split()]
        assert len(kids) == 60 and all(_alive(p) for p in kids)
    finally:
        proc.close()
    assert [p for p in kids if _alive(p)] == []


def test_a_reward_that_runs_too_many_processes_is_stopped_in_one_line(tmp_path):
    body = ("import subprocess\n"
            "kids = [subprocess.Popen(['sleep', '3600']) for _ in range(12)]\n"
            "return 0.5")
    proc = custom.RewardProcess(str(_reward(tmp_path, body)), max_processes=8)
    try:
        pid = proc.proc.pid
        with pytest.raises(InputError) as err:
            proc("row 7", **ROW)
    finally:
        proc.close()
    line = str(err.value)
    assert "on row 7 started 12 processes, more than the reward process's limit of 8 alive at once" in line, line
    assert not _alive(pid) and "\n" not in line


def test_a_reward_that_keeps_memory_is_stopped_at_its_limit(tmp_path):
    """60 MB more per call against a 150 MB limit: refused with its row and the limit, then a fresh process."""
    head = "KEPT = []\n"
    body = "KEPT.append(bytearray(60 * 2**20))\nreturn 0.5"
    proc = custom.RewardProcess(str(_reward(tmp_path, body, head)), max_memory_mb=150)
    try:
        lines = []
        for i in range(6):
            try:
                proc(f"row {i}", **ROW)
            except InputError as exc:
                lines.append(str(exc))
                break
        assert lines and "more than the reward process's limit of 150 MB; the reward process was stopped" in lines[0]
        assert lines[0].startswith(f"reward.custom: {proc.where} on row ")
        assert proc("row 9", **ROW) == 0.5  # a fresh process for the next call
    finally:
        proc.close()


def _score_row_7_in_a_process(opener: str) -> subprocess.CompletedProcess:
    """One row scored by the reward `opener` (a Python expression over llmrnn.reward.custom) opens, in a process
    of its own: its stderr is the log the reward's output lands in."""
    script = ("from llmrnn.reward import custom\n"
              f"p = {opener}\n"
              "print(p('row 7', data_source='d', solution_str='s', ground_truth='g', extra_info={}))\n"
              "p.close()\n")
    return subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=300, check=False)


def test_the_reward_output_is_capped_in_the_log(tmp_path):
    """8 MB printed to stdout and stderr each: the log (this process's stderr) gets the first output_cap bytes
    and one line saying the rest was dropped."""
    path = _reward(tmp_path, "import os, sys\nprint('x' * 8_000_000)\nos.write(2, b'y' * 8_000_000)\nreturn 0.5")
    done = _score_row_7_in_a_process(f"custom.load({str(path)!r})")
    assert done.returncode == 0 and done.stdout.strip() == "0.5", done.stderr[-2000:]
    assert custom.OUTPUT_CAP <= len(done.stderr) < custom.OUTPUT_CAP + 4096
    assert f"printed more than {custom.OUTPUT_CAP} bytes; the rest of its output is dropped" in done.stderr


def test_the_childs_bounds_are_settings_of_reward_custom_defaulting_to_the_old_constants():
    """reward.custom.max_processes, max_memory_mb and max_output_bytes: 64, 4096 MB and 1 MiB by default (what
    the constants were), bounded, and strict (a bool or a string is refused, not coerced)."""
    from pydantic import ValidationError

    from llmrnn.settings.evaluation import RewardCustom

    defaults = RewardCustom()
    assert (defaults.max_processes, defaults.max_memory_mb, defaults.max_output_bytes) == (64, 4096, 1 << 20)
    assert (custom.MAX_PROCESSES, custom.MAX_MEMORY_MB, custom.OUTPUT_CAP) == (64, 4096, 1 << 20)
    for bad in ({"max_processes": -1}, {"max_processes": 5000}, {"max_memory_mb": 10},
                {"max_memory_mb": 2_000_000}, {"max_output_bytes": -1}, {"max_output_bytes": 1 << 31},
                {"max_processes": True}, {"max_memory_mb": "4096"}):
        with pytest.raises(ValidationError):
            RewardCustom(path="r.py", **bad)


def test_reward_custom_settings_bound_the_child_processes_and_memory(tmp_path):
    """The limits come from the settings wherever the reward runs (custom_of -> open_custom: check, preflight,
    `reward try`, both trainers): 3 processes against max_processes 2, then 80 MB kept against max_memory_mb 64."""
    body = ("import subprocess\n"
            "kids = [subprocess.Popen(['sleep', '3600']) for _ in range(3)]\n"
            "return 0.5")
    spec = custom.custom_of({"custom": {"path": str(_reward(tmp_path, body)), "max_processes": 2}})
    assert spec["max_processes"] == 2 and spec["max_memory_mb"] == custom.MAX_MEMORY_MB
    proc = custom.open_custom(spec)
    try:
        with pytest.raises(InputError, match="started 3 processes, more than the reward process's limit of 2 alive"):
            proc("row 7", **ROW)
    finally:
        proc.close()
    (tmp_path / "mem").mkdir()
    path = _reward(tmp_path / "mem", "KEPT.append(bytearray(80 * 2**20))\nreturn 0.5", "KEPT = []\n")
    proc = custom.open_custom(custom.custom_of({"custom": {"path": str(path), "max_memory_mb": 64}}))
    try:
        with pytest.raises(InputError, match="more than the reward process's limit of 64 MB"):
            proc("row 3", **ROW)
    finally:
        proc.close()


def test_reward_custom_max_output_bytes_caps_the_log(tmp_path):
    path = _reward(tmp_path, "import os\nos.write(2, b'y' * 50_000)\nreturn 0.5")
    done = _score_row_7_in_a_process(
        f"custom.open_custom(custom.custom_of({{'custom': {{'path': {str(path)!r}, 'max_output_bytes': 1000}}}}))")
    assert done.returncode == 0 and done.stdout.strip() == "0.5", done.stderr[-2000:]
    assert "y" * 1000 + "\n" in done.stderr and "y" * 1001 not in done.stderr
    assert "printed more than 1000 bytes; the rest of its output is dropped" in done.stderr


@pytest.mark.parametrize("body", [
    ("import pickle, json, struct, zlib, os\n"
    "pickle.dumps = pickle.loads = lambda *a, **k: b'garbage'\n"
    "json.dumps = json.loads = struct.pack = struct.unpack = zlib.crc32 = lambda *a, **k: 0\n"
    "os.write = os.read = lambda *a, **k: 0\n"
    "return 0.25"),
])
def test_a_reward_that_patches_the_serialiser_changes_nothing(tmp_path, body):
    proc = custom.load(str(_reward(tmp_path, body)))
    try:
        assert [proc(f"row {i}", **ROW) for i in range(3)] == [0.25, 0.25, 0.25]
    finally:
        proc.close()


@pytest.mark.parametrize("body", [
    "import os\nos.closerange(0, 4096)\nreturn 0.25",
    ("import os\nnull = os.open(os.devnull, os.O_RDWR)\nfor fd in range(3, 1024):\n"
    "    if fd != null:\n        try:\n            os.dup2(null, fd)\n        except OSError:\n            pass\nreturn 0.25"),
])
def test_a_reward_that_closes_or_replaces_the_protocols_descriptors_is_named(tmp_path, body):
    proc = custom.load(str(_reward(tmp_path, "if solution_str == 'x':\n" + "".join(
        f"    {line}\n" for line in body.splitlines()) + "return 0.5")))
    try:
        with pytest.raises(InputError) as err:
            proc("row 7", **{**ROW, "solution_str": "x"})
        assert proc("row 8", **ROW) == 0.5  # the next call gets a fresh process
    finally:
        proc.close()
    line = str(err.value)
    assert line.startswith(f"reward.custom: {proc.where} on row 7 closed or replaced the reward protocol's file "
                           "descriptors"), line


def _deep(n: int):
    value: list = []
    for _ in range(n):
        value = [value]
    return value


@pytest.mark.parametrize(("field", "value", "expected"), [
    ("extra_info", {"index": 7, "deep": _deep(20_000)}, "extra_info is nested more than 200 levels deep"),
    ("ground_truth", _deep(20_000), "ground_truth is nested more than 200 levels deep"),
    ("extra_info", {"index": 7, "fn": lambda: 0}, "extra_info cannot be handed to the reward process"),
])
def test_a_hostile_row_is_one_line_naming_the_row_and_field(tmp_path, field, value, expected):
    proc = custom.load(str(_reward(tmp_path, "return 0.5")))
    try:
        with pytest.raises(InputError) as err:
            proc("row 7", **{**ROW, field: value})
        assert proc("row 8", **ROW) == 0.5
    finally:
        proc.close()
    assert str(err.value) == f"reward.custom: {proc.where} on row 7: {expected}" or expected in str(err.value)


def test_verls_entry_takes_a_null_extra_info_and_names_one_that_is_no_mapping(tmp_path):
    import llmrnn.reward

    cfg = json.dumps({"mode": "outcome", "custom": {"path": str(_reward(tmp_path, "return len(extra_info)"))}})
    assert llmrnn.reward.custom_compute_score("d", "s", "g", None, reward_cfg=cfg) == 0.0
    with pytest.raises(InputError, match=r"^reward.custom: row \?: extra_info is a str, not a mapping$"):
        llmrnn.reward.custom_compute_score("d", "s", "g", "index", reward_cfg=cfg)


@pytest.mark.parametrize(("result", "expected"), [
    ("{'value': 1.0}", "returned {'value': 1.0}, a dict without a 'score' key"),
    ("{'score': None}", "returned {'score': None} (its 'score' is None); expected a finite number"),
    ("None", "returned None; expected a finite number"),
])
def test_a_wrong_result_is_named_as_what_was_returned(tmp_path, result, expected):
    proc = custom.load(str(_reward(tmp_path, f"return {result}")))
    try:
        with pytest.raises(InputError) as err:
            proc("row 7", **ROW)
    finally:
        proc.close()
    assert f"on row 7 {expected}" in str(err.value), str(err.value)


def test_a_raising_reward_names_its_file_and_line_and_logs_the_traceback(tmp_path, caplog):
    path = _reward(tmp_path, "def helper():\n    raise ValueError('no visit')\nreturn helper()")
    proc = custom.load(str(path))
    try:
        with caplog.at_level(logging.DEBUG, logger="llmrnn.reward.custom"), pytest.raises(InputError) as err:
            proc("row 7", **ROW)
    finally:
        proc.close()
    assert str(err.value).endswith(f"on row 7 raised ValueError: no visit ({path}:3)"), str(err.value)
    trace = "\n".join(r.getMessage() for r in caplog.records)
    assert "Traceback (most recent call last)" in trace and f'File "{path}", line 4' in trace
    assert "custom_reward_child" not in trace  # the user's frames only


def test_the_child_leads_its_own_session_and_shields_itself_from_sigterm(tmp_path):
    """A signal to the trainer's process group (SLURM's SIGTERM) does not reach the reward's process, and one
    sent to it alone does not end it: the trainer can finish its step and save."""
    proc = custom.load(str(_reward(tmp_path, "return 0.5")))
    try:
        child = proc.proc.pid
        assert os.getsid(child) == child and os.getpgid(child) != os.getpgrp()
        os.kill(child, signal.SIGTERM)
        assert proc("row 7", **ROW) == 0.5 and proc.proc.pid == child
    finally:
        proc.close()


def test_the_childs_group_ends_when_its_parent_is_killed(tmp_path):
    """The trainer killed outright (SIGKILL, no atexit): the child's watchdog ends its whole group."""
    pids = tmp_path / "pids.txt"
    path = _reward(tmp_path, f"import os, subprocess\nkid = subprocess.Popen(['sleep', '3600']).pid\n"
                             f"open({str(pids)!r}, 'w').write(f'{{os.getpid()}} {{kid}}')\nreturn 0.5")
    script = ("import os, signal\nfrom llmrnn.reward import custom\n"
              f"p = custom.load({str(path)!r})\n"
              "p('row 7', data_source='d', solution_str='s', ground_truth='g', extra_info={})\n"
              "os.kill(os.getpid(), signal.SIGKILL)\n")
    subprocess.run([sys.executable, "-c", script], capture_output=True, timeout=300, check=False)
    child, kid = map(int, pids.read_text().split())
    import time

    deadline = time.monotonic() + 30
    while (_alive(child) or _alive(kid)) and time.monotonic() < deadline:
        time.sleep(0.1)
    assert not _alive(child) and not _alive(kid)


# SLURM's preemption, from inside a reward call: the whole process group of the job gets SIGTERM at once
PREEMPTING = '''import os, signal

CALLS = os.path.join(os.path.dirname(__file__), "calls.txt")


def compute_score(data_source, solution_str, ground_truth, extra_info, **kwargs):
    with open(CALLS, "a") as fh:
        fh.write("x")
    if os.path.getsize(CALLS) == 12:  # in step 2 (8 completions a step)
        os.killpg(os.getpgid(os.getppid()), signal.SIGTERM)
    return len(solution_str) % 7 / 7
'''


@pytest.mark.slow
@pytest.mark.e2e  # one tiny TRL run
def test_a_sigterm_to_the_jobs_process_group_lets_the_trainer_save_and_exit_75(tmp_path, tiny_model_dir):
    """A real `llmrnn train run` (TRL, tiny model, CPU) with reward.custom, in a process group of its own as a
    SLURM job step is; SIGTERM reaches the whole group in the middle of a reward call. The reward's process,
    in a session of its own, finishes the call and the step's others; the trainer saves at the step boundary and
    exits 75 ("saved, retry me"), not 2 (a reward process killed with the trainer's group)."""
    from llmrnn.errors import Interrupted
    from tests.test_train_trl import LLMRNN, tiny_cfg
    from tests.verl.rows import make_rows, write_parquet

    (tmp_path / "my_reward.py").write_text(PREEMPTING)
    train = write_parquet(tmp_path / "t.parquet", make_rows(8))
    val = write_parquet(tmp_path / "v.parquet", make_rows(2, split="val", seed=1))
    out = tmp_path / "train"
    cfg = {"train": tiny_cfg(test_freq=0, save_freq=4, keep_last=None),
           "reward": {"mode": "outcome", "custom": {"path": "my_reward.py"}}}
    env = {k: v for k, v in os.environ.items() if not k.startswith("LLMRNN_")} | {"OMP_NUM_THREADS": "1"}
    cmd = [LLMRNN, "train", "run", "--cfg", json.dumps(cfg), "--train", train, "--val", val, "--model",
           str(tiny_model_dir), "--work-dir", str(out), "--adapter", str(out / "adapter"), "--metrics",
           str(out / "metrics.jsonl"), "--summary", str(out / "summary.json")]
    proc = subprocess.Popen(cmd, env=env, cwd=tmp_path, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                            start_new_session=True)
    try:
        log, _ = proc.communicate(timeout=900)
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
    assert proc.returncode == Interrupted.exit_code == 75, log[-3000:]
    assert "on signal SIGTERM" in log and "Traceback" not in log, log[-3000:]
    assert list((out / "checkpoints").glob("checkpoint-*")), "no checkpoint saved"


def test_check_gives_a_hanging_import_its_own_limit_and_ends_what_it_started(tmp_path, monkeypatch):
    """`llmrnn check` waits CHECK_IMPORT_S for the import (not reward.custom.timeout_s, 60 s by default), then one
    line; a process the import started, holding check's output open, ends with the reward's process (a caller
    reading check's output would otherwise wait on it)."""
    from llmrnn.check import reward as check_reward

    pids = tmp_path / "pids.txt"
    path = _reward(tmp_path, "return 0.5", f"import subprocess, time\n"
                                           f"open({str(pids)!r}, 'w').write(str(subprocess.Popen(['sleep', '3600']).pid))\n"
                                           "time.sleep(3600)\n")
    monkeypatch.setattr(check_reward, "CHECK_IMPORT_S", 2.0)
    lines = check_reward.check_custom_reward({"reward": {"custom": {"path": str(path)}}})
    assert lines == [(f"reward.custom.path: {path}: importing it gave no answer within 2 s (llmrnn check's limit on "
                     "the import; training waits reward.custom.timeout_s); the reward process was stopped")]
    assert not _alive(int(pids.read_text()))


def test_the_docs_quote_the_childs_bounds():
    """docs/rewards.md's numbers for the child are the code's."""
    from llmrnn.check.reward import CHECK_IMPORT_S
    from llmrnn.custom_reward_child import AS_FACTOR

    docs = (Path(__file__).resolve().parents[1] / "docs" / "rewards.md").read_text()
    section = docs.split("### What the reward process may do", 1)[1].split("\n## ", 1)[0]
    for quoted in (f"More than {custom.MAX_PROCESSES} processes", f"more than {custom.MAX_MEMORY_MB} MB resident",
                   f"capped at {AS_FACTOR} times", f"first {custom.OUTPUT_CAP >> 20} MiB",
                   f"more than {custom.MAX_DEPTH} levels deep", f"over {custom.MAX_REQUEST_MB} MB"):
        assert quoted in " ".join(section.split()), quoted
    assert f"waits at most {CHECK_IMPORT_S:g} s for the import" in " ".join(docs.split())
