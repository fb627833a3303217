"""Plots and summary table from metrics.json / comparison.json, training curves from train metrics.jsonl."""

from __future__ import annotations

import argparse
import json

import pytest

from llmrnn import evaluate, io, report
from llmrnn.errors import InputError
from llmrnn.io import write_json

PNG = b"\x89PNG\r\n\x1a\n"


def run_report_cli(argv: list[str]) -> None:
    """`llmrnn report ...` through the stage's own argparse registration (independent of other stages)."""
    parser = argparse.ArgumentParser()
    report.register(parser.add_subparsers(dest="command", required=True))
    args = parser.parse_args(["report", *argv])
    args.func(args)


def _metrics_and_comparison(tmp_path):
    judge = evaluate.FinalJudge({"mode": "matcher"})
    truth = ["anemia"]
    graded = {}
    for variant, hits in (("base", [1, 0, 0, 1]), ("trained", [1, 1, 0, 1])):
        recs = [
            {
                "patient_id": f"p{i}",
                "visits": [
                    {"visit_index": 0, "ground_truth": truth, "prediction": {"primary_diagnosis": "x"},
                     "prediction_ok": True, "memory_words": 10},
                    {"visit_index": 1, "ground_truth": truth,
                     "prediction": {"primary_diagnosis": "anemia" if h else "x"}, "prediction_ok": True,
                     "memory_words": 20,
                     "h_prev": json.dumps({"evolving_summary": "anemia" if h and variant == "trained" else "x"})},
                ],
            }
            for i, h in enumerate(hits)
        ]
        path = tmp_path / "eval" / variant / "graded_0.jsonl"
        path.parent.mkdir(parents=True)
        io.write_jsonl(path, evaluate.grade_records(recs, judge))
        graded[variant] = [path]
    return evaluate.gather(graded, {"stats": {"bootstrap": {"samples": 200}}})


def test_training_cli_plots_reward_and_kl_from_metrics_rows(tmp_path):
    path = tmp_path / "metrics.jsonl"
    rows = [{"step": s, "kind": "train", "reward_mean": 0.1 * s, "reward_std": 0.05, "kl": 0.001 * s}
            for s in (1, 2, 3)]
    rows.append({"step": 3, "kind": "val", "val_reward_mean": 0.4})
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    reward, kl = tmp_path / "plots" / "reward.png", tmp_path / "plots" / "kl.png"
    run_report_cli(["training", "--metrics", str(path), "--reward", str(reward), "--kl", str(kl)])
    for png in (reward, kl):
        data = png.read_bytes()
        assert data.startswith(PNG) and len(data) > 5000, png
    assert sorted(p.name for p in reward.parent.iterdir()) == ["kl.png", "reward.png"]  # no temp files left


def test_training_cli_missing_metrics_is_one_clear_error(tmp_path):
    with pytest.raises(InputError, match="nope.jsonl: not found"):
        run_report_cli(["training", "--metrics", str(tmp_path / "nope.jsonl"), "--reward",
                        str(tmp_path / "p" / "r.png"), "--kl", str(tmp_path / "p" / "k.png")])
    assert not (tmp_path / "p").exists()


def test_plots_cli_writes_pngs_and_summary(tmp_path):
    metrics, comparison = _metrics_and_comparison(tmp_path)
    write_json(tmp_path / "metrics.json", metrics)
    write_json(tmp_path / "comparison.json", comparison)
    out = tmp_path / "plots"
    run_report_cli(["plots", "--metrics", str(tmp_path / "metrics.json"), "--comparison",
                    str(tmp_path / "comparison.json"), "--bars", str(out / "acc_bars.png"),
                    "--by-visit", str(out / "acc_by_visit.png"), "--memory-recall", str(out / "memory_recall.png"),
                    "--summary", str(out / "summary.tsv")])
    assert sorted(p.name for p in out.iterdir()) == ["acc_bars.png", "acc_by_visit.png", "memory_recall.png",
                                                     "summary.tsv"]
    for name in ("acc_bars.png", "acc_by_visit.png", "memory_recall.png"):
        data = (out / name).read_bytes()
        assert data.startswith(PNG) and len(data) > 5000, name
    rows = [line.split("\t") for line in (out / "summary.tsv").read_text().splitlines()]
    assert rows[0][:3] == ["variant", "n", "acc@1"]
    by_variant = {r[0]: r for r in rows[1:]}
    assert by_variant["base"][2] == "0.500" and by_variant["trained"][2] == "0.750"
    assert by_variant["trained"][6] == "0.250"  # acc@1 difference vs base
    assert by_variant["base"][6] == ""  # no comparison of base with itself
    col = rows[0].index("memory recall")
    assert (by_variant["base"][col], by_variant["trained"][col]) == ("0.000", "0.750")
    assert by_variant["trained"][col + 1] == "0.750" and by_variant["base"][col + 1] == ""
    assert float(by_variant["trained"][col + 3]) > 0.05  # three of four pairs differ: no paired test passes


def test_plots_cli_missing_metrics_is_one_clear_error(tmp_path):
    with pytest.raises(InputError, match="nope.json: not found"):
        run_report_cli(["plots", "--metrics", str(tmp_path / "nope.json"), "--comparison",
                        str(tmp_path / "nope2.json"), "--bars", str(tmp_path / "p" / "b.png"),
                        "--by-visit", str(tmp_path / "p" / "v.png"), "--memory-recall", str(tmp_path / "p" / "m.png"),
                        "--summary", str(tmp_path / "p" / "s.tsv")])
    assert not (tmp_path / "p").exists()
