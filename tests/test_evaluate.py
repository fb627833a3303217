"""Held-out metrics on handcrafted predictions: grading, Acc@1/Acc@5, per-visit accuracy, unparsable rates,
memory length, comparison vs base; and sharding does not change the metrics."""

from __future__ import annotations

import json

import pytest

from llmrnn import evaluate, io
from llmrnn.errors import InputError

CFG = {
    "final_judge": {"mode": "matcher", "matcher": {"threshold": 0.5, "primary_target": "first"}},
    "grade_visits": "all",
    "stats": {"bootstrap": {"samples": 2000, "seed": 0}, "mcnemar_exact_below": 25},
}
TRUTH = ["congestive heart failure", "type 2 diabetes mellitus"]
RIGHT = {"primary_diagnosis": "CHF", "top_5_diagnoses": ["CHF", "anemia"]}
TOP5_ONLY = {"primary_diagnosis": "anemia", "top_5_diagnoses": ["anemia", "T2DM"]}
WRONG = {"primary_diagnosis": "hip fracture", "top_5_diagnoses": ["hip fracture"]}


def visit(i, prediction, memory=None, ok=True):
    return {
        "visit_index": i,
        "visit_id": f"v{i}",
        "ground_truth": TRUTH,
        "prediction": prediction if ok else None,
        "prediction_ok": ok,
        "evaluation_ok": True,
        "memory_ok": None if memory is None else True,
        "memory_words": None if memory is None else evaluate.memory_words(memory),
    }


def patient(pid, last, n_visits=3, memory='{"evolving_summary": "one two three four"}', first_ok=True):
    visits = [visit(i, WRONG, memory, ok=first_ok if i == 0 else True) for i in range(n_visits - 1)]
    visits.append(visit(n_visits - 1, last, memory))
    return {"patient_id": pid, "variant": "x", "visits": visits}


@pytest.fixture
def records():
    # base: 2 of 6 primary right, 3 of 6 top-5 right; trained: 5 of 6 primary right, 6 of 6 top-5 right
    base = [patient(f"p{i}", p) for i, p in enumerate([RIGHT, RIGHT, TOP5_ONLY, WRONG, WRONG, WRONG])]
    trained = [patient(f"p{i}", p, first_ok=i != 0) for i, p in enumerate([RIGHT] * 5 + [TOP5_ONLY])]
    judge = evaluate.FinalJudge(CFG["final_judge"])
    return {
        "base": evaluate.grade_records(base, judge),
        "trained": evaluate.grade_records(trained, judge),
    }


def write(tmp_path, records, shards):
    out = {}
    for variant, recs in records.items():
        for k in range(shards):
            path = tmp_path / f"{variant}_{shards}_{k}.jsonl"
            io.write_jsonl(path, recs[k::shards])  # any split of the patients
            out.setdefault(variant, []).append(path)
    return out


def test_metrics_on_handcrafted_predictions(tmp_path, records):
    metrics, comparison = evaluate.gather(write(tmp_path, records, 1), CFG)
    base, trained = metrics["variants"]["base"], metrics["variants"]["trained"]
    assert (base["acc_at_1"]["correct"], base["acc_at_5"]["correct"], base["n_patients"]) == (2, 3, 6)
    assert base["acc_at_1"]["value"] == pytest.approx(2 / 6)
    assert trained["acc_at_1"]["value"] == pytest.approx(5 / 6)
    assert trained["acc_at_5"]["value"] == 1.0
    lo, hi = base["acc_at_1"]["ci95"]
    assert lo < 2 / 6 < hi
    # earlier visits were all WRONG: per-visit accuracy is 0 there, the last index carries the result
    by_visit = {r["visit_index"]: r for r in trained["by_visit_index"]}
    assert by_visit[0]["acc_at_1"] == 0.0 and by_visit[2]["acc_at_1"] == pytest.approx(5 / 6)
    assert by_visit[0]["n"] == 6
    # one of 18 trained predictions was unparsable; every memory is 4 words
    assert trained["unparsable"]["prediction"] == {"rate": pytest.approx(1 / 18), "n": 18}
    assert base["unparsable"]["prediction"]["rate"] == 0.0
    assert trained["memory_words"]["mean"] == 4
    c = comparison["comparisons"]["trained"]
    assert c["a"] == "base" and c["b"] == "trained" and c["n_pairs"] == 6
    assert c["acc_at_1"]["diff"] == pytest.approx(3 / 6)
    assert c["acc_at_1"]["ci95"][0] <= 0.5 <= c["acc_at_1"]["ci95"][1]
    # McNemar: 3 patients only trained got right, none only base -> exact p = 2 * (1/2)^3 = 0.25
    mc = c["acc_at_1"]["mcnemar"]
    assert (mc["only_b_correct"], mc["only_a_correct"], mc["method"]) == (3, 0, "exact binomial")
    assert mc["p_value"] == pytest.approx(0.25)


def test_shards_gather_to_the_same_metrics_as_one_shard(tmp_path, records):
    one = evaluate.gather(write(tmp_path, records, 1), CFG)
    many = evaluate.gather(write(tmp_path, records, 4), CFG)
    assert json.dumps(one, sort_keys=True) == json.dumps(many, sort_keys=True)


def test_gather_refuses_unpaired_or_duplicated_patients(tmp_path, records):
    records["trained"] = records["trained"][:-1]
    with pytest.raises(InputError, match="different patients"):
        evaluate.gather(write(tmp_path, records, 1), CFG)
    records["trained"] = records["base"] + records["base"][:1]
    with pytest.raises(InputError, match="more than one shard"):
        evaluate.gather(write(tmp_path, records, 2), CFG)


def test_grade_last_visit_only(records):
    recs = [patient("q", RIGHT)]
    evaluate.grade_records(recs, evaluate.FinalJudge(CFG["final_judge"]), visits="last")
    assert recs[0]["visits"][0]["grade"] is None
    assert recs[0]["visits"][-1]["grade"]["primary_correct"] is True


def test_select_and_shard_patients():
    pts = [{"subject_id": i, "visits": [{}] * (1 + i % 3)} for i in range(10)]
    chosen = evaluate.select_patients(pts, 4, seed=1)
    assert len(chosen) == 4 and chosen == evaluate.select_patients(pts, 4, seed=1)
    assert [p["subject_id"] for p in chosen] == sorted(p["subject_id"] for p in chosen)
    assert evaluate.select_patients(pts, None, seed=1) == pts
    parts = [evaluate.shard_of(pts, k, 3) for k in range(3)]  # the trajectories' policy: balanced by visits
    assert sorted(p["subject_id"] for part in parts for p in part) == list(range(10))
    assert {sum(len(p["visits"]) for p in part) for part in parts} <= {6, 7}
    assert [len(evaluate.shard_of(pts[:2], k, 3)) for k in range(3)] == [1, 1, 0]  # more shards than patients
    with pytest.raises(InputError, match="shard 3 out of range for 3 shards"):
        evaluate.shard_of(pts, 3, 3)


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ('{"primary_correct": true, "any_top5_correct": false}', (True, True, True)),
        ('Sure!\n```json\n{"primary_correct": "false", "any_top5_correct": "true"}\n```', (False, True, True)),
        ('{"diagnosis_evaluation": {"primary_correct": false, "any_top5_correct": false}}', (False, False, True)),
        ("I think it is correct.", (False, False, False)),
        ('{"primary_correct": "maybe", "any_top5_correct": true}', (False, False, False)),
    ],
)
def test_parse_judge_verdict(text, expected):
    v = evaluate.parse_judge_verdict(text)
    assert (v["primary_correct"], v["any_top5_correct"], v["judge_ok"]) == expected


def test_memory_words():
    assert evaluate.memory_words('{"evolving_summary": "a b c"}') == 3
    assert evaluate.memory_words("not json at all") == 4
    assert evaluate.memory_words(None) is None


# ----------------------------------------------------------------------------- real forward pass (tiny model)
def run_evaluate_cli(argv: list[str]) -> None:
    """`llmrnn evaluate ...` through the stage's own argparse registration."""
    import argparse

    parser = argparse.ArgumentParser()
    evaluate.register(parser.add_subparsers(dest="command", required=True))
    args = parser.parse_args(["evaluate", *argv])
    args.func(args)


@pytest.mark.e2e  # a slow tier test (a workflow, CLI or training run of its own): `make test-e2e`
@pytest.mark.slow
def test_real_shards_gather_to_the_same_metrics_as_one_shard(tmp_path, tiny_model_dir):
    """The tiny model through the real forward pass: 1 shard vs 3 shards give identical metrics."""
    from llmrnn.cohort import dump_cohort, synthesize_cohort

    test_split = tmp_path / "test.json"
    test_split.write_text(dump_cohort(synthesize_cohort(7, seed=3)))
    role = {"model": str(tiny_model_dir), "backend": "transformers", "temperature": 0.8, "top_p": 0.95,
            "max_tokens": 12, "batch_size": 4}
    cfg = {
        "eval": {"max_patients": 5, "patient_seed": 0, "seed": 11},
        "roles": {r: dict(role) for r in ("prediction", "evaluation", "memory")},
    }
    grade_cfg = json.dumps(CFG)
    results = {}
    for shards in (1, 3):
        graded = []
        for variant in ("base", "trained", "zero_shot"):
            for k in range(shards):
                shard = tmp_path / f"k{shards}" / variant / f"shard_{k}.jsonl"
                memory = ["--memory-model", str(tiny_model_dir)] if variant == "trained" else []
                run_evaluate_cli(["shard", "--test", str(test_split), "--variant", variant, *memory,
                                  "--shard", str(k), "--shards", str(shards), "--out", str(shard),
                                  "--prompts", str(evaluate_prompts_file()),
                                  "--cfg", json.dumps(cfg)])
                out = shard.with_name(f"graded_{k}.jsonl")
                run_evaluate_cli(["grade", "--shard", str(shard), "--out", str(out), "--cfg", grade_cfg])
                graded.append(str(out))
        metrics, comparison = tmp_path / f"m{shards}.json", tmp_path / f"c{shards}.json"
        run_evaluate_cli(["gather", "--graded", *graded, "--metrics", str(metrics), "--comparison",
                          str(comparison), "--cfg", grade_cfg])
        results[shards] = (json.loads(metrics.read_text()), json.loads(comparison.read_text()))
    assert results[1] == results[3]
    m = results[1][0]["variants"]
    assert set(m) == {"base", "trained", "zero_shot"}
    assert m["base"]["n_patients"] == 5
    # the memory variants wrote memories; zero_shot never calls the memory model
    assert m["base"]["memory_words"]["n"] > 0 and m["zero_shot"]["memory_words"] is None
    assert m["zero_shot"]["unparsable"]["memory"]["n"] == 0
    # same memory weights + same seeds -> base and trained agree pair by pair
    assert results[1][1]["comparisons"]["trained"]["acc_at_5"]["mcnemar"]["p_value"] == 1.0
    # not only the (mostly zero) accuracies: every raw output of the tiny model is the same, whatever the shard
    def raw_outputs(shards, variant):
        rows = [r for f in sorted((tmp_path / f"k{shards}" / variant).glob("shard_*.jsonl"))
                for r in io.read_jsonl(f)]
        return {r["patient_id"]: [(v["prediction_raw"], v["evaluation_raw"], v.get("memory_raw")) for v in r["visits"]]
                for r in rows}

    for variant in ("base", "zero_shot"):
        one = raw_outputs(1, variant)
        assert len(one) == 5 and any(v[0] for visits in one.values() for v in visits)
        assert raw_outputs(3, variant) == one


def test_replay_is_the_base_shard_of_the_same_patients(tmp_path, tiny_model_dir):
    """`evaluate shard --replay` refuses, in one line and before a model loads, a file of other patients and a
    variant that has nothing to replay (the base itself)."""
    from llmrnn.cohort import dump_cohort, synthesize_cohort

    test_split = tmp_path / "test.json"
    patients = synthesize_cohort(4, seed=3)
    test_split.write_text(dump_cohort(patients))
    role = {"model": str(tiny_model_dir), "backend": "transformers"}
    cfg = json.dumps({"eval": {"max_patients": None, "patient_seed": 0, "seed": 1},
                      "roles": {r: dict(role) for r in ("prediction", "evaluation", "memory")}})
    ids = [str(p["subject_id"]) for p in patients]

    def shard(variant: str, replayed: list[str]) -> None:
        replay = tmp_path / "base_shard_0.jsonl"
        io.write_jsonl(replay, [{"patient_id": pid, "visits": []} for pid in replayed])
        memory = ["--memory-model", str(tiny_model_dir)] if variant == "trained" else []
        run_evaluate_cli(["shard", "--test", str(test_split), "--variant", variant, *memory, "--replay", str(replay),
                          "--shard", "0", "--shards", "1", "--out", str(tmp_path / "shard_0.jsonl"),
                          "--prompts", str(evaluate_prompts_file()), "--cfg", cfg])

    with pytest.raises(InputError, match="is not of this shard's patients"):
        shard("trained", ids[:-1])
    with pytest.raises(InputError, match="--replay is for a memory model variant other than base"):
        shard("base", ids)
    assert not (tmp_path / "shard_0.jsonl").exists()


def evaluate_prompts_file():
    from pathlib import Path

    return Path(__file__).resolve().parents[1] / "config" / "prompts" / "llmrnn.yaml"


# ----------------------------------------------------------------------------- LLM final judge over HTTP
def test_llm_final_judge_through_the_openai_backend(monkeypatch):
    """A real OpenAI-compatible HTTP server on 127.0.0.1 whose judge MODEL is scripted (the fake part):
    prompts carry the prediction and ground truth, the key comes from the named environment variable,
    answers are parsed, a garbled answer counts as unparsable, unparsable predictions are not sent."""
    from tests.judge_helpers import KEY, ScriptedJudge, prompt_of

    def respond(body):
        text = prompt_of(body)
        if "garble" in text:
            return "I cannot decide."
        primary = '"primary_diagnosis": "anemia"' in text and "1. anemia" in text
        return json.dumps({"primary_correct": primary, "any_top5_correct": True})

    monkeypatch.setenv("TEST_FINAL_JUDGE_KEY", KEY)
    with ScriptedJudge(respond) as server:
        cfg = {
            "mode": "llm",
            "llm": {"url": f"http://127.0.0.1:{server.port}/v1", "model": "judge", "api_key_env": "TEST_FINAL_JUDGE_KEY",
                    "temperature": 0.0, "max_tokens": 32, "batch_size": 2, "timeout_s": 10},
        }
        judge = evaluate.FinalJudge(cfg)
        grades = judge.grade_many([
            ({"primary_diagnosis": "anemia", "top_5_diagnoses": ["anemia"]}, ["anemia", "ckd"]),
            ({"primary_diagnosis": "syncope", "top_5_diagnoses": ["anemia"]}, ["anemia"]),
            ({"primary_diagnosis": "garble", "top_5_diagnoses": []}, ["anemia"]),
            (None, ["anemia"]),
        ])
        assert server.hits == 3  # the unparsable prediction is graded wrong without a request
        assert server.bodies[0]["temperature"] == 0.0 and server.bodies[0]["model"] == "judge"
    assert [(g["primary_correct"], g["any_top5_correct"], g["judge_ok"]) for g in grades] == [
        (True, True, True),
        (False, True, True),
        (False, False, False),
        (False, False, True),
    ]
    assert judge.describe()["mode"] == "llm"


def test_an_llm_final_judge_that_stalls_midway_fails_after_stall_s(monkeypatch):
    """The eval's LLM judge (the openai backend) answers its first requests, then accepts the rest and answers
    none: grading fails after eval.final_judge.llm.stall_s with one line naming it, not timeout_s x retries."""
    import threading
    import time

    from llmrnn.backends import BackendError
    from tests.judge_helpers import KEY, ScriptedJudge

    lock, seen = threading.Lock(), [0]

    def respond(body):
        with lock:
            seen[0] += 1
            stall = seen[0] > 2
        if stall:
            time.sleep(120)
        return json.dumps({"primary_correct": True, "any_top5_correct": True})

    monkeypatch.setenv("TEST_FINAL_JUDGE_KEY", KEY)
    with ScriptedJudge(respond) as server:
        judge = evaluate.FinalJudge({"mode": "llm", "llm": {
            "url": f"http://127.0.0.1:{server.port}/v1", "model": "judge", "api_key_env": "TEST_FINAL_JUDGE_KEY",
            "batch_size": 2, "concurrency": 2, "timeout_s": 300, "stall_s": 1}})
        t0 = time.monotonic()
        with pytest.raises(BackendError, match=r"has stalled: .*after 2 answer\(s\).*eval\.final_judge\.llm\.stall_s 1\b"):
            judge.grade_many([({"primary_diagnosis": f"d{i}", "top_5_diagnoses": []}, ["anemia"]) for i in range(6)])
        assert time.monotonic() - t0 < 60  # stall_s, not 300 s x 5 tries


def test_llm_final_judge_missing_key_is_one_clear_error(monkeypatch):
    monkeypatch.delenv("NOPE_KEY", raising=False)
    judge = evaluate.FinalJudge({"mode": "llm", "llm": {"url": "http://127.0.0.1:9/v1", "model": "m",
                                                         "api_key_env": "NOPE_KEY"}})
    with pytest.raises(InputError, match="NOPE_KEY"):
        judge.grade_many([({"primary_diagnosis": "x"}, ["y"])])


# ----------------------------------------------------------------------------- memory recall (judge-free)
def with_memories(record, summaries):
    """Set h_prev of visits 1.. to the given evolving summaries (what the prediction model was shown)."""
    for v, text in zip(record["visits"][1:], summaries):
        v["h_prev"] = json.dumps({"evolving_summary": text})
    return record


def test_memory_recall_per_variant_and_paired_test(tmp_path, records):
    # TRUTH = [congestive heart failure, type 2 diabetes mellitus] at every visit
    for rec in records["base"]:
        with_memories(rec, ["none", "congestive heart failure"])  # transitions 0 and 0.5 -> 0.25
    for i, rec in enumerate(records["trained"]):
        full = "congestive heart failure; type 2 diabetes mellitus"
        with_memories(rec, [full, full] if i < 5 else ["none", "none"])  # 1.0 for five, 0.0 for p5
    metrics, comparison = evaluate.gather(write(tmp_path, records, 2), CFG)
    base = metrics["variants"]["base"]["memory_recall"]
    assert base["value"] == pytest.approx(0.25)
    assert base["by_visit_index"] == {"1": pytest.approx(0.0), "2": pytest.approx(0.5)}
    assert (base["n_patients"], base["n_transitions"]) == (6, 12)
    assert metrics["variants"]["trained"]["memory_recall"]["value"] == pytest.approx(5 / 6)
    mr = comparison["comparisons"]["trained"]["memory_recall"]
    assert (mr["a"], mr["b"], mr["n_pairs"]) == (pytest.approx(0.25), pytest.approx(5 / 6), 6)
    assert mr["diff"] == pytest.approx(5 / 6 - 0.25)
    assert mr["ci95"][0] < mr["diff"] < mr["ci95"][1] + 1e-12
    w = mr["wilcoxon"]
    assert (w["b_better"], w["a_better"], w["n_nonzero"]) == (5, 1, 6)
    # exact two-sided signed-rank p for ranks: the one negative difference (0.25) has the smallest rank
    assert w["p_value"] == pytest.approx(2 * 2 / 64)


def test_memory_recall_of_baselines_uses_what_was_shown():
    none_shown = with_memories(patient("p0", RIGHT), ["none", "none"])
    history = patient("p0", RIGHT)
    history["visits"][2]["memory_shown"] = "Visit 1: ... DISCHARGE DIAGNOSES: congestive heart failure; type 2 diabetes mellitus"
    assert evaluate.recall_by_patient([none_shown]) == {"p0": 0.0}
    assert evaluate.recall_by_patient([history]) == {"p0": pytest.approx(0.5)}  # visit 1 shown nothing
    assert evaluate.memory_recall_metrics([patient("p1", RIGHT, n_visits=1)]) is None


def test_wilcoxon_signed_rank_all_equal_is_not_a_finding():
    from llmrnn.stats import wilcoxon_signed_rank

    assert wilcoxon_signed_rank([0.5, 0.2], [0.5, 0.2])["p_value"] == 1.0
    with pytest.raises(ValueError):
        wilcoxon_signed_rank([0.1], [0.1, 0.2])


# ----------------------------------------------------------------------------- patient specificity (control)
OWN = ["asthma", "gout", "psoriasis", "epilepsy", "glaucoma", "migraine"]


def cohort_with_memories(summary_of) -> list[dict]:
    """Six patients: visit t >= 1 of patient i has diagnoses [OWN[i], hypertension] (hypertension is common to
    all); the memory shown at each visit is summary_of(i)."""
    out = []
    for i, own in enumerate(OWN):
        rec = patient(f"p{i}", RIGHT)
        for v in rec["visits"]:
            v["ground_truth"] = [own, "hypertension"]
        out.append(with_memories(rec, [summary_of(i)] * 2))
    return out


def test_specificity_separates_remembering_the_patient_from_listing_common_conditions(tmp_path):
    """Two memories with the same recall gain over base: one names the patient's own condition (specific),
    the other lists every condition in the cohort (its recall against other patients is as high)."""
    judge = evaluate.FinalJudge(CFG["final_judge"])
    variants = {
        "base": cohort_with_memories(lambda i: "hypertension"),                       # own 0.5, other 0.5
        "trained": cohort_with_memories(lambda i: f"{OWN[i]}; hypertension"),          # own 1.0, other 0.5
        "zero_shot": cohort_with_memories(lambda i: "; ".join([*OWN, "hypertension"])),  # own 1.0, other 1.0
    }
    records = {k: evaluate.grade_records(v, judge) for k, v in variants.items()}
    metrics, comparison = evaluate.gather(write(tmp_path, records, 2), CFG)
    spec = {v: metrics["variants"][v]["memory_specificity"] for v in variants}
    assert (spec["base"]["own_recall"], spec["base"]["other_recall"], spec["base"]["gap"]) == (0.5, 0.5, 0.0)
    assert (spec["trained"]["own_recall"], spec["trained"]["other_recall"]) == (1.0, 0.5)
    assert spec["zero_shot"]["gap"] == 0.0 and spec["zero_shot"]["own_recall"] == 1.0
    assert spec["trained"]["others_per_patient"] == 20 and spec["trained"]["n_transitions"] == 12
    # the same recall gain, but only the specific memory widens the gap, with its paired test
    for v in ("trained", "zero_shot"):
        assert comparison["comparisons"][v]["memory_recall"]["diff"] == pytest.approx(0.5)
    ms = comparison["comparisons"]["trained"]["memory_specificity"]
    assert (ms["a"], ms["b"], ms["diff"], ms["n_pairs"]) == (0.0, 0.5, 0.5, 6)
    assert (ms["a_other_recall"], ms["b_other_recall"]) == (0.5, 0.5)
    assert ms["wilcoxon"]["b_better"] == 6 and ms["wilcoxon"]["p_value"] == pytest.approx(2 / 64)
    assert comparison["comparisons"]["zero_shot"]["memory_specificity"]["diff"] == 0.0


def test_other_patients_are_a_fixed_seeded_sample_shared_by_variants():
    pids = [f"p{i}" for i in range(30)]
    first = evaluate.other_patients(pids, "p3", 5, seed=0)
    assert len(first) == 5 and "p3" not in first
    assert first == evaluate.other_patients(list(reversed(pids)), "p3", 5, seed=0)  # order of records irrelevant
    assert first != evaluate.other_patients(pids, "p3", 5, seed=1)
    assert evaluate.other_patients(pids, "p3", None, seed=0) == sorted(set(pids) - {"p3"})
    # a sample of others: own recall unchanged, the other-patient recall is over the chosen ones only
    recs = cohort_with_memories(lambda i: f"{OWN[i]}; hypertension")
    few = evaluate.specificity_by_patient(recs, {"others": 1, "seed": 0})
    assert all(p["own"] == 1.0 and p["other"] == 0.5 for p in few.values())


KILLED_SHARD = """
import sys
from llmrnn.cli import main
import llmrnn.kept as kept
kept.CHUNK_PATIENTS = 2
sys.exit(main(sys.argv[1:]))
"""


@pytest.mark.slow
@pytest.mark.e2e  # three tiny forward passes: about 2 min on a loaded 2-core machine
def test_killed_shard_continues_from_its_finished_rows(tmp_path, tiny_model_dir, monkeypatch):
    """A shard killed mid-way (SIGKILL after its first chunk of patients was written) and rerun writes exactly
    the rows of an uninterrupted run: none lost, none twice; the rerun does not redo the kept chunk."""
    import os
    import signal
    import subprocess
    import sys
    import time
    from pathlib import Path

    from llmrnn import evaluate as evaluate_mod
    from llmrnn import kept as kept_mod
    from llmrnn.cohort import dump_cohort, synthesize_cohort

    test_split = tmp_path / "test.json"
    test_split.write_text(dump_cohort(synthesize_cohort(7, seed=3)))
    role = {"model": str(tiny_model_dir), "backend": "transformers", "temperature": 0.8, "top_p": 0.95,
            "max_tokens": 12, "batch_size": 4}
    cfg = json.dumps({"eval": {"max_patients": 6, "patient_seed": 0, "seed": 11},
                      "roles": {r: dict(role) for r in ("prediction", "evaluation", "memory")}})

    def argv(out):
        return ["shard", "--test", str(test_split), "--variant", "base", "--shard", "0", "--shards", "1",
                "--out", str(out), "--prompts", str(evaluate_prompts_file()), "--cfg", cfg]

    monkeypatch.setattr(kept_mod, "CHUNK_PATIENTS", 2)
    whole = tmp_path / "whole" / "shard_0.jsonl"
    run_evaluate_cli(argv(whole))
    assert not Path(f"{whole}.partial").exists()

    out = tmp_path / "killed" / "shard_0.jsonl"
    partial = Path(f"{out}.partial")
    proc = subprocess.Popen([sys.executable, "-c", KILLED_SHARD, "evaluate", *argv(out)],
                            env=dict(os.environ, OMP_NUM_THREADS="1"), stdout=subprocess.DEVNULL,
                            stderr=subprocess.DEVNULL)
    deadline = time.time() + 300
    while not (partial.exists() and len(partial.read_text().splitlines()) >= 2):  # header + chunk 0
        assert proc.poll() is None, "the shard ended before it was killed"
        assert time.time() < deadline
        time.sleep(0.02)
    proc.send_signal(signal.SIGKILL)
    proc.wait()
    assert not out.exists()
    kept = len(partial.read_text().splitlines()) - 1
    assert 1 <= kept < 3
    with open(partial, "a") as fh:  # and a write the kill tore in half
        fh.write('{"chunk": ' + str(kept) + ', "rows": [{"subj')

    calls = []
    real = evaluate_mod.run_shard
    monkeypatch.setattr(evaluate_mod, "run_shard", lambda part, *a, **k: calls.append(len(part)) or real(part, *a, **k))
    run_evaluate_cli(argv(out))
    assert sum(calls) == 6 - 2 * kept  # only the patients not kept were run again
    assert out.read_text() == whole.read_text()
    assert len(out.read_text().splitlines()) == 6 and not partial.exists()


def test_memprompt_is_a_baseline_of_its_own_memory_mode():
    from llmrnn.evaluate.recall import BASELINES, variant_mode
    from llmrnn.rnn import MEMORY_MODES

    assert variant_mode("memprompt") == "memprompt" and "memprompt" in MEMORY_MODES
    assert set(BASELINES.values()) <= set(MEMORY_MODES)
    # eval's memory recall scores what memprompt showed (its stored errors), not h
    shown = {"visit_index": 1, "ground_truth": TRUTH, "h_prev": '{"evolving_summary": "nothing"}',
             "memory_shown": "Visit 1: predicted anemia; the visit's diagnoses were congestive heart failure"}
    assert evaluate.recall_by_patient([{"patient_id": "p", "visits": [shown]}]) == {"p": 0.5}
