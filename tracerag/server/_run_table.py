"""Answer runs kept in the audit store's database, so every replica can replay them.

One row per answer request that can be resumed (streamed, started with ``POST /v1/requests``
or sent with an ``Idempotency-Key``): its request id, the key's hash, a fingerprint of the
question, and once the run ended its events. A stage event is stored as sent; the ``response``
event is stored without its data: a replay reads the answer from the request's hash-chained
audit record, so a row changed by someone with database access cannot put an answer in a
caller's stream that the pipeline never gave. Rows expire (``expires_at``, seconds since the
epoch) and are purged by the replicas.

The table lives beside the audit store's (the SQLite file, or the PostgreSQL DSN and schema),
with its own migrations in ``answer_run_schema_version`` (connections are ``tracerag._db``'s).
``open_run_table(store)`` opens it, or returns None for a store without a database of its own
(``:memory:``, a custom store).
"""

from __future__ import annotations

import json
import logging
import sqlite3
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from tracerag._db import Database, PostgresDB, PostgresSchema, Schema, SQLiteDB, Step, locate
from tracerag._db import _postgres as postgres
from tracerag._db import _sqlite as sqlite
from tracerag.errors import TraceragError
from tracerag.store._base import AuditStore

logger = logging.getLogger("tracerag.server")

#: how long a statement on the table may wait (a locked SQLite file, a slow server)
STATEMENT_TIMEOUT = 2.0
#: the most request ids asked about in one decision query
DECIDED_CHUNK = 500

#: the run table's migrations (``tracerag._db._versions``' format)
MIGRATIONS: list[tuple[int, list[Step]]] = [
    (
        1,
        [
            """CREATE TABLE answer_runs (
                request_id TEXT PRIMARY KEY,
                idem_key TEXT UNIQUE,
                fingerprint TEXT NOT NULL,
                events TEXT,
                created_at {double} NOT NULL,
                expires_at {double} NOT NULL
            )""",
            "CREATE INDEX answer_runs_expiry ON answer_runs (expires_at)",
        ],
    )
]


class RunTableError(TraceragError):
    """The answer-run table refused or failed an operation."""


RUNS = Schema(
    name="answer runs",
    version_table="answer_run_schema_version",
    migrations=MIGRATIONS,
    refuse=RunTableError,
    lock="tracerag.answer_runs.schema",
    lock_per_schema=False,
)


@dataclass(frozen=True)
class StoredRun:
    """One row: ``events`` is None while the run is under way (or its replica stopped)."""

    request_id: str
    fingerprint: str
    events: list[tuple[str, Any]] | None
    created_at: float


def _events_from(text: str | None) -> list[tuple[str, Any]] | None:
    if text is None:
        return None
    try:
        raw = json.loads(text)
    except json.JSONDecodeError:
        raise RunTableError("a stored run's events are not JSON") from None
    events: list[tuple[str, Any]] = []
    if not isinstance(raw, list):
        raise RunTableError("a stored run's events are not a list")
    for item in raw:
        if not (isinstance(item, list) and len(item) == 2 and isinstance(item[0], str)):
            raise RunTableError("a stored run's event is not [name, data]")
        events.append((item[0], item[1]))
    return events


def _row(row: Sequence[Any] | None) -> StoredRun | None:
    if row is None:
        return None
    return StoredRun(str(row[0]), str(row[1]), _events_from(row[2]), float(row[3]))


_COLUMNS = "request_id, fingerprint, events, created_at"


class RunTable:
    """The ``answer_runs`` table in a database; every method blocks (call it from a thread)."""

    def __init__(self, db: Database) -> None:
        self._db = db
        self.dialect = db.dialect
        db.migrate(RUNS)

    def close(self) -> None:
        self._db.close()

    def claim(
        self,
        request_id: str,
        key: str | None,
        fingerprint: str,
        now: float,
        ttl: float,
    ) -> StoredRun | None:
        """Record a new run; with a key already taken (and not expired), that run instead.

        Returns None when this run was recorded. A key's run that expired is forgotten first.
        """
        with self._db.write() as cur:
            if key is not None:
                cur.execute(
                    "DELETE FROM answer_runs WHERE idem_key = %s AND expires_at <= %s", (key, now)
                )
            cur.execute(
                "INSERT INTO answer_runs (request_id, idem_key, fingerprint, events, created_at, "
                "expires_at) VALUES (%s, %s, %s, NULL, %s, %s) ON CONFLICT DO NOTHING",
                (request_id, key, fingerprint, now, now + ttl),
            )
            if key is None:
                return None
            cur.execute(f"SELECT {_COLUMNS} FROM answer_runs WHERE idem_key = %s", (key,))
            found = _row(cur.fetchone())
        if found is None:
            raise RunTableError("the run was neither recorded nor found")
        return None if found.request_id == request_id else found

    def finish(self, request_id: str, events: Sequence[tuple[str, str]]) -> None:
        """Store the events of a run that ended, each ``(name, data as JSON)``; the
        response's data is left out."""
        items = []
        for name, text in events:
            if not isinstance(name, str) or not name.isidentifier():
                raise RunTableError(f"not an event name: {name!r}")
            items.append(f'["{name}",{"null" if name == "response" else text}]')
        text = "[" + ",".join(items) + "]"
        with self._db.write() as cur:
            cur.execute(
                "UPDATE answer_runs SET events = %s WHERE request_id = %s", (text, request_id)
            )

    def get(self, request_id: str, now: float) -> StoredRun | None:
        """The run of a request (None when unknown or expired)."""
        with self._db.read() as cur:
            cur.execute(
                f"SELECT {_COLUMNS} FROM answer_runs WHERE request_id = %s AND expires_at > %s",
                (request_id, now),
            )
            return _row(cur.fetchone())

    def purge(self, now: float) -> int:
        """Forget expired runs; how many were removed."""
        with self._db.write() as cur:
            done = cur.execute("DELETE FROM answer_runs WHERE expires_at <= %s", (now,))
            removed = getattr(done, "rowcount", -1)
        return int(removed) if removed is not None else -1

    def count(self) -> int:
        """Rows kept now (expired ones not yet purged included)."""
        with self._db.read() as cur:
            cur.execute("SELECT COUNT(*) FROM answer_runs")
            row = cur.fetchone()
        return int(row[0]) if row else 0

    def decided_among(self, request_ids: Sequence[str]) -> set[str]:
        """Which of these requests a reviewer has decided (the audit store's review queue)."""
        decided: set[str] = set()
        ids = list(request_ids)
        with self._db.read() as cur:
            for start in range(0, len(ids), DECIDED_CHUNK):
                chunk = ids[start : start + DECIDED_CHUNK]
                marks = ", ".join(["%s"] * len(chunk))
                cur.execute(
                    "SELECT request_id FROM review_queue "
                    f"WHERE status = 'decided' AND request_id IN ({marks})",
                    tuple(chunk),
                )
                decided.update(str(r[0]) for r in cur.fetchall())
        return decided


def _closed() -> RunTableError:
    return RunTableError("the answer-run table is closed")


def _sqlite_runs(path: str, busy_timeout_s: float = STATEMENT_TIMEOUT) -> SQLiteDB:
    def opener() -> sqlite3.Connection:
        # runs are replays, not the audit trail: a power loss may forget the newest
        return sqlite.open_file(path, busy_timeout_s=busy_timeout_s, synchronous="NORMAL")

    return SQLiteDB(opener, closed_error=_closed)


def _postgres_runs(where: PostgresSchema) -> PostgresDB:
    return PostgresDB(
        lambda: postgres.connect(
            where.dsn,
            where.schema,
            connect_timeout=STATEMENT_TIMEOUT,
            statement_timeout=STATEMENT_TIMEOUT,
        ),
        max_connections=1,  # one connection, made again after it broke
        closed_error=_closed,
    )


def open_run_table(store: AuditStore) -> RunTable | None:
    """The run table in the database of an open audit store; None when it has none."""
    where = locate(store)
    if where is None:
        return None
    db = _postgres_runs(where) if isinstance(where, PostgresSchema) else _sqlite_runs(where.path)
    try:
        return RunTable(db)
    except BaseException:
        db.close()
        raise
