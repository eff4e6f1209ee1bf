"""The audit store's schema: one list of migrations for SQLite and PostgreSQL.

Each migration is a version and its steps (in the format of ``tracerag._db._versions``),
applied in one transaction with its ``schema_version`` row. ``AUDIT`` is the schema the backends
migrate (SQLite under ``BEGIN IMMEDIATE``, PostgreSQL under a transaction-scoped advisory lock).

Version 3 gives the store an identity (``store_meta``: ``store_id``, ``genesis``,
``created_at``), records the canonicalisation version of each entry (``chain_version``), and on
PostgreSQL refuses ``TRUNCATE`` of the audit tables.

Version 4 indexes entries by kind, for the ``material_change`` entries (one per change to a
material, chained under the material's id). Material changes written before it stay where they
are (``operator_action`` entries of the request ``tracerag.materials``); the chain is
append-only, so they are read and verified in place, not moved.
"""

from __future__ import annotations

import hashlib
import uuid
from typing import Any

from tracerag._db import Schema, Step, create_version_table
from tracerag.store._base import SchemaTooNew, now_iso
from tracerag.store._chain import GENESIS_HASH


def genesis_for(store_id: str) -> str:
    """The hash a new store's chain starts from: it binds the chain to the store's identity."""
    return hashlib.sha256(f"tracerag-genesis:{store_id}".encode()).hexdigest()


def _identity(cur: Any, dialect: str) -> None:
    cur.execute("SELECT last_seq FROM chain_head WHERE id = 1")
    empty = int(cur.fetchone()[0]) == 0
    store_id = str(uuid.uuid4())
    genesis = genesis_for(store_id) if empty else GENESIS_HASH
    for key, value in (
        ("store_id", store_id),
        ("genesis", genesis),
        ("created_at", now_iso()),
    ):
        cur.execute("INSERT INTO store_meta (key, value) VALUES (%s, %s)", (key, value))
    if empty:
        cur.execute("UPDATE chain_head SET last_hash = %s WHERE id = 1", (genesis,))


_AUDIT_TABLES = ("audit_entries", "chain_head", "requests", "review_queue", "store_meta")
_APPEND_ONLY_PG = """CREATE FUNCTION tracerag_append_only() RETURNS trigger LANGUAGE plpgsql AS $$
               BEGIN RAISE EXCEPTION 'audit entries are append-only'; END $$"""

MIGRATIONS: list[tuple[int, list[Step]]] = [
    (
        1,
        [
            """CREATE TABLE audit_entries (
                seq {bigint} PRIMARY KEY,
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
                last_seq {bigint} NOT NULL,
                last_hash TEXT NOT NULL
            )""",
            f"INSERT INTO chain_head (id, last_seq, last_hash) VALUES (1, 0, '{GENESIS_HASH}')",
            """CREATE TABLE requests (
                request_id TEXT PRIMARY KEY,
                trace_id TEXT,
                created_at TEXT NOT NULL,
                question TEXT,
                first_seq {bigint} NOT NULL,
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
            "ALTER TABLE requests ADD COLUMN confidence {double}",
            "ALTER TABLE requests ADD COLUMN tier TEXT",
            "ALTER TABLE requests ADD COLUMN channel TEXT",
            {
                "sqlite": """UPDATE requests SET
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
                "postgres": """UPDATE requests r SET
                decision = resp.payload::jsonb ->> 'decision',
                confidence = CASE WHEN jsonb_typeof(resp.payload::jsonb -> 'confidence') = 'number'
                             THEN (resp.payload::jsonb ->> 'confidence')::double precision END
               FROM audit_entries resp
               WHERE resp.request_id = r.request_id AND resp.kind = 'response'""",
            },
            {
                "postgres": """UPDATE requests r SET
                tier = reg.payload::jsonb ->> 'tier',
                channel = reg.payload::jsonb ->> 'channel'
               FROM audit_entries reg
               WHERE reg.request_id = r.request_id AND reg.kind = 'register'""",
            },
            "CREATE INDEX requests_decision ON requests (decision, created_at)",
            """CREATE TABLE review_queue (
                request_id TEXT PRIMARY KEY REFERENCES requests (request_id),
                route TEXT NOT NULL,
                priority INTEGER NOT NULL,
                reason TEXT NOT NULL,
                status TEXT NOT NULL CHECK (status IN ('pending', 'claimed', 'decided')),
                enqueued_seq {bigint} NOT NULL,
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
            {
                "sqlite": """CREATE TRIGGER audit_entries_no_update BEFORE UPDATE ON audit_entries
               BEGIN SELECT RAISE(ABORT, 'audit entries are append-only'); END""",
                "postgres": _APPEND_ONLY_PG,
            },
            {
                "sqlite": """CREATE TRIGGER audit_entries_no_delete BEFORE DELETE ON audit_entries
               BEGIN SELECT RAISE(ABORT, 'audit entries are append-only'); END""",
                "postgres": """CREATE TRIGGER audit_entries_append_only
               BEFORE UPDATE OR DELETE ON audit_entries
               FOR EACH ROW EXECUTE FUNCTION tracerag_append_only()""",
            },
        ],
    ),
    (
        3,
        [
            "CREATE TABLE store_meta (key TEXT PRIMARY KEY, value TEXT NOT NULL)",
            _identity,
            "ALTER TABLE audit_entries ADD COLUMN chain_version INTEGER NOT NULL DEFAULT 1",
            "ALTER TABLE chain_head ADD COLUMN mac TEXT",
            {
                "postgres": """CREATE FUNCTION tracerag_no_truncate() RETURNS trigger
               LANGUAGE plpgsql AS $$
               BEGIN RAISE EXCEPTION 'audit tables cannot be truncated'; END $$""",
            },
            *(
                {
                    "postgres": f"""CREATE TRIGGER {table}_no_truncate BEFORE TRUNCATE ON {table}
               FOR EACH STATEMENT EXECUTE FUNCTION tracerag_no_truncate()"""
                }
                for table in _AUDIT_TABLES
            ),
        ],
    ),
    (
        4,
        ["CREATE INDEX audit_entries_kind ON audit_entries (kind, request_id, seq)"],
    ),
]
SCHEMA_VERSION = MIGRATIONS[-1][0]


CREATE_SCHEMA_VERSION = create_version_table("schema_version")

#: the audit tables' schema, as the backends migrate it
AUDIT = Schema(
    name="audit database",
    version_table="schema_version",
    migrations=MIGRATIONS,
    refuse=SchemaTooNew,
    lock="tracerag.audit.schema",
)
