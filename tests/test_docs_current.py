"""Docs that cannot go stale: every `snakemake <target>`, every `llmrnn <verb> [<sub>]`, every pointer to a
section of a page and every dotted config key, wherever the project shows one to a reader, names something
that exists now. Seconds: no program is started (the workflow's rules are Snakemake's own, built once in this
process; a slow test holds the option table equal to Snakemake's parser).

Where: README.md, CONTRIBUTING.md, config/README.md, docs/*.md, the comments of config/ and profiles/ YAML,
the Snakefile and rules/*.smk (comments and strings: the rules' shell commands), and the strings and
comments of src/llmrnn (the CLI's own messages).
Against what:
  - `snakemake ...`: the rules of the workflow as Snakemake builds it for both recipes, wildcards too
    (tests.rules_api), and Snakemake's options (a table held
    equal to Snakemake's own parser by a slow test): a rule that does not exist, a rule with wildcards named
    as a target, a `--configfile` that swallows a target, a `--profile` that is no folder of profiles/;
  - `llmrnn ...`: the verbs, subcommands and options of the real CLI parser (`llmrnn.cli.build_parser`);
  - `docs/x.md#anchor`, `README "Title"`, `CONTRIBUTING.md's "Title"`, `(docs/x.md, "Title")`, and
    "section `key`": the headings of the page, with GitHub's anchor rules; a pointer from a config,
    rule or message to the README names its section;
  - `qa.split.val_size`, `roles.<role>.model`: a setting of llmrnn.settings.Config;
  - the README's DAG sketch names rules, and docs/architecture.md's glossary defines the project's words.
A mention in code (a fenced block, a `code span`, a comment or string line that is a command with an
option) is checked in full; one in running prose only where it reads as a name (a rule name has a `_`,
a verb is one of the CLI's), so "snakemake runs in" and "llmrnn at that commit" stay prose. Each failure
names file:line and the reference.
"""

from __future__ import annotations

import argparse
import re
import types
import typing
from dataclasses import dataclass
from functools import cache
from pathlib import Path

import pytest

from tests.conftest import REPO
from tests.rules_api import workflow_rules
from tests.test_docs_links import anchors, headings

MARKDOWN = ["README.md", "CONTRIBUTING.md", "config/README.md"]
FENCE = re.compile(r"^\s*(```|~~~)(\S*)")
CODE_SPAN = re.compile(r"`([^`\n]+)`")
# the text after a program's name that can be its arguments: up to the end of a clause of code or prose
ARGS = r"((?:[ \t]+[^\s`)|;&#\"',]+)*)"
COMMAND = re.compile(r"(?<![\w./-])(snakemake|llmrnn)(?![\w.-])" + ARGS)
# a comment or string line that IS a command, with an option (`#   LLMRNN_CONFIGFILE=x snakemake --profile ...`,
# a rule's "llmrnn cohort synth --n ..."); "llmrnn package; run from ..." is a sentence
COMMAND_LINE = re.compile(r"^\s*(?:[A-Z_][A-Z0-9_]*=\S*\s+)*(?:exec\s+)?(?:snakemake|llmrnn)\b(?=.*\s--?\w)")
PLACEHOLDER = re.compile(r"^(\.\.\.|…|[A-Z]|[\w.-]*<[^>]*>[\w./-]*|\{.*\}|\$\S+|my\.yaml)$")
# the names of the project's pages as prose and messages write them
DOC = r"(?<![\w/.])((?:config/)?README(?:\.md)?|CONTRIBUTING(?:\.md)?|docs/[\w-]+\.md)"
TITLED = re.compile(DOC + r"(?:'s)?(?:,\s*|\s+)(?:section\s+)?"
                    r"(?:\"([^\"\n]{2,80})\"|'([^'\n]{2,80})'|“([^”\n]{2,80})”|`([^`\n]{1,80})`)")
ANCHORED = re.compile(DOC + r"#([\w-]+)")
BARE_README = re.compile(r"(?<![\w/.`])README(?!\.md|\w|'s\s*[\"'“`]|,?\s*[\"'“`]|#)")
CONFIG_SECTION = re.compile(r"(?<![\w.])section\s+`([\w.]+)`")
# A code span that reads like a command but is none -> why.
NOT_COMMANDS = {"llmrnn release of run <run_name>": "the default commit message of the Hub upload"}
RULE_OPTIONS = {"--forcerun", "--until", "--omit-from", "--allowed-rules", "--prioritize"}


@dataclass(frozen=True)
class Text:
    """One piece of a source line, and whether it is code (checked in full) or prose."""

    file: str
    line: int
    text: str
    code: bool

    @property
    def where(self) -> str:
        return f"{self.file}:{self.line}"


# ----------------------------------------------------------------------------- where the docs are
def markdown_files() -> list[str]:
    return [*MARKDOWN, *sorted(p.relative_to(REPO).as_posix() for p in (REPO / "docs").glob("*.md"))]


def other_files() -> list[str]:
    found = [*(REPO / "config").rglob("*.yaml"), *(REPO / "profiles").rglob("*.yaml"), REPO / "Snakefile",
             *(REPO / "rules").glob("*.smk"), *(REPO / "src" / "llmrnn").rglob("*.py")]
    return sorted(p.relative_to(REPO).as_posix() for p in found)


def split_code(file: str, n: int, text: str, code: bool = False) -> list[Text]:
    """A prose line as its code spans (code) and the rest, spans blanked (prose unless `code`)."""
    spans = [Text(file, n, m.group(1), True) for m in CODE_SPAN.finditer(text)]
    return [*spans, Text(file, n, CODE_SPAN.sub(lambda m: " " * len(m.group()), text), code)]


def markdown_texts(file: str, text: str) -> list[Text]:
    """Fenced lines are code (a `\\` continuation joined to its line); the rest is prose with code spans."""
    out, fenced, pending = [], False, None
    for n, line in enumerate(text.splitlines(), 1):
        if FENCE.match(line):
            fenced = not fenced
            continue
        if fenced:
            if pending:
                n, line = pending[0], pending[1] + " " + line.strip()
                pending = None
            if line.rstrip().endswith("\\"):
                pending = (n, line.rstrip()[:-1])
                continue
            out.append(Text(file, n, line, True))
        else:
            out += split_code(file, n, line)
    return out


def source_texts(file: str, text: str) -> list[Text]:
    """YAML: its comments. Snakefile, rules and Python: their comments and strings (the messages, the
    docstrings, the rules' shell commands), line by line. A comment or string line that IS a command is
    code; otherwise its code spans are, the rest is prose."""
    if file.endswith(".yaml"):
        pieces = [(n, line.partition("#")[2]) for n, line in enumerate(text.splitlines(), 1) if "#" in line]
    else:
        pieces = strings_and_comments(text)
    out = []
    for n, piece in pieces:
        piece = piece.lstrip("#")
        out += split_code(file, n, piece, code=bool(COMMAND_LINE.match(piece)))
    return out


# a comment, or a string literal (its prefix, quotes and body), of Python or Snakemake's Python: a regex scan
# (tokenize reads the package in 2 s, this in a tenth of that); a `#` inside a string stays in the string
LITERAL = re.compile(r"(#[^\n]*)|[rRbBfFuU]{0,2}(\"\"\"(?:\\.|[^\\])*?\"\"\"|'''(?:\\.|[^\\])*?'''"
                     r"|\"(?:\\.|[^\"\\\n])*\"|'(?:\\.|[^'\\\n])*')", re.DOTALL)


def strings_and_comments(text: str) -> list[tuple[int, str]]:
    """(line, text) of each line of each string literal and comment of Python (or Snakemake's Python)."""
    out, line, at = [], 1, 0
    for m in LITERAL.finditer(text):
        line += text.count("\n", at, m.start())
        at = m.start()
        if m.group(1):
            out.append((line, m.group(1)))
        else:
            quote = 3 if m.group(2)[:3] in ('"""', "'''") else 1
            out += [(line + i, piece) for i, piece in enumerate(m.group(2)[quote:-quote].split("\n"))]
    return out


@cache
def texts() -> tuple[Text, ...]:
    out = []
    for file in markdown_files():
        out += markdown_texts(file, (REPO / file).read_text(encoding="utf-8"))
    for file in other_files():
        out += source_texts(file, (REPO / file).read_text(encoding="utf-8"))
    return tuple(out)


# ----------------------------------------------------------------------------- what exists
@cache
def rules() -> dict[str, bool]:
    """Rule name -> whether its output has wildcards (so it cannot be a target by name), of the Snakefile and
    the rule files as Snakemake builds them for both recipes (tests.rules_api: a computed `name:` under each
    name it gives, a `use rule` child with its parent's output unless its `with:` block gives one)."""
    return {name: rule.has_wildcards for name, rule in workflow_rules().items()}


# Snakemake's options the docs use -> (the option's long name, nargs), so the fast checks need not import
# Snakemake (2-4 s); any other option is looked up in Snakemake's own parser, and the slow test below holds
# this table equal to that parser.
SNAKEMAKE_OPTIONS = {
    "--configfile": ("--configfile", "+"), "--config": ("--config", "*"), "-C": ("--config", "*"),
    "--profile": ("--profile", None), "--cores": ("--cores", None), "-c": ("--cores", None),
    "--jobs": ("--jobs", None), "-j": ("--jobs", None), "--dry-run": ("--dry-run", 0), "-n": ("--dry-run", 0),
    "--printshellcmds": ("--printshellcmds", 0), "-p": ("--printshellcmds", 0),
    "--forcerun": ("--forcerun", "*"), "-R": ("--forcerun", "*"), "--until": ("--until", "+"),
    "-U": ("--until", "+"), "--omit-from": ("--omit-from", "+"), "-O": ("--omit-from", "+"),
    "--allowed-rules": ("--allowed-rules", "+"), "--forceall": ("--forceall", 0), "-F": ("--forceall", 0),
    "--report": ("--report", "?"), "--lint": ("--lint", "?"), "--dag": ("--dag", "?"),
    "--rulegraph": ("--rulegraph", "?"), "--summary": ("--summary", 0), "--list-changes": ("--list-changes", None),
    "--list-rules": ("--list-rules", 0), "--list-target-rules": ("--list-target-rules", 0),
    "--keep-going": ("--keep-going", 0), "-k": ("--keep-going", 0), "--unlock": ("--unlock", 0),
    "--rerun-incomplete": ("--rerun-incomplete", 0), "--software-deployment-method":
    ("--software-deployment-method", "+"), "--sdm": ("--software-deployment-method", "+"),
    "--directory": ("--directory", None), "-d": ("--directory", None), "--help": ("--help", 0),
}


@cache
def snakemake_parser_options() -> dict[str, tuple[str, object]]:
    """Option string -> (the option's first long name, nargs), from Snakemake's own argument parser."""
    from snakemake.cli import get_argument_parser

    out = {}
    for action in get_argument_parser()._actions:
        long = next((s for s in action.option_strings if s.startswith("--")), None)
        for s in action.option_strings:
            out[s] = (long or s, action.nargs)
    return out


def snakemake_option(name: str) -> tuple[str, object] | None:
    return SNAKEMAKE_OPTIONS.get(name) or snakemake_parser_options().get(name)


@cache
def llmrnn_parser() -> argparse.ArgumentParser:
    from llmrnn import cli

    return cli.build_parser()


def subcommands(parser: argparse.ArgumentParser) -> dict[str, argparse.ArgumentParser]:
    return {name: sub for a in parser._actions if isinstance(a, argparse._SubParsersAction)
            for name, sub in a.choices.items()}


# ----------------------------------------------------------------------------- the checks
def tokens_of(args: str) -> list[str]:
    """The words of a mention, a sentence's last full stop or colon dropped."""
    return [re.sub(r"[.:]+$", "", t) if not re.fullmatch(r"\.+|…", t) else t for t in args.split()]


def parse_snakemake(tokens: list[str]) -> tuple[list[str], dict[str, list[str]], list[str]]:
    """(targets, option -> values, unknown options) as Snakemake's parser reads the words: an option takes
    as many of the words after it as its nargs allows (`+`/`*`: every word up to the next option)."""
    targets: list[str] = []
    values: dict[str, list[str]] = {}
    unknown: list[str] = []
    i = 0
    while i < len(tokens):
        tok = tokens[i]
        i += 1
        if tok == "--":
            targets += tokens[i:]
            break
        if not tok.startswith("-") or tok == "-":
            targets.append(tok)
            continue
        name, eq, inline = tok.partition("=")
        if not snakemake_option(name):
            if not (name.startswith("-") and not name.startswith("--")  # -np: -n -p
                    and all((snakemake_option(f"-{c}") or ("", 1))[1] == 0 for c in name[1:])):
                unknown.append(tok)
            continue
        long, nargs = snakemake_option(name)
        taken = [inline] if eq else []
        if not eq and nargs != 0:
            most = {None: 1, "?": 1}.get(nargs, nargs if isinstance(nargs, int) else len(tokens))
            while i < len(tokens) and len(taken) < most and not tokens[i].startswith("-"):
                taken.append(tokens[i])
                i += 1
        values.setdefault(long, []).extend(taken)
    return targets, values, unknown


def is_path(word: str) -> bool:
    return "/" in word or "." in word


def snakemake_problems(t: Text, args: str) -> list[str]:
    """What is wrong with one `snakemake ...` mention."""
    targets, values, unknown = parse_snakemake(tokens_of(args))
    known, out = rules(), []
    named = [w for w in targets if not PLACEHOLDER.match(w) and not is_path(w)]
    for option in sorted(RULE_OPTIONS & values.keys()):
        named += [w for w in values[option] if not PLACEHOLDER.match(w) and not is_path(w)]
    for word in named:
        if word not in known and (t.code or "_" in word):
            out.append(f"no rule {word!r}")
    for word in targets:
        if known.get(word):
            out.append(f"rule {word!r} has wildcards: it cannot be a target by name (name its output file, or "
                       f"use --until {word})")
    if not t.code:
        return out
    out += [f"no snakemake option {u!r}" for u in unknown]
    for value in values.get("--configfile", []):
        if value in known:
            out.append(f"--configfile reads the rule {value!r} as a config file: put the targets first or "
                       f"after `--`")
        elif value.startswith("config/") and not PLACEHOLDER.match(value) and not (REPO / value).is_file():
            out.append(f"no config file {value}")
    for value in values.get("--profile", []):
        if not PLACEHOLDER.match(value) and not (REPO / value / "config.yaml").is_file():
            out.append(f"--profile {value}: not a profile folder of this repository (profiles/slurm, "
                       f"profiles/local)")
    return out


def llmrnn_problems(t: Text, args: str) -> list[str]:
    """What is wrong with one `llmrnn ...` mention: its verb, subcommands and options (prose: only a
    verb and subcommands that exist are followed, "llmrnn at" is a word of a sentence)."""
    parser, path = llmrnn_parser(), ["llmrnn"]
    words = [w for w in tokens_of(args) if w not in ("-v", "--verbose")]
    while words and (subs := subcommands(parser)):
        word = words[0]
        if PLACEHOLDER.match(word) or word in ("-h", "--help"):
            return []
        if word not in subs:
            return [f"`{' '.join(path)}` has no subcommand {word!r} (it has: {', '.join(subs)})"] if t.code else []
        parser, path, words = subs[word], [*path, word], words[1:]
    if not t.code:
        return []
    options = set(parser._option_string_actions)
    return [f"`{' '.join(path)}` has no option {w.split('=')[0]}" for w in words
            if w.startswith("--") and w.split("=")[0] not in options]


def command_problems(items: tuple[Text, ...]) -> list[str]:
    out = []
    for t in items:
        for m in COMMAND.finditer(t.text):
            if m.group().strip() in NOT_COMMANDS:
                continue
            check = snakemake_problems if m.group(1) == "snakemake" else llmrnn_problems
            mention = (m.group(1) + m.group(2)).strip()
            out += [f"{t.where}: `{mention}`: {p}" for p in check(t, m.group(2))]
    return out


@cache
def doc_path(name: str) -> Path:
    return REPO / (name if name.endswith(".md") else f"{name}.md")


@cache
def heading_names(path: Path) -> tuple[set[str], set[str]]:
    """(each heading's text, backticks dropped, lower case; the code spans of the headings)."""
    names = {h.replace("`", "").strip().lower() for h in headings(path)}
    spans = {s for h in headings(path) for s in CODE_SPAN.findall(h)}
    return names, spans


def has_section(path: Path, title: str, quote: str) -> bool:
    names, spans = heading_names(path)
    title = title.replace("`", "").strip().lower()
    return any(n == title or n.startswith(title) and not n[len(title)].isalnum() for n in names) or (
        quote == "`" and title in spans)


def pointer_problems(items: tuple[Text, ...]) -> list[str]:
    out = []
    markdown = set(markdown_files())
    for t in items:
        # a pointer in prose and a title in a code span next to it are one pointer: look at the whole line
        for m in TITLED.finditer(t.text):
            doc, title = m.group(1), next(g for g in m.groups()[1:] if g is not None)
            quote = "`" if m.group(5) is not None else '"'
            path = doc_path(doc)
            if not path.is_file():
                out.append(f"{t.where}: {doc}: no such page")
            elif not has_section(path, title, quote):
                out.append(f"{t.where}: {doc} has no section {title!r} (its headings: "
                           f"{'; '.join(headings(path))})")
        for m in ANCHORED.finditer(t.text):
            doc, anchor = m.groups()
            path = doc_path(doc)
            if not path.is_file():
                out.append(f"{t.where}: {doc}: no such page")
            elif anchor not in anchors(path):
                out.append(f"{t.where}: {doc}#{anchor}: no heading with that anchor in {doc}")
        for m in CONFIG_SECTION.finditer(t.text):
            key = m.group(1)
            if not TITLED.search(t.text[max(0, m.start() - 40):m.end()]) and not (
                    {key, key.split(".")[0]} & heading_names(REPO / "docs" / "configuration.md")[1]):
                out.append(f"{t.where}: section `{key}`: docs/configuration.md has no heading for it")
        if t.file not in markdown and not t.code and BARE_README.search(t.text):
            out.append(f"{t.where}: points at the README without naming a section: name the page and its "
                       f"section (docs/x.md \"Title\" or docs/x.md#anchor)")
    return out


def whole_lines() -> tuple[Text, ...]:
    """Each source line once, whole, as prose: a pointer may put its title in a code span."""
    out = []
    for file in [*markdown_files(), *other_files()]:
        for n, line in enumerate((REPO / file).read_text(encoding="utf-8").splitlines(), 1):
            if file.endswith(".md") and FENCE.match(line):
                continue
            out.append(Text(file, n, line, False))
    return tuple(out)


def diagram_problems(file: str) -> list[str]:
    """The rule names of a page's diagrams (fenced blocks drawn with box lines): every snake_case name is
    a rule."""
    out, fenced, drawing = [], False, False
    for n, line in enumerate((REPO / file).read_text(encoding="utf-8").splitlines(), 1):
        if FENCE.match(line):
            fenced, drawing = not fenced, False
            continue
        if fenced and ("─" in line or "│" in line or drawing):
            drawing = True
            out += [f"{file}:{n}: the diagram names {w!r}, which is no rule"
                    for w in re.findall(r"\b[a-z]+(?:_[a-z0-9]+)+\b", line) if w not in rules()]
    return out


# ----------------------------------------------------------------------------- config keys the docs name
# Dotted names in a config key's spelling that are no key of ours -> whose they are.
NOT_CONFIG_KEYS = {
    "reward.custom_reward_function": "verl's Hydra key (llmrnn.train.verl_overrides)",
    "reward.reward_manager": "verl's Hydra key", "reward.num_workers": "verl's Hydra key",
    "judge.source": "a key of the rubric file (config/rubrics/)", "judge.model": "a key of the rubric file",
}
KEY_FILE_ENDINGS = {"py", "smk", "yaml", "yml", "json", "jsonl", "parquet", "md", "png", "tsv", "csv", "txt",
                    "log", "html", "pt", "safetensors", "gz"}


def key_exists(parts: list[str]) -> bool:
    """Whether a dotted config key (`qa.split.val_size`, `models.<name>.source`, `qa.fields.*`) names a
    setting of the models (llmrnn.settings.Config), a section or a leaf."""
    from pydantic import BaseModel

    from llmrnn.settings import Config

    tp: object = Config
    for part in parts:
        if part == "*" or part.startswith("{"):
            return True
        origin, args = typing.get_origin(tp), typing.get_args(tp)
        if origin is dict:  # models.<name>: any name
            tp = args[1]
            continue
        if part.startswith("<") and isinstance(tp, type) and issubclass(tp, BaseModel):  # roles.<role>: any role
            tp = next(iter(tp.model_fields.values())).annotation
            continue
        if not (isinstance(tp, type) and issubclass(tp, BaseModel)) or part not in tp.model_fields:
            return False
        tp = tp.model_fields[part].annotation
        inner = [a for a in typing.get_args(tp) if a is not type(None)]
        if typing.get_origin(tp) in (typing.Union, types.UnionType) and len(inner) == 1:
            tp = inner[0]
    return True


@cache
def key_pattern() -> re.Pattern:
    from pydantic import BaseModel

    from llmrnn.settings import Config

    sections = [k for k, i in Config.model_fields.items()
                if typing.get_origin(i.annotation) is dict or (isinstance(i.annotation, type)
                                                               and issubclass(i.annotation, BaseModel))]
    return re.compile(r"(?<![\w/.$-])(" + "|".join(sections) + r")((?:\.(?:[\w]+|<\w+>|\*|\{[\w,]+\}))+)(?![\w(/-])")


def key_problems(items: tuple[Text, ...]) -> list[str]:
    """A dotted config key that no setting has, in a code span of the docs or anywhere in a comment of a
    config or profile (the code's own dotted names are modules as often as keys: not checked)."""
    out = []
    for t in items:
        if not (t.code and t.file.endswith(".md") or t.file.startswith(("config/", "profiles/"))):
            continue
        for m in key_pattern().finditer(t.text):
            parts = [m.group(1), *m.group(2).lstrip(".").split(".")]
            if parts[-1] in KEY_FILE_ENDINGS or any(".".join(parts).startswith(k) for k in NOT_CONFIG_KEYS):
                continue
            if not key_exists(parts):
                out.append(f"{t.where}: `{'.'.join(parts)}`: no such config key (docs/configuration.md)")
    return out


# ----------------------------------------------------------------------------- the checker itself
def test_the_rule_reader_reads_names_use_rule_and_wildcards(tmp_path):
    (tmp_path / "Snakefile").write_text(
        'RUN = "r"\n\n\nrule plain:\n    output:\n        f"{RUN}/x.json",\n    shell:\n        "echo"\n\n\n'
        'rule shard:\n    input:\n        "a",\n    output:\n        part=f"{RUN}/s/{{k}}.parquet",\n\n\n'
        'checkpoint plain_file:\n    output:\n        "out/{name}.txt",\n\n\n'
        'use rule plain as plain_copy with:\n    log:\n        "x.log",\n\n\n'
        'use rule shard as shard_fixed with:\n    output:\n        "fixed.txt",\n')
    found = workflow_rules(tmp_path / "Snakefile", configs=())
    assert {name: rule.has_wildcards for name, rule in found.items()} == {
        "plain": False, "shard": True, "plain_file": True, "plain_copy": False, "shard_fixed": False}


def test_snakemake_words_are_read_as_snakemake_reads_them(monkeypatch):
    monkeypatch.setattr("tests.test_docs_current.snakemake_parser_options", dict)  # the table alone
    assert parse_snakemake(["--configfile", "config/qa_demo.yaml", "all"]) == (
        [], {"--configfile": ["config/qa_demo.yaml", "all"]}, [])
    assert parse_snakemake(["all", "--configfile", "a.yaml", "--", "eval_heldout"])[0] == ["all", "eval_heldout"]
    targets, values, _ = parse_snakemake(["--profile", "profiles/slurm", "-np", "-R", "merge_model"])
    assert targets == [] and values == {"--profile": ["profiles/slurm"], "--forcerun": ["merge_model"]}
    assert parse_snakemake(["--report", "report.html", "--lint"]) == ([], {"--report": ["report.html"],
                                                                          "--lint": []}, [])
    assert parse_snakemake(["--no-such-option"])[2] == ["--no-such-option"]


def test_a_stale_command_or_pointer_is_found(monkeypatch):
    """Each kind of stale reference the docs had, as a line of a message, comment or page, is reported."""
    code = [Text("m.py", 1, 'f"(rerun `llmrnn check` after `snakemake prepare_models`)"', True),
            Text("c.yaml", 2, "   snakemake --configfile config/qa_demo.yaml all", True),
            Text("d.md", 3, "snakemake --profile slurm all", True),
            Text("d.md", 4, "snakemake eval_shard --until nope", True),
            Text("d.md", 5, "llmrnn judge serverr --rubric x", True),
            Text("d.md", 6, "llmrnn cohort synth --formatt mimic-iv", True),
            Text("d.md", 7, "llmrnn chekc", True),
            Text("d.md", 8, "snakemake --profile profiles/slurm all --configfile config/smoke.yaml", True),
            Text("d.md", 9, "llmrnn train ray-cluster node --help", True)]
    found = command_problems(tuple(code))
    assert [p.split(":", 2)[:2] for p in found] == [
        ["m.py", "1"], ["c.yaml", "2"], ["d.md", "3"], ["d.md", "4"], ["d.md", "4"], ["d.md", "5"],
        ["d.md", "6"], ["d.md", "7"]], found
    assert "no rule 'prepare_models'" in found[0] and "--configfile reads the rule 'all'" in found[1]
    assert "cannot be a target by name" in found[4] and "no option --formatt" in found[6]
    prose = [Text("p.md", 1, "when running snakemake so rules find it, llmrnn at its best", False),
             Text("p.md", 2, "run snakemake prepare_models first", False)]
    assert [p.split(":")[1] for p in command_problems(tuple(prose))] == ["2"]
    pointers = [Text("a.yaml", 1, '# the smoke test (README "Smoke test first"); see README.', False),
                Text("b.py", 2, 'see docs/cluster.md#no-such-anchor and (docs/demo.md, "What runs")', False),
                Text("c.smk", 3, "config section `no_such_key`; CONTRIBUTING.md's \"Where is stage X?\"", False)]
    found = pointer_problems(tuple(pointers))
    assert [p.split(":")[:2] for p in found] == [["a.yaml", "1"], ["a.yaml", "1"], ["b.py", "2"], ["c.smk", "3"]]
    assert "README has no section 'Smoke test first'" in found[0] and "without naming a section" in found[1]
    assert "#no-such-anchor" in found[2] and "section `no_such_key`" in found[3]


def test_a_key_that_no_setting_has_is_found():
    items = (Text("docs/x.md", 1, "qa.split.val_size / split.val_size", True),
             Text("docs/x.md", 2, "split.test_size", True),
             Text("config/c.yaml", 3, " roles.memory.model, models.<name>.source, qa.fields.*, train.lr", False),
             Text("config/c.yaml", 4, " the judge grades where eval.judge is on", False),
             Text("docs/x.md", 5, "RUN/train.parquet, rules/qa.smk, train.parquet", True),
             Text("docs/x.md", 6, "the split.val_size of the prose", False),
             Text("src/a.py", 7, "train.config.normalize", True))
    assert [p.split(": ")[0:2] for p in key_problems(items)] == [["docs/x.md:2", "`split.test_size`"],
                                                                 ["config/c.yaml:4", "`eval.judge`"]]


# ----------------------------------------------------------------------------- the project's docs
def test_the_readers_find_the_mentions():
    """The readers see the mentions the docs hold (so an empty pass is not a vacuous one)."""
    items = texts()
    files = {t.file for t in items}
    assert {"README.md", "docs/cluster.md", "config/smoke.yaml", "Snakefile", "rules/check.smk",
            "src/llmrnn/check/__init__.py"} <= files
    mentions = [m.group(1) for t in items for m in COMMAND.finditer(t.text)]
    assert mentions.count("snakemake") >= 40 and mentions.count("llmrnn") >= 100, len(mentions)
    assert len(rules()) >= 30 and "train_grpo" in rules() and "qa_train_grpo" in rules()
    assert sum(bool(TITLED.search(t.text) or ANCHORED.search(t.text)) for t in whole_lines()) >= 5


def test_every_snakemake_and_llmrnn_command_names_what_exists():
    problems = command_problems(texts())
    assert not problems, "stale commands:\n" + "\n".join(problems)


def test_every_section_pointer_names_a_real_heading():
    problems = pointer_problems(whole_lines())
    assert not problems, "stale pointers:\n" + "\n".join(problems)


def test_every_config_key_the_docs_name_exists():
    problems = key_problems(texts())
    assert not problems, "\n".join(problems)


GLOSSARY = ["the reference", "h_ref", "pkg://", "phase b", "memory head", "judge", "outcome vs judged reward",
            "trajectory step", "shard", "code identity", "rerun table"]


def test_the_glossary_defines_the_projects_words():
    """docs/architecture.md's glossary defines the words the docs and messages use without explaining."""
    page = REPO / "docs" / "architecture.md"
    assert "Glossary" in headings(page)
    section = page.read_text(encoding="utf-8").split("\n## Glossary\n", 1)[1].split("\n## ", 1)[0]
    defined = [d.replace("`", "").lower() for d in re.findall(r"^- \*\*(.+?)\*\*", section, re.MULTILINE)]
    assert not [w for w in GLOSSARY if not any(w in d for d in defined)], defined


def test_the_readmes_diagram_names_real_rules():
    problems = diagram_problems("README.md")
    assert not problems, "\n".join(problems)


@pytest.mark.slow
def test_the_option_table_is_snakemakes():
    real = snakemake_parser_options()
    assert {name: real.get(name) for name in SNAKEMAKE_OPTIONS} == SNAKEMAKE_OPTIONS


