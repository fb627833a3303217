"""The reward against real local HTTP servers with scripted judge answers: every edge-table row end to
end, outcome term, dedup, concurrency, retries-then-raise, pairwise (per sample and within a group)."""

from __future__ import annotations

import json
import math
import re
import stat

import pytest

from llmrnn.errors import InputError
from llmrnn.judge import JudgeUnavailable
from llmrnn.reward import (
    STOP_REASON_FILE,
    JudgeDegraded,
    Scorer,
    compute_score,
    compute_score_batch,
    fallback_rate,
    guard_spec,
    outcome_share,
    reward_kwargs,
    trl_reward_func,
)
from llmrnn.settings import Reward
from tests.judge_helpers import ScriptedJudge, chat_payload, make_step, memory, write_endpoint, write_rubric

DS = "llm_as_rnn_memory_update"
STEP = json.dumps(make_step())


@pytest.fixture
def judge_env(tmp_path):
    """(start(respond, **kw) -> (judge, kwargs for compute_score)); servers stop at teardown."""
    started = []

    def start(respond, score_method="text", prefix="", **server_kw):
        judge = ScriptedJudge(respond, **server_kw).__enter__()
        started.append(judge)
        sub = tmp_path / f"s{len(started)}"
        sub.mkdir()
        rubric = write_rubric(sub, score_method=score_method, prefix=prefix)
        endpoint = write_endpoint(sub, judge.port, rubric)
        kw = {"endpoint_file": str(endpoint), "audit_dir": str(sub / "audit"),
              "reward_cfg": {"retries": 2, "backoff_s": 0.01, "backoff_max_s": 0.02, "timeout_s": 5,
                             "health_timeout_s": 5}}
        return judge, kw

    yield start
    for judge in started:
        judge.__exit__(None, None, None)


# --------------------------------------------------------------------------- edge table, end to end
def test_invalid_policy_json_scores_005_without_a_judge_call(judge_env):
    judge, kw = judge_env(lambda body: "Score: 9")
    for bad in ["not json", '{"summary": "x"}', "Here it is: {\"evolving_summary\": \"x\"}", "[1, 2]", ""]:
        r = compute_score(DS, bad, STEP, {"index": 0}, **kw)
        assert (r["score"], r["parse_method"], r["valid_json"]) == (0.05, "invalid_json", False)
    assert judge.hits == 0


@pytest.mark.parametrize("answer, score, method", [
    ("Reasoning about renal history.\nScore: 7", 7 / 9, "score_line"),
    ("8", 8 / 9, "short_digit"),
    ("This memory is generally helpful but I will not give a number.", 0.5, "fallback"),
])
def test_judge_answer_rows(judge_env, answer, score, method):
    judge, kw = judge_env(lambda body: answer)
    r = compute_score(DS, memory("CKD stage 3."), STEP, {"index": 0}, **kw)
    assert r["parse_method"] == method and math.isclose(r["score"], score) and judge.hits == 1
    assert r["retries"] == 0 and r["judge_latency_s"] > 0


def test_expected_score_from_logprobs(judge_env):
    content = [{"token": "6", "logprob": math.log(0.6), "top_logprobs": [
        {"token": "6", "logprob": math.log(0.6)}, {"token": "9", "logprob": math.log(0.4)}]}]
    judge, kw = judge_env(lambda body: (200, chat_payload("6", content)), score_method="expected", prefix="Score:")
    r = compute_score(DS, memory("CKD."), STEP, {"index": 0}, **kw)
    assert r["parse_method"] == "expected" and math.isclose(r["score"], (0.6 * 6 + 0.4 * 9) / 9)
    body = judge.bodies[0]
    assert body["logprobs"] is True and body["messages"][-1]["content"] == "Score:" and body["temperature"] == 0


def test_fenced_json_is_valid_policy_output(judge_env):
    judge, kw = judge_env(lambda body: "Score: 9")
    assert compute_score(DS, '```json\n{"evolving_summary": "a"}\n```', STEP, {}, **kw)["score"] == 1.0
    assert compute_score(DS, '{"evolving_summary": 3}', STEP, {}, **kw)["parse_method"] == "invalid_json"
    assert judge.hits == 1


# --------------------------------------------------------------------------- outcome term
def test_outcome_term_depends_on_the_candidate_memory(judge_env):
    assert outcome_share("History of HEART-FAILURE.", ["Heart failure", "CKD stage 3"]) == 0.5
    assert outcome_share("heart failures", ["heart failure"]) == 1.0  # the held-out matcher's plural stem
    # abbreviations expand as the matcher expands them: CKD shares "kidney" with acute kidney injury, no more
    assert math.isclose(outcome_share("hyperkalemia due to ckd", ["hyperkalemia", "acute kidney injury"]), (1 + 1 / 3) / 2)
    assert outcome_share("CHF", ["congestive heart failure"]) == 1.0
    assert outcome_share("anything", []) == 0.0
    _judge, kw = judge_env(lambda body: "Score: 5")
    kw["reward_cfg"]["outcome_epsilon"] = 0.2
    good = compute_score(DS, memory("Heart failure; CKD stage 3."), STEP, {}, **kw)
    poor = compute_score(DS, memory("Likes tennis."), STEP, {}, **kw)
    assert math.isclose(good["score"], 5 / 9 + 0.2) and math.isclose(poor["score"], 5 / 9)


# --------------------------------------------------------------------------- outcome mode: no judge
def test_outcome_mode_needs_no_judge_endpoint(tmp_path):
    """reward.mode outcome asks no judge: every entry point scores without an endpoint, an endpoint given
    anyway is not waited on (this one names no server: a wait would fail), and every sample is audited."""
    kw = {"audit_dir": str(tmp_path / "audit"), "reward_cfg": {"mode": "outcome", "health_timeout_s": 1}}
    good = compute_score(DS, memory("Heart failure; CKD stage 3."), STEP, {}, **kw)
    assert (good["score"], good["parse_method"], good["judge_calls"]) == (1.0, "outcome", 0)
    ignored = compute_score(DS, memory("Likes tennis."), STEP, {}, endpoint_file=str(tmp_path / "none.json"), **kw)
    assert ignored["score"] == 0.0 and ignored["valid_json"] is True
    batch = compute_score_batch([DS] * 3, [memory("heart failure"), "no json at all", memory("")], [STEP] * 3,
                                [{"index": 0}] * 3, **kw)
    assert [r["score"] for r in batch] == [0.5, 0.0, 0.0] and batch[1]["parse_method"] == "invalid_json"
    completions = [[{"role": "assistant", "content": memory("CKD stage 3, heart failure")}],
                   [{"role": "assistant", "content": memory("nothing")}]]
    rewards = trl_reward_func(["p", "p"], completions, reward_model=[{"ground_truth": STEP}] * 2,
                              extra_info=[{"index": 1}] * 2, **kw)
    assert rewards == [1.0, 0.0]
    lines = [json.loads(x) for f in (tmp_path / "audit").glob("calls_*.jsonl") for x in f.read_text().splitlines()]
    assert len(lines) == 7 and {(x["mode"], x["rubric"], len(x["judge"])) for x in lines} == {("outcome", None, 0)}
    assert not (tmp_path / "none.json").exists()


@pytest.mark.parametrize("mode", ["scalar", "pairwise"])
def test_judged_modes_without_an_endpoint_stop_with_one_line(tmp_path, mode):
    kw = {"audit_dir": str(tmp_path / "audit"), "reward_cfg": {"mode": mode}}
    line = f"reward.mode {mode} asks the judge but no judge endpoint was given: pass endpoint_file="
    with pytest.raises(InputError, match=re.escape(line + " (RUN/judge/endpoint.json")):
        compute_score(DS, memory("x"), STEP, {}, **kw)
    with pytest.raises(InputError, match=re.escape(line)):
        trl_reward_func(["p"], [memory("x")], reward_model=[{"ground_truth": STEP}], **kw)
    with pytest.raises(InputError, match=re.escape(f"reward.mode {mode} asks the judge")):
        Scorer(None, None, tmp_path / "audit", Reward(mode=mode))
    assert not (tmp_path / "audit").exists()


# --------------------------------------------------------------------------- batching, dedup, audit
def test_batch_is_concurrent_deduplicated_and_audited(judge_env, tmp_path):
    judge, kw = judge_env(lambda body: f"Score: {1 + sum(map(ord, body['messages'][0]['content'])) % 9}",
                          delay_s=0.2)
    sols = [memory(f"candidate {i % 4}") for i in range(16)]  # 4 distinct candidates, 4 copies each
    results = compute_score_batch([DS] * 16, sols, [STEP] * 16, [{"index": 0}] * 16, **kw)
    assert judge.hits == 4  # identical judge prompts judged once
    assert sum(r["cache_hits"] for r in results) == 12
    assert judge.max_inflight > 1  # calls ran concurrently
    assert len({round(r["score"], 6) for r in results}) > 1
    audit = list((tmp_path / "s1" / "audit").glob("calls_*.jsonl"))
    assert len(audit) == 1 and stat.S_IMODE(audit[0].stat().st_mode) == 0o600
    assert stat.S_IMODE(audit[0].parent.stat().st_mode) == 0o700
    lines = [json.loads(x) for x in audit[0].read_text().splitlines()]
    assert len(lines) == 16 and lines[0]["rollout"] == sols[0] and lines[0]["judge"][0]["response"].startswith("Score")
    numeric = compute_score_batch([DS], [sols[0]], [STEP], [{}], numeric_only=True, **kw)[0]
    assert all(isinstance(v, (int, float)) for v in numeric.values()) and numeric["parse_score_line"] == 1.0


# --------------------------------------------------------------------------- dead judge
def test_judge_dying_mid_training_raises_instead_of_constant_rewards(judge_env):
    judge, kw = judge_env(lambda body: "Score: 5")
    assert compute_score(DS, memory("x"), STEP, {}, **kw)["score"] == 5 / 9
    judge.__exit__(None, None, None)  # the server goes away: connection refused
    with pytest.raises(JudgeUnavailable, match="failed 3 times"):
        compute_score(DS, memory("y"), STEP, {}, **kw)


def test_judge_answering_500_raises_after_retries(judge_env):
    judge, kw = judge_env(lambda body: (500, {"error": "oom"}))
    with pytest.raises(JudgeUnavailable, match="HTTP 500"):
        compute_score(DS, memory("a"), STEP, {}, **kw)
    assert judge.hits == 3  # 1 + 2 retries
    with pytest.raises(JudgeUnavailable, match="HTTP 500"):  # a batch raises too (no partial rewards)
        compute_score_batch([DS] * 2, [memory("b"), memory("c")], [STEP] * 2, [{}] * 2, **kw)


def test_judge_timing_out_raises_after_retries(judge_env):
    _judge, kw = judge_env(lambda body: "Score: 5", delay_s=1.0)
    kw["reward_cfg"]["timeout_s"] = 0.2
    with pytest.raises(JudgeUnavailable, match="timeout"):
        compute_score(DS, memory("z"), STEP, {}, **kw)


def test_missing_endpoint_is_a_clear_error(monkeypatch, tmp_path):
    """The settings are arguments only: an endpoint in the old environment variable is not read."""
    monkeypatch.setenv("LLMRNN_JUDGE_ENDPOINT", str(tmp_path / "endpoint.json"))
    with pytest.raises(InputError, match="no judge endpoint was given: pass endpoint_file="):
        compute_score(DS, memory("x"), STEP, {}, audit_dir=str(tmp_path / "audit"))


def test_missing_audit_dir_is_a_clear_error(monkeypatch, tmp_path):
    """Every judge call is audited where the caller says; no path is guessed from the endpoint's."""
    monkeypatch.setenv("LLMRNN_AUDIT_DIR", str(tmp_path / "audit"))  # not read: an argument or nothing
    with pytest.raises(InputError, match="no audit directory: pass audit_dir=$"):
        compute_score(DS, memory("x"), STEP, {}, endpoint_file=str(tmp_path / "endpoint.json"))
    assert list(tmp_path.iterdir()) == []


def test_a_full_disk_under_the_audit_is_one_line_naming_the_audit_file(tmp_path):
    """The training reward's audit writer on a full disk (its file is /dev/full: every write fails with
    ENOSPC): one CheckFailed naming the audit file, no OSError traceback; the same for an audit dir that
    cannot be made."""
    import os

    from llmrnn.errors import CheckFailed

    audit = tmp_path / "audit"
    audit.mkdir()
    (audit / f"calls_{os.getpid()}.jsonl").symlink_to("/dev/full")
    with pytest.raises(CheckFailed, match=rf"{audit}/calls_{os.getpid()}\.jsonl: cannot write the judge audit "
                                         r"\(No space left on device\)"):
        compute_score(DS, "not json", STEP, {}, audit_dir=str(audit), reward_cfg={"mode": "outcome"})
    blocked = tmp_path / "file"
    blocked.write_text("")
    with pytest.raises(CheckFailed, match="cannot write the judge audit"):
        compute_score(DS, "not json", STEP, {}, audit_dir=str(blocked / "audit"), reward_cfg={"mode": "outcome"})


# --------------------------------------------------------------------------- pairwise
_PAIR = re.compile(r"Memory A:\n(.*?)\n\nMemory B:\n(.*?)\n\nReply", re.DOTALL)


def _quality(text: str) -> int:
    m = re.search(r"q(\d)", text)
    return int(m.group(1)) if m else 0


def prefers_quality(body: dict) -> str:
    """A handcrafted judge: the memory with the higher qN wins; equal -> tie."""
    a, b = _PAIR.search(body["messages"][0]["content"]).groups()
    qa, qb = _quality(a), _quality(b)
    return "Winner: A" if qa > qb else "Winner: B" if qb > qa else "Winner: tie"


def test_pairwise_vs_reference_in_both_orders(judge_env):
    judge, kw = judge_env(prefers_quality)
    kw["reward_cfg"]["mode"] = "pairwise"
    step = json.dumps(make_step(ref="reference q5"))
    assert compute_score(DS, memory("better q9"), step, {}, **kw)["score"] == 1.0
    assert compute_score(DS, memory("worse q1"), step, {}, **kw)["score"] == 0.0
    assert compute_score(DS, memory("same q5"), step, {}, **kw)["score"] == 0.5
    orders = {_PAIR.search(b["messages"][0]["content"]).groups() for b in judge.bodies[:2]}
    assert orders == {("better q9", "reference q5"), ("reference q5", "better q9")}  # A/B and B/A


def test_pairwise_cancels_position_bias_and_counts_unparsed(judge_env):
    _judge, kw = judge_env(lambda body: "Winner: A")  # always picks the first position
    kw["reward_cfg"]["mode"] = "pairwise"
    r = compute_score(DS, memory("anything q9"), STEP, {}, **kw)
    assert r["score"] == 0.5 and r["parse_method"] == "pairwise"
    _judge2, kw2 = judge_env(lambda body: "Both are reasonable memories of this patient.")
    kw2["reward_cfg"]["mode"] = "pairwise"
    r = compute_score(DS, memory("anything"), STEP, {}, **kw2)
    assert r["score"] == 0.5 and r["parse_method"] == "fallback"


def test_pairwise_within_group_for_trl(judge_env):
    """The settings reach TRL's reward function as the arguments `train run` binds (functools.partial over
    llmrnn.reward.reward_kwargs: the reward section as JSON text), as verl's reward_kwargs carry them."""
    import functools

    judge, kw = judge_env(prefers_quality)
    cfg = dict(kw["reward_cfg"], mode="pairwise", pairwise_opponent="group")
    reward = functools.partial(trl_reward_func, **reward_kwargs(cfg, audit_dir=kw["audit_dir"],
                                                                endpoint_file=kw["endpoint_file"]))
    step_a, step_b = json.dumps(make_step(0)), json.dumps(make_step(1))
    completions = [[{"role": "assistant", "content": memory(t)}] for t in
                   ("best q9", "mid q5", "worst q1", "other q2", "other q7")]
    completions.insert(3, [{"role": "assistant", "content": "not json"}])
    rm = [{"style": "rubric", "ground_truth": g} for g in (step_a,) * 4 + (step_b,) * 2]
    extra = [{"split": "train", "index": 0}] * 4 + [{"split": "train", "index": 1}] * 2
    scores = reward(["p"] * 6, completions, reward_model=rm, extra_info=extra, data_source=[DS] * 6)
    # group 0: q9 beats both (1.0), q5 beats one (0.5), q1 none (0.0); invalid JSON 0.05; group 1: 0 and 1
    assert scores == [1.0, 0.5, 0.0, 0.05, 0.0, 1.0]
    assert judge.hits == 2 * 3 + 2 * 1  # ordered pairs: 3*2 in group 0, 2*1 in group 1


def test_outcome_term_on_output_that_is_not_json(judge_env):
    judge, kw = judge_env(lambda body: "Score: 9")
    step = json.dumps({**make_step(), "next_ground_truth_diagnoses": ["hyperkalemia", "type 2 diabetes mellitus"]})
    assert compute_score(DS, "not json, hyperkalemia", step, {}, **kw)["score"] == 0.05  # epsilon 0: reference
    kw["reward_cfg"]["outcome_epsilon"] = 0.2
    full = compute_score(DS, "watch hyperkalemia and type 2 diabetes mellitus", step, {}, **kw)
    part = compute_score(DS, "history of diabetes", step, {}, **kw)
    none = compute_score(DS, "likes tennis", step, {}, **kw)
    # "type" carries no diagnostic content for the matcher: diabetes covers 1/3 of type 2 diabetes mellitus
    assert math.isclose(full["score"], 0.25) and math.isclose(part["score"], 0.05 + 0.2 * (1 / 3 / 2))
    assert none["score"] == 0.05 and full["parse_method"] == "invalid_json"
    assert judge.hits == 0  # never judged


# --------------------------------------------------------------------------- the fallback guard (training)
def _vague_or_scored(body) -> str:
    """The judge loses the format on memories that say 'vague' (the 0.5 fallback), scores the rest."""
    prompt = "\n".join(m["content"] for m in body["messages"])
    return "It is hard to say, the memory is quite unclear overall." if "vague" in prompt else "Score: 7"


def _batch(texts: list[str]) -> dict:
    n = len(texts)
    return {"data_sources": [DS] * n, "solution_strs": texts, "ground_truths": [STEP] * n,
            "extra_infos": [{"index": i} for i in range(n)]}


def test_fallback_guard_stops_training_when_the_window_is_mostly_fallbacks(judge_env, tmp_path):
    _, kw = judge_env(_vague_or_scored)
    kw["guard"] = json.dumps(guard_spec(0.25, 8))  # as reward_kwargs carries it (train run sets it)
    two_of_eight = [memory(f"vague {i}") for i in range(2)] + [memory(f"CKD {i}") for i in range(6)]
    results = compute_score_batch(**_batch(two_of_eight), **kw)
    assert [r["parse_method"] for r in results].count("fallback") == 2  # 25%: not above the limit
    compute_score_batch(**_batch(["not json"] * 8), **kw)  # the policy's fault, not the judge's: not counted
    four_of_eight = [memory(f"vague x{i}") for i in range(4)] + [memory(f"CKD x{i}") for i in range(4)]
    with pytest.raises(JudgeDegraded, match=r"4 of the last 8 judged samples \(50%\) .*preflight\.max_fallback_rate 25%"):
        compute_score_batch(**_batch(four_of_eight), **kw)
    reason = (tmp_path / "s1" / "audit" / STOP_REASON_FILE).read_text()
    assert "judge degraded during training" in reason and "vague" not in reason  # no judged text in it
    with pytest.raises(JudgeDegraded):  # tripped: it stays stopped
        compute_score(DS, memory("CKD again"), STEP, {"index": 0}, **kw)


def test_without_the_guard_fallbacks_are_scored_not_stopped(judge_env):
    """Preflight measures the rate itself: outside training the guard is off."""
    _, kw = judge_env(_vague_or_scored)
    results = compute_score_batch(**_batch([memory(f"vague {i}") for i in range(70)]), **kw)
    assert {r["parse_method"] for r in results} == {"fallback"} and fallback_rate(results) == 1.0


def test_trl_reward_logs_the_fallback_rate_of_judged_samples(judge_env):
    _, kw = judge_env(_vague_or_scored)
    logged: list[tuple[str, float]] = []
    completions = [[{"role": "assistant", "content": text}] for text in
                   [memory("vague a"), memory("CKD a"), memory("CKD b"), memory("CKD c"), "not json"]]
    n = len(completions)
    trl_reward_func(["p"] * n, completions, reward_model=[{"ground_truth": STEP}] * n,
                    extra_info=[{"index": 0}] * n, log_metric=lambda name, value: logged.append((name, value)), **kw)
    assert logged == [("judge_fallback_rate", 0.25)]  # 1 of the 4 judged; invalid JSON is not judged


# --------------------------------------------------------------------------- one key set on every path
def _paths_judge(body):
    """Judged: a score line; fallback: a long answer with no score (0.5); pairwise: a verdict."""
    text = json.dumps(body)
    if "unscorable" in text:
        return "I cannot decide this one, the memory is neither good nor bad in my view, sorry. " * 3
    return "Score: 8" if "Verdict" not in text else "A"


@pytest.mark.parametrize("numeric_only", [True, False], ids=["numeric_only", "full"])
def test_compute_score_returns_the_same_keys_in_the_same_order_on_every_path(judge_env, numeric_only):
    """verl 0.7.1 takes a worker's reward-extra keys from its FIRST sample and asserts equal key lists when
    it concatenates workers (tests/verl/assemble_batch.py runs verl's own code on these outputs): judged,
    invalid JSON, judge fallback, pairwise and outcome results must all carry one key list."""
    _, kw = judge_env(_paths_judge)
    solutions = {"judged": memory("CKD stage 3: watch edema."), "invalid_json": "not JSON at all",
                 "fallback": memory("unscorable memory")}
    keys = {}
    for mode in ("scalar", "pairwise", "outcome"):
        cfg = dict(kw["reward_cfg"], mode=mode)
        for path, text in solutions.items():
            out = compute_score(DS, text, STEP, {}, **dict(kw, reward_cfg=cfg), numeric_only=numeric_only)
            keys[(mode, path)] = list(out)
    assert compute_score(DS, solutions["fallback"], STEP, {}, **kw)["parse_method"] == "fallback"
    first = keys[("scalar", "judged")]
    assert "truncated_calls" in first and "judge_latency_s" in first
    for where, got in keys.items():
        assert got == first, (where, got, first)


@pytest.mark.parametrize("change, line", [
    (lambda s: s.pop("next_ground_truth_diagnoses"),
     "reward: row 4 (train): reward_model.ground_truth.next_ground_truth_diagnoses: Field required"),
    (lambda s: s.update(visit_index="0"),
     "reward: row 4 (train): reward_model.ground_truth.visit_index: Input should be a valid integer (got '0')"),
    (lambda s: s["next_prediction"].update(top_5_diagnoses="copd"),
     ("reward: row 4 (train): reward_model.ground_truth.next_prediction.top_5_diagnoses: Input should be a valid "
     "list (got 'copd')")),
    (lambda s: s.update(h_ref_typo="x"),
     "reward: row 4 (train): reward_model.ground_truth.h_ref_typo: Extra inputs are not permitted (got 'x')"),
])
def test_a_step_missing_or_mistyping_a_field_is_one_line_naming_the_row_and_field(tmp_path, change, line):
    """The reward reads the row through TrajectoryStep (outcome mode: no judge needed to get there)."""
    step = make_step()
    change(step)
    kw = {"audit_dir": str(tmp_path / "audit"), "reward_cfg": {"mode": "outcome"}}
    with pytest.raises(InputError) as caught:
        compute_score(DS, memory("heart failure"), json.dumps(step), {"index": 4, "split": "train"}, **kw)
    assert str(caught.value) == line
    assert compute_score(DS, memory("heart failure"), STEP, {"index": 4}, **kw)["score"] == 0.5
