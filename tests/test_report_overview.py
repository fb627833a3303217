"""The report's first page: the overview (`llmrnn report overview`) says what was trained, the headline with
its CI and what it rests on, and what next; workflow/report/workflow.rst, rendered as Snakemake renders it
(Jinja over the config and the report's files, then docutils), takes it and the cost table in whole."""

from __future__ import annotations

import json
import re
from html import unescape
from pathlib import Path

import jinja2
import pytest
from docutils.core import publish_parts

from llmrnn import io
from llmrnn.errors import InputError
from llmrnn.overview import headline
from llmrnn.plan import Plan
from llmrnn.provenance import code_identity
from tests.test_report import _metrics_and_comparison, run_report_cli

REPO = Path(__file__).resolve().parents[1]
SUMMARY = {"engine": "trl", "steps": 8, "planned_steps": 8, "train_rows": 96,
           "checkpoint": {"step": 8, "select": "last", "why": "train.select last"}}
SPLITS = {"sizes": {"train": 60, "val": 10, "test": 30}}


def cells(html: str) -> dict[str, str]:
    """The overview's what/this-run table as {what: this run}."""
    rows = re.findall(r"<tr><td>(.*?)</td><td>(.*?)</td></tr>", html)
    return {unescape(k): unescape(v) for k, v in rows}


def write_overview(tmp_path: Path, configfiles=(), overrides=None, summary=SUMMARY) -> tuple[str, dict]:
    """The overview of a run of these config files, from a real gathered comparison."""
    _, comparison = _metrics_and_comparison(tmp_path)
    io.write_json(tmp_path / "comparison.json", comparison)
    io.write_json(tmp_path / "splits.json", SPLITS)
    plan = Plan.from_configfiles(*(REPO / f for f in configfiles), overrides=overrides)
    argv = ["overview", "--comparison", str(tmp_path / "comparison.json"), "--splits", str(tmp_path / "splits.json"),
            "--cfg", plan.evaluate.overview_cfg(),
            "--out", str(tmp_path / "overview.html")]
    if summary is not None:
        io.write_json(tmp_path / "summary.json", summary)
        argv += ["--train-summary", str(tmp_path / "summary.json")]
    run_report_cli(argv)
    return (tmp_path / "overview.html").read_text(), comparison


def test_the_overview_says_what_was_trained_and_the_headline(tmp_path, monkeypatch):
    monkeypatch.chdir(REPO)  # the config's paths are the repository's
    html, comparison = write_overview(tmp_path)
    # the headline is the line `make demo` ends with (llmrnn report headline), its n and seeds included
    assert f"<strong>Headline</strong>: {headline(comparison)}." in unescape(html)
    assert "on 4 held-out patients and 1 training seed" in html
    table = cells(html)
    assert table["memory model"] == "smollm2-135m-instruct with a LoRA of rank 16"
    assert table["reward"].startswith("the outcome reward") and "no judge" in table["reward"]
    # the very identity train_grpo's `code` param has (rules/train.smk)
    trained = Plan.from_configfiles(REPO / "config/config.yaml").train
    assert f"code identity {code_identity('train run', *trained.reward_code())} (" in table["reward code"]
    assert table["steps"] == ("8 of 8 planned GRPO steps (trl); the merged adapter is step 8 (train.select last)")
    assert table["seeds"].startswith("one training seed (train.seed 42)")
    assert table["patients"] == "60 in training (96 prompts), 10 in validation"
    assert table["evaluated on"] == "4 held-out patients of the 30 in the test split (eval.max_patients 20)"
    # what next, from what this run measured: 3 of 4 pairs differ, no test passes
    nxt = unescape(html.split("<strong>Next</strong>", 1)[1])
    assert "The interval includes 0" in nxt and "eval.max_patients 20 evaluates 20 of the 30" in nxt
    assert "<code>PATH=.venv/bin:$PATH .venv/bin/python benchmarks/demo_seeds.py --seeds 42 1 2</code>" in nxt
    assert "docs/rewards.md" in nxt and "docs/cluster.md" in nxt


def test_the_overview_names_your_own_reward_by_its_hash(tmp_path, monkeypatch):
    monkeypatch.chdir(REPO)
    html, _ = write_overview(tmp_path, ("config/config.yaml", "config/own_reward/my_reward.yaml"))
    table = cells(html)
    sha = io.sha256_file(REPO / "config/own_reward/my_reward.py")
    assert table["reward"] == ("your own: compute_score in config/own_reward/my_reward.py (reward.custom; no judge)")
    assert table["reward code"].startswith(f"config/own_reward/my_reward.py: sha256 {sha}")
    assert f"code identity {code_identity('train run', 'config/own_reward/my_reward.py')} (" in table["reward code"]
    assert code_identity("train run", "config/own_reward/my_reward.py").endswith("+" + sha)
    assert "Your own reward" not in html  # no advice to do what this run did


def test_a_model_trained_elsewhere_is_not_described_as_this_runs(tmp_path, monkeypatch):
    monkeypatch.chdir(REPO)
    html, comparison = write_overview(tmp_path, overrides={"eval": {"trained_model": "elsewhere/model"}},
                                      summary=None)
    assert f"{headline(comparison, seeds=None)}." in unescape(html) and "training seed" not in html
    assert set(cells(html)) == {"trained model", "base model", "evaluated on"}
    assert "trained outside this run" in cells(html)["trained model"]


def test_the_overview_without_its_training_summary_is_one_line(tmp_path, monkeypatch):
    monkeypatch.chdir(REPO)
    with pytest.raises(InputError, match=r"no --train-summary"):
        write_overview(tmp_path, summary=None)
    with pytest.raises(InputError, match=r"nope\.json: not found"):
        run_report_cli(["overview", "--comparison", str(tmp_path / "nope.json"), "--splits", str(tmp_path / "s.json"),
                        "--cfg", "{}", "--out", str(tmp_path / "o.html")])
    assert not (tmp_path / "overview.html").exists() and not (tmp_path / "o.html").exists()


def test_the_overview_reads_what_the_run_made():
    """Its inputs: this run's training summary unless eval.trained_model; the rubric of a judged reward."""
    demo = Plan.from_configfiles(REPO / "config/config.yaml").evaluate
    assert demo.overview_inputs() == {"comparison": "results/demo/eval/comparison.json",
                                      "splits": "results/demo/splits/splits.json",
                                      "train_summary": "results/demo/train/summary.json"}
    assert demo.overview_target() in demo.heldout_targets()
    judged = Plan.from_configfiles(REPO / "config/config.yaml", overrides={"reward": {"mode": "scalar"}}).evaluate
    assert judged.overview_inputs()["rubric"] == judged.config["judge"]["rubric"]
    elsewhere = Plan.from_configfiles(REPO / "config/config.yaml", overrides={"eval": {"trained_model": "m"}})
    assert "train_summary" not in elsewhere.evaluate.overview_inputs()
    assert json.loads(demo.overview_cfg())["train"] == {"engine": "trl", "seed": 42, "select": "last",
                                                        "lora": {"rank": 16}}


class ReportFile:
    """A result as Snakemake's report hands it to the landing text's Jinja (`files`): its name and path."""

    def __init__(self, path: Path):
        self.path, self.target = path, path.name


def landing(config: dict, files: list[Path]) -> str:
    """workflow/report/workflow.rst as Snakemake 9 renders it (snakemake.report.auto_report): Jinja with
    trim_blocks and lstrip_blocks over `snakemake.config` and the report's files, then docutils' html_body."""
    env = jinja2.Environment(trim_blocks=True, lstrip_blocks=True)
    text = env.from_string((REPO / "workflow/report/workflow.rst").read_text()).render(
        snakemake=type("Snakemake", (), {"config": config}), categories={}, files=[ReportFile(f) for f in files])
    return publish_parts(text, writer="html")["html_body"]


def test_the_report_opens_with_the_overview_and_the_cost_table(tmp_path, monkeypatch):
    monkeypatch.chdir(REPO)
    _, comparison = write_overview(tmp_path)
    cost = tmp_path / "cost.html"
    cost.write_text("<table class=\"llmrnn\"><tr><td>train_grpo</td></tr></table>\n")
    page = landing({"run_name": "demo"}, [tmp_path / "overview.html", cost])
    assert page.index("Run <tt") < page.index(headline(comparison).split(":")[0]) < page.index("train_grpo")
    assert "<td>smollm2-135m-instruct with a LoRA of rank 16</td>" in page
    assert "Cost per stage</strong> (the benchmark files" in page
    # before the evaluation and the cost report: what makes them, never a half page
    before = landing({"run_name": "demo"}, [])
    assert "come here once the held-out evaluation has run" in before and "cost_report" in before
    assert "<table" not in before
    assert "Recipe qa" in landing({"run_name": "qa_demo", "recipe": "qa"}, [])
