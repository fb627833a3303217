"""Code provenance: a rule's `code` param is the hash of the modules its verb can run, read from the imports.

Unit tests on a small package written here (every kind of import), the closure against what the CLI
really imports, every rule against the verb its shell runs, and real Snakemake plans: in a copy of the
workflow whose outputs are marked made (`--touch`), an edit of a module changes the params of exactly the
rules whose verb imports it (Snakemake's `--summary`), and an edit of a module no verb imports, of none.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from llmrnn import cli, provenance
from llmrnn.errors import InputError
from tests.conftest import REPO, WORKFLOW_PARTS
from tests.rules_api import RECIPE_CONFIGS, WorkflowRule, workflow_rules
from tests.slurm.dag import EXTRA_PARTS


def write_package(root: Path, files: dict[str, str]) -> Path:
    """A package `llmrnn` under root from {relative path: source}; returns the package folder."""
    pkg = root / "llmrnn"
    for rel, text in files.items():
        path = pkg / rel
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(textwrap.dedent(text))
    return pkg


@pytest.fixture
def pkg(tmp_path) -> Path:
    return write_package(tmp_path, {
        "__init__.py": "",
        "errors.py": "",
        "io.py": "from llmrnn.errors import *\n",
        "leaf.py": "import json\nimport numpy\n",
        "lazy.py": "def f():\n    from llmrnn import leaf\n",
        "named.py": "REWARD = 'llmrnn.sub.scored:compute'\nDOC = 'see llmrnn.leaf for more'\n",
        "unused.py": "import llmrnn.io\n",
        "sub/__init__.py": "from llmrnn import io\n\ndef helper():\n    from llmrnn import lazy\n",
        "sub/rel.py": "from . import sibling\nfrom .sibling import thing\nfrom .. import named\n",
        "sub/sibling.py": "thing = 1\n",
        "sub/scored.py": "def compute():\n    pass\n",
        "sub/user.py": "from llmrnn.sub import sibling\n",
        "sub/name_user.py": "from llmrnn.sub import helper\n",
    })


def test_closure_follows_module_function_and_relative_imports(pkg):
    root = pkg
    assert provenance.closure(["llmrnn.lazy"], root) == ["llmrnn", "llmrnn.lazy", "llmrnn.leaf"]
    # `from . import x`, `from .x import y`, `from .. import z`; z names a module by a string
    assert provenance.closure(["llmrnn.sub.rel"], root) == [
        "llmrnn", "llmrnn.errors", "llmrnn.io", "llmrnn.named", "llmrnn.sub", "llmrnn.sub.rel",
        "llmrnn.sub.scored", "llmrnn.sub.sibling"]
    # third-party imports (json, numpy) and prose that mentions a module are no part of it
    assert provenance.closure(["llmrnn.leaf"], root) == ["llmrnn", "llmrnn.leaf"]
    assert "llmrnn.leaf" not in provenance.closure(["llmrnn.named"], root)


def test_a_package_reached_as_a_parent_counts_its_module_level_only(pkg):
    # importing llmrnn.sub.sibling runs sub/__init__.py (which imports io), not sub.helper (lazy)
    assert provenance.closure(["llmrnn.sub.user"], pkg) == [
        "llmrnn", "llmrnn.errors", "llmrnn.io", "llmrnn.sub", "llmrnn.sub.sibling", "llmrnn.sub.user"]
    # a name taken from the package itself may be its function: then the package counts whole
    assert "llmrnn.lazy" in provenance.closure(["llmrnn.sub.name_user"], pkg)


def test_an_unknown_module_is_one_clear_error(pkg):
    with pytest.raises(InputError, match="llmrnn.nope has no source"):
        provenance.closure(["llmrnn.nope"], pkg)


STAGE = """
    from llmrnn import io

    def _light(args):
        from llmrnn import leaf
        return _shared()

    def _heavy(args):
        from llmrnn import lazy

    def _shared():
        from llmrnn.sub import sibling

    def register(sub):
        from llmrnn.errors import InputError
        p = sub.add_parser("stage")
        s = p.add_subparsers()
        p = s.add_parser("light")
        p.set_defaults(func=_light)
        p = s.add_parser("heavy")
        p.set_defaults(func=_heavy)
"""


def test_a_verb_counts_its_own_handler_not_its_siblings(pkg):
    (pkg / "stage.py").write_text(textwrap.dedent(STAGE))
    light = provenance.verb_imports("llmrnn.stage", "light", pkg)
    assert light == {"llmrnn.io", "llmrnn.errors", "llmrnn.leaf", "llmrnn.sub.sibling"}
    assert provenance.verb_imports("llmrnn.stage", "heavy", pkg) == {"llmrnn.io", "llmrnn.errors", "llmrnn.lazy"}
    assert provenance.verb_imports("llmrnn.stage", "nope", pkg) is None  # unknown: the whole module counts
    # the stage module is hashed itself; what it imports counts only as far as the verb reaches
    got = provenance.closure(["llmrnn.stage"], pkg, {"llmrnn.stage": light})
    assert "llmrnn.lazy" not in got and {"llmrnn.stage", "llmrnn.leaf", "llmrnn.sub.sibling"} <= set(got)


def test_the_hash_moves_with_a_module_of_the_closure_only(pkg):
    members = provenance.closure(["llmrnn.lazy"], pkg)
    before = provenance.hash_modules(members, pkg)
    (pkg / "unused.py").write_text("import llmrnn.io  # edited\n")
    assert provenance.hash_modules(members, pkg) == before
    (pkg / "leaf.py").write_text("import json\nimport os\n")
    assert provenance.hash_modules(members, pkg) != before


def test_a_comment_or_docstring_edit_changes_no_hash_and_any_code_edit_does(pkg):
    """The hash is of the code that runs: comments, docstrings and layout change nothing (a comment edit
    in errors.py reruns no stage); a changed statement, constant or string that is not a docstring does."""
    (pkg / "errors.py").write_text('"""Errors."""\n\nclass InputError(Exception):\n    """Bad input."""\n\n'
                                   'LIMIT = 3\nTEXT = "shown"\n')
    members = provenance.closure(["llmrnn.io"], pkg)
    assert "llmrnn.errors" in members
    before = provenance.hash_modules(members, pkg)
    (pkg / "errors.py").write_text('"""Errors, reworded."""\n# a comment\n\n\nclass InputError(Exception):\n'
                                   '    """Bad input, one line."""  # more\n\n\nLIMIT = (3)\nTEXT = "shown"\n')
    assert provenance.hash_modules(members, pkg) == before
    for code in ('class InputError(Exception):\n    pass\nLIMIT = 4\nTEXT = "shown"\n',
                 'class InputError(Exception):\n    pass\nLIMIT = 3\nTEXT = "changed"\n',
                 'class InputError(ValueError):\n    pass\nLIMIT = 3\nTEXT = "shown"\n'):
        (pkg / "errors.py").write_text(code)
        assert provenance.hash_modules(members, pkg) != before, code


def test_a_module_that_is_not_utf8_or_not_python_is_named_in_one_line(pkg):
    (pkg / "leaf.py").write_bytes("NAME = 'caf\xe9'\n".encode("latin-1"))
    with pytest.raises(InputError, match=r"module llmrnn\.leaf \(.*leaf\.py\): byte \d+: not UTF-8"):
        provenance.closure(["llmrnn.lazy"], pkg)
    (pkg / "leaf.py").write_text("def broken(:\n")
    with pytest.raises(InputError, match=r"module llmrnn\.leaf \(.*leaf\.py\): line 1"):
        provenance.hash_modules(["llmrnn.leaf"], pkg)


def computed_loads(root: Path) -> set[tuple[str, str]]:
    """(module, loader) of every call of a module loader whose first argument is not a string constant."""
    import ast

    found = set()
    for path in sorted(root.rglob("*.py")):
        name = ".".join(["llmrnn", *path.relative_to(root).with_suffix("").parts]).removesuffix(".__init__")
        found |= {(name, func) for node in ast.walk(ast.parse(path.read_text(encoding="utf-8")))
                  if (func := provenance.loader_call(node))}
    return found


def test_the_covered_computed_loads_are_the_packages_own():
    """COVERED_LOADS lists only call sites that exist (a stale entry would excuse a future one)."""
    assert {(f"llmrnn.{m}", f) for m, f in provenance.COVERED_LOADS} <= computed_loads(provenance.ROOT)


@pytest.mark.parametrize(("call", "reaches", "not_reaches"), [
    ("importlib.import_module('llmrnn.' + x)", {"llmrnn.leaf", "llmrnn.sub.scored", "llmrnn.unused"}, set()),
    ("importlib.import_module(f'llmrnn.sub.{x}')", {"llmrnn.sub.scored", "llmrnn.sub.sibling"}, {"llmrnn.unused"}),
    ("importlib.import_module('llmrnn.sub.' + x + '_v2')", {"llmrnn.sub.scored"}, {"llmrnn.unused"}),
    ("__import__(name)", {"llmrnn.leaf", "llmrnn.named"}, set()),
    ("exec(compile(src, 'f', 'exec'))", {"llmrnn.leaf"}, set()),
])
def test_a_module_loaded_by_a_computed_name_is_in_the_identity(pkg, call, reaches, not_reaches):
    """A load whose name is built at run time counts as loading whatever it could: the modules under its
    constant prefix, or the whole package. Editing any of them changes the identity of its importers."""
    (pkg / "sneaky.py").write_text(f"import importlib\n\ndef f(x, name, src):\n    return {call}\n")
    members = set(provenance.closure(["llmrnn.sneaky"], pkg))
    assert reaches <= members and not (not_reaches & members), sorted(members)
    before = provenance.hash_modules(members, pkg)
    target = pkg / "sub" / "scored.py"
    target.write_text(target.read_text() + "\nEDITED = 1\n")
    assert provenance.hash_modules(provenance.closure(["llmrnn.sneaky"], pkg), pkg) != before
    # a model's .eval() is no loader
    (pkg / "calm.py").write_text("def f(model):\n    return model.eval()\n")
    assert provenance.closure(["llmrnn.calm"], pkg) == ["llmrnn", "llmrnn.calm"]


CACHE_PROBE = """
import json, sys
from pathlib import Path
from llmrnn import provenance
print(json.dumps({"ident": provenance.code_identity("cohort split"), "parses": provenance._tree.cache_info().misses,
                  "key": provenance.package_key(), "file": str(provenance._disk_cache(provenance.ROOT).path)}))
"""


def _identity_in_fresh_process(src: Path, cache: Path) -> dict:
    env = dict(os.environ, PYTHONPATH=str(src), LLMRNN_CACHE_DIR=str(cache))
    proc = subprocess.run([sys.executable, "-c", CACHE_PROBE], env=env, capture_output=True, text=True,
                          check=False, timeout=300)
    assert proc.returncode == 0, proc.stderr[-3000:]
    return json.loads(proc.stdout.strip().splitlines()[-1])


def test_identities_are_cached_on_disk_by_the_packages_content(tmp_path):
    """A second process answers from the cache without parsing a module; an edit of any module between
    the two (code or not) is a new key, so the cache cannot hand back the identity of other code."""
    src = tmp_path / "src"
    shutil.copytree(REPO / "src", src, ignore=shutil.ignore_patterns("__pycache__", "*.egg-info"))
    cache = tmp_path / "cache"
    first = _identity_in_fresh_process(src, cache)
    assert first["parses"] > 5 and Path(first["file"]).is_file()
    assert json.loads(Path(first["file"]).read_text()) == {"cohort split": first["ident"]}
    second = _identity_in_fresh_process(src, cache)
    assert second["ident"] == first["ident"] and second["parses"] == 0  # no module parsed: read from disk
    io = src / "llmrnn" / "io.py"  # every cohort stage writes through it
    io.write_text(io.read_text() + "\n_EDITED_BY_TEST = 1\n")
    edited = _identity_in_fresh_process(src, cache)
    assert edited["key"] != first["key"] and edited["parses"] > 5
    assert edited["ident"] != first["ident"]
    # a comment edit is a new key too, yet the identity (code without comments) stays: a rerun-table no-op
    io.write_text(io.read_text() + "# a comment\n")
    commented = _identity_in_fresh_process(src, cache)
    assert commented["key"] != edited["key"] and commented["ident"] == edited["ident"]


def test_a_broken_or_unwritable_cache_costs_a_recomputation_not_an_error(tmp_path):
    src = tmp_path / "src"
    shutil.copytree(REPO / "src", src, ignore=shutil.ignore_patterns("__pycache__", "*.egg-info"))
    cache = tmp_path / "cache"
    good = _identity_in_fresh_process(src, cache)
    Path(good["file"]).write_text("{not json")
    assert _identity_in_fresh_process(src, cache)["ident"] == good["ident"]
    blocked = tmp_path / "blocked"
    blocked.write_text("a file where the cache folder would be")
    assert _identity_in_fresh_process(src, blocked)["ident"] == good["ident"]


def test_verbs_reach_what_the_old_hand_lists_missed():
    """The cohort stages write through llmrnn.io and run under cli/errors; training reaches the GPU stack."""
    assert {"llmrnn.io", "llmrnn.errors", "llmrnn.cli"} <= set(provenance.verb_closure("cohort split"))
    train = set(provenance.verb_closure("train run"))
    assert {"llmrnn.gpus", "llmrnn.gpu_stack", "llmrnn.io", "llmrnn.reward", "llmrnn.train.verl_cmd"} <= train
    assert "llmrnn.qa.rewards" in provenance.verb_closure("train run", "llmrnn.qa.rewards")
    # lazy dispatch: a verb does not depend on another stage's modules
    assert not {"llmrnn.train", "llmrnn.evaluate", "llmrnn.release"} & set(provenance.verb_closure("cohort synth"))


def _imported_by_cli(tmp_path: Path, *argv: str) -> set[str]:
    probe = ("import json, sys\nfrom llmrnn import cli\nrc = cli.main(sys.argv[1:])\n"
             "print(json.dumps(sorted(m for m in sys.modules if m.split('.')[0] == 'llmrnn')))\nsys.exit(rc)\n")
    env = dict(os.environ, PYTHONPATH=str(REPO / "src"))
    proc = subprocess.run([sys.executable, "-c", probe, *argv], cwd=tmp_path, env=env, capture_output=True, check=False,
                          text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr[-3000:]
    return set(json.loads(proc.stdout.strip().splitlines()[-1]))


def test_the_closure_covers_what_the_cli_really_imports(tmp_path):
    ran = _imported_by_cli(tmp_path, "cohort", "synth", "--patients", "3", "--seed", "0", "--out", "c.json",
                           "--meta", "m.json")
    assert "llmrnn.cohort" in ran and ran <= set(provenance.verb_closure("cohort synth")), ran
    assert "llmrnn.train" not in ran  # the other stages are not even imported
    ran = _imported_by_cli(tmp_path, "qa", "synth", "--cohort", "c.json", "--out", "q.jsonl", "--ood", "o.jsonl")
    assert "llmrnn.qa.synth" in ran and ran <= set(provenance.verb_closure("qa synth")), ran


def test_help_still_lists_every_stage():
    text = cli.build_parser().format_help()
    assert all(stage in text for stage in cli.STAGES)
    with pytest.raises(ValueError, match="no llmrnn stage 'nope'"):
        cli.stage_module("nope")


# a module a command line names for loading (`--reward-func llmrnn.qa.rewards:trl_reward_func`)
NAMED_MODULE = re.compile(r"(llmrnn(?:\.\w+)+):\w+")


def command_line(rule: WorkflowRule) -> str:
    """The rule's shell with the flags its `flags` params function adds (for a job with its required inputs
    only), as Snakemake computes them."""
    if "flags" not in rule.params:
        return rule.shell
    return rule.shell + " " + " ".join(rule.called_param("flags", preflight="p.json"))


def rule_code_args(rule: WorkflowRule) -> tuple[str, ...]:
    """What a rule's `code` param must hash: the verb its shell runs, then each module its command line
    names for loading."""
    return (rule.command.removeprefix("llmrnn "), *sorted(set(NAMED_MODULE.findall(command_line(rule)))))


def code_param_problem(rule: WorkflowRule) -> str | None:
    """Why a rule's `code` param is not the code identity of the command it runs, or None."""
    args = rule_code_args(rule)
    if "code" not in rule.params:
        return f"rule {rule.name}: runs {rule.command} but has no code=code_hash(...) param"
    if rule.params["code"] != provenance.code_identity(*args):
        return f"rule {rule.name}: its code param is not code_hash({', '.join(map(repr, args))}), the command it runs"
    return None


def hashed_rules(configfile: str) -> dict[str, WorkflowRule]:
    """The rules that make files with an llmrnn command (so their code decides a rerun), as the workflow of
    a recipe's config builds them (a rule named alike in both recipes may run another command line in each)."""
    return {name: rule for name, rule in workflow_rules(configs=(configfile,)).items()
            if rule.command and rule.rule.output}


def test_every_rule_hashes_the_verb_its_shell_runs():
    """Each rule that makes files with an llmrnn command has `code=code_hash("<verb> <sub>", ...)` for that
    same command, plus every module its command line names for loading (e.g. --reward-func): its code param,
    as Snakemake holds it, is that command's code identity."""
    rules = [rule for config in RECIPE_CONFIGS for rule in hashed_rules(config).values()]
    qa_trainer = [rule for rule in hashed_rules("config/qa_demo.yaml").values() if rule.command == "llmrnn train run"]
    assert [rule_code_args(rule) for rule in qa_trainer] == [("train run", "llmrnn.qa.rewards")]  # flags are read
    assert [problem for rule in rules if (problem := code_param_problem(rule))] == []
    for rule in rules:
        provenance.verb_closure(*rule_code_args(rule))  # the verb and modules exist
    assert len({rule.name for rule in rules}) >= 20


def test_a_rule_without_its_verb_is_found(tmp_path):
    (tmp_path / "Snakefile").write_text(
        "from llmrnn.provenance import code_identity\n\n\n"
        "rule split:\n    output:\n        x=\"x\",\n    params:\n        code=code_identity(\"report cost\"),\n"
        "    shell:\n        \"llmrnn cohort split --out {output.x:q}\"\n\n\n"
        "rule bare:\n    output:\n        x=\"y\",\n    shell:\n        \"llmrnn cohort split --out {output.x:q}\"\n")
    rules = workflow_rules(tmp_path / "Snakefile", configs=())
    assert rule_code_args(rules["split"]) == ("cohort split",)
    assert code_param_problem(rules["split"]) == ("rule split: its code param is not code_hash('cohort split'), "
                                                  "the command it runs")
    assert code_param_problem(rules["bare"]) == "rule bare: runs llmrnn cohort split but has no code=code_hash(...) param"


# ----------------------------------------------------------------------------- real Snakemake plans
JUDGED = {"reward": {"mode": "scalar"}}  # the judge server and its rules join the plan
PLANS = {"default": ["config/config.yaml"], "judged": ["config/config.yaml", "judged.yaml"],
         "qa": ["config/qa_demo.yaml"]}


# A job's params change, as Snakemake's summary states it (`--summary`, one row per output: its rule, its
# status), for each job on its own: a dry run names a params change only for a job that nothing upstream
# reruns, and `--list-params-changes` (Snakemake 9.27) also lists unchanged outputs. The summary says
# "updated input files" in place of "params changed" only where an input is newer than the output: never
# here, every output marked made in order.
SUMMARY_STATUS = 4  # output_file, date, rule, log-file(s), status, plan
DETAILED_STATUS = 6  # output_file, date, rule, log-file(s), input-file(s), shellcmd, status, plan


class Plans:
    """Per config, a copy of the workflow whose every output is marked made (`--touch`: the params
    recorded as a real run records them), all on one copy of the package (PYTHONPATH)."""

    def __init__(self, work: Path):
        self.root = work
        self.src = work / ".pkg" / "src"
        self.env = {k: v for k, v in os.environ.items() if not k.startswith("LLMRNN_")}
        self.env.update(PATH=f"{Path(sys.executable).parent}{os.pathsep}{os.environ['PATH']}",
                        PYTHONPATH=str(self.src), HF_HUB_OFFLINE="1", OMP_NUM_THREADS="1")
        self.rules: dict[str, set[str]] = {}

    def run(self, plan: str, *args: str) -> str:
        proc = subprocess.run(args, cwd=self.root / plan, env=self.env, capture_output=True, text=True, timeout=600,
                              check=False)
        assert proc.returncode == 0, f"{' '.join(args)}:\n{proc.stdout[-3000:]}\n{proc.stderr[-3000:]}"
        return proc.stdout

    def snakemake(self, plan: str, *args: str) -> str:
        return self.run(plan, str(Path(sys.executable).parent / "snakemake"), "--cores", "1", *args)

    def made(self, plan: str) -> set[str]:
        """The rules of the plan, whose outputs are marked made (once)."""
        if plan in self.rules:
            return self.rules[plan]
        work = self.root / plan
        work.mkdir()
        for part in dict.fromkeys(WORKFLOW_PARTS + EXTRA_PARTS):
            (shutil.copytree if (REPO / part).is_dir() else shutil.copy2)(REPO / part, work / part)
        (work / "judged.yaml").write_text(json.dumps(JUDGED))
        files = PLANS[plan]
        rows = [line.split("\t") for line in self.snakemake(plan, "--summary", "all", "--configfile", *files)
                .splitlines()]
        outputs = {row[0]: row[2] for row in rows if len(row) > 2 and row[0] != "output_file" and row[2]}
        for out in outputs:
            path = work / out
            path.parent.mkdir(parents=True, exist_ok=True)
            if "." in path.name:  # a file; the directory() outputs (adapter, merged, audit) have no suffix
                path.touch()
            else:
                path.mkdir(exist_ok=True)
        self.snakemake(plan, "--touch", "--forceall", "all", "--configfile", *files)
        self.restore_services(plan)
        self.rules[plan] = set(outputs.values())
        return self.rules[plan]

    def restore_services(self, plan: str) -> None:
        """A service's output (the judge's endpoint) is gone once its consumers are done, and the summary
        states no params change for a missing file: it is made again, as old as its newest input (its
        recorded inputs: `--detailed-summary`), so it is newer than no input and older than no consumer."""
        rows = [line.split("\t") for line in self.snakemake(plan, "--detailed-summary", "all", "--configfile",
                                                             *PLANS[plan]).splitlines()]
        for row in rows[1:]:
            if len(row) > DETAILED_STATUS and row[DETAILED_STATUS] == "service file":
                path = self.root / plan / row[0]
                path.touch()
                newest = max(((self.root / plan / f).stat().st_mtime for f in row[4].split(",") if f != "-"),
                             default=0)
                os.utime(path, (newest, newest))

    def changed_rules(self, plan: str) -> set[str]:
        rows = [line.split("\t") for line in self.snakemake(plan, "--summary", "all", "--configfile",
                                                             *PLANS[plan]).splitlines()]
        return {row[2] for row in rows[1:] if len(row) > SUMMARY_STATUS and row[SUMMARY_STATUS] == "params changed"}

    def expected(self, plan: str, module: str) -> set[str]:
        """Rules of the plan whose code_hash verb (+ named modules) can run `module`, per the copy's source."""
        rules = hashed_rules(PLANS[plan][0])  # the plan's recipe config
        return {name for name in self.made(plan)
                if name in rules and module in provenance.verb_closure(*rule_code_args(rules[name]),
                                                                       root=self.src / "llmrnn")}

    def edited(self, module: str, plan: str) -> set[str]:
        path = provenance.module_path(module, self.src / "llmrnn")
        text = path.read_bytes()
        self.made(plan)
        path.write_bytes(text + b"\n_EDITED_BY_TEST_PROVENANCE = 1\n")  # code: a comment changes no hash
        try:
            return self.changed_rules(plan)
        finally:
            path.write_bytes(text)


@pytest.fixture(scope="module")
def plans(tmp_path_factory) -> Plans:
    work = tmp_path_factory.mktemp("plans")
    shutil.copytree(REPO / "src", work / ".pkg" / "src", ignore=shutil.ignore_patterns("__pycache__", "*.egg-info"))
    return Plans(work)


def _check(plans: Plans, plan: str, module: str) -> None:
    expected = plans.expected(plan, module)
    observed = plans.edited(module, plan)
    assert observed == expected, (f"{plan}: editing {module} changes the code of {sorted(observed)}; "
                                  f"its importers are {sorted(expected)}")


@pytest.mark.e2e  # a slow tier test (a workflow, CLI or training run of its own): `make test-e2e`
@pytest.mark.slow
@pytest.mark.parametrize(("plan", "module"), [
    ("default", "llmrnn.io"),  # every stage writes through it
    ("qa", "llmrnn.qa.rewards"),
])
def test_an_edit_reruns_exactly_the_rules_that_import_it(plans, plan, module):
    _check(plans, plan, module)
    assert plans.expected(plan, module), f"{module} is imported by no rule of {plan}: the row checks nothing"


@pytest.mark.e2e  # a slow tier test (a workflow, CLI or training run of its own): `make test-e2e`
@pytest.mark.slow
def test_an_edit_of_a_module_no_verb_imports_reruns_nothing(plans):
    assert plans.expected("default", "llmrnn.chat") == set()
    assert plans.edited("llmrnn.chat", "default") == set()


@pytest.mark.slow
@pytest.mark.e2e  # a plan per module of the package
def test_every_rules_own_modules_rerun_exactly_their_importers(plans):
    """The e2e tier's sweep: for every rule of every plan, the stage module its verb enters (and the modules its
    command line names) edited once, under the first plan that has the rule (the judged one adds the judge
    server); the plans just marked made have no change. Each edit costs one Snakemake plan (~10 s), so
    the every-module sweep (48 modules x 3 plans, ~25 min here) is left to LLMRNN_FULL_SWEEP=1."""
    from llmrnn.cli import stage_module

    full = os.environ.get("LLMRNN_FULL_SWEEP") == "1"
    done: set[str] = set()
    for plan in PLANS:
        plans.made(plan)
        assert plans.changed_rules(plan) == set(), f"{plan}: a plan just marked made has params changes"
        if full:
            modules = sorted(f"llmrnn.{p.relative_to(plans.src / 'llmrnn').with_suffix('').as_posix()}"
                             .replace("/", ".").removesuffix(".__init__")
                             for p in (plans.src / "llmrnn").rglob("*.py"))
        else:
            rules = hashed_rules(PLANS[plan][0])
            modules = sorted({m for name in plans.made(plan) if name in rules
                              for args in [rule_code_args(rules[name])]
                              for m in (stage_module(args[0].split()[0]), *args[1:])} - done)
        for module in modules:
            _check(plans, plan, module)
            done.add(module)


@pytest.mark.slow
def test_a_rule_naming_an_unknown_module_stops_the_plan_with_one_line(workflow_dir):
    from tests.conftest import snakemake

    rules = workflow_dir / "rules" / "cohort.smk"
    text = rules.read_text()
    assert 'code=code_hash("cohort split"),' in text
    rules.write_text(text.replace('code=code_hash("cohort split"),', 'code=code_hash("cohort split", "llmrnn.nope"),'))
    proc = snakemake(workflow_dir, "-n", "all", check=False)
    assert proc.returncode != 0
    assert "code_hash('cohort split'): provenance: module llmrnn.nope has no source" in proc.stdout + proc.stderr
