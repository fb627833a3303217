"""Plots and summary table from metrics.json / comparison.json, training curves from train metrics.jsonl."""

from __future__ import annotations

import argparse
import json
import re
from html import unescape
from pathlib import Path

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
    rows = [{"step": s, "kind": "train", "reward_mean": 0.1 * s, "reward_std": 0.05, "kl": 0.001 * s,
             "truncation_rate": 0.5 / s, "response_length_mean": 40 - s} for s in (1, 2, 3)]
    rows.append({"step": 3, "kind": "val", "val_reward_mean": 0.4, "val_truncation_rate": 0.1,
                 "val_response_length_mean": 20.0})
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    plots = tmp_path / "plots"
    reward, kl, trunc = plots / "reward.png", plots / "kl.png", plots / "truncation.png"
    run_report_cli(["training", "--metrics", str(path), "--reward", str(reward), "--kl", str(kl),
                    "--truncation", str(trunc)])
    for png in (reward, kl, trunc):
        data = png.read_bytes()
        assert data.startswith(PNG) and len(data) > 5000, png
    assert sorted(p.name for p in plots.iterdir()) == ["kl.png", "reward.png", "truncation.png"]  # no temp files
    # no KL rows (train.kl.coef 0): the KL plot still renders, with a note instead of a curve
    path.write_text("".join(json.dumps({k: v for k, v in r.items() if k != "kl"}) + "\n" for r in rows))
    run_report_cli(["training", "--metrics", str(path), "--reward", str(reward), "--kl", str(kl),
                    "--truncation", str(trunc)])
    assert kl.read_bytes().startswith(PNG)


def test_training_cli_missing_metrics_is_one_clear_error(tmp_path):
    with pytest.raises(InputError, match="nope.jsonl: not found"):
        run_report_cli(["training", "--metrics", str(tmp_path / "nope.jsonl"), "--reward",
                        str(tmp_path / "p" / "r.png"), "--kl", str(tmp_path / "p" / "k.png"),
                        "--truncation", str(tmp_path / "p" / "t.png")])
    assert not (tmp_path / "p").exists()


def test_plots_cli_writes_pngs_and_summary(tmp_path):
    metrics, comparison = _metrics_and_comparison(tmp_path)
    write_json(tmp_path / "metrics.json", metrics)
    write_json(tmp_path / "comparison.json", comparison)
    out = tmp_path / "plots"
    run_report_cli(["plots", "--metrics", str(tmp_path / "metrics.json"), "--comparison",
                    str(tmp_path / "comparison.json"), "--bars", str(out / "acc_bars.png"),
                    "--by-visit", str(out / "acc_by_visit.png"), "--memory-recall", str(out / "memory_recall.png"),
                    "--summary", str(out / "summary.tsv"), "--summary-html", str(out / "summary.html")])
    assert sorted(p.name for p in out.iterdir()) == ["acc_bars.png", "acc_by_visit.png", "memory_recall.png",
                                                     "summary.html", "summary.tsv"]
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
    # the report shows the same table inline (an HTML page; summary.tsv would be a download only)
    page = (out / "summary.html").read_text()
    assert page.startswith("<!DOCTYPE html>") and page.count("<table") == 1
    assert [[unescape(c) for c in re.findall(r"<t[dh]>(.*?)</t[dh]>", r)] for r in re.findall(r"<tr>(.*?)</tr>", page)] == rows


def test_plots_cli_missing_metrics_is_one_clear_error(tmp_path):
    with pytest.raises(InputError, match="nope.json: not found"):
        run_report_cli(["plots", "--metrics", str(tmp_path / "nope.json"), "--comparison",
                        str(tmp_path / "nope2.json"), "--bars", str(tmp_path / "p" / "b.png"),
                        "--by-visit", str(tmp_path / "p" / "v.png"), "--memory-recall", str(tmp_path / "p" / "m.png"),
                        "--summary", str(tmp_path / "p" / "s.tsv")])
    assert not (tmp_path / "p").exists()


def test_trl_val_rows_carry_truncation_and_length():
    """A TRL validation log becomes a val row with the truncation rate and mean length of its rollouts
    (the demo's val truncation fell from 42% to 3% within 4 steps); the progress line shows them."""
    from llmrnn.train.metrics import progress_line, trl_row

    row = trl_row(4, {"eval_reward": 0.47, "eval_reward_std": 0.28, "eval_completions/clipped_ratio": 0.03,
                      "eval_completions/mean_length": 19.3})
    assert row["kind"] == "val"
    assert (row["val_truncation_rate"], row["val_response_length_mean"]) == (0.03, 19.3)
    assert progress_line(row, 8) == "val   step 4/8: reward 0.47, truncated 0.03, len 19.3"
    train = trl_row(5, {"reward": 0.4, "completions/clipped_ratio": 0.0})
    assert train["kind"] == "train" and train["truncation_rate"] == 0.0 and "val_truncation_rate" not in train


def test_plots_cli_shows_the_specificity_control(tmp_path):
    """memory_specificity.png + summary columns: other-patient recall, the gap and trained-vs-base on the gap."""
    metrics, comparison = _metrics_and_comparison(tmp_path)
    write_json(tmp_path / "metrics.json", metrics)
    write_json(tmp_path / "comparison.json", comparison)
    out = tmp_path / "plots"
    run_report_cli(["plots", "--metrics", str(tmp_path / "metrics.json"), "--comparison",
                    str(tmp_path / "comparison.json"), "--bars", str(out / "b.png"), "--by-visit", str(out / "v.png"),
                    "--memory-recall", str(out / "m.png"), "--specificity", str(out / "memory_specificity.png"),
                    "--summary", str(out / "summary.tsv")])
    data = (out / "memory_specificity.png").read_bytes()
    assert data.startswith(PNG) and len(data) > 5000
    rows = [line.split("\t") for line in (out / "summary.tsv").read_text().splitlines()]
    head, by_variant = rows[0], {r[0]: r for r in rows[1:]}
    for name in ("other-patient recall", "specificity gap", "gap diff vs base", "Wilcoxon p (gap)"):
        assert name in head
    spec = metrics["variants"]["trained"]["memory_specificity"]
    assert by_variant["trained"][head.index("specificity gap")] == f"{spec['gap']:.3f}"
    assert by_variant["trained"][head.index("gap diff vs base")] == \
        f"{comparison['comparisons']['trained']['memory_specificity']['diff']:.3f}"
    assert by_variant["base"][head.index("gap diff vs base")] == ""


def test_training_plot_marks_the_chosen_checkpoint(tmp_path):
    path = tmp_path / "metrics.jsonl"
    rows = [{"step": s, "kind": "train", "reward_mean": 0.1 * s} for s in (1, 2, 3, 4)]
    rows += [{"step": s, "kind": "val", "val_reward_mean": v} for s, v in ((2, 0.5), (4, 0.3))]
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    summary = tmp_path / "summary.json"
    write_json(summary, {"checkpoint": {"step": 2, "select": "best_val", "why": "train.select best_val: step 2"}})
    plots = tmp_path / "plots"
    argv = ["training", "--metrics", str(path), "--reward", str(plots / "r.png"), "--kl", str(plots / "k.png"),
            "--truncation", str(plots / "t.png")]
    run_report_cli([*argv, "--summary", str(summary)])
    marked = (plots / "r.png").read_bytes()
    run_report_cli(argv)
    assert marked.startswith(PNG) and marked != (plots / "r.png").read_bytes()  # the marker changes the plot
    with pytest.raises(InputError, match="nope.json: not found"):
        run_report_cli([*argv, "--summary", str(tmp_path / "nope.json")])


def test_agreement_plot_from_the_check_and_from_preflight(tmp_path):
    agreement = {"mode": "scalar", "judge_model": "judge", "pairs": 12, "agreed": 5, "ties": 3, "rate": 5 / 12,
                 "ci95": [0.19, 0.68], "verdict": "fail", "warn_below": 0.75, "fail_below": 0.5,
                 "training_reward_mode": "outcome",
                 "by_kind": {"other_patient": {"pairs": 4, "agreed": 1, "ties": 1, "rate": 0.25},
                             "truncated": {"pairs": 8, "agreed": 4, "ties": 2, "rate": 0.5}}}
    write_json(tmp_path / "agreement.json", agreement)
    run_report_cli(["agreement", "--agreement", str(tmp_path / "agreement.json"), "--plot", str(tmp_path / "a.png")])
    assert (tmp_path / "a.png").read_bytes().startswith(PNG)
    write_json(tmp_path / "preflight.json", {"ok": True, "judge_agreement": agreement})
    run_report_cli(["agreement", "--agreement", str(tmp_path / "preflight.json"), "--plot", str(tmp_path / "b.png")])
    assert (tmp_path / "b.png").read_bytes().startswith(PNG)
    write_json(tmp_path / "skipped.json", {"judge_agreement": {"skipped": "reward.mode outcome asks no judge"}})
    with pytest.raises(InputError, match="no judge agreement in it \\(reward.mode outcome asks no judge\\)"):
        run_report_cli(["agreement", "--agreement", str(tmp_path / "skipped.json"), "--plot", str(tmp_path / "c.png")])
    assert not (tmp_path / "c.png").exists()


def test_make_demo_ends_with_the_report_path_and_the_headline(tmp_path, capsys):
    """`make demo`'s last command: two lines, the report's path and the held-out result with its CI and n."""
    _, comparison = _metrics_and_comparison(tmp_path)
    write_json(tmp_path / "comparison.json", comparison)
    run_report_cli(["headline", "--comparison", str(tmp_path / "comparison.json"),
                    "--report", str(tmp_path / "report.html")])
    lines = capsys.readouterr().out.splitlines()
    mr = comparison["comparisons"]["trained"]["memory_recall"]
    assert lines[0] == f"report: {tmp_path / 'report.html'}"
    assert lines[1].startswith(f"held-out memory recall: base {mr['a']:.3f} -> trained {mr['b']:.3f}")
    assert f"on {mr['n_pairs']} held-out patients and 1 training seed" in lines[1] and "95% CI" in lines[1]
    assert len(lines) == 2
    makefile = (Path(__file__).resolve().parents[1] / "Makefile").read_text()
    demo = makefile.split("\ndemo:", 1)[1].split("\n\n", 1)[0].strip().splitlines()
    assert "llmrnn report headline --comparison results/demo/eval/comparison.json --report report.html" in demo[-1]
