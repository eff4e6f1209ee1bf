"""What differs between SQLite and PostgreSQL in the SQL the project writes.

The dialect names, the column types that differ, and the cursors that translate placeholders:
shared SQL is written in the ``format`` paramstyle (``%s``, ``%%`` for a literal ``%``, psycopg's
own), which ``QmarkCursor`` gives to sqlite3 as ``?``; SQL written with ``?`` goes to a ``%s``
cursor through ``FormatCursor``.
"""

from __future__ import annotations

import functools
import re
import sqlite3
from collections.abc import Sequence
from typing import Any, Literal, Protocol

Dialect = Literal["sqlite", "postgres"]
#: how a database's cursors take parameters: ``format`` (``%s``) or ``qmark`` (``?``)
Paramstyle = Literal["format", "qmark"]

DIALECTS: tuple[Dialect, ...] = ("sqlite", "postgres")
#: the column types spelled differently, by the name a migration uses for them
TYPES: dict[str, dict[str, str]] = {
    "sqlite": {"bigint": "INTEGER", "double": "REAL"},
    "postgres": {"bigint": "BIGINT", "double": "DOUBLE PRECISION"},
}


class Cursor(Protocol):
    """The part of a DB-API cursor the project's tables use."""

    def execute(self, sql: str, params: Sequence[Any] = ()) -> Any: ...

    def executemany(self, sql: str, params_seq: Sequence[Sequence[Any]]) -> Any: ...

    def fetchone(self) -> Any: ...

    def fetchall(self) -> list[Any]: ...


_FORMAT_TOKEN = re.compile(r"%[s%]")


@functools.lru_cache(maxsize=512)
def to_qmark(sql: str) -> str:
    """A ``format``-paramstyle statement in ``qmark`` style: ``%s`` → ``?``, ``%%`` → ``%``."""
    return _FORMAT_TOKEN.sub(lambda m: "?" if m.group(0) == "%s" else "%", sql)


class QmarkCursor:
    """An sqlite3 cursor taking ``format``-style parameters (a statement without parameters
    is sent as written, as psycopg does)."""

    def __init__(self, cur: sqlite3.Cursor) -> None:
        self._cur = cur

    def execute(self, sql: str, params: Sequence[Any] = ()) -> Any:
        if params:
            return self._cur.execute(to_qmark(sql), params)
        return self._cur.execute(sql)

    def executemany(self, sql: str, params_seq: Sequence[Sequence[Any]]) -> Any:
        return self._cur.executemany(to_qmark(sql), params_seq)

    def fetchone(self) -> Any:
        return self._cur.fetchone()

    def fetchall(self) -> list[Any]:
        return self._cur.fetchall()

    def close(self) -> None:
        self._cur.close()


class FormatCursor:
    """A cursor taking ``?`` parameters over one taking ``%s`` (every ``?`` is a parameter:
    SQL given to it holds no literal ``?`` or ``%``)."""

    def __init__(self, cur: Any) -> None:
        self._cur = cur

    def execute(self, sql: str, params: Sequence[Any] = ()) -> Any:
        return self._cur.execute(sql.replace("?", "%s"), tuple(params) or None)

    def executemany(self, sql: str, params_seq: Sequence[Sequence[Any]]) -> Any:
        return self._cur.executemany(sql.replace("?", "%s"), params_seq)

    def fetchone(self) -> Any:
        return self._cur.fetchone()

    def fetchall(self) -> list[Any]:
        rows: list[Any] = self._cur.fetchall()
        return rows
