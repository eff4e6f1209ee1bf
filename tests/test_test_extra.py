"""`pip install -e ".[test]"` is enough for the fast suite: every package a fast test module
imports is required by tracerag, its `test` extra or what those require.

An import inside ``try: … except ImportError`` (an optional extra the test skips without) does
not count; neither do the standard library, tracerag and the tests' own modules.
"""

from __future__ import annotations

import ast
import re
import sys
from importlib import metadata

import tomllib
from packaging.requirements import Requirement
from packaging.utils import canonicalize_name
from pipeline_fixtures import REPO

TESTS = REPO / "tests"
INTEGRATION_MODULE = re.compile(r"^pytestmark = pytest\.mark\.integration$", re.MULTILINE)
#: imported by shared fixtures only after a guarded import said it is there (the PostgreSQL
#: store tests are integration tests and skip, naming the package, without it)
OPTIONAL = {"psycopg"}


def _optional(node: ast.AST, parents: dict[ast.AST, ast.AST]) -> bool:
    """Whether ``node`` sits in a ``try`` that handles ImportError."""
    while node in parents:
        node = parents[node]
        if isinstance(node, ast.Try):
            for handler in node.handlers:
                names = ast.unparse(handler.type) if handler.type else "BaseException"
                if "ImportError" in names or "ModuleNotFoundError" in names:
                    return True
    return False


def imported_top_levels() -> dict[str, str]:
    """Top-level module → a fast test file importing it unconditionally."""
    own = {p.stem for p in TESTS.rglob("*.py")} | {"tracerag", "tests"}
    found: dict[str, str] = {}
    for path in sorted(TESTS.rglob("*.py")):
        text = path.read_text("utf-8")
        if INTEGRATION_MODULE.search(text):
            continue
        tree = ast.parse(text)
        parents = {child: node for node in ast.walk(tree) for child in ast.iter_child_nodes(node)}
        for node in ast.walk(tree):
            if isinstance(node, ast.Import):
                names = [alias.name for alias in node.names]
            elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
                names = [node.module]
            else:
                continue
            if _optional(node, parents):
                continue
            for name in names:
                top = name.split(".")[0]
                if top not in sys.stdlib_module_names and top not in own | OPTIONAL:
                    found.setdefault(top, str(path.relative_to(REPO)))
    return found


def required_closure() -> set[str]:
    """Distributions tracerag and its `test` extra require, transitively (names canonical)."""
    project = tomllib.loads((REPO / "pyproject.toml").read_text("utf-8"))["project"]
    extras = project["optional-dependencies"]
    pending = [Requirement(r) for r in [*project["dependencies"], *extras["test"]]]
    seen: set[str] = set()
    expanded: set[str] = set()
    while pending:
        req = pending.pop()
        name = canonicalize_name(req.name)
        if name == "tracerag":  # a self-reference: tracerag[server] is the server extra
            for extra in req.extras - expanded:
                expanded.add(extra)
                pending.extend(Requirement(r) for r in extras[extra])
            continue
        if name in seen:
            continue
        seen.add(name)
        try:
            requires = metadata.requires(req.name) or []
        except metadata.PackageNotFoundError:
            continue
        for line in requires:
            sub = Requirement(line)
            wanted = [{"extra": extra} for extra in req.extras] or [{"extra": ""}]
            if sub.marker is None or any(sub.marker.evaluate(env) for env in wanted):
                pending.append(sub)
    return seen


def test_every_package_a_fast_test_imports_comes_with_the_test_extra():
    providers = metadata.packages_distributions()
    closure = required_closure()
    missing = {}
    for top, where in imported_top_levels().items():
        dists = {canonicalize_name(d) for d in providers.get(top, [])}
        assert dists, f"{top} (imported by {where}) is not installed"
        if not dists & closure:
            missing[top] = where
    assert missing == {}


def test_the_check_sees_what_the_server_tests_import():
    imported = imported_top_levels()
    assert {"fastapi", "pytest", "hypothesis", "langgraph"} <= set(imported)
