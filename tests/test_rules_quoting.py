"""Nothing from a config reaches a shell unquoted: every `{field}` of every rule's shell command carries
Snakemake's `:q` (a cohort path with a space or `$(...)` would otherwise split or execute)."""

from __future__ import annotations

import ast
import re
import string
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
RULE = re.compile(r"^rule (\w+):", re.MULTILINE)


def shell_commands(smk: Path) -> dict[str, str]:
    """rule name -> its shell command (the string literals under `shell:`, joined as Python joins them)."""
    commands: dict[str, str] = {}
    rule, lines = None, smk.read_text().splitlines()
    for i, line in enumerate(lines):
        if m := RULE.match(line):
            rule = m.group(1)
        if line.strip() == "shell:":
            parts = []
            for body in lines[i + 1:]:
                stripped = body.strip()
                if stripped.startswith("#"):
                    continue
                if not stripped.startswith(('"', "'")):
                    break
                parts.append(ast.literal_eval(stripped))
            commands[rule] = "".join(parts)
    return commands


def unquoted_fields(command: str) -> list[str]:
    return [
        field + (f":{spec}" if spec else "")
        for _, field, spec, _ in string.Formatter().parse(command)
        if field is not None and not (spec or "").endswith("q")
    ]


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
