"""The one database layer under the audit store, the material registry and the server.

Dialects and placeholders (``_dialect``), SQLite and PostgreSQL connections with their bounded
waits, locks and pools (``_sqlite``, ``_postgres``), schema versions (``_versions``) and where
a store's database is (``_connection``). It imports nothing of the application above it.
"""

from __future__ import annotations

from tracerag._db._connection import Database, PostgresSchema, SQLiteFile, locate
from tracerag._db._dialect import (
    DIALECTS,
    TYPES,
    Cursor,
    Dialect,
    FormatCursor,
    Paramstyle,
    QmarkCursor,
    to_qmark,
)
from tracerag._db._postgres import Pool, PostgresDB
from tracerag._db._sqlite import SQLiteDB, transaction
from tracerag._db._versions import Schema, Step, create_version_table, migrate, statements

__all__ = [
    "DIALECTS",
    "TYPES",
    "Cursor",
    "Database",
    "Dialect",
    "FormatCursor",
    "Paramstyle",
    "Pool",
    "PostgresDB",
    "PostgresSchema",
    "QmarkCursor",
    "SQLiteDB",
    "SQLiteFile",
    "Schema",
    "Step",
    "create_version_table",
    "locate",
    "migrate",
    "statements",
    "to_qmark",
    "transaction",
]
