"""The PostgreSQL audit store (psycopg 3; install the ``postgres`` extra).

Several application instances may share one database. Every write transaction first locks the
single ``chain_head`` row (``SELECT ... FOR UPDATE``), so appends from all instances are
serialised and the hash chain stays linear; reviewers claim items with
``FOR UPDATE SKIP LOCKED`` (since every claim also appends to the chain, claims are serialised by
the head lock as well; SKIP LOCKED keeps an item from being handed out twice regardless).
Migrations run under a transaction-scoped advisory lock, so instances starting together do not
race. ``schema=`` keeps the tables in their own schema
(created if missing); otherwise the connection's ``search_path`` decides, which can also be set
in the URL (``?options=-csearch_path%3Dmyschema``). Connections, their bounded waits and the
pool are ``tracerag._db``'s.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

from tracerag._db import PostgresDB
from tracerag._db import _postgres as postgres
from tracerag._db._postgres import connect
from tracerag.store import _migrations as migrations
from tracerag.store._base import InvalidRecord, StoreError, StoreMissing
from tracerag.store._migrations import SCHEMA_VERSION
from tracerag.store._sql import Cursor, SQLAuditStore, _Head, opening

__all__ = ["MIGRATIONS", "SCHEMA_VERSION", "PostgresAuditStore", "connect", "migrate"]

try:  # psycopg is an optional dependency
    import psycopg
except ImportError:  # pragma: no cover - exercised only without the extra
    psycopg = None  # type: ignore[assignment]

MIGRATIONS = migrations.MIGRATIONS


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
    return postgres.migrate(conn, migrations.AUDIT, target)


def _closed() -> StoreError:
    return StoreError("the audit store is closed")


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
        self._db = PostgresDB(
            lambda: connect(dsn, schema, connect_timeout, statement_timeout),
            max_connections=max_connections,
            closed_error=_closed,
        )
        with (
            opening(self._db.close, psycopg.Error, "cannot open the PostgreSQL audit store"),
            self._db.connection() as conn,
        ):
            if not create and not postgres.has_table(conn, "schema_version"):
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
        self._db.interrupt()

    @contextmanager
    def _write(self) -> Iterator[tuple[Cursor, _Head]]:
        with self._db.write() as cur:
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
        with self._db.read() as cur:
            # one snapshot for multi-query reads (verification, metrics)
            cur.execute("SET TRANSACTION ISOLATION LEVEL REPEATABLE READ READ ONLY")
            yield cur

    @property
    def closed(self) -> bool:
        """True once ``close()`` was called."""
        return self._db.closed

    def close(self) -> None:
        self._db.close()

    def __repr__(self) -> str:
        schema = f", schema={self.schema!r}" if self.schema else ""
        return f"PostgresAuditStore(<dsn>{schema})"
