"""Tampering by someone with database access: what verify_chain catches with a chain key, with an
outside anchor (an exported head), and — the honest limit — with neither."""

from __future__ import annotations

import pytest
from store_fixtures import make_record
from tamper import KEY, genesis, reseal_from

from tracerag.store._chain import CHAIN_V2, entry_hash


def _fill(store) -> None:
    """Three requests (30 entries): r0 decided by a reviewer, r1 pending review, r2 passed."""
    store.append_record(make_record("r0"))  # decision "review": queued
    store.append_record(make_record("r1"))
    store.append_record(make_record("r2", decision="pass"))
    store.decide("r0", "alice", "reject", reason="cites a superseded policy")


def _truncate_tail(backend) -> None:
    """Remove the newest request (r2's entries, its index row) and move the head back."""
    backend.execute("DELETE FROM audit_entries WHERE request_id = 'r2'")
    backend.execute("DELETE FROM requests WHERE request_id = 'r2'")
    (last,) = backend.execute(
        "SELECT seq, hash FROM audit_entries ORDER BY seq DESC LIMIT 1", bypass_guard=False
    )
    backend.execute(
        "UPDATE chain_head SET last_seq = ?, last_hash = ? WHERE id = 1", (last[0], last[1])
    )


def _delete_everything(backend) -> None:
    for table in ("review_queue", "audit_entries", "requests"):
        backend.execute(f"DELETE FROM {table}")
    backend.execute(
        "UPDATE chain_head SET last_seq = 0, last_hash = ?, mac = NULL WHERE id = 1",
        (genesis(backend),),
    )


def _append_forged(backend) -> None:
    """A new entry, sealed as well as one can without the key, with the head moved onto it."""
    (head,) = backend.execute("SELECT last_seq, last_hash FROM chain_head", bypass_guard=False)
    seq, prev = head[0] + 1, head[1]
    payload = '{"action":"approve","final_answer":"all fine","reason":null}'
    created = "2030-01-01T00:00:00.000000+00:00"
    new = entry_hash(prev, seq, "r1", "note", payload, "mallory", created, CHAIN_V2)
    backend.execute(
        "INSERT INTO audit_entries (seq, request_id, kind, payload, actor, created_at, "
        "prev_hash, hash, chain_version) VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?)",
        (seq, "r1", "note", payload, "mallory", created, prev, new, CHAIN_V2),
    )
    backend.execute("UPDATE requests SET n_entries = n_entries + 1 WHERE request_id = 'r1'")
    backend.execute("UPDATE chain_head SET last_seq = ?, last_hash = ? WHERE id = 1", (seq, new))


def _rewrite_middle(backend) -> None:
    """Change the answer in r1's response entry and re-hash everything after it."""
    import json

    from tracerag.store._chain import jcs_json

    ((seq, payload),) = backend.execute(
        "SELECT seq, payload FROM audit_entries WHERE request_id = 'r1' AND kind = 'response'",
        bypass_guard=False,
    )
    body = json.loads(payload)
    body["response"]["answer"] = "a different answer, never given"
    backend.execute("UPDATE audit_entries SET payload = ? WHERE seq = ?", (jcs_json(body), seq))
    reseal_from(backend, seq)


def _delete_middle(backend) -> None:
    """Delete one of r1's sample entries, renumber the rest and re-hash them."""
    (row,) = backend.execute(
        "SELECT MIN(seq) FROM audit_entries WHERE request_id = 'r1' AND kind = 'sample'",
        bypass_guard=False,
    )
    gone = row[0]
    backend.execute("DELETE FROM audit_entries WHERE seq = ?", (gone,))
    (top,) = backend.execute("SELECT MAX(seq) FROM audit_entries", bypass_guard=False)
    for s in range(gone + 1, top[0] + 1):
        backend.execute("UPDATE audit_entries SET seq = ? WHERE seq = ?", (s - 1, s))
    backend.execute("UPDATE requests SET n_entries = n_entries - 1 WHERE request_id = 'r1'")
    backend.execute("UPDATE requests SET first_seq = first_seq - 1 WHERE first_seq > ?", (gone,))
    backend.execute(
        "UPDATE review_queue SET enqueued_seq = enqueued_seq - 1 WHERE enqueued_seq > ?", (gone,)
    )
    reseal_from(backend, gone)


CHAIN_ATTACKS = {
    "tail truncated, head moved back": _truncate_tail,
    "everything deleted, head reset": _delete_everything,
    "forged entry appended, head moved": _append_forged,
    "middle record modified, the rest re-hashed": _rewrite_middle,
    "middle entry deleted, the rest renumbered and re-hashed": _delete_middle,
}


@pytest.mark.parametrize("attack", list(CHAIN_ATTACKS))
def test_with_the_chain_key_every_chain_rewrite_is_detected(backend, attack) -> None:
    store = backend.open(chain_key=KEY)
    try:
        _fill(store)
        assert store.verify_chain().ok
        CHAIN_ATTACKS[attack](backend)
        report = store.verify_chain()
        assert not report.ok, attack
        assert report.keyed
    finally:
        store.close()


@pytest.mark.parametrize(
    "attack",
    [
        "tail truncated, head moved back",
        "everything deleted, head reset",
        "middle record modified, the rest re-hashed",
        "middle entry deleted, the rest renumbered and re-hashed",
    ],
)
def test_with_an_anchor_rewrites_up_to_it_are_detected(backend, attack) -> None:
    store = backend.open()
    try:
        _fill(store)
        anchor = store.head()  # exported outside the database before the attack
        CHAIN_ATTACKS[attack](backend)
        assert store.verify_chain().ok or attack == "tail truncated, head moved back"
        report = store.verify_chain(expect_head=anchor)
        assert not report.ok, attack
        assert report.anchored
    finally:
        store.close()


def test_without_key_or_anchor_a_careful_rewrite_is_not_detected(backend) -> None:
    """The documented limit: re-hashing everything consistently needs a key or an anchor."""
    store = backend.open()
    try:
        _fill(store)
        _rewrite_middle(backend)
        report = store.verify_chain()
        assert report.ok and not report.complete  # not detected, and not called intact
        assert "NOT CHECKED: no anchor" in report.summary()
    finally:
        store.close()


def test_a_store_without_the_key_cannot_be_written_as_if_unkeyed(backend) -> None:
    from tracerag.store import StoreError

    keyed = backend.open(chain_key=KEY)
    _fill(keyed)
    keyed.close()
    for key in (None, "another key"):
        store = backend.open(chain_key=key)
        try:
            with pytest.raises(StoreError, match="key"):
                store.append_record(make_record("late", decision="pass"))
        finally:
            store.close()


# -- tables the API serves are checked against the chain (no key needed) ----------------------


def test_a_rewritten_decision_in_the_review_queue_is_detected(backend) -> None:
    store = backend.open()
    try:
        _fill(store)
        backend.execute(
            "UPDATE review_queue SET action = 'approve', final_answer = 'all fine', "
            "decided_by = 'mallory' WHERE request_id = 'r0'"
        )
        report = store.verify_chain()
        details = " | ".join(i.detail for i in report.issues)
        assert not report.ok
        assert "review_queue.action" in details and "review_queue.decided_by" in details
        assert "review_queue.final_answer" in details
        assert {i.request_id for i in report.issues} == {"r0"}
    finally:
        store.close()


def test_a_deleted_pending_review_item_is_detected(backend) -> None:
    store = backend.open()
    try:
        _fill(store)
        backend.execute("DELETE FROM review_queue WHERE request_id = 'r1'")
        report = store.verify_chain()
        assert [(i.kind, i.request_id) for i in report.issues] == [("removed", "r1")]
        assert "pending" in report.issues[0].detail
    finally:
        store.close()


def test_a_changed_request_decision_is_detected(backend) -> None:
    store = backend.open()
    try:
        _fill(store)
        backend.execute("UPDATE requests SET decision = 'pass' WHERE request_id = 'r1'")
        report = store.verify_chain()
        assert [(i.kind, i.request_id) for i in report.issues] == [("changed", "r1")]
        assert "requests.decision" in report.issues[0].detail
    finally:
        store.close()


def test_the_store_records_its_identity_and_a_replaced_store_is_a_finding(backend) -> None:
    store = backend.open()
    try:
        _fill(store)
        anchor = store.head()
        identity = store.identity()
        assert identity["store_id"] and identity["genesis"] != "0" * 64
        assert store.get("r0").entries[0].prev_hash == identity["genesis"]
    finally:
        store.close()
    # the whole database is gone; a fresh one takes its place
    if backend.name == "sqlite":
        from pathlib import Path

        for suffix in ("", "-wal", "-shm"):
            Path(backend.path + suffix).unlink(missing_ok=True)
    else:
        backend.cleanup()
    fresh = backend.open()
    try:
        assert fresh.identity()["store_id"] != identity["store_id"]
        report = fresh.verify_chain(expect_head=anchor)
        assert not report.ok
        assert any("not the anchored store" in i.detail for i in report.issues)
    finally:
        fresh.close()


@pytest.mark.integration
def test_truncate_is_refused_on_postgresql() -> None:
    from store_fixtures import PostgresBackend, postgres_dsn

    pg = PostgresBackend(postgres_dsn())
    store = pg.open()
    try:
        _fill(store)
        for table in ("audit_entries", "requests", "review_queue", "chain_head", "store_meta"):
            with pytest.raises(Exception, match="cannot be truncated"):
                pg.execute(f"TRUNCATE {table} CASCADE", bypass_guard=False)
        assert store.verify_chain().ok
    finally:
        store.close()
        pg.cleanup()
