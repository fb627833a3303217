"""Nothing from a config reaches a shell unquoted: every `{field}` of every rule's shell command carries
Snakemake's `:q` (a cohort path with a space or `$(...)` would otherwise split or execute). The commands are
Snakemake's own (tests.rules_api), over both recipes."""

from __future__ import annotations

import re
import string

from tests.rules_api import REPO, shells_not_literal, workflow_rules


def shell_commands() -> dict[str, str]:
    """`rule file:rule` -> its shell command, for every rule with one, as Snakemake holds it (unformatted)."""
    return {f"{rule.file}:{name}": rule.shell for name, rule in workflow_rules().items() if rule.shell}


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
    commands = shell_commands()
    # both recipes' rules are read (the QA recipe's stage file too)
    assert len(commands) >= 30 and {"rules/qa.smk", "rules/train.smk"} <= {where.split(":")[0] for where in commands}
    unquoted = {name: fields for name, cmd in commands.items() if (fields := unquoted_fields(cmd))}
    assert unquoted == {}


def test_every_shell_is_one_plain_string():
    """An f-string or any expression as a `shell:` would format config values into the command before
    Snakemake sees a field to quote."""
    assert [where for smk in sorted((REPO / "rules").glob("*.smk")) for where in shells_not_literal(smk)] == []


def test_the_scan_sees_an_unquoted_field(tmp_path):
    (tmp_path / "Snakefile").write_text(
        'rule x:\n    shell:\n        "tool --in {input.a:q} "\n        "--out {output} 2> {log:q}; echo ${{HOME}}"\n')
    assert unquoted_fields(workflow_rules(tmp_path / "Snakefile", configs=())["x"].shell) == ["output"]


def test_the_scan_sees_a_quoted_shell_variable(tmp_path):
    (tmp_path / "Snakefile").write_text('rule x:\n    shell:\n        "tool {input:q} | tee {log:q}; exit ${{PIPESTATUS[0]:q}}"\n')
    assert unquoted_fields(workflow_rules(tmp_path / "Snakefile", configs=())["x"].shell) == ["${PIPESTATUS[0]:q}"]


def test_the_scan_refuses_an_fstring_shell(tmp_path):
    smk = tmp_path / "x.smk"
    smk.write_text('rule x:\n    shell:\n        "tool {input:q}"\n\n\n'
                   'rule y:\n    shell:\n        f"tool --in {config[\'path\']}"\n\n\n'
                   'rule z:\n    shell:\n        "tool " + config["path"]\n')
    assert shells_not_literal(smk) == ["x.smk:7", "x.smk:12"]


def test_the_scan_reads_triple_quoted_shells(tmp_path):
    (tmp_path / "Snakefile").write_text(
        'rule x:\n    shell:\n        """\n        tool {input:q} \\\n          {output}\n        """\n')
    assert unquoted_fields(workflow_rules(tmp_path / "Snakefile", configs=())["x"].shell) == ["output"]
