"""The pipeline's audit trail: everything written can be read back by request_id; a store
that is down never fails a request and never loses a record silently."""

from __future__ import annotations

import logging

from pipeline_fixtures import FABRICATED, GOOD, QUESTION, scripted
from waiting import wait_until

from tracerag.store import open_store
from tracerag.store._writer import AuditWriter


def test_default_store_records_each_request_readably(make_pipeline, _audit_store_in_temp_dir):
    pipeline = make_pipeline(scripted([GOOD]))
    response = pipeline.invoke(QUESTION)
    assert response.audit_persisted is True
    writer = pipeline.settings.record_sink.writer
    assert writer.flush(timeout=10)
    store = open_store(str(_audit_store_in_temp_dir))
    trail = store.get(response.request_id)
    assert trail.trace_id == response.trace_id
    assert trail.decision == "pass"
    assert trail.versions["prompt"] == "test-prompt-v1"
    assert len(trail.samples) == 5
    assert trail.claims[0]["verdict"] == "supported"
    assert store.verify_chain().ok


def test_escalated_request_enters_the_review_queue(make_pipeline, tmp_path):
    store = open_store(str(tmp_path / "a.sqlite"))
    pipeline = make_pipeline(scripted([FABRICATED]), audit=store)
    response = pipeline.invoke(QUESTION)
    assert response.decision == "escalate"
    assert pipeline.settings.record_sink.writer.flush(timeout=10)
    queued = [item.request_id for item in store.list_queue()]
    assert queued == [response.request_id]
    trail = store.get(response.request_id)
    assert trail.cited_not_retrieved == ["policy-99"]


class DownStore:
    """A store whose every write fails, like a database that is unreachable."""

    def __init__(self):
        self.attempts = 0

    def append_record(self, record):
        self.attempts += 1
        raise ConnectionError("store unreachable")

    def close(self):
        pass


def test_store_down_still_answers_and_says_so(make_pipeline, caplog):
    store = DownStore()
    writer = AuditWriter(store, max_buffer=1, backoff_initial=0.01, backoff_max=0.02)
    pipeline = make_pipeline(scripted([GOOD]), audit=writer)
    with caplog.at_level(logging.ERROR, logger="tracerag.audit"):
        first = pipeline.invoke(QUESTION)
        writer_had_failure = wait_until(
            lambda: not writer.healthy, "the writer to find the store down", timeout=2
        )
        second = pipeline.invoke(QUESTION)
        third = pipeline.invoke(QUESTION)
    assert first.decision == second.decision == third.decision == "pass"
    assert writer_had_failure
    assert second.audit_persisted is False and third.audit_persisted is False
    assert writer.dropped >= 1
    assert third.request_id in caplog.text or second.request_id in caplog.text
    writer.close(timeout=0.1)


def test_no_store_configured_means_no_trail_and_no_file(make_pipeline, tmp_path, monkeypatch):
    """A library call never writes into the caller's working directory by default."""
    from tracerag.config import reset_config

    monkeypatch.chdir(tmp_path)
    monkeypatch.delenv("TRACERAG_STORE", raising=False)
    reset_config()
    pipeline = make_pipeline(scripted([GOOD]))
    response = pipeline.invoke(QUESTION)
    assert response.decision == "pass"
    assert response.audit_persisted is None  # nothing claims a trail that does not exist
    assert pipeline.settings.record_sink is None
    assert list(tmp_path.iterdir()) == []


def test_persisted_true_means_journaled_even_while_the_store_is_locked(make_pipeline, tmp_path):
    """Issue: `audit_persisted: true` was said of records held only in memory."""
    import sqlite3

    from tracerag.store._journal import read_frames

    path = tmp_path / "a.sqlite"
    open_store(str(path)).close()
    holder = sqlite3.connect(path, isolation_level=None)
    holder.execute("BEGIN EXCLUSIVE")  # another process holds the store
    try:
        pipeline = make_pipeline(scripted([GOOD]), audit=str(path))
        response = pipeline.invoke(QUESTION)
        assert response.audit_persisted is True
        writer = pipeline.settings.record_sink.writer
        assert writer.status()["journal"] == str(path) + ".journal"
        # it is on disk in the journal, before the store has it
        frames = read_frames(str(path) + ".journal")
        assert any(response.request_id.encode() in payload for _, payload in frames)
    finally:
        holder.execute("ROLLBACK")
        holder.close()
    assert writer.flush(timeout=10)
    assert open_store(str(path), create=False).get(response.request_id).decision == "pass"


def test_without_a_journal_a_locked_store_gets_false_not_a_promise(make_pipeline, tmp_path):
    import sqlite3

    from tracerag.store._sqlite import SQLiteAuditStore

    path = tmp_path / "a.sqlite"
    store = SQLiteAuditStore(path, busy_timeout_s=0.05)
    holder = sqlite3.connect(path, isolation_level=None)
    holder.execute("BEGIN EXCLUSIVE")
    try:
        pipeline = make_pipeline(scripted([GOOD]), audit=store)
        response = pipeline.invoke(QUESTION)
        assert response.audit_persisted is False
    finally:
        holder.execute("ROLLBACK")
        holder.close()
    writer = pipeline.settings.record_sink.writer
    assert writer.flush(timeout=10)
    assert writer.persisted(response.request_id) is True  # written later, and said so then
    writer.close()
    store.close()
