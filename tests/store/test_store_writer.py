"""AuditWriter: writing never slows or breaks the answer, and no record is lost silently."""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable, Mapping
from typing import Any

import pytest
from store_fixtures import make_record
from waiting import wait_until

from tracerag.store import AuditWriter, DuplicateRequest, InvalidRecord
from tracerag.store._sqlite import SQLiteAuditStore

FAST = {"backoff_initial": 0.01, "backoff_max": 0.05}


class FakeStore:
    """An in-memory store that can be taken down, slowed or held."""

    def __init__(self) -> None:
        self.records: list[Mapping[str, Any]] = []
        self.down = False
        self.delay = 0.0
        self.gate = threading.Event()
        self.gate.set()
        self.calls = 0

    def append_record(self, record: Mapping[str, Any]) -> None:
        self.gate.wait(10)
        self.calls += 1
        if self.delay:
            time.sleep(self.delay)
        if self.down:
            raise ConnectionError("audit database unreachable")
        if not isinstance(record, Mapping) or not record.get("request_id"):
            raise InvalidRecord("no request_id")
        if any(r["request_id"] == record["request_id"] for r in self.records):
            raise DuplicateRequest(record["request_id"])
        self.records.append(record)

    @property
    def ids(self) -> list[str]:
        return [r["request_id"] for r in self.records]


def wait_for(predicate: Callable[[], bool], timeout: float = 5.0) -> None:
    wait_until(predicate, timeout=timeout, interval=0.005)


class Drops:
    """An on_drop hook that remembers what it was told."""

    def __init__(self) -> None:
        self.calls: list[tuple[str, str]] = []

    def __call__(self, record: Mapping[str, Any], reason: str) -> None:
        rid = record.get("request_id") if isinstance(record, Mapping) else None
        self.calls.append((str(rid), reason))


def test_records_are_written_in_submission_order(tmp_path) -> None:
    store = SQLiteAuditStore(tmp_path / "a.sqlite")
    writer = AuditWriter(store, **FAST)
    try:
        ids = [f"r{i:02d}" for i in range(20)]
        assert all(writer.submit(make_record(rid, decision="pass")) for rid in ids)
        assert writer.flush(10)
        assert writer.pending == 0 and writer.written == 20 and writer.dropped == 0
        assert all(writer.persisted(rid) is True for rid in ids)
        assert writer.healthy
        firsts = [store.get(rid).entries[0].seq for rid in ids]
        assert firsts == sorted(firsts)
        assert store.verify_chain().ok
    finally:
        writer.close()
        store.close()


def test_outage_is_retried_with_backoff_and_reported(caplog) -> None:
    caplog.set_level(logging.WARNING, logger="tracerag.audit")
    store = FakeStore()
    store.down = True
    writer = AuditWriter(store, **FAST)
    try:
        assert writer.submit(make_record("a"))
        assert writer.submit(make_record("b"))
        wait_for(lambda: writer.failures >= 3)
        assert not writer.healthy
        assert isinstance(writer.last_error, ConnectionError)
        assert writer.persisted("a") is None and writer.pending == 2
        assert "request_id=a" in caplog.text and "retrying" in caplog.text
        store.down = False
        assert writer.flush(5)
        assert store.ids == ["a", "b"]
        assert writer.healthy and writer.last_error is None
        assert writer.persisted("a") is True and writer.dropped == 0
    finally:
        writer.close()


def test_full_buffer_refuses_the_newest_record_and_names_it(caplog) -> None:
    caplog.set_level(logging.ERROR, logger="tracerag.audit")
    store = FakeStore()
    store.gate.clear()  # the store hangs
    drops = Drops()
    writer = AuditWriter(store, max_buffer=2, on_drop=drops, **FAST)
    try:
        assert writer.submit(make_record("a"))
        assert writer.submit(make_record("b"))
        assert not writer.healthy  # full
        assert writer.submit(make_record("c")) is False
        assert writer.dropped == 1
        assert drops.calls == [("c", "buffer_full")]
        assert writer.persisted("c") is False
        lost = [r for r in caplog.records if r.name == "tracerag.audit" and "LOST" in r.message]
        assert len(lost) == 1 and "request_id=c" in lost[0].message
        assert "buffer_full" in lost[0].message
        store.gate.set()
        assert writer.flush(5)
        assert store.ids == ["a", "b"]  # accepted records were never evicted
        assert writer.healthy
    finally:
        store.gate.set()
        writer.close()


def test_an_invalid_record_is_dropped_without_blocking_the_rest(caplog) -> None:
    caplog.set_level(logging.ERROR, logger="tracerag.audit")
    store = FakeStore()
    drops = Drops()
    writer = AuditWriter(store, on_drop=drops, **FAST)
    try:
        assert writer.submit({"question": "no id"})
        assert writer.submit(make_record("ok"))
        assert writer.flush(5)
        assert store.ids == ["ok"]
        assert writer.dropped == 1 and drops.calls[0][1].startswith("invalid_record")
        assert "<no request_id>" in caplog.text
        assert writer.healthy
    finally:
        writer.close()


def test_a_record_already_stored_counts_as_written() -> None:
    store = FakeStore()
    store.records.append(make_record("dup"))
    writer = AuditWriter(store, **FAST)
    try:
        writer.submit(make_record("dup"))
        assert writer.flush(5)
        assert writer.persisted("dup") is True and writer.dropped == 0
    finally:
        writer.close()


def test_close_drops_what_it_cannot_write_and_says_so(caplog) -> None:
    caplog.set_level(logging.ERROR, logger="tracerag.audit")
    store = FakeStore()
    store.down = True
    drops = Drops()
    writer = AuditWriter(store, on_drop=drops, **FAST)
    writer.submit(make_record("x1"))
    writer.submit(make_record("x2"))
    assert writer.close(timeout=0.3) is False
    assert writer.status()["closed"]  # it gave up on the down store instead of retrying on
    assert not writer._thread.is_alive()
    assert drops.calls == [("x1", "shutdown"), ("x2", "shutdown")]
    assert writer.dropped == 2
    assert "request_id=x1" in caplog.text and "request_id=x2" in caplog.text
    assert writer.submit(make_record("late")) is False
    assert drops.calls[-1] == ("late", "writer_closed")
    assert not writer.healthy


def test_close_writes_everything_when_it_can(tmp_path) -> None:
    store = SQLiteAuditStore(tmp_path / "a.sqlite")
    with AuditWriter(store, **FAST) as writer:
        for i in range(5):
            writer.submit(make_record(f"c{i}", decision="pass"))
    assert writer.written == 5
    assert len(store.list_requests()) == 5
    store.close()


def test_write_now_is_synchronous_and_raises(tmp_path) -> None:
    store = SQLiteAuditStore(tmp_path / "a.sqlite")
    writer = AuditWriter(store, **FAST)
    try:
        writer.write_now(make_record("now", decision="pass"))
        assert store.get("now").decision == "pass"
        assert writer.persisted("now") is True
        with pytest.raises(DuplicateRequest):
            writer.write_now(make_record("now", decision="pass"))
    finally:
        writer.close()
        store.close()


def test_a_store_that_cannot_be_opened_yet_is_opened_later(tmp_path) -> None:
    attempts = []

    def opener() -> SQLiteAuditStore:
        attempts.append(1)
        if len(attempts) < 3:
            raise ConnectionError("database not up yet")
        return SQLiteAuditStore(tmp_path / "late.sqlite")

    writer = AuditWriter(opener, probe_idle=False, **FAST)
    try:
        assert writer.healthy  # nothing has failed yet (no probe at start)
        writer.submit(make_record("early", decision="pass"))
        assert writer.flush(5)
        # the write failed once; the store was then probed until it opened
        assert len(attempts) == 3 and writer.failures >= 1
        assert writer.persisted("early") is True
    finally:
        writer.close()


def test_submit_cost_does_not_depend_on_the_store() -> None:
    store = FakeStore()
    store.delay = 0.05  # a slow database: 50 ms per record
    writer = AuditWriter(store, max_buffer=1000, **FAST)
    try:
        records = [make_record(f"s{i}") for i in range(200)]
        for record in records:
            assert writer.submit(record)
        # every submit has returned while the slow store has written only a few: submitting
        # does not wait for the store (inline writes would have taken 200 × 50 ms first)
        assert len(store.records) < 200
        store.delay = 0.0
        assert writer.flush(10)
        assert len(store.records) == 200
    finally:
        writer.close()


def test_a_failing_drop_hook_is_logged_not_raised(caplog) -> None:
    caplog.set_level(logging.ERROR, logger="tracerag.audit")
    store = FakeStore()
    store.gate.clear()

    def bad_hook(record: Mapping[str, Any], reason: str) -> None:
        raise RuntimeError("metrics backend down")

    writer = AuditWriter(store, max_buffer=1, on_drop=bad_hook, **FAST)
    try:
        writer.submit(make_record("a"))
        assert writer.submit(make_record("b")) is False
        assert "on_drop hook failed for request_id=b" in caplog.text
    finally:
        store.gate.set()
        writer.close()


def test_writer_with_each_backend(backend) -> None:
    store = backend.open()
    writer = AuditWriter(store, **FAST)
    try:
        for i in range(6):
            writer.submit(make_record(f"b{i}", decision=["pass", "review", "escalate"][i % 3]))
        assert writer.flush(10)
        assert len(store.list_requests()) == 6
        assert [i.request_id for i in store.list_queue()] == ["b2", "b5", "b1", "b4"]
        assert store.verify_chain().ok
    finally:
        writer.close()
        store.close()


class GatedStore:
    """A real store behind a gate, so records pile up into one batch."""

    def __init__(self, store: Any) -> None:
        self.store = store
        self.gate = threading.Event()
        self.batches: list[int] = []

    def append_record(self, record: Mapping[str, Any]) -> None:
        self.gate.wait(10)
        self.batches.append(1)
        self.store.append_record(record)

    def append_records(self, records: list[Mapping[str, Any]]) -> list:
        self.gate.wait(10)
        self.batches.append(len(records))
        return self.store.append_records(records)


def test_buffered_records_are_written_in_batches(tmp_path) -> None:
    real = SQLiteAuditStore(tmp_path / "a.sqlite")
    real.append_record(make_record("stored-before", decision="pass"))
    store = GatedStore(real)
    drops = Drops()
    writer = AuditWriter(store, batch_size=50, on_drop=drops, **FAST)
    try:
        writer.submit(make_record("first", decision="pass"))
        wait_for(lambda: writer.pending == 1)
        ids = [f"b{i:02d}" for i in range(60)]
        for rid in ids:
            writer.submit(make_record(rid, decision="pass"))
        writer.submit({"question": "no id"})
        writer.submit(make_record("stored-before", decision="pass"))
        writer.submit(make_record("b00", decision="pass"))  # repeated
        store.gate.set()
        assert writer.flush(10)
        # the record without a request_id is quarantined by the writer: it never reaches a batch
        assert sum(store.batches) == 63 and 1 < max(store.batches) <= 50
        assert writer.written == 63 and writer.dropped == 1
        assert drops.calls[0][1].startswith("invalid_record")
        assert all(writer.persisted(rid) for rid in ["first", *ids, "stored-before"])
        firsts = [real.get(rid).entries[0].seq for rid in ["first", *ids]]
        assert firsts == sorted(firsts)
        assert real.verify_chain().ok
    finally:
        store.gate.set()
        writer.close()
        real.close()


class PickyBatchStore(FakeStore):
    """Refuses a whole batch when one record in it is bad (as a database may)."""

    def append_records(self, records: list[Mapping[str, Any]]) -> list:
        self.gate.wait(10)
        if any(r.get("poison") for r in records):
            raise InvalidRecord("value out of range in one of the rows")
        for r in records:
            self.records.append(r)
        return [None] * len(records)

    def append_record(self, record: Mapping[str, Any]) -> None:
        if record.get("poison"):
            raise InvalidRecord("value out of range")
        super().append_record(record)


def test_a_batch_refused_as_a_whole_is_retried_record_by_record() -> None:
    store = PickyBatchStore()
    store.gate.clear()
    drops = Drops()
    writer = AuditWriter(store, on_drop=drops, **FAST)
    try:
        writer.submit(make_record("p0"))
        wait_for(lambda: writer.pending == 1)
        for rid in ["p1", "p2"]:
            writer.submit(make_record(rid))
        writer.submit(make_record("bad", poison=True))
        writer.submit(make_record("p3"))
        store.gate.set()
        assert writer.flush(5)
        assert store.ids == ["p0", "p1", "p2", "p3"]
        assert [d[0] for d in drops.calls] == ["bad"]
        assert writer.healthy
    finally:
        store.gate.set()
        writer.close()
