"""Schema versions: an older database is migrated on open, its evidence intact."""

from __future__ import annotations

import pytest
from store_fixtures import make_record

from tracerag.store import SchemaTooNew
from tracerag.store._chain import GENESIS_HASH, canonical_json, entry_hash
from tracerag.store._codec import entries_from_record


def _migrate_to(backend, version: int) -> None:
    """Create the backend's database at an old schema version."""
    if backend.name == "sqlite":
        from tracerag.store._sqlite import migrate

        conn = backend.connect()
        try:
            assert migrate(conn, target=version) == version
        finally:
            conn.close()
    else:
        from tracerag.store._postgres import migrate

        conn = backend.connect()
        try:
            assert migrate(conn, target=version) == version
        finally:
            conn.close()


def _write_v1(backend, records: list[dict]) -> None:
    """Write records the way a version-1 store did (log, head and the v1 request index)."""
    seq, prev = 0, GENESIS_HASH
    for record in records:
        entries = entries_from_record(record)
        first = seq + 1
        for i, entry in enumerate(entries):
            seq += 1
            created_at = f"2024-06-01T10:00:{seq:02d}.000000+00:00"
            payload = canonical_json(entry.payload)
            h = entry_hash(
                prev, seq, entry.request_id, entry.kind, payload, entry.actor, created_at
            )
            backend.execute(
                "INSERT INTO audit_entries (seq, request_id, kind, payload, actor, created_at, "
                "prev_hash, hash) VALUES (?, ?, ?, ?, ?, ?, ?, ?)",
                (seq, entry.request_id, entry.kind, payload, entry.actor, created_at, prev, h),
                bypass_guard=False,
            )
            prev = h
            if i == 0:
                created = created_at
        backend.execute(
            "INSERT INTO requests (request_id, trace_id, created_at, question, first_seq, "
            "n_entries) VALUES (?, ?, ?, ?, ?, ?)",
            (
                record["request_id"],
                record["trace_id"],
                created,
                record["question"],
                first,
                len(entries),
            ),
            bypass_guard=False,
        )
    backend.execute(
        "UPDATE chain_head SET last_seq = ?, last_hash = ? WHERE id = 1",
        (seq, prev),
        bypass_guard=False,
    )


def test_a_version_1_database_is_migrated_on_open(backend) -> None:
    _migrate_to(backend, 1)
    old = [
        make_record("old-pass", decision="pass", confidence=0.93),
        make_record("old-escalate", decision="escalate", confidence=0.4),
    ]
    _write_v1(backend, old)
    with pytest.raises(Exception):  # noqa: B017 - v1 has no review queue yet
        backend.execute("SELECT * FROM review_queue", bypass_guard=False)

    store = backend.open()
    try:
        from tracerag.store._sqlite import SCHEMA_VERSION

        assert store.schema_version == SCHEMA_VERSION
        versions = [
            r[0]
            for r in backend.execute(
                "SELECT version FROM schema_version ORDER BY version", bypass_guard=False
            )
        ]
        assert versions == list(range(1, SCHEMA_VERSION + 1))
        # the old evidence reads back whole and still verifies
        assert store.get("old-escalate").record == old[1]
        assert store.verify_chain().ok
        # the new request index columns were back-filled from the log
        listed = {r.request_id: r for r in store.list_requests()}
        assert listed["old-pass"].decision == "pass"
        assert listed["old-pass"].confidence == pytest.approx(0.93)
        assert listed["old-escalate"].tier == "high"
        assert listed["old-escalate"].channel == "helpdesk"
        # the new features work on old requests, and new writes continue the old chain
        store.enqueue_review("old-escalate", "migrated backlog", "escalate")
        assert store.claim_next("alice").request_id == "old-escalate"
        store.append_record(make_record("new", decision="pass"))
        assert store.get("new").entries[0].seq == 23  # 20 old + enqueued + claimed
        assert store.verify_chain().ok
        # the append-only guard arrived with version 2
        with pytest.raises(Exception, match="append-only"):
            backend.execute("DELETE FROM audit_entries WHERE seq = 1", bypass_guard=False)
    finally:
        store.close()


def test_opening_twice_applies_nothing_new(backend) -> None:
    backend.open().close()
    store = backend.open()
    store.close()
    rows = backend.execute("SELECT COUNT(*) FROM schema_version", bypass_guard=False)
    from tracerag.store._sqlite import SCHEMA_VERSION

    assert rows[0][0] == SCHEMA_VERSION


def test_a_newer_schema_is_refused(backend) -> None:
    backend.open().close()
    backend.execute(
        "INSERT INTO schema_version (version, applied_at) VALUES (?, ?)",
        (999, "2099-01-01T00:00:00+00:00"),
        bypass_guard=False,
    )
    with pytest.raises(SchemaTooNew, match="999"):
        backend.open()


def test_backends_have_the_same_migration_versions() -> None:
    from tracerag.store import _postgres as postgres
    from tracerag.store import _sqlite as sqlite

    assert [v for v, _ in sqlite.MIGRATIONS] == [v for v, _ in postgres.MIGRATIONS]


def test_one_migration_list_serves_both_dialects() -> None:
    from tracerag._db import DIALECTS, statements
    from tracerag.store import _migrations as migrations
    from tracerag.store import _postgres as postgres
    from tracerag.store import _sqlite as sqlite

    assert sqlite.MIGRATIONS is migrations.MIGRATIONS is postgres.MIGRATIONS
    assert migrations.MIGRATIONS
    for _, steps in migrations.MIGRATIONS:
        for step in steps:
            if callable(step):
                continue
            sqls = {d: statements(step, d) for d in DIALECTS}
            assert any(sqls.values())
            for sql in (s for group in sqls.values() for s in group):
                assert "{" not in sql and "%s" not in sql  # types resolved, no parameters


def test_the_format_paramstyle_is_translated_token_by_token() -> None:
    from tracerag._db import to_qmark

    assert to_qmark("a = %s AND b LIKE 'x%%' AND c = %s") == "a = ? AND b LIKE 'x%' AND c = ?"


def test_literal_question_marks_and_percents_survive_both_backends(backend) -> None:
    """Issue: PostgreSQL support rewrote every ``?``, literal ones included."""
    opened = backend.open()
    try:
        with opened._read() as cur:
            cur.execute("SELECT '?', %s, 'a%%b'", ("?%s",))
            assert tuple(cur.fetchone()) == ("?", "?%s", "a%b")
        question = "Is it 50% off? What about %s and ?? and 100%%?"
        opened.append_record(make_record("q?%s", decision="pass", question=question))
        assert opened.get("q?%s").question == question
        assert [s.question for s in opened.list_requests()] == [question]
    finally:
        opened.close()
