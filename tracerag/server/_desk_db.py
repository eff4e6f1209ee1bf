"""The desk's shared state, in the audit store's own database.

Desk sessions, claims on items, skipped items and the sign-in back-off are kept in four small
tables beside the audit tables, so several server processes (on one machine or many) on one
store are interchangeable: a session signed in on one is valid on every other, a claim taken on
one blocks a decision on another, and failed sign-ins count towards one lockout.

These rows are working state, not evidence: they are not chained (a decision, a vote, a
comment or an assignment is, in the audit log). Their migrations are kept in their own
``desk_schema_version`` table. Writes are short transactions that never take the audit chain's
lock: SQLite ``BEGIN IMMEDIATE`` on a connection of its own, PostgreSQL a small pool (both
``tracerag._db``'s, opened again after a close).

A store without a shared database (SQLite ``:memory:``, a store object of another kind) keeps
desk state in the process instead (``desk_db_like`` returns None).
"""

from __future__ import annotations

import sqlite3

from tracerag._db import Database, PostgresDB, PostgresSchema, Schema, SQLiteDB, Step, locate
from tracerag._db import _postgres as postgres
from tracerag._db import _sqlite as sqlite
from tracerag.errors import TraceragError
from tracerag.store._base import AuditStore

#: the desk's migrations (``tracerag._db._versions``' format)
MIGRATIONS: list[tuple[int, list[Step]]] = [
    (
        1,
        [
            # sid_key: HMAC of the session id under a key derived from the desk's credentials
            # (never stored), so a row written into the database opens no session
            """CREATE TABLE desk_sessions (
                sid_key TEXT PRIMARY KEY,
                reviewer TEXT NOT NULL,
                kind TEXT NOT NULL,
                created_at {double} NOT NULL,
                expires_at {double} NOT NULL
            )""",
            "CREATE INDEX desk_sessions_expires ON desk_sessions (expires_at)",
            # item_id: a review item's request id (other desk item kinds use their own ids)
            """CREATE TABLE desk_claims (
                item_id TEXT PRIMARY KEY,
                reviewer TEXT NOT NULL,
                sid_key TEXT,
                taken_at {double} NOT NULL,
                expires_at {double} NOT NULL
            )""",
            "CREATE INDEX desk_claims_session ON desk_claims (sid_key)",
            "CREATE INDEX desk_claims_expires ON desk_claims (expires_at)",
            """CREATE TABLE desk_throttle (
                client TEXT PRIMARY KEY,
                failures INTEGER NOT NULL,
                first_at {double} NOT NULL,
                locked_until {double} NOT NULL
            )""",
            """CREATE TABLE desk_skips (
                item_id TEXT NOT NULL,
                reviewer TEXT NOT NULL,
                skipped_at {double} NOT NULL,
                PRIMARY KEY (item_id, reviewer)
            )""",
        ],
    ),
]
SCHEMA_VERSION = MIGRATIONS[-1][0]


class DeskStateError(TraceragError):
    """The desk's shared state could not be read or written."""


DESK = Schema(
    name="review desk",
    version_table="desk_schema_version",
    migrations=MIGRATIONS,
    refuse=DeskStateError,
    lock="tracerag.desk.schema",
)

#: transactions on the desk's tables (cursors take ``%s`` parameters); ``close()`` closes the
#: connections, and a later transaction opens one again (an app started again)
DeskDB = Database


def _closed() -> DeskStateError:
    return DeskStateError("the desk's tables are closed")


def _sqlite_desk(path: str, busy_timeout_s: float = 5.0) -> SQLiteDB:
    def opener() -> sqlite3.Connection:
        # working state: a session or a claim lost to a power cut costs a sign-in
        return sqlite.open_file(path, busy_timeout_s=busy_timeout_s, synchronous="NORMAL")

    try:
        db = SQLiteDB(opener, closed_error=_closed, reopen=True)
        try:
            db.migrate(DESK)
        except BaseException:
            db.close()
            raise
    except sqlite3.Error as exc:
        raise DeskStateError(f"cannot open the desk's tables in {path}: {exc}") from exc
    return db


def _postgres_desk(where: PostgresSchema, max_connections: int = 4) -> PostgresDB:
    db = PostgresDB(
        lambda: postgres.connect(where.dsn, where.schema),
        max_connections=max_connections,
        closed_error=_closed,
        reopen=True,
    )
    try:
        db.migrate(DESK)
    except TraceragError:  # said already in the project's terms
        db.close()
        raise
    except Exception as exc:
        db.close()
        raise DeskStateError(f"cannot open the desk's tables: {exc}") from exc
    return db


def desk_db_like(store: AuditStore) -> DeskDB | None:
    """The desk's tables in the database of an open audit store; None when the store has no
    database another process could share (SQLite ``:memory:``, a store of another kind)."""
    where = locate(store)
    if isinstance(where, PostgresSchema):
        return _postgres_desk(where)
    if where is not None:
        return _sqlite_desk(where.path)
    return None


__all__ = [
    "DESK",
    "MIGRATIONS",
    "SCHEMA_VERSION",
    "DeskDB",
    "DeskStateError",
    "desk_db_like",
]
