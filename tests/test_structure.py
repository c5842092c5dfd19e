"""The code's shape, read from the source (no imports, no jax): no import cycle among the project's modules, and
no function over `MAX_FUNCTION_LINES` lines in `model/` and `bench/` (issue 42, part 2).

Import graph: one edge per `import` / `from ... import` statement ANYWHERE in a module, at module level or inside a
function or method. A function-level import still makes the importer need the imported module (it runs the first
time the function does), and moving an import into a function is the usual way a cycle gets hidden rather than
removed: both count. Not counted: imports under `if TYPE_CHECKING:` (they never run; the same rule as the import
contracts in pyproject.toml), dynamic imports (`importlib.import_module`, e.g. `model.__getattr__`), and the
parent packages Python initialises before a submodule (a package's `__init__` naming its children would otherwise
always close a circle). `from pkg import name` is an edge to the module `pkg.name` when there is one, else to `pkg`.
A cycle is a strongly connected component of more than one module (or a module importing itself).
"""

from __future__ import annotations

import ast
from collections.abc import Iterator
from pathlib import Path

from runfolders import REPO

PACKAGES = ("model", "bench")
MAX_FUNCTION_LINES = 60
"""end_lineno - lineno + 1 of a `def` (its signature and docstring included, its decorators not)."""

# Functions over the bound, tolerated: none (the last, bench/report/compare.py's compare_runs, was split). A function
# may join only while another branch is splitting it, and leaves at its merge. "path: qualified name".
ALLOWED_LONG_FUNCTIONS: frozenset[str] = frozenset()

# Import cycles tolerated inside a package: none (the last, bench.cli, ended when its app moved to bench/cli/root.py).
# A package may join only while another branch is breaking its cycle; the test fails when an entry holds none.
ALLOWED_CYCLE_PACKAGES: tuple[str, ...] = ()


# ---- the import graph --------------------------------------------------------------------------------------------
def _module_files() -> dict[str, Path]:
    """Dotted module name -> file, for every .py of the project's packages (a package is its __init__.py)."""
    modules = {}
    for package in PACKAGES:
        for path in sorted((REPO / package).rglob("*.py")):
            parts = path.relative_to(REPO).with_suffix("").parts
            modules[".".join(parts[:-1] if parts[-1] == "__init__" else parts)] = path
    return modules


def _is_type_checking(test: ast.expr) -> bool:
    return (isinstance(test, ast.Name) and test.id == "TYPE_CHECKING") or (
        isinstance(test, ast.Attribute) and test.attr == "TYPE_CHECKING")  # fmt: skip


def _import_nodes(node: ast.AST) -> Iterator[ast.Import | ast.ImportFrom]:
    """Every import statement under `node`, at any depth, except the bodies of `if TYPE_CHECKING:`."""
    for child in ast.iter_child_nodes(node):
        if isinstance(child, (ast.Import, ast.ImportFrom)):
            yield child
        elif isinstance(child, ast.If) and _is_type_checking(child.test):
            for other in child.orelse:
                yield from _import_nodes(ast.Module(body=[other], type_ignores=[]))
        else:
            yield from _import_nodes(child)


def _targets(node: ast.Import | ast.ImportFrom, importer: str, is_package: bool, modules: set[str]) -> Iterator[str]:
    """The project modules one import statement of `importer` names."""
    if isinstance(node, ast.Import):
        for alias in node.names:
            name = alias.name
            while name and name not in modules:
                name = name.rpartition(".")[0]
            if name:
                yield name
        return
    base = node.module or ""
    if node.level:
        package = importer if is_package else importer.rpartition(".")[0]
        for _ in range(node.level - 1):
            package = package.rpartition(".")[0]
        base = f"{package}.{base}" if base else package
    for alias in node.names:
        if f"{base}.{alias.name}" in modules:
            yield f"{base}.{alias.name}"
        elif base in modules:
            yield base


def import_graph() -> dict[str, dict[str, list[int]]]:
    """importer -> {imported: [line numbers]} over the project's modules (see the module docstring)."""
    files = _module_files()
    names = set(files)
    graph: dict[str, dict[str, list[int]]] = {m: {} for m in files}
    for module, path in files.items():
        tree = ast.parse(path.read_text(), filename=str(path))
        for node in _import_nodes(tree):
            for target in _targets(node, module, path.name == "__init__.py", names):
                lines = graph[module].setdefault(target, [])
                if node.lineno not in lines:
                    lines.append(node.lineno)
    return graph


def cycles(graph: dict[str, dict[str, list[int]]]) -> list[list[str]]:
    """The strongly connected components of `graph` that hold a cycle, each sorted (Tarjan's algorithm, iterative)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found: list[list[str]] = []
    for root in sorted(graph):
        if root in index:
            continue
        work = [(root, iter(sorted(graph[root])))]
        index[root] = low[root] = len(index)
        stack.append(root)
        on_stack.add(root)
        while work:
            node, edges = work[-1]
            nxt = next(edges, None)
            if nxt is not None:
                if nxt not in index:
                    index[nxt] = low[nxt] = len(index)
                    stack.append(nxt)
                    on_stack.add(nxt)
                    work.append((nxt, iter(sorted(graph[nxt]))))
                elif nxt in on_stack:
                    low[node] = min(low[node], index[nxt])
                continue
            work.pop()
            if work:
                low[work[-1][0]] = min(low[work[-1][0]], low[node])
            if low[node] == index[node]:
                component = []
                while True:
                    member = stack.pop()
                    on_stack.discard(member)
                    component.append(member)
                    if member == node:
                        break
                if len(component) > 1 or node in graph[node]:
                    found.append(sorted(component))
    return found


def _inside(module: str, package: str) -> bool:
    return module == package or module.startswith(package + ".")


def _describe(component: list[str], graph: dict[str, dict[str, list[int]]]) -> str:
    edges = [f"  {a} -> {b} (line {', '.join(map(str, graph[a][b]))})" for a in component for b in sorted(graph[a])
             if b in component]  # fmt: skip
    return f"{len(component)} modules: {', '.join(component)}\n" + "\n".join(edges)


def test_no_import_cycle_among_the_projects_modules() -> None:
    graph = import_graph()
    found = [c for c in cycles(graph) if not any(all(_inside(m, p) for m in c) for p in ALLOWED_CYCLE_PACKAGES)]
    assert not found, ("import cycles (move the shared names to the module that owns them; a function-level "
                       "import counts too):\n" + "\n".join(_describe(c, graph) for c in found))  # fmt: skip


def test_the_allowed_cycle_packages_still_hold_a_cycle() -> None:
    found = cycles(import_graph())
    stale = [p for p in ALLOWED_CYCLE_PACKAGES if not any(all(_inside(m, p) for m in c) for c in found)]
    assert not stale, f"no import cycle inside {stale} any more: drop it from ALLOWED_CYCLE_PACKAGES"


def test_the_cycle_finder_sees_module_and_function_level_cycles(tmp_path: Path) -> None:
    graph = {"a": {"b": [1]}, "b": {"c": [3]}, "c": {"a": [9]}, "d": {"a": [1]}, "e": {"e": [2]}, "f": {}}
    assert cycles(graph) == [["a", "b", "c"], ["e"]]
    source = ("from typing import TYPE_CHECKING\nimport pkg.b\nif TYPE_CHECKING:\n    import pkg.c\nelse:\n"
              "    import pkg.d\ndef f():\n    from pkg import e, NAME\n    from . import b\n")  # fmt: skip
    modules = {"pkg", "pkg.a", "pkg.b", "pkg.c", "pkg.d", "pkg.e"}
    seen = [t for node in _import_nodes(ast.parse(source)) for t in _targets(node, "pkg.a", False, modules)]
    assert seen == ["pkg.b", "pkg.d", "pkg.e", "pkg", "pkg.b"]  # TYPE_CHECKING's body skipped, its else kept


def test_the_real_graph_holds_module_and_function_level_edges() -> None:
    graph = import_graph()
    assert "model.config" in graph["model.engine"]  # a module-level import
    assert "model.slots" in graph["model.engine"]  # a function-level one (Engine.slot_decoder)


# ---- function length ---------------------------------------------------------------------------------------------
def long_functions(root: Path = REPO, packages: tuple[str, ...] = PACKAGES,
                   limit: int = MAX_FUNCTION_LINES) -> dict[str, int]:  # fmt: skip
    """"path: qualified name" -> lines, for every function or method of `packages` (under `root`) over `limit`
    lines (nested functions by their own length, named outer.inner; methods Class.method)."""
    found: dict[str, int] = {}

    def visit(node: ast.AST, prefix: str, rel: str) -> None:
        for child in ast.iter_child_nodes(node):
            if isinstance(child, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
                name = f"{prefix}{child.name}"
                if not isinstance(child, ast.ClassDef) and child.end_lineno - child.lineno + 1 > limit:
                    found[f"{rel}: {name}"] = child.end_lineno - child.lineno + 1
                visit(child, f"{name}.", rel)
            else:
                visit(child, prefix, rel)

    for package in packages:
        for path in sorted((root / package).rglob("*.py")):
            visit(ast.parse(path.read_text(), filename=str(path)), "", path.relative_to(root).as_posix())
    return found


def test_no_function_over_sixty_lines() -> None:
    over = {k: v for k, v in long_functions().items() if k not in ALLOWED_LONG_FUNCTIONS}
    assert not over, (f"functions over {MAX_FUNCTION_LINES} lines (split them into named steps that read top to "
                      f"bottom): {over}")  # fmt: skip


def test_the_allow_list_names_only_functions_still_over_the_bound() -> None:
    stale = sorted(ALLOWED_LONG_FUNCTIONS - set(long_functions()))
    assert not stale, f"no longer over {MAX_FUNCTION_LINES} lines (or gone); drop from ALLOWED_LONG_FUNCTIONS: {stale}"


def test_the_length_check_counts_the_signature_and_nested_functions(tmp_path: Path) -> None:
    (tmp_path / "pkg").mkdir()
    body = "    x = 1\n" * 5
    method = "class C:\n    @staticmethod\n    def method(a,\n               b):\n" + body.replace("    ", "        ")
    source = "def short(a,\n          b):\n" + body + method  # 7 lines each, the signature's two included
    source += "def outer():\n" + body + "    def inner():\n" + "        y = 2\n" * 5  # 12 and 6 lines
    (tmp_path / "pkg" / "m.py").write_text(source)
    assert long_functions(tmp_path, ("pkg",), limit=6) == {"pkg/m.py: short": 7, "pkg/m.py: C.method": 7,
                                                            "pkg/m.py: outer": 12}  # fmt: skip
    assert long_functions(tmp_path, ("pkg",), limit=5)["pkg/m.py: outer.inner"] == 6
