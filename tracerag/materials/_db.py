"""The registry's own tables, beside the audit store's in the same database.

``connect_like(store)`` opens the database an open audit store uses (the SQLite file, or the
PostgreSQL DSN and schema; connections are ``tracerag._db``'s) and applies the registry's
migrations, kept in their own ``material_schema_version`` table. Registry writes are
serialised: SQLite by ``BEGIN IMMEDIATE``, PostgreSQL by locking the one ``material_head`` row.
Reads have a connection of their own: a write waiting for the database does not hold up
retrieval, which only reads.
"""

from __future__ import annotations

import sqlite3
from collections.abc import Iterator
from contextlib import AbstractContextManager, contextmanager

from tracerag._db import (
    Cursor,
    Database,
    PostgresDB,
    PostgresSchema,
    Schema,
    SQLiteDB,
    Step,
    locate,
)
from tracerag._db import FormatCursor as ChainCursor
from tracerag._db import _postgres as postgres
from tracerag._db import _sqlite as sqlite
from tracerag.errors import ConfigurationError, TraceragError


class MaterialStoreError(TraceragError):
    """The material registry failed or refused an operation."""


#: the registry's migrations (``tracerag._db._versions``' format)
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

REGISTRY = Schema(
    name="material registry",
    version_table="material_schema_version",
    migrations=MIGRATIONS,
    refuse=MaterialStoreError,
    lock="tracerag.materials.schema",
    lock_per_schema=False,
)


def _closed() -> MaterialStoreError:
    return MaterialStoreError("the material registry is closed")


class RegistryDB:
    """Transactions on the registry's tables: ``write()`` and ``read()`` give a cursor taking
    ``?`` parameters; a write holds the registry's lock (SQLite ``BEGIN IMMEDIATE``,
    PostgreSQL the ``material_head`` row)."""

    def __init__(self, db: Database) -> None:
        self._db = db
        self.dialect = db.dialect
        self.schema_version = db.migrate(REGISTRY)

    @contextmanager
    def write(self) -> Iterator[Cursor]:
        with self._db.write() as cur:
            if self.dialect == "postgres":
                cur.execute("SELECT generation FROM material_head WHERE id = 1 FOR UPDATE")
            yield cur

    def read(self) -> AbstractContextManager[Cursor]:
        return self._db.read()

    def close(self) -> None:
        self._db.close()


def _sqlite_db(path: str, busy_timeout_s: float = 30.0) -> SQLiteDB:
    def opener() -> sqlite3.Connection:
        return sqlite.open_file(path, busy_timeout_s=busy_timeout_s, synchronous="FULL")

    return SQLiteDB(opener, closed_error=_closed, separate_reads=True, paramstyle="qmark")


def _postgres_db(where: PostgresSchema) -> PostgresDB:
    return PostgresDB(
        lambda: postgres.connect(where.dsn, where.schema),
        max_connections=1,  # one writer (the head row serialises them anyway), one reader
        separate_reads=True,
        closed_error=_closed,
        paramstyle="qmark",
    )


def registry_present(store: object) -> bool:
    """True when the database of an open audit store holds the registry's tables (checked
    without creating them)."""
    where = locate(store)
    if isinstance(where, PostgresSchema):
        conn = postgres.connect(where.dsn, where.schema)
        try:
            return postgres.has_table(conn, "material_schema_version")
        finally:
            conn.close()
    if where is None:
        return False
    conn2 = sqlite.connect(where.path, busy_timeout_s=30.0)
    try:
        row = conn2.execute(
            "SELECT 1 FROM sqlite_master WHERE type = 'table' AND name = 'material_schema_version'"
        ).fetchone()
        return row is not None
    finally:
        conn2.close()


def connect_like(store: object) -> RegistryDB:
    """Registry tables in the same database as an open audit store."""
    where = locate(store)
    if isinstance(where, PostgresSchema):
        return RegistryDB(_postgres_db(where))
    if where is not None:
        return RegistryDB(_sqlite_db(where.path))
    if getattr(store, "path", None) == ":memory:":
        raise ConfigurationError(
            "the material registry needs a file or server audit store, not :memory:"
        )
    raise ConfigurationError(f"cannot find the database of {store!r} for the material registry")


__all__ = [
    "MIGRATIONS",
    "REGISTRY",
    "SCHEMA_VERSION",
    "ChainCursor",
    "Cursor",
    "MaterialStoreError",
    "RegistryDB",
    "connect_like",
    "registry_present",
]
