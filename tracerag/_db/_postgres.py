"""PostgreSQL connections (psycopg 3, the ``postgres`` extra): bounded waits, a small pool.

``connect`` opens an autocommit connection whose every wait is bounded (connecting, each
statement, each lock, a dead peer) with its ``search_path`` set to a schema. ``Pool`` hands out
connections to threads and drops broken ones. ``PostgresDB`` runs transactions on a pool, with a
pool of its own for reads when asked (a writer waiting on a lock holds up no reader).
"""

from __future__ import annotations

import os
import socket
import threading
from collections.abc import Callable, Iterator
from contextlib import AbstractContextManager, contextmanager, suppress
from types import ModuleType
from typing import Any

from tracerag._db._dialect import Cursor, Dialect, FormatCursor, Paramstyle
from tracerag._db._versions import Schema
from tracerag.errors import ConfigurationError

Connection = Any  # a psycopg.Connection (psycopg may be absent)


def _psycopg() -> ModuleType:
    # psycopg is the optional ``postgres`` extra, imported on first use: importing this module
    # (as every user of the layer does) loads no driver for a SQLite deployment
    try:
        import psycopg
    except ImportError:  # pragma: no cover - exercised only without the extra
        raise ConfigurationError(
            'PostgreSQL needs psycopg 3: from the tracerag source tree, pip install ".[postgres]"'
        ) from None
    return psycopg


def connect(
    dsn: str,
    schema: str | None = None,
    connect_timeout: float = 5.0,
    statement_timeout: float = 5.0,
) -> Connection:
    """An autocommit psycopg connection with bounded waits, its search_path set to ``schema``.

    ``connect_timeout`` bounds connecting; ``statement_timeout`` bounds each statement and each
    lock wait on the server; TCP keepalives and ``tcp_user_timeout`` notice a dead peer.
    """
    psycopg = _psycopg()
    pgsql = psycopg.sql
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
    try:
        millis = str(int(statement_timeout * 1000))
        conn.execute("SELECT set_config('statement_timeout', %s, false)", (millis,))
        conn.execute("SELECT set_config('lock_timeout', %s, false)", (millis,))
        if schema:
            name = pgsql.Identifier(schema)
            # another instance may create it at the same moment (IF NOT EXISTS races)
            with suppress(psycopg.errors.UniqueViolation):
                conn.execute(pgsql.SQL("CREATE SCHEMA IF NOT EXISTS {}").format(name))
            conn.execute(pgsql.SQL("SET search_path TO {}").format(name))
    except BaseException:
        conn.close()  # a connection that is not set up is not handed out, nor left open
        raise
    return conn


def migrate(conn: Connection, schema: Schema, target: int | None = None) -> int:
    """Apply ``schema``'s pending migrations under its transaction-scoped advisory lock, so
    instances starting together do not race; the new version."""
    where = "coalesce(current_schema(), '') || %s" if schema.lock_per_schema else "%s"
    with conn.transaction(), conn.cursor() as cur:
        cur.execute(f"SELECT pg_advisory_xact_lock(hashtext({where}))", (schema.lock,))
        return schema.apply(cur, "postgres", target)


def has_table(conn: Connection, name: str) -> bool:
    """True when ``name`` is a table on the connection's search_path."""
    row = conn.execute("SELECT to_regclass(%s) IS NOT NULL", (name,)).fetchone()
    return bool(row and row[0])


class Pool:
    """A small thread-safe connection pool; broken connections are discarded."""

    def __init__(
        self,
        factory: Callable[[], Connection],
        max_size: int,
        closed_error: Callable[[], Exception],
    ) -> None:
        self._factory = factory
        self._max = max_size
        self._closed_error = closed_error
        self._idle: list[Connection] = []
        self._busy: set[Connection] = set()
        self._size = 0
        self._cond = threading.Condition()
        self._closed = False

    @property
    def closed(self) -> bool:
        return self._closed

    @contextmanager
    def connection(self) -> Iterator[Connection]:
        with self._cond:
            while True:
                if self._closed:
                    raise self._closed_error()
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
                broken = conn.info.transaction_status != _psycopg().pq.TransactionStatus.IDLE
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


class PostgresDB:
    """Transactions on one PostgreSQL database and schema, safe from any thread.

    ``write()`` and ``read()`` give a cursor in a transaction, on a pool of ``max_connections``
    (reads on a pool of their own with ``separate_reads``). After ``close()`` a transaction
    makes a new pool with ``reopen`` (an app started again); otherwise, and for a transaction
    that was starting on the pool being closed, it raises ``closed_error()``.
    """

    dialect: Dialect = "postgres"

    def __init__(
        self,
        factory: Callable[[], Connection],
        *,
        max_connections: int,
        closed_error: Callable[[], Exception],
        reopen: bool = False,
        separate_reads: bool = False,
        paramstyle: Paramstyle = "format",
    ) -> None:
        def new_pool() -> Pool:
            return Pool(factory, max_connections, closed_error)

        self._new_pool = new_pool
        self._reopen = reopen
        self._qmark = paramstyle == "qmark"
        self._lock = threading.Lock()
        self._writer: Pool | None = new_pool()
        self._reader: Pool | None = new_pool() if separate_reads else None
        self._separate = separate_reads

    @property
    def closed(self) -> bool:
        """True after ``close()`` (until a reopening transaction)."""
        pool = self._writer
        return pool is None or pool.closed

    def _pools(self) -> tuple[Pool, Pool]:
        with self._lock:
            if self._writer is None:  # closed with ``reopen``: a new start
                self._writer = self._new_pool()
                self._reader = self._new_pool() if self._separate else None
            return self._writer, self._reader or self._writer

    def connection(self, *, read: bool = False) -> AbstractContextManager[Connection]:
        """A connection of the pool (for reads, of the read pool)."""
        writer, reader = self._pools()
        return (reader if read else writer).connection()

    @contextmanager
    def _transaction(self, read: bool) -> Iterator[Cursor]:
        with self.connection(read=read) as conn, conn.transaction(), conn.cursor() as raw:
            yield FormatCursor(raw) if self._qmark else raw

    def write(self) -> AbstractContextManager[Cursor]:
        """A cursor in a transaction that may write."""
        return self._transaction(read=False)

    def read(self) -> AbstractContextManager[Cursor]:
        """A cursor in a transaction for reads."""
        return self._transaction(read=True)

    def migrate(self, schema: Schema, target: int | None = None) -> int:
        """Apply ``schema``'s pending migrations; the new version."""
        with self.connection() as conn:
            return migrate(conn, schema, target)

    def interrupt(self) -> None:
        """Break the connections in use (a hung server): their operations fail at once."""
        for pool in (self._writer, self._reader):
            if pool is not None:
                pool.interrupt()

    def close(self) -> None:
        with self._lock:
            pools = [p for p in (self._writer, self._reader) if p is not None]
            if self._reopen:
                self._writer = self._reader = None
        for pool in pools:
            pool.close()
