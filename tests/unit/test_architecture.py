"""The house rules of imports, over every import in ``app/`` and ``workers/`` (module-level or
inside a function, absolute or relative), read from the source without importing it:

* no circle between modules;
* ``app.services`` never imports ``app.api`` (services raise the one error family, the API renders it);
* ``app.core`` imports no other package of ``app`` (and nothing of ``workers``);
* nothing in ``app`` imports ``workers`` (the app sends tasks by name).
"""

from __future__ import annotations

import ast
import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
PACKAGES = ("app", "workers")

Graph = dict[str, set[str]]


def _module_files() -> dict[str, Path]:
    """Dotted module name -> source file of every module under the packages (``pkg`` for ``pkg/__init__.py``)."""
    found: dict[str, Path] = {}
    for package in PACKAGES:
        for path in sorted((ROOT / package).rglob("*.py")):
            parts = list(path.relative_to(ROOT).with_suffix("").parts)
            if parts[-1] == "__init__":
                parts.pop()
            found[".".join(parts)] = path
    return found


def _known(name: str, modules: dict[str, Path]) -> str | None:
    """The longest prefix of ``name`` that is one of our modules (None: a third-party import)."""
    while name and name not in modules:
        name = name.rpartition(".")[0]
    return name or None


def _imported_names(module: str, path: Path, node: ast.AST) -> list[str]:
    """Dotted names an import node refers to: ``from a import b`` names ``a.b``, which resolves to
    module ``a.b`` when there is one and to ``a`` otherwise (see :func:`_known`)."""
    if isinstance(node, ast.Import):
        return [alias.name for alias in node.names]
    if not isinstance(node, ast.ImportFrom):
        return []
    base = node.module or ""
    if node.level:
        package = module if path.name == "__init__.py" else module.rpartition(".")[0]
        anchor = package.split(".")[: len(package.split(".")) - node.level + 1]
        base = ".".join(anchor + ([base] if base else []))
    return [f"{base}.{alias.name}" for alias in node.names]


def import_graph() -> Graph:
    """Module -> the modules of ours it imports anywhere in its source."""
    modules = _module_files()
    graph: Graph = {m: set() for m in modules}
    for module, path in modules.items():
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"), str(path))):
            for name in _imported_names(module, path, node):
                target = _known(name, modules)
                if target is not None and target != module:
                    graph[module].add(target)
    return graph


def circles(graph: Graph) -> list[list[str]]:
    """Strongly connected components with more than one module (Kosaraju, iterative)."""
    order: list[str] = []
    seen: set[str] = set()
    for start in graph:
        if start in seen:
            continue
        seen.add(start)
        stack = [(start, iter(sorted(graph[start])))]
        while stack:
            node, targets = stack[-1]
            nxt = next((t for t in targets if t not in seen), None)
            if nxt is None:
                order.append(node)
                stack.pop()
            else:
                seen.add(nxt)
                stack.append((nxt, iter(sorted(graph[nxt]))))
    reverse: Graph = {m: set() for m in graph}
    for a, targets in graph.items():
        for b in targets:
            reverse[b].add(a)
    assigned: set[str] = set()
    components = []
    for root in reversed(order):
        if root in assigned:
            continue
        component, todo = [], [root]
        assigned.add(root)
        while todo:
            node = todo.pop()
            component.append(node)
            for prev in reverse[node] - assigned:
                assigned.add(prev)
                todo.append(prev)
        if len(component) > 1:
            components.append(sorted(component))
    return components


def arrows(graph: Graph, source: str, target: str) -> list[str]:
    """Every import from a module in package ``source`` into a module in package ``target``."""
    def inside(module: str, package: str) -> bool:
        return module == package or module.startswith(package + ".")

    return sorted(f"{a} -> {b}" for a, targets in graph.items() for b in targets
                  if inside(a, source) and inside(b, target))


@pytest.fixture(scope="module")
def graph() -> Graph:
    found = import_graph()
    assert "app.services.training.runner" in found and "workers.tasks" in found  # the walk sees the tree
    return found


def test_the_checker_sees_function_local_relative_and_from_imports(tmp_path) -> None:
    source = "def f():\n    from . import b\n    from .b import g\n    import app.api.errors\n"
    tree = ast.parse(source)
    names = [n for node in ast.walk(tree) for n in _imported_names("app.services.a", Path("a.py"), node)]
    assert {"app.services.b", "app.services.b.g", "app.api.errors"} <= set(names)
    assert circles({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == [["a", "b", "c"]]
    assert circles({"a": {"b"}, "b": set()}) == []


def test_no_import_circles(graph: Graph) -> None:
    assert circles(graph) == []


def test_services_never_import_the_api(graph: Graph) -> None:
    assert arrows(graph, "app.services", "app.api") == []


def test_core_imports_no_other_package_of_app_nor_workers(graph: Graph) -> None:
    outside = [a for pkg in set(m.split(".")[1] for m in graph if m.startswith("app.") and not m.startswith("app.core"))
               for a in arrows(graph, "app.core", f"app.{pkg}")]
    assert outside == []
    assert arrows(graph, "app.core", "workers") == []


def test_app_never_imports_workers(graph: Graph) -> None:
    assert arrows(graph, "app", "workers") == []


# the composition roots read the process settings once and pass them on; everything else is given them
SETTINGS_READERS = {"app.config", "app.main", "app.cli", "workers.celery_app", "workers.tasks"}


def test_settings_are_injected_never_looked_up() -> None:
    readers = sorted(name for name, path in _module_files().items()
                     if name not in SETTINGS_READERS and "get_settings()" in path.read_text())
    assert readers == [], f"settings looked up instead of passed in: {readers}"


# ----------------------------------------------------------------------------- storage in the stores
# Use cases validate, decide and call a store (app.db.stores): a module of app/services/ imports
# nothing from SQLAlchemy but the Session type, holds no SQL text and never branches on the
# database's dialect.
SESSION_ONLY = ("sqlalchemy.orm", "Session")
SQL_STATEMENT = re.compile(r"\bSELECT\b.*\bFROM\b|\bINSERT\s+INTO\b|\bUPDATE\s+\w+\s+SET\b|\bDELETE\s+FROM\b"
                           r"|\bCOPY\s+\w+|\bON\s+CONFLICT\b|\bCREATE\s+(TEMP\s+)?TABLE\b", re.DOTALL)
DIALECT_NAMES = {"postgresql", "sqlite", "postgres"}
QUERY_RUNNERS = {"execute", "scalar", "scalars", "query", "get_bind", "connection"}  # a Session's, run by a store
# converted by the training/ledger stores
NOT_YET_CONVERTED: set[str] = set()


def _docstrings(tree: ast.AST) -> set[int]:
    """ids of the string constants that are docstrings (they may describe statements)."""
    found = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Module | ast.ClassDef | ast.FunctionDef | ast.AsyncFunctionDef) and node.body:
            first = node.body[0]
            if isinstance(first, ast.Expr) and isinstance(first.value, ast.Constant) and isinstance(first.value.value, str):
                found.add(id(first.value))
    return found


def storage_in(source: str) -> list[str]:
    """What in ``source`` belongs in a store: SQLAlchemy imports beyond ``Session``, SQL text, a
    dialect branch (``is_postgres``, a ``dialect`` attribute, a dialect's name), a query run on
    the session (``.execute``, ``.scalar``, ...)."""
    tree = ast.parse(source)
    docstrings = _docstrings(tree)
    found: list[str] = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            found += [f"import {a.name}" for a in node.names if a.name.split(".")[0] == "sqlalchemy"]
        elif isinstance(node, ast.ImportFrom) and (node.module or "").split(".")[0] == "sqlalchemy":
            found += [f"from {node.module} import {a.name}" for a in node.names if (node.module, a.name) != SESSION_ONLY]
        elif isinstance(node, ast.Constant) and isinstance(node.value, str) and id(node) not in docstrings:
            if SQL_STATEMENT.search(node.value):
                found.append(f"SQL text {node.value[:40]!r}")
            elif node.value in DIALECT_NAMES:
                found.append(f"dialect name {node.value!r}")
        elif isinstance(node, ast.Name | ast.Attribute):
            name = node.id if isinstance(node, ast.Name) else node.attr
            if name in {"is_postgres", "dialect", "text"}:
                found.append(f"dialect branch or SQL text: {name}")
            elif isinstance(node, ast.Attribute) and name in QUERY_RUNNERS:
                found.append(f"a query run here: .{name}")
    return found


def test_the_storage_check_sees_sql_imports_and_dialect_branches() -> None:
    source = ('"""SELECT x FROM docs is fine here."""\n'
              "from sqlalchemy.orm import Session\nfrom sqlalchemy import select\nimport sqlalchemy\n"
              "Q = 'SELECT id FROM users'\nW = 'INSERT INTO t VALUES (1)'\n"
              "def f(s: Session):\n    if is_postgres(s) or s.get_bind().dialect.name == 'sqlite':\n"
              "        return text('x')\n    return s.execute(Q)\n")
    assert sorted(storage_in(source)) == sorted([
        "from sqlalchemy import select", "import sqlalchemy", "SQL text 'SELECT id FROM users'",
        "SQL text 'INSERT INTO t VALUES (1)'", "dialect branch or SQL text: is_postgres",
        "dialect name 'sqlite'", "dialect branch or SQL text: dialect", "dialect branch or SQL text: text",
        "a query run here: .get_bind", "a query run here: .execute"])
    assert storage_in("'''UPDATE x SET y, described'''\nfrom sqlalchemy.orm import Session\n") == []


def test_services_hold_no_storage() -> None:
    offenders = {name: found for name, path in _module_files().items()
                 if name.startswith("app.services") and name not in NOT_YET_CONVERTED
                 and (found := storage_in(path.read_text(encoding="utf-8")))}
    assert offenders == {}
    still = sorted(name for name in NOT_YET_CONVERTED if not storage_in(_module_files()[name].read_text(encoding="utf-8")))
    assert still == [], f"converted: remove from NOT_YET_CONVERTED: {still}"


def _algorithm_name_switches(tree: ast.AST, names: set[str]) -> list[int]:
    """Lines that branch on an algorithm's name: a comparison (``==``, ``!=``, ``in``, ``not in``)
    with a name as a string literal or inside a literal container, a ``match`` case on one, or a
    table keyed by names (a dict literal with a name as a key)."""

    def is_name(node: ast.AST) -> bool:
        if isinstance(node, ast.Constant):
            return node.value in names
        if isinstance(node, (ast.Tuple, ast.List, ast.Set)):
            return any(is_name(e) for e in node.elts)
        return False

    def switches(node: ast.AST) -> bool:
        if isinstance(node, ast.Compare):
            return any(is_name(n) for n in (node.left, *node.comparators))
        if isinstance(node, ast.MatchValue):
            return is_name(node.value)
        if isinstance(node, ast.Dict):
            return any(k is not None and is_name(k) for k in node.keys)
        return False

    lines = [node.lineno for node in ast.walk(tree) if switches(node)]
    return sorted(lines)


def test_the_name_switch_checker_sees_comparisons_matches_and_tables() -> None:
    source = ('if a.name == "dpfw": pass\nif x in ("onebit", "y"): pass\n'
              'match n:\n    case "dpals": pass\nT = {"dpcmf": 2}\nok = {"algorithm": "onebit"}\n')
    assert _algorithm_name_switches(ast.parse(source), {"dpals", "dpfw", "dpcmf", "onebit"}) == [1, 2, 4, 5]


def test_only_the_algorithms_module_branches_on_an_algorithm_name() -> None:
    """Everything an algorithm knows lives in its ``Algorithm`` (app.core.algorithms): services
    read its declarations (data kind, minimum catalogue, defaults, ...) and never its name."""
    from app.core.algorithms import ALGORITHMS

    names = set(ALGORITHMS)
    found = [f"{path.relative_to(ROOT)}:{line}"
             for module, path in _module_files().items() if not module.startswith("app.core.algorithms")
             for line in _algorithm_name_switches(ast.parse(path.read_text()), names)]
    assert found == [], f"branches on an algorithm's name outside app.core.algorithms: {found}"
