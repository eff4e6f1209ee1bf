"""Tamper evidence: the database is changed behind the store's back and verify_chain tells."""

from __future__ import annotations

import pytest
from store_fixtures import make_record

from tracerag.store._chain import (
    GENESIS_HASH,
    ChainVerifier,
    StoredRow,
    canonical_json,
    entry_hash,
)


def _fill(store, n: int = 3) -> None:
    for i in range(n):
        store.append_record(make_record(f"r{i}", decision="pass"))


def _row(backend, seq: int) -> tuple:
    rows = backend.execute(
        "SELECT seq, request_id, kind, payload, actor, created_at, prev_hash, hash "
        "FROM audit_entries WHERE seq = ?",
        (seq,),
        bypass_guard=False,
    )
    return rows[0]


# ---------------------------------------------------------------------------------------------
# Hashing


def test_canonical_json_is_deterministic() -> None:
    assert canonical_json({"b": 1, "a": [1.5, "é"]}) == '{"a":[1.5,"é"],"b":1}'
    assert canonical_json({"x": float("inf")}) == '{"x":"Infinity"}'


def test_entry_hash_covers_every_field() -> None:
    base = ("0" * 64, 1, "r", "register", "{}", "tracerag", "2025-01-01T00:00:00.000000+00:00")
    h = entry_hash(*base)
    assert len(h) == 64
    for i in range(len(base)):
        changed = list(base)
        changed[i] = changed[i] + 1 if isinstance(changed[i], int) else changed[i] + "x"
        assert entry_hash(*changed) != h


def test_verifier_on_hand_made_rows() -> None:
    rows, prev = [], GENESIS_HASH
    for seq in range(1, 6):
        h = entry_hash(prev, seq, "r", "note", "{}", "a", f"t{seq}")
        rows.append(StoredRow(seq, "r", "note", "{}", "a", f"t{seq}", prev, h))
        prev = h
    by_hash = {r.hash: r for r in rows}

    v = ChainVerifier(by_hash.get)
    for r in rows:
        v.feed(r)
    assert v.finish(5, rows[-1].hash).ok

    v = ChainVerifier(by_hash.get)
    for r in rows[:2] + rows[3:]:
        v.feed(r)
    report = v.finish(5, rows[-1].hash)
    assert [(i.kind, i.seq, i.seq_end) for i in report.issues] == [("removed", 3, 3)]


# ---------------------------------------------------------------------------------------------
# Tampering with the database (both backends)


def test_intact_chain(store) -> None:
    assert store.verify_chain().ok  # empty store
    _fill(store)
    report = store.verify_chain()
    assert report.ok, report.summary()
    assert report.checked == report.head_seq == 30
    assert report.head_hash == store.get("r2").entries[-1].hash
    # without an anchor the report does not call the chain intact: it says what it did not check
    assert not report.complete and report.summary().startswith("audit chain consistent")
    assert "NOT CHECKED: no anchor" in report.summary()
    anchored = store.verify_chain(expect_head=store.head())
    assert anchored.ok and anchored.complete and anchored.unanchored_tail == 0
    assert anchored.summary().startswith("audit chain intact")


def test_plain_update_and_delete_are_refused(backend, store) -> None:
    _fill(store, 1)
    with pytest.raises(Exception, match="append-only"):
        backend.execute("UPDATE audit_entries SET actor = 'x' WHERE seq = 1", bypass_guard=False)
    with pytest.raises(Exception, match="append-only"):
        backend.execute("DELETE FROM audit_entries WHERE seq = 1", bypass_guard=False)
    assert store.verify_chain().ok


def test_changed_payload_is_reported(backend, store) -> None:
    _fill(store)
    trail = store.get("r1")
    verify = trail.first("verify")
    payload = verify.payload
    payload["signals"]["citations"]["fabricated"] = []  # hide the fabricated citation
    backend.execute(
        "UPDATE audit_entries SET payload = ? WHERE seq = ?", (canonical_json(payload), verify.seq)
    )
    report = store.verify_chain()
    assert not report.ok
    assert [(i.kind, i.seq, i.request_id) for i in report.issues] == [("changed", verify.seq, "r1")]
    assert f"seq {verify.seq}" in report.summary()


@pytest.mark.parametrize("column", ["actor", "created_at", "kind", "request_id"])
def test_changed_metadata_is_reported(backend, store, column) -> None:
    _fill(store)
    backend.execute(f"UPDATE audit_entries SET {column} = {column} || 'x' WHERE seq = 12")
    report = store.verify_chain()
    changed = report.changed
    assert [i.seq for i in changed] == [12]


def test_rewritten_and_rehashed_entry_is_reported(backend, store) -> None:
    """An intruder who recomputes the entry's own hash still breaks the next link."""
    _fill(store)
    seq, rid, kind, _payload, actor, created_at, prev_hash, _h = _row(backend, 18)
    version = backend.execute(
        "SELECT chain_version FROM audit_entries WHERE seq = 18", bypass_guard=False
    )[0][0]
    forged = canonical_json({"confidence": 0.99, "decision": "pass"})
    new_hash = entry_hash(prev_hash, seq, rid, kind, forged, actor, created_at, version)
    backend.execute(
        "UPDATE audit_entries SET payload = ?, hash = ? WHERE seq = ?", (forged, new_hash, seq)
    )
    report = store.verify_chain()
    assert kind == "response"
    # the link check finds the entry; the derived-table check finds the index it contradicts
    assert [(i.kind, i.seq) for i in report.issues] == [("changed", 18), ("changed", None)]
    assert "requests.confidence" in report.issues[1].detail


def test_removed_entry_is_reported_with_seq_and_request(backend, store) -> None:
    _fill(store)
    backend.execute("DELETE FROM audit_entries WHERE seq = 15")
    report = store.verify_chain()
    removed = report.removed
    assert ("removed", 15, 15) in [(i.kind, i.seq, i.seq_end) for i in removed]
    assert any(i.request_id == "r1" and i.seq is None for i in removed)
    assert not report.changed and not report.reordered


def test_removed_request_is_reported(backend, store) -> None:
    _fill(store)
    backend.execute("DELETE FROM audit_entries WHERE request_id = 'r1'")
    report = store.verify_chain()
    assert [(i.seq, i.seq_end) for i in report.removed if i.seq] == [(11, 20)]
    assert [i.request_id for i in report.removed if i.seq is None] == ["r1"]


def test_removed_newest_entries_are_reported(backend, store) -> None:
    _fill(store)
    backend.execute("DELETE FROM audit_entries WHERE seq > 27")
    report = store.verify_chain()
    assert (28, 30) in [(i.seq, i.seq_end) for i in report.removed]


def test_removed_and_renumbered_entries_are_reported(backend, store) -> None:
    """Deleting an entry and closing the seq gap does not hide the deletion."""
    _fill(store)
    backend.execute("DELETE FROM audit_entries WHERE seq = 5")
    for seq in range(6, 31):
        backend.execute("UPDATE audit_entries SET seq = ? WHERE seq = ?", (seq - 1, seq))
    backend.execute("UPDATE chain_head SET last_seq = 29")
    report = store.verify_chain()
    assert not report.ok
    assert any(i.request_id == "r0" for i in report.removed)
    assert report.reordered[0].seq == 5


def test_swapped_entries_are_reported_as_reordered(backend, store) -> None:
    _fill(store)
    backend.execute("UPDATE audit_entries SET seq = -1 WHERE seq = 14")
    backend.execute("UPDATE audit_entries SET seq = 14 WHERE seq = 15")
    backend.execute("UPDATE audit_entries SET seq = 15 WHERE seq = -1")
    report = store.verify_chain()
    assert [(i.kind, i.seq) for i in report.issues] == [("reordered", 14), ("reordered", 15)]
    assert "written as seq 15" in report.issues[0].detail


def test_report_is_json_able(backend, store) -> None:
    import json

    _fill(store, 1)
    backend.execute("DELETE FROM audit_entries WHERE seq = 3")
    data = json.loads(json.dumps(store.verify_chain().to_dict()))
    assert data["ok"] is False and data["issues"][0]["kind"] == "removed"


def test_appending_continues_the_chain_after_reopen(backend) -> None:
    s = backend.open()
    _fill(s, 1)
    s.close()
    s = backend.open()
    try:
        s.append_record(make_record("later", decision="pass"))
        first = s.get("later").entries[0]
        assert first.seq == 11
        assert first.prev_hash == s.get("r0").entries[-1].hash
        assert s.verify_chain().ok
    finally:
        s.close()


# ---------------------------------------------------------------------------------------------
# Canonical JSON per RFC 8785, so a third party can re-verify the chain


def test_jcs_json_is_rfc8785_where_rfc8785_can_write_the_value() -> None:
    import json

    import rfc8785
    from hypothesis import given, settings
    from hypothesis import strategies as st
    from hypothesis_budget import examples

    from tracerag.store._chain import jcs_json

    scalars = (
        st.none()
        | st.booleans()
        | st.integers(min_value=-(2**53) + 1, max_value=2**53 - 1)
        # integral floats beyond 2^53 read back as other integers from JCS: version 1 text
        | st.floats(allow_nan=False, allow_infinity=False).filter(
            lambda f: not (f.is_integer() and abs(f) > 2**53)
        )
        | st.text()
    )
    values = st.recursive(
        scalars,
        lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.text(), inner, max_size=4),
        max_leaves=20,
    )

    @settings(max_examples=examples(150), deadline=None)
    @given(values)
    def check(value) -> None:
        assert jcs_json(value) == rfc8785.dumps(value).decode("utf-8")
        assert json.loads(jcs_json(value)) == json.loads(json.dumps(value))

    check()


def test_a_chain_can_be_re_verified_with_any_jcs_implementation(store) -> None:
    """What a third party does: SHA-256 over the JCS array of the stored fields."""
    import hashlib

    import rfc8785

    _fill(store, 1)
    entries = store.get("r0").entries
    assert {e.chain_version for e in entries} == {2}
    for e in entries:
        material = ["tracerag-chain-v2", e.prev_hash, e.seq, e.request_id, e.kind]
        material += [e.payload_json, e.actor, e.created_at]
        assert hashlib.sha256(rfc8785.dumps(material)).hexdigest() == e.hash


def test_a_material_change_is_sealed_like_any_entry(store) -> None:
    """A material_change entry: its payload is RFC 8785 text, re-verifiable by a third party,
    it is chained between request entries, and it belongs to no request."""
    import hashlib

    import rfc8785

    from tracerag.store import InvalidRecord, RequestNotFound

    _fill(store, 1)
    change = {"material_change": {"material_id": "fee", "version": 1, "ratio": 0.1, "n": 10}}
    sealed = store.append_material_change("fee", "alice", change, "new fee")
    store.append_record(make_record("r-after"))
    assert sealed.kind == "material_change" and sealed.request_id == "fee"
    assert sealed.payload_json == rfc8785.dumps({**change, "reason": "new fee"}).decode("utf-8")
    material = ["tracerag-chain-v2", sealed.prev_hash, sealed.seq, "fee", "material_change"]
    material += [sealed.payload_json, "alice", sealed.created_at]
    assert hashlib.sha256(rfc8785.dumps(material)).hexdigest() == sealed.hash
    assert store.material_changes() == [sealed] == store.material_changes("fee")
    assert store.material_changes("other") == []
    with pytest.raises(RequestNotFound):
        store.get("fee")
    assert "fee" not in {r.request_id for r in store.list_requests()}
    report = store.verify_chain()
    assert report.ok and report.checked == len(store.get("r0").entries) + 1 + len(
        store.get("r-after").entries
    )
    with pytest.raises(InvalidRecord):
        store.append_material_change("fee", " ", change)
