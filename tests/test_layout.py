"""The package reads like its rules: CONTRIBUTING's rule -> command -> module table is true, every output a
rule declares reaches its command, and its layers point one way. No test here measures a module's or a
function's length: code is split by concept (CONTRIBUTING), not to fit a cap."""

from __future__ import annotations

import argparse
import ast
import importlib
import re
from pathlib import Path

from llmrnn import cli, provenance
from tests.rules_api import WorkflowRule, workflow_rules

REPO = Path(__file__).resolve().parents[1]


def rule_file_rules() -> dict[str, WorkflowRule]:
    """Every rule of the rule files (rules/*.smk) under each recipe, as Snakemake builds them (tests.rules_api):
    the Snakefile's own targets (`all`, `eval_heldout`) left out."""
    return {name: rule for name, rule in workflow_rules().items() if rule.file.startswith("rules/")}


def outputs_not_passed(rules: dict[str, WorkflowRule]) -> list[str]:
    """Each named output a rule's shell does not pass to its command; a rule whose outputs have no names
    passes them all (`{output:q}`)."""
    found = [f"rule {name}: output {out} is not passed to its command"
             for name, rule in rules.items() for out in rule.outputs
             if not re.search(rf"\{{output\.{out}(:q)?\}}", rule.shell)]
    return found + [f"rule {name}: its outputs are not passed to its command" for name, rule in rules.items()
                    if rule.rule.output and not rule.outputs and not re.search(r"\{output(:q)?\}", rule.shell)]


def contributing_table() -> dict[str, dict]:
    rows = {}
    text = (REPO / "CONTRIBUTING.md").read_text()
    for line in text.split("## Where is stage X?", 1)[1].split("\n## ", 1)[0].splitlines():
        cells = [c.strip() for c in line.strip().strip("|").split("|")]
        if len(cells) != 4 or not cells[0].startswith("`"):
            continue
        command = re.fullmatch(r"`(llmrnn [^`]+)`", cells[2])
        rows[cells[0].strip("`")] = {
            "file": cells[1],
            "command": command.group(1) if command else None,
            "modules": [m.strip() for m in cells[3].split(",") if m.strip()],
        }
    return rows


def registered_commands(module_name: str) -> set[str]:
    """`llmrnn verb` and `llmrnn verb sub` for every (sub)command the module's register() adds."""
    parser = argparse.ArgumentParser()
    sub = parser.add_subparsers(dest="command")
    importlib.import_module(module_name).register(sub)
    out = set()
    for verb, verb_parser in sub.choices.items():
        out.add(f"llmrnn {verb}")
        for action in verb_parser._actions:
            if isinstance(action, argparse._SubParsersAction):
                out.update(f"llmrnn {verb} {name}" for name in action.choices)
    return out


def module_name(path: str) -> str:
    name = path.removeprefix("src/").removesuffix(".py").replace("/", ".")
    return name.removesuffix(".__init__")


def test_table_lists_every_rule_with_its_file_and_command():
    rules, table = rule_file_rules(), contributing_table()
    assert set(table) == set(rules), (
        f"rules missing from CONTRIBUTING.md: {sorted(set(rules) - set(table))}; "
        f"rows without a rule: {sorted(set(table) - set(rules))}"
    )
    for name, rule in rules.items():
        assert table[name]["file"] == rule.file, name
        assert table[name]["command"] == rule.command, name


def test_each_command_is_registered_by_the_module_the_table_names():
    for name, row in contributing_table().items():
        for path in row["modules"]:
            assert (REPO / path).is_file(), f"{name}: {path} does not exist"
        if row["command"] is None:
            continue
        home = module_name(row["modules"][0])
        assert home in map(cli.stage_module, cli.STAGES), f"{name}: {home} is not a stage module of cli.STAGES"
        assert row["command"] in registered_commands(home), f"{name}: {home} does not register {row['command']}"


def test_every_declared_output_is_passed_to_the_command():
    rules = rule_file_rules()
    assert {"adapter", "metrics", "summary"} <= set(rules["train_grpo"].outputs)  # the reader sees outputs
    assert rules["eval_shard"].rule.output and not rules["eval_shard"].outputs  # and unnamed ones
    assert outputs_not_passed(rules) == []


def test_an_output_left_out_of_the_command_is_found(tmp_path):
    (tmp_path / "Snakefile").write_text(
        "rule demo:\n    input:\n        x=\"a\",\n    output:\n        main=\"b\",\n        side=\"c\",\n"
        "    log:\n        \"l\",\n    shell:\n        \"llmrnn demo run --x {input.x} --out {output.main} 2> {log}\"\n\n\n"
        "rule bare:\n    output:\n        \"d\",\n    shell:\n        \"llmrnn demo bare 2> {log}\"\n"
    )
    rules = workflow_rules(tmp_path / "Snakefile", configs=())
    assert rules["demo"].command == "llmrnn demo run" and rules["demo"].outputs == ["main", "side"]
    assert outputs_not_passed(rules) == ["rule demo: output side is not passed to its command",
                                         "rule bare: its outputs are not passed to its command"]


def test_a_use_rule_takes_its_parents_command_and_its_own_outputs(tmp_path):
    (tmp_path / "Snakefile").write_text(
        "rule demo:\n    output:\n        main=\"b\",\n    shell:\n        \"llmrnn demo run --out {output.main:q}\"\n"
        "\n\nif True:\n\n    use rule demo as twin with:\n        output:\n            main=\"c\",\n"
        "            side=\"d\",\n        log:\n            \"l\",\n\n\nuse rule demo as copy with:\n    log:\n        \"m\",\n"
    )
    rules = workflow_rules(tmp_path / "Snakefile", configs=())
    assert {name: (r.command, r.outputs) for name, r in rules.items()} == {
        "demo": ("llmrnn demo run", ["main"]),
        "twin": ("llmrnn demo run", ["main", "side"]),
        "copy": ("llmrnn demo run", ["main"]),
    }
    assert outputs_not_passed(rules) == ["rule twin: output side is not passed to its command"]


def test_the_trainer_is_execd_so_a_preemption_signal_reaches_it_first():
    """SLURM signals every process of a preempted job: a shell between Snakemake and the trainer dies of it at
    once and the job ends while the trainer saves (tests/slurm/test_preemption.py shows both). Every rule that
    trains runs its command with `exec`."""
    commands = {name: rule.shell for name, rule in rule_file_rules().items() if rule.command == "llmrnn train run"}
    assert commands and all(re.match(r"(umask \d+; )?exec llmrnn train run", shell) for shell in commands.values()), \
        commands


# ----------------------------------------------------------------------------- layers that point one way
# The package bottom up. A module imports (at module level or in a function, as llmrnn.provenance reads it)
# only modules of its own layer or below, and the import graph has no loop; a module entering a package from
# outside imports that package's __init__ too (with_packages). cli sits low: it holds the
# argument types the stages' register() use and loads the stage it dispatches to by name, never by import.
LAYERS: list[tuple[str, set[str]]] = [
    ("leaves", {"errors", "constants", "safe_path", "custom_reward_child", "settings", "settings.base", "settings.workflow", "settings.evaluation",
                "settings.train", "settings.release", "settings.qa", "settings.trajectory_step"}),
    ("helpers", {"io", "transport", "rope", "stats", "jsonparse", "matching", "retry", "prompts", "rubric", "gpus", "upload", "cli",
                 "configcheck", "runconfig", "provenance", "settings.render", "settings.masking", "plots", "lora_files", "slurm", "quota", "kept", "benchmarks", "html_table"}),
    ("services", {"prefix_engine", "backends", "engine_budget", "models", "cohort", "judge", "judge.client", "judge.server",
                  "judge.launcher", "promptfit", "phi_guard", "phi_guard.canonical", "phi_guard.decoders",
                  "phi_guard.secrets", "phi_guard.ordinary_words", "phi_guard.identifiers", "phi_guard.scan", "phi_guard.formats",
                  "phi_guard.files", "phi_guard.accounting", "phi_guard.bundle", "mimic", "mimic.admission", "mimic.sections", "mimic.audit", "mimic.tables", "mimic.build",
                  "mimic.synth"}),
    ("reward", {"reward", "reward.config", "reward.kwargs", "reward.audit", "reward.guard", "reward.scorer",
                "reward.entry", "reward.custom", "reward.trial", "reward.modes", "reward.function"}),
    ("stages", {"rnn", "trajectories", "merge", "merge.adapter", "merge.weights", "merge.fold",
                "merge.verify", "gpu_stack", "train", "train.checkpoints",
                "train.config", "train.data", "train.diagnose", "train.metrics", "train.spec", "train.trl_engine",
                "train.verl_cmd", "train.verl_overrides", "train.verl_attention", "train.verl_adapter", "train.outputs", "train.ray_cluster", "train.tracking", "train.stop", "train.lora_guard"}),
    ("checks and recipes", {"evaluate", "evaluate.recall", "evaluate.specificity", "evaluate.grading", "evaluate.comparison",
                            "evaluate.gather", "evaluate.shard", "preflight", "preflight.rows",
                            "preflight.reward_checks", "preflight.agreement", "preflight.training", "preflight.run",
                            "qa", "qa.data", "qa.evaluate", "qa.report", "qa.rewards",
                            "qa.sft", "qa.synth"}),
    ("top", {"report", "overview", "cost_plan", "release", "release.manifest", "release.card", "release.staging", "release.upload", "release.bundle",
             "check", "chat", "plan", "plan.common", "plan.cohort", "plan.models", "plan.trajectories", "plan.judge",
             "plan.train", "plan.evaluate", "plan.merge", "plan.release", "plan.qa", "plan.recipe", "check.config", "check.models",
             "check.cohort", "check.judge", "check.training", "check.slurm", "check.outside", "check.gpus",
             "check.prompts", "check.reward", "check.skips"}),
]


def package_modules() -> list[str]:
    root = REPO / "src" / "llmrnn"
    return sorted(module_name(str(p.relative_to(REPO))) for p in root.rglob("*.py"))


def with_packages(graph: dict[str, set[str]]) -> dict[str, set[str]]:
    """The graph with an arrow to each package a module enters from outside: importing llmrnn.train.config
    from llmrnn.gpu_stack runs llmrnn/train/__init__.py first, and whatever that imports."""
    def entered(module: str, target: str) -> set[str]:
        parts = target.split(".")
        packages = {".".join(parts[:i]) for i in range(2, len(parts))}  # not "llmrnn": its __init__ is bare
        return {p for p in packages if module != p and not module.startswith(p + ".")}

    return {m: targets | {p for t in targets for p in entered(m, t)} for m, targets in graph.items()}


def import_graph() -> dict[str, set[str]]:
    root = REPO / "src" / "llmrnn"
    return with_packages({m: provenance.direct_imports(m, root) - {m} for m in package_modules()})


def upward_imports(graph: dict[str, set[str]], layers: list[tuple[str, set[str]]]) -> list[str]:
    layer_of = {f"llmrnn.{m}".removesuffix("."): (i, name) for i, (name, mods) in enumerate(layers) for m in mods}
    return [f"{a} ({layer_of[a][1]}) imports {b} ({layer_of[b][1]})" for a, targets in sorted(graph.items())
            for b in sorted(targets) if a in layer_of and b in layer_of and layer_of[b][0] > layer_of[a][0]]


def import_loops(graph: dict[str, set[str]]) -> list[list[str]]:
    """The loops of the graph (strongly connected parts of more than one module)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    loops: list[list[str]] = []

    def visit(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        for w in graph.get(v, ()):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            part = []
            while True:
                w = stack.pop()
                part.append(w)
                if w == v:
                    break
            if len(part) > 1:
                loops.append(sorted(part))

    for v in sorted(graph):
        if v not in index:
            visit(v)
    return loops


def test_every_module_has_a_layer():
    listed = {f"llmrnn.{m}" for _, mods in LAYERS for m in mods}
    modules = set(package_modules()) - {"llmrnn"}
    assert modules - listed == set(), f"give these modules a layer in LAYERS: {sorted(modules - listed)}"
    assert listed - modules == set(), f"LAYERS names modules that do not exist: {sorted(listed - modules)}"


def test_no_import_runs_back_up_the_layers():
    graph = import_graph()
    assert "llmrnn.train.config" in graph["llmrnn.preflight"]  # the reader sees function-level imports
    assert upward_imports(graph, LAYERS) == []
    assert import_loops(graph) == []


def test_the_shared_pieces_sit_below_their_users():
    """The issue's three arrows: training does not import its preflight, the release guard knows no
    recipe, and the reward (verl's reward workers import it) does not bring the forward pass along."""
    root = REPO / "src" / "llmrnn"
    graph = import_graph()
    assert "llmrnn.preflight" not in provenance.closure(["llmrnn.train"], root)
    guard = [name for name in graph if name == "llmrnn.phi_guard" or name.startswith("llmrnn.phi_guard.")]
    assert len(guard) > 1 and not [m for name in guard for m in graph[name] if m.startswith("llmrnn.qa")]
    reward = set(provenance.closure(["llmrnn.reward"], root))
    assert not reward & {"llmrnn.trajectories", "llmrnn.rnn", "llmrnn.backends", "llmrnn.prefix_engine"}, reward


def test_the_engines_are_siblings():
    """TRL's engine and verl's runner take one run specification (train.spec), share what a run leaves
    behind (train.outputs) and import nothing of each other; the QA warm start takes the adapter export from
    there too, not from an engine. The spec knows neither engine."""
    graph = import_graph()
    trl = {"llmrnn.train.trl_engine"}
    verl = {"llmrnn.train.verl_cmd", "llmrnn.train.verl_overrides", "llmrnn.train.verl_attention",
            "llmrnn.train.verl_adapter"}
    assert not [m for m in verl | {"llmrnn.qa.sft"} if graph[m] & trl]
    assert not [m for m in trl if graph[m] & verl]
    assert all("llmrnn.train.outputs" in graph[m] for m in ("llmrnn.train.trl_engine", "llmrnn.train.verl_cmd",
                                                          "llmrnn.qa.sft"))
    assert all("llmrnn.train.spec" in graph[m] for m in ("llmrnn.train.trl_engine", "llmrnn.train.verl_cmd"))
    assert not graph["llmrnn.train.spec"] & (trl | verl)


def test_an_upward_import_or_a_loop_is_found():
    layers = [("low", {"a"}), ("high", {"b"})]
    assert upward_imports({"llmrnn.a": {"llmrnn.b"}, "llmrnn.b": set()}, layers) == [
        "llmrnn.a (low) imports llmrnn.b (high)"]
    assert upward_imports({"llmrnn.b": {"llmrnn.a"}, "llmrnn.a": set()}, layers) == []
    assert import_loops({"x": {"y"}, "y": {"z"}, "z": {"x"}, "w": {"x"}}) == [["x", "y", "z"]]
    # the loop gpu_stack -> train.ray_cluster -> (train's __init__) -> gpu_stack, which ran only one way round
    graph = {"llmrnn.gpu_stack": {"llmrnn.train.ray_cluster"}, "llmrnn.train": {"llmrnn.gpu_stack"},
             "llmrnn.train.ray_cluster": {"llmrnn.train.config"}, "llmrnn.train.config": set()}
    assert import_loops(graph) == []
    assert with_packages(graph)["llmrnn.gpu_stack"] == {"llmrnn.train.ray_cluster", "llmrnn.train"}
    assert with_packages(graph)["llmrnn.train.ray_cluster"] == {"llmrnn.train.config"}  # inside its package
    assert import_loops(with_packages(graph)) == [["llmrnn.gpu_stack", "llmrnn.train"]]


# ----------------------------------------------------------------------------- imports at module top
# A function imports a module only where importing it at module top costs start-up time that matters: every
# `llmrnn <verb>` imports llmrnn.cli and its stage module (`llmrnn --help`: all of them), every Snakemake start
# llmrnn.plan, llmrnn.configcheck, llmrnn.provenance, llmrnn.upload, llmrnn.runconfig and what they import.
# These (a module and its submodules) may be imported in a function, nothing else. Measured: `python -c
# "import X"` (or the form the package uses), best of two, the CPU venv, 2 shared cores; llmrnn.cli alone is
# 15 ms. Anything else that a function must import carries `# lazy: <why>` on its line or on the comment
# line over its import block (rare: a measured cost or a process boundary, said in the comment).
HEAVY_IMPORTS = {
    "torch": "956 ms",
    "transformers": "775 ms; `from transformers import AutoTokenizer` 1.9 s (imports torch)",
    "trl": "`from trl import GRPOConfig` 4.5 s (torch, transformers)",
    "peft": "4.4 s",
    "datasets": "1.6 s",
    "pandas": "905 ms",
    "scipy": "`from scipy import stats` 1.3 s",
    "matplotlib": "471 ms",
    "fastapi": "412 ms",
    "uvicorn": "106 ms",
    "huggingface_hub": "`from huggingface_hub import HfApi` 287 ms, `snapshot_download` 322 ms, `.errors` 101 ms",
    "httpx": "231 ms",
    "omegaconf": "157 ms",
    "pyarrow": "81 ms; pyarrow.parquet 94 ms, pyarrow.compute 106 ms",
    "jsonschema": "100 ms",
    "snakemake": "`from snakemake.utils import validate` 81 ms",
    "markdown_it": "57 ms",
    "numpy": "51 ms",
    "tenacity": "30 ms",
    "confusable_homoglyphs": "`confusable_homoglyphs.utils` 28 ms",
    "safetensors.torch": "imports torch (956 ms); `safetensors` alone is 2 ms and sits at the top",
    "vllm": "the GPU stack only (envs/gpu-lock.txt): not importable in the CPU venv",
    "verl": "the GPU stack only: not importable in the CPU venv",
    "ray": "the GPU stack only (verl's): not importable in the CPU venv",
    "hydra": "the GPU stack only (verl's config): not importable in the CPU venv",
    "flash_attn": "a CUDA source build the GPU lock leaves out: a probe for it",
    "wandb": "an optional tracker (train.report_to), no dependency",
    "mlflow": "an optional tracker (train.report_to), no dependency",
}
LAZY_MARK = "# lazy:"
# A stage package's __init__ (`llmrnn <stage>`: cli.STAGES) registers its verbs and imports what each verb runs
# inside that verb's handler: llmrnn.provenance hashes, for a verb, only what its handler reaches (and a
# package's module level, which importing any of its modules runs), so `llmrnn qa synth` does not rerun
# when `qa sft`'s code changes. At their module top these imports made the code hashes of 33 verbs cover
# more modules (qa's ~45 -> 74, release's 60 -> 91, as the train stage came in through qa.sft), and
# `llmrnn judge --help` 66 -> 234 ms.
HANDLER_PACKAGES = tuple(f"src/llmrnn/{stage}/__init__.py" for stage in cli.STAGES)


def imported_module(node: ast.Import | ast.ImportFrom) -> list[str]:
    """The absolute modules an import statement names; a relative import is the package's own ("llmrnn")."""
    if isinstance(node, ast.Import):
        return [alias.name for alias in node.names]
    return ["llmrnn"] if node.level else [node.module or ""]


def is_heavy(module: str) -> bool:
    return any(module == heavy or module.startswith(heavy + ".") for heavy in HEAVY_IMPORTS)


def function_imports(text: str, rel: str) -> list[tuple[str, str]]:
    """(`file:line: statement`, why it may stay: "heavy", "lazy" (marked) or "" (it may not)) of every import
    inside a function body of one module's source."""
    lines = text.splitlines()
    found = []

    def marked(lineno: int) -> bool:
        i = lineno - 1
        while i > 0 and lines[i - 1].strip().startswith(("import ", "from ")):
            i -= 1  # the comment over an import block marks every import of the block
        return LAZY_MARK in lines[lineno - 1] or (i > 0 and lines[i - 1].strip().startswith(LAZY_MARK))

    def visit(node: ast.AST, in_function: bool) -> None:
        for child in ast.iter_child_nodes(node):
            if in_function and isinstance(child, (ast.Import, ast.ImportFrom)):
                why = ("heavy" if all(is_heavy(m) for m in imported_module(child))
                       else "lazy" if marked(child.lineno) else "")
                found.append((f"{rel}:{child.lineno}: {ast.unparse(child)}", why))
            visit(child, in_function or isinstance(child, (ast.FunctionDef, ast.AsyncFunctionDef, ast.Lambda)))

    visit(ast.parse(text), False)
    return found


def test_imports_sit_at_module_top_unless_heavy():
    found = []
    for path in sorted((REPO / "src" / "llmrnn").rglob("*.py")):
        rel = str(path.relative_to(REPO))
        if rel not in HANDLER_PACKAGES:
            found += function_imports(path.read_text(), rel)
    assert sum(why == "heavy" for _, why in found) > 50  # the walk sees the heavy imports inside functions
    inside = [where for where, why in found if not why]
    assert not inside, ("import these at module top (or add the module to HEAVY_IMPORTS with its measured import "
                        "time, or mark the line `# lazy: <why>`): " + "; ".join(inside))
    marked = [where for where, why in found if why == "lazy"]
    assert len(marked) <= 5, f"`# lazy:` is for the rare case: {marked}"


def test_an_import_inside_a_function_is_found():
    text = ("import os\n\n\ndef f():\n    import torch\n    from llmrnn import io\n    from . import rope\n"
            "    from safetensors import safe_open\n    from safetensors.torch import load_file\n\n\n"
            "def g():\n    # lazy: a process of its own\n    import json\n    import shlex\n\n    x = 1\n"
            "    import re  # lazy: measured\n    import csv\n    import torchvision\n")
    assert function_imports(text, "m.py") == [
        ("m.py:5: import torch", "heavy"),
        ("m.py:6: from llmrnn import io", ""),
        ("m.py:7: from . import rope", ""),
        ("m.py:8: from safetensors import safe_open", ""),
        ("m.py:9: from safetensors.torch import load_file", "heavy"),
        ("m.py:14: import json", "lazy"),
        ("m.py:15: import shlex", "lazy"),
        ("m.py:18: import re", "lazy"),
        ("m.py:19: import csv", ""),
        ("m.py:20: import torchvision", ""),
    ]
