"""SQLite connections: opened with a bounded busy wait, used one transaction at a time.

``connect`` opens a file in autocommit mode (``mode="rw"``: only an existing file), ``configure``
sets the pragmas (WAL, ``synchronous``, busy timeout, foreign keys), ``transaction`` runs a block
in ``BEGIN``/``BEGIN IMMEDIATE``. ``SQLiteDB`` shares a connection between threads under a lock,
optionally with a second one for reads (a writer waiting on another process holds up no reader).
"""

from __future__ import annotations

import sqlite3
import threading
from collections.abc import Callable, Iterator
from contextlib import AbstractContextManager, ExitStack, contextmanager
from pathlib import Path
from typing import Literal

from tracerag._db._dialect import Cursor, Dialect, Paramstyle, QmarkCursor
from tracerag._db._versions import Schema
from tracerag.errors import ConfigurationError

Mode = Literal["rwc", "rw", "ro"]
SYNCHRONOUS = ("OFF", "NORMAL", "FULL", "EXTRA")


def connect(path: str, *, busy_timeout_s: float, mode: Mode = "rwc") -> sqlite3.Connection:
    """An autocommit connection usable from any thread; ``rw``/``ro`` open only an existing
    file (``ro``: read-only). ``:memory:`` is always created."""
    uri = mode != "rwc" and path != ":memory:"
    return sqlite3.connect(
        Path(path).resolve().as_uri() + f"?mode={mode}" if uri else path,
        isolation_level=None,
        check_same_thread=False,
        timeout=busy_timeout_s,
        uri=uri,
    )


def configure(
    conn: sqlite3.Connection,
    *,
    busy_timeout_s: float,
    synchronous: str | None = None,
    wal: bool = False,
    foreign_keys: bool = False,
) -> str:
    """Set a connection's pragmas; returns the journal mode (``wal`` once WAL is on).

    Raises ``ConfigurationError`` for an unknown ``synchronous`` level.
    """
    mode = ""
    if wal:
        mode = str(conn.execute("PRAGMA journal_mode=WAL").fetchone()[0]).lower()
    if synchronous is not None:
        if synchronous.upper() not in SYNCHRONOUS:
            raise ConfigurationError(f"unknown synchronous level {synchronous!r}")
        conn.execute(f"PRAGMA synchronous={synchronous.upper()}")
    conn.execute(f"PRAGMA busy_timeout={int(busy_timeout_s * 1000)}")
    if foreign_keys:
        conn.execute("PRAGMA foreign_keys=ON")
    return mode


def open_file(
    path: str, *, busy_timeout_s: float, synchronous: str | None = None
) -> sqlite3.Connection:
    """``connect`` then ``configure``; the connection is closed when configuring fails."""
    conn = connect(path, busy_timeout_s=busy_timeout_s)
    try:
        configure(conn, busy_timeout_s=busy_timeout_s, synchronous=synchronous)
    except BaseException:
        conn.close()
        raise
    return conn


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


@contextmanager
def read_only(path: str, *, busy_timeout_s: float) -> Iterator[QmarkCursor]:
    """A cursor in a read transaction on a connection of its own, closed afterwards: in WAL
    mode it reads one consistent snapshot while other connections go on writing."""
    conn = connect(path, busy_timeout_s=busy_timeout_s, mode="ro")
    try:
        with transaction(conn) as raw:
            yield QmarkCursor(raw)
    finally:
        conn.close()


def migrate(conn: sqlite3.Connection, schema: Schema, target: int | None = None) -> int:
    """Apply ``schema``'s pending migrations under ``BEGIN IMMEDIATE``; the new version."""
    with transaction(conn, "BEGIN IMMEDIATE") as cur:
        return schema.apply(QmarkCursor(cur), "sqlite", target)


class _Slot:
    """One connection and the lock its users take turns under."""

    def __init__(self, conn: sqlite3.Connection) -> None:
        self.conn: sqlite3.Connection | None = conn
        self.lock = threading.RLock()


class SQLiteDB:
    """Transactions on one SQLite database, safe from any thread.

    ``write()`` runs in ``BEGIN IMMEDIATE`` (serialised with every other writer of the file),
    ``read()`` in ``BEGIN``, on a second connection with ``separate_reads``. Connections come
    from ``opener`` (at once, so a failure to open surfaces here). After ``close()`` a
    transaction opens the database again with ``reopen`` (an app started again); otherwise
    it raises ``closed_error()``.
    """

    dialect: Dialect = "sqlite"

    def __init__(
        self,
        opener: Callable[[], sqlite3.Connection],
        *,
        closed_error: Callable[[], Exception],
        reopen: bool = False,
        separate_reads: bool = False,
        paramstyle: Paramstyle = "format",
    ) -> None:
        self._opener = opener
        self._closed_error = closed_error
        self._reopen = reopen
        self._qmark = paramstyle == "qmark"
        self._writer = _Slot(opener())
        self._slots: tuple[_Slot, ...] = (self._writer,)
        if separate_reads:
            try:
                self._slots += (_Slot(opener()),)
            except BaseException:
                self.close()
                raise
        self._reader = self._slots[-1]
        self._closed = False

    @property
    def closed(self) -> bool:
        """True after ``close()`` (until a transaction opens the database again)."""
        return self._closed

    def _conn(self, slot: _Slot) -> sqlite3.Connection:
        if slot.conn is None:
            if not self._reopen:
                raise self._closed_error()
            slot.conn = self._opener()
            self._closed = False
        return slot.conn

    @contextmanager
    def _transaction(self, slot: _Slot, begin: str) -> Iterator[Cursor]:
        with slot.lock, transaction(self._conn(slot), begin) as raw:
            yield raw if self._qmark else QmarkCursor(raw)

    def write(self) -> AbstractContextManager[Cursor]:
        """A cursor in a transaction that may write."""
        return self._transaction(self._writer, "BEGIN IMMEDIATE")

    def read(self) -> AbstractContextManager[Cursor]:
        """A cursor in a read transaction (one snapshot for several queries)."""
        return self._transaction(self._reader, "BEGIN")

    def migrate(self, schema: Schema, target: int | None = None) -> int:
        """Apply ``schema``'s pending migrations; the new version."""
        with self._writer.lock:
            return migrate(self._conn(self._writer), schema, target)

    def interrupt(self) -> None:
        """Make the statements in progress fail now (``sqlite3.OperationalError``)."""
        for slot in self._slots:
            conn = slot.conn
            if conn is not None:
                conn.interrupt()

    def close(self) -> None:
        with ExitStack() as locks:
            for slot in self._slots:
                locks.enter_context(slot.lock)
            self._closed = True
            for slot in self._slots:
                conn, slot.conn = slot.conn, None
                if conn is not None:
                    conn.close()
