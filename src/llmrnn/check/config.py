"""The merged config with schema defaults and every schema problem (`llmrnn check`'s first check)."""

from __future__ import annotations

from pathlib import Path

from llmrnn.configcheck import finding_line, model_findings, shard_problems, value_findings
from llmrnn.errors import InputError
from llmrnn.io import deep_merge, read_yaml
from llmrnn.runconfig import fill_defaults, find_schema, layer_problems, read_layer


def load_config(paths: list[Path], schema_path: Path | None = None) -> tuple[dict, list[str]]:
    """The merged config with schema defaults, and every schema problem (not just the first)."""
    import jsonschema

    problems: list[str] = []
    config: dict = {}
    layers: list[tuple[str, dict]] = []

    for path in paths:
        try:  # the one YAML policy (llmrnn.io.read_yaml): bombs, fifos, duplicate keys, non-UTF-8 refused
            _, data = read_layer(path)
        except InputError as exc:
            problems.append(f"config: {exc}")
            continue
        config = deep_merge(config, data)
        layers.append((str(path), data))
    problems += layer_problems(layers)  # config layers never cross recipes
    try:
        schema = read_yaml(find_schema(schema_path), "config schema")
    except InputError as exc:
        return config, [*problems, f"{exc}" if str(exc).startswith("config:") else f"config: {exc}"]

    findings = value_findings(config)
    secret_paths = [where for where, _, secret in findings if secret]
    validator = jsonschema.Draft202012Validator(schema)
    invalid: list[list] = []
    said = {where for where, _, _ in findings}  # paths a problem line names already
    for err in sorted(validator.iter_errors(config), key=lambda e: list(e.absolute_path)):
        where = ".".join(str(p) for p in err.absolute_path) or "<top>"
        said.add(where)
        if where.endswith("_env"):
            continue  # check_env_names says it from the value itself, without echoing a possible secret
        invalid.append(list(err.absolute_path) if err.validator in VALUE_ERRORS else [])
        if where in {f for f, _, _ in findings}:
            continue  # the finding below says it
        # the schema's message would quote the secret
        if any(s == where or s.startswith((f"{where}.", f"{where}[")) for s in secret_paths):
            problems.append(f"config: {where}: not valid for the schema (value not repeated: it holds a credential)")
            continue
        problems.append(f"config: {where}: {err.message}")
    problems += [f"config: {where}: {problem}" for where, problem, _ in findings]
    for path in invalid:  # the other checks see the schema default, not a value of the wrong type
        _drop(config, path)
    fill_defaults(config, schema)  # the one home of filling schema defaults (runconfig)
    if not invalid:
        problems += [f"config: {p}" for p in shard_problems(config)]
    problems += [f"config: {finding_line(where, problem)}" for where, problem in model_findings(config)
                 if not _said_elsewhere(where, problem, said)]
    return config, problems


def _said_elsewhere(where: str, problem: str, said: set[str]) -> bool:
    """A settings-model finding another line already says: a key the schema or value_findings named, a
    missing key (the schema's), a `*_env` value (check_env_names'), the train section (check_training
    parses it with the same model)."""
    return (where in said or problem.startswith("Field required") or where.endswith("_env")
            or where == "train" or where.startswith("train."))


# schema errors about a value itself (not a misspelt or missing key): the value is dropped for the later checks
VALUE_ERRORS = frozenset({"type", "enum", "const", "pattern", "minimum", "maximum", "exclusiveMinimum",
                          "exclusiveMaximum", "minLength", "maxLength", "minItems", "maxItems", "uniqueItems",
                          "multipleOf", "format"})


def _drop(config: dict, path: list) -> None:
    """Remove the value at `path` (a schema error's location; a bad list item removes its whole list) so
    defaults fill it for the later checks."""
    while path and isinstance(path[-1], int):
        path = path[:-1]
    node = config
    for part in path[:-1]:
        try:
            node = node[part]
        except (KeyError, IndexError, TypeError):
            return
    if path and isinstance(node, dict):
        node.pop(path[-1], None)
