"""The report as a document: sections of paragraphs, bullet lists, tables (bench/report/views.py `Table`) and
plots, rendered once as markdown (`to_markdown`, report.md) and once as HTML (bench/report/page.py), so the two
always hold the same tables, plots and findings. No jax, no engine.
"""

from __future__ import annotations

import dataclasses
from typing import Any

from bench.report.tables import md_table
from bench.report.views import Table


@dataclasses.dataclass(frozen=True, kw_only=True)
class Plot:
    """A PNG of the report folder: `file` (its name there) and `alt` (what it shows)."""

    file: str
    alt: str


@dataclasses.dataclass(frozen=True, kw_only=True)
class Bullets:
    """A bullet list (markdown text)."""

    items: list[str]


@dataclasses.dataclass(frozen=True, kw_only=True)
class Section:
    """A heading (`level` 2 or 3, `anchor` an id for the HTML page) and its blocks: str (a paragraph),
    `Bullets`, `Table`, `Plot`, or a `Section` (a sub-section)."""

    title: str
    level: int = 2
    anchor: str = ""
    blocks: list[Any] = dataclasses.field(default_factory=list)


def table_markdown(table: Table) -> list[str]:
    """A `Table` as markdown lines: its title in bold (when it has one), the table, its notes as bullets."""
    lines = [f"**{table.title}**", ""] if table.title else []
    lines.append(md_table(table.header, table.rows))
    if table.notes:
        lines += [""] + [f"- {n}" for n in table.notes]
    return lines


def to_markdown(title: str, intro: list[str], sections: list[Section]) -> str:
    """The whole document as markdown text (a trailing newline)."""
    md = [f"# {title}", ""]
    for para in intro:
        md += [para, ""]
    for s in sections:
        md += _section_markdown(s)
    return "\n".join(md).rstrip("\n") + "\n"


def _section_markdown(s: Section) -> list[str]:
    md = ["#" * s.level + " " + s.title, ""]
    for block in s.blocks:
        if isinstance(block, Section):
            md += _section_markdown(block)
            continue
        if isinstance(block, Table):
            md += table_markdown(block)
        elif isinstance(block, Bullets):
            md += [f"- {x}" for x in block.items]
        elif isinstance(block, Plot):
            md.append(f"![{block.alt}]({block.file})")
        else:
            md.append(str(block))
        md.append("")
    return md
