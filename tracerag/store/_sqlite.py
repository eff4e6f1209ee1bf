"""The SQLite audit store: one file, created on first use unless told not to.

WAL journal, ``synchronous=FULL`` by default (a committed record survives power loss), and the
migrations of ``tracerag.store._migrations`` applied on open. Appends run in ``BEGIN IMMEDIATE``
transactions, so several processes may share the file; within a process one connection is
shared under a lock, so the store is safe to use from any thread. Every wait for a lock held
by another process is bounded by ``busy_timeout_s`` (default 5 s), after which the operation
fails (and the writer retries it). Plain ``UPDATE``/``DELETE`` on the log is refused by
triggers (defence in depth; the hash chain is what makes tampering evident).

``create=False`` opens only an existing audit store: a missing file, a file without the audit
tables, a directory or a file that is not a database raise ``StoreMissing``/``StoreError``.
While open, ``check()`` notices that the file was deleted or replaced (``StoreVanished``).
"""

from __future__ import annotations

import functools
import os
import re
import sqlite3
import threading
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from tracerag.errors import ConfigurationError
from tracerag.store import _migrations as migrations
from tracerag.store._base import StoreError, StoreMissing, StoreVanished
from tracerag.store._migrations import SCHEMA_VERSION
from tracerag.store._sql import Cursor, SQLAuditStore, _Head, opening

MIGRATIONS = migrations.MIGRATIONS
__all__ = ["MIGRATIONS", "SCHEMA_VERSION", "SQLiteAuditStore", "migrate", "schema_version"]

_FORMAT_TOKEN = re.compile(r"%[s%]")


@functools.lru_cache(maxsize=512)
def to_qmark(sql: str) -> str:
    """A ``format``-paramstyle statement in ``qmark`` style: ``%s`` → ``?``, ``%%`` → ``%``."""
    return _FORMAT_TOKEN.sub(lambda m: "?" if m.group(0) == "%s" else "%", sql)


class QmarkCursor:
    """An sqlite3 cursor taking the shared SQL's ``format``-style parameters."""

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


@contextmanager
def transaction(conn: sqlite3.Connection, begin: str = "BEGIN") -> Iterator[sqlite3.Cursor]:
    """A cursor in one transaction on an autocommit connection: committed when the block ends,
    rolled back when the block (or the commit) fails."""
    cur = conn.cursor()
    cur.execute(begin)
    try:
        yield cur
    except BaseException:
        cur.execute("ROLLBACK")
        raise
    else:
        try:
            cur.execute("COMMIT")
        except BaseException:
            if conn.in_transaction:
                cur.execute("ROLLBACK")
            raise
    finally:
        cur.close()


def schema_version(conn: sqlite3.Connection) -> int:
    """The schema version of an open database (0 for a new one)."""
    conn.execute(migrations.CREATE_SCHEMA_VERSION)
    row = conn.execute("SELECT MAX(version) FROM schema_version").fetchone()
    return int(row[0] or 0)


def _has_schema(conn: sqlite3.Connection) -> bool:
    row = conn.execute(
        "SELECT 1 FROM sqlite_master WHERE type = 'table' AND name = 'schema_version'"
    ).fetchone()
    return row is not None


def migrate(conn: sqlite3.Connection, target: int | None = None) -> int:
    """Apply pending migrations up to ``target`` (default: latest); returns the new version.

    ``conn`` must be in autocommit mode (``isolation_level=None``).
    """
    with transaction(conn, "BEGIN IMMEDIATE") as cur:
        return migrations.apply(QmarkCursor(cur), "sqlite", target)


class SQLiteAuditStore(SQLAuditStore):
    """The audit store in one SQLite file (or ``:memory:``)."""

    def __init__(
        self,
        path: str | Path = ".tracerag/audit.sqlite",
        *,
        auto_enqueue: bool = True,
        chain_key: str | bytes | None = None,
        synchronous: str = "FULL",
        busy_timeout_s: float = 5.0,
        create: bool = True,
    ) -> None:
        super().__init__(auto_enqueue=auto_enqueue, chain_key=chain_key)
        self.path = str(path)
        self._file_id: tuple[int, int] | None = None
        if self.path == ":memory:":
            create = True  # nothing to find, nothing left behind
        if self.path != ":memory:":
            target = Path(self.path).expanduser()
            self.path = str(target)
            if target.is_dir():
                raise StoreError(f"{self.path} is a directory, not an audit store file")
            if not create and not target.exists():
                raise StoreMissing(f"no audit store at {self.path} (the file does not exist)")
            if create:
                target.parent.mkdir(parents=True, exist_ok=True)
        self._lock = threading.RLock()
        try:
            self._conn = sqlite3.connect(
                self.path if create or self.path == ":memory:" else _uri(self.path, "rw"),
                isolation_level=None,
                check_same_thread=False,
                timeout=busy_timeout_s,
                uri=not create and self.path != ":memory:",
            )
        except sqlite3.Error as exc:
            raise StoreError(f"cannot open the SQLite audit store {self.path}: {exc}") from exc
        with opening(
            self._conn.close,
            sqlite3.DatabaseError,
            f"{self.path} is not a usable SQLite audit store",
        ):
            if self.path != ":memory:":
                mode = self._conn.execute("PRAGMA journal_mode=WAL").fetchone()[0]
                if str(mode).lower() != "wal":
                    raise StoreError(f"could not put {self.path} in WAL mode (got {mode})")
            if synchronous.upper() not in {"OFF", "NORMAL", "FULL", "EXTRA"}:
                raise ConfigurationError(f"unknown synchronous level {synchronous!r}")
            self._conn.execute(f"PRAGMA synchronous={synchronous.upper()}")
            self._conn.execute(f"PRAGMA busy_timeout={int(busy_timeout_s * 1000)}")
            self._conn.execute("PRAGMA foreign_keys=ON")
            if not create and not _has_schema(self._conn):
                raise StoreMissing(f"{self.path} holds no audit store (no audit tables)")
            self.schema_version = migrate(self._conn)
            if self.path != ":memory:":
                st = os.stat(self.path)
                self._file_id = (st.st_dev, st.st_ino)
        self._closed = False

    @contextmanager
    def _write(self) -> Iterator[tuple[Cursor, _Head]]:
        with self._lock:
            self._check_open()
            with transaction(self._conn, "BEGIN IMMEDIATE") as raw:
                cur = QmarkCursor(raw)
                yield cur, self._read_head(cur)

    @contextmanager
    def _read(self) -> Iterator[Cursor]:
        with self._lock:
            self._check_open()
            # one consistent snapshot for multi-query reads
            with transaction(self._conn) as raw:
                yield QmarkCursor(raw)

    @contextmanager
    def _snapshot(self) -> Iterator[Cursor]:
        if self.path == ":memory:":
            with self._read() as cur:
                yield cur
            return
        self._check_open()
        # A separate read-only connection: in WAL mode it reads a consistent snapshot while
        # this store's connection goes on writing.
        conn = sqlite3.connect(_uri(self.path, "ro"), uri=True, isolation_level=None)
        try:
            with transaction(conn) as raw:
                yield QmarkCursor(raw)
        finally:
            conn.close()

    def _check_open(self) -> None:
        if self._closed:
            raise StoreError("the audit store is closed")

    def interrupt(self) -> None:
        """Make the statement in progress fail now (``sqlite3.OperationalError``)."""
        self._conn.interrupt()

    def check(self) -> None:
        """Raise ``StoreVanished`` if the file was deleted or replaced since it was opened."""
        if self._file_id is None:
            return
        try:
            st = os.stat(self.path)
        except FileNotFoundError:
            raise StoreVanished(f"the audit store file {self.path} disappeared") from None
        if (st.st_dev, st.st_ino) != self._file_id:
            raise StoreVanished(f"the audit store file {self.path} was replaced by another file")

    @property
    def location(self) -> str:
        return self.path

    @property
    def closed(self) -> bool:
        """True once ``close()`` was called."""
        return self._closed

    def close(self) -> None:
        with self._lock:
            if not self._closed:
                self._closed = True
                self._conn.close()

    def __repr__(self) -> str:
        return f"SQLiteAuditStore({self.path!r})"


def _uri(path: str, mode: str) -> str:
    return Path(path).resolve().as_uri() + f"?mode={mode}"
