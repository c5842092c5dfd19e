"""The report as one self-contained HTML page (report.html beside report.md): the same document
(bench/report/document.py) rendered with a jinja2 template, every plot embedded as a base64 PNG, no script, no
stylesheet or font from the network, so it opens from an archive on a machine with no connection.

Markdown in the text (**bold**, *italic*, `code`) is rendered; everything else is escaped. No jax, no engine.
"""

from __future__ import annotations

import base64
import re
from pathlib import Path
from typing import Any

from markupsafe import Markup, escape

from bench.report.document import Bullets, Plot, Section
from bench.report.views import Table



def inline(text: str) -> Markup:
    """Escaped `text` with markdown's **bold**, *italic* and `code` as HTML."""
    html = str(escape(text))
    html = re.sub(r"\*\*(.+?)\*\*", r"<strong>\1</strong>", html)
    html = re.sub(r"(?<![\w*])\*(?!\s)(.+?)(?<!\s)\*(?![\w*])", r"<em>\1</em>", html)
    html = re.sub(r"`(.+?)`", r"<code>\1</code>", html)
    return Markup(html)


def _kind(block: Any) -> str:
    for cls, name in ((Section, "section"), (Table, "table"), (Bullets, "bullets"), (Plot, "plot")):
        if isinstance(block, cls):
            return name
    return "para"


def _png(out_dir: Path, plot: Plot) -> str:
    return base64.b64encode((out_dir / plot.file).read_bytes()).decode("ascii")


def render_page(title: str, intro: list[str], sections: list[Section], out_dir: Path) -> str:
    """The HTML text of the report: a contents list, then every section; plots read from `out_dir` and embedded.
    Raises OSError when a plot file cannot be read."""
    from jinja2 import Environment, StrictUndefined

    env = Environment(autoescape=True, undefined=StrictUndefined, trim_blocks=True, lstrip_blocks=True)
    env.filters["md"] = inline
    env.globals.update(kind=_kind, png=lambda plot: _png(out_dir, plot))
    template = env.from_string(TEMPLATE)
    return template.render(title=title, intro=intro, sections=sections)


TEMPLATE = """<!DOCTYPE html>
<html lang="en">
<head>
<meta charset="utf-8">
<title>{{ title }}</title>
<style>
  body { font-family: -apple-system, "Segoe UI", Helvetica, Arial, sans-serif; margin: 1.5rem auto; max-width: 1300px;
         padding: 0 1rem; color: #1d1d1f; line-height: 1.45; }
  h1 { font-size: 1.6rem; } h2 { font-size: 1.3rem; border-bottom: 2px solid #ddd; padding-bottom: .2rem; margin-top: 2.2rem; }
  h3 { font-size: 1.1rem; margin-top: 1.6rem; }
  nav { background: #f5f5f7; padding: .5rem 1rem; border-radius: 6px; font-size: .9rem; }
  nav ul { margin: .2rem 0; padding-left: 1.2rem; }
  .scroll { overflow-x: auto; margin: .5rem 0 1rem; }
  table { border-collapse: collapse; font-size: .85rem; }
  caption { text-align: left; font-weight: 600; padding: .3rem 0; }
  th, td { border: 1px solid #d0d0d5; padding: .25rem .55rem; text-align: right; vertical-align: top; }
  th { background: #eef0f4; position: sticky; top: 0; }
  td:first-child, th:first-child { text-align: left; }
  tr:nth-child(even) td { background: #fafafc; }
  table.environment td, table.roofline td, table.runs td, table.groups td { text-align: left; max-width: 28rem; }
  table.environment th, table.roofline th, table.runs th, table.groups th, table.profile th { text-align: left; }
  ul.notes { font-size: .85rem; color: #444; margin-top: .2rem; }
  img { max-width: min(100%, 950px); border: 1px solid #eee; margin: .5rem 0; }
  p, li { max-width: 75rem; }
</style>
</head>
<body>
<h1>{{ title }}</h1>
{% for para in intro %}<p>{{ para | md }}</p>
{% endfor %}
<nav><strong>Contents</strong><ul>
{% for s in sections %}<li><a href="#{{ s.anchor }}">{{ s.title }}</a></li>
{% endfor %}</ul></nav>
{% macro block(b) %}
{% set k = kind(b) %}
{% if k == "section" %}{{ section(b) }}
{% elif k == "table" %}
<div class="scroll"><table class="{{ b.kind }}">
{% if b.title %}<caption>{{ b.title | md }}</caption>{% endif %}
<thead><tr>{% for h in b.header %}<th>{{ h }}</th>{% endfor %}</tr></thead>
<tbody>
{% for row in b.rows %}<tr>{% for c in row %}<td>{{ "—" if c is none else c }}</td>{% endfor %}</tr>
{% endfor %}</tbody></table></div>
{% if b.notes %}<ul class="notes">{% for n in b.notes %}<li>{{ n | md }}</li>{% endfor %}</ul>{% endif %}
{% elif k == "bullets" %}<ul>{% for x in b.items %}<li>{{ x | md }}</li>{% endfor %}</ul>
{% elif k == "plot" %}<figure><img alt="{{ b.alt }}" src="data:image/png;base64,{{ png(b) }}"><figcaption>{{ b.alt }}</figcaption></figure>
{% else %}<p>{{ b | md }}</p>
{% endif %}
{% endmacro %}
{% macro section(s) %}
<section id="{{ s.anchor }}">
<h{{ s.level }}>{{ s.title }}</h{{ s.level }}>
{% for b in s.blocks %}{{ block(b) }}{% endfor %}
</section>
{% endmacro %}
{% for s in sections %}{{ section(s) }}{% endfor %}
</body>
</html>
"""
"""The page's jinja2 template (kept in this module, so an installed package needs no data files)."""
