"""Code provenance: which of the package's modules a CLI verb can run, and one hash of them.

A rule's `code` param is this hash, so Snakemake reruns a job exactly when code it can execute changed.
The modules come from the source, not from a list kept by hand: the import closure of the verb, read
with `ast` (nothing is imported). Followed, within `llmrnn` only:
  - `import llmrnn.x`, `from llmrnn.x import y` (y too, where it is a submodule), relative imports;
  - imports at any depth (inside functions too: the heavy third-party packages are imported there, and
    what a function may import, it may run);
  - a string constant that names a module of the package (`"llmrnn.reward:trl_reward_func"`,
    `["-m", "llmrnn.cli"]`): what is loaded by name at run time (reward functions, subprocesses);
  - every package a module lies in, as far as importing it runs (its module level, not its functions).
The verb's own stage module counts as far as the verb reaches it: its module level, register() and the
subcommand's handler with the functions it names: what another verb's handler imports inside itself (a
heavy package) or names in a string (a module it loads) does not count. What the stage module imports at
its top counts for every verb: importing the stage runs it.
A module name built at run time (importlib.import_module of a computed string, exec, ...) cannot be read:
such a call counts as loading every module of the package whose name starts with the call's constant
prefix (`import_module(f"llmrnn.judge.{kind}")`: all of llmrnn.judge), the whole package where it has
none, unless the call site is one of COVERED_LOADS, whose code is hashed another way.
The hash is of each module's syntax tree less docstrings (ast.dump: no comments, no positions), so a
comment or docstring edit reruns nothing, and any change to code that runs reruns its jobs.

Cost: the walk parses every module of the package, and every Snakemake start (a dry run, each SLURM job
re-reading the Snakefile) asks for ~20 identities. So the identities of a package are kept on disk,
keyed by the content of every source file of the package and the Python version (ast.dump's output is
version-specific): an edit to any module is a new key, so a stale identity can never be handed back.
One read of the package's files (no parse) answers a start whose code did not change.
"""

from __future__ import annotations

import ast
import contextlib
import functools
import hashlib
import json
import os
import re
import sys
import tempfile
from collections.abc import Iterable, Iterator
from pathlib import Path

from llmrnn.cli import stage_module
from llmrnn.errors import InputError

PACKAGE = "llmrnn"
ROOT = Path(__file__).resolve().parent  # the package folder this process imports
CLI = "llmrnn.cli"
_MODULE_STRING = re.compile(r"llmrnn(?:\.[A-Za-z_]\w*)+(?::[A-Za-z_]\w*)?")
_FUNCTIONS = (ast.FunctionDef, ast.AsyncFunctionDef, ast.Lambda)
_LOADERS = frozenset({"import_module", "__import__", "spec_from_file_location", "run_module", "run_path", "exec",
                      "eval", "load_module"})
# (module, loader) call sites with a computed name whose code the identity covers another way; modules
# named without the package prefix (a string naming a module of the package is read as an import)
COVERED_LOADS = {
    ("cli", "import_module"): "help and dispatch: the verb's own stage is hashed by verb_closure",
    ("train.trl_engine", "import_module"): "--reward-func: rules name the module in code_hash(...) and the "
                                          "checkpoints' job_code",
    ("train.trl_engine", "spec_from_file_location"): "--reward-func as a file: job_code hashes the file",
    ("train.tracking", "import_module"): "a train.report_to tracker's package (TRACKER_API: tensorboard, wandb, "
                                        "mlflow), never a module of llmrnn",
    ("check.gpus", "import_module"): "verl, imported to see that it imports (the GPU stack's check), never a "
                                    "module of llmrnn",
    ("custom_reward_child", "spec_from_file_location"): "reward.custom.path, loaded in its child: the same file "
                                                       "hashes as reward.custom's",
}


def module_path(name: str, root: Path = ROOT) -> Path | None:
    """The source file of module `name` of the package under `root`, or None where there is none."""
    parts = name.split(".")
    if parts[0] != PACKAGE or not all(p.isidentifier() for p in parts):
        return None
    base = root.joinpath(*parts[1:])
    candidates = [base / "__init__.py"] if len(parts) == 1 else [base.with_name(f"{base.name}.py"), base / "__init__.py"]
    return next((path for path in candidates if path.is_file()), None)


def _parents(name: str) -> list[str]:
    parts = name.split(".")
    return [".".join(parts[:i]) for i in range(1, len(parts))]


def _resolve_relative(module: str | None, level: int, importer: str, is_package: bool) -> str:
    base = importer.split(".")
    if not is_package:
        base = base[:-1]
    if level > 1:
        base = base[: len(base) - (level - 1)]
    return ".".join(base + ([module] if module else []))


def _read(name: str, path: Path) -> bytes:
    try:
        return path.read_bytes()
    except OSError as exc:
        raise InputError(f"provenance: module {name} ({path}): cannot read it ({exc.strerror or exc})") from None


@functools.lru_cache(maxsize=1024)
def _tree(name: str, path: Path, source: bytes) -> ast.Module:
    """The parsed source of module `name` (read only: never changed; one parse per content); a file that
    is not UTF-8 Python is one line naming it."""
    try:
        return ast.parse(source.decode("utf-8"), filename=str(path))
    except UnicodeDecodeError as exc:
        raise InputError(f"provenance: module {name} ({path}): byte {exc.start}: not UTF-8 text "
                         f"({exc.reason}); save the file as UTF-8") from None
    except SyntaxError as exc:
        raise InputError(f"provenance: module {name} ({path}): line {exc.lineno}: {exc.msg}") from None
    except (ValueError, RecursionError) as exc:
        raise InputError(f"provenance: module {name} ({path}): cannot parse it ({exc})") from None


def _parse(name: str, root: Path) -> tuple[ast.Module, bool]:
    path = module_path(name, root)
    if path is None:
        raise InputError(f"provenance: module {name} has no source under {root}")
    return _tree(name, path, _read(name, path)), path.name == "__init__.py"


def _without_docstrings(tree: ast.Module) -> ast.Module:
    """`tree` less every statement that is a bare string (docstrings and the like): they run nothing."""
    for node in ast.walk(tree):
        for field in ("body", "orelse", "finalbody"):
            body = getattr(node, field, None)
            if isinstance(body, list):
                body[:] = [stmt for stmt in body if not (
                    isinstance(stmt, ast.Expr) and isinstance(stmt.value, ast.Constant)
                    and isinstance(stmt.value.value, str))]
    return tree


def code_text(name: str, root: Path = ROOT) -> str:
    """What of module `name` counts for its code identity: its syntax tree without comments, docstrings
    and positions (ast.dump), so an edit that changes no code that runs changes nothing."""
    path = module_path(name, root)
    if path is None:
        raise InputError(f"provenance: module {name} has no source under {root}")
    return _code_text(name, path, _read(name, path))


@functools.lru_cache(maxsize=1024)
def _code_text(name: str, path: Path, source: bytes) -> str:
    return ast.dump(_without_docstrings(_tree.__wrapped__(name, path, source)))  # a fresh tree: stripped here


def _walk(nodes: Iterable[ast.AST], into_functions: bool) -> Iterator[ast.AST]:
    todo = list(nodes)
    while todo:
        node = todo.pop()
        yield node
        if into_functions or not isinstance(node, _FUNCTIONS):
            todo.extend(ast.iter_child_nodes(node))


def _imports_in(nodes: Iterable[ast.AST], name: str, is_package: bool, root: Path,
                into_functions: bool = True) -> set[str]:
    found: set[str] = set()
    for node in _walk(nodes, into_functions):
        if isinstance(node, ast.Import):
            found.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            target = (_resolve_relative(node.module, node.level, name, is_package) if node.level
                      else node.module or "")
            # `from pkg import sub` runs sub, and pkg's module level only (a parent); `from pkg import f`, pkg
            subs = {f"{target}.{alias.name}" for alias in node.names}
            modules = {m for m in subs if module_path(m, root) is not None}
            found |= modules | ({target} if modules != subs else set())
        elif (isinstance(node, ast.Constant) and isinstance(node.value, str)
              and _MODULE_STRING.fullmatch(node.value)):
            found.add(node.value.split(":")[0])
        elif (prefix := computed_load_prefix(node, name)) is not None:
            found |= {m for m in package_modules(root) if m == prefix or m.startswith(prefix)}
    return {m for m in found if module_path(m, root) is not None}


def loader_call(node: ast.AST) -> str | None:
    """The loader a call runs with a name computed at run time (its first argument is no string
    constant), or None: `importlib.import_module(x)`, `__import__(x)`, `exec(code)`, ... (not `m.eval()`)."""
    if not isinstance(node, ast.Call):
        return None
    func = node.func.attr if isinstance(node.func, ast.Attribute) else getattr(node.func, "id", None)
    if func not in _LOADERS or (func in ("exec", "eval") and not isinstance(node.func, ast.Name)):
        return None
    first = node.args[0] if node.args else None
    return None if isinstance(first, ast.Constant) and isinstance(first.value, str) else func


def computed_load_prefix(node: ast.AST, importer: str) -> str | None:
    """For a load by a computed name (loader_call) outside COVERED_LOADS: the prefix every module it may
    load starts with (the constant start of an f-string or `"llmrnn.x." + name`), else the package's."""
    func = loader_call(node)
    if func is None or (importer.removeprefix(f"{PACKAGE}."), func) in COVERED_LOADS:
        return None
    first = node.args[0] if node.args else None
    head = first
    while isinstance(head, ast.BinOp) and isinstance(head.op, ast.Add):
        head = head.left
    if isinstance(head, ast.JoinedStr) and head.values:
        head = head.values[0]
    text = head.value if isinstance(head, ast.Constant) and isinstance(head.value, str) else ""
    return text if text.startswith(f"{PACKAGE}.") else PACKAGE


@functools.cache
def package_modules(root: Path = ROOT) -> tuple[str, ...]:
    """Every module of the package under root, by name."""
    names = (".".join([PACKAGE, *p.relative_to(root).with_suffix("").parts]).removesuffix(".__init__")
             for p in sorted(root.rglob("*.py")))
    return tuple(n for n in names if all(part.isidentifier() for part in n.split(".")))


def direct_imports(name: str, root: Path = ROOT, into_functions: bool = True) -> set[str]:
    """Modules of the package that module `name` imports or names (see the module docstring);
    into_functions=False: only what importing it runs (its module level)."""
    tree, is_package = _parse(name, root)
    return _imports_in([tree], name, is_package, root, into_functions)


def _handler(register: ast.FunctionDef, subcommand: str) -> str | None:
    """The function that register() binds to `subcommand`: `v = x.add_parser("sub"); v.set_defaults(func=f)`."""
    parsers: dict[str, str] = {}  # variable -> the subcommand whose parser it holds now (`p` is reused)
    for node in sorted(ast.walk(register), key=lambda n: (getattr(n, "lineno", 0), getattr(n, "col_offset", 0))):
        if (isinstance(node, ast.Assign) and len(node.targets) == 1 and isinstance(node.targets[0], ast.Name)
                and isinstance(node.value, ast.Call) and isinstance(node.value.func, ast.Attribute)
                and node.value.func.attr == "add_parser" and node.value.args
                and isinstance(node.value.args[0], ast.Constant)):
            parsers[node.targets[0].id] = node.value.args[0].value
        elif (isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute)
                and node.func.attr == "set_defaults" and isinstance(node.func.value, ast.Name)
                and parsers.get(node.func.value.id) == subcommand):
            for kw in node.keywords:
                if kw.arg == "func" and isinstance(kw.value, ast.Name):
                    return kw.value.id
    return None


def verb_imports(stage_module: str, subcommand: str | None, root: Path = ROOT) -> set[str] | None:
    """What `llmrnn <stage> <subcommand>` can run of its stage module: the module level, register() and
    the handler with every function or class of the module it names (transitively). None where no
    handler is found: the whole module counts then."""
    tree, is_package = _parse(stage_module, root)
    defs = {n.name: n for n in tree.body if isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef))}
    register = defs.get("register")
    handler = _handler(register, subcommand) if subcommand and isinstance(register, ast.FunctionDef) else None
    if handler not in defs:
        return None
    # register() names every subcommand's handler; only this one runs
    others = {kw.value.id for n in ast.walk(register) if isinstance(n, ast.Call)
              for kw in n.keywords if kw.arg == "func" and isinstance(kw.value, ast.Name)} - {handler}
    reached: set[str] = set()
    todo = ["register", handler]
    while todo:
        name = todo.pop()
        if name not in reached and name not in others:
            reached.add(name)
            todo.extend(n.id for n in ast.walk(defs[name]) if isinstance(n, ast.Name) and n.id in defs)
    found = _imports_in([tree], stage_module, is_package, root, into_functions=False)
    return found | _imports_in([defs[n] for n in reached], stage_module, is_package, root)


def closure(entry_modules: Iterable[str], root: Path = ROOT, partial: dict[str, set[str]] | None = None
            ) -> list[str]:
    """Every module of the package that the entry modules can run, sorted (entries and their packages
    included). partial: module -> the imports that count for it where it is an entry (a verb's stage)."""
    partial = dict(partial or {})
    todo = [(name, True) for name in entry_modules]
    whole_done: set[str] = set()
    seen: set[str] = set()
    while todo:
        name, whole = todo.pop()
        if name in whole_done or (name in seen and not whole):
            continue
        if module_path(name, root) is None:
            raise InputError(f"provenance: module {name} has no source under {root}")
        seen.add(name)
        todo.extend((parent, False) for parent in _parents(name))
        if whole and name in partial:
            found = partial.pop(name)  # reached again by a real import: then it counts whole
        else:
            found = direct_imports(name, root, into_functions=whole)
            if whole:
                whole_done.add(name)
        todo.extend((m, True) for m in found)
    return sorted(seen)


def verb_closure(verb: str, *also: str, root: Path = ROOT) -> list[str]:
    """The modules `llmrnn <verb>` can run: the CLI, its stage module as far as the verb reaches it, what
    those import, and `also` (modules it loads by a name given on its command line)."""
    words = verb.split()
    stage = stage_module(words[0])
    part = verb_imports(stage, words[1] if len(words) > 1 else None, root)
    return closure([CLI, stage, *also], root, {stage: part} if part is not None else None)


def hash_modules(modules: Iterable[str], root: Path = ROOT) -> str:
    """sha256 (16 hex digits) of the modules' names and code (code_text: comments and docstrings left out)."""
    digest = hashlib.sha256()
    for name in sorted(modules):
        digest.update(name.encode() + b"\0")
        digest.update(code_text(name, root).encode() + b"\0")
    return digest.hexdigest()[:16]


CACHE_ENV = "LLMRNN_CACHE_DIR"  # where the identities are kept; default $XDG_CACHE_HOME/llmrnn (~/.cache)
_CACHE_KEEP = 8  # cache files kept per folder (one per package content seen: old checkouts age out)


def cache_dir() -> Path:
    """The folder of the on-disk identity cache: $LLMRNN_CACHE_DIR, else $XDG_CACHE_HOME/llmrnn, else
    ~/.cache/llmrnn."""
    if os.environ.get(CACHE_ENV):
        return Path(os.environ[CACHE_ENV])
    return Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache") / "llmrnn"


@functools.cache
def package_key(root: Path = ROOT) -> str:
    """sha256 of every source file of the package under `root` (relative path and bytes) and of the
    Python version: any edit, added or removed module changes it. Read once per process."""
    digest = hashlib.sha256(f"{sys.version_info[:2]}\0{PACKAGE}\0".encode())
    for path in sorted(root.rglob("*.py")):
        digest.update(path.relative_to(root).as_posix().encode() + b"\0")
        digest.update(_read(path.stem, path) + b"\0")
    return digest.hexdigest()[:32]


class _DiskCache:
    """verb key -> identity for one package content, in one JSON file named by package_key. Best effort:
    a folder that cannot be written or a file that does not parse costs a recomputation, never an error
    (the identity is the same either way). Written atomically (temp + rename): concurrent jobs each
    write a whole file."""

    def __init__(self, root: Path):
        self.root = root
        self.folder = cache_dir() / "code-identity"
        self.path = self.folder / f"{package_key(root)}.json"
        self.entries = self._load()

    def _load(self) -> dict[str, str]:
        try:
            data = json.loads(self.path.read_text())
        except (OSError, ValueError):
            return {}
        return {k: v for k, v in data.items() if isinstance(k, str) and isinstance(v, str)} \
            if isinstance(data, dict) else {}

    def get(self, key: str) -> str | None:
        return self.entries.get(key)

    def put(self, key: str, ident: str) -> None:
        self.entries[key] = ident
        self.entries.update(self._load())  # keep what a concurrent job wrote meanwhile (same content, same values)
        self.entries[key] = ident
        try:
            self.folder.mkdir(parents=True, exist_ok=True)
            fd, tmp = tempfile.mkstemp(dir=self.folder, prefix=".tmp-", suffix=".json")
            with os.fdopen(fd, "w") as out:
                json.dump(self.entries, out, sort_keys=True)
            os.replace(tmp, self.path)
        except OSError:
            with contextlib.suppress(OSError, UnboundLocalError):
                os.unlink(tmp)
            return
        self._prune()

    def _prune(self) -> None:
        with contextlib.suppress(OSError):
            files = sorted(self.folder.glob("*.json"), key=lambda p: p.stat().st_mtime, reverse=True)
            for old in files[_CACHE_KEEP:]:
                old.unlink(missing_ok=True)


@functools.cache
def _disk_cache(root: Path) -> _DiskCache:
    return _DiskCache(root)


@functools.cache
def _modules_identity(verb: str, *also: str, root: Path = ROOT) -> str:
    cache = _disk_cache(root)
    key = "\0".join((verb, *also))
    ident = cache.get(key)
    if ident is None:
        ident = hash_modules(verb_closure(verb, *also, root=root), root)
        cache.put(key, ident)
    return ident


def code_identity(verb: str, *also: str, root: Path = ROOT) -> str:
    """The code identity of a job running `llmrnn <verb>` (e.g. "cohort split"), plus the modules it
    loads by a name given on its command line (`also`, e.g. a `--reward-func` module) and the Python files
    from outside the package it runs (`also` ending in .py: your own reward, reward.custom.path), each by
    its content's sha256. The ONE identity of a job: a rule's `code` param (rules/common.smk code_hash) and
    the training checkpoints' fingerprint (llmrnn.train.checkpoints) are both this."""
    files = [a for a in also if a.endswith(".py")]
    ident = _modules_identity(verb, *(a for a in also if not a.endswith(".py")), root=root)
    for file in files:
        try:
            ident += "+" + hashlib.sha256(Path(file).read_bytes()).hexdigest()
        except OSError as exc:
            raise InputError(f"{file}: cannot read the code it names ({exc.strerror or exc})") from exc
    return ident
