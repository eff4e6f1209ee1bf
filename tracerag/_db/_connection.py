"""Where a store's database is, and what every database of this package offers.

``locate(store)`` finds the database an open audit store uses (its PostgreSQL DSN and schema,
or its SQLite file), so the tables kept beside the audit tables (the material registry, the
desk's state, the answer runs) open the same one. ``Database`` is what ``SQLiteDB`` and
``PostgresDB`` both are.
"""

from __future__ import annotations

from contextlib import AbstractContextManager
from dataclasses import dataclass
from typing import Protocol

from tracerag._db._dialect import Cursor, Dialect
from tracerag._db._versions import Schema


class Database(Protocol):
    """Transactions on one database; cursors take the paramstyle it was opened with."""

    @property
    def dialect(self) -> Dialect: ...

    @property
    def closed(self) -> bool: ...

    def write(self) -> AbstractContextManager[Cursor]: ...

    def read(self) -> AbstractContextManager[Cursor]: ...

    def migrate(self, schema: Schema, target: int | None = None) -> int: ...

    def close(self) -> None: ...


@dataclass(frozen=True)
class SQLiteFile:
    """A store's SQLite file."""

    path: str


@dataclass(frozen=True)
class PostgresSchema:
    """A store's PostgreSQL database (``dsn``) and schema (None: the search_path's)."""

    dsn: str
    schema: str | None


def locate(store: object) -> SQLiteFile | PostgresSchema | None:
    """The database of an open audit store; None when no other connection could share it
    (SQLite ``:memory:`` or a ``file:`` URI, a store of another kind)."""
    dsn = getattr(store, "dsn", None)
    if isinstance(dsn, str) and dsn:
        schema = getattr(store, "schema", None)
        return PostgresSchema(dsn, schema if isinstance(schema, str) and schema else None)
    path = getattr(store, "path", None)
    if isinstance(path, str) and path and path != ":memory:" and not path.startswith("file:"):
        return SQLiteFile(path)
    return None
