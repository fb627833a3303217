"""The qa recipe end to end: `snakemake all --configfile config/qa_demo.yaml` on CPU, with a second config
layer that swaps SmolLM2 for the tiny model and shrinks every size (the DAG and the code are the demo's),
then the rerun table of the qa knobs by dry runs."""

from __future__ import annotations

import json
import re
import subprocess
from dataclasses import dataclass
from pathlib import Path

import pytest
import yaml

from tests.conftest import copy_workflow, snakemake

QA_CORE_JOBS = {"qa_synth", "qa_data", "qa_sft", "qa_merge_sft", "qa_preflight", "qa_train_grpo", "merge_model",
                "release", "qa_eval_model", "qa_eval_gather", "qa_report"}


def small_layer(workdir, tiny, **qa_over) -> str:
    cfg = {
        "run_name": "qatest",
        "cohort": {"synthetic": {"patients": 10, "seed": 7}},
        "split": {"val_size": 2, "train_size": 3, "seed": 42},
        "models": {"tiny": {"source": "local", "path": str(tiny)}},
        "qa": {
            "model": "tiny",
            "split": {"val_size": 1, "test_size": 2, "seed": 42},
            "sft": {"max_steps": 3, "batch_size": 2, "max_length": 256, "lr": 1.0e-3},
            "eval": {"k": 2, "max_new_tokens": 12, "max_questions": 4,
                     "stats": {"bootstrap": {"samples": 200, "seed": 0}}},
            **qa_over,
        },
        "train": {"total_steps": 2, "max_response_length": 12, "max_prompt_length": 512, "lr": 1.0e-3,
                  "fail_on_zero_gradient": False,  # a tiny model: plumbing, not learning
                  "save_freq": 1},
        "release": {"base_model": "tiny-random-llama"},
    }
    name = f"layer_{len(list(workdir.glob('layer_*.yaml')))}.yaml"
    (workdir / name).write_text(yaml.safe_dump(cfg))
    return name


def planned(workdir, *configfiles) -> dict[str, int]:
    out = snakemake(workdir, "all", "-n", "--configfile", "config/qa_demo.yaml", *configfiles).stdout
    if "Nothing to be done" in out:
        return {}
    table = out.split("Job stats:", 1)[1].split("total", 1)[0]
    return {m.group(1): int(m.group(2)) for m in re.finditer(r"^(\w+)\s+(\d+)\s*$", table, re.MULTILINE)}


@dataclass
class QaRun:
    work: Path  # a workflow copy where `all` of the small layer has run
    layer: str  # that layer's file name in work
    jobs: dict[str, int]  # the dry run of `all` before the run


@pytest.fixture(scope="module")
def qa_run(tmp_path_factory, tiny_model_dir) -> QaRun:
    """The qa demo's `all` on the small layer, run once for the module: the exact-match run and the judged
    one (its judge grading layered on top) read it. Each test works in a copy (qa_copy)."""
    work = copy_workflow(tmp_path_factory.mktemp("qa-run"))
    layer = small_layer(work, tiny_model_dir)
    jobs = planned(work, layer)
    snakemake(work, "all", "--configfile", "config/qa_demo.yaml", layer)
    return QaRun(work, layer, jobs)


@pytest.fixture
def qa_copy(qa_run, tmp_path) -> Path:
    """A copy of the finished run for one test (cp -a keeps the mtimes Snakemake compares)."""
    copy = tmp_path / "work"
    subprocess.run(["cp", "-a", str(qa_run.work), str(copy)], check=True)
    return copy


@pytest.mark.slow
@pytest.mark.e2e  # a whole-workflow run: `make test-e2e` (the fast-feedback tiers)
def test_qa_demo_runs_end_to_end_and_reruns_by_the_table(qa_run, qa_copy, tiny_model_dir):
    workflow_dir, layer, jobs = qa_copy, qa_run.layer, qa_run.jobs
    assert QA_CORE_JOBS <= set(jobs) and jobs["qa_eval_model"] == 6  # 3 models x (test, ood)
    assert not {"dump_trajectories", "train_grpo", "eval_shard", "judge_server"} & set(jobs)
    assert not {"clean_cohort", "split_cohort"} & set(jobs)  # the release guards the QA data, not the cohort

    run = workflow_dir / "results/qatest"
    splits = json.loads((run / "qa/splits.json").read_text())
    assert splits["overlap"] == 0 and splits["sizes"]["test"] > 0 and splits["sizes"]["ood"] > 0
    assert splits["checks"]["states_correct_option"] == {"train": 0, "val": 0, "test": 0, "ood": 0}
    assert splits["checks"]["repeats_train_question"] == {"val": 0, "test": 0, "ood": 0}

    for check in (run / "qa/sft/merge_check.json", run / "merge_check.json"):
        report = json.loads(check.read_text())
        assert report["ok"] and report["checks"]["weights_differ"]["ok"], check
    # GRPO started from the merged SFT model, not from the base
    assert json.loads((run / "merge_check.json").read_text())["base"].endswith("qa/sft/merged")

    metrics = json.loads((run / "eval/metrics.json").read_text())
    assert set(metrics["splits"]) == {"test", "ood"}
    for split in ("test", "ood"):
        assert set(metrics["splits"][split]) == {"base", "sft", "grpo"}
        for variant, m in metrics["splits"][split].items():
            assert m["greedy_pass@1"]["mode"] == "greedy: temperature 0, n 1"
            assert m["sampling_pass@k"]["mode"].startswith("sampling: temperature 0.8") and "n 2" in \
                m["sampling_pass@k"]["mode"]
            lo, hi = m["greedy_pass@1"]["ci95"]
            assert 0 <= lo <= m["greedy_pass@1"]["value"] <= hi <= 1
            assert {"sampling_pass@1", "sampling_pass@2", "sampling_maj@1", "sampling_maj@2"} <= set(m)
            assert m["sampling_pass@2"]["value"] == pytest.approx(m["sampling_pass@k"]["value"])
            assert m["greedy_pass@1"]["chance"]["uniform_guess"] == 0.25  # 4 options
            assert m["sampling_pass@2"]["chance"]["most_common_train_answer"] is not None
            # each metric counts its questions' own answers: greedy correct, and any of the k samples correct
            answers = [json.loads(x) for x in (run / f"eval/{variant}/{split}.jsonl").read_text().splitlines()[1:]]
            assert answers and m["sampling_pass@k"]["n"] == m["greedy_pass@1"]["n"] == len(answers)
            assert m["greedy_pass@1"]["correct"] == sum(a["greedy"]["correct"] for a in answers)
            assert m["sampling_pass@k"]["correct"] == sum(any(x["correct"] for x in a["samples"]) for a in answers)
    comparison = json.loads((run / "eval/comparison.json").read_text())
    assert set(comparison["splits"]["test"]) == {"sft_vs_base", "grpo_vs_base", "grpo_vs_sft"}
    for pair in comparison["splits"]["test"].values():
        assert 0 <= pair["greedy_pass@1"]["mcnemar"]["p_value"] <= 1 and pair["greedy_pass@1"]["n_pairs"] > 0

    per_question = [json.loads(x) for x in (run / "eval/grpo/test.jsonl").read_text().splitlines()]
    assert per_question[0]["header"]["variant"] == "grpo" and len(per_question[1]["samples"]) == 2
    assert (run / "eval/plots/pass_at_k.png").read_bytes().startswith(b"\x89PNG")
    summary = (run / "eval/plots/summary.tsv").read_text()
    assert "greedy_pass@1" in summary and "sampling_pass@k" in summary and "grpo_vs_sft" in summary
    assert "sampling_maj@2" in summary and "chance_uniform_guess" in summary.splitlines()[0]

    rows = [json.loads(x) for x in (run / "train/metrics.jsonl").read_text().splitlines()]
    train = [r for r in rows if r["kind"] == "train"]
    assert len(train) == 2 and all(r["truncation_rate"] is not None and r["response_length_mean"] for r in train)
    assert sorted(p.name for p in (run / "train/samples").iterdir()) == ["step_000001.jsonl", "step_000002.jsonl"]
    assert (run / "release/MANIFEST.json").is_file()
    guard = json.loads((run / "release/upload_receipt.json").read_text())["phi_guard"]
    assert guard["ok"] and guard["reference"] == "qa", guard["findings"]
    assert guard["identifiers_checked"] > 0 and guard["clinical_texts_checked"] >= splits["sizes"]["train"]
    assert planned(workflow_dir, layer) == {}

    # cost per stage (rules/cost.smk, outside all) from this run's benchmark files, in its report
    snakemake(workflow_dir, "cost_report", "--configfile", "config/qa_demo.yaml", layer)
    stages = {line.split("\t")[0]: line.split("\t") for line in (run / "report/cost.tsv").read_text().splitlines()}
    assert {"qa_sft", "qa_train_grpo", "qa_eval_model", "release", "total"} <= set(stages)
    assert stages["qa_eval_model"][1] == "6" and float(stages["qa_train_grpo"][2]) > 0  # jobs, wall s
    snakemake(workflow_dir, "--report", "report.html", "cost_report", "--configfile", "config/qa_demo.yaml", layer)
    html = (workflow_dir / "report.html").read_text(errors="replace")
    assert "filename=cost.html;" in html and "filename=cost.png;" in html and "filename=pass_at_k.png;" in html
    assert planned(workflow_dir, layer) == {}  # the cost report reran nothing

    # rerun table (dry runs): an SFT knob reruns SFT onwards, an eval knob the evaluation only,
    # a data knob everything from the data stage, a reward knob GRPO onwards (not SFT)
    sft = planned(workflow_dir, small_layer(workflow_dir, tiny_model_dir, sft={
        "max_steps": 3, "batch_size": 2, "max_length": 256, "lr": 5.0e-4}))
    assert {"qa_sft", "qa_merge_sft", "qa_train_grpo", "merge_model", "release"} <= set(sft)
    assert "qa_data" not in sft and sft["qa_eval_model"] == 4  # sft + grpo on test and ood; base kept
    evals = planned(workflow_dir, small_layer(workflow_dir, tiny_model_dir, eval={
        "k": 3, "max_new_tokens": 12, "max_questions": 4, "stats": {"bootstrap": {"samples": 200, "seed": 0}}}))
    assert set(evals) == {"qa_eval_model", "qa_eval_gather", "qa_report", "all"} and evals["qa_eval_model"] == 6
    reward = planned(workflow_dir, small_layer(workflow_dir, tiny_model_dir, reward={
        "weights": {"exact_match": 1.0, "format": 0.5, "fluency": 0.1}}))
    assert "qa_train_grpo" in reward and "qa_sft" not in reward and reward["qa_eval_model"] == 2
    data = planned(workflow_dir, small_layer(workflow_dir, tiny_model_dir, split={
        "val_size": 1, "test_size": 2, "seed": 43}))
    assert {"qa_data", "qa_sft", "qa_train_grpo"} <= set(data) and "qa_synth" not in data


def test_qa_eval_gets_the_prompt_and_gather_the_train_split(workflow_dir, tiny_model_dir):
    """Dry run: the evaluation asks in qa.prompt.system (a change reruns it), and gather reads the train
    split for the always-the-most-common-answer baseline."""
    layer = small_layer(workflow_dir, tiny_model_dir, prompt={"system": "You are QA-bot 7."})
    out = snakemake(workflow_dir, "all", "-n", "-p", "--configfile", "config/qa_demo.yaml", layer).stdout
    evals = [ln for ln in out.splitlines() if "llmrnn qa eval " in ln]
    assert evals and all("QA-bot 7" in ln for ln in evals)
    gather = [ln for ln in out.splitlines() if "llmrnn qa gather " in ln]
    assert len(gather) == 1 and "--train" in gather[0] and "qa/train.jsonl" in gather[0]


def test_qa_reproduce_names_an_ood_set_or_says_why_not():
    from tests.conftest import REPO

    text = (REPO / "config/qa_reproduce.yaml").read_text()
    qa = yaml.safe_load(text)["qa"]
    if qa.get("ood"):
        return
    lines = text.splitlines()
    at = next(i for i, ln in enumerate(lines) if ln.strip().startswith("ood:"))
    reason = " ".join(ln.strip() for ln in lines[max(0, at - 4):at] if ln.strip().startswith("#"))
    assert "OOD" in reason and "because" in reason.lower() or "on purpose" in reason, reason


@pytest.mark.e2e
def test_qa_answers_are_judge_graded_by_a_judge_of_their_own(qa_copy, tiny_model_dir, smollm2_dir):
    """qa.eval.judge: true on CPU: after the six evaluations a second judge instance (SmolLM2-135M, the real
    llmrnn judge server) grades every answer; metrics, comparison and the report carry the judged metrics
    beside exact match. The judge's knobs and rubric regrade without regenerating or retraining. Turned on
    over the module's finished exact-match run, the judge grades the answers it has: nothing upstream reruns."""
    workflow_dir = qa_copy
    evals = {"k": 2, "max_new_tokens": 12, "max_questions": 4, "judge": True,
             "stats": {"bootstrap": {"samples": 200, "seed": 0}}}
    layer = small_layer(workflow_dir, tiny_model_dir, eval=evals)
    (workflow_dir / "judge_layer.yaml").write_text(yaml.safe_dump({
        "models": {"smollm2-135m-instruct": {"source": "local", "path": str(smollm2_dir)}},
        "judge": {"rubric": "config/rubrics/qa_correctness_smollm2.yaml"}}))
    jobs = planned(workflow_dir, layer, "judge_layer.yaml")
    assert jobs["qa_eval_judge_server"] == 1 and jobs["qa_judge_eval"] == 1
    assert "judge_server" not in jobs  # training's reward asks no judge: only the grading starts one
    regrade = {"qa_eval_judge_server", "qa_judge_eval", "qa_eval_gather", "qa_report", "all"}
    # the answers of the exact-match run are graded, not generated again; the judge's model is prepared, and
    # the release card, whose knobs list the models, is written again
    assert set(jobs) == regrade | {"prepare_base_model", "release"}

    snakemake(workflow_dir, "all", "--configfile", "config/qa_demo.yaml", layer, "judge_layer.yaml")
    run = workflow_dir / "results/qatest"
    metrics = json.loads((run / "eval/metrics.json").read_text())
    for split in ("test", "ood"):
        for variant, m in metrics["splits"][split].items():
            judged = [json.loads(x) for x in (run / f"eval/{variant}/{split}.judged.jsonl").read_text().splitlines()]
            assert judged[0]["header"]["judge"] is True and len(judged) == len(
                (run / f"eval/{variant}/{split}.jsonl").read_text().splitlines())
            assert m["judge_greedy_pass@1"]["correct"] == sum(r["greedy"]["judge_correct"] for r in judged[1:])
            assert "judge" in m["judge_greedy_pass@1"]["mode"] and m["judge_fallback_rate"]["value"] <= 0.25
    comparison = json.loads((run / "eval/comparison.json").read_text())
    assert "judge_greedy_pass@1" in comparison["splits"]["test"]["grpo_vs_base"]
    assert "\tjudge_greedy_pass@1\t" in (run / "eval/plots/summary.tsv").read_text()
    assert any((run / "eval/judge/audit").iterdir())

    # the judge's threshold and its rubric regrade; the answers and the models stay
    stricter = small_layer(workflow_dir, tiny_model_dir, eval={**evals, "judge_threshold": 0.9})
    assert set(planned(workflow_dir, stricter, "judge_layer.yaml")) == regrade
    rubric = workflow_dir / "config/rubrics/qa_correctness_smollm2.yaml"
    rubric.write_text(rubric.read_text().replace("1 = wrong or no answer.", "1 = wrong, or no answer at all."))
    assert set(planned(workflow_dir, layer, "judge_layer.yaml")) == regrade
