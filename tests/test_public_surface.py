"""The public surface is deliberate: a module is private (``_name.py``, or under a ``_`` package)
unless the documentation shows it, and a public module's ``__all__`` is what the documentation
lists for it — the API reference renders each public module from its ``__all__``.
"""

from __future__ import annotations

import ast
import re
import subprocess
import sys
from pathlib import Path

import pytest
from pipeline_fixtures import REPO

import tracerag

PACKAGE = REPO / "tracerag"
DOCS = REPO / "docs"
DIRECTIVE = re.compile(r"^::: ([\w.]+)\s*$", re.M)


def module_name(path: Path) -> str:
    parts = path.relative_to(REPO).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def public_modules() -> dict[str, Path]:
    return {
        module_name(path): path
        for path in sorted(PACKAGE.rglob("*.py"))
        if not any(part.startswith("_") for part in module_name(path).split("."))
    }


def declared_all(path: Path) -> list[str] | None:
    for node in ast.parse(path.read_text("utf-8")).body:
        targets = node.targets if isinstance(node, ast.Assign) else []
        if any(isinstance(t, ast.Name) and t.id == "__all__" for t in targets):
            assert isinstance(node, ast.Assign)
            return list(ast.literal_eval(node.value))
    return None


def is_namespace(path: Path) -> bool:
    """A package's ``__init__.py`` that holds nothing but its docstring."""
    body = ast.parse(path.read_text("utf-8")).body
    return path.name == "__init__.py" and all(
        isinstance(node, ast.Expr) and isinstance(node.value, ast.Constant) for node in body
    )


def docs_text() -> str:
    pages = [REPO / "README.md", *sorted(DOCS.rglob("*.md"))]
    return "\n".join(page.read_text("utf-8") for page in pages)


def directives() -> set[str]:
    return set(DIRECTIVE.findall(docs_text()))


def top_level_table() -> set[str]:
    """The names the API reference's index lists for ``tracerag`` itself."""
    index = (DOCS / "reference" / "index.md").read_text("utf-8")
    rows = [line for line in index.splitlines() if line.startswith("| [")]
    return {name for row in rows for name in re.findall(r"`(\w+)`", row.split("|")[2])}


MODULES = public_modules()


def test_the_package_is_mostly_private() -> None:
    modules = [module_name(p) for p in PACKAGE.rglob("*.py")]
    assert len(MODULES) <= 30 < len(modules) - len(MODULES)


@pytest.mark.parametrize("module", sorted(MODULES))
def test_a_public_module_declares_its_surface_or_is_a_namespace(module: str) -> None:
    path = MODULES[module]
    assert is_namespace(path) or declared_all(path) is not None, (
        f"{module} is public (no _ in its path) but declares no __all__"
    )


@pytest.mark.parametrize(
    "module", sorted(m for m, p in MODULES.items() if declared_all(p) and m != "tracerag")
)
def test_every_name_a_public_module_exports_is_in_the_documentation(module: str) -> None:
    names = declared_all(MODULES[module]) or []
    shown = directives()
    text = docs_text()
    missing = [
        name
        for name in names
        if module not in shown
        and f"{module}.{name}" not in shown
        and f"{module}.{name}" not in text
    ]
    assert not missing, f"{module}.__all__ names the documentation does not show: {missing}"


def test_the_reference_index_lists_exactly_the_top_level_names() -> None:
    assert top_level_table() == set(tracerag.__all__) - {"__version__"}


def test_the_documentation_shows_public_paths_only() -> None:
    for target in directives():
        assert not any(part.startswith("_") for part in target.split(".")), target
    imports = re.findall(r"^\s*(?:from|import) (tracerag[\w.]*)", docs_text(), re.M)
    assert imports and not [i for i in imports if "._" in i]


def test_every_documented_module_is_public() -> None:
    for target in directives():
        module = target
        while module not in MODULES and "." in module:
            module = module.rsplit(".", 1)[0]
        assert module in MODULES, target


def test_the_top_level_exports_nothing_from_the_demo() -> None:
    code = (
        "import sys, tracerag\n"
        "for name in tracerag.__all__: getattr(tracerag, name)\n"
        "bad = sorted(m for m in sys.modules if m.startswith(('tracerag.demo', 'tracerag.tools',"
        " 'tracerag.server')))\n"
        "print(bad)\n"
    )
    out = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, check=True, cwd=REPO
    ).stdout
    assert out.strip() == "[]"
    assert "ExtractiveChatModel" not in tracerag.__all__


def test_store_error_is_exported_from_the_store_and_the_top_says_where() -> None:
    from tracerag.store import StoreError

    assert "StoreError" not in tracerag.__all__
    assert issubclass(StoreError, tracerag.TraceragError)
    with pytest.raises(AttributeError, match=r"from tracerag\.store import StoreError"):
        tracerag.StoreError  # noqa: B018


@pytest.mark.parametrize("name", ["AuditRecord", "AuditStore", "AuditWriter", "open_store"])
def test_the_audit_store_names_live_in_the_store_not_the_library(name: str) -> None:
    import tracerag.store

    assert name in tracerag.store.__all__ and getattr(tracerag.store, name) is not None
    assert name not in tracerag.__all__ and name not in dir(tracerag)
    with pytest.raises(AttributeError, match=rf"tracerag\.{name} is the audit store's"):
        getattr(tracerag, name)


def test_an_unknown_top_level_name_is_a_plain_attribute_error() -> None:
    with pytest.raises(AttributeError, match="has no attribute 'nothing_here'"):
        tracerag.nothing_here  # noqa: B018
