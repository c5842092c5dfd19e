"""The documentation agrees with the code it documents (no MkDocs needed: `make docs` builds the site strictly).

- The README's two set-up commands are `make sweep` and `make test`, and `.ci/run` runs the README's test command
  first (issue 42: the README's test command and CI stay one and the same).
- Every `bench` command has its page under docs/commands/, listed in mkdocs.yml's nav, and the README's command
  table links it.
- Every section of docs/method.md that the code cites by name (`docs/method.md, "Rooflines"`) is a heading there,
  and nothing cites the method's old file outside the repository (the shared folder's measurement page), which a
  clone cannot open.
- Every page in docs/ is in the nav (a page left out would build but be unreachable).
"""

from __future__ import annotations

import re
from pathlib import Path

import pytest
import yaml

ROOT = Path(__file__).resolve().parent.parent
CODE_DIRS = ("bench", "model", "scripts", "tests")
OLD_METHOD = re.compile(r"(?:shared/|(?<![\w/]))" + "measurement" + r"\.md")
"""The method's old file, cited as `../shared/<it>` or by its bare name (spelled in two parts so that this file does
not cite it)."""
OLD_CITATIONS_LEFT: set[str] = set()
"""Files that still cite the old file because another change edits them in the same session (issue 42's part 3 and
the profile work): their citations become docs/method.md when that change lands; then this set is emptied."""


def _readme() -> str:
    return (ROOT / "README.md").read_text(encoding="utf-8")


def _nav_pages() -> list[str]:
    """Every page path in mkdocs.yml's nav, in order (nested sections flattened)."""
    nav = yaml.safe_load((ROOT / "mkdocs.yml").read_text(encoding="utf-8"))["nav"]
    pages: list[str] = []

    def walk(items):
        for item in items:
            for value in item.values() if isinstance(item, dict) else [item]:
                walk(value) if isinstance(value, list) else pages.append(value)

    walk(nav)
    return pages


def _bench_commands() -> list[str]:
    from bench.cli import _register, app

    _register([])  # every command module, as `bench --help` sees them (hidden ones, such as `bench ab-worker`,
    # which `bench ab` starts, are not a user's commands)
    return sorted([c.name or c.callback.__name__ for c in app.registered_commands if not c.hidden] +
                  [g.name for g in app.registered_groups])  # fmt: skip


def test_readme_setup_commands_and_ci_run_the_same_test_command():
    readme = _readme()
    setup = readme[readme.index("## Set-up: two commands"):readme.index("## Quick start")]
    block = re.search(r"```sh\n(.*?)```", setup, re.S).group(1)
    commands = [line.split("#")[0].strip() for line in block.splitlines() if line.strip()]
    assert commands == ["make sweep", "make test"]
    ci = [line.strip() for line in (ROOT / ".ci/run").read_text().splitlines()
          if line.strip() and not line.lstrip().startswith("#")]  # fmt: skip
    assert [line for line in ci if line.startswith("make ")] == ["make test"]  # CI is the README's test command
    test_target = re.search(r"^test:(.*)$", (ROOT / "Makefile").read_text(), re.M)
    assert test_target and "docs" in test_target.group(1).split(), "make test must build the docs strictly"


def test_readme_is_short():
    assert len(_readme().splitlines()) <= 300


def test_every_command_has_a_page_in_the_nav_and_the_readme():
    pages, readme = _nav_pages(), _readme()
    for name in _bench_commands():
        page = f"commands/{name}.md"
        assert (ROOT / "docs" / page).is_file(), f"no docs/{page} for `bench {name}`"
        assert page in pages, f"docs/{page} is not in mkdocs.yml's nav"
        assert f"](docs/{page})" in readme, f"the README's command table does not link docs/{page}"


def test_every_docs_page_is_in_the_nav():
    on_disk = sorted(str(p.relative_to(ROOT / "docs")) for p in (ROOT / "docs").rglob("*.md"))
    assert sorted(_nav_pages()) == on_disk


def _code_files():
    for d in CODE_DIRS:
        yield from (p for p in (ROOT / d).rglob("*") if p.suffix in (".py", ".sh") and p.is_file())
    yield ROOT / "Makefile"


def test_code_cites_method_sections_that_exist():
    headings = set(re.findall(r"^###? (.+)$", (ROOT / "docs/method.md").read_text(encoding="utf-8"), re.M))  # and subsections
    cited: dict[str, list[str]] = {}
    for path in _code_files():
        if path.resolve() == Path(__file__).resolve():
            continue  # this file spells the patterns, not citations
        text = path.read_text(encoding="utf-8", errors="replace")
        rel = str(path.relative_to(ROOT))
        if rel not in OLD_CITATIONS_LEFT:
            assert not OLD_METHOD.search(text), f"{rel} cites the method's old file: cite docs/method.md, \"SECTION\""
        for section in re.findall(r'docs/method\.md[`,]?\s*\(?"([^"\n]+)"', text.replace('\\"', '"')):
            cited.setdefault(section, []).append(str(path.relative_to(ROOT)))
    assert cited, "no citation of docs/method.md found: the pattern no longer matches the code's form"
    missing = {s: files for s, files in cited.items() if s not in headings}
    assert not missing, f"cited sections that docs/method.md does not have: {missing}"


@pytest.mark.parametrize("path", ["README.md", "CHANGELOG.md", "reports/README.md"])
def test_relative_links_resolve(path):
    """Links from the README, the changelog and the reports index to files of the repository exist."""
    text = (ROOT / path).read_text(encoding="utf-8")
    base = (ROOT / path).parent
    for target in re.findall(r"\]\(([^)#\s]+)(?:#[^)]*)?\)", text):
        if "://" in target:
            continue
        assert (base / target).exists(), f"{path} links {target}, which does not exist"
