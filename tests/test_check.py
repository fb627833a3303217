"""`llmrnn check`: every problem of a config and its inputs, listed at once, before anything is queued."""

from __future__ import annotations

import json
import os
import shutil
import subprocess

import pytest
import yaml

from llmrnn import check
from llmrnn.cli import main
from llmrnn.settings.train import Train
from tests.conftest import REPO


def _write(path, data):
    path.write_text(yaml.safe_dump(data))
    return str(path)


def test_default_config_passes(in_workflow, capsys):
    assert main(["check"]) == 0
    assert "llmrnn check: OK" in capsys.readouterr().out


def test_all_problems_listed_at_once(in_workflow, tmp_path, capsys):
    bad_cohort = tmp_path / "cohort.json"
    bad_cohort.write_text(json.dumps([{"subject_id": 1, "visits": [{"visit_id": 9}]}]))
    override = _write(tmp_path / "bad.yaml", {
        "split": {"seed": "forty-two", "val_sise": 3},             # two schema problems
        "cohort": {"source": str(bad_cohort)},                      # a record without its fields
        "release": {"upload": True, "repo_id": "not a repo"},      # no token, bad repo id
    })
    out = tmp_path / "report.json"
    assert main(["check", "--configfile", "config/config.yaml", override, "--out", str(out)]) == 1
    err = capsys.readouterr().err
    report = json.loads(out.read_text())
    assert report["ok"] is False
    problems = report["problems"]
    assert any(p.startswith("config: split") and "val_sise" in p for p in problems), problems
    assert any(p.startswith("config: split.seed") for p in problems), problems
    assert any(p.startswith("cohort.source:") and "record 0" in p for p in problems), problems  # not its id
    assert any("HF_TOKEN" in p for p in problems), problems
    assert any("release.repo_id" in p for p in problems), problems
    assert f"{len(problems)} problem(s)" in err
    for p in problems:
        assert f"  - {p}" in err


def test_missing_cohort_and_too_small_cohort(in_workflow, tmp_path):
    from llmrnn.cohort import dump_cohort, synthesize_cohort

    assert check.check_cohort({"cohort": {"source": "nope.json"}}) == [
        "cohort.source: nope.json does not exist (the cleaned cohort JSON in LLM-as-RNN format)"
    ]
    small = tmp_path / "small.json"
    small.write_text(dump_cohort(synthesize_cohort(5, seed=1)))
    problems = check.check_cohort({"cohort": {"source": str(small)}, "split": {"val_size": 4, "train_size": 6}})
    assert len(problems) == 1 and "split needs at least 11" in problems[0]


def test_model_folder_needs_weights_and_chat_template(tiny_model_dir, tmp_path):
    assert check.chat_template_problem(tiny_model_dir, "models.tiny") is None
    broken = tmp_path / "no-template"
    shutil.copytree(tiny_model_dir, broken)
    for name in ("chat_template.jinja", "chat_template.json"):
        (broken / name).unlink(missing_ok=True)
    tok = json.loads((broken / "tokenizer_config.json").read_text())
    tok.pop("chat_template", None)
    (broken / "tokenizer_config.json").write_text(json.dumps(tok))
    assert "no chat template" in check.chat_template_problem(broken, "models.x")
    assert "not a HF model folder" in check.chat_template_problem(tmp_path, "models.y")


def test_unprepared_hub_model_offline_is_a_problem(in_workflow):
    problems = check.check_models({"models": {"big": {"source": "hub", "repo_id": "org/never-downloaded"}},
                                   "roles": {"memory": {"model": "missing-name"}}})
    assert any("org/never-downloaded" in p and "HF_HUB_OFFLINE" in p for p in problems), problems
    assert any(p.startswith("roles.memory.model: missing-name") for p in problems), problems


def test_batch_geometry_and_profile_gpus(in_workflow, monkeypatch):
    pytest.importorskip("llmrnn.train.config")
    cfg = {"train": {"engine": "verl", "n_gpus_per_node": 4, "group_size": 8,
                     "batch": {"train": 16, "mini": 12, "micro_per_gpu": 4}}}
    problems = check.check_training(cfg)
    assert any("train.batch.train=16 is not a multiple of train.batch.mini=12" in p for p in problems), problems
    assert any("LLMRNN_TRAIN_GPUS=4" in p for p in problems), problems
    monkeypatch.setenv("LLMRNN_TRAIN_GPUS", "4")
    assert not any("LLMRNN_TRAIN_GPUS" in p for p in check.check_training(cfg))


def test_a_lora_dropout_verl_would_ignore_is_refused(in_workflow, capsys):
    """verl 0.7.1 and 0.9.1 build the actor's LoraConfig without lora_dropout (no setting for it): a nonzero
    train.lora.dropout under verl would train something else than the config says."""
    pytest.importorskip("llmrnn.train.config")
    lora = {"rank": 16, "alpha": 32, "dropout": 0.05}
    problems = check.check_training({"train": {"engine": "verl", "lora": lora}})
    assert [p for p in problems if p.startswith("train.lora.dropout: 0.05 under train.engine verl")], problems
    assert not any("lora.dropout" in p for p in check.check_training({"train": {"engine": "trl", "lora": lora}}))
    assert not any("lora.dropout" in p for p in check.check_training(
        {"train": {"engine": "verl", "lora": {**lora, "dropout": 0.0}}}))
    assert main(["check", "--configfile", "config/config.yaml", _write(in_workflow / "d.yaml", {
        "train": {"engine": "verl", "lora": lora}})]) == 1
    assert "  - train.lora.dropout: 0.05 under train.engine verl" in capsys.readouterr().err


def test_a_judge_no_job_starts_needs_no_model_nor_gpu(in_workflow, monkeypatch):
    """An undownloaded hub judge and a profile without a judge GPU are problems only where a job starts the
    judge: a judged reward, the memory head's judge-agreement check (on by default, also under the outcome
    reward), the QA answers' grading (qa.eval.judge); not reward.mode outcome with agreement_pairs 0, nor a
    QA reward without judge weight whose answers exact match grades."""
    monkeypatch.setenv("LLMRNN_JUDGE_GPUS", "0")
    train = Train(n_gpus_per_node=2, nnodes=1)
    monkeypatch.setenv("LLMRNN_TRAIN_GPUS", "2")
    rubric = {"rubric": "config/rubrics/rubric_v2_rubricarm_scalar.yaml"}  # RubricARM from the Hub, vLLM (1 GPU)
    scalar = {"judge": rubric, "reward": {"mode": "scalar"}}
    assert any("HF_HUB_OFFLINE" in p for p in check.check_judge(scalar)), check.check_judge(scalar)
    assert check.check_profile_gpus(scalar, train) == [
        "the judge needs 1 GPU(s) but profiles/slurm requests 0: export LLMRNN_JUDGE_GPUS=1"]
    outcome = {"judge": rubric, "reward": {"mode": "outcome"}, "preflight": {"agreement_pairs": 0}}
    assert check.check_judge(outcome) == [] and check.check_profile_gpus(outcome, train) == []
    needs_gpu = ["the judge needs 1 GPU(s) but profiles/slurm requests 0: export LLMRNN_JUDGE_GPUS=1"]
    agreement = {"judge": rubric, "reward": {"mode": "outcome"}}  # the agreement check starts the judge
    assert check.check_judge(agreement) and check.check_profile_gpus(agreement, train) == needs_gpu
    qa_exact = {"recipe": "qa", "judge": rubric, "qa": {"reward": {"weights": {"judge": 0}}}}
    assert check.check_judge(qa_exact) == [] and check.check_profile_gpus(qa_exact, train) == []
    qa_graded = {**qa_exact, "qa": {**qa_exact["qa"], "eval": {"judge": True}}}
    assert check.check_judge(qa_graded) and check.check_profile_gpus(qa_graded, train) == needs_gpu


VERL_ENVS = sorted(REPO.glob(".venv-verl-*/bin/python"))
VERL_PROBE = """
import json, sys
from llmrnn import check
from llmrnn.train import config as tcfg
good = tcfg.settings({"engine": "verl", "n_gpus_per_node": 2})
bad = tcfg.settings({"engine": "verl", "n_gpus_per_node": 2,
                      "verl": {"extra_overrides": ["trainer.no_such_key=1"]}})
print(json.dumps([check.check_verl_command(good), check.check_verl_command(bad)]))
"""


@pytest.mark.skipif(not VERL_ENVS, reason="no verl env (scripts/make_verl_env.sh makes .venv-verl-<version>)")
@pytest.mark.parametrize("python", VERL_ENVS, ids=[p.parts[-3] for p in VERL_ENVS])
def test_verl_command_composes_against_installed_verl(python):
    """The real verl config (0.7.1 / 0.9.x): our command composes; a typo'd pass-through key is caught."""
    env = dict(os.environ, PYTHONPATH=str(REPO / "src"))
    proc = subprocess.run([str(python), "-c", VERL_PROBE], capture_output=True, text=True, env=env,
                          timeout=300, check=False)
    assert proc.returncode == 0, proc.stderr[-3000:]
    good, bad = json.loads(proc.stdout.strip().splitlines()[-1])
    assert good == []
    assert len(bad) == 1 and "trainer.no_such_key" in bad[0], bad


@pytest.mark.e2e  # a slow tier test (a workflow, CLI or training run of its own): `make test-e2e`
def test_check_target_in_the_workflow(workflow_dir, monkeypatch):
    from tests.conftest import snakemake

    for var in ("HF_TOKEN", "HUGGING_FACE_HUB_TOKEN"):
        monkeypatch.delenv(var, raising=False)

    proc = snakemake(workflow_dir, "check")
    assert "llmrnn check: OK" in (workflow_dir / "logs" / "demo" / "check.log").read_text()
    bad = workflow_dir / "config" / "bad.yaml"
    bad.write_text(yaml.safe_dump({"release": {"upload": True}}))
    proc = snakemake(workflow_dir, "check", "--configfile", "config/config.yaml", "config/bad.yaml", check=False)
    assert proc.returncode != 0
    assert "HF_TOKEN" in (workflow_dir / "logs" / "demo" / "check.log").read_text()


def test_split_sizes_are_checked_against_the_cleaned_cohort(in_workflow, tmp_path):
    from llmrnn.cohort import dump_cohort, synthesize_cohort

    cohort = synthesize_cohort(12, seed=1)
    for p in cohort[:3]:  # 3 patients cleaning drops: 12 on file, 9 to split
        p["visits"][-1]["clinical_sections"]["discharge_diagnosis"] = ""
    path = tmp_path / "c.json"
    path.write_text(dump_cohort(cohort))
    problems = check.check_cohort({"cohort": {"source": str(path)}, "split": {"val_size": 4, "train_size": 6}})
    assert len(problems) == 1
    assert "has 9 patients after cleaning (12 before); split needs at least 11" in problems[0]
    assert check.check_cohort({"cohort": {"source": str(path)}, "split": {"val_size": 4, "train_size": 4}}) == []


def test_synthetic_cohort_size_is_checked(in_workflow):
    from llmrnn.cohort import clean_cohort, synthesize_cohort

    kept = len(clean_cohort(synthesize_cohort(10, seed=3))[0])
    cfg = {"cohort": {"source": "synthetic", "synthetic": {"patients": 10, "seed": 3}},
           "split": {"val_size": kept, "train_size": 1}}
    problems = check.check_cohort(cfg)
    assert len(problems) == 1 and f"synthetic has {kept} patients after cleaning" in problems[0]
    assert f"needs at least {kept + 2}" in problems[0]


def test_brace_in_cohort_path_is_refused(in_workflow, tmp_path):
    from llmrnn.cohort import dump_cohort, synthesize_cohort

    path = tmp_path / "cohort{x}.json"
    path.write_text(dump_cohort(synthesize_cohort(30, seed=1)))
    problems = check.check_cohort({"cohort": {"source": str(path)}, "split": {"val_size": 2, "train_size": 2}})
    assert len(problems) == 1 and "contains a brace, which Snakemake reads as a wildcard" in problems[0]


def test_multi_node_layouts_each_refused_with_one_line(in_workflow, tmp_path, monkeypatch):
    """train.nnodes > 1 runs (verl on a Ray cluster over the job's nodes) when the judge binds to an
    address the other nodes reach and the profile asks for the nodes; the rest is refused, one line each."""
    monkeypatch.setenv("LLMRNN_TRAIN_GPUS", "1")

    def problems(data):
        out = tmp_path / "report.json"
        main(["check", "--configfile", _write(tmp_path / "layout.yaml", data), "--out", str(out)])
        return json.loads(out.read_text())["problems"]

    verl2 = {"train": {"engine": "verl", "nnodes": 2, "n_gpus_per_node": 1}, "reward": {"mode": "scalar"}}
    found = problems(verl2)
    assert any(p.startswith("judge.host: the judge listens on the rubric's loopback address but train.nnodes is 2")
               for p in found), found
    assert "train.nnodes is 2 but profiles/slurm requests 1 node(s): export LLMRNN_TRAIN_NODES=2" in found
    found = problems({**verl2, "judge": {"host": "127.0.0.1"}})
    assert any(p.startswith("judge.host: the judge listens on 127.0.0.1") for p in found), found
    trl2 = {"train": {"engine": "trl", "nnodes": 2}, "reward": {"mode": "scalar"}, "judge": {"host": "node"}}
    assert any("train.engine trl trains in one process" in p for p in problems(trl2))

    monkeypatch.setenv("LLMRNN_TRAIN_NODES", "2")
    wired = problems({**verl2, "judge": {"host": "node"}})
    assert not [p for p in wired if "nnodes" in p or "judge.host" in p or "node(s)" in p], wired
    assert all("\n" not in p for p in found + wired)


def _stand_in_sinfo(tmp_path, monkeypatch, listing: str) -> None:
    """A stand-in `sinfo` on PATH (the real one answers where .ci/slurm/up.sh runs a local SLURM): it prints
    what `sinfo -h -o "%P %l"` prints on a cluster, and refuses any other question."""
    bin_dir = tmp_path / "stand-in-bin"
    bin_dir.mkdir(parents=True)
    script = bin_dir / "sinfo"
    script.write_text(f'#!/bin/sh\n[ "$*" = "-h -o %P %l" ] || exit 2\nprintf "{listing}"\n')
    script.chmod(0o755)
    monkeypatch.setenv("PATH", f"{bin_dir}{os.pathsep}{os.environ['PATH']}")


def test_a_job_longer_than_its_partitions_maxtime_is_refused(in_workflow, tmp_path, monkeypatch):
    """Issue 31 item 7: the one train/judge sbatch asks train.resources.runtime (48 h in the reproduction);
    a partition whose MaxTime is 1 day would keep it pending (PartitionTimeLimit) or refuse it. One line
    names the job, its runtime, the partition, the limit and the knob."""
    config, _ = check.load_config([REPO / "config" / "reproduce.yaml"])
    _stand_in_sinfo(tmp_path, monkeypatch, "cpu* 7-00:00:00\\ngpu-a100 1-00:00:00\\ndebug 30:00\\n")
    (line,) = check.check_partition_time(config)
    assert line.startswith("slurm: the judge/preflight/trainer job (group train_node), ")
    assert "asks 2880 min (48 h) but partition gpu-a100 allows 1440 min (24 h) (sinfo MaxTime)" in line
    assert "lower train.resources.runtime" in line and "LLMRNN_SLURM_GPU_PARTITION" in line
    # the partition the profile is pointed at decides; an unlimited one passes
    monkeypatch.setenv("LLMRNN_SLURM_GPU_PARTITION", "long")
    _stand_in_sinfo(tmp_path / "b", monkeypatch, "cpu* 2-00:00:00\\nlong infinite\\n")
    assert check.check_partition_time(config) == []
    # merge.resources.gpu 0 runs on the CPU partition: its limit is the one compared
    monkeypatch.setenv("LLMRNN_SLURM_CPU_PARTITION", "short")
    _stand_in_sinfo(tmp_path / "c", monkeypatch, "short 1:00:00\\nlong infinite\\n")
    (line,) = check.check_partition_time(config)
    assert line.startswith("slurm: merge_model asks 120 min (2 h) but partition short allows 60 min (1 h)"), line
    assert "slurm time limits" in dict(check.CHECKS)


def test_no_sinfo_no_time_limit_check(in_workflow, tmp_path, monkeypatch):
    config, _ = check.load_config([REPO / "config" / "reproduce.yaml"])
    monkeypatch.setenv("PATH", str(tmp_path))  # no sinfo: not a SLURM login node
    assert check.check_partition_time(config) == []
