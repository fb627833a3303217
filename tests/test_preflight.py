"""Preflight: a compliant judge passes with stats; a judge that never prints a score fails and says why;
the real workflow (judge_server service + preflight) runs under Snakemake with a tiny model."""

from __future__ import annotations

import json
import re

import pytest

from llmrnn.errors import CheckFailed
from llmrnn.preflight import run_preflight
from tests.conftest import llmrnn_in_process, snakemake
from tests.judge_helpers import (
    ScriptedJudge,
    chat_payload,
    make_step,
    write_endpoint,
    write_parquet,
    write_rubric,
)

# agreement_pairs 0: these tests count the compliance check's judge calls; the agreement tests turn it on
CFG = {"reward": {"retries": 1, "backoff_s": 0.01, "health_timeout_s": 5},
       "preflight": {"rows": 4, "max_fallback_rate": 0.25, "min_distinct_rewards": 3, "on_problem": "fail",
                     "agreement_pairs": 0}}


def _steps(n=6):
    return [make_step(i, ref=f"patient {i}: CKD stage {i % 5}, heart failure", prev=f"visit {i} note") for i in range(n)]


def _setup(tmp_path, respond):
    judge = ScriptedJudge(respond).__enter__()
    rubric = write_rubric(tmp_path)
    endpoint = write_endpoint(tmp_path, judge.port, rubric)
    parquet = write_parquet(tmp_path / "trajectories" / "train.parquet", _steps())
    return judge, endpoint, parquet


def content_score(body):
    text = body["messages"][0]["content"]
    return f"Score: {1 + sum(map(ord, text)) % 9}"


def test_compliant_judge_passes_with_stats(tmp_path):
    judge, endpoint, parquet = _setup(tmp_path, content_score)
    try:
        out = tmp_path / "train" / "preflight.json"
        report = run_preflight(str(parquet), str(endpoint), str(out), str(tmp_path / "audit"), CFG)
    finally:
        judge.__exit__(None, None, None)
    saved = json.loads(out.read_text())
    assert saved == json.loads(json.dumps(report))
    assert saved["ok"] is True and saved["problems"] == []
    j = saved["judge"]
    assert j["rows"] == 4 and j["candidates"] == 12 and j["parse_methods"] == {"score_line": 12}
    assert j["fallback_rate"] == 0.0 and j["reward"]["distinct"] >= 3 and j["reward"]["std"] > 0
    assert j["latency_s"]["p50"] > 0 and j["latency_s"]["p95"] >= j["latency_s"]["p50"]
    # the 4 empty-memory candidates share one judge prompt here (same next visit): judged once
    assert j["rows_with_spread"] >= 1 and judge.hits == 9 and j["cache_hits"] == 3 and "training" in saved


def test_judge_that_never_prints_a_score_fails_preflight_with_the_reason(tmp_path):
    judge, endpoint, parquet = _setup(
        tmp_path, lambda body: "This memory summarises the patient's history well and is clinically relevant.")
    out = tmp_path / "train" / "preflight.json"
    try:
        with pytest.raises(CheckFailed) as err:
            run_preflight(str(parquet), str(endpoint), str(out), str(tmp_path / "audit"), CFG)
    finally:
        judge.__exit__(None, None, None)
    message = str(err.value)
    assert "the judge does not follow the score format: 12/12 answers (100%) had no parseable score" in message
    assert "the reward is (nearly) constant: 1 distinct value(s) [0.5]" in message
    assert "This memory summarises" in message  # shows what the judge said
    saved = json.loads(out.read_text())
    assert saved["ok"] is False and len(saved["problems"]) == 2
    assert saved["judge"]["parse_methods"] == {"fallback": 12} and saved["judge"]["fallback_rate"] == 1.0


def test_judge_cut_off_by_max_tokens_before_a_score_fails_preflight(tmp_path):
    """A thinking judge (Qwen3 through chat) spends max_tokens on its reasoning: finish_reason 'length',
    no score. Preflight says so instead of training on 0.5 fallbacks."""
    def thinking(body):
        payload = chat_payload("<think>Let me weigh the memory against the next visit. First, the")
        payload["choices"][0]["finish_reason"] = "length"
        return 200, payload

    judge, endpoint, parquet = _setup(tmp_path, thinking)
    out = tmp_path / "train" / "preflight.json"
    try:
        with pytest.raises(CheckFailed, match=r"12 judge answer\(s\) hit max_tokens=64 before giving a score"):
            run_preflight(str(parquet), str(endpoint), str(out), str(tmp_path / "audit"), CFG)
    finally:
        judge.__exit__(None, None, None)
    saved = json.loads(out.read_text())
    assert saved["judge"]["truncated_before_score"] == 12
    assert any("request.api: completions" in p for p in saved["problems"])


def test_compliant_judge_is_not_flagged_as_cut_off(tmp_path):
    def scored_at_the_limit(body):  # the score came out, then the answer hit the limit: that is fine
        payload = chat_payload(content_score(body) + " because")
        payload["choices"][0]["finish_reason"] = "length"
        return 200, payload

    judge, endpoint, parquet = _setup(tmp_path, scored_at_the_limit)
    try:
        report = run_preflight(str(parquet), str(endpoint), str(tmp_path / "p.json"), str(tmp_path / "audit"), CFG)
    finally:
        judge.__exit__(None, None, None)
    assert report["ok"] and report["judge"]["truncated_before_score"] == 0


def test_warn_mode_records_problems_as_warnings(tmp_path):
    judge, endpoint, parquet = _setup(tmp_path, lambda body: "no score here, just a long answer without a digit")
    cfg = json.loads(json.dumps(CFG))
    cfg["preflight"]["on_problem"] = "warn"
    try:
        report = run_preflight(str(parquet), str(endpoint), str(tmp_path / "p.json"), str(tmp_path / "a"), cfg)
    finally:
        judge.__exit__(None, None, None)
    assert report["ok"] is True and report["problems"] == [] and len(report["warnings"]) >= 2


def test_cli_failure_is_one_line_without_traceback(tmp_path):
    judge, endpoint, parquet = _setup(tmp_path, lambda body: "I refuse to grade this memory summary today, sorry.")
    try:
        proc = llmrnn_in_process("preflight", "run", "--train-parquet", str(parquet), "--endpoint", str(endpoint),
                                 "--out", str(tmp_path / "p.json"), "--audit-dir", str(tmp_path / "a"),
                                 "--cfg", json.dumps(CFG))
    finally:
        judge.__exit__(None, None, None)
    assert proc.returncode == 3
    last = proc.stderr.strip().splitlines()[-1]
    assert last.startswith("llmrnn preflight: error: preflight failed: the judge does not follow the score format")
    assert "Traceback" not in proc.stderr


def test_training_problems_fail_preflight_even_when_the_judge_passes(tmp_path, tiny_model_dir):
    judge, endpoint, parquet = _setup(tmp_path, content_score)
    cfg = dict(CFG, train={"engine": "trl", "group_size": 4, "batch": {"train": 2, "mini": 2, "micro_per_gpu": 3}})
    out = tmp_path / "train" / "preflight.json"
    try:
        with pytest.raises(CheckFailed, match="training: train.batch.micro_per_gpu=3 does not divide"):
            run_preflight(str(parquet), str(endpoint), str(out), str(tmp_path / "audit"), cfg,
                          tokenizer_dir=str(tiny_model_dir))
    finally:
        judge.__exit__(None, None, None)
    saved = json.loads(out.read_text())
    assert saved["ok"] is False and saved["judge"]["fallback_rate"] == 0.0
    assert saved["training"]["geometry"]["responses_per_step"] == 8 and saved["training"]["data"]["train"]["rows"] == 6


def _port_closed(log_text: str) -> bool:
    import re
    import socket

    port = int(re.search(r"on 127\.0\.0\.1:(\d+)", log_text).group(1))
    with socket.socket() as sock:
        return sock.connect_ex(("127.0.0.1", port)) != 0


@pytest.mark.e2e  # a slow tier test (a workflow, CLI or training run of its own): `make test-e2e`
@pytest.mark.slow
def test_workflow_preflight_without_a_judge_in_outcome_mode(workflow_dir, tiny_model_dir):
    """Real snakemake, reward.mode outcome: preflight runs alone (no judge_server job, no endpoint) and
    writes its report; the judge's rubric names a model that does not exist, so any judge start would fail."""
    run = workflow_dir / "results" / "t"
    for split in ("train", "val"):
        write_parquet(run / "trajectories" / f"{split}.parquet", _steps(3))
    rubric = write_rubric(workflow_dir / "config", model=str(workflow_dir / "no-such-judge"), source="path")
    (workflow_dir / "outcome.yaml").write_text(json.dumps({
        "run_name": "t", "judge": {"rubric": str(rubric.relative_to(workflow_dir))},
        "reward": {"mode": "outcome"}, "preflight": {"rows": 2},
        "roles": {"memory": {"model": str(tiny_model_dir)}},
    }))
    proc = snakemake(workflow_dir, "--configfile", "config/config.yaml", "outcome.yaml", "--allowed-rules", "preflight", "--",
                     "results/t/train/preflight.json")
    assert "judge_server" not in proc.stdout + proc.stderr
    report = json.loads((run / "train" / "preflight.json").read_text())
    assert report["judge"]["skipped"] == "reward.mode outcome asks no judge" and report["judge"]["candidates"] == 6
    assert not (run / "judge").exists()


@pytest.mark.slow
@pytest.mark.e2e  # a whole-workflow run: `make test-e2e` (the fast-feedback tiers)
def test_workflow_runs_judge_service_and_preflight(workflow_dir, tiny_model_dir):
    """Real snakemake: the judge_server service starts our CPU server with a tiny model, preflight waits on
    its health and scores rows. The random tiny model gives no usable reward: with on_problem fail the run
    stops with the reason; with warn it finishes; either way the service is gone afterwards."""
    rubric = write_rubric(workflow_dir / "config", score_method="expected", prefix="Score:",
                          model=str(tiny_model_dir), source="path", max_tokens=2)
    run = workflow_dir / "results" / "t"
    for split in ("train", "val"):
        write_parquet(run / "trajectories" / f"{split}.parquet", _steps(3))
    args = ["--allowed-rules", "judge_server", "preflight", "--", "results/t/train/preflight.json"]
    log = workflow_dir / "logs" / "t" / "judge_server.log"
    for on_problem in ("fail", "warn"):
        (workflow_dir / f"{on_problem}.yaml").write_text(json.dumps({
            "run_name": "t", "judge": {"rubric": str(rubric.relative_to(workflow_dir))},
            # agreement_pairs 0: the audit below counts the compliance candidates (agreement: its own test)
            "preflight": {"rows": 2, "on_problem": on_problem, "agreement_pairs": 0},
            "reward": {"mode": "scalar"},  # the judge's reward (the demo default, outcome, asks no judge)
            "roles": {"memory": {"model": str(tiny_model_dir)}},  # the policy whose tokenizer training checks use
        }))
        proc = snakemake(workflow_dir, "--configfile", "config/config.yaml", f"{on_problem}.yaml", *args, check=False)
        assert "judge healthy at http://127.0.0.1:" in log.read_text()
        assert _port_closed(log.read_text())  # the server did not outlive the workflow
        if on_problem == "fail":
            # Snakemake SIGKILLs the service when a consumer fails; the server dies with its launcher
            # (PR_SET_PDEATHSIG, port closed above); the key file of the dead server may remain.
            assert proc.returncode != 0
            message = (workflow_dir / "logs" / "t" / "preflight.log").read_text()
            # the random model either prints no score or scores near-constantly: both stop the run
            assert "preflight failed: " in message
            assert ("the judge does not follow the score format" in message
                    or "the reward is (nearly) constant" in message), message
            assert not (run / "train" / "preflight.json").exists()
    assert proc.returncode == 0, proc.stderr
    report = json.loads((run / "train" / "preflight.json").read_text())
    assert report["ok"] is True and report["judge"]["candidates"] == 6 and len(report["warnings"]) >= 1
    assert "Terminating service job" in proc.stderr and "terminating the judge server" in log.read_text()
    assert not (run / "judge" / "api_key").exists()  # graceful stop deletes the key
    assert not (run / "judge" / "endpoint.json").exists()
    audit = list((run / "train" / "preflight_audit").glob("calls_*.jsonl"))
    assert len(audit) == 1 and len(audit[0].read_text().splitlines()) == 6


def test_outcome_mode_reports_a_constant_reference_reward_without_stopping(tmp_path):
    """reward.mode outcome asks no judge: the fixed reference memories' (constant) outcome scores are a
    warning, not a stop; the same rows under the judge's scalar mode stop the run."""
    judge, endpoint, _ = _setup(tmp_path, lambda body: "no score here, just a long answer without a digit")
    parquet = write_parquet(tmp_path / "trajectories" / "blank.parquet",  # memories that name no diagnosis
                            [make_step(i, ref="nothing recorded", prev="nothing recorded") for i in range(6)])
    outcome = json.loads(json.dumps(CFG))
    outcome["reward"]["mode"] = "outcome"
    try:
        report = run_preflight(str(parquet), str(endpoint), str(tmp_path / "o.json"), str(tmp_path / "a"), outcome)
        with pytest.raises(CheckFailed, match="preflight failed"):
            run_preflight(str(parquet), str(endpoint), str(tmp_path / "s.json"), str(tmp_path / "b"), CFG)
    finally:
        judge.__exit__(None, None, None)
    assert report["ok"] is True and report["problems"] == []
    assert any(w.startswith("reward.mode outcome (no judge): ") for w in report["warnings"])
    # the endpoint given anyway is not asked (the scalar run above asked it for its 12 candidates)
    assert report["judge"]["skipped"] == "reward.mode outcome asks no judge" and report["judge"]["http_calls"] == 0


TRAIN_OK = {"engine": "trl", "group_size": 4, "batch": {"train": 2, "mini": 2, "micro_per_gpu": 4},
            "max_prompt_length": 256, "max_response_length": 16, "epochs": 2}


def _preflight_cli(tmp_path, parquet, cfg, *extra):
    return llmrnn_in_process("preflight", "run", "--train-parquet", str(parquet),
                             "--out", str(tmp_path / "train" / "preflight.json"), "--audit-dir", str(tmp_path / "audit"),
                             "--cfg", json.dumps(cfg), *extra)


def test_outcome_mode_runs_without_a_judge_endpoint(tmp_path, tiny_model_dir):
    """`llmrnn preflight run` with no --endpoint in outcome mode: the reference memories are scored with
    the outcome reward (statistics kept), the training checks run, and the report says no judge was asked."""
    parquet = write_parquet(tmp_path / "trajectories" / "train.parquet", _steps())
    cfg = json.loads(json.dumps(CFG))
    cfg["reward"]["mode"] = "outcome"
    cfg["train"] = TRAIN_OK
    proc = _preflight_cli(tmp_path, parquet, cfg, "--val-parquet", str(parquet), "--tokenizer-dir",
                          str(tiny_model_dir))
    assert proc.returncode == 0, proc.stderr[-3000:]
    report = json.loads((tmp_path / "train" / "preflight.json").read_text())
    j = report["judge"]
    assert report["ok"] is True and j["skipped"] == "reward.mode outcome asks no judge" and j["mode"] == "outcome"
    assert j["rows"] == 4 and j["candidates"] == 12 and j["parse_methods"] == {"invalid_json": 4, "outcome": 8}
    assert j["fallback_rate"] is None and j["http_calls"] == 0 and j["latency_s"] == {"p50": None, "p95": None}
    # h_ref names the next visit's heart failure (and CKD), h_prev names nothing, the empty memory is no memory
    assert j["reward"]["max"] >= 0.5 and j["reward"]["min"] == 0.0 and j["rows_with_spread"] == 4
    assert report["training"]["ok"] is True and report["training"]["data"]["train"]["rows"] == 6
    audit = [json.loads(line) for f in (tmp_path / "audit").glob("calls_*.jsonl") for line in f.read_text().splitlines()]
    assert len(audit) == 12 and {(a["mode"], a["rubric"], len(a["judge"])) for a in audit} == {("outcome", None, 0)}


@pytest.mark.parametrize("mode", ["scalar", "pairwise"])
def test_judged_mode_without_an_endpoint_is_one_line(tmp_path, mode):
    parquet = write_parquet(tmp_path / "trajectories" / "train.parquet", _steps())
    cfg = json.loads(json.dumps(CFG))
    cfg["reward"]["mode"] = mode
    proc = _preflight_cli(tmp_path, parquet, cfg)
    assert proc.returncode == 2 and "Traceback" not in proc.stderr
    assert proc.stderr.strip().splitlines()[-1] == (
        f"llmrnn preflight: error: reward.mode {mode} asks the judge but no judge endpoint was given: pass "
        "--endpoint (RUN/judge/endpoint.json; reward.mode outcome needs none)")
    assert not (tmp_path / "train").exists() and not (tmp_path / "audit").exists()


def test_a_loopback_judge_with_several_training_nodes_fails_preflight(tmp_path, monkeypatch):
    """train.nnodes 2: verl's reward workers run on every node; a judge on 127.0.0.1 reaches only its
    own node, so the preflight fails before training (not a dead reward mid-run)."""
    for var in ("SLURM_JOB_ID", "SLURM_JOB_NODELIST", "SLURM_NODELIST"):
        monkeypatch.delenv(var, raising=False)  # no allocation: the other nodes are elsewhere
    judge, endpoint, parquet = _setup(tmp_path, content_score)
    cfg = {**CFG, "train": {"engine": "verl", "nnodes": 2}}
    try:
        with pytest.raises(CheckFailed, match=r"judge: the endpoint http://127\.0\.0\.1:\d+/v1 is a loopback address"):
            run_preflight(str(parquet), str(endpoint), str(tmp_path / "p.json"), str(tmp_path / "audit"), cfg)
        report = json.loads((tmp_path / "p.json").read_text())
        assert report["ok"] is False and any("judge.host: node" in p for p in report["problems"])
        cfg["train"]["nnodes"] = 1  # one node: loopback is right
        assert run_preflight(str(parquet), str(endpoint), str(tmp_path / "p1.json"), str(tmp_path / "a"), cfg)["ok"]
    finally:
        judge.__exit__(None, None, None)


# ----------------------------------------------------------------------------- judge agreement
CONDITIONS = ["asthma exacerbation", "gout flare", "psoriasis", "epilepsy", "glaucoma", "migraine"]


def _patient_steps():
    """Six patients, each with its own next-visit diagnosis, named by its reference memory."""
    steps = []
    for i, cond in enumerate(CONDITIONS):
        step = make_step(i, ref=f"lives alone with a cat; hypertension; {cond}")
        step["next_ground_truth_diagnoses"] = [cond]
        step["ground_truth_diagnoses"] = ["hypertension"]
        steps.append(step)
    return steps


def reading_judge(body):
    """A judge that reads: the score grows with the share of the next visit's diagnosis words the memory names."""
    from tests.judge_helpers import prompt_of

    text = prompt_of(body)
    memory = text.split("Memory:", 1)[1].split("Next visit, true diagnoses:", 1)[0].lower()
    truth = text.split("Next visit, true diagnoses:", 1)[1].splitlines()[0].lower()
    words = [w.strip(",.;[]'\"") for w in truth.split()]
    words = [w for w in words if w]
    share = sum(w in memory for w in words) / max(1, len(words))
    return f"Score: {1 + round(8 * share)}"


def _agreement(tmp_path, respond, cfg_over=None):
    from llmrnn.preflight import run_agreement

    tmp_path.mkdir(parents=True, exist_ok=True)
    judge = ScriptedJudge(respond).__enter__()
    try:
        endpoint = write_endpoint(tmp_path, judge.port, write_rubric(tmp_path))
        parquet = write_parquet(tmp_path / "trajectories" / "train.parquet", _patient_steps())
        cfg = {"reward": {"mode": "outcome", "retries": 1, "backoff_s": 0.01, "health_timeout_s": 5},
               "preflight": {"agreement_pairs": 6, **(cfg_over or {})}}
        out = tmp_path / "judge" / "agreement.json"
        report = run_agreement(str(parquet), str(endpoint), str(out), str(tmp_path / "audit"), cfg)
    finally:
        judge.__exit__(None, None, None)
    assert json.loads(out.read_text()) == json.loads(json.dumps(report))
    return report


def test_judge_agreement_of_a_judge_that_reads_the_memory(tmp_path):
    report = _agreement(tmp_path, reading_judge)
    assert report["mode"] == "scalar" and report["training_reward_mode"] == "outcome"
    assert (report["pairs"], report["agreed"], report["ties"], report["rate"]) == (6, 6, 0, 1.0)
    assert report["verdict"] == "ok" and report["problems"] == [] and report["warnings"] == []
    from llmrnn.stats import wilson_ci

    assert report["ci95"] == list(wilson_ci(6, 6)) and report["ci_method"] == "wilson"
    assert set(report["by_kind"]) == {"other_patient", "diagnoses_removed", "truncated"}
    assert all(k["pairs"] == 2 and k["rate"] == 1.0 for k in report["by_kind"].values())
    assert "outcome" in report["why_training_reward"] and "6 pairs" in report["sample_note"]


def test_judge_agreement_of_a_judge_that_ignores_the_memory(tmp_path):
    """A constant score ties every pair: agreement 0 is below agreement_fail_below, said in one line; the
    standalone check records the verdict without stopping anything."""
    report = _agreement(tmp_path, lambda body: "Score: 5")
    assert (report["pairs"], report["agreed"], report["ties"]) == (6, 0, 6)
    assert report["verdict"] == "fail" and report["ci95"][1] < 0.5
    assert report["problems"] == [
        ("judge agreement: the judge ranked a patient's reference memory above a wrong one in 0/6 pairs (0%, 95% CI "
        "0%-39%, ties 6), below preflight.agreement_fail_below 50%: its reward would not tell right memories from "
        "wrong ones")]
    # between the thresholds: a warning
    half = _agreement(tmp_path / "w", lambda body: reading_judge(body) if "gout" not in prompt_text(body) else "Score: 5",
                      {"agreement_warn_below": 0.95, "agreement_fail_below": 0.5})
    assert half["verdict"] == "warn" and half["warnings"] and 0.5 <= half["rate"] < 0.95


def prompt_text(body):
    from tests.judge_helpers import prompt_of

    return prompt_of(body)


def test_judged_preflight_fails_on_a_judge_that_ignores_the_memory(tmp_path):
    judge = ScriptedJudge(content_score).__enter__()  # input-dependent scores, but not about the patient
    try:
        endpoint = write_endpoint(tmp_path, judge.port, write_rubric(tmp_path))
        parquet = write_parquet(tmp_path / "trajectories" / "train.parquet", _patient_steps())
        cfg = json.loads(json.dumps(CFG))
        cfg["preflight"].update(agreement_pairs=6, agreement_fail_below=0.9, agreement_warn_below=0.95)
        out = tmp_path / "train" / "preflight.json"
        with pytest.raises(CheckFailed, match=r"judge agreement: the judge ranked a patient's reference memory above "
                                              r"a wrong one in \d/6 pairs"):
            run_preflight(str(parquet), str(endpoint), str(out), str(tmp_path / "audit"), cfg)
        saved = json.loads(out.read_text())
        assert saved["judge_agreement"]["pairs"] == 6 and saved["judge_agreement"]["verdict"] == "fail"
    finally:
        judge.__exit__(None, None, None)
    # a judge that reads the memory passes the same preflight, its agreement in preflight.json
    judge = ScriptedJudge(reading_judge).__enter__()
    try:
        endpoint = write_endpoint(tmp_path, judge.port, write_rubric(tmp_path))
        cfg["preflight"]["min_distinct_rewards"] = 2
        report = run_preflight(str(parquet), str(endpoint), str(out), str(tmp_path / "audit"), cfg)
    finally:
        judge.__exit__(None, None, None)
    assert report["ok"] and report["judge_agreement"]["rate"] == 1.0


@pytest.mark.parametrize("over,message", [
    ({"agreement_fail_below": 0.8, "agreement_warn_below": 0.6}, "preflight.agreement_fail_below (0.8) <= "),
    ({"agreement_pairs": -1}, "preflight.agreement_pairs: Input should be greater than or equal to 0"),
    ({"on_problem": "ignore"}, "preflight.on_problem: Input should be 'fail' or 'warn'"),
    ({"rows": 8, "row": 9}, "preflight.row: Extra inputs are not permitted"),
])
def test_bad_agreement_thresholds_are_one_line(over, message):
    from llmrnn.errors import InputError
    from llmrnn.preflight import preflight_settings

    with pytest.raises(InputError, match="^" + re.escape(message)):
        preflight_settings(over)


@pytest.mark.e2e  # a slow tier test (a workflow, CLI or training run of its own): `make test-e2e`
@pytest.mark.slow
def test_workflow_runs_the_judge_agreement_beside_an_outcome_run(workflow_dir, tiny_model_dir):
    """Real snakemake, reward.mode outcome: rule judge_agreement starts the judge service for itself alone,
    writes agreement.json (whatever the random tiny judge's verdict, it never fails the run) and the
    report figure; the service is gone afterwards and preflight/train_grpo were never involved."""
    rubric = write_rubric(workflow_dir / "config", score_method="expected", prefix="Score:",
                          model=str(tiny_model_dir), source="path", max_tokens=2)
    run = workflow_dir / "results" / "t"
    write_parquet(run / "trajectories" / "train.parquet", _patient_steps())
    (workflow_dir / "agree.yaml").write_text(json.dumps({
        "run_name": "t", "judge": {"rubric": str(rubric.relative_to(workflow_dir))},
        "reward": {"mode": "outcome"}, "preflight": {"agreement_pairs": 4},
    }))
    # layered on the demo (a file named alone would get the schema's reference split sizes)
    proc = snakemake(workflow_dir, "--configfile", "config/config.yaml", "agree.yaml", "--allowed-rules", "judge_server", "judge_agreement",
                     "judge_agreement_plot", "--", "results/t/judge/plots/judge_agreement.png", check=False)
    assert proc.returncode == 0, proc.stderr[-3000:]
    report = json.loads((run / "judge" / "agreement.json").read_text())
    assert report["pairs"] == 4 and report["mode"] == "scalar" and report["verdict"] in ("ok", "warn", "fail")
    assert report["training_reward_mode"] == "outcome" and "outcome" in report["why_training_reward"]
    assert (run / "judge" / "plots" / "judge_agreement.png").read_bytes().startswith(b"\x89PNG")
    log = (workflow_dir / "logs" / "t" / "judge_server.log").read_text()
    assert "judge healthy at http://127.0.0.1:" in log and _port_closed(log)
    assert not (run / "judge" / "endpoint.json").exists() and not (run / "train").exists()
