"""Real snakemake runs of the held-out evaluation: `eval_heldout` on tiny models, the HTML report, and
the rerun table of the eval knobs (an eval setting reruns evaluation jobs only, and only those it feeds).

The trained memory model is given as eval.trained_model (a second tiny model with other weights), so this
test needs neither training nor merge; the full chain (merged model of this run) is the default config's.
"""

from __future__ import annotations

import json
import re
from html import escape

import pytest
import yaml

from llmrnn.overview import headline
from tests.conftest import snakemake

EVAL_JOBS = {"eval_shard", "eval_grade", "eval_gather", "eval_plots", "report_overview", "eval_heldout"}


def write_test_config(workdir, tiny, trained, **eval_overrides) -> str:
    role = {"model": "tiny", "backend": "transformers", "temperature": 0.7, "top_p": 0.95, "max_tokens": 12}
    cfg = {
        "run_name": "evaltest",
        "cohort": {"source": "synthetic", "synthetic": {"patients": 14, "seed": 7}},
        "split": {"val_size": 2, "train_size": 3, "seed": 42},
        "models": {"tiny": {"source": "local", "path": str(tiny)}},
        "roles": {r: dict(role) for r in ("prediction", "evaluation", "memory")},
        "eval": {
            "baselines": ["zero_shot"],
            "max_patients": 4,
            "shards": 2,
            "seed": 5,
            "trained_model": str(trained),
            "stats": {"bootstrap": {"samples": 300, "seed": 0}},
            **eval_overrides,
        },
    }
    name = f"test_{len(list(workdir.glob('test_*.yaml')))}.yaml"
    (workdir / name).write_text(yaml.safe_dump(cfg))
    return name


def planned_jobs(workdir, configfile) -> dict[str, int]:
    """Job name -> count of a dry run of eval_heldout (default rerun triggers, params included)."""
    out = snakemake(workdir, "eval_heldout", "-n", "--configfile", "config/config.yaml", configfile).stdout
    if "Nothing to be done" in out:
        return {}
    table = out.split("Job stats:", 1)[1].split("total", 1)[0]
    return {m.group(1): int(m.group(2)) for m in re.finditer(r"^(\w+)\s+(\d+)\s*$", table, re.MULTILINE)}


@pytest.mark.slow
@pytest.mark.e2e  # a whole-workflow run: `make test-e2e` (the fast-feedback tiers)
def test_eval_heldout_report_and_eval_only_reruns(workflow_dir, tiny_model_dir, tmp_path):
    from tests.tiny_model import build_tiny_model

    trained = build_tiny_model(tmp_path / "trained-tiny", seed=1)
    base_cfg = write_test_config(workflow_dir, tiny_model_dir, trained)
    snakemake(workflow_dir, "eval_heldout", "--configfile", "config/config.yaml", base_cfg)

    run = workflow_dir / "results/evaltest/eval"
    metrics = json.loads((run / "metrics.json").read_text())
    comparison = json.loads((run / "comparison.json").read_text())
    assert set(metrics["variants"]) == {"base", "trained", "zero_shot"}
    assert {m["n_patients"] for m in metrics["variants"].values()} == {4}
    assert set(comparison["comparisons"]) == {"trained", "zero_shot"}
    assert comparison["comparisons"]["trained"]["n_pairs"] == 4
    for variant in ("base", "trained", "zero_shot"):
        assert sorted(p.name for p in (run / variant).iterdir()) == [
            "graded_0.jsonl", "graded_1.jsonl", "shard_0.jsonl", "shard_1.jsonl"]
    # the trained variant really used the other memory weights: its memory outputs differ from base's
    def memories(variant):
        rows = [json.loads(line) for k in (0, 1) for line in (run / variant / f"shard_{k}.jsonl").open()]
        return [v.get("memory_raw") for r in sorted(rows, key=lambda r: r["patient_id"]) for v in r["visits"]]

    assert memories("base") != memories("trained")
    for name in ("acc_bars.png", "acc_by_visit.png"):
        assert (run / "plots" / name).read_bytes().startswith(b"\x89PNG")

    snakemake(workflow_dir, "eval_heldout", "--configfile", "config/config.yaml", base_cfg, "--report", "report.html")
    html = (workflow_dir / "report.html").read_text(errors="replace")
    for name in ("acc_bars.png", "acc_by_visit.png", "summary.html", "Held-out evaluation"):
        assert name in html, name
    # the first page opens with the headline of a model trained elsewhere (no training seed to count)
    landing = json.loads(re.search(r"var workflow_desc = (\".*?\");\n", html).group(1))
    assert f"<strong>Headline</strong>: {escape(headline(comparison, seeds=None))}." in landing
    assert "trained outside this run" in landing

    # rerun table of the eval knobs, on top of the finished run
    assert planned_jobs(workflow_dir, base_cfg) == {}
    judge_cfg = write_test_config(workflow_dir, tiny_model_dir, trained, final_judge={"matcher": {"threshold": 0.6}})
    assert planned_jobs(workflow_dir, judge_cfg) == {"eval_grade": 6, "eval_gather": 1, "eval_plots": 1,
                                                      "report_overview": 1, "eval_heldout": 1}
    stats_cfg = write_test_config(workflow_dir, tiny_model_dir, trained,
                                  stats={"bootstrap": {"samples": 500, "seed": 1}})
    assert planned_jobs(workflow_dir, stats_cfg) == {"eval_gather": 1, "eval_plots": 1, "report_overview": 1,
                                                      "eval_heldout": 1}
    seed_cfg = write_test_config(workflow_dir, tiny_model_dir, trained, seed=6)
    jobs = planned_jobs(workflow_dir, seed_cfg)
    assert jobs["eval_shard"] == 6 and set(jobs) == EVAL_JOBS  # nothing upstream (cohort, models) reruns
    # (`--list-changes params` is no help here: snakemake 9.27 lists outputs of unchanged jobs as well)
