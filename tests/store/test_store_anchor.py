"""The exported chain head (the anchor): written within a second, only ever forward, where the
operator says; ``tracerag audit verify`` uses it, and says so when it has none or lacks the key.

Issue 22: a truncation confined to entries after the last exported head (exported every 10 s)
passed plain verify; a keyed store verified without the key exited 0; PostgreSQL exported no
head by default, and a store emptied with its triggers disabled and its head reset passed.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from store_fixtures import Backend, PostgresBackend, make_record
from tamper import KEY, genesis
from waiting import wait_until

from tracerag import cli
from tracerag.store import AuditWriter

FAST = {"backoff_initial": 0.01, "backoff_max": 0.05}


def wait_for(predicate, timeout: float = 10.0) -> None:
    wait_until(predicate, timeout=timeout, interval=0.02)


def store_url(backend: Backend) -> str:
    """The backend's store as ``--store`` takes it."""
    if isinstance(backend, PostgresBackend):
        sep = "&" if "?" in backend.dsn else "?"
        return f"{backend.dsn}{sep}options=-csearch_path%3D{backend.schema}"
    return backend.path  # type: ignore[attr-defined]


def _writer(backend: Backend, journal: Path, key: str | None = None, **options) -> AuditWriter:
    def opener(create: bool = True):
        return backend.open(create=create, chain_key=key)

    return AuditWriter(opener, journal=journal, **options)


def _read(path: Path) -> dict:
    return json.loads(path.read_text())


def _truncate_newest(backend: Backend, request_id: str) -> None:
    """Delete a request's entries (the newest) and move the head back, as an intruder would."""
    backend.execute("DELETE FROM review_queue WHERE request_id = ?", (request_id,))
    backend.execute("DELETE FROM audit_entries WHERE request_id = ?", (request_id,))
    backend.execute("DELETE FROM requests WHERE request_id = ?", (request_id,))
    (last,) = backend.execute(
        "SELECT seq, hash FROM audit_entries ORDER BY seq DESC LIMIT 1", bypass_guard=False
    )
    backend.execute(
        "UPDATE chain_head SET last_seq = ?, last_hash = ? WHERE id = 1", (last[0], last[1])
    )


def _empty(backend: Backend) -> None:
    """Empty the store (triggers disabled) and reset its head to the genesis."""
    for table in ("review_queue", "audit_entries", "requests"):
        backend.execute(f"DELETE FROM {table}")
    backend.execute(
        "UPDATE chain_head SET last_seq = 0, last_hash = ?, mac = NULL WHERE id = 1",
        (genesis(backend),),
    )


def test_the_head_is_anchored_within_a_second_and_never_moved_back(
    backend, tmp_path, capsys
) -> None:
    journal = tmp_path / "journal"
    anchor = journal / "head.json"

    def stored_head() -> int:
        store = backend.open()
        try:
            return int(store.head()["seq"])
        finally:
            store.close()

    writer = _writer(backend, journal, **FAST)
    try:
        assert writer.submit_durable(make_record("r1", decision="pass"))
        assert writer.flush(10)
        first = stored_head()
        wait_for(lambda: anchor.is_file() and _read(anchor)["seq"] == first, 5.0)
        for rid in ("r2", "r3"):
            assert writer.submit_durable(make_record(rid, decision="pass"))
        assert writer.flush(10)
        head = stored_head()
        # the newer head is exported within about a second too (it was every 10 s)
        wait_for(lambda: _read(anchor)["seq"] == head > first, 5.0)
        exported = _read(anchor)
        _truncate_newest(backend, "r3")  # the writer is still running
        wait_for(lambda: writer.status()["anchor_conflict"] is not None, 5.0)
        assert "entries were removed" in writer.status()["anchor_conflict"]
        assert _read(anchor) == exported  # the anchor was not moved back onto the truncation
    finally:
        writer.close()
    assert _read(anchor) == exported  # nor at close
    store = backend.open()
    try:
        report = store.verify_chain(expect_head=exported)
        assert not report.ok and report.removed
    finally:
        store.close()
    if backend.name == "sqlite":  # found by audit verify beside the store's journal
        journal.rename(backend.path + ".journal")  # type: ignore[attr-defined]
        assert cli.main(["audit", "verify", "--store", store_url(backend)]) == 1
        out = capsys.readouterr().out
        assert "anchored to head" in out and "entries were removed" in out


def test_an_emptied_store_is_detected_with_the_anchor_the_operator_placed(
    backend, tmp_path, monkeypatch, capsys
) -> None:
    """The anchor goes where TRACERAG_AUDIT_ANCHOR says, on every backend, and verify finds it
    there; an emptied store (triggers disabled, head reset) is then a finding, and without the
    anchor verify does not call it intact."""
    anchors = tmp_path / "elsewhere"
    anchors.mkdir()
    monkeypatch.setenv("TRACERAG_AUDIT_ANCHOR", str(anchors))
    writer = _writer(backend, tmp_path / "journal", **FAST)
    try:
        for rid in ("r1", "r2"):
            assert writer.submit_durable(make_record(rid, decision="pass"))
        assert writer.flush(10)
    finally:
        assert writer.close()
    assert (anchors / "head.json").is_file() and _read(anchors / "head.json")["seq"] > 0
    assert not (tmp_path / "journal" / "head.json").exists()  # only where the operator said
    url = store_url(backend)
    assert cli.main(["audit", "verify", "--store", url]) == 0
    assert "audit chain intact" in capsys.readouterr().out

    _empty(backend)
    assert cli.main(["audit", "verify", "--store", url]) == 1
    out = capsys.readouterr().out
    assert "BROKEN" in out and "entries were removed" in out

    monkeypatch.delenv("TRACERAG_AUDIT_ANCHOR")
    assert cli.main(["audit", "verify", "--store", url]) == 3  # no anchor: not "intact"
    out = capsys.readouterr().out
    assert "no anchor" in out and "NOT CHECKED" in out and "intact" not in out


def test_a_keyed_store_verified_without_the_key_says_so_and_is_not_intact(
    backend, tmp_path, monkeypatch, capsys
) -> None:
    monkeypatch.setenv("TRACERAG_CHAIN_KEY", KEY)
    monkeypatch.setenv("TRACERAG_AUDIT_ANCHOR", str(tmp_path / "head.json"))
    writer = _writer(backend, tmp_path / "journal", KEY, **FAST)
    try:
        assert writer.submit_durable(make_record("r1", decision="pass"))
        assert writer.flush(10)
    finally:
        assert writer.close()
    url = store_url(backend)
    assert cli.main(["audit", "verify", "--store", url]) == 0
    assert "audit chain intact" in capsys.readouterr().out

    monkeypatch.delenv("TRACERAG_CHAIN_KEY")
    assert cli.main(["audit", "verify", "--store", url]) == 3
    out = capsys.readouterr().out
    assert "NOT CHECKED" in out and "chain key was not given" in out and "intact" not in out
    assert cli.main(["audit", "verify", "--store", url, "--json"]) == 3
    report = json.loads(capsys.readouterr().out)
    assert report["store_keyed"] and not report["keyed"] and not report["complete"]


def test_a_writer_without_a_journal_exports_only_where_told(tmp_path, monkeypatch) -> None:
    from tracerag.store import open_store

    path = str(tmp_path / "a.sqlite")
    writer = AuditWriter(lambda create=True: open_store(path, create=create), **FAST)
    assert writer.anchor is None  # no journal, no anchor configured: nothing is written
    writer.close()
    monkeypatch.setenv("TRACERAG_AUDIT_ANCHOR", str(tmp_path / "anchor.json"))
    writer = AuditWriter(lambda create=True: open_store(path, create=create), **FAST)
    try:
        assert writer.submit_durable(make_record("r1", decision="pass"))
        assert writer.flush(10)
    finally:
        writer.close()
    assert _read(tmp_path / "anchor.json")["seq"] > 0
    off = AuditWriter(
        lambda create=True: open_store(path, create=create), journal=tmp_path / "j", anchor=False
    )
    off.close()
    assert not (tmp_path / "j" / "head.json").exists()


@pytest.mark.parametrize("garbage", ["", "{not json", '{"seq": "x"}'])
def test_an_unreadable_anchor_is_replaced_by_the_next_export(tmp_path, garbage) -> None:
    from tracerag.store import open_store

    path = str(tmp_path / "a.sqlite")
    anchor = tmp_path / "head.json"
    anchor.write_text(garbage)
    writer = AuditWriter(lambda create=True: open_store(path, create=create), anchor=anchor, **FAST)
    try:
        assert writer.submit_durable(make_record("r1", decision="pass"))
        assert writer.flush(10)
        wait_for(lambda: _read(anchor).get("seq", 0) > 0, 5.0)
    finally:
        writer.close()


def test_the_anchor_of_an_empty_store_moves_forward_with_the_first_records(tmp_path) -> None:
    """A server starts on an empty store and exports seq 0 before any answer: that anchor is
    extended by the first records, not mistaken for a rewritten chain."""
    from tracerag.store import open_store

    path = str(tmp_path / "a.sqlite")
    anchor = tmp_path / "journal" / "head.json"
    writer = AuditWriter(
        lambda create=True: open_store(path, create=create), journal=tmp_path / "journal", **FAST
    )
    try:
        wait_for(lambda: anchor.is_file(), 5.0)
        assert _read(anchor)["seq"] == 0
        assert writer.submit_durable(make_record("r1", decision="pass"))
        assert writer.flush(10)
        wait_for(lambda: _read(anchor)["seq"] > 0, 5.0)
        assert writer.status()["anchor_conflict"] is None
    finally:
        writer.close()
