"""The registry's own tables, beside the audit store's in the same database.

``connect_like(store)`` opens a connection to the database an open audit store uses (the
SQLite file, or the PostgreSQL DSN and schema) and applies the registry's migrations, kept in
their own ``material_schema_version`` table. Registry writes are serialised: SQLite by
``BEGIN IMMEDIATE``, PostgreSQL by locking the one ``material_head`` row.
"""

from __future__ import annotations

import sqlite3
import threading
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from typing import Any, Protocol

from tracerag.errors import ConfigurationError, TraceragError
from tracerag.store._migrations import Step, migrate
from tracerag.store._sqlite import QmarkCursor, transaction


class MaterialStoreError(TraceragError):
    """The material registry failed or refused an operation."""


class Cursor(Protocol):
    """The part of a DB-API cursor the registry uses (``?`` placeholders)."""

    def execute(self, sql: str, params: Sequence[Any] = ()) -> Any: ...

    def fetchone(self) -> Any: ...

    def fetchall(self) -> list[Any]: ...


#: the registry's migrations, in the audit store's format (``tracerag.store.migrations``)
MIGRATIONS: list[tuple[int, list[Step]]] = [
    (
        1,
        [
            """CREATE TABLE material_versions (
                material_id TEXT NOT NULL,
                version INTEGER NOT NULL,
                status TEXT NOT NULL,
                written_by TEXT NOT NULL,
                operator TEXT NOT NULL,
                batch_id TEXT,
                change TEXT NOT NULL,
                content_hash TEXT NOT NULL,
                created_at TEXT NOT NULL,
                body TEXT NOT NULL,
                body_hash TEXT NOT NULL,
                audit_seq {bigint},
                audit_hash TEXT,
                PRIMARY KEY (material_id, version)
            )""",
            "CREATE INDEX material_versions_rule ON material_versions (written_by)",
            "CREATE INDEX material_versions_batch ON material_versions (batch_id)",
            "CREATE INDEX material_versions_hash ON material_versions (content_hash)",
            """CREATE TABLE materials (
                material_id TEXT PRIMARY KEY,
                current_version INTEGER NOT NULL,
                status TEXT NOT NULL,
                content_hash TEXT NOT NULL,
                ema {double} NOT NULL,
                outcomes INTEGER NOT NULL DEFAULT 0,
                denials INTEGER NOT NULL DEFAULT 0,
                pending_version INTEGER,
                updated_at TEXT NOT NULL
            )""",
            "CREATE INDEX materials_status ON materials (status)",
            """CREATE TABLE material_usage (
                material_id TEXT NOT NULL,
                version INTEGER NOT NULL,
                retrievals INTEGER NOT NULL DEFAULT 0,
                citations INTEGER NOT NULL DEFAULT 0,
                passed INTEGER NOT NULL DEFAULT 0,
                approvals INTEGER NOT NULL DEFAULT 0,
                edits INTEGER NOT NULL DEFAULT 0,
                rejections INTEGER NOT NULL DEFAULT 0,
                confirmations INTEGER NOT NULL DEFAULT 0,
                denials INTEGER NOT NULL DEFAULT 0,
                PRIMARY KEY (material_id, version)
            )""",
            """CREATE TABLE material_reads (
                request_id TEXT NOT NULL,
                material_id TEXT NOT NULL,
                version INTEGER NOT NULL,
                rank_before INTEGER,
                rank_after INTEGER,
                cited INTEGER NOT NULL DEFAULT 0,
                decision TEXT,
                created_at TEXT NOT NULL,
                PRIMARY KEY (request_id, material_id)
            )""",
            "CREATE INDEX material_reads_material ON material_reads (material_id, version)",
            "CREATE INDEX material_reads_created ON material_reads (created_at)",
            """CREATE TABLE material_complaints (
                request_id TEXT PRIMARY KEY,
                verdict TEXT NOT NULL,
                created_at TEXT NOT NULL
            )""",
            """CREATE TABLE material_feedback (
                feedback_id TEXT PRIMARY KEY,
                request_id TEXT NOT NULL,
                verdict TEXT NOT NULL,
                comment TEXT,
                correction TEXT,
                operator TEXT NOT NULL,
                created_at TEXT NOT NULL,
                audit_seq {bigint}
            )""",
            "CREATE INDEX material_feedback_request ON material_feedback (request_id)",
            """CREATE TABLE material_conflicts (
                conflict_id TEXT PRIMARY KEY,
                material_a TEXT NOT NULL,
                version_a INTEGER NOT NULL,
                material_b TEXT NOT NULL,
                version_b INTEGER NOT NULL,
                slot_key TEXT NOT NULL,
                value_a TEXT NOT NULL,
                value_b TEXT NOT NULL,
                status TEXT NOT NULL CHECK (status IN ('open', 'resolved')),
                created_at TEXT NOT NULL,
                resolved_at TEXT,
                resolution TEXT
            )""",
            "CREATE INDEX material_conflicts_status ON material_conflicts (status)",
            """CREATE TABLE material_head (
                id INTEGER PRIMARY KEY CHECK (id = 1),
                generation {bigint} NOT NULL
            )""",
            "INSERT INTO material_head (id, generation) VALUES (1, 0)",
        ],
    ),
    (
        # verdicts per principal (``principal`` is NULL for an unverified note and for verdicts
        # kept before principals existed, ``method`` 'legacy'); what each verdict did to each
        # material (the per-material limits count these); the upgrade's baseline of the
        # columns of materials changed before registry events were chained
        2,
        [
            "ALTER TABLE material_feedback ADD COLUMN principal TEXT",
            "ALTER TABLE material_feedback ADD COLUMN method TEXT NOT NULL DEFAULT 'legacy'",
            "ALTER TABLE material_feedback ADD COLUMN counted INTEGER NOT NULL DEFAULT 0",
            "ALTER TABLE material_feedback ADD COLUMN declared_user TEXT",
            "CREATE UNIQUE INDEX material_feedback_principal "
            "ON material_feedback (request_id, principal)",
            "CREATE INDEX material_feedback_window ON material_feedback (principal, created_at)",
            """CREATE TABLE material_feedback_effects (
                feedback_id TEXT NOT NULL,
                material_id TEXT NOT NULL,
                principal TEXT,
                counted INTEGER NOT NULL,
                created_at TEXT NOT NULL,
                PRIMARY KEY (feedback_id, material_id)
            )""",
            "CREATE INDEX material_feedback_effects_material "
            "ON material_feedback_effects (material_id, created_at)",
            "CREATE INDEX material_feedback_effects_principal "
            "ON material_feedback_effects (principal, material_id, created_at)",
            """CREATE TABLE material_baseline (
                id INTEGER PRIMARY KEY CHECK (id = 1),
                done INTEGER NOT NULL
            )""",
            "INSERT INTO material_baseline (id, done) VALUES (1, 0)",
        ],
    ),
]
SCHEMA_VERSION = MIGRATIONS[-1][0]


class RegistryDB:
    """Connections to the registry's tables: ``write()`` and ``read()`` give a cursor."""

    dialect: str

    def write(self) -> Any:  # pragma: no cover - interface
        raise NotImplementedError

    def read(self) -> Any:  # pragma: no cover - interface
        raise NotImplementedError

    def close(self) -> None:  # pragma: no cover - interface
        raise NotImplementedError


class SQLiteRegistryDB(RegistryDB):
    """The registry's tables in the audit store's SQLite file."""

    dialect = "sqlite"

    def __init__(self, path: str, busy_timeout_s: float = 30.0) -> None:
        if path == ":memory:":
            raise ConfigurationError(
                "the material registry needs a file or server audit store, not :memory:"
            )
        self._lock = threading.RLock()
        self._conn = sqlite3.connect(
            path, isolation_level=None, check_same_thread=False, timeout=busy_timeout_s
        )
        self._conn.execute(f"PRAGMA busy_timeout={int(busy_timeout_s * 1000)}")
        self._conn.execute("PRAGMA synchronous=FULL")
        self.schema_version = self._migrate()
        # reads have a connection of their own: a write waiting for the database (locked by
        # another process) does not hold up retrieval, which only reads (WAL: readers go on)
        self._read_lock = threading.RLock()
        self._read_conn = sqlite3.connect(
            path, isolation_level=None, check_same_thread=False, timeout=busy_timeout_s
        )
        self._read_conn.execute(f"PRAGMA busy_timeout={int(busy_timeout_s * 1000)}")

    def _migrate(self) -> int:
        with self._lock, transaction(self._conn, "BEGIN IMMEDIATE") as cur:
            return _migrate(QmarkCursor(cur), self.dialect)

    @contextmanager
    def write(self) -> Iterator[Cursor]:
        with self._lock, transaction(self._conn, "BEGIN IMMEDIATE") as cur:
            yield cur

    @contextmanager
    def read(self) -> Iterator[Cursor]:
        with self._read_lock, transaction(self._read_conn, "BEGIN") as cur:
            yield cur

    def close(self) -> None:
        with self._lock, self._read_lock:
            self._conn.close()
            self._read_conn.close()


class _PgCursor:
    def __init__(self, cur: Any) -> None:
        self._cur = cur

    def execute(self, sql: str, params: Sequence[Any] = ()) -> Any:
        return self._cur.execute(sql.replace("?", "%s"), params or None)

    def fetchone(self) -> Any:
        return self._cur.fetchone()

    def fetchall(self) -> list[Any]:
        rows: list[Any] = self._cur.fetchall()
        return rows


class PostgresRegistryDB(RegistryDB):
    """The registry's tables in the audit store's PostgreSQL database and schema."""

    dialect = "postgres"

    def __init__(self, dsn: str, schema: str | None = None) -> None:
        from tracerag.store._postgres import connect

        self._dsn, self._schema = dsn, schema
        self._lock = threading.RLock()
        self._read_lock = threading.RLock()
        self._closed = False
        self._conn = connect(dsn, schema)
        with self._conn.transaction(), self._conn.cursor() as raw:
            raw.execute("SELECT pg_advisory_xact_lock(hashtext('tracerag.materials.schema'))")
            self.schema_version = _migrate(raw, self.dialect)
        # reads have a connection of their own: a write waiting for a lock does not hold them
        self._read_conn = connect(dsn, schema)

    def _connection(self, read: bool) -> Any:
        """A connection, made again when the server dropped the last one (an outage)."""
        from tracerag.store._postgres import connect

        conn = self._read_conn if read else self._conn
        if not self._closed and (conn.closed or conn.broken):
            conn = connect(self._dsn, self._schema)
            if read:
                self._read_conn = conn
            else:
                self._conn = conn
        return conn

    @contextmanager
    def write(self) -> Iterator[Cursor]:
        with self._lock:
            conn = self._connection(read=False)
            with conn.transaction(), conn.cursor() as raw:
                cur = _PgCursor(raw)
                cur.execute("SELECT generation FROM material_head WHERE id = 1 FOR UPDATE")
                yield cur

    @contextmanager
    def read(self) -> Iterator[Cursor]:
        with self._read_lock:
            conn = self._connection(read=True)
            with conn.transaction(), conn.cursor() as raw:
                yield _PgCursor(raw)

    def close(self) -> None:
        with self._lock, self._read_lock:
            self._closed = True
            self._conn.close()
            self._read_conn.close()


def _migrate(cur: Any, dialect: str) -> int:
    """Apply the registry's pending migrations (``cur`` takes ``format``-style parameters)."""
    return migrate(
        cur,
        dialect,
        MIGRATIONS,
        version_table="material_schema_version",
        schema="material registry",
        refuse=MaterialStoreError,
    )


class ChainCursor:
    """The cursor of a store's chained transaction (``SQLAuditStore.chained``), taking the
    registry's ``?`` parameters."""

    def __init__(self, cur: Any) -> None:
        self._cur = cur

    def execute(self, sql: str, params: Sequence[Any] = ()) -> Any:
        return self._cur.execute(sql.replace("?", "%s"), tuple(params))

    def fetchone(self) -> Any:
        return self._cur.fetchone()

    def fetchall(self) -> list[Any]:
        rows: list[Any] = self._cur.fetchall()
        return rows


def registry_present(store: Any) -> bool:
    """True when the database of an open audit store holds the registry's tables (checked
    without creating them)."""
    dsn = getattr(store, "dsn", None)
    if dsn:
        from tracerag.store._postgres import connect

        conn = connect(dsn, getattr(store, "schema", None))
        try:
            with conn.cursor() as cur:
                cur.execute("SELECT to_regclass('material_schema_version')")
                row = cur.fetchone()
            return bool(row and row[0])
        finally:
            conn.close()
    path = getattr(store, "path", None)
    if not path or path == ":memory:":
        return False
    conn2 = sqlite3.connect(path, timeout=30)
    try:
        row = conn2.execute(
            "SELECT 1 FROM sqlite_master WHERE type = 'table' AND name = 'material_schema_version'"
        ).fetchone()
        return row is not None
    finally:
        conn2.close()


def connect_like(store: Any) -> RegistryDB:
    """Registry tables in the same database as an open audit store."""
    dsn = getattr(store, "dsn", None)
    if dsn:
        return PostgresRegistryDB(dsn, getattr(store, "schema", None))
    path = getattr(store, "path", None)
    if path:
        return SQLiteRegistryDB(str(path))
    raise ConfigurationError(f"cannot find the database of {store!r} for the material registry")


__all__ = [
    "MIGRATIONS",
    "SCHEMA_VERSION",
    "ChainCursor",
    "MaterialStoreError",
    "PostgresRegistryDB",
    "RegistryDB",
    "SQLiteRegistryDB",
    "connect_like",
    "registry_present",
]
