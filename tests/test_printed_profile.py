"""Every `snakemake --profile P` the project prints (llmrnn check, config headers, docs, rules, Makefile) names
a profile that Snakemake's own lookup (snakemake.cli.get_profile_dir) finds from the repository root on a
fresh account: no ~/.config/snakemake link made first. `--profile slurm` failed there ("no profile.yaml")."""

from __future__ import annotations

import re

import pytest

from tests.conftest import REPO

PRINTED = re.compile(r"--profile[ =]+([^\s`'\"),;]+)")
WHERE = ["README.md", "CONTRIBUTING.md", "Makefile", "Snakefile", "config/README.md",
         *(p for glob in ("src/**/*.py", "config/**/*.yaml", "docs/*.md", "rules/*.smk", "workflow/**/*.yaml")
           for p in sorted(str(x.relative_to(REPO)) for x in REPO.glob(glob)))]


def printed_profiles() -> list[tuple[str, str]]:
    found = []
    for rel in WHERE:
        path = REPO / rel
        if path.is_file():
            found += [(rel, m.group(1)) for m in PRINTED.finditer(path.read_text(encoding="utf-8"))]
    return found


def test_the_scan_sees_the_commands_we_print():
    from llmrnn.check import SMOKE_COMMAND

    found = printed_profiles()
    assert ("src/llmrnn/check/__init__.py", "profiles/slurm") in found, SMOKE_COMMAND
    assert ("config/smoke.yaml", "profiles/slurm") in found
    assert any(rel == "docs/cluster.md" for rel, _ in found)


@pytest.mark.parametrize("profile", sorted({p for _, p in printed_profiles()}))
def test_every_printed_profile_is_found_by_snakemake_on_a_fresh_account(profile, tmp_path, monkeypatch):
    from snakemake.cli import get_profile_dir

    monkeypatch.setenv("HOME", str(tmp_path))  # no ~/.config/snakemake, no site profile
    monkeypatch.setenv("XDG_CONFIG_HOME", str(tmp_path / ".config"))
    monkeypatch.setenv("XDG_CONFIG_DIRS", str(tmp_path / "etc"))
    monkeypatch.chdir(REPO)
    where = [rel for rel, p in printed_profiles() if p == profile]
    found = get_profile_dir(profile)
    assert found is not None, f"--profile {profile} (printed in {where}) is not found on a fresh account"
    assert found[0].resolve().is_relative_to(REPO / "profiles"), found
