"""The audit journal: what an answer calls persisted survives kill -9, a poisoned record is
isolated, a hung, vanished or replaced store is noticed and never papered over."""

from __future__ import annotations

import json
import logging
import os
import signal
import sqlite3
import subprocess
import sys
import textwrap
import threading
import time
from pathlib import Path

import pytest
from pipeline_fixtures import REPO
from store_fixtures import make_record, stored_request_ids
from waiting import wait_until

from tracerag.store import AuditWriter, Journal, StoreMissing, open_store
from tracerag.store._journal import HEAD_FILE, IDENTITY_FILE, JournalBusy, open_journal, read_frames
from tracerag.store._sqlite import SQLiteAuditStore

FAST = {"backoff_initial": 0.01, "backoff_max": 0.05}
ROOT = REPO


def wait_for(predicate, timeout: float = 10.0) -> None:
    wait_until(predicate, timeout=timeout)


def _opener(path):
    def opener(create: bool = True):
        return open_store(str(path), create=create)

    return opener


# -- poisoned records --------------------------------------------------------------------------


def test_a_lone_surrogate_is_quarantined_and_blocks_nothing(tmp_path, caplog) -> None:
    """Issue: one "\\ud800" made hashing raise, was retried forever and blocked every record."""
    caplog.set_level(logging.ERROR, logger="tracerag.audit")
    path = tmp_path / "a.sqlite"
    writer = AuditWriter(_opener(path), journal=tmp_path / "journal", **FAST)
    try:
        assert writer.submit_durable(make_record("before", decision="pass"))
        poisoned = make_record("poisoned", decision="pass", question="bad \ud800 text")
        assert writer.submit_durable(poisoned) is False  # not stored as given: never claimed
        assert writer.submit_durable(make_record("after", decision="pass"))
        assert writer.flush(10)
        assert writer.healthy and writer.quarantined == 1 and writer.dropped == 0
        assert writer.persisted("after") is True and writer.persisted("poisoned") is False
    finally:
        writer.close()
    store = SQLiteAuditStore(path)
    try:
        assert [s.request_id for s in store.list_requests()] == ["after", "poisoned", "before"]
        (entry,) = store.get("poisoned").entries
        assert entry.kind == "quarantined"
        assert "surrogate" in entry.payload["reason"] or "Unicode" in entry.payload["reason"]
        assert json.loads(entry.payload["raw"])["question"] == "bad \ud800 text"  # lossless
        assert store.verify_chain().ok
    finally:
        store.close()
    assert "poisoned" in caplog.text and "QUARANTINED" in caplog.text


def test_the_store_itself_refuses_a_surrogate_as_invalid_not_as_a_failure(tmp_path) -> None:
    from tracerag.store import InvalidRecord

    store = SQLiteAuditStore(tmp_path / "a.sqlite")
    try:
        for bad in (
            make_record("q", question="\udc80"),
            make_record("\ud800"),
            make_record("s", samples=["fine", {"text": "x\ud800"}]),
        ):
            try:
                store.append_record(bad)
            except InvalidRecord:
                continue
            raise AssertionError(f"stored {bad['request_id']!r}")
        assert store.list_requests() == []
    finally:
        store.close()


class OneBadRecordStore:
    """A real store that fails (like a driver bug) on one record only, whatever the retry."""

    def __init__(self, store) -> None:
        self.store = store

    def append_record(self, record) -> None:
        if record.get("request_id") == "bad":
            raise sqlite3.OperationalError("cannot store this one")
        self.store.append_record(record)

    def append_quarantined(self, *args) -> None:
        self.store.append_quarantined(*args)

    def ping(self) -> None:
        self.store.ping()


def test_a_record_that_keeps_failing_while_the_store_answers_is_quarantined(tmp_path) -> None:
    real = SQLiteAuditStore(tmp_path / "a.sqlite")
    writer = AuditWriter(OneBadRecordStore(real), **FAST)
    try:
        for rid in ("ok1", "bad", "ok2"):
            writer.submit(make_record(rid, decision="pass"))
        assert writer.flush(10)
        assert [s.request_id for s in real.list_requests()] == ["ok2", "bad", "ok1"]
        assert real.get("bad").entries[0].kind == "quarantined"
        assert writer.quarantined == 1 and writer.dropped == 0
    finally:
        writer.close()
        real.close()


# -- the buffer is bounded by bytes ------------------------------------------------------------


class HeldStore:
    def __init__(self) -> None:
        self.gate = threading.Event()
        self.records: list = []

    def append_record(self, record) -> None:
        self.gate.wait(10)
        self.records.append(record)


def test_the_memory_buffer_is_bounded_by_bytes_as_well_as_count() -> None:
    from tracerag.store._buffer import encode_record

    big = "x" * 6000
    size = encode_record(make_record("b0", question=big)).size
    store = HeldStore()
    writer = AuditWriter(store, max_buffer=1000, max_buffer_bytes=int(2.5 * size), **FAST)
    try:
        accepted = [writer.submit(make_record(f"b{i}", question=big)) for i in range(6)]
        # one may be taken by the writer thread (held at the store), two fill the buffer
        assert accepted[:2] == [True, True] and accepted[-1] is False
        assert writer.status()["buffered_bytes"] <= 2.5 * size
        assert writer.dropped == accepted.count(False)
    finally:
        store.gate.set()
        writer.close()


# -- durable means durable ---------------------------------------------------------------------


def test_without_a_journal_true_means_committed_and_a_down_store_gets_false(tmp_path) -> None:
    class Down:
        def append_record(self, record):
            raise ConnectionError("unreachable")

    store = SQLiteAuditStore(tmp_path / "a.sqlite")
    writer = AuditWriter(store, **FAST)
    try:
        assert writer.submit_durable(make_record("c", decision="pass"))
        assert store.get("c").decision == "pass"  # committed before the answer said so
    finally:
        writer.close()
        store.close()
    writer = AuditWriter(Down(), durable_timeout=5.0, **FAST)
    try:
        assert writer.submit_durable(make_record("d")) is False
        assert writer.persisted("d") is None  # still pending: it may yet be written
    finally:
        writer.close(timeout=0.1)


CHILD = textwrap.dedent(
    """
    import sys
    from tracerag.store import AuditWriter, open_store

    store_path, journal, n = sys.argv[1], sys.argv[2], int(sys.argv[3])

    def opener(create=True):
        return open_store(store_path, create=create)

    writer = AuditWriter(opener, journal=journal, backoff_initial=0.01, backoff_max=0.05)
    record = {"request_id": "", "question": "q", "decision": "pass", "confidence": 0.9}
    for i in range(n):
        rid = f"k{i:05d}"
        if writer.submit_durable({**record, "request_id": rid}):
            print(rid, flush=True)
    print("DONE", flush=True)
    sys.stdin.read()  # wait to be killed
    """
)


@pytest.mark.integration  # a child process killed with SIGKILL: an integration test
def test_kill_9_loses_no_record_that_was_reported_persisted(tmp_path) -> None:
    """Issue: kill -9 lost up to 1,216 records per round, each reported as persisted."""
    path = tmp_path / "a.sqlite"
    journal = tmp_path / "a.sqlite.journal"
    SQLiteAuditStore(path).close()
    # Another process holds the store's write lock: nothing the child acknowledges can reach the
    # store before it dies, so every acknowledged record is in the journal only.
    holder = sqlite3.connect(path, isolation_level=None)
    holder.execute("BEGIN IMMEDIATE")
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    acked = []
    try:
        with subprocess.Popen(
            [sys.executable, "-c", CHILD, str(path), str(journal), "300"],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            env=env,
            text=True,
        ) as child:
            try:
                assert child.stdout is not None
                for line in child.stdout:
                    line = line.strip()
                    if line == "DONE":
                        break
                    acked.append(line)
                os.kill(child.pid, signal.SIGKILL)
                child.wait(10)
            finally:
                if child.poll() is None:
                    child.kill()
    finally:
        holder.execute("ROLLBACK")
        holder.close()
    assert child.returncode == -signal.SIGKILL
    assert len(acked) == 300
    before = SQLiteAuditStore(path)
    stored_before = {s.request_id for s in before.list_requests(limit=1000)}
    before.close()
    assert len(stored_before) < len(acked)  # the kill did land before the store had them

    writer = AuditWriter(_opener(path), journal=journal, **FAST)  # the next start
    try:
        assert writer.recovered >= len(acked) - len(stored_before)
        assert writer.flush(30)
    finally:
        writer.close()
    store = SQLiteAuditStore(path)
    try:
        stored = {s.request_id for s in store.list_requests(limit=1000)}
        assert set(acked) <= stored
        assert store.verify_chain().ok
    finally:
        store.close()
    assert read_frames(journal) == []  # drained and released


def test_a_torn_tail_is_cut_and_the_rest_is_kept(tmp_path) -> None:
    journal = Journal(tmp_path / "j")
    journal.append(b"R", b'{"request_id":"a"}')
    journal.append(b"R", b'{"request_id":"b"}')
    journal.close()
    (segment,) = sorted((tmp_path / "j").glob("*.seg"))
    with open(segment, "ab") as fh:
        fh.write(b"TJR\x00\x00\x00\x01\x00")  # a frame header cut short by a crash
    again = Journal(tmp_path / "j")
    try:
        frames = again.read(0, 0)
        assert [f.payload for f in frames] == [b'{"request_id":"a"}', b'{"request_id":"b"}']
        assert again.torn_bytes == 8
    finally:
        again.close()


def test_appends_from_many_threads_are_all_kept(tmp_path) -> None:
    journal = Journal(tmp_path / "j", segment_bytes=2000)
    threads = [
        threading.Thread(
            target=lambda t=t: [
                journal.append(b"R", f'{{"request_id":"t{t}-{i}"}}'.encode()) for i in range(50)
            ]
        )
        for t in range(8)
    ]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    frames = journal.read(0, 0, max_frames=10_000)
    journal.close()
    assert len(frames) == 400
    assert len({f.payload for f in frames}) == 400
    assert len(list((tmp_path / "j").glob("*.seg"))) > 1  # segments rotated


# -- a store that vanished or was replaced -----------------------------------------------------


def _remove_sqlite(path: Path) -> None:
    for suffix in ("", "-wal", "-shm"):
        Path(str(path) + suffix).unlink(missing_ok=True)


def test_a_deleted_store_is_noticed_and_never_recreated(tmp_path, caplog) -> None:
    """Issue: deleting the store's directory was invisible and a new empty store was created."""
    caplog.set_level(logging.WARNING, logger="tracerag.audit")
    path = tmp_path / "data" / "a.sqlite"
    writer = AuditWriter(_opener(path), journal=tmp_path / "journal", **FAST)
    try:
        assert writer.submit_durable(make_record("r1", decision="pass"))
        assert writer.flush(10) and writer.ready()
        _remove_sqlite(path)
        assert writer.submit_durable(make_record("r2", decision="pass"))  # journaled: durable
        wait_for(lambda: not writer.ready())
        status = writer.status()
        assert status["failing"] and status["backlog"] == 1
        assert "disappeared" in status["last_error"] or "no audit store" in status["last_error"]
        tried = writer.failures
        wait_for(lambda: writer.failures >= tried + 2)  # retries go on: still nothing created
        assert not path.exists()
        assert "audit store write failed" in caplog.text
    finally:
        writer.close(timeout=0.2)
    # the next start remembers the store it fed: it does not create a new one either
    writer = AuditWriter(_opener(path), journal=tmp_path / "journal", **FAST)
    try:
        assert writer.recovered >= 1  # r2 (and r1, already stored: skipped as a duplicate)
        wait_for(lambda: writer.status()["failing"])
        assert not path.exists()
    finally:
        writer.close(timeout=0.2)


def test_a_replaced_store_is_refused_and_the_records_wait(tmp_path) -> None:
    path = tmp_path / "a.sqlite"
    journal = tmp_path / "journal"
    writer = AuditWriter(_opener(path), journal=journal, **FAST)
    try:
        assert writer.submit_durable(make_record("r1", decision="pass"))
        assert writer.flush(10)
        _remove_sqlite(path)
        SQLiteAuditStore(path).close()  # someone puts a new, empty store in its place
        assert writer.submit_durable(make_record("r2", decision="pass"))
        wait_for(lambda: "StoreReplaced" in (writer.status()["last_error"] or ""))
        assert not writer.ready()
    finally:
        writer.close(timeout=0.2)
    fresh = SQLiteAuditStore(path)
    try:
        assert fresh.list_requests() == []  # nothing was written into the impostor
    finally:
        fresh.close()
    assert json.loads((journal / IDENTITY_FILE).read_text())["store_id"]


def test_reading_a_missing_store_never_creates_it(tmp_path) -> None:
    path = tmp_path / "nowhere" / "a.sqlite"
    try:
        open_store(str(path), create=False)
    except StoreMissing as exc:
        assert "does not exist" in str(exc)
    else:
        raise AssertionError("opened a store that does not exist")
    assert not path.parent.exists()


# -- a hung store ------------------------------------------------------------------------------


def test_a_locked_store_degrades_to_journaled_and_reports_not_ready(tmp_path, caplog) -> None:
    """Issue: a SQLite lock held by another process stalled every answer and logged nothing."""
    caplog.set_level(logging.WARNING, logger="tracerag.audit")
    path = tmp_path / "a.sqlite"

    def opener(create: bool = True):
        return SQLiteAuditStore(path, busy_timeout_s=0.2, create=create)

    writer = AuditWriter(opener, journal=tmp_path / "journal", **FAST)
    holder = None
    try:
        assert writer.submit_durable(make_record("r0", decision="pass"))
        assert writer.flush(10)
        holder = sqlite3.connect(path, isolation_level=None)
        holder.execute("BEGIN EXCLUSIVE")
        results = [writer.submit_durable(make_record(f"r{i}", decision="pass")) for i in (1, 2)]
        assert results == [True, True]  # journaled: the answer does not wait for the store
        wait_for(lambda: not writer.ready())
        assert "database is locked" in (writer.status()["last_error"] or "")
        assert "audit store write failed" in caplog.text
        probed = writer.failures
        wait_for(lambda: writer.failures >= probed + 3)  # the writer probes the store again
        holder.execute("ROLLBACK")
        assert writer.flush(10) and writer.ready()
        assert writer.quarantined == 0  # a locked store is not a poisoned record
    finally:
        if holder is not None:
            holder.close()
        writer.close()
    store = SQLiteAuditStore(path)
    try:
        assert {e.kind for s in ("r1", "r2") for e in store.get(s).entries} >= {"register"}
        assert all(store.get(s).entries[0].kind == "register" for s in ("r0", "r1", "r2"))
    finally:
        store.close()


def test_the_head_is_exported_next_to_the_journal(tmp_path) -> None:
    path = tmp_path / "a.sqlite"
    writer = AuditWriter(
        _opener(path), journal=tmp_path / "journal", head_export_interval=0.0, **FAST
    )
    try:
        writer.submit_durable(make_record("r1", decision="pass"))
        assert writer.flush(10)
    finally:
        writer.close()
    head = json.loads((tmp_path / "journal" / HEAD_FILE).read_text())
    store = SQLiteAuditStore(path)
    try:
        assert head["seq"] == store.head()["seq"] > 0
        assert head["store_id"] == store.identity()["store_id"]
        assert store.verify_chain(expect_head=head).ok
    finally:
        store.close()


def test_a_store_its_owner_closed_first_leaves_the_last_head_and_no_warning(
    tmp_path, caplog
) -> None:
    store = SQLiteAuditStore(tmp_path / "a.sqlite")
    writer = AuditWriter(store, journal=tmp_path / "journal", head_export_interval=0.0, **FAST)
    writer.submit_durable(make_record("r1", decision="pass"))
    assert writer.flush(10)
    exported = json.loads((tmp_path / "journal" / HEAD_FILE).read_text())
    store.close()
    assert store.closed
    with caplog.at_level(logging.WARNING, logger="tracerag"):
        assert writer.close()
    assert not [r for r in caplog.records if "chain head" in r.getMessage()]
    assert json.loads((tmp_path / "journal" / HEAD_FILE).read_text()) == exported
    assert exported["seq"] > 0


def test_a_journal_directory_serves_one_process_and_others_take_a_slot(tmp_path) -> None:
    first = Journal(tmp_path / "j")
    try:
        try:
            Journal(tmp_path / "j")
        except JournalBusy:
            pass
        else:
            raise AssertionError("two journals shared one directory")
        second = open_journal(tmp_path / "j")
        try:
            assert second.directory == tmp_path / "j" / "1"
        finally:
            second.close()
    finally:
        first.close()


@pytest.mark.integration
def test_a_frozen_postgresql_connection_is_interrupted_and_answers_go_on(tmp_path, caplog):
    """Issue: a frozen PostgreSQL stalled every answer for the whole outage."""
    from store_fixtures import PostgresBackend, postgres_dsn

    caplog.set_level(logging.WARNING, logger="tracerag.audit")
    pg = PostgresBackend(postgres_dsn())
    store = pg.open(max_connections=1, statement_timeout=30.0)
    with store._db.connection() as conn:
        pid = conn.execute("SELECT pg_backend_pid()").fetchone()[0]
    writer = AuditWriter(store, journal=tmp_path / "journal", op_timeout=0.5, **FAST)
    try:
        assert writer.submit_durable(make_record("r1", decision="pass"))
        assert writer.flush(10)
        os.kill(pid, signal.SIGSTOP)  # the server process behind the writer's connection
        try:
            assert writer.submit_durable(make_record("r2", decision="pass"))  # not blocked
            assert writer.flush(30)  # interrupted, reconnected, written
        finally:
            os.kill(pid, signal.SIGCONT)
        assert store.get("r2").decision == "pass"
        assert "hanging" in caplog.text
    finally:
        writer.close()
        store.close()
        pg.cleanup()


async def test_an_event_loop_shares_one_sync_among_concurrent_answers(tmp_path) -> None:
    import asyncio

    path = tmp_path / "a.sqlite"
    writer = AuditWriter(_opener(path), journal=tmp_path / "journal", **FAST)
    try:
        ids = [f"a{i:02d}" for i in range(50)]
        results = await asyncio.gather(
            *(writer.asubmit_durable(make_record(rid, decision="pass")) for rid in ids)
        )
        assert results == [True] * 50
        # group commit: answers share fdatasyncs (how many depends on thread scheduling)
        assert writer.journal.syncs < len(ids)
        poisoned = make_record("p", question="\ud800")
        assert await writer.asubmit_durable(poisoned) is False
        assert writer.flush(10)
    finally:
        writer.close()
    store = SQLiteAuditStore(path)
    try:
        assert {s.request_id for s in store.list_requests(limit=100)} == {*ids, "p"}
    finally:
        store.close()


def test_readiness_follows_the_store_without_any_traffic(tmp_path) -> None:
    path = tmp_path / "a.sqlite"
    SQLiteAuditStore(path).close()
    writer = AuditWriter(_opener(path), journal=tmp_path / "journal", **FAST)
    try:
        wait_for(writer.ready)  # opened at start, not at the first record
        _remove_sqlite(path)
        wait_for(lambda: not writer.ready())  # noticed while idle
        assert "disappeared" in writer.status()["last_error"]
        assert not path.exists()
    finally:
        writer.close(timeout=0.2)


def test_without_a_journal_a_stalled_store_costs_one_wait_not_one_per_answer(tmp_path) -> None:
    """A store that hangs (not failing yet) must not make every answer wait in turn."""
    path = tmp_path / "a.sqlite"
    store = SQLiteAuditStore(path, busy_timeout_s=30.0)  # waits on the lock, does not fail
    holder = sqlite3.connect(path, isolation_level=None)
    holder.execute("BEGIN EXCLUSIVE")
    writer = AuditWriter(store, durable_timeout=0.2, **FAST)
    try:
        outcomes = [writer.submit_durable(make_record(f"s{i}", decision="pass")) for i in range(6)]
        assert outcomes == [False] * 6  # nothing was committed: nothing is claimed
        assert writer.durable_timeouts == 1  # only the first answer waited
        holder.execute("ROLLBACK")
        assert writer.flush(30)
        assert all(writer.persisted(f"s{i}") for i in range(6))  # written after all
    finally:
        holder.close()
        writer.close()
        store.close()


def test_a_backlog_of_full_batches_is_drained_without_the_gathering_wait(tmp_path) -> None:
    """The writer waits ``batch_delay`` to gather a batch only when less than a batch waits:
    a backlog (full load, the end of an outage) must not drain at one batch per delay."""
    path = tmp_path / "a.sqlite"
    SQLiteAuditStore(path).close()
    writer = AuditWriter(
        _opener(path), journal=tmp_path / "journal", batch_delay=0.5, batch_bytes=4000, **FAST
    )
    try:
        ids = [f"b{i:03d}" for i in range(60)]
        for rid in ids:  # each record is a batch of its own (~3 KB): 60 batches
            assert writer.submit(make_record(rid, decision="pass"))
        t = time.monotonic()
        assert writer.flush(timeout=20)
        # one delay per batch would take 60 x 0.5 s = 30 s
        assert time.monotonic() - t < 10
    finally:
        writer.close()
    store = SQLiteAuditStore(path)
    try:
        assert {s.request_id for s in store.list_requests(limit=100)} == set(ids)
        assert store.verify_chain().ok
    finally:
        store.close()


@pytest.mark.parametrize("journaled", [["r1", "r2", "r3"], ["r2"]], ids=["batch", "alone"])
def test_replaying_records_the_store_already_holds_stores_each_once(tmp_path, journaled) -> None:
    """A commit that ended after its record was journaled (the server's commit wait): the
    replay skips what the store holds and chains the rest; nothing is stored twice."""
    from tracerag.store._buffer import encode_record

    path = tmp_path / "a.sqlite"
    journal = open_journal(tmp_path / "journal")
    for rid in journaled:
        item = encode_record(make_record(rid, decision="pass"))
        journal.append(item.type, item.payload)
    journal.close()
    store = SQLiteAuditStore(str(path))
    store.append_record(make_record("r2", decision="pass"))  # the late commit
    writer = AuditWriter(store, journal=tmp_path / "journal", **FAST)
    try:
        assert writer.recovered == len(journaled)
        assert writer.flush(10)
        assert writer.dropped == 0 and writer.quarantined == 0
    finally:
        writer.close()
    assert sorted(stored_request_ids(path)) == sorted({"r2", *journaled})
    report = store.verify_chain()
    assert report.ok, report.issues
    store.close()
