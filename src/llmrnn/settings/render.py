"""The files generated from the config models (llmrnn.settings): the JSON schema Snakemake validates
against and fills defaults from (workflow/schemas/config.schema.yaml, and the same as .json, which Snakemake
reads faster), the key tables of the
configuration reference (docs/configuration.md, between its `<!-- keys: SECTION -->` markers) and the field
table of the trajectory step a reward reads (docs/rewards.md, llmrnn.settings.trajectory_step).

    llmrnn config schema --write    # regenerate both
    llmrnn config schema --check    # exit 1 naming each file that differs from what the models generate
"""

from __future__ import annotations

import json
import re
import types
import typing
from pathlib import Path
from typing import Any, Literal

import annotated_types as at
import yaml
from pydantic import BaseModel
from pydantic.fields import FieldInfo

from llmrnn.io import write_text
from llmrnn.settings import Config, Experiment
from llmrnn.settings.trajectory_step import TrajectoryStep
from llmrnn.settings.workflow import ModelSpec, Role

SCHEMA_FILE = Path("workflow/schemas/config.schema.yaml")
# The same schema as JSON: what rules/common.smk validates against at every Snakemake start (Snakemake reads
# JSON with the json module and YAML with a pure-Python parser, 0.3-0.4 s of each dry run for this schema)
SCHEMA_JSON_FILE = Path("workflow/schemas/config.schema.json")
DOCS_FILE = Path("docs/configuration.md")
# the field table of the trajectory step (what a reward sees of a row), between `<!-- keys: trajectory_step -->`
REWARDS_DOCS_FILE = Path("docs/rewards.md")
HEADER = ("# GENERATED from the config models (src/llmrnn/settings/) by `llmrnn config schema --write`: edit\n"
          "# the models, not this file (tests/test_settings.py fails when the two differ).\n")
_PRIMITIVES = {int: "integer", float: "number", str: "string", bool: "boolean"}
_BOUNDS = {at.Ge: ("ge", "minimum"), at.Gt: ("gt", "exclusiveMinimum"), at.Le: ("le", "maximum"),
           at.Lt: ("lt", "exclusiveMaximum")}
_SHARED = {Role: "role"}  # models written once under $defs and referenced


# ----------------------------------------------------------------------------- schema
def _type_schema(tp: Any) -> dict:
    """The JSON schema of an annotation (without the field's bounds, default or help)."""
    origin, args = typing.get_origin(tp), typing.get_args(tp)
    if origin in (typing.Union, types.UnionType):
        inner = [a for a in args if a is not type(None)]
        sub = _type_schema(inner[0]) if len(inner) == 1 else {}
        if type(None) in args and "type" in sub:
            return {**sub, "type": [sub["type"], "null"]}
        if type(None) in args and "enum" in sub:  # Literal[9, 10] | None
            return {**sub, "enum": [*sub["enum"], None]}
        return sub
    if origin is Literal:
        return {"enum": list(args)}
    if origin is list:
        return {"type": "array", "items": _type_schema(args[0])}
    if origin is dict:
        return {"type": "object", "additionalProperties": _type_schema(args[1])}
    if typing.get_origin(tp) is typing.Annotated:
        return _field_schema(FieldInfo.from_annotation(tp), with_default=False)
    if tp in _SHARED:
        return {"$ref": f"#/$defs/{_SHARED[tp]}"}
    if isinstance(tp, type) and issubclass(tp, BaseModel):
        return model_schema(tp)
    if tp in _PRIMITIVES:
        return {"type": _PRIMITIVES[tp]}
    if tp is Any:
        return {}
    raise TypeError(f"no JSON schema for {tp!r}")


def _bounds(info: FieldInfo, sub: dict) -> dict:
    out = {}
    is_array = sub.get("type") == "array" or sub.get("type") == ["array", "null"]
    for meta in info.metadata:
        for cls, (attr, key) in _BOUNDS.items():
            if isinstance(meta, cls):
                out[key] = getattr(meta, attr)
        if isinstance(meta, at.MinLen):
            out["minItems" if is_array else "minLength"] = meta.min_length
        if isinstance(meta, at.MaxLen):
            out["maxItems" if is_array else "maxLength"] = meta.max_length
        if getattr(meta, "pattern", None):
            out["pattern"] = meta.pattern
    return out


def _default(info: FieldInfo) -> Any:
    value = info.get_default(call_default_factory=True)
    if isinstance(value, BaseModel):
        return value.model_dump(mode="json", exclude_defaults=True)
    if isinstance(value, dict):
        return {k: v.model_dump(mode="json", exclude_unset=True) if isinstance(v, BaseModel) else v
                for k, v in value.items()}
    return value


def _field_schema(info: FieldInfo, with_default: bool = True) -> dict:
    extra = dict(info.json_schema_extra or {})
    no_default = extra.pop("no_default", False)
    sub = {} if "oneOf" in extra else _type_schema(info.annotation)
    sub.update(_bounds(info, sub))
    if with_default and not info.is_required() and not no_default:
        sub["default"] = _default(info)
    if info.description:
        sub["description"] = info.description
    sub.update(extra)
    return sub


def model_schema(model: type[BaseModel]) -> dict:
    """The object schema of one section: its keys, closed unless the model allows extra keys."""
    out: dict = {"type": "object"}
    if model.model_config.get("extra") == "forbid":
        out["additionalProperties"] = False
    out["properties"] = {name: _field_schema(info) for name, info in model.model_fields.items()}
    out.update(model.model_config.get("json_schema_extra") or {})
    return out


def config_schema() -> dict:
    """The whole workflow schema (draft 2020-12), as Snakemake's validate() reads it."""
    body = model_schema(Config)
    return {"$schema": "https://json-schema.org/draft/2020-12/schema",
            "description": "llmrnn workflow configuration (see docs/configuration.md)",
            **body, "$defs": {name: model_schema(model) for model, name in _SHARED.items()}}


class _Dumper(yaml.SafeDumper):
    pass


def _represent_dict(dumper: yaml.SafeDumper, data: dict):
    leaf = not any(isinstance(v, dict) and v for v in data.values()) and len(json.dumps(data)) < 100
    return dumper.represent_mapping("tag:yaml.org,2002:map", data, flow_style=leaf)


def _represent_list(dumper: yaml.SafeDumper, data: list):
    return dumper.represent_sequence("tag:yaml.org,2002:seq", data,
                                     flow_style=all(not isinstance(v, (dict, list)) for v in data))


_Dumper.add_representer(dict, _represent_dict)
_Dumper.add_representer(list, _represent_list)


def schema_text() -> str:
    return HEADER + yaml.dump(config_schema(), Dumper=_Dumper, sort_keys=False, width=120, allow_unicode=True)


# ----------------------------------------------------------------------------- docs tables
def _leaf_rows(model: type[BaseModel], prefix: str = "") -> list[tuple[str, FieldInfo]]:
    rows = []
    for name, info in model.model_fields.items():
        tp = info.annotation
        if isinstance(tp, type) and issubclass(tp, BaseModel) and tp not in _SHARED:
            rows += _leaf_rows(tp, f"{prefix}{name}.")
        else:
            rows.append((f"{prefix}{name}", info))
    return rows


def _cell(text: str) -> str:
    return text.replace("|", "\\|").replace("\n", " ")


def _type_text(info: FieldInfo) -> str:
    sub = _field_schema(info, with_default=False)
    if "oneOf" in sub:
        return " or ".join(_type_text_of(s) for s in sub["oneOf"])
    return _type_text_of(sub)


def _type_text_of(sub: dict) -> str:
    if "enum" in sub:
        return " or ".join(json.dumps(v) for v in sub["enum"])
    if "$ref" in sub:
        return "role"
    kind = sub.get("type", "any")
    if isinstance(kind, list):
        kind = " or ".join(kind)
    if "array" in str(kind) and "items" in sub:
        kind = str(kind).replace("array", f"list of {_type_text_of(sub['items'])}")
    bounds = [f"{op} {sub[k]}" for k, op in (("minimum", ">="), ("exclusiveMinimum", ">"), ("maximum", "<="),
                                            ("exclusiveMaximum", "<"), ("minItems", "items >="),
                                            ("maxLength", "length <=")) if k in sub]
    return kind + (f" ({', '.join(bounds)})" if bounds else "")


def key_table(model: type[BaseModel], prefix: str = "") -> str:
    """The markdown key table of one section: key (its full dotted name from the top of the config, so
    `split.val_size` and `qa.split.val_size` read as the two keys they are), type and bounds, default, help."""
    lines = ["| key | type | default | meaning |", "|---|---|---|---|"]
    for key, info in _leaf_rows(model):
        default = "(required)" if info.is_required() else (
            "" if (info.json_schema_extra or {}).get("no_default") else f"`{json.dumps(_default(info))}`")
        lines.append(f"| `{prefix}{key}` | {_cell(_type_text(info))} | {_cell(default)} | {_cell(info.description or '')} |")
    return "\n".join(lines)


def doc_tables() -> dict[str, str]:
    """Marker name -> generated table: each section of Config, the role keys, the model keys."""
    tables = {}
    top = [(k, i) for k, i in Config.model_fields.items()
           if not (isinstance(i.annotation, type) and issubclass(i.annotation, BaseModel)) and k not in ("models", "experiment")]
    tables["top"] = "\n".join(["| key | type | default | meaning |", "|---|---|---|---|"] + [
        f"| `{k}` | {_cell(_type_text(i))} | {'(required)' if i.is_required() else f'`{json.dumps(_default(i))}`'} "
        f"| {_cell(i.description or '')} |" for k, i in top])
    for name, info in Config.model_fields.items():
        tp = info.annotation
        if isinstance(tp, type) and issubclass(tp, BaseModel):
            tables[name] = key_table(tp, f"{name}.")
    tables["models"] = key_table(ModelSpec, "models.<name>.")
    tables["experiment"] = key_table(Experiment, "experiment.")
    tables["role"] = key_table(Role, "roles.<role>.")
    return tables


def step_table() -> str:
    """The field table of a trajectory step (llmrnn.settings.trajectory_step): key, type, example, meaning."""
    lines = ["| key | type | example | meaning |", "|---|---|---|---|"]
    for key, info in _leaf_rows(TrajectoryStep):
        example = f"`{json.dumps(info.examples[0], ensure_ascii=False)}`" if info.examples else ""
        lines.append(f"| `{key}` | {_cell(_type_text(info))} | {_cell(example)} | {_cell(info.description or '')} |")
    return "\n".join(lines)


def render_docs(text: str, tables: dict[str, str] | None = None, where: Path = DOCS_FILE) -> str:
    """`text` with every `<!-- keys: NAME -->` ... `<!-- /keys -->` block replaced by its generated table
    (`tables`; the config's key tables by default)."""
    tables = doc_tables() if tables is None else tables

    def fill(match: re.Match) -> str:
        name = match.group(1)
        if name not in tables:
            raise KeyError(f"{where}: no generated table named {name!r}; known: {sorted(tables)}")
        return f"<!-- keys: {name} -->\n{tables[name]}\n<!-- /keys -->"

    return re.sub(r"<!-- keys: ([\w.]+) -->\n.*?<!-- /keys -->", fill, text, flags=re.DOTALL)


def generated(root: Path) -> dict[Path, str]:
    """Each generated file (relative to the repository root) and the text the models give it."""
    docs = root / DOCS_FILE
    out = {SCHEMA_FILE: schema_text(), SCHEMA_JSON_FILE: json.dumps(config_schema(), indent=1) + "\n"}
    if docs.is_file():
        out[DOCS_FILE] = render_docs(docs.read_text(encoding="utf-8"))
    rewards = root / REWARDS_DOCS_FILE
    if rewards.is_file():
        out[REWARDS_DOCS_FILE] = render_docs(rewards.read_text(encoding="utf-8"), {"trajectory_step": step_table()},
                                             REWARDS_DOCS_FILE)
    return out


def stale(root: Path) -> list[Path]:
    """The generated files whose checked-in text differs from what the models generate."""
    return [rel for rel, text in generated(root).items()
            if not (root / rel).is_file() or (root / rel).read_text(encoding="utf-8") != text]


def write(root: Path) -> list[Path]:
    changed = stale(root)
    for rel, text in generated(root).items():
        if rel in changed:
            write_text(root / rel, text)
    return changed
