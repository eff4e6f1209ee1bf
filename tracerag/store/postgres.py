"""The PostgreSQL audit store (psycopg 3; install the ``postgres`` extra).

Several application instances may share one database. Every write transaction first locks the
single ``chain_head`` row (``SELECT ... FOR UPDATE``), so appends from all instances are
serialised and the hash chain stays linear; reviewers claim items with
``FOR UPDATE SKIP LOCKED`` (since every claim also appends to the chain, claims are serialised by
the head lock as well; SKIP LOCKED keeps an item from being handed out twice regardless).
Migrations run under a transaction-scoped advisory lock, so instances starting together do not
race. ``schema=`` keeps the tables in their own schema
(created if missing); otherwise the connection's ``search_path`` decides, which can also be set
in the URL (``?options=-csearch_path%3Dmyschema``).
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager, suppress
from typing import Any

from tracerag.store.base import (
    Cursor,
    InvalidRecord,
    SchemaTooNew,
    SQLAuditStore,
    StoreError,
    _Head,
    now_iso,
)
from tracerag.store.chain import GENESIS_HASH

try:  # psycopg is an optional dependency
    import psycopg
    from psycopg import sql as pgsql
except ImportError:  # pragma: no cover - exercised only without the extra
    psycopg = None  # type: ignore[assignment]
    pgsql = None  # type: ignore[assignment]

MIGRATIONS: list[tuple[int, list[str]]] = [
    (
        1,
        [
            """CREATE TABLE audit_entries (
                seq BIGINT PRIMARY KEY,
                request_id TEXT NOT NULL,
                kind TEXT NOT NULL,
                payload TEXT NOT NULL,
                actor TEXT NOT NULL,
                created_at TEXT NOT NULL,
                prev_hash TEXT NOT NULL,
                hash TEXT NOT NULL UNIQUE
            )""",
            "CREATE INDEX audit_entries_request ON audit_entries (request_id, seq)",
            """CREATE TABLE chain_head (
                id INTEGER PRIMARY KEY CHECK (id = 1),
                last_seq BIGINT NOT NULL,
                last_hash TEXT NOT NULL
            )""",
            f"INSERT INTO chain_head (id, last_seq, last_hash) VALUES (1, 0, '{GENESIS_HASH}')",
            """CREATE TABLE requests (
                request_id TEXT PRIMARY KEY,
                trace_id TEXT,
                created_at TEXT NOT NULL,
                question TEXT,
                first_seq BIGINT NOT NULL,
                n_entries INTEGER NOT NULL
            )""",
            "CREATE INDEX requests_created ON requests (created_at)",
        ],
    ),
    (
        2,
        [
            "ALTER TABLE requests ADD COLUMN decision TEXT",
            "ALTER TABLE requests ADD COLUMN confidence DOUBLE PRECISION",
            "ALTER TABLE requests ADD COLUMN tier TEXT",
            "ALTER TABLE requests ADD COLUMN channel TEXT",
            """UPDATE requests r SET
                decision = resp.payload::jsonb ->> 'decision',
                confidence = CASE WHEN jsonb_typeof(resp.payload::jsonb -> 'confidence') = 'number'
                             THEN (resp.payload::jsonb ->> 'confidence')::double precision END
               FROM audit_entries resp
               WHERE resp.request_id = r.request_id AND resp.kind = 'response'""",
            """UPDATE requests r SET
                tier = reg.payload::jsonb ->> 'tier',
                channel = reg.payload::jsonb ->> 'channel'
               FROM audit_entries reg
               WHERE reg.request_id = r.request_id AND reg.kind = 'register'""",
            "CREATE INDEX requests_decision ON requests (decision, created_at)",
            """CREATE TABLE review_queue (
                request_id TEXT PRIMARY KEY REFERENCES requests (request_id),
                route TEXT NOT NULL,
                priority INTEGER NOT NULL,
                reason TEXT NOT NULL,
                status TEXT NOT NULL CHECK (status IN ('pending', 'claimed', 'decided')),
                enqueued_seq BIGINT NOT NULL,
                enqueued_at TEXT NOT NULL,
                claimed_by TEXT,
                claimed_at TEXT,
                decided_by TEXT,
                decided_at TEXT,
                action TEXT,
                final_answer TEXT,
                decision_reason TEXT
            )""",
            "CREATE INDEX review_queue_next ON review_queue (status, priority, enqueued_seq)",
            """CREATE FUNCTION tracerag_append_only() RETURNS trigger LANGUAGE plpgsql AS $$
               BEGIN RAISE EXCEPTION 'audit entries are append-only'; END $$""",
            """CREATE TRIGGER audit_entries_append_only BEFORE UPDATE OR DELETE ON audit_entries
               FOR EACH ROW EXECUTE FUNCTION tracerag_append_only()""",
        ],
    ),
]
SCHEMA_VERSION = MIGRATIONS[-1][0]

_MIGRATION_LOCK = "tracerag.audit.schema"


def _require_psycopg() -> None:
    if psycopg is None:
        raise StoreError(
            "the PostgreSQL audit store needs psycopg 3: from the tracerag source tree, "
            'pip install ".[postgres]"'
        )


class _PgCursor:
    """A psycopg cursor that takes the shared SQL's ``?`` placeholders."""

    def __init__(self, cur: Any) -> None:
        self._cur = cur

    def execute(self, sql: str, params: Sequence[Any] = ()) -> Any:
        return self._cur.execute(sql.replace("?", "%s"), params or None)

    def fetchone(self) -> Any:
        return self._cur.fetchone()

    def fetchall(self) -> list[Any]:
        return self._cur.fetchall()


def migrate(conn: Any, target: int | None = None) -> int:
    """Apply pending migrations up to ``target`` (default: latest); returns the new version.

    ``conn`` is an autocommit psycopg connection whose search_path selects the schema.
    """
    target = SCHEMA_VERSION if target is None else target
    with conn.transaction(), conn.cursor() as cur:
        cur.execute(
            "SELECT pg_advisory_xact_lock(hashtext(coalesce(current_schema(), '') || %s))",
            (_MIGRATION_LOCK,),
        )
        cur.execute(
            "CREATE TABLE IF NOT EXISTS schema_version "
            "(version INTEGER PRIMARY KEY, applied_at TEXT NOT NULL)"
        )
        cur.execute("SELECT MAX(version) FROM schema_version")
        current = int(cur.fetchone()[0] or 0)
        if current > SCHEMA_VERSION:
            raise SchemaTooNew(
                f"audit database schema version {current} is newer than this tracerag "
                f"supports ({SCHEMA_VERSION}); upgrade tracerag"
            )
        for version, statements in MIGRATIONS:
            if current < version <= target:
                for statement in statements:
                    cur.execute(statement)
                cur.execute(
                    "INSERT INTO schema_version (version, applied_at) VALUES (%s, %s)",
                    (version, now_iso()),
                )
                current = version
    return current


def connect(dsn: str, schema: str | None = None, connect_timeout: float = 10.0) -> Any:
    """An autocommit psycopg connection, its search_path set to ``schema`` when given."""
    _require_psycopg()
    conn = psycopg.connect(dsn, autocommit=True, connect_timeout=max(1, int(connect_timeout)))
    if schema:
        conn.execute(pgsql.SQL("CREATE SCHEMA IF NOT EXISTS {}").format(pgsql.Identifier(schema)))
        conn.execute(pgsql.SQL("SET search_path TO {}").format(pgsql.Identifier(schema)))
    return conn


class _Pool:
    """A small thread-safe connection pool; broken connections are discarded."""

    def __init__(self, factory: Callable[[], Any], max_size: int) -> None:
        self._factory = factory
        self._max = max_size
        self._idle: list[Any] = []
        self._size = 0
        self._cond = threading.Condition()
        self._closed = False

    @contextmanager
    def connection(self) -> Iterator[Any]:
        with self._cond:
            while True:
                if self._closed:
                    raise StoreError("the audit store is closed")
                if self._idle:
                    conn = self._idle.pop()
                    break
                if self._size < self._max:
                    self._size += 1
                    conn = None
                    break
                self._cond.wait()
        if conn is None:
            try:
                conn = self._factory()
            except BaseException:
                with self._cond:
                    self._size -= 1
                    self._cond.notify()
                raise
        ok = False
        try:
            yield conn
            ok = True
        finally:
            broken = conn.closed or getattr(conn, "broken", False)
            if not ok and not broken:
                # after an error, keep the connection only if it is idle and usable
                broken = conn.info.transaction_status != psycopg.pq.TransactionStatus.IDLE
            with self._cond:
                if broken or self._closed:
                    self._size -= 1
                    with suppress(Exception):
                        conn.close()
                else:
                    self._idle.append(conn)
                self._cond.notify()

    def close(self) -> None:
        with self._cond:
            self._closed = True
            idle, self._idle = self._idle, []
            self._size -= len(idle)
            self._cond.notify_all()
        for conn in idle:
            with suppress(Exception):
                conn.close()


class PostgresAuditStore(SQLAuditStore):
    """The audit store in a PostgreSQL database, safe for several writers at once."""

    claim_lock_clause = "FOR UPDATE SKIP LOCKED"
    row_lock_clause = "FOR UPDATE"

    def __init__(
        self,
        dsn: str,
        *,
        schema: str | None = None,
        auto_enqueue: bool = True,
        max_connections: int = 8,
        connect_timeout: float = 10.0,
    ) -> None:
        _require_psycopg()
        super().__init__(auto_enqueue=auto_enqueue)
        self.dsn = dsn
        self.schema = schema
        self._pool = _Pool(lambda: connect(dsn, schema, connect_timeout), max_connections)
        with self._pool.connection() as conn:
            self.schema_version = migrate(conn)

    @contextmanager
    def _write(self) -> Iterator[tuple[Cursor, _Head]]:
        with self._pool.connection() as conn, conn.transaction(), conn.cursor() as raw:
            cur = _PgCursor(raw)
            cur.execute("SELECT last_seq, last_hash FROM chain_head WHERE id = 1 FOR UPDATE")
            row = cur.fetchone()
            if row is None:
                raise StoreError("the audit store has no chain head row")
            try:
                yield cur, _Head(int(row[0]), str(row[1]))
            except psycopg.DataError as exc:  # e.g. a NUL character in a text value
                raise InvalidRecord(f"PostgreSQL refused the data: {exc}") from exc

    @contextmanager
    def _read(self) -> Iterator[Cursor]:
        with self._pool.connection() as conn, conn.transaction(), conn.cursor() as raw:
            # one snapshot for multi-query reads (verification, metrics)
            raw.execute("SET TRANSACTION ISOLATION LEVEL REPEATABLE READ READ ONLY")
            yield _PgCursor(raw)

    def close(self) -> None:
        self._pool.close()

    def __repr__(self) -> str:
        schema = f", schema={self.schema!r}" if self.schema else ""
        return f"PostgresAuditStore(<dsn>{schema})"
