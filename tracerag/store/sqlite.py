"""The SQLite audit store: the default, one file, created on first use.

WAL journal, ``synchronous=FULL`` by default (a committed record survives power loss), and a
``schema_version`` table with migrations applied in order on open. Appends run in
``BEGIN IMMEDIATE`` transactions, so several processes may share the file; within a process one
connection is shared under a lock, so the store is safe to use from any thread.
Plain ``UPDATE``/``DELETE`` on the log is refused by triggers (defence in depth; the hash chain
is what makes tampering evident).
"""

from __future__ import annotations

import sqlite3
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

from tracerag.store.base import Cursor, SchemaTooNew, SQLAuditStore, StoreError, _Head, now_iso
from tracerag.store.chain import GENESIS_HASH

# Each migration is a list of statements, applied in one transaction with its version row.
MIGRATIONS: list[tuple[int, list[str]]] = [
    (
        1,
        [
            """CREATE TABLE audit_entries (
                seq INTEGER PRIMARY KEY,
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
                last_seq INTEGER NOT NULL,
                last_hash TEXT NOT NULL
            )""",
            f"INSERT INTO chain_head (id, last_seq, last_hash) VALUES (1, 0, '{GENESIS_HASH}')",
            """CREATE TABLE requests (
                request_id TEXT PRIMARY KEY,
                trace_id TEXT,
                created_at TEXT NOT NULL,
                question TEXT,
                first_seq INTEGER NOT NULL,
                n_entries INTEGER NOT NULL
            )""",
            "CREATE INDEX requests_created ON requests (created_at)",
        ],
    ),
    (
        2,
        [
            # request summary columns for listing, back-filled from the log
            "ALTER TABLE requests ADD COLUMN decision TEXT",
            "ALTER TABLE requests ADD COLUMN confidence REAL",
            "ALTER TABLE requests ADD COLUMN tier TEXT",
            "ALTER TABLE requests ADD COLUMN channel TEXT",
            """UPDATE requests SET
                decision = (SELECT json_extract(e.payload, '$.decision') FROM audit_entries e
                            WHERE e.request_id = requests.request_id AND e.kind = 'response'
                            ORDER BY e.seq LIMIT 1),
                confidence = (SELECT json_extract(e.payload, '$.confidence') FROM audit_entries e
                              WHERE e.request_id = requests.request_id AND e.kind = 'response'
                              ORDER BY e.seq LIMIT 1),
                tier = (SELECT json_extract(e.payload, '$.tier') FROM audit_entries e
                        WHERE e.request_id = requests.request_id AND e.kind = 'register'
                        ORDER BY e.seq LIMIT 1),
                channel = (SELECT json_extract(e.payload, '$.channel') FROM audit_entries e
                           WHERE e.request_id = requests.request_id AND e.kind = 'register'
                           ORDER BY e.seq LIMIT 1)""",
            "CREATE INDEX requests_decision ON requests (decision, created_at)",
            """CREATE TABLE review_queue (
                request_id TEXT PRIMARY KEY REFERENCES requests (request_id),
                route TEXT NOT NULL,
                priority INTEGER NOT NULL,
                reason TEXT NOT NULL,
                status TEXT NOT NULL CHECK (status IN ('pending', 'claimed', 'decided')),
                enqueued_seq INTEGER NOT NULL,
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
            """CREATE TRIGGER audit_entries_no_update BEFORE UPDATE ON audit_entries
               BEGIN SELECT RAISE(ABORT, 'audit entries are append-only'); END""",
            """CREATE TRIGGER audit_entries_no_delete BEFORE DELETE ON audit_entries
               BEGIN SELECT RAISE(ABORT, 'audit entries are append-only'); END""",
        ],
    ),
]
SCHEMA_VERSION = MIGRATIONS[-1][0]


def schema_version(conn: sqlite3.Connection) -> int:
    """The schema version of an open database (0 for a new one)."""
    conn.execute(
        "CREATE TABLE IF NOT EXISTS schema_version "
        "(version INTEGER PRIMARY KEY, applied_at TEXT NOT NULL)"
    )
    row = conn.execute("SELECT MAX(version) FROM schema_version").fetchone()
    return int(row[0] or 0)


def migrate(conn: sqlite3.Connection, target: int | None = None) -> int:
    """Apply pending migrations up to ``target`` (default: latest); returns the new version.

    ``conn`` must be in autocommit mode (``isolation_level=None``).
    """
    target = SCHEMA_VERSION if target is None else target
    conn.execute("BEGIN IMMEDIATE")
    try:
        current = schema_version(conn)
        if current > SCHEMA_VERSION:
            raise SchemaTooNew(
                f"audit database schema version {current} is newer than this tracerag "
                f"supports ({SCHEMA_VERSION}); upgrade tracerag"
            )
        for version, statements in MIGRATIONS:
            if current < version <= target:
                for statement in statements:
                    conn.execute(statement)
                conn.execute(
                    "INSERT INTO schema_version (version, applied_at) VALUES (?, ?)",
                    (version, now_iso()),
                )
                current = version
        conn.execute("COMMIT")
    except BaseException:
        conn.execute("ROLLBACK")
        raise
    return current


class SQLiteAuditStore(SQLAuditStore):
    """The audit store in one SQLite file (or ``:memory:``)."""

    def __init__(
        self,
        path: str | Path = ".tracerag/audit.sqlite",
        *,
        auto_enqueue: bool = True,
        synchronous: str = "FULL",
        busy_timeout_s: float = 30.0,
    ) -> None:
        super().__init__(auto_enqueue=auto_enqueue)
        self.path = str(path)
        if self.path != ":memory:":
            Path(self.path).expanduser().parent.mkdir(parents=True, exist_ok=True)
            self.path = str(Path(self.path).expanduser())
        self._lock = threading.RLock()
        self._conn = sqlite3.connect(
            self.path,
            isolation_level=None,
            check_same_thread=False,
            timeout=busy_timeout_s,
        )
        try:
            if self.path != ":memory:":
                mode = self._conn.execute("PRAGMA journal_mode=WAL").fetchone()[0]
                if str(mode).lower() != "wal":
                    raise StoreError(f"could not put {self.path} in WAL mode (got {mode})")
            if synchronous.upper() not in {"OFF", "NORMAL", "FULL", "EXTRA"}:
                raise ValueError(f"unknown synchronous level {synchronous!r}")
            self._conn.execute(f"PRAGMA synchronous={synchronous.upper()}")
            self._conn.execute(f"PRAGMA busy_timeout={int(busy_timeout_s * 1000)}")
            self._conn.execute("PRAGMA foreign_keys=ON")
            self.schema_version = migrate(self._conn)
        except BaseException:
            self._conn.close()
            raise
        self._closed = False

    @contextmanager
    def _write(self) -> Iterator[tuple[Cursor, _Head]]:
        with self._lock:
            self._check_open()
            cur = self._conn.cursor()
            cur.execute("BEGIN IMMEDIATE")
            try:
                head = self._read_head(cur)
                yield cur, head
            except BaseException:
                cur.execute("ROLLBACK")
                raise
            else:
                try:
                    cur.execute("COMMIT")
                except BaseException:
                    if self._conn.in_transaction:
                        cur.execute("ROLLBACK")
                    raise
            finally:
                cur.close()

    @contextmanager
    def _read(self) -> Iterator[Cursor]:
        with self._lock:
            self._check_open()
            cur = self._conn.cursor()
            cur.execute("BEGIN")  # one consistent snapshot for multi-query reads
            try:
                yield cur
            finally:
                cur.execute("COMMIT")
                cur.close()

    @contextmanager
    def _snapshot(self) -> Iterator[Cursor]:
        if self.path == ":memory:":
            with self._read() as cur:
                yield cur
            return
        self._check_open()
        # A separate read-only connection: in WAL mode it reads a consistent snapshot while
        # this store's connection goes on writing.
        conn = sqlite3.connect(
            Path(self.path).resolve().as_uri() + "?mode=ro", uri=True, isolation_level=None
        )
        try:
            cur = conn.cursor()
            cur.execute("BEGIN")
            try:
                yield cur
            finally:
                cur.execute("COMMIT")
        finally:
            conn.close()

    def _check_open(self) -> None:
        if self._closed:
            raise StoreError("the audit store is closed")

    def close(self) -> None:
        with self._lock:
            if not self._closed:
                self._closed = True
                self._conn.close()

    def __repr__(self) -> str:
        return f"SQLiteAuditStore({self.path!r})"
