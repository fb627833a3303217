"""The workflow's rules as Snakemake itself reads them: one reader the tests share (test_layout,
test_provenance, test_rules_quoting, test_private_logs, test_docs_current, the rerun table, the SLURM profile).

A rule file is never parsed here: Snakemake's `Workflow` object (snakemake.workflow.Workflow, the object a
Snakefile sees as `workflow`, built as `SnakemakeApi.workflow()` builds it) includes the Snakefile under a
recipe's config, and each rule is read from it: its name (a computed `name:` as that recipe names it), its
file, its shell command, its outputs, params and resources; a `use rule` child comes with what it took from
its parent. Building one costs a few seconds, so each (Snakefile, configs) is built once per process.
"""

from __future__ import annotations

import ast
import functools
import json
import os
import re
import sys
from dataclasses import dataclass
from pathlib import Path

from snakemake.api import SnakemakeApi
from snakemake.common import get_input_function_aux_params
from snakemake.iocontainers import InputFiles, Wildcards
from snakemake.parser import parse
from snakemake.rules import Rule
from snakemake.settings.enums import Quietness
from snakemake.settings.types import (
    ConfigSettings,
    DeploymentSettings,
    OutputSettings,
    ResourceSettings,
    StorageSettings,
    WorkflowSettings,
)
from snakemake.sourcecache import infer_source_file
from snakemake.workflow import Workflow

REPO = Path(__file__).resolve().parents[1]
SNAKEFILE = REPO / "Snakefile"
# one config per recipe (memory_head: the embedded demo; qa: the QA demo): between them every rule exists
RECIPE_CONFIGS = ("config/config.yaml", "config/qa_demo.yaml")
# the first `llmrnn <verb> [<sub>]` of a shell command (the command string Snakemake holds, not a rule file)
COMMAND = re.compile(r"llmrnn ([a-z][\w-]*)(?: ([a-z][\w-]*))?")


def load_workflow(snakefile: Path, configfiles: tuple[Path, ...] = (), config: dict | None = None) -> Workflow:
    """The workflow object of a Snakefile under config files (+ `--config` values), its rules included and
    checked as a Snakemake run reads them. The process keeps its environment, import path and folder: the
    rules set variables for their jobs (LLMRNN_REPO, ...) that a test's own commands must not inherit."""
    env, path, cwd = dict(os.environ), list(sys.path), Path.cwd()
    try:
        with SnakemakeApi(OutputSettings(quiet={Quietness.ALL})) as api:
            workflow = Workflow(
                config_settings=ConfigSettings(configfiles=list(configfiles), config=config or {}),
                resource_settings=ResourceSettings(cores=1),
                workflow_settings=WorkflowSettings(),
                storage_settings=StorageSettings(),
                deployment_settings=DeploymentSettings(),
                logger_manager=api.logger_manager,
            )
            workflow.include(snakefile, overwrite_default_target=True)
            workflow.check()
    finally:
        os.environ.clear()
        os.environ.update(env)
        sys.path[:] = path
        os.chdir(cwd)
    return workflow


@dataclass(frozen=True)
class WorkflowRule:
    """One rule as Snakemake built it (`rule`: Snakemake's own Rule) and the recipe configs it was read under."""

    rule: Rule
    configfiles: tuple[str, ...]
    root: Path

    @property
    def name(self) -> str:
        return self.rule.name

    @property
    def file(self) -> str:
        """The rule file that declares it, relative to the workflow folder (`rules/train.smk`)."""
        path = Path(self.rule.snakefile)
        return str(path.relative_to(self.root)) if path.is_relative_to(self.root) else str(path)

    @property
    def shell(self) -> str:
        """Its shell command before formatting ("" for a rule without one)."""
        return self.rule.shellcmd or ""

    @property
    def command(self) -> str | None:
        """The `llmrnn verb [sub]` its shell runs, or None."""
        m = COMMAND.search(self.shell)
        return " ".join(["llmrnn", *(g for g in m.groups() if g)]) if m else None

    @property
    def outputs(self) -> list[str]:
        """The names of its named outputs."""
        return list(self.rule.output.keys())

    @property
    def params(self) -> dict:
        return dict(self.rule.params.items())

    @property
    def resources(self) -> dict:
        """The resources it declares (those Snakemake gives every rule left out)."""
        return {k: v for k, v in self.rule.resources.items() if k not in {"_cores", "_nodes", "tmpdir"}}

    @property
    def has_wildcards(self) -> bool:
        """Whether its outputs hold wildcards (so it cannot be a target by name)."""
        return self.rule.has_wildcards()

    def called_param(self, name: str, **inputs: str):
        """A params function's value as Snakemake computes it for a job with these named inputs (and no
        wildcards); a plain param's value as it is."""
        value = self.params[name]
        if not callable(value):
            return value
        aux = get_input_function_aux_params(value, {"input": InputFiles(fromdict=inputs), "output": self.rule.output})
        return value(Wildcards(), **aux)


@functools.cache
def recipe_workflow(snakefile: Path, configfiles: tuple[str, ...], config_json: str = "{}") -> Workflow:
    root = snakefile.parent
    return load_workflow(snakefile, tuple(root / f for f in configfiles), json.loads(config_json))


def workflow_rules(snakefile: Path = SNAKEFILE, configs: tuple[str, ...] = RECIPE_CONFIGS,
                   config: dict | None = None) -> dict[str, WorkflowRule]:
    """rule name -> the rule, over the workflow built under each config (a rule both recipes have, as the
    first reads it; a rule named by the plan, under each name it gives). `configs=()`: the Snakefile alone."""
    found: dict[str, WorkflowRule] = {}
    for files in [(c,) for c in configs] or [()]:
        workflow = recipe_workflow(snakefile, files, json.dumps(config or {}, sort_keys=True))
        for rule in workflow.rules:
            found.setdefault(rule.name, WorkflowRule(rule, files, snakefile.parent))
    return found


def shells_not_literal(rule_file: Path) -> list[str]:
    """`file:line` of each rule of a rule file whose `shell:` is not one plain string literal (an f-string
    or any expression would format config values into the command without `:q`), read from Snakemake's
    own compilation of the file (its parser turns `shell:` into a `workflow.shellcmd(...)` call)."""
    with SnakemakeApi(OutputSettings(quiet={Quietness.ALL})) as api:
        workflow = Workflow(config_settings=ConfigSettings(), resource_settings=ResourceSettings(cores=1),
                            workflow_settings=WorkflowSettings(), storage_settings=StorageSettings(),
                            deployment_settings=DeploymentSettings(), logger_manager=api.logger_manager)
        code, _ = parse(infer_source_file(str(rule_file)), workflow, linemap=(linemap := {}))
    found = []
    for node in ast.walk(ast.parse(code)):
        literal = isinstance(node, ast.Call) and len(node.args) == 1 and isinstance(node.args[0], ast.Constant) \
            and isinstance(node.args[0].value, str)
        if isinstance(node, ast.Call) and ast.unparse(node.func) == "workflow.shellcmd" and not literal:
            found.append(f"{rule_file.name}:{linemap.get(node.lineno, node.lineno)}")
    return found
