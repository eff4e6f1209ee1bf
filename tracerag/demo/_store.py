"""Where ``tracerag demo`` writes: the audit store and the traces file, checked before a question
is asked, so a path it cannot write is one line and a non-zero exit, not a traceback or a run
that ends with "not written".

The demo creates no directory but its default ``./.tracerag/``: a ``--store`` or ``--traces``
(or ``TRACERAG_STORE``) in a directory that does not exist is refused, since a mistyped path
would otherwise leave a directory tree behind wherever the typo points.
"""

from __future__ import annotations

from pathlib import Path
from typing import NoReturn

from tracerag.errors import TraceragError

COMMAND = "tracerag demo"


def _fail(what: str, target: str, reason: str) -> NoReturn:
    raise SystemExit(f"{COMMAND}: cannot write {what} to {target}: {reason}")


def _one_line(exc: BaseException) -> str:
    return " ".join(str(exc).split()) or type(exc).__name__


def _parent_problem(file: Path) -> str | None:
    """Why ``file`` cannot be made in its directory without creating one; None if it can."""
    if file.is_dir():
        return f"{file} is a directory"
    parent = file.parent
    if parent.is_dir():
        return None
    for ancestor in [parent, *parent.parents]:
        if ancestor.exists() and not ancestor.is_dir():
            return f"{ancestor} is a file, not a directory"
        if ancestor.is_dir():
            break
    return f"the directory {parent} does not exist"


def checked_file(path: str | Path, *, what: str, default: bool) -> Path:
    """``path`` when a file can be written there; exit with one line otherwise.

    ``default``: the path is the demo's default, whose own directory may be missing (it is
    made by ``made_parent`` once everything is checked). Nothing is created here.
    """
    file = Path(path).expanduser()
    if default and not file.parent.exists():
        file = file.parent.parent / file.name  # where the directory itself will be made
    problem = _parent_problem(file)
    if problem:
        _fail(what, str(path), problem)
    return Path(path).expanduser()


def made_parent(file: Path, *, what: str) -> Path:
    """``file`` once its directory exists (the default's ``./.tracerag/``)."""
    try:
        file.parent.mkdir(exist_ok=True)
    except OSError as exc:
        _fail(what, str(file), _one_line(exc))
    return file


def writable_store(target: str, *, default: bool) -> str:
    """``target`` once it opens as an audit store the demo can write; else exit with one line.

    ``default``: the target is the CLI's default, whose ``./.tracerag/`` may be created.
    Opening it first means a file that is not an audit store is refused before anything (a
    journal beside it, an answer) is made.
    """
    # the store imports pydantic: imported when the demo runs, not by `tracerag demo --help`
    # (which imports this module; a test checks it imports no pydantic)
    from tracerag.store import open_store
    from tracerag.store._open import sqlite_path

    path = sqlite_path(target)
    if path and path != ":memory:":
        file = checked_file(path, what="the audit trail", default=default)
        if default:
            made_parent(file, what="the audit trail")
    try:
        store = open_store(target, create=True)
    except (TraceragError, OSError) as exc:
        _fail("the audit trail", target, _one_line(exc))
    except Exception as exc:  # a driver error the backend did not wrap
        _fail("the audit trail", target, f"{type(exc).__name__}: {_one_line(exc)}")
    store.close()
    return target
