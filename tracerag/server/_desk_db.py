"""The desk's shared state, in the audit store's own database.

Desk sessions, claims on items, skipped items and the sign-in back-off are kept in four small
tables beside the audit tables, so several server processes (on one machine or many) on one
store are interchangeable: a session signed in on one is valid on every other, a claim taken on
one blocks a decision on another, and failed sign-ins count towards one lockout.

These rows are working state, not evidence: they are not chained (a decision, a vote, a
comment or an assignment is, in the audit log). Their migrations are kept in their own
``desk_schema_version`` table. Writes are short transactions that never take the audit chain's
lock: SQLite ``BEGIN IMMEDIATE`` on a connection of its own, PostgreSQL a small pool.

A store without a shared database (SQLite ``:memory:``, a store object of another kind) keeps
desk state in the process instead (``desk_db_like`` returns None).
"""

from __future__ import annotations

import sqlite3
import threading
from collections.abc import Iterator, Sequence
from contextlib import AbstractContextManager, contextmanager
from typing import Any

from tracerag.errors import TraceragError
from tracerag.store._base import AuditStore, StoreError
from tracerag.store._migrations import Step, migrate
from tracerag.store._sqlite import QmarkCursor, transaction

#: the desk's migrations, in the audit store's format (``tracerag.store.migrations``)
MIGRATIONS: list[tuple[int, list[Step]]] = [
    (
        1,
        [
            # sid_key: HMAC of the session id under a key derived from the desk's credentials
            # (never stored), so a row written into the database opens no session
            """CREATE TABLE desk_sessions (
                sid_key TEXT PRIMARY KEY,
                reviewer TEXT NOT NULL,
                kind TEXT NOT NULL,
                created_at {double} NOT NULL,
                expires_at {double} NOT NULL
            )""",
            "CREATE INDEX desk_sessions_expires ON desk_sessions (expires_at)",
            # item_id: a review item's request id (other desk item kinds use their own ids)
            """CREATE TABLE desk_claims (
                item_id TEXT PRIMARY KEY,
                reviewer TEXT NOT NULL,
                sid_key TEXT,
                taken_at {double} NOT NULL,
                expires_at {double} NOT NULL
            )""",
            "CREATE INDEX desk_claims_session ON desk_claims (sid_key)",
            "CREATE INDEX desk_claims_expires ON desk_claims (expires_at)",
            """CREATE TABLE desk_throttle (
                client TEXT PRIMARY KEY,
                failures INTEGER NOT NULL,
                first_at {double} NOT NULL,
                locked_until {double} NOT NULL
            )""",
            """CREATE TABLE desk_skips (
                item_id TEXT NOT NULL,
                reviewer TEXT NOT NULL,
                skipped_at {double} NOT NULL,
                PRIMARY KEY (item_id, reviewer)
            )""",
        ],
    ),
]
SCHEMA_VERSION = MIGRATIONS[-1][0]


class DeskStateError(TraceragError):
    """The desk's shared state could not be read or written."""


def _migrate(cur: Any, dialect: str) -> int:
    return migrate(
        cur,
        dialect,
        MIGRATIONS,
        version_table="desk_schema_version",
        schema="review desk",
        refuse=DeskStateError,
    )


class DeskDB:
    """Transactions on the desk's tables; cursors take ``%s`` parameters."""

    dialect: str = ""

    def write(self) -> AbstractContextManager[Any]:  # pragma: no cover - interface
        """A cursor in a transaction that may write (serialised with other desk writers)."""
        raise NotImplementedError

    def read(self) -> AbstractContextManager[Any]:  # pragma: no cover - interface
        """A cursor for reads."""
        raise NotImplementedError

    def close(self) -> None:  # pragma: no cover - interface
        """Close the connections; a later transaction opens one again (an app started again)."""
        raise NotImplementedError


class SQLiteDeskDB(DeskDB):
    """The desk's tables in the audit store's SQLite file, on a connection of their own."""

    dialect = "sqlite"

    def __init__(self, path: str, busy_timeout_s: float = 5.0) -> None:
        self.path = path
        self._lock = threading.RLock()
        self._busy_timeout_s = busy_timeout_s
        self._conn: sqlite3.Connection | None = None
        try:
            with self._lock, transaction(self._connection(), "BEGIN IMMEDIATE") as cur:
                self.schema_version = _migrate(QmarkCursor(cur), self.dialect)
        except sqlite3.Error as exc:
            self.close()
            raise DeskStateError(f"cannot open the desk's tables in {path}: {exc}") from exc

    def _connection(self) -> sqlite3.Connection:
        """The open connection (under the lock), opened again after a close."""
        if self._conn is None:
            conn = sqlite3.connect(
                self.path,
                isolation_level=None,
                check_same_thread=False,
                timeout=self._busy_timeout_s,
            )
            try:
                conn.execute(f"PRAGMA busy_timeout={int(self._busy_timeout_s * 1000)}")
                # working state: a session or a claim lost to a power cut costs a sign-in
                conn.execute("PRAGMA synchronous=NORMAL")
            except BaseException:
                conn.close()
                raise
            self._conn = conn
        return self._conn

    @contextmanager
    def write(self) -> Iterator[Any]:
        with self._lock, transaction(self._connection(), "BEGIN IMMEDIATE") as cur:
            yield QmarkCursor(cur)

    @contextmanager
    def read(self) -> Iterator[Any]:
        with self._lock, transaction(self._connection()) as cur:
            yield QmarkCursor(cur)

    def close(self) -> None:
        with self._lock:
            conn, self._conn = self._conn, None
            if conn is not None:
                conn.close()


class _PgCursor:
    def __init__(self, cur: Any) -> None:
        self._cur = cur

    def execute(self, sql: str, params: Sequence[Any] = ()) -> Any:
        return self._cur.execute(sql, params or None)

    def fetchone(self) -> Any:
        return self._cur.fetchone()

    def fetchall(self) -> list[Any]:
        rows: list[Any] = self._cur.fetchall()
        return rows


class PostgresDeskDB(DeskDB):
    """The desk's tables in the audit store's PostgreSQL database and schema (a small pool)."""

    dialect = "postgres"

    def __init__(self, dsn: str, schema: str | None = None, max_connections: int = 4) -> None:
        from tracerag.store._postgres import _Pool, connect

        def new_pool() -> Any:
            return _Pool(lambda: connect(dsn, schema), max_connections)

        self._new_pool = new_pool
        self._pool_lock = threading.Lock()
        self._pool: Any = new_pool()
        try:
            with self._pool.connection() as conn, conn.transaction(), conn.cursor() as raw:
                raw.execute(
                    "SELECT pg_advisory_xact_lock(hashtext(coalesce(current_schema(), '') "
                    "|| 'tracerag.desk.schema'))"
                )
                self.schema_version = _migrate(raw, self.dialect)
        except (StoreError, DeskStateError):
            self._pool.close()
            raise
        except Exception as exc:
            self._pool.close()
            raise DeskStateError(f"cannot open the desk's tables: {exc}") from exc

    def _open_pool(self) -> Any:
        """The pool, a new one after a close."""
        with self._pool_lock:
            if self._pool is None:
                self._pool = self._new_pool()
            return self._pool

    @contextmanager
    def write(self) -> Iterator[Any]:
        with self._open_pool().connection() as conn, conn.transaction(), conn.cursor() as raw:
            yield _PgCursor(raw)

    @contextmanager
    def read(self) -> Iterator[Any]:
        with self._open_pool().connection() as conn, conn.transaction(), conn.cursor() as raw:
            yield _PgCursor(raw)

    def close(self) -> None:
        with self._pool_lock:
            pool, self._pool = self._pool, None
        if pool is not None:
            pool.close()


def desk_db_like(store: AuditStore) -> DeskDB | None:
    """The desk's tables in the database of an open audit store; None when the store has no
    database another process could share (SQLite ``:memory:``, a store of another kind)."""
    dsn = getattr(store, "dsn", None)
    if isinstance(dsn, str) and dsn:
        return PostgresDeskDB(dsn, getattr(store, "schema", None))
    path = getattr(store, "path", None)
    if isinstance(path, str) and path and path != ":memory:":
        return SQLiteDeskDB(path)
    return None


__all__ = [
    "MIGRATIONS",
    "SCHEMA_VERSION",
    "DeskDB",
    "DeskStateError",
    "PostgresDeskDB",
    "SQLiteDeskDB",
    "desk_db_like",
]
