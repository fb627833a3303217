"""Each run config is what runs (llmrnn.runconfig, the Snakefile): config/config.yaml (the CPU demo) is read
only when no config file is named; named files layer in order over the schema's defaults and never across
recipes; every run writes RUN/config.yaml with each value's source; `llmrnn config show/diff`."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import yaml

from llmrnn import runconfig
from llmrnn.cli import main

REPO = Path(__file__).resolve().parents[1]
SCHEMA = REPO / runconfig.SCHEMA


@pytest.fixture
def in_repo(monkeypatch):
    monkeypatch.chdir(REPO)


def _write(path: Path, data) -> Path:
    path.write_text(yaml.safe_dump(data))
    return path


# ----------------------------------------------------------------------------- resolving + sources
def test_later_layers_win_and_every_value_names_its_source(tmp_path):
    base = _write(tmp_path / "base.yaml", {"run_name": "a", "train": {"lr": 1e-4, "kl": {"coef": 0.0}}})
    over = _write(tmp_path / "over.yaml", {"train": {"kl": {"coef": 0.01}}, "eval": {"baselines": ["zero_shot"]}})
    layers = [runconfig.read_layer(base), runconfig.read_layer(over), ("--config", {"run_name": "b"})]
    config, sources = runconfig.resolve(layers, SCHEMA)
    assert config["run_name"] == "b" and sources["run_name"] == "--config"
    assert config["train"]["lr"] == 1e-4 and sources["train"]["lr"] == str(base)
    assert config["train"]["kl"]["coef"] == 0.01 and sources["train"]["kl"]["coef"] == str(over)
    assert config["eval"]["baselines"] == ["zero_shot"] and sources["eval"]["baselines"] == str(over)
    # the schema fills the rest (Snakemake's own validate: defaults behind $ref too) and says so
    assert config["train"]["kl"]["estimator"] == "low_var_kl"
    assert sources["train"]["kl"]["estimator"] == runconfig.SCHEMA_DEFAULT
    assert config["roles"]["evaluation"]["temperature"] == 0.3
    assert sources["roles"]["evaluation"]["backend"] == runconfig.SCHEMA_DEFAULT
    # sources has the shape of config: one source per value
    assert [p for p, _ in runconfig.leaves(config)] == [p for p, _ in runconfig.leaves(sources)]


def test_a_layer_replacing_a_list_or_mapping_owns_it(tmp_path):
    a = _write(tmp_path / "a.yaml", {"run_name": "a", "train": {"lora": {"target_modules": ["q_proj", "v_proj"]}}})
    b = _write(tmp_path / "b.yaml", {"train": {"lora": {"target_modules": ["o_proj"]}}})
    config, sources = runconfig.resolve([runconfig.read_layer(a), runconfig.read_layer(b)], SCHEMA)
    assert config["train"]["lora"]["target_modules"] == ["o_proj"]
    assert sources["train"]["lora"]["target_modules"] == str(b)


@pytest.mark.parametrize("content, message", [
    ("run_name: [unclosed", "not valid YAML"),
    ("- a list", "must be a YAML mapping"),
])
def test_bad_config_files_are_one_line(tmp_path, content, message):
    bad = tmp_path / "bad.yaml"
    bad.write_text(content)
    with pytest.raises(runconfig.InputError, match=message):
        runconfig.read_layer(bad)
    with pytest.raises(runconfig.InputError, match="does not exist"):
        runconfig.read_layer(tmp_path / "missing.yaml")


def test_a_schema_error_is_one_line(tmp_path):
    bad = _write(tmp_path / "bad.yaml", {"run_name": "x", "train": {"lr": "fast"}})
    with pytest.raises(runconfig.InputError) as err:
        runconfig.resolve([runconfig.read_layer(bad)], SCHEMA)
    assert "fast" in str(err.value) and "\n" not in str(err.value)


def test_layers_never_cross_recipes():
    layers = [runconfig.read_layer(REPO / "config/reproduce.yaml"), runconfig.read_layer(REPO / "config/qa_reproduce.yaml")]
    (problem,) = runconfig.layer_problems(layers)
    assert "qa_reproduce.yaml (recipe qa) is layered over" in problem and "never cross recipes" in problem
    with pytest.raises(runconfig.InputError, match="never cross recipes"):
        runconfig.resolve(layers, SCHEMA)
    # an overlay that names no recipe layers on either
    assert runconfig.layer_problems([layers[1], ("over.yaml", {"run_name": "x"})]) == []


@pytest.mark.parametrize("name", ["config.yaml", "reproduce.yaml", "qa_demo.yaml", "qa_reproduce.yaml"])
def test_every_shipped_config_is_complete_on_its_own(name):
    """Each recipe file names its recipe and runs alone: no value comes from another config file."""
    layer = runconfig.read_layer(REPO / "config" / name)
    config, sources = runconfig.resolve([layer], SCHEMA)
    assert layer[1].get("recipe") in ("memory_head", "qa")
    assert {s for _, s in runconfig.leaves(sources)} <= {layer[0], runconfig.SCHEMA_DEFAULT}
    models = config["qa"]["model"] if config["recipe"] == "qa" else config["roles"]["memory"]["model"]
    assert models in config["models"], f"{name}: the policy model {models} is not in its own models section"


# Schema defaults equal to a demo value although the reproduction of that recipe chose another, kept on
# purpose: safe or local by default (no patient data, no upload, grading that sends nothing anywhere), the one
# open model that needs no licence or GPU, plain sizing, or the recipe's own neutral reward. Any other demo
# value that becomes a schema default fails below.
NEUTRAL_DEFAULTS = {
    "cohort.source": "synthetic: no patient data unless a file is named",
    "qa.source": "synthetic: no QA data unless a file is named",
    "qa.ood": "synthetic questions, made locally",
    "eval.final_judge.mode": "matcher: grading sends no patient text anywhere",
    "eval.baselines": "no extra variants",
    "models.smollm2-135m-instruct.source": "the default open model (roles/qa.model default to it)",
    "models.smollm2-135m-instruct.package": "the default open model",
    "models.smollm2-135m-instruct.gguf_file": "the default open model",
    "models.smollm2-135m-instruct.dtype": "the default open model",
    "roles.prediction.model": "the default open model", "roles.evaluation.model": "the default open model",
    "roles.memory.model": "the default open model", "qa.model": "the default open model",
    "roles.prediction.backend": "in-process transformers runs anywhere",
    "roles.evaluation.backend": "in-process transformers runs anywhere",
    "roles.memory.backend": "in-process transformers runs anywhere",
    "trajectories.shards": "sizing", "train.resources.mem_mb": "sizing", "train.resources.cpus_per_task": "sizing",
    "qa.split.val_size": "sizing", "qa.sft.epochs": "sizing", "qa.sft.batch_size": "sizing", "qa.eval.k": "sizing",
    "qa.reward.weights.exact_match": "the qa recipe's own reward", "qa.reward.weights.format": "the qa recipe's own reward",
    "qa.reward.weights.judge": "off: no judge unless asked",
    "release.license": "the default open model's licence; the package's release defaults agree",
    **{f"roles.{role}.dtype": "float32 runs on every CPU; the demo names it so its numbers are the same on each"
       for role in ("prediction", "evaluation", "memory")},
}


@pytest.mark.parametrize("demo, reproduction", [("config.yaml", "reproduce.yaml"), ("qa_demo.yaml", "qa_reproduce.yaml")])
def test_no_demo_choice_is_a_schema_default(demo, reproduction):
    """Where a demo differs from its recipe's reproduction, the schema's default is not the demo's value
    (a reproduction that forgot the key would silently run the demo's choice)."""
    defaults = runconfig.with_defaults({"run_name": "x"}, SCHEMA)
    _, demo_values = runconfig.read_layer(REPO / "config" / demo)
    ref_config, _ = runconfig.resolve([runconfig.read_layer(REPO / "config" / reproduction)], SCHEMA)
    leaks = []
    for path, value in runconfig.leaves(demo_values):
        key = ".".join(map(str, path))
        in_ref, ref_value = runconfig._get(ref_config, path)
        has_default, default = runconfig._get(defaults, path)
        if (not in_ref or ref_value != value) and has_default and default == value and key not in NEUTRAL_DEFAULTS:
            leaks.append(f"{key}: schema default {default!r} is the demo's value")
    assert leaks == []


def test_known_demo_values_are_not_schema_defaults():
    defaults = runconfig.with_defaults({"run_name": "x"}, SCHEMA)
    assert defaults["train"]["total_steps"] is None and defaults["train"]["val_generations"] is None
    assert defaults["eval"]["max_visits"] is None and defaults["eval"]["max_patients"] is None
    assert defaults["train"]["trl"]["stop_at_json"] is False and defaults["train"]["kl"]["coef"] == 0.001
    assert defaults["judge"]["rubric"] == "config/rubrics/rubric_v2_rubricarm_scalar.yaml"  # not the SmolLM2 judge


# ----------------------------------------------------------------------------- CLI
def test_config_show_prints_each_value_with_its_source(in_repo, capsys):
    assert main(["config", "show", "--configfile", "config/reproduce.yaml"]) == 0
    lines = capsys.readouterr().out.splitlines()
    assert lines[0] == "# configfiles: config/reproduce.yaml"
    assert "train.lr: 3e-06  # config/reproduce.yaml" in lines
    assert "train.total_steps: null  # schema default" in lines
    assert "eval.max_visits: null  # schema default" in lines
    assert not any("config/config.yaml" in line for line in lines)
    # no file named: the embedded demo, as `snakemake` without --configfile
    assert main(["config", "show"]) == 0
    assert "train.total_steps: 4  # config/config.yaml" in capsys.readouterr().out


def test_config_show_yaml_is_a_complete_config_that_resolves_the_same(in_repo, tmp_path, capsys):
    assert main(["config", "show", "--configfile", "config/qa_demo.yaml", "--yaml"]) == 0
    printed = tmp_path / "effective.yaml"
    printed.write_text(capsys.readouterr().out)
    again, _ = runconfig.resolve([runconfig.read_layer(printed)], SCHEMA)
    original, _ = runconfig.resolve([runconfig.read_layer("config/qa_demo.yaml")], SCHEMA)
    assert again == original


def test_crossing_recipes_is_one_line_from_the_cli(in_repo, capsys):
    rc = main(["config", "show", "--configfile", "config/reproduce.yaml", "config/qa_reproduce.yaml"])
    err = capsys.readouterr().err
    assert rc == 2 and len(err.strip().splitlines()) == 1 and "never cross recipes" in err


def test_config_diff_of_two_files(in_repo, capsys):
    assert main(["config", "diff", "config/config.yaml", "config/reproduce.yaml"]) == 1
    lines = capsys.readouterr().out.splitlines()
    assert 'train.total_steps: 4 (config/config.yaml) -> null (schema default)' in lines
    assert 'train.lr: 0.0002 (config/config.yaml) -> 3e-06 (config/reproduce.yaml)' in lines
    assert any(line.startswith("models.llama-3.2-3b-instruct.repo_id: (absent) -> ") for line in lines)
    assert main(["config", "diff", "config/reproduce.yaml", "config/reproduce.yaml"]) == 0
    assert capsys.readouterr().out.strip() == "no difference"


def test_config_diff_of_two_runs_and_show_of_a_run(in_repo, tmp_path, capsys):
    runs = []
    for name, lr in (("a", 1e-4), ("b", 2e-4)):
        layers = [runconfig.read_layer("config/config.yaml"), ("--config", {"run_name": name, "train": {"lr": lr}})]
        config, _ = runconfig.resolve(layers, SCHEMA)
        runconfig.write_run_config(tmp_path / name / "config.yaml", config, layers)
        runs.append(tmp_path / name)
    assert main(["config", "diff", str(runs[0]), str(runs[1] / "config.yaml")]) == 1
    out = capsys.readouterr().out.splitlines()
    assert out == ['run_name: "a" (--config) -> "b" (--config)', "train.lr: 0.0001 (--config) -> 0.0002 (--config)"]
    assert main(["config", "show", "--run", str(runs[0])]) == 0
    shown = capsys.readouterr().out.splitlines()
    assert shown[0] == "# configfiles: config/config.yaml" and "train.lr: 0.0001  # --config" in shown
    assert main(["config", "diff", str(tmp_path / "a"), str(tmp_path / "nowhere")]) == 2
    assert "nowhere" in capsys.readouterr().err


def test_llmrnn_check_reads_the_named_file_alone(in_repo, tmp_path):
    """`llmrnn check --configfile F` checks what `snakemake --configfile F` runs: F, not F over the demo."""
    out = tmp_path / "report.json"
    main(["check", "--configfile", "config/reproduce.yaml", "config/qa_reproduce.yaml", "--out", str(out)])
    report = json.loads(out.read_text())
    assert report["configfiles"] == ["config/reproduce.yaml", "config/qa_reproduce.yaml"]
    assert any("never cross recipes" in p for p in report["problems"])
    main(["check", "--out", str(out)])
    assert json.loads(out.read_text())["configfiles"] == ["config/config.yaml"]


# ----------------------------------------------------------------------------- the real workflow
@pytest.mark.e2e  # a slow tier test (a workflow, CLI or training run of its own): `make test-e2e`
@pytest.mark.slow
def test_a_run_writes_its_effective_config_and_named_files_replace_the_demo(workflow_dir):
    from tests.conftest import snakemake

    over = _write(workflow_dir / "over.yaml", {"cohort": {"synthetic": {"patients": 24}}})
    snakemake(workflow_dir, "--configfile", "config/config.yaml", "over.yaml", "--config", "run_name=cfgtest",
              "--", "resources/cohort/synthetic.json")
    doc = yaml.safe_load((workflow_dir / "results/cfgtest/config.yaml").read_text())
    assert doc["configfiles"] == ["config/config.yaml", "over.yaml"]
    config, sources = doc["config"], doc["sources"]
    assert (config["run_name"], sources["run_name"]) == ("cfgtest", "--config")
    assert (config["cohort"]["synthetic"]["patients"], sources["cohort"]["synthetic"]["patients"]) == (24, str(over.name))
    assert (config["train"]["total_steps"], sources["train"]["total_steps"]) == (4, "config/config.yaml")
    assert sources["eval"]["patient_seed"] == runconfig.SCHEMA_DEFAULT
    # a file named alone is all there is: no demo value (total_steps 4, max_visits 4) in its plan
    # (split sizes named too: the schema's reference sizes, 100/100, leave 24 patients no test split)
    _write(workflow_dir / "alone.yaml", {"cohort": {"synthetic": {"patients": 24}},
                                         "split": {"val_size": 4, "train_size": 12}})
    plan = snakemake(workflow_dir, "-n", "-p", "all", "--configfile", "alone.yaml", "--config", "run_name=alone",
                     check=False)
    assert plan.returncode == 0, plan.stderr[-3000:]
    assert '"total_steps": 4' not in plan.stdout and '"max_visits": 4' not in plan.stdout
    assert '"total_steps": null' in plan.stdout
    assert not (workflow_dir / "results/alone").exists()  # a dry run writes nothing
    # crossing recipes stops the parse with the one line
    bad = snakemake(workflow_dir, "-n", "--configfile", "config/reproduce.yaml", "config/qa_reproduce.yaml",
                    check=False)
    assert bad.returncode != 0 and "never cross recipes" in bad.stdout + bad.stderr
