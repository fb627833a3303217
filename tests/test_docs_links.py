"""Docs a newcomer can follow: every relative link and #anchor of the project's markdown resolves (GitHub's
heading slugs), every section a message or a doc names by title exists, and README.md stays a short front
page that reaches every page of docs/ directly."""

from __future__ import annotations

import re
from pathlib import Path

from tests.conftest import REPO

README_MAX_LINES = 200
FENCE = re.compile(r"^\s*(```|~~~)")
LINK = re.compile(r"!?\[(?:[^\]\\]|\\.)*\]\(\s*<?([^)\s>]+)>?(?:\s+\"[^\"]*\")?\s*\)")
HEADING = re.compile(r"^ {0,3}(#{1,6})\s+(.*?)\s*#*\s*$")
# `docs/cluster.md "Smoke test first"`, `README 'Running on SLURM'`, `config/README.md, 'How configs combine'`
SECTION_REF = re.compile(r"((?:config/)?README(?:\.md)?|CONTRIBUTING\.md|docs/[\w-]+\.md)(?:,\s*|\s+)[\"']([^\"'\n]{3,80})[\"']")


def markdown_files() -> list[Path]:
    return [REPO / "README.md", REPO / "CONTRIBUTING.md", REPO / "config" / "README.md",
            *sorted((REPO / "docs").glob("*.md"))]


def prose_lines(text: str) -> list[tuple[int, str]]:
    """(line number, line) outside fenced code blocks, inline code spans blanked."""
    out, fenced = [], False
    for n, line in enumerate(text.splitlines(), 1):
        if FENCE.match(line):
            fenced = not fenced
            continue
        if not fenced:
            out.append((n, re.sub(r"`[^`]*`", lambda m: " " * len(m.group()), line)))
    return out


def slug(heading: str) -> str:
    """GitHub's anchor of a heading: its text (code spans, links and emphasis rendered), lower case, every
    character but letters, digits, spaces, `-` and `_` dropped, spaces to `-`."""
    text = re.sub(r"!?\[([^\]]*)\]\([^)]*\)", r"\1", heading)  # a link renders as its text
    text = re.sub(r"<[^>]+>", "", text).replace("`", "")
    text = re.sub(r"(\*\*|__|\*|~~)", "", text)
    return re.sub(r"[^\w\- ]", "", text.lower()).replace(" ", "-")


def headings(path: Path) -> list[str]:
    """The heading texts of a markdown file, outside code blocks (a `# comment` in a bash block is none)."""
    out, fenced = [], False
    for line in path.read_text().splitlines():
        if FENCE.match(line):
            fenced = not fenced
        elif not fenced and (m := HEADING.match(line)):
            out.append(m.group(2))
    return out


def anchors(path: Path) -> set[str]:
    """Every anchor GitHub gives the headings of a file (a repeated slug gets -1, -2, ...)."""
    seen: dict[str, int] = {}
    out = set()
    for text in headings(path):
        base = slug(text)
        n = seen.get(base, 0)
        out.add(base if n == 0 else f"{base}-{n}")
        seen[base] = n + 1
    return out


def broken_links(path: Path) -> list[str]:
    problems = []
    for n, line in prose_lines(path.read_text()):
        for target in LINK.findall(line):
            if re.match(r"^[a-z][a-z0-9+.-]*:", target, re.IGNORECASE):  # https:, mailto: ...: not checked here
                continue
            file_part, _, anchor = target.partition("#")
            dest = (path.parent / file_part).resolve() if file_part else path
            where = f"{path.relative_to(REPO)}:{n}: {target}"
            if not dest.exists():
                problems.append(f"{where}: no such file")
            elif anchor and (dest.suffix != ".md" or anchor not in anchors(dest)):
                problems.append(f"{where}: no heading with anchor #{anchor} in {dest.relative_to(REPO)}")
    return problems


# ----------------------------------------------------------------------------- the checker itself
def test_slugs_are_githubs():
    assert slug("The QA demo (`config/qa_demo.yaml`)") == "the-qa-demo-configqa_demoyaml"
    assert slug("Software environments: gpu-env, conda, containers") == "software-environments-gpu-env-conda-containers"
    assert slug("`qa` (recipe: qa)") == "qa-recipe-qa"
    assert slug("Watching a run (`train.report_to`)") == "watching-a-run-trainreport_to"
    assert slug("**Bold** and [a link](x.md)") == "bold-and-a-link"


def test_a_broken_link_or_anchor_is_found(tmp_path, monkeypatch):
    monkeypatch.setattr("tests.test_docs_links.REPO", tmp_path)
    (tmp_path / "docs").mkdir()
    (tmp_path / "docs" / "a.md").write_text("# A\n\n## Section two\n\n```bash\n# not a heading\n```\n")
    page = tmp_path / "README.md"
    page.write_text("[ok](docs/a.md) [ok](docs/a.md#section-two) [ok](#top) [web](https://x.org/#y)\n"
                    "[gone](docs/b.md) [bad](docs/a.md#not-a-heading) [bad](docs/a.md#section-2)\n"
                    "`[code](docs/none.md)`\n\n# Top\n")
    assert sorted(p.split(": ", 1)[1] for p in broken_links(page)) == [
        "docs/a.md#not-a-heading: no heading with anchor #not-a-heading in docs/a.md",
        "docs/a.md#section-2: no heading with anchor #section-2 in docs/a.md",
        "docs/b.md: no such file"]
    assert anchors(tmp_path / "docs" / "a.md") == {"a", "section-two"}


# ----------------------------------------------------------------------------- the project's docs
def test_every_link_and_anchor_resolves():
    files = markdown_files()
    assert len(files) >= 10, files  # README, CONTRIBUTING, config/README and the docs/ pages
    problems = [p for path in files for p in broken_links(path)]
    assert not problems, "broken links:\n" + "\n".join(problems)


def test_every_section_named_by_title_exists():
    """A message or doc that sends the reader to `docs/cluster.md "Smoke test first"` names a real heading."""
    sources = [*sorted((REPO / "src").rglob("*.py")), *sorted((REPO / "scripts").glob("*.py")),
               *sorted((REPO / "profiles").rglob("*.yaml")), *markdown_files()]
    problems, found = [], 0
    for source in sources:
        for n, line in enumerate(source.read_text().splitlines(), 1):
            for doc, title in SECTION_REF.findall(line):
                target = REPO / (doc if doc.endswith(".md") else f"{doc}.md")
                found += 1
                names = {re.sub(r"`", "", h).strip().lower() for h in headings(target)} if target.is_file() else set()
                if title.strip().lower() not in names:
                    problems.append(f"{source.relative_to(REPO)}:{n}: {doc} has no section {title!r}")
    assert found >= 3, "the reference pattern found nothing: is it still the form the code uses?"
    assert not problems, "\n".join(problems)


def test_the_readme_is_short_and_reaches_every_page():
    readme = REPO / "README.md"
    lines = readme.read_text().splitlines()
    assert len(lines) < README_MAX_LINES, f"README.md has {len(lines)} lines; move detail into a docs/ page"
    linked = {(REPO / target.partition("#")[0]).resolve()
              for _, line in prose_lines(readme.read_text()) for target in LINK.findall(line)}
    pages = sorted((REPO / "docs").glob("*.md"))
    assert len(pages) >= 8, pages
    missing = [p.relative_to(REPO).as_posix() for p in pages if p.resolve() not in linked]
    assert not missing, f"README.md does not link these docs/ pages: {missing}"


def test_the_readme_lists_two_commands_and_is_honest_about_the_gpu():
    """'The two commands' lists two; the opening lines and the status table agree that no GPU ran the GPU route."""
    text = (REPO / "README.md").read_text()
    section = text.split("## The two commands", 1)[1].split("\n## ", 1)[0]
    block = section.split("```bash", 1)[1].split("```", 1)[0]
    assert [line.split("#")[0].strip() for line in block.strip().splitlines()] == ["make demo", "make test"]
    opening = text.split("```", 1)[0]
    assert "not yet run on a GPU" in opening
    assert "## What has run where" in text.split("## The two commands", 1)[0]  # near the top
