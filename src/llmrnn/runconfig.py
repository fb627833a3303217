"""The effective config of a run: the config files it named, every value the rules read, and the file
each value came from (a config file, `--config` on the command line, or the schema's default).

How configs combine (the Snakefile does the same): the files named with `--configfile` (a profile's
`configfile:` too) are layered in order, later keys over earlier ones, over the schema's defaults
(workflow/schemas/config.schema.yaml). config/config.yaml, the embedded CPU demo, is read ONLY when no
file is named: a run of config/reproduce.yaml never sees a demo value. Layers never cross recipes: two
files that name different `recipe`s are refused.

    llmrnn config show [--configfile F ...] [--run results/RUN]   every value with its source
    llmrnn config diff A B       A, B: a config file, a run's config.yaml, or a results/RUN folder

Every run writes `results/RUN/config.yaml` when it starts (the Snakefile's onstart): `configfiles`,
`config` (what the rules read) and `sources` (the same shape as `config`, each value's source).
"""

from __future__ import annotations

import argparse
import copy
import json
import os
import sys
from collections.abc import Iterator, Mapping
from pathlib import Path
from typing import Any

import yaml

from llmrnn.errors import InputError, doc_summary
from llmrnn.io import deep_merge, read_yaml, write_text
from llmrnn.settings import render, section_defaults
from llmrnn.settings.masking import mask

SCHEMA = Path("workflow/schemas/config.schema.yaml")
DEFAULT_CONFIG = Path("config/config.yaml")
SCHEMA_DEFAULT = "schema default"
COMMAND_LINE = "--config"
RUN_CONFIG_KEYS = ("configfiles", "config", "sources")

Layer = tuple[str, dict]


def find_schema(given: str | os.PathLike | None = None) -> Path:
    """The config schema: `given`, else workflow/schemas/ of the working directory (the workflow folder a
    run starts in), else of the repository this package lies in; none is one line, not a traceback."""
    if given is not None:
        return Path(given)
    for candidate in (SCHEMA, Path(__file__).resolve().parents[2] / SCHEMA):
        if candidate.is_file():
            return candidate
    raise InputError(f"config: the schema {SCHEMA} is neither under the working directory nor beside the "
                     "llmrnn package; run from the llmrnn workflow folder (where the Snakefile is)")


def configfiles_for(given: list | tuple | None) -> list[Path]:
    """The files a run layers: the ones named, or config/config.yaml when none is (the Snakefile's rule)."""
    return [Path(p) for p in given] if given else [DEFAULT_CONFIG]


def label(path: str | os.PathLike) -> str:
    """A file's name as the user typed it: relative to the working directory when inside it."""
    p = Path(path)
    try:
        return str(p.resolve().relative_to(Path.cwd().resolve()))
    except ValueError:
        return str(p)


def read_layer(path: str | os.PathLike) -> Layer:
    """(label, mapping) of one config file; a missing, unparsable or non-mapping file is one line."""
    data = read_yaml(path, "config file")  # the one YAML policy (llmrnn.io): bombs, fifos, duplicates refused
    if data is None:
        data = {}
    if not isinstance(data, dict):
        raise InputError(f"{path}: a config file must be a YAML mapping, got {type(data).__name__}")
    return label(path), data


def layer_problems(layers: list[Layer]) -> list[str]:
    """Layers never cross recipes: a file naming `recipe` must agree with every earlier file that names
    one (a file without `recipe` is an overlay of whatever it is layered on)."""
    problems, named = [], None
    for name, data in layers:
        recipe = data.get("recipe")
        if recipe is None:
            continue
        if named is not None and recipe != named[1]:
            problems.append(
                f"config: {name} (recipe {recipe}) is layered over {named[0]} (recipe {named[1]}): config "
                f"layers never cross recipes; run {name} on its own (docs/configuration.md, 'How configs combine')"
            )
        named = named or (name, recipe)
    return problems


def with_defaults(config: dict, schema_path: str | os.PathLike | None = None) -> dict:
    """A validated copy of `config` with the schema's defaults filled in, by Snakemake's own validate()
    (the workflow's `validate(config, schema)`); a schema error is one line."""
    from snakemake.exceptions import WorkflowError
    from snakemake.utils import validate

    filled = copy.deepcopy(config)
    try:
        validate(filled, str(find_schema(schema_path).resolve()))
    except WorkflowError as exc:
        raise InputError(f"config: {' '.join(str(exc).split())[:500]}") from None
    return copy.deepcopy(filled)  # defaults are the schema's own objects: never share them


def fill_defaults(instance: Any, schema: dict) -> None:
    """The schema's `default:` values into a config in place, without validating it (what
    snakemake.utils.validate(set_default=True) fills; `llmrnn check` fills them after it has listed every
    schema problem and dropped the bad values)."""
    if not isinstance(instance, dict) or schema.get("type") not in (None, "object"):
        return
    for key, sub in (schema.get("properties") or {}).items():
        if key not in instance and "default" in sub:
            instance[key] = copy.deepcopy(sub["default"])
        if key in instance:
            fill_defaults(instance[key], sub)


def filled(section: str, given: Mapping | None) -> dict:
    """A config section as a library or CLI caller passed it (partial, or None) over the models' defaults
    (llmrnn.settings, the defaults a workflow run gets from the schema): `filled("eval.stats", cfg)["seed"]`.
    Keys the models do not know (an engine's own, such as enable_lora) pass through."""
    return deep_merge(section_defaults(section), dict(given or {}))


def leaves(tree: Any, path: tuple = ()) -> Iterator[tuple[tuple, Any]]:
    """(path, value) of every leaf: a value that is not a mapping, or an empty mapping."""
    if isinstance(tree, Mapping) and tree:
        for key, value in tree.items():
            yield from leaves(value, (*path, key))
    else:
        yield path, tree


def _get(tree: Any, path: tuple) -> tuple[bool, Any]:
    for key in path:
        if not isinstance(tree, Mapping) or key not in tree:
            return False, None
        tree = tree[key]
    return True, tree


def _set(tree: dict, path: tuple, value: Any) -> None:
    for key in path[:-1]:
        tree = tree.setdefault(key, {})
    tree[path[-1]] = value


def sources_of(config: dict, layers: list[Layer]) -> dict:
    """The shape of `config`, each leaf replaced by its source: the last layer that set that leaf (layers
    merge mapping by mapping, anything else replaces), else the schema's default."""
    sources: dict = {}
    for path, _ in leaves(config):
        source = SCHEMA_DEFAULT
        for name, data in reversed(layers):
            found, value = _get(data, path)
            if found and (not isinstance(value, Mapping) or not value):
                source = name
                break
        _set(sources, path, source)
    return sources


def resolve(layers: list[Layer], schema_path: str | os.PathLike | None = None) -> tuple[dict, dict]:
    """(effective config, sources) of config layers, refused when they cross recipes."""
    problems = layer_problems(layers)
    if problems:
        raise InputError(problems[0])
    merged: dict = {}
    for _, data in layers:
        merged = deep_merge(merged, data)
    config = with_defaults(merged, schema_path)
    return config, sources_of(config, layers)


def run_config(config: dict, layers: list[Layer]) -> dict:
    """The document of RUN/config.yaml: the layers' names, the config as the rules read it, its sources."""
    return {
        "configfiles": [name for name, _ in layers if name != COMMAND_LINE],
        "config": config,
        "sources": sources_of(config, layers),
    }


HEADER = (
    "# The effective config of run {run}, written when the run started. `config` is what the rules read\n"
    "# (schema defaults filled in); `sources` has the same shape and names each value's source: a config\n"
    "# file, --config (command line) or 'schema default' (workflow/schemas/config.schema.yaml).\n"
    "# Print it: llmrnn config show --run {folder}; compare runs: llmrnn config diff A B\n"
)


def write_run_config(path: str | os.PathLike, config: dict, layers: list[Layer]) -> None:
    """RUN/config.yaml, atomically (a killed start never leaves half a file)."""
    doc = run_config(json.loads(json.dumps(config)), layers)  # plain types (Snakemake's config may hold others)
    text = HEADER.format(run=config.get("run_name"), folder=Path(path).parent)
    try:
        write_text(path, text + yaml.safe_dump(doc, sort_keys=False, allow_unicode=True, width=110))
    except OSError as exc:  # a full disk, a read-only or missing folder: one line naming the file
        raise InputError(f"{path}: cannot write the run's config ({exc.strerror or type(exc).__name__})") from None


def snakemake_layers(configfiles: list, command_line: Mapping | None) -> list[Layer]:
    """The layers of a Snakemake invocation: the config files it loaded (workflow.configfiles), then the
    `--config key=value` values (workflow.config_settings.config)."""
    layers = [read_layer(p) for p in configfiles]
    if command_line:
        layers.append((COMMAND_LINE, json.loads(json.dumps(dict(command_line), default=str))))
    return layers


# ----------------------------------------------------------------------------- show / diff
def load_any(spec: str | os.PathLike, schema_path: str | os.PathLike | None = None) -> dict:
    """A RUN/config.yaml document from: a run's config.yaml, a results/RUN folder, or a config file
    (resolved alone over the schema's defaults, as a run naming only that file would be)."""
    path = Path(spec)
    if path.is_dir():
        if not (path / "config.yaml").is_file():
            raise InputError(f"{path}: no config.yaml (a run writes RUN/config.yaml when it starts)")
        path = path / "config.yaml"
    name, data = read_layer(path)
    if set(data) == set(RUN_CONFIG_KEYS):
        return _run_doc(path, data)
    config, sources = resolve([(name, data)], schema_path)
    return {"configfiles": [name], "config": config, "sources": sources}


def _run_doc(path: Path, data: dict) -> dict:
    """A RUN/config.yaml document as write_run_config writes it; a damaged one is one line."""
    if not isinstance(data["config"], dict) or not isinstance(data["sources"], dict):
        raise InputError(f"{path}: config and sources must be mappings")
    files = data["configfiles"]
    if not isinstance(files, list) or not all(isinstance(f, str) for f in files):
        raise InputError(f"{path}: configfiles must be a list of file names")
    try:  # write_run_config writes plain JSON types only; a date or binary value is not one of ours
        json.dumps(data["config"])
    except (TypeError, ValueError) as exc:
        raise InputError(f"{path}: config holds a value that is not plain data ({exc})") from None
    return data


def _dotted(path: tuple) -> str:
    return ".".join(str(k) for k in path)


def _value(value: Any) -> str:
    return json.dumps(value, ensure_ascii=False)


def show_lines(doc: dict) -> list[str]:
    """`key: value  # source`, one line per value, in config order; a value that looks like a secret is
    masked (llmrnn.settings.masking)."""
    lines = [f"# configfiles: {', '.join(doc['configfiles']) or '(none)'}"]
    for path, value in leaves(mask(doc["config"])):
        _, source = _get(doc["sources"], path)
        lines.append(f"{_dotted(path)}: {_value(value)}  # {source or '?'}")
    return lines


def diff_lines(a: dict, b: dict) -> list[str]:
    """One line per value that differs (or exists on one side only): `key: A (source) -> B (source)`;
    values compared as they are, shown masked where they look like a secret (llmrnn.settings.masking)."""
    left = dict(leaves(a["config"]))
    right = dict(leaves(b["config"]))
    shown = {id(a): dict(leaves(mask(a["config"]))), id(b): dict(leaves(mask(b["config"])))}
    lines = []
    for path in [*left, *(p for p in right if p not in left)]:
        if path in left and path in right and left[path] == right[path]:
            continue
        sides = []
        for doc, values in ((a, left), (b, right)):
            if path in values:
                sides.append(f"{_value(shown[id(doc)].get(path, '***'))} ({_get(doc['sources'], path)[1] or '?'})")
            else:
                sides.append("(absent)")
        lines.append(f"{_dotted(path)}: {sides[0]} -> {sides[1]}")
    return lines


def _cmd_show(args: argparse.Namespace) -> int:
    if args.run and args.configfile:
        raise InputError("config show: give --run or --configfile, not both")
    if args.run:
        doc = load_any(args.run)
    else:
        layers = [read_layer(p) for p in configfiles_for(args.configfile)]
        config, sources = resolve(layers)
        doc = {"configfiles": [n for n, _ in layers], "config": config, "sources": sources}
    if args.yaml:  # the effective config alone: a complete config file that runs the same
        sys.stdout.write(yaml.safe_dump(mask(doc["config"]), sort_keys=False, allow_unicode=True))
    else:
        print("\n".join(show_lines(doc)))
    return 0


def _cmd_diff(args: argparse.Namespace) -> int:
    lines = diff_lines(load_any(args.a), load_any(args.b))
    print("\n".join(lines) if lines else "no difference")
    return 1 if lines else 0


def _cmd_schema(args: argparse.Namespace) -> int:
    # the checkout whose schema runs and `llmrnn check` read (find_schema: the working directory's workflow
    # folder first), not the one the package was installed from: a default edited by hand in the workflow
    # folder a run starts in was never compared with the models
    root = find_schema().resolve().parents[2]
    if args.write:
        changed = render.write(root)
        print("\n".join(f"wrote {p}" for p in changed) if changed else "up to date")
        return 0
    if args.check:
        changed = render.stale(root)
        for path in changed:
            print(f"{path}: differs from the config models (src/llmrnn/settings/); run llmrnn config schema --write")
        return 1 if changed else 0
    sys.stdout.write(render.schema_text())
    return 0


def register(sub) -> None:
    p = sub.add_parser("config", help="the effective config of a run or of config files, with each value's source",
                       description=doc_summary(__doc__))
    verbs = p.add_subparsers(dest="verb", required=True)
    s = verbs.add_parser("show", help="every value of the effective config and the file it came from")
    s.add_argument("--configfile", nargs="+", default=[],
                   help="config files layered in order, as snakemake --configfile; none: config/config.yaml")
    s.add_argument("--run", help="a run's config.yaml or its results/RUN folder")
    s.add_argument("--yaml", action="store_true", help="print the effective config alone, as a config file")
    s.set_defaults(func=_cmd_show)
    d = verbs.add_parser("diff", help="values that differ between two runs or config files (exit 1 if any)")
    d.add_argument("a", help="a config file, a run's config.yaml or a results/RUN folder")
    d.add_argument("b", help="the same kinds as a")
    d.set_defaults(func=_cmd_diff)
    g = verbs.add_parser("schema", help="the config schema and key tables generated from the config models")
    mode = g.add_mutually_exclusive_group()
    mode.add_argument("--write", action="store_true",
                      help="regenerate workflow/schemas/config.schema.yaml and docs/configuration.md's key tables")
    mode.add_argument("--check", action="store_true", help="exit 1 when a generated file differs from the models")
    g.set_defaults(func=_cmd_schema)
