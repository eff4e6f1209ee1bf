"""The error tree is true: every exception tracerag raises on purpose is a ``TraceragError``.

The walk reads every module of the package (``error_index``: from source, so a module whose
optional extra is missing is read too). Each ``raise`` names a class of the tree, or belongs
to one of the categories below, which docs/errors.md lists as well; anything else fails the
test, naming file:line. The drawn tree in ``tracerag/errors.py`` and the table in
docs/errors.md are compared with what the classes are, so neither can drift.
"""

from __future__ import annotations

import ast
from dataclasses import dataclass

import pytest
from error_index import (
    DOCS,
    PACKAGE,
    Cls,
    Index,
    docs_block,
    docstring_block,
    render_table,
    render_tree,
    server_statuses,
)

#: The raises that are not tree classes, by category (docs/errors.md lists the same).
CATEGORIES = {
    "re-raise": "`raise` alone, or `raise exc` of the exception an enclosing `except … as exc` "
    "caught",
    "propagated": "an exception caught elsewhere and raised again where its caller waits "
    "(another thread's or attempt's failure): `PROPAGATED` names each site",
    "not-implemented": "`NotImplementedError` in a method: an interface method a subclass "
    "implements, or one this implementation does not support",
    "module-getattr": "`AttributeError` from a module's `__getattr__` (Python's protocol for "
    "a missing attribute)",
    "command-exit": "`SystemExit` in the command line's code (`tracerag.tools`, "
    "`tracerag.demo`, the `cli` modules): a command ends with its message and exit status",
    "invariant": "`AssertionError`: an internal invariant (unreachable code) or a check of "
    "`tracerag.testing`'s assertion helpers",
    "internal-signal": "a class caught inside tracerag and never raised to a caller: "
    "`INTERNAL` names each; a private (`_Name`) class caught in its own module is one too",
    "stand-in": "a test double's failure standing for a provider's error (`tracerag.testing`): "
    "it must stay outside the tree, which tracerag never retries",
}

#: (innermost function, expression raised) -> why the object raised is not a new error
PROPAGATED = {
    ("_run_in_new_thread", "value"): "the worker thread's exception, raised in the calling thread",
    (
        "_iterate_here",
        "value",
    ): "what the iterated async iterator raised, raised in the sync caller",
    ("_iterate_in_thread", "value"): "what the iterated async iterator raised in the loop's "
    "thread, raised in the calling thread",
    ("check", "self.error"): "what failed a streamed request, raised to the run stream's reader",
    ("run", "refusal"): "a stage's StageRefusal, which the run loop handles",
    ("within", "error"): "the CallTimeoutError class the caller passed",
    ("__exit__", "self._error"): "the CallTimeoutError class the caller passed",
    ("attempt", "error"): "the first attempt's failure, handed to tenacity as its attempt 1",
    ("append_record", "item.error"): "the group commit's failure, raised in each writer "
    "whose record was in the group",
    ("migrate", "refuse"): "the schema's own SchemaTooNew class, passed by the caller",
    ("connection", "self._closed_error"): "the database user's own error for a closed "
    "database (StoreError, MaterialStoreError, DeskStateError, RunTableError), passed by it",
    ("_conn", "self._closed_error"): "the database user's own error for a closed database "
    "(StoreError, MaterialStoreError, DeskStateError, RunTableError), passed by it",
}

#: classes outside the tree that are raised and caught inside tracerag -> who handles them
INTERNAL = {
    "ApiError": "the server's exception handler answers it in the JSON error shape",
    "SignInRequired": "the server's handler answers it with 401 or the sign-in page",
    "FormRefused": "the server's handler answers it with the desk's 403 page (audited)",
    "NothingToSend": "the server's handler answers it with 204: EventSource stops",
    "StageRefusal": "the run loop keeps the stage's output, then raises the refusal's error",
    "NotDrawn": "the sample stage keeps it as a sample not drawn (no error of the request)",
}
STAND_INS = {"ScriptedModelError"}
COMMAND_PARTS = {"tools", "demo"}


@dataclass(frozen=True)
class Site:
    path: str
    line: int
    function: str  # the innermost function's qualified name ("" at module level)
    expr: str
    category: str | None  # None: a tree class
    problem: str | None = None
    key: tuple[str, str] = ("", "")  # (innermost function, what is raised) for PROPAGATED

    def __str__(self) -> str:
        return f"{self.path}:{self.line}: raise {self.expr} ({self.problem})"


def _parents(tree: ast.AST) -> dict[ast.AST, ast.AST]:
    return {child: node for node in ast.walk(tree) for child in ast.iter_child_nodes(node)}


def _scope(node: ast.AST, parents: dict[ast.AST, ast.AST]) -> tuple[list[ast.AST], str]:
    """The enclosing nodes (innermost first) and the innermost function's qualified name."""
    chain = []
    while node in parents:
        node = parents[node]
        chain.append(node)
    names: list[str] = []
    for i, n in enumerate(chain):
        if isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef)):
            names = [n.name]
            for outer in chain[i + 1 :]:
                if isinstance(outer, ast.ClassDef):
                    names.insert(0, outer.name)
                elif isinstance(outer, (ast.FunctionDef, ast.AsyncFunctionDef)):
                    break
            break
    return chain, ".".join(names)


def _handled_names(index: Index) -> set[str]:
    """Class names caught by an ``except`` or given to an exception-handler registration."""
    names: set[str] = set()
    for module in index.modules.values():
        for node in ast.walk(module.tree):
            if isinstance(node, ast.ExceptHandler) and node.type is not None:
                for n in ast.walk(node.type):
                    if isinstance(n, ast.Name):
                        names.add(n.id)
            elif isinstance(node, ast.Call) and node.args:
                func = ast.unparse(node.func)
                if func.endswith("exception_handler") and isinstance(node.args[0], ast.Name):
                    names.add(node.args[0].id)
    return names


def _caught_in(module_tree: ast.Module, name: str) -> bool:
    return any(
        isinstance(n, ast.ExceptHandler)
        and n.type is not None
        and any(isinstance(x, ast.Name) and x.id == name for x in ast.walk(n.type))
        for n in ast.walk(module_tree)
    )


def raise_sites(index: Index) -> list[Site]:
    handled = _handled_names(index)
    sites = []
    for module in index.modules.values():
        parents = _parents(module.tree)
        rel = str(module.path.relative_to(index.root))
        command = (
            bool(COMMAND_PARTS & set(module.name.split(".")[1:-1]))
            or (module.name.split(".")[-1].lstrip("_") == "cli")
            or module.name.split(".")[1:2] == ["demo"]
        )
        for node in ast.walk(module.tree):
            if not isinstance(node, ast.Raise):
                continue
            chain, function = _scope(node, parents)

            def site(category: str | None, problem: str | None = None) -> Site:
                key = (function.split(".")[-1], ast.unparse(target))  # noqa: B023
                return Site(rel, node.lineno, function, expr, category, problem, key)  # noqa: B023

            if node.exc is None:
                sites.append(Site(rel, node.lineno, function, "", "re-raise"))
                continue
            target = node.exc.func if isinstance(node.exc, ast.Call) else node.exc
            expr = ast.unparse(node.exc)
            cls = index.resolve_expr(module.name, target)
            if cls is None and isinstance(target, ast.Name):
                fn = module.functions.get(target.id)
                if fn is not None and fn.returns is not None:  # a function building the error
                    cls = index.resolve_expr(module.name, fn.returns)
            if cls is None:
                bound = {h.name for h in chain if isinstance(h, ast.ExceptHandler) and h.name}
                if isinstance(node.exc, ast.Name) and node.exc.id in bound:
                    sites.append(site("re-raise"))
                elif (function.split(".")[-1], ast.unparse(target)) in PROPAGATED:
                    sites.append(site("propagated"))
                else:
                    sites.append(
                        site(
                            None,
                            "cannot tell what this raises: add it to PROPAGATED "
                            "with the reason, or raise a class of the tree",
                        )
                    )
                continue
            if index.in_tree(cls):
                sites.append(site(None))
                continue
            functions = [
                i
                for i, c in enumerate(chain)
                if isinstance(c, (ast.FunctionDef, ast.AsyncFunctionDef))
            ]
            in_method = bool(functions) and isinstance(
                chain[functions[0] + 1] if functions[0] + 1 < len(chain) else None, ast.ClassDef
            )
            name = cls.name
            if cls == Cls("builtins", "NotImplementedError") and in_method:
                sites.append(site("not-implemented"))
            elif cls == Cls("builtins", "AttributeError") and function == "__getattr__":
                sites.append(site("module-getattr"))
            elif cls == Cls("builtins", "SystemExit") and command:
                sites.append(site("command-exit"))
            elif cls == Cls("builtins", "AssertionError"):
                sites.append(site("invariant"))
            elif (name in INTERNAL and name in handled) or (
                name.startswith("_") and cls.module == module.name and _caught_in(module.tree, name)
            ):
                sites.append(site("internal-signal"))
            elif name in STAND_INS and cls.module.split(".")[-1].lstrip("_") == "testing":
                sites.append(site("stand-in"))
            else:
                sites.append(site(None, f"{cls.qualified} is not a TraceragError"))
    return sorted(sites, key=lambda s: (s.path, s.line))


@pytest.fixture(scope="module")
def index() -> Index:
    return Index()


@pytest.fixture(scope="module")
def sites(index: Index) -> list[Site]:
    return raise_sites(index)


def test_every_deliberate_raise_is_a_tree_class_or_an_allowed_category(sites):
    assert len(sites) > 300  # the walk saw the package
    bad = [str(s) for s in sites if s.problem]
    assert not bad, f"{len(bad)} raise sites outside the error tree:\n" + "\n".join(bad)


def test_the_walk_catches_a_bare_builtin_and_an_unknown_object(tmp_path):
    package = tmp_path / "tracerag"
    package.mkdir()
    (package / "errors.py").write_text((PACKAGE / "errors.py").read_text("utf-8"))
    (package / "bad.py").write_text(
        "from tracerag.errors import InputError\n"
        "def f(x):\n"
        "    if x:\n"
        "        raise InputError('fine')\n"
        "    raise ValueError('a bare builtin')\n"
        "def g(err):\n"
        "    raise err\n"
        "class Local(ValueError):\n"
        "    pass\n"
        "def h():\n"
        "    raise Local('outside the tree')\n"
    )
    found = raise_sites(Index(package))
    bad = {(s.path.split("/")[-1], s.line) for s in found if s.problem}
    assert bad == {("bad.py", 5), ("bad.py", 7), ("bad.py", 11)}


def test_each_allowance_is_used_and_documented(sites):
    used = {s.category for s in sites if s.category}
    assert used == set(CATEGORIES), set(CATEGORIES) ^ used
    propagated = {s.key for s in sites if s.category == "propagated"}
    stale = [k for k in PROPAGATED if k not in propagated]
    assert not stale, f"PROPAGATED names sites that are gone: {stale}"
    docs = DOCS.read_text("utf-8")
    for category in CATEGORIES:
        assert f"`{category}`" in docs, category
    for name in INTERNAL:
        assert f"`{name}`" in docs, name


def test_the_tree_drawn_in_errors_py_is_the_tree(index):
    drawn = docstring_block((PACKAGE / "errors.py").read_text("utf-8"))
    expected = "".join(f"    {line}\n" for line in render_tree(index).splitlines())
    assert drawn == expected, (
        "tracerag/errors.py draws another tree; `python tests/error_index.py` redraws it:\n"
        + expected
    )


def test_the_docs_table_is_the_tree_with_the_servers_answers(index):
    table = docs_block(DOCS.read_text("utf-8"))
    expected = render_table(index, server_statuses(index))
    assert table == expected, (
        "docs/errors.md shows another tree; `python tests/error_index.py` rewrites it:\n" + expected
    )


def test_every_tree_class_a_caller_can_meet_is_exported(index):
    internal = {
        "tracerag.server._run_book.KeyReused",  # answered as 422 idempotency_key_reused
        "tracerag.server._run_table.RunTableError",  # answered as 503 store_unavailable
        "tracerag.server._desk_db.DeskStateError",  # answered as 503 store_unavailable
        "tracerag.server._target.AppTargetError",  # tracerag serve --app prints it
    }
    unexported = {
        c.qualified
        for c in index.tree_classes()
        if not index.homes(c) and c.qualified not in internal
    }
    assert not unexported
