"""Nothing from a config reaches a shell unquoted: every `{field}` of every rule's shell command carries
Snakemake's `:q` (a cohort path with a space or `$(...)` would otherwise split or execute)."""

from __future__ import annotations

import ast
import re
import string
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
RULE = re.compile(r"^rule( \w+)?:", re.MULTILINE)


def shell_commands(smk: Path) -> dict[str, str]:
    """rule name -> its shell command: the block indented under `shell:`, read as ONE Python literal
    (implicit concatenation, triple quotes); a `rule:` is named by its `name:` expression. An f-string or any expression there is an error: it would
    format config values into the command without `:q`."""
    commands: dict[str, str] = {}
    rule, lines = None, smk.read_text().splitlines()
    for i, line in enumerate(lines):
        if m := RULE.match(line):
            rule = (m.group(1) or "").strip()
        if re.match(r"^    name:", line):  # a `rule:`'s computed name: its expression names it here
            rule = line.split(":", 1)[1].strip() or lines[i + 1].strip()
        if line.strip() != "shell:":
            continue
        indent = len(line) - len(line.lstrip())
        block = []
        for body in lines[i + 1:]:
            if body.strip() and len(body) - len(body.lstrip()) <= indent:
                break
            if not body.strip().startswith("#"):
                block.append(body.strip())
        try:
            commands[rule] = ast.literal_eval("(\n" + "\n".join(block) + "\n)")
        except (ValueError, SyntaxError) as exc:
            raise AssertionError(f"{smk.name}: rule {rule}: shell is not a plain string literal ({exc})") from None
    return commands


def unquoted_fields(command: str) -> list[str]:
    """Fields without `:q`, and shell variables given a `:q` (`${{X:q}}` reaches bash as `${X:q}`, a
    substitution error: `:q` belongs to Snakemake fields, not to escaped braces)."""
    parsed = list(string.Formatter().parse(command))
    fields = [
        field + (f":{spec}" if spec else "")
        for _, field, spec, _ in parsed
        if field is not None and not (spec or "").endswith("q")
    ]
    literal = "".join(text for text, *_ in parsed)
    return fields + re.findall(r"\$\{[^}]*:q\}", literal)


def test_every_shell_field_is_quoted():
    commands = {
        f"{smk.name}:{rule}": cmd for smk in sorted((REPO / "rules").glob("*.smk")) for rule, cmd in shell_commands(smk).items()
    }
    # every rule with a shell: block was found (the scan cannot silently miss a stage file)
    with_shell = sum(
        len(re.findall(r"^    shell:", smk.read_text(), re.MULTILINE)) for smk in (REPO / "rules").glob("*.smk")
    )
    assert len(commands) == with_shell >= 15, sorted(commands)
    unquoted = {name: fields for name, cmd in commands.items() if (fields := unquoted_fields(cmd))}
    assert unquoted == {}


def test_the_scan_sees_an_unquoted_field(tmp_path):
    smk = tmp_path / "x.smk"
    smk.write_text('rule x:\n    shell:\n        "tool --in {input.a:q} "\n        "--out {output} 2> {log:q}; echo ${{HOME}}"\n')
    assert unquoted_fields(shell_commands(smk)["x"]) == ["output"]


def test_the_scan_sees_a_quoted_shell_variable(tmp_path):
    smk = tmp_path / "x.smk"
    smk.write_text('rule x:\n    shell:\n        "tool {input:q} | tee {log:q}; exit ${{PIPESTATUS[0]:q}}"\n')
    assert unquoted_fields(shell_commands(smk)["x"]) == ["${PIPESTATUS[0]:q}"]


def test_the_scan_refuses_an_fstring_shell(tmp_path):
    smk = tmp_path / "x.smk"
    smk.write_text('rule x:\n    shell:\n        f"tool --in {config[\'path\']}"\n\n\nrule y:\n    input:\n')
    with pytest.raises(AssertionError, match="rule x: shell is not a plain string literal"):
        shell_commands(smk)


def test_the_scan_reads_triple_quoted_shells(tmp_path):
    smk = tmp_path / "x.smk"
    smk.write_text('rule x:\n    shell:\n        """\n        tool {input:q} \\\n          {output}\n        """\n')
    assert unquoted_fields(shell_commands(smk)["x"]) == ["output"]
