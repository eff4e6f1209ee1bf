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

import os
import threading
from collections.abc import Callable, Iterator
from contextlib import contextmanager, suppress
from typing import Any

from tracerag.store import _migrations as migrations
from tracerag.store._base import InvalidRecord, StoreError, StoreMissing
from tracerag.store._migrations import SCHEMA_VERSION
from tracerag.store._sql import Cursor, SQLAuditStore, _Head, opening

__all__ = ["MIGRATIONS", "SCHEMA_VERSION", "PostgresAuditStore", "connect", "migrate"]

try:  # psycopg is an optional dependency
    import psycopg
    from psycopg import sql as pgsql
except ImportError:  # pragma: no cover - exercised only without the extra
    psycopg = None  # type: ignore[assignment]
    pgsql = None  # type: ignore[assignment]

MIGRATIONS = migrations.MIGRATIONS

_MIGRATION_LOCK = "tracerag.audit.schema"


def _require_psycopg() -> None:
    if psycopg is None:
        raise StoreError(
            "the PostgreSQL audit store needs psycopg 3: from the tracerag source tree, "
            'pip install ".[postgres]"'
        )


def migrate(conn: Any, target: int | None = None) -> int:
    """Apply pending migrations up to ``target`` (default: latest); returns the new version.

    ``conn`` is an autocommit psycopg connection whose search_path selects the schema.
    """
    with conn.transaction(), conn.cursor() as cur:
        cur.execute(
            "SELECT pg_advisory_xact_lock(hashtext(coalesce(current_schema(), '') || %s))",
            (_MIGRATION_LOCK,),
        )
        return migrations.apply(cur, "postgres", target)


def _has_schema(conn: Any) -> bool:
    row = conn.execute("SELECT to_regclass('schema_version') IS NOT NULL").fetchone()
    return bool(row and row[0])


def connect(
    dsn: str,
    schema: str | None = None,
    connect_timeout: float = 5.0,
    statement_timeout: float = 5.0,
) -> Any:
    """An autocommit psycopg connection with bounded waits, its search_path set to ``schema``.

    ``connect_timeout`` bounds connecting; ``statement_timeout`` bounds each statement and each
    lock wait on the server; TCP keepalives and ``tcp_user_timeout`` notice a dead peer.
    """
    _require_psycopg()
    conn = psycopg.connect(
        dsn,
        autocommit=True,
        connect_timeout=max(1, int(connect_timeout)),
        keepalives=1,
        keepalives_idle=5,
        keepalives_interval=2,
        keepalives_count=3,
        tcp_user_timeout=int(max(1.0, connect_timeout + statement_timeout) * 1000),
    )
    millis = str(int(statement_timeout * 1000))
    conn.execute("SELECT set_config('statement_timeout', %s, false)", (millis,))
    conn.execute("SELECT set_config('lock_timeout', %s, false)", (millis,))
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
        self._busy: set[Any] = set()
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
        with self._cond:
            self._busy.add(conn)
        ok = False
        try:
            yield conn
            ok = True
        finally:
            with self._cond:
                self._busy.discard(conn)
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

    def interrupt(self) -> None:
        """Shut down the sockets of the connections in use; their waits end with an error."""
        import socket

        with self._cond:
            busy = list(self._busy)
        for conn in busy:
            with suppress(Exception):
                sock = socket.socket(fileno=os.dup(conn.pgconn.socket))
                try:
                    sock.shutdown(socket.SHUT_RDWR)
                finally:
                    sock.close()

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
    networked = True

    def __init__(
        self,
        dsn: str,
        *,
        schema: str | None = None,
        auto_enqueue: bool = True,
        chain_key: str | bytes | None = None,
        max_connections: int = 8,
        connect_timeout: float = 5.0,
        statement_timeout: float = 5.0,
        create: bool = True,
    ) -> None:
        _require_psycopg()
        super().__init__(auto_enqueue=auto_enqueue, chain_key=chain_key)
        self.dsn = dsn
        self.schema = schema
        self._pool = _Pool(
            lambda: connect(dsn, schema, connect_timeout, statement_timeout), max_connections
        )
        with (
            opening(self._pool.close, psycopg.Error, "cannot open the PostgreSQL audit store"),
            self._pool.connection() as conn,
        ):
            if not create and not _has_schema(conn):
                raise StoreMissing(
                    f"no audit store in {self.location} (the audit tables do not exist)"
                )
            self.schema_version = migrate(conn)

    @property
    def location(self) -> str:
        """The database, without credentials."""
        try:
            info = psycopg.conninfo.conninfo_to_dict(self.dsn)
        except Exception:
            return "<postgresql>"
        where = (
            f"postgresql://{info.get('host', '')}:{info.get('port', '')}/{info.get('dbname', '')}"
        )
        return where + (f" schema {self.schema}" if self.schema else "")

    def interrupt(self) -> None:
        """Break the connections in use (a hung server): their operations fail at once."""
        self._pool.interrupt()

    @contextmanager
    def _write(self) -> Iterator[tuple[Cursor, _Head]]:
        with self._pool.connection() as conn, conn.transaction(), conn.cursor() as cur:
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
        with self._pool.connection() as conn, conn.transaction(), conn.cursor() as cur:
            # one snapshot for multi-query reads (verification, metrics)
            cur.execute("SET TRANSACTION ISOLATION LEVEL REPEATABLE READ READ ONLY")
            yield cur

    @property
    def closed(self) -> bool:
        """True once ``close()`` was called."""
        return self._pool._closed

    def close(self) -> None:
        self._pool.close()

    def __repr__(self) -> str:
        schema = f", schema={self.schema!r}" if self.schema else ""
        return f"PostgresAuditStore(<dsn>{schema})"
