"""Every setting in one typed home (llmrnn.settings): the workflow schema and the key tables of
docs/configuration.md are generated from the models and checked in sync; a config default is written once."""

from __future__ import annotations

import ast
import json
import shutil
from pathlib import Path

import pytest
import yaml
from pydantic import BaseModel

from llmrnn.settings import Config, render, section_defaults
from llmrnn.settings.workflow import ModelSpec, Role

REPO = Path(__file__).resolve().parents[1]


def test_generated_files_match_the_models():
    """workflow/schemas/config.schema.yaml and docs/configuration.md are what `llmrnn config schema --write`
    writes from the models."""
    assert render.stale(REPO) == [], "run: llmrnn config schema --write"


def test_a_hand_edit_of_a_generated_file_is_found(tmp_path):
    for rel in (render.SCHEMA_FILE, render.SCHEMA_JSON_FILE, render.DOCS_FILE):
        (tmp_path / rel).parent.mkdir(parents=True, exist_ok=True)
        shutil.copy(REPO / rel, tmp_path / rel)
    assert render.stale(tmp_path) == []
    schema = tmp_path / render.SCHEMA_FILE
    schema.write_text(schema.read_text().replace("default: 3.0e-06", "default: 1.0e-05", 1))
    docs = tmp_path / render.DOCS_FILE
    docs.write_text(docs.read_text().replace("| `train.lr` |", "| `train.learning_rate` |", 1))
    assert render.stale(tmp_path) == [render.SCHEMA_FILE, render.DOCS_FILE]
    # the JSON twin Snakemake validates against is checked as well
    twin = tmp_path / render.SCHEMA_JSON_FILE
    twin.write_text(twin.read_text().replace('"default": 3e-06', '"default": 1e-05', 1))
    assert render.SCHEMA_JSON_FILE in render.stale(tmp_path)


def test_snakemake_validates_against_the_json_twin_of_the_schema():
    assert json.loads((REPO / render.SCHEMA_JSON_FILE).read_text()) == yaml.safe_load(
        (REPO / render.SCHEMA_FILE).read_text())
    assert 'schema="../workflow/schemas/config.schema.json"' in (REPO / "rules" / "common.smk").read_text()


def test_the_schema_carries_the_models_defaults_and_bounds():
    schema = yaml.safe_load((REPO / render.SCHEMA_FILE).read_text())
    train = schema["properties"]["train"]["properties"]
    assert train["lr"] == {**train["lr"], "type": "number", "exclusiveMinimum": 0, "default": 3e-6}
    assert schema["properties"]["train"]["additionalProperties"] is False
    assert schema["properties"]["roles"]["properties"]["memory"]["default"] == {"max_tokens": 128}
    custom = schema["properties"]["reward"]["properties"]["custom"]["properties"]
    assert custom["path"]["default"] is None and custom["name"]["default"] == "compute_score"


def _fields(model: type[BaseModel], prefix: str = ""):
    for name, info in model.model_fields.items():
        yield f"{prefix}{name}", info
        tp = info.annotation
        if isinstance(tp, type) and issubclass(tp, BaseModel):
            yield from _fields(tp, f"{prefix}{name}.")


def test_every_key_has_one_line_of_help():
    missing = [key for model, pre in ((Config, ""), (Role, "roles.<role>."), (ModelSpec, "models.<name>."))
               for key, info in _fields(model, pre)
               if not (isinstance(info.annotation, type) and issubclass(info.annotation, BaseModel))
               and not (info.description or "").strip()]
    assert not missing


def test_qa_format_weight_has_one_default():
    """It was 0.2 in the schema (what every workflow run got) and 0.0 in qa/rewards.py."""
    from llmrnn.qa.rewards import DEFAULT_WEIGHTS, reward_config

    schema = yaml.safe_load((REPO / render.SCHEMA_FILE).read_text())
    weights = schema["properties"]["qa"]["properties"]["reward"]["properties"]["weights"]["properties"]
    assert weights["format"]["default"] == DEFAULT_WEIGHTS["format"] == 0.2
    assert reward_config({"weights": {"exact_match": 1.0}})["weights"]["format"] == 0.2
    assert section_defaults("qa.reward")["weights"] == DEFAULT_WEIGHTS


# --------------------------------------------------------------------------- no config default written twice
def _config_keys() -> set[str]:
    return {key.rsplit(".", 1)[-1] for model in (Config, Role, ModelSpec) for key, _ in _fields(model)}


def literal_defaults(root: Path) -> list[str]:
    """`x.get("<config key>", <literal>)` (also setdefault/pop) in src/llmrnn outside llmrnn.settings: a
    default written a second time, which drifts (rnn.py's max_tokens 256 against the schema's 96)."""
    keys, hits = _config_keys(), []
    for path in sorted((root / "src" / "llmrnn").rglob("*.py")):
        if "settings" in path.parts:
            continue
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            if (isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute)
                    and node.func.attr in ("get", "setdefault", "pop") and len(node.args) == 2
                    and isinstance(node.args[0], ast.Constant) and node.args[0].value in keys
                    and isinstance(node.args[1], ast.Constant) and node.args[1].value is not None):
                hits.append(f"{path.relative_to(root)}:{node.lineno}: {ast.unparse(node)}")
    return hits


def test_no_literal_config_default_outside_settings():
    """Every default is the models' (runconfig.filled, settings.section_defaults, backends.role_settings)."""
    assert literal_defaults(REPO) == []


def test_the_scan_finds_a_literal_default(tmp_path):
    src = tmp_path / "src" / "llmrnn"
    src.mkdir(parents=True)
    (src / "stage.py").write_text("def f(cfg):\n    return cfg.get('group_size', 8), cfg.get('run_name')\n")
    assert literal_defaults(tmp_path) == ["src/llmrnn/stage.py:2: cfg.get('group_size', 8)"]


def resources_sections(model: type[BaseModel] = Config, prefix: str = "") -> dict[str, type[BaseModel]]:
    """Every `resources` section of the config, by its dotted key."""
    out = {}
    for name, info in model.model_fields.items():
        tp = info.annotation
        if isinstance(tp, type) and issubclass(tp, BaseModel):
            out.update({f"{prefix}{name}": tp} if name == "resources" else resources_sections(tp, f"{prefix}{name}."))
    return out


def test_every_stages_resources_is_the_one_resources_model_with_its_own_defaults():
    """One Resources model (llmrnn.settings.base): each stage's `resources` has its fields and bounds, only
    the defaults and the job its help names differ; a bad value is refused the same way in every stage."""
    from llmrnn.errors import InputError
    from llmrnn.settings.base import GpuResources, Resources, parse

    sections = resources_sections()
    assert set(sections) == {"qa.sft.resources", "qa.eval.resources", "trajectories.resources", "eval.resources",
                             "judge.resources", "train.resources", "merge.resources"}
    shared = {name: info.metadata for name, info in GpuResources.model_fields.items()}
    for key, model in sections.items():
        assert issubclass(model, Resources), key
        assert {n: i.metadata for n, i in model.model_fields.items()} == {
            n: m for n, m in shared.items() if n in model.model_fields}, key
        assert set(model.model_fields) == set(shared) - ({"gpu"} if key == "judge.resources" else set()), key
        with pytest.raises(InputError, match=rf"^{key}\.mem_mb: Input should be greater than or equal to 1 \(got 0\)$"):
            parse(model, {"mem_mb": 0}, key)
    assert section_defaults("judge.resources") == {"mem_mb": 8000, "runtime": 1440, "cpus_per_task": 2}
    assert section_defaults("qa.eval.resources") == {"gpu": 0, "mem_mb": 6000, "runtime": 60, "cpus_per_task": 1}
    assert section_defaults("train.resources")["gpu"] is None  # null: the engine decides
    assert sections["merge.resources"].model_fields["mem_mb"].description == "memory of the merge_model job (MB)"
