"""tracerag's exception classes, raise sites and exports, read from its source (no import).

Reading the source rather than importing it covers every module, those whose optional extra
is not installed too. ``Index`` resolves a name the way the module's own imports bind it, and
a class's bases the same way, down to ``tracerag.errors.TraceragError`` or a built-in.
``python tests/error_index.py`` rewrites the drawn tree in ``tracerag/errors.py`` and the
table in ``docs/errors.md`` (the tests compare both with what it would write).
"""

from __future__ import annotations

import ast
import builtins
import importlib
import re
import sys
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
PACKAGE = REPO / "tracerag"
ROOT = ("tracerag.errors", "TraceragError")
DOCS = REPO / "docs" / "errors.md"
TREE_START, TREE_END = "<!-- error-tree:start -->", "<!-- error-tree:end -->"


@dataclass(frozen=True)
class Cls:
    """A class: defined in tracerag (``module``, ``name``) or a built-in/third-party one."""

    module: str
    name: str

    @property
    def qualified(self) -> str:
        return f"{self.module}.{self.name}"


@dataclass
class Module:
    name: str
    path: Path
    tree: ast.Module
    classes: dict[str, ast.ClassDef] = field(default_factory=dict)
    functions: dict[str, ast.FunctionDef | ast.AsyncFunctionDef] = field(default_factory=dict)
    #: a name bound by an import: (module, attribute) or (module, None) for ``import m as n``
    imports: dict[str, tuple[str, str | None]] = field(default_factory=dict)
    exported: tuple[str, ...] | None = None  # a literal ``__all__``
    lazy: dict[str, str] = field(default_factory=dict)  # a literal ``_EXPORTS`` name -> module

    @property
    def public(self) -> bool:
        return not any(part.startswith("_") for part in self.name.split("."))


def module_name(path: Path, root: Path = REPO) -> str:
    parts = list(path.relative_to(root).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


def _absolute(module: Module, level: int, target: str | None) -> str:
    if level == 0:
        return target or ""
    base = module.name.split(".")
    if module.path.name != "__init__.py":
        base.pop()
    base = base[: len(base) - (level - 1)]
    return ".".join(base + ([target] if target else []))


def _strings(node: ast.AST) -> tuple[str, ...] | None:
    if isinstance(node, (ast.List, ast.Tuple)) and all(
        isinstance(e, ast.Constant) and isinstance(e.value, str) for e in node.elts
    ):
        return tuple(e.value for e in node.elts)  # type: ignore[attr-defined]
    return None


def read_module(path: Path, root: Path = REPO) -> Module:
    tree = ast.parse(path.read_text("utf-8"), str(path))
    module = Module(module_name(path, root), path, tree)
    for node in ast.walk(tree):  # imports inside functions too: tracerag imports lazily
        if isinstance(node, ast.ImportFrom):
            source = _absolute(module, node.level, node.module)
            for alias in node.names:
                module.imports.setdefault(alias.asname or alias.name, (source, alias.name))
        elif isinstance(node, ast.Import):
            for alias in node.names:
                if alias.asname:
                    module.imports.setdefault(alias.asname, (alias.name, None))
                else:
                    top = alias.name.split(".")[0]
                    module.imports.setdefault(top, (top, None))
    for node in tree.body:
        if isinstance(node, ast.ClassDef):
            module.classes[node.name] = node
        elif isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
            module.functions[node.name] = node
        elif isinstance(node, (ast.Assign, ast.AnnAssign)):
            targets = node.targets if isinstance(node, ast.Assign) else [node.target]
            names = [t.id for t in targets if isinstance(t, ast.Name)]
            if "__all__" in names and node.value is not None:
                module.exported = _strings(node.value)
            if "_EXPORTS" in names and isinstance(node.value, ast.Dict):
                for k, v in zip(node.value.keys, node.value.values, strict=True):
                    if isinstance(k, ast.Constant) and isinstance(v, ast.Constant):
                        module.lazy[str(k.value)] = str(v.value)
    return module


class Index:
    """Every module of the tracerag package, read from source."""

    def __init__(self, package: Path = PACKAGE) -> None:
        self.root = package.parent
        self.modules: dict[str, Module] = {}
        for path in sorted(package.rglob("*.py")):
            module = read_module(path, self.root)
            self.modules[module.name] = module

    # -- names ---------------------------------------------------------------------------

    def resolve(self, module: str, name: str, _seen: int = 0) -> Cls | None:
        """The class ``name`` is in ``module``, or None (not a class, or not known)."""
        if _seen > 20:
            return None
        mod = self.modules.get(module)
        if mod is None:
            return self._foreign(module, name)
        if name in mod.classes:
            return Cls(module, name)
        if name in mod.imports:
            source, attribute = mod.imports[name]
            if attribute is None:
                return None
            if f"{source}.{attribute}" in self.modules:
                return None  # a submodule
            return self.resolve(source, attribute, _seen + 1)
        if name in mod.lazy:
            return self.resolve(mod.lazy[name], name, _seen + 1)
        if module == mod.name and name not in mod.functions:
            value = getattr(builtins, name, None)
            if isinstance(value, type):
                return Cls("builtins", name)
        return None

    def _foreign(self, module: str, name: str) -> Cls | None:
        if module.split(".")[0] == "tracerag":
            return None
        try:
            value = getattr(importlib.import_module(module), name)
        except (ImportError, AttributeError):
            return None
        return Cls(value.__module__, value.__qualname__) if isinstance(value, type) else None

    def resolve_expr(self, module: str, node: ast.expr) -> Cls | None:
        """The class an expression names in ``module`` (``Name`` or ``alias.Name``)."""
        if isinstance(node, ast.Name):
            return self.resolve(module, node.id)
        if isinstance(node, ast.Attribute):
            target = self.module_of(module, node.value)
            if target is not None:
                return self.resolve(target, node.attr)
        return None

    def module_of(self, module: str, node: ast.expr) -> str | None:
        """The module an expression names (``import x as y`` / ``from p import m``)."""
        mod = self.modules[module]
        if isinstance(node, ast.Name) and node.id in mod.imports:
            source, attribute = mod.imports[node.id]
            return source if attribute is None else f"{source}.{attribute}"
        if isinstance(node, ast.Attribute):
            base = self.module_of(module, node.value)
            return f"{base}.{node.attr}" if base else None
        return None

    # -- classes -------------------------------------------------------------------------

    def real(self, cls: Cls) -> type | None:
        """A built-in or third-party class itself."""
        if cls.module in self.modules:
            return None
        try:
            value = importlib.import_module(cls.module)
            for part in cls.name.split("."):
                value = getattr(value, part)
        except (ImportError, AttributeError):
            return None
        return value if isinstance(value, type) else None

    def bases(self, cls: Cls) -> list[Cls]:
        if cls.module in self.modules:
            node = self.modules[cls.module].classes[cls.name]
            found = [self.resolve_expr(cls.module, b) for b in node.bases]
            return [b for b in found if b is not None]
        value = self.real(cls)
        if value is None:
            return []
        return [Cls(b.__module__, b.__qualname__) for b in value.__bases__]

    def ancestors(self, cls: Cls) -> Iterator[Cls]:
        """``cls`` and every class it derives from (depth first, each once)."""
        seen: set[Cls] = set()
        stack = [cls]
        while stack:
            current = stack.pop(0)
            if current in seen:
                continue
            seen.add(current)
            yield current
            stack[:0] = self.bases(current)

    def in_tree(self, cls: Cls) -> bool:
        return Cls(*ROOT) in set(self.ancestors(cls))

    def builtin_bases(self, cls: Cls) -> list[str]:
        """The built-in exceptions a tree class also is (the most derived ones)."""
        names = [c.name for c in self.ancestors(cls) if c.module == "builtins"]
        kept = [n for n in names if n not in ("Exception", "BaseException", "object")]
        return [
            n
            for n in kept
            if not any(
                o != n and issubclass(getattr(builtins, o), getattr(builtins, n)) for o in kept
            )
        ]

    def tree_classes(self) -> list[Cls]:
        """Every class of the tree defined in tracerag."""
        return [
            Cls(m.name, name)
            for m in self.modules.values()
            for name in m.classes
            if self.in_tree(Cls(m.name, name))
        ]

    def parent(self, cls: Cls) -> Cls | None:
        """The base a tree class hangs from in the drawing (its first base in the tree)."""
        for base in self.bases(cls):
            if self.in_tree(base):
                return base
        return None

    def docstring(self, cls: Cls) -> str:
        text = ast.get_docstring(self.modules[cls.module].classes[cls.name]) or ""
        return " ".join(text.split("\n\n")[0].split())

    def homes(self, cls: Cls) -> list[str]:
        """The public modules whose ``__all__`` holds the class (or, in a module without
        ``__all__``, that define it under a public name), shortest first."""
        found = [
            m.name
            for m in self.modules.values()
            if m.public
            and (
                (m.exported is not None and cls.name in m.exported)
                or (m.exported is None and m.name == cls.module and not cls.name.startswith("_"))
            )
            and self.resolve(m.name, cls.name) == cls
        ]
        return sorted(found, key=lambda n: (n.count("."), n))


# -- the drawn tree and the table --------------------------------------------------------


def children(index: Index) -> dict[Cls, list[Cls]]:
    out: dict[Cls, list[Cls]] = {}
    for cls in index.tree_classes():
        parent = index.parent(cls)
        if parent is not None:
            out.setdefault(parent, []).append(cls)
    for kids in out.values():
        kids.sort(key=lambda c: _ORDER.get(c.name, (1, c.name)))
    return out


#: the classes callers meet first are drawn first; the rest in alphabetical order
_ORDER = {
    name: (0, f"{i:02d}")
    for i, name in enumerate(
        [
            "InputError",
            "ConfigurationError",
            "AuthenticationError",
            "ContractError",
            "PlanError",
            "CallError",
            "StoreError",
            "MaterialStoreError",
        ]
    )
}


def _also(index: Index, cls: Cls) -> str:
    parent = index.parent(cls)
    inherited = set(index.builtin_bases(parent)) if parent else set()
    own = [b for b in index.builtin_bases(cls) if b not in inherited]
    return f" ({', '.join(own)} too)" if own else ""


def render_tree(index: Index) -> str:
    """The tree as drawn in ``tracerag/errors.py``: every class, its extra built-in bases and,
    unless ``tracerag`` exports it, the module to import it from."""
    kids = children(index)
    root = Cls(*ROOT)
    rows: list[tuple[str, str]] = [(root.name, "")]

    def walk(cls: Cls, prefix: str) -> None:
        below = kids.get(cls, [])
        for i, child in enumerate(below):
            last = i == len(below) - 1
            homes = index.homes(child)
            home = "" if homes[:1] == ["tracerag"] else (homes[0] if homes else "(internal)")
            line = f"{prefix}{'└── ' if last else '├── '}{child.name}{_also(index, child)}"
            rows.append((line, home))
            walk(child, prefix + ("    " if last else "│   "))

    walk(root, "")
    width = max(len(line) for line, _ in rows) + 2
    return "\n".join(f"{line:<{width}}{home}".rstrip() for line, home in rows)


def render_table(index: Index, statuses: dict[str, tuple[int, str]]) -> str:
    """The docs block: the drawn tree, then each class (in the tree's order) with where to
    import it, what it means and what the server answers for it.

    ``statuses``: qualified class name -> (status, code), for every class of the tree.
    """
    kids = children(index)
    rows = ["| Error | Import from | Means | HTTP |", "|---|---|---|---|"]

    def walk(cls: Cls) -> None:
        homes = index.homes(cls)
        home = f"`{homes[0]}`" if homes else "internal"
        status, code = statuses[cls.qualified]
        means = index.docstring(cls).replace("``", "`").replace("|", "\\|")
        rows.append(f"| `{cls.name}`{_also(index, cls)} | {home} | {means} | {status} `{code}` |")
        for child in kids.get(cls, []):
            walk(child)

    walk(Cls(*ROOT))
    return "```text\n" + render_tree(index) + "\n```\n\n" + "\n".join(rows)


def server_statuses(index: Index) -> dict[str, tuple[int, str]]:
    """What the server answers for each class of the tree (the nearest mapped ancestor)."""
    from tracerag.server._error_shape import error_statuses

    table = {f"{c.__module__}.{c.__qualname__}": v for c, v in error_statuses().items()}
    out = {}
    for cls in [Cls(*ROOT), *index.tree_classes()]:
        for ancestor in index.ancestors(cls):
            if ancestor.qualified in table:
                out[cls.qualified] = table[ancestor.qualified]
                break
    return out


def docstring_block(text: str) -> str | None:
    """The tree drawn in a module docstring: from ``TraceragError`` to the first blank line."""
    match = re.search(r"^ {4}TraceragError\n(?: {4}.+\n)*", text, re.MULTILINE)
    return match.group(0) if match else None


def _span(text: str) -> tuple[int, int] | None:
    start, end = text.find(TREE_START), text.find(TREE_END)
    if start < 0 or end < start:
        return None
    return start + len(TREE_START), end


def docs_block(text: str) -> str | None:
    span = _span(text)
    return None if span is None else text[span[0] : span[1]].strip("\n")


def write() -> None:
    """Redraw the tree in ``tracerag/errors.py`` and the block in docs/errors.md."""
    index = Index()
    tree = "".join(f"    {line}\n" for line in render_tree(index).splitlines())
    errors = PACKAGE / "errors.py"
    text = errors.read_text("utf-8")
    match = re.search(r"^ {4}TraceragError\n(?: {4}.+\n)*", text, re.MULTILINE)
    assert match is not None, "tracerag/errors.py draws no tree"
    errors.write_text(text[: match.start()] + tree + text[match.end() :], "utf-8")
    docs = DOCS.read_text("utf-8")
    span = _span(docs)
    assert span is not None, f"docs/errors.md has no {TREE_START} … {TREE_END} block"
    block = render_table(index, server_statuses(index))
    DOCS.write_text(docs[: span[0]] + "\n" + block + "\n" + docs[span[1] :], "utf-8")


if __name__ == "__main__":
    sys.path.insert(0, str(REPO))
    write()
