"""The SQLite audit store: one file, created on first use unless told not to.

WAL journal, ``synchronous=FULL`` by default (a committed record survives power loss), and the
migrations of ``tracerag.store._migrations`` applied on open. Appends run in ``BEGIN IMMEDIATE``
transactions, so several processes may share the file; within a process one connection is
shared under a lock, so the store is safe to use from any thread. Every wait for a lock held
by another process is bounded by ``busy_timeout_s`` (default 5 s), after which the operation
fails (and the writer retries it). Plain ``UPDATE``/``DELETE`` on the log is refused by
triggers (defence in depth; the hash chain is what makes tampering evident). The connections,
pragmas and transactions are ``tracerag._db``'s.

``create=False`` opens only an existing audit store: a missing file, a file without the audit
tables, a directory or a file that is not a database raise ``StoreMissing``/``StoreError``.
While open, ``check()`` notices that the file was deleted or replaced (``StoreVanished``).
"""

from __future__ import annotations

import os
import sqlite3
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

from tracerag._db import SQLiteDB
from tracerag._db import _sqlite as sqlite
from tracerag.store import _migrations as migrations
from tracerag.store._base import StoreError, StoreMissing, StoreVanished
from tracerag.store._migrations import SCHEMA_VERSION
from tracerag.store._sql import Cursor, SQLAuditStore, _Head, opening

MIGRATIONS = migrations.MIGRATIONS
__all__ = ["MIGRATIONS", "SCHEMA_VERSION", "SQLiteAuditStore", "migrate", "schema_version"]


def schema_version(conn: sqlite3.Connection) -> int:
    """The schema version of an open database (0 for a new one)."""
    conn.execute(migrations.CREATE_SCHEMA_VERSION)
    row = conn.execute("SELECT MAX(version) FROM schema_version").fetchone()
    return int(row[0] or 0)


def _has_schema(cur: Cursor) -> bool:
    cur.execute("SELECT 1 FROM sqlite_master WHERE type = 'table' AND name = 'schema_version'")
    return cur.fetchone() is not None


def migrate(conn: sqlite3.Connection, target: int | None = None) -> int:
    """Apply pending migrations up to ``target`` (default: latest); returns the new version.

    ``conn`` must be in autocommit mode (``isolation_level=None``).
    """
    return sqlite.migrate(conn, migrations.AUDIT, target)


def _closed() -> StoreError:
    return StoreError("the audit store is closed")


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
        self._busy_timeout_s = busy_timeout_s
        self._file_id: tuple[int, int] | None = None
        memory = self.path == ":memory:"
        if memory:
            create = True  # nothing to find, nothing left behind
        else:
            target = Path(self.path).expanduser()
            self.path = str(target)
            if target.is_dir():
                raise StoreError(f"{self.path} is a directory, not an audit store file")
            if not create and not target.exists():
                raise StoreMissing(f"no audit store at {self.path} (the file does not exist)")
            if create:
                target.parent.mkdir(parents=True, exist_ok=True)
        self._db = SQLiteDB(
            lambda: self._connect(synchronous, create=create),
            closed_error=_closed,
        )
        with opening(
            self._db.close, sqlite3.DatabaseError, f"{self.path} is not a usable SQLite audit store"
        ):
            if not create:
                with self._db.read() as cur:
                    if not _has_schema(cur):
                        raise StoreMissing(f"{self.path} holds no audit store (no audit tables)")
            self.schema_version = self._db.migrate(migrations.AUDIT)
            if not memory:
                st = os.stat(self.path)
                self._file_id = (st.st_dev, st.st_ino)

    def _connect(self, synchronous: str, *, create: bool) -> sqlite3.Connection:
        """The store's connection: WAL (a file), ``synchronous``, bounded busy waits."""
        memory = self.path == ":memory:"
        try:
            conn = sqlite.connect(
                self.path, busy_timeout_s=self._busy_timeout_s, mode="rwc" if create else "rw"
            )
        except sqlite3.Error as exc:
            raise StoreError(f"cannot open the SQLite audit store {self.path}: {exc}") from exc
        with opening(
            conn.close, sqlite3.DatabaseError, f"{self.path} is not a usable SQLite audit store"
        ):
            mode = sqlite.configure(
                conn,
                busy_timeout_s=self._busy_timeout_s,
                synchronous=synchronous,
                wal=not memory,
                foreign_keys=True,
            )
            if not memory and mode != "wal":
                raise StoreError(f"could not put {self.path} in WAL mode (got {mode})")
        return conn

    @contextmanager
    def _write(self) -> Iterator[tuple[Cursor, _Head]]:
        with self._db.write() as cur:
            yield cur, self._read_head(cur)

    @contextmanager
    def _read(self) -> Iterator[Cursor]:
        # one consistent snapshot for multi-query reads
        with self._db.read() as cur:
            yield cur

    @contextmanager
    def _snapshot(self) -> Iterator[Cursor]:
        if self.path == ":memory:":
            with self._read() as cur:
                yield cur
            return
        self._check_open()
        # a connection of its own: it reads one snapshot while this store's goes on writing
        with sqlite.read_only(self.path, busy_timeout_s=self._busy_timeout_s) as cur:
            yield cur

    def _check_open(self) -> None:
        if self._db.closed:
            raise _closed()

    def interrupt(self) -> None:
        """Make the statement in progress fail now (``sqlite3.OperationalError``)."""
        self._db.interrupt()

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
        return self._db.closed

    def close(self) -> None:
        self._db.close()

    def __repr__(self) -> str:
        return f"SQLiteAuditStore({self.path!r})"
