"""HTML tables for the Snakemake report: it shows an HTML result inline (a TSV only as a download), and its
landing page (workflow/report/workflow.rst) takes such a file in whole. The style is scoped to the tables'
own class, so a page taken into the landing page restyles nothing else of the report."""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from html import escape

CLASS = "llmrnn"
STYLE = (f"table.{CLASS}{{border-collapse:collapse;font-family:sans-serif;font-size:90%;margin:0.5em 0}}"
         f"table.{CLASS} td,table.{CLASS} th{{border:1px solid #ccc;padding:2px 8px;vertical-align:top}}"
         f"table.{CLASS}.numbers td:not(:first-child){{text-align:right}}"
         f"table.{CLASS}.total tr:last-child{{font-weight:bold}}")


def table(head: Sequence[object], rows: Iterable[Sequence[object]], *, numbers: bool = False,
          total: bool = False) -> str:
    """A table of escaped cells; `numbers`: every column but the first right-aligned; `total`: the last row
    bold. Rows and cells carry no attributes (<tr>, <td>), so a reader can take the cells back out."""
    def row(cells: Sequence[object], tag: str = "td") -> str:
        return "<tr>" + "".join(f"<{tag}>{escape(str(c))}</{tag}>" for c in cells) + "</tr>\n"

    kinds = " ".join([CLASS, *(["numbers"] if numbers else []), *(["total"] if total else [])])
    return f'<table class="{kinds}">\n' + row(head, "th") + "".join(row(r) for r in rows) + "</table>\n"


def page(title: str, body: str) -> str:
    """A whole HTML page around `body` (HTML): a report result opens in a frame of its own. Its html, head
    and body tags are left out, as HTML allows, so the landing page can take it in as it stands."""
    return f'<!DOCTYPE html>\n<meta charset="utf-8">\n<title>{escape(title)}</title>\n<style>{STYLE}</style>\n{body}'


def tsv_page(title: str, tsv: str) -> str:
    """A TSV text (its first line the header) as a standalone page with one table."""
    lines = [line.split("\t") for line in tsv.splitlines() if line]
    if not lines:
        return page(title, "<p>(empty table)</p>\n")
    return page(title, table(lines[0], lines[1:], numbers=True))
