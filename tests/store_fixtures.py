"""Shared fixtures for the audit-store tests: backends (SQLite, PostgreSQL) and realistic records.

A pytest plugin (registered in conftest.py): the ``backend`` and ``store`` fixtures reach every
test; import the helpers a test module needs (``from store_fixtures import make_record``).
PostgreSQL tests use the server named by ``TRACERAG_TEST_POSTGRES_DSN`` (start one with
``eval "$(bash .ci/postgres.sh)"``); each test gets its own schema, dropped afterwards.
Without that variable they are skipped — except under CI (env ``CI`` set), where they fail.
"""

from __future__ import annotations

import json
import os
import sqlite3
import uuid
from collections.abc import Iterator
from typing import Any

import pytest

from tracerag.config import reset_config
from tracerag.store._sql import SQLAuditStore

PG_ENV = "TRACERAG_TEST_POSTGRES_DSN"
BACKENDS = ("sqlite", "postgres")


def postgres_dsn() -> str:
    """The test server's DSN, or skip (fail under CI) when there is none."""
    dsn = os.environ.get(PG_ENV, "").strip()
    problem = None
    if not dsn:
        problem = (
            f'{PG_ENV} is not set: start a server with `eval "$(bash .ci/postgres.sh)"` '
            "to run the PostgreSQL audit-store tests"
        )
    else:
        try:
            import psycopg  # noqa: F401
        except ImportError:
            problem = "psycopg is not installed: pip install 'psycopg[binary]>=3.1'"
    if problem:
        if os.environ.get("CI"):
            pytest.fail(f"PostgreSQL tests cannot run under CI: {problem}", pytrace=False)
        pytest.skip(problem)
    return dsn


class Backend:
    """One test database and the means to open stores on it and to tamper with it directly."""

    name: str

    def open(self, **options: Any) -> SQLAuditStore:
        raise NotImplementedError

    def execute(self, sql: str, params: tuple = (), *, bypass_guard: bool = True) -> list:
        """Run SQL straight against the database (as an intruder would), returning rows."""
        raise NotImplementedError

    def cleanup(self) -> None:
        pass


class SQLiteBackend(Backend):
    name = "sqlite"

    def __init__(self, path: str) -> None:
        self.path = path

    def open(self, **options: Any) -> SQLAuditStore:
        from tracerag.store._sqlite import SQLiteAuditStore

        return SQLiteAuditStore(self.path, **options)

    def connect(self) -> sqlite3.Connection:
        return sqlite3.connect(self.path, isolation_level=None, timeout=30)

    def execute(self, sql: str, params: tuple = (), *, bypass_guard: bool = True) -> list:
        conn = self.connect()
        try:
            conn.execute("BEGIN IMMEDIATE")
            if bypass_guard:
                conn.execute("DROP TRIGGER IF EXISTS audit_entries_no_update")
                conn.execute("DROP TRIGGER IF EXISTS audit_entries_no_delete")
            rows = conn.execute(sql.replace("%s", "?"), params).fetchall()
            conn.execute("COMMIT")
            return rows
        except BaseException:
            if conn.in_transaction:
                conn.execute("ROLLBACK")
            raise
        finally:
            conn.close()


class PostgresBackend(Backend):
    name = "postgres"

    def __init__(self, dsn: str) -> None:
        self.dsn = dsn
        self.schema = "t_" + uuid.uuid4().hex[:12]

    def open(self, **options: Any) -> SQLAuditStore:
        from tracerag.store._postgres import PostgresAuditStore

        return PostgresAuditStore(self.dsn, schema=self.schema, **options)

    def connect(self) -> Any:
        from tracerag.store._postgres import connect

        return connect(self.dsn, self.schema)

    def execute(self, sql: str, params: tuple = (), *, bypass_guard: bool = True) -> list:
        conn = self.connect()
        try:
            with conn.transaction(), conn.cursor() as cur:
                if bypass_guard:
                    cur.execute("ALTER TABLE audit_entries DISABLE TRIGGER USER")
                cur.execute(sql.replace("?", "%s"), params or None)
                rows = cur.fetchall() if cur.description else []
                if bypass_guard:
                    cur.execute("ALTER TABLE audit_entries ENABLE TRIGGER USER")
                return rows
        finally:
            conn.close()

    def cleanup(self) -> None:
        import psycopg

        with psycopg.connect(self.dsn, autocommit=True) as conn:
            conn.execute(f'DROP SCHEMA IF EXISTS "{self.schema}" CASCADE')


@pytest.fixture(params=["sqlite", pytest.param("postgres", marks=pytest.mark.integration)])
def backend(request: pytest.FixtureRequest, tmp_path: Any) -> Iterator[Backend]:
    """Each backend in turn, on a fresh empty database."""
    if request.param == "sqlite":
        b: Backend = SQLiteBackend(str(tmp_path / "audit.sqlite"))
    else:
        b = PostgresBackend(postgres_dsn())
    # a server on a store that can be down needs an audit journal, as in production: apps the
    # test builds on PostgreSQL keep theirs in the test's directory
    monkeypatch = pytest.MonkeyPatch()
    if request.param == "postgres":
        monkeypatch.setenv("TRACERAG_AUDIT_JOURNAL", str(tmp_path / "journal"))
        reset_config()
    try:
        yield b
    finally:
        monkeypatch.undo()
        reset_config()
        b.cleanup()


@pytest.fixture
def store(backend: Backend) -> Iterator[SQLAuditStore]:
    """An open store on the backend's fresh database."""
    s = backend.open()
    try:
        yield s
    finally:
        s.close()


# ---------------------------------------------------------------------------------------------
# A realistic record (layout version 1, before record_version), as a full pipeline run wrote it.

_BASE_RECORD: dict[str, Any] = {
    "request_id": "req-0001",
    "trace_id": "4bf92f3577b34da6a3ce929d0e0e4736",
    "question": "I received a damaged kettle. How long do I have to return it, and who pays "
    "for the return shipping?",
    "session_id": "sess-42",
    "user_id": "agent-7",
    "channel": "helpdesk",
    "tier": "high",
    "versions": {
        "prompt": "support-answer@3f9c2a1",
        "model": "gpt-4o-mini-2024-07-18",
        "tracerag": "0.1.0",
    },
    "params": {"n_samples": 3, "temperature": 0.7, "plan_mode": "separate", "k": 4},
    "started_at": "2025-03-04T09:15:02.123456+00:00",
    "materials": [
        {
            "id": "M01",
            "text": "Items that arrive damaged may be returned within 30 days of delivery. "
            "We cover return shipping for damaged items.",
            "title": "Returns policy (2025)",
            "source": "kb://policies/returns-2025",
            "score": 0.912,
            "rank": 1,
            "metadata": {"valid_until": "2026-12-31"},
        },
        {
            "id": "M02",
            "text": "Report transit damage within 48 hours with a photo of the packaging.",
            "title": "Shipping damage FAQ",
            "source": "kb://faq/shipping-damage",
            "score": 0.803,
            "rank": 2,
            "metadata": {},
        },
        {
            "id": "M03",
            "text": "Returns are accepted within 14 days; the customer pays return shipping.",
            "title": "Returns policy (2022)",
            "source": "kb://policies/returns-2022",
            "score": 0.655,
            "rank": 3,
            "metadata": {"superseded_by": "M01", "status": "superseded"},
        },
    ],
    "retrieval": {"count": 3, "top_score": 0.912, "score_margin": 0.109, "scored": True},
    "plan": {
        "material_ids": ["M01", "M02"],
        "key_facts": ["30 days from delivery for damaged items", "we pay return shipping"],
        "ok": True,
        "error": None,
        "raw": '{"material_ids": ["M01", "M02"], "key_facts": ["30 days", "we pay"]}',
        "attempts": 1,
        "mode": "separate",
        "agreement": None,
    },
    "samples": [
        {
            "index": 0,
            "raw": "You can return a damaged item within 30 days of delivery [M01]. "
            "We pay for the return shipping [M01]. Report the damage within 48 hours [M02].",
            "answer": "You can return a damaged item within 30 days of delivery [M01]. "
            "We pay for the return shipping [M01]. Report the damage within 48 hours [M02].",
            "plan": None,
            "error": None,
            "attempts": 1,
            "latency_s": 1.234,
            "input_tokens": 812,
            "output_tokens": 61,
        },
        {
            "index": 1,
            "raw": "Damaged items: 30 days [M01]; return postage is on us [M01] [M99].",
            "answer": "Damaged items: 30 days [M01]; return postage is on us [M01] [M99].",
            "plan": None,
            "error": None,
            "attempts": 2,
            "latency_s": 2.871,
            "input_tokens": 812,
            "output_tokens": 40,
        },
        {
            "index": 2,
            "raw": None,
            "answer": None,
            "plan": None,
            "error": "TimeoutError: model call timed out after 20s",
            "attempts": 3,
            "latency_s": 60.0,
            "input_tokens": None,
            "output_tokens": None,
        },
    ],
    "signals": {
        "citations": {
            "claims": [
                {
                    "text": "You can return a damaged item within 30 days of delivery.",
                    "cited_ids": ["M01"],
                    "verdict": "supported",
                    "score": 0.93,
                    "sentence": "Items that arrive damaged may be returned within 30 days of "
                    "delivery.",
                    "material_id": "M01",
                },
                {
                    "text": "Return postage is on us.",
                    "cited_ids": ["M01", "M99"],
                    "verdict": "fabricated_citation",
                    "score": 0.71,
                    "sentence": "We cover return shipping for damaged items.",
                    "material_id": "M01",
                },
                {
                    "text": "Returns are accepted within 14 days.",
                    "cited_ids": ["M03"],
                    "verdict": "stale",
                    "score": 0.88,
                    "sentence": "Returns are accepted within 14 days; the customer pays "
                    "return shipping.",
                    "material_id": "M03",
                },
                {
                    "text": "Keep the original box.",
                    "cited_ids": [],
                    "verdict": "uncited",
                    "score": 0.0,
                    "sentence": None,
                    "material_id": None,
                },
            ],
            "coverage": 0.75,
            "accuracy": 0.5,
            "fabricated": ["M99"],
        },
        "consistency": {"agreement": 0.8, "groups": 2, "entropy": 0.5},
        "rules": [
            {"name": "no_personal_data", "passed": True, "required": True, "detail": ""},
            {
                "name": "mentions_deadline",
                "passed": False,
                "required": False,
                "detail": "no deadline for reporting damage",
            },
        ],
    },
    "confidence": 0.72,
    "decision": "review",
    "response": {
        "answer": "You can return a damaged item within 30 days of delivery [M01]. "
        "We pay for the return shipping [M01].",
        "status": "flagged_for_review",
        "decision": "review",
    },
    "errors": [
        {
            "stage": "sample",
            "type": "RateLimitError",
            "message": "429 Too Many Requests",
            "attempt": 1,
            "sample": 1,
            "at": "2025-03-04T09:15:03.500000+00:00",
        },
        {
            "stage": "sample",
            "type": "TimeoutError",
            "message": "model call timed out after 20s",
            "attempt": 3,
            "sample": 2,
            "at": "2025-03-04T09:16:02.000000+00:00",
        },
    ],
    "skipped": [],
    "calibration": "isotonic@2025-02",
    "timings": {
        "register": 0.001,
        "retrieve": 0.042,
        "plan": 0.8,
        "sample": 60.1,
        "verify": 0.12,
        "assemble": 0.002,
        "request": 61.07,
    },
    "warnings": ["sample 2 failed after 3 attempts"],
}


# the realistic record as JSON text: parsing it makes a deep copy about 4x faster than deepcopy
_BASE_JSON = json.dumps(_BASE_RECORD)


def make_record(request_id: str = "req-0001", **changes: Any) -> dict[str, Any]:
    """A deep copy of the realistic record with a request_id and top-level changes."""
    record: dict[str, Any] = json.loads(_BASE_JSON)
    record["request_id"] = request_id
    record.update(changes)
    if "decision" in changes and isinstance(record.get("response"), dict):
        record["response"]["decision"] = changes["decision"]
    return record


def stored_request_ids(path: Any) -> list[str]:
    """The request_id of every record in a SQLite store, in chain order (duplicates kept);
    the requests index must hold the same ones."""
    conn = sqlite3.connect(str(path))
    try:
        index = [r[0] for r in conn.execute("SELECT request_id FROM requests")]
        chained = [
            r[0]
            for r in conn.execute(
                "SELECT request_id FROM audit_entries WHERE kind = 'response' ORDER BY seq"
            )
        ]
    finally:
        conn.close()
    assert sorted(index) == sorted(chained)
    return chained
