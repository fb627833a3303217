"""Cost per stage: real benchmark files written by Snakemake (benchmark-extended, as the profiles ask), the
report's table and plot from them, and `llmrnn check`'s warning from the last run's figures."""

from __future__ import annotations

import base64
import json
import os
import re
import subprocess
import sys
from html import escape
from pathlib import Path

import pytest

from llmrnn import check
from llmrnn.benchmarks import read_benchmarks, stage_costs
from llmrnn.check.slurm import benchmark_advice
from llmrnn.cli import main
from llmrnn.io import write_json
from llmrnn.overview import headline
from tests.slurm.dag import job_counts
from tests.test_report import _metrics_and_comparison

REPO = Path(__file__).resolve().parents[1]

# as rules/cost.smk and rules/report.smk report them (their inputs there are the whole run: too much for this
# tier), under the workflow's own landing text (workflow/report/workflow.rst)
SNAKEFILE = """
import json

report: "LANDING"
config["run_name"] = "demo"

rule shard:
    output: "out/{k}.txt"
    benchmark: "logs/demo/benchmarks/shard/{k}.tsv"
    resources: gpu=2
    shell: "python3 -c 'x = bytearray(64 << 20); import time; time.sleep(1.5)'; touch {output}"

rule gather:
    input: expand("out/{k}.txt", k=[0, 1])
    output: "all.txt"
    benchmark: "logs/demo/benchmarks/gather/gather.tsv"
    shell: "cat {input} > {output}"

rule overview:
    input: comparison="comparison.json", splits="splits.json", summary="summary.json"
    output: report("report/overview.html", category="Overview")
    params: cfg=json.dumps({"run_name": "demo", "memory_model": "m", "train": {"seed": 42, "lora": {"rank": 16}}, "reward": {"mode": "outcome"}, "eval": {}})
    shell: "llmrnn report overview --comparison {input.comparison} --splits {input.splits} --train-summary {input.summary} --cfg {params.cfg:q} --out {output}"

rule cost:
    input: "all.txt"
    output:
        table="report/cost.tsv",
        html=report("report/cost.html", category="Cost"),
        plot=report("report/cost.png", category="Cost"),
    shell: "llmrnn report cost --benchmarks logs/demo/benchmarks --table {output.table} --html {output.html} --plot {output.plot}"
""".replace("LANDING", str(REPO / "workflow" / "report" / "workflow.rst"))


def reported(html: str, name: str) -> bytes:
    """The file `name` as Snakemake's report embeds it (a base64 data URI naming the file)."""
    match = re.search(rf"data:([\w/+-]+);charset=[\w-]+;filename={re.escape(name)};base64,([A-Za-z0-9+/=]+)", html)
    assert match, f"{name} is not embedded in the report"
    return match.group(1).encode() + b"\n" + base64.b64decode(match.group(2))


@pytest.fixture(scope="module")
def benchmarks(tmp_path_factory) -> Path:
    work = tmp_path_factory.mktemp("bench")
    (work / "Snakefile").write_text(SNAKEFILE)
    _, comparison = _metrics_and_comparison(work / "eval-inputs")
    write_json(work / "comparison.json", comparison)
    write_json(work / "splits.json", {"sizes": {"train": 6, "val": 2, "test": 4}})
    write_json(work / "summary.json", {"engine": "trl", "steps": 2, "planned_steps": 2,
                                       "checkpoint": {"step": 2, "select": "last"}})
    exe = Path(sys.executable).with_name("snakemake")
    env = dict(os.environ, PATH=f"{exe.parent}{os.pathsep}{os.environ['PATH']}")
    proc = subprocess.run([str(exe), "--cores", "1", "--benchmark-extended", "all.txt"], cwd=work, env=env,
                          capture_output=True, text=True, timeout=300, check=False)
    assert proc.returncode == 0, proc.stderr[-3000:]
    return work / "logs" / "demo" / "benchmarks"


@pytest.mark.slow
def test_the_report_shows_the_cost_table_inline_and_the_plot(benchmarks):
    """`snakemake --report`: the cost table is an HTML result (shown inline; a TSV is only a download) with a
    row per stage and the total, and the plot a PNG, both under the category Cost; the report's first page
    (the landing text) opens with the overview's headline and holds the cost table itself."""
    work = benchmarks.parents[2]
    exe = Path(sys.executable).with_name("snakemake")
    env = dict(os.environ, PATH=f"{exe.parent}{os.pathsep}{os.environ['PATH']}")
    for args in (["cost", "overview"], ["--report", "report.html", "cost", "overview"]):
        proc = subprocess.run([str(exe), "--cores", "1", *args], cwd=work, env=env, capture_output=True, text=True,
                              timeout=300, check=False)
        assert proc.returncode == 0, proc.stderr[-3000:]
    html = (work / "report.html").read_text(errors="replace")
    table = reported(html, "cost.html").decode()
    assert table.startswith("text/html\n")
    rows = {cells[0]: cells for cells in (re.findall(r"<t[dh]>(.*?)</t[dh]>", r)
                                          for r in re.findall(r"<tr>(.*?)</tr>", table))}
    assert list(rows) == ["stage", "gather", "shard", "total"]  # stages by name (their files' paths), then the total
    assert rows["shard"][1] == "2" and rows["total"][1] == "3"  # jobs
    assert rows["shard"][5] == f"{stage_costs(read_benchmarks(benchmarks))[1]['gpu_hours']:.2f}"
    assert reported(html, "cost.png").startswith(b"image/png\n\x89PNG")
    assert "Cost" in html
    landing = json.loads(re.search(r"var workflow_desc = (\".*?\");\n", html).group(1))
    comparison = json.loads((work / "comparison.json").read_text())
    assert f"<strong>Headline</strong>: {escape(headline(comparison))}." in landing
    assert "<td>2 of 2 planned GRPO steps (trl); the merged adapter is step 2 (train.select last)</td>" in landing
    assert landing.index("Headline") < landing.index("<td>shard</td><td>2</td>")  # the cost table, inline


@pytest.mark.slow
def test_stage_costs_from_snakemakes_benchmark_files(benchmarks):
    jobs = read_benchmarks(benchmarks)
    assert sorted(j.job for j in jobs) == ["gather/gather", "shard/0", "shard/1"]
    stages = {s["stage"]: s for s in stage_costs(jobs)}
    assert stages["shard"]["jobs"] == 2 and stages["gather"]["jobs"] == 1
    assert stages["shard"]["wall_s"] >= 3.0  # two jobs of 1.5 s sleep each
    assert stages["shard"]["gpu_hours"] == pytest.approx(stages["shard"]["wall_s"] * 2 / 3600)  # gpu=2
    assert stages["gather"]["gpu_hours"] == 0


@pytest.mark.slow
def test_report_cost_writes_table_and_plot(benchmarks, tmp_path):
    table, plot = tmp_path / "cost.tsv", tmp_path / "cost.png"
    assert main(["report", "cost", "--benchmarks", str(benchmarks), "--table", str(table), "--plot", str(plot)]) == 0
    rows = [line.split("\t") for line in table.read_text().splitlines()]
    assert rows[0] == ["stage", "jobs", "wall_s", "longest_job_s", "peak_max_rss_mb", "gpu_hours"]
    assert {r[0] for r in rows[1:]} == {"shard", "gather", "total"}
    assert rows[-1][1] == "3"
    assert plot.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_report_cost_without_benchmarks_is_one_line(tmp_path, capsys):
    rc = main(["report", "cost", "--benchmarks", str(tmp_path / "none"), "--table", str(tmp_path / "t.tsv"),
               "--plot", str(tmp_path / "p.png")])
    err = capsys.readouterr().err.strip().splitlines()
    assert rc == 2 and len(err) == 1 and "no benchmark files" in err[0]
    assert not (tmp_path / "t.tsv").exists()


def test_bad_benchmark_file_names_the_file_and_field(tmp_path):
    from llmrnn.errors import InputError

    bad = tmp_path / "shard" / "0.tsv"
    bad.parent.mkdir()
    bad.write_text("s\th:m:s\tmax_rss\nslow\t0:00:01\t12\n")
    with pytest.raises(InputError, match=r"0\.tsv: field s is 'slow'"):
        read_benchmarks(tmp_path)


def test_check_warns_when_the_last_run_did_not_fit_the_runtime(tmp_path):
    config, _ = check.load_config([REPO / "config" / "reproduce.yaml"])
    config["train"]["resources"]["runtime"] = config["judge"]["resources"]["runtime"] = 60  # one group job
    config["eval"]["resources"]["runtime"] = 600
    logs = tmp_path / "logs"
    for rule, seconds in (("train_grpo", 7200.0), ("eval_shard", 60.0)):
        path = logs / "benchmarks" / rule / "job.tsv"
        path.parent.mkdir(parents=True)
        path.write_text(f"s\th:m:s\tmax_rss\n{seconds}\t0\t100\n")
    advice = benchmark_advice(config, logs=str(logs))
    assert len(advice) == 1, advice  # eval_shard fits its 600 min
    assert "train_grpo took 120 min" in advice[0] and "asks 60 min" in advice[0]
    assert "continue in a rerun" in advice[0]
    assert benchmark_advice(config, logs=str(tmp_path / "no-run")) == []  # no benchmarks: nothing to say


# ----------------------------------------------------------------------------- the cost plan, before a run
@pytest.mark.parametrize("text, field", [
    ("s\tmax_rss\tresources\nabc\t1\t{}\n", "field s is 'abc', not a number"),
    ("s\tmax_rss\tresources\n5\tnan\t{}\n", "field max_rss is 'nan', not a finite number"),
    ("s\tmax_rss\tresources\n5\t1\t{'gpu': 'a100'}\n", "gpu is 'a100', not a whole number"),
    ("s\tmax_rss\tresources\n5\t1\t5\n", "field resources is not a dict"),
    ("s\tmax_rss\tresources\n5\n", "field max_rss is missing"),
])
def test_report_cost_on_a_non_number_is_one_line(tmp_path, capsys, text, field):
    bench = tmp_path / "benchmarks" / "train_grpo"
    bench.mkdir(parents=True)
    (bench / "train_grpo.tsv").write_text(text)
    rc = main(["report", "cost", "--benchmarks", str(tmp_path / "benchmarks"), "--table", str(tmp_path / "t.tsv"),
               "--plot", str(tmp_path / "p.png")])
    err = capsys.readouterr().err.strip().splitlines()
    assert rc == 2 and len(err) == 1 and field in err[0] and "train_grpo.tsv" in err[0], err


def _plan(*files: str):
    from llmrnn.check import load_config

    config, problems = load_config([Path(f) for f in files])
    assert not problems, problems
    return config


def test_the_reproduction_cost_plan_before_submitting(monkeypatch, capsys):
    """Training 3 GPUs x 48 h (2 trainer + 1 judge), 64 eval shards x 4 h, 8 trajectory shards x 4 h."""
    monkeypatch.chdir(REPO)
    rc = main(["report", "cost-plan", "--configfile", "config/reproduce.yaml", "--benchmarks", "nowhere"])
    out = capsys.readouterr().out
    assert rc == 0
    rows = {line.split()[0]: line.split() for line in out.splitlines()[1:-1]}
    assert rows["eval_shard"][1:4] == ["64", "1", "4.00"] and rows["trajectory_shard"][1:4] == ["8", "1", "4.00"]
    assert rows["train_grpo"][1:3] == ["1", "2"] and rows["judge_server"][1:3] == ["1", "1"]
    assert "up to 432.0 GPU-hours" in out.splitlines()[-1]
    assert "wall up to 58 h" in out.splitlines()[-1]  # 4 h shards + 48 h training + 2 h merge + 4 h eval


def test_an_earlier_runs_benchmark_replaces_the_cap(tmp_path, monkeypatch):
    from llmrnn.cost_plan import plan_stages

    monkeypatch.chdir(REPO)
    bench = tmp_path / "train_grpo"
    bench.mkdir()
    (bench / "train_grpo.tsv").write_text("s\tmax_rss\tresources\n7200\t1000\t{'gpu': 2}\n")
    stages = {s["stage"]: s for s in plan_stages(_plan("config/smoke.yaml"), tmp_path)}
    assert stages["train_grpo"]["source"] == "measured" and stages["train_grpo"]["gpu_hours"] == pytest.approx(4.0)
    assert stages["judge_server"]["hours_per_job"] == pytest.approx(2.0)  # it lives as long as training
    assert stages["eval_shard"]["source"] == "cap"


def test_the_plan_counts_the_jobs_the_dry_run_plans(tmp_path, shipped_dry_runs):
    """The cost plan's job counts are the workflow's own (a dry run of the demo, and of the demo with more shards
    and a baseline; the session's dry runs, conftest.ShippedDryRuns: the demo's is test_plan_snapshot's)."""
    from llmrnn.cost_plan import plan_stages

    over = tmp_path / "over.yaml"
    over.write_text("eval: {shards: 3, baselines: [zero_shot]}\ntrajectories: {shards: 1}\n")
    # the demo with no configfile named is config/config.yaml alone (the Snakefile's own configfile)
    demo_over = ("config/config.yaml", str(over))
    for named, files in (((), ("config/config.yaml",)), (demo_over, demo_over)):
        planned = job_counts(shipped_dry_runs.text(*named))
        assert planned, files  # the dry run's job table was read
        cwd = os.getcwd()
        try:
            os.chdir(REPO)
            stages = plan_stages(_plan(*files))
        finally:
            os.chdir(cwd)
        for s in stages:
            assert planned.get(s["stage"]) == s["jobs"], (files, s["stage"], planned)


def test_check_prints_the_cost_plan(monkeypatch, capsys):
    monkeypatch.chdir(REPO)
    report = check.run_checks([Path("config/smoke.yaml")])
    assert any(a.startswith("cost plan: up to 5.2 GPU-hours") for a in report["advice"]), report["advice"]
