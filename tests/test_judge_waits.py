"""Every wait on the judge is bounded by settings the user can see (config section `reward`), and a
process that reports a judge failure exits at once (issue 33 item 4): `llmrnn qa judge` takes the
config's waits, a hung call ends at reward.call_budget_s, one failed call cuts the others in flight, and a
judge that is gone before the start fails after reward.dead_after_s, not health_timeout_s. Real HTTP
servers on 127.0.0.1 that hang or refuse (tests/judge_helpers.py); real `llmrnn` processes."""

from __future__ import annotations

import json
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest

from llmrnn.errors import CheckFailed
from llmrnn.judge.client import Endpoint, JudgeClient, JudgeUnavailable, wait_for_endpoint
from llmrnn.judge.launcher import free_port
from tests.judge_helpers import REPO, ScriptedJudge, write_endpoint, write_rubric
from tests.test_qa_evaluate import _free_text_eval, _qa_rubric

HANG_S = 120.0  # the scripted judge's "hung" answers take this long: far beyond every bound under test


def _qa_judge(tmp_path, endpoint, inputs, reward: dict) -> tuple[subprocess.CompletedProcess, float]:
    outputs = [str(tmp_path / f"out{i}.judged.jsonl") for i in range(len(inputs))]
    cfg = {"eval": {"k": 2, "judge_threshold": 0.5}, "max_fallback_rate": 0.25, "reward": reward}
    t0 = time.monotonic()
    proc = subprocess.run([sys.executable, "-m", "llmrnn.cli", "qa", "judge", "--inputs", *inputs,
                           "--outputs", *outputs, "--endpoint", str(endpoint), "--audit-dir",
                           str(tmp_path / "audit"), "--cfg", json.dumps(cfg)],
                          capture_output=True, text=True, check=False, timeout=90)
    return proc, time.monotonic() - t0


def _error_lines(proc) -> list[str]:
    return [ln for ln in proc.stderr.splitlines() if ln.strip() and " INFO " not in ln and " WARNING " not in ln]


def test_qa_judge_waits_on_a_hung_judge_only_as_long_as_the_config_says(tmp_path):
    """A judge that never answers: `qa judge` stops after the config's reward.timeout_s x tries (bounded by
    reward.call_budget_s), one line naming those settings, and exits (no lingering call)."""
    answers = _free_text_eval(tmp_path, "base", {0})
    with ScriptedJudge(lambda body: "Score: 9", delay_s=HANG_S) as judge:
        endpoint = write_endpoint(tmp_path, judge.port, _qa_rubric(tmp_path))
        proc, took = _qa_judge(tmp_path, endpoint, [answers],
                               {"timeout_s": 1, "retries": 5, "backoff_s": 0.01, "call_budget_s": 2.5,
                                "max_concurrency": 4})
    assert proc.returncode == 4, proc.stderr
    lines = _error_lines(proc)
    assert len(lines) == 1 and "reward.timeout_s" in lines[0] and "reward.call_budget_s" in lines[0], lines
    assert "Traceback" not in proc.stderr
    assert took < 30, took  # the budget (2.5 s) + start-up, not 5 x HANG_S nor 300 s x 5


def test_one_failed_call_ends_the_calls_in_flight_and_the_process_exits(tmp_path):
    """One answer is refused at once (HTTP 400) while the others hang: the process reports it and exits at
    once, instead of waiting one call deadline for the hung calls before it can end."""
    answers = _free_text_eval(tmp_path, "base", {0})

    def respond(body):
        if "case 0" in json.dumps(body):
            return 400, {"error": "bad request"}
        time.sleep(HANG_S)
        return "Score: 9"

    with ScriptedJudge(respond) as judge:
        endpoint = write_endpoint(tmp_path, judge.port, _qa_rubric(tmp_path))
        proc, took = _qa_judge(tmp_path, endpoint, [answers], {"timeout_s": 60, "retries": 0, "max_concurrency": 16})
    assert proc.returncode != 0 and "rejected the request" in proc.stderr, proc.stderr
    assert len(_error_lines(proc)) == 1, proc.stderr
    assert took < 30, took  # not the hung calls' 60 s deadline


def test_a_call_ends_at_its_budget_whatever_timeout_and_retries_allow():
    ep = Endpoint(url="http://127.0.0.1:1/v1", model="judge", api_key_file=None, rubric="r")
    with ScriptedJudge(lambda body: "Score: 5", delay_s=HANG_S, key=None) as judge:
        client = JudgeClient(ep.__class__(**{**ep.__dict__, "url": f"http://127.0.0.1:{judge.port}/v1"}),
                             timeout_s=30, retries=10, backoff_s=0.01, budget_s=1.5)
        t0 = time.monotonic()
        with pytest.raises(JudgeUnavailable, match=r"reward\.call_budget_s"):
            client.post("/chat/completions", {"model": "judge"})
        assert time.monotonic() - t0 < 10


def test_abort_cuts_a_hung_call_at_once():

    with ScriptedJudge(lambda body: "Score: 5", delay_s=HANG_S, key=None) as judge:
        client = JudgeClient(Endpoint(url=f"http://127.0.0.1:{judge.port}/v1", model="judge", api_key_file=None,
                                      rubric="r"), timeout_s=60, retries=3, backoff_s=0.01)
        errors: list[Exception] = []

        def call():
            try:
                client.post("/chat/completions", {"model": "judge"})
            except Exception as exc:  # noqa: BLE001 - the test reads it
                errors.append(exc)

        t = threading.Thread(target=call)
        t.start()
        deadline = time.monotonic() + 10
        while judge.inflight == 0 and time.monotonic() < deadline:
            time.sleep(0.05)
        client.abort()
        t.join(timeout=10)
        assert not t.is_alive() and isinstance(errors[0], JudgeUnavailable) and "abandoned" in str(errors[0])


def _dead_pid() -> int:
    proc = subprocess.Popen([sys.executable, "-c", "pass"])
    proc.wait()
    return proc.pid


RUBRIC = REPO / "config/rubrics/outcome_v2_smollm2.yaml"


def test_a_judge_dead_before_the_start_fails_after_dead_after_s_not_the_health_timeout(tmp_path):
    """The endpoint names a server pid that is not running: the wait fails after dead_after_s (seconds)
    with one line naming the pid, not after the whole health timeout."""
    ep = write_endpoint(tmp_path, free_port(), RUBRIC, pid=_dead_pid())
    t0 = time.monotonic()
    with pytest.raises(CheckFailed, match=r"judge is gone: .*pid \d+ .*not running .*reward\.dead_after_s"):
        wait_for_endpoint(ep, timeout_s=120, poll_s=0.1, dead_after_s=1.0)
    assert time.monotonic() - t0 < 15


def test_a_ready_judge_whose_port_refuses_fails_fast_and_a_rewritten_file_is_waited_for(tmp_path):
    """A ready endpoint on a port nobody listens on (the server died, pid on another host) fails after
    dead_after_s; a stale file that a starting launcher rewrites meanwhile is waited past as before."""
    ep = write_endpoint(tmp_path, free_port(), RUBRIC)
    data = json.loads(ep.read_text())
    ep.write_text(json.dumps({**data, "host": "another-node", "pid": 12345}))
    with pytest.raises(CheckFailed, match="refuses connections"):
        wait_for_endpoint(ep, timeout_s=120, poll_s=0.1, dead_after_s=1.0)

    stale = write_endpoint(tmp_path, free_port(), RUBRIC, pid=_dead_pid())
    with ScriptedJudge(lambda body: "Score: 5") as judge:

        def relaunch():  # the new launcher rewrites the file while the consumer waits
            time.sleep(0.5)
            write_endpoint(tmp_path, judge.port, RUBRIC)

        threading.Thread(target=relaunch).start()
        assert wait_for_endpoint(stale, timeout_s=30, poll_s=0.1, dead_after_s=2.0).url.endswith(f"{judge.port}/v1")


def test_the_scorer_takes_its_dead_judge_wait_from_the_reward_config(tmp_path):
    """The memory head's reward (and preflight, through the same scorer) waits reward.dead_after_s."""
    from llmrnn.reward import get_scorer

    ep = write_endpoint(tmp_path, free_port(), RUBRIC, pid=_dead_pid())
    t0 = time.monotonic()
    with pytest.raises(CheckFailed, match="reward.dead_after_s"):
        get_scorer(str(ep), None, str(tmp_path / "audit"), {"dead_after_s": 1, "health_timeout_s": 120})
    assert time.monotonic() - t0 < 15


def _stalls_after(n: int):
    """A judge that answers its first `n` calls, then accepts every later one and never answers it."""

    lock, answered = threading.Lock(), [0]

    def respond(body):
        with lock:
            answered[0] += 1
            stall = answered[0] > n
        if stall:
            time.sleep(HANG_S)
        return "Score: 9"
    return respond


def test_a_judge_that_stalls_midway_fails_qa_judge_after_stall_s_not_the_call_budget(tmp_path):
    """The judge answers its first calls, then stops answering (connections accepted, no answer): `qa judge`
    fails after reward.stall_s with one line saying the judge stalled, not after reward.timeout_s x tries
    nor reward.call_budget_s (both far longer here, as their defaults are)."""
    answers = [_free_text_eval(tmp_path, "base", {0}), _free_text_eval(tmp_path, "grpo", {0, 1, 2, 3})]
    with ScriptedJudge(_stalls_after(2)) as judge:
        endpoint = write_endpoint(tmp_path, judge.port, _qa_rubric(tmp_path))
        proc, took = _qa_judge(tmp_path, endpoint, answers,
                               {"timeout_s": 300, "retries": 4, "call_budget_s": 900, "stall_s": 1.5,
                                "max_concurrency": 2})
        hits = judge.hits
    assert proc.returncode == 4, proc.stderr
    lines = _error_lines(proc)
    assert len(lines) == 1 and "has stalled" in lines[0] and "reward.stall_s 1.5" in lines[0], lines
    assert "after 2 answer(s)" in lines[0], lines
    assert "Traceback" not in proc.stderr and hits > 2
    assert not any(Path(p).exists() for p in (tmp_path / "out0.judged.jsonl", tmp_path / "out1.judged.jsonl"))
    assert took < 60, took  # stall_s + start-up, not 300 s x 5 tries nor 900 s


def test_a_slow_judge_that_keeps_answering_is_not_stalled():
    """One answer at a time, each slower than none of the watchdog's window but all of them together far
    longer than stall_s: every call succeeds (progress resets the watchdog)."""

    from llmrnn.judge.client import Endpoint as Ep

    one_at_a_time = threading.Lock()

    def respond(body):
        with one_at_a_time:
            time.sleep(0.25)
        return "Score: 5"

    with ScriptedJudge(respond, key=None) as judge:
        client = JudgeClient(Ep(url=f"http://127.0.0.1:{judge.port}/v1", model="judge", api_key_file=None,
                                rubric="r"), timeout_s=60, retries=0, budget_s=120, stall_s=1.0)
        results: list = []

        def call():
            results.append(client.post("/chat/completions", {"model": "judge"})[0])

        threads = [threading.Thread(target=call) for _ in range(12)]  # 12 x 0.25 s queued: 3 s > stall_s
        for t in threads:
            t.start()
        for t in threads:
            t.join(timeout=60)
        client.close()
    assert len(results) == 12 and client._live.reason is None


def test_the_scorer_every_judge_consumer_uses_takes_stall_s_from_the_reward_config(tmp_path):
    """Training's reward and preflight (get_scorer) and `qa judge` share the scorer: a judge that stalls after
    answering fails its calls after reward.stall_s with the stall line."""
    from llmrnn.reward import JudgeUnavailable as Unavailable
    from llmrnn.reward import get_scorer
    from tests.judge_helpers import make_step, memory

    stalled = threading.Event()

    def respond(body):
        if stalled.is_set():
            time.sleep(HANG_S)
        return "Score: 9"

    with ScriptedJudge(respond) as judge:
        ep = write_endpoint(tmp_path, judge.port, write_rubric(tmp_path, score_method="text"))
        scorer = get_scorer(str(ep), None, str(tmp_path / "audit"),
                            {"stall_s": 1, "timeout_s": 300, "call_budget_s": 900, "max_concurrency": 4})
        sample = {"data_source": "llm_as_rnn_memory_update", "solution_str": memory("CKD stage 3."),
                  "ground_truth": json.dumps(make_step(0)), "extra_info": {}}
        assert scorer.score_samples([sample])[0]["judge_score"] is not None  # answered
        stalled.set()
        samples = [{**sample, "solution_str": memory(f"CKD stage {i}.")} for i in range(4)]
        with pytest.raises(Unavailable, match=r"has stalled: .*after \d+ answer\(s\).*reward\.stall_s 1\b"):
            scorer.score_samples(samples)
        assert "has stalled" in (tmp_path / "audit" / "stop_reason.txt").read_text()
