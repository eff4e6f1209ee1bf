"""The audit store's parts, each on its own: the chain log and the review queue that writes
through it, the group commit and the chain check; the writer's buffer, journal buffer, retry
policy, store link and health; and the attributes an owner keeps in a part."""

from __future__ import annotations

import sqlite3
import threading
import time
from typing import Any

import pytest
from store_fixtures import make_record

from tracerag.store import AuditWriter, StoreError, StoreReplaced
from tracerag.store._buffer import (
    FRAME_REFUSED,
    JournalBuffer,
    MemoryBuffer,
    encode_record,
    request_id_of,
)
from tracerag.store._chain import GENESIS_HASH
from tracerag.store._chain_check import check_chain
from tracerag.store._chain_log import ChainLog, read_head, request_exists
from tracerag.store._group_commit import GroupCommit
from tracerag.store._health import StoreHealth
from tracerag.store._journal import FRAME_QUARANTINE, FRAME_RECORD, Journal
from tracerag.store._kept import Kept
from tracerag.store._link import StoreLink
from tracerag.store._retry import POISON_PROBE_AFTER, RetryPolicy, is_transient
from tracerag.store._review_queue import SQLReviewQueue
from tracerag.store._sqlite import SQLiteAuditStore
from tracerag.store._types import (
    KIND_MATERIAL_CHANGE,
    KIND_REVIEW_ENQUEUED,
    Entry,
    InvalidRecord,
    StoreFailing,
)

KEY = b"k" * 32


def sqlite_store(tmp_path: Any, name: str = "audit.db", **options: Any) -> SQLiteAuditStore:
    return SQLiteAuditStore(str(tmp_path / name), **options)


# -- the chain log -----------------------------------------------------------------------------
def test_the_chain_log_seals_entries_in_a_chain_and_reads_them_back(tmp_path):
    store = sqlite_store(tmp_path)
    log = ChainLog(store._write, store._read, None)
    with log.write() as (cur, head):
        first, second = log.seal(
            cur,
            head,
            [
                Entry(request_id="m-1", kind=KIND_MATERIAL_CHANGE, payload={"a": 1}, actor="al"),
                Entry(request_id="m-1", kind=KIND_MATERIAL_CHANGE, payload={"a": 2}, actor="al"),
            ],
        )
    assert (first.seq, second.seq) == (1, 2)
    genesis = store.identity()["genesis"]
    assert genesis != GENESIS_HASH  # each store's chain starts from its own genesis
    assert first.prev_hash == genesis and second.prev_hash == first.hash
    with log.read() as cur:
        assert read_head(cur).hash == second.hash
        back = log.entries(cur, "request_id = %s", ("m-1",))
    assert [e.payload for e in back] == [{"a": 1}, {"a": 2}]
    assert store.verify_chain().ok
    store.close()


def test_a_transaction_that_fails_after_sealing_leaves_the_chain_as_it_was(tmp_path):
    store = sqlite_store(tmp_path)
    log = ChainLog(store._write, store._read, None)
    with pytest.raises(RuntimeError), log.write() as (cur, head):
        log.material_change(cur, head, "fee", "alice", {"fee": 5})
        raise RuntimeError("the caller's own table update failed")
    with log.read() as cur:
        assert read_head(cur).seq == 0
        assert log.entries(cur, "kind = %s", (KIND_MATERIAL_CHANGE,)) == []
    store.close()


def test_the_chain_log_refuses_a_material_change_without_an_actor(tmp_path):
    store = sqlite_store(tmp_path)
    log = ChainLog(store._write, store._read, None)
    with pytest.raises(InvalidRecord), log.write() as (cur, head):
        log.material_change(cur, head, "fee", " ", {"fee": 5})
    assert store.verify_chain().head_seq == 0
    store.close()


def test_a_keyed_chain_is_never_sealed_without_its_key_or_with_another(tmp_path):
    keyed = sqlite_store(tmp_path, chain_key=KEY)
    keyed.append_material_change("fee", "alice", {"fee": 1})
    keyed.close()
    for key in (None, b"o" * 32):
        store = sqlite_store(tmp_path, chain_key=key)
        log = ChainLog(store._write, store._read, key)
        with pytest.raises(StoreError, match="key"), log.write() as (cur, head):
            log.material_change(cur, head, "fee", "mallory", {"fee": 0})
        store.close()
    store = sqlite_store(tmp_path, chain_key=KEY)
    assert store.verify_chain().ok and store.verify_chain().head_seq == 1
    store.close()


def test_both_material_change_doors_seal_the_same_entry(tmp_path):
    store = sqlite_store(tmp_path)
    direct = store.append_material_change("fee", "alice", {"fee": 5}, "new fee")
    chained = store.chained(lambda tx: tx.material_change("fee", "alice", {"fee": 5}, "new fee"))
    assert (direct.kind, chained.kind) == (KIND_MATERIAL_CHANGE, KIND_MATERIAL_CHANGE)
    assert direct.payload == chained.payload and direct.actor == chained.actor
    assert [e.seq for e in store.material_changes("fee")] == [direct.seq, chained.seq]
    store.close()


# -- the review queue over a chain log ---------------------------------------------------------
def test_the_review_queue_writes_each_change_through_the_chain_log(tmp_path):
    store = sqlite_store(tmp_path, auto_enqueue=False)
    store.append_record(make_record("req-1"))
    sealed: list[Entry] = []
    log = ChainLog(store._write, store._read, None)
    seal = log.seal

    def counting_seal(cur: Any, head: Any, entries: Any) -> list[Entry]:
        out = seal(cur, head, entries)
        sealed.extend(out)
        return out

    log.seal = counting_seal  # type: ignore[method-assign]
    queue = SQLReviewQueue(log)
    item = queue.enqueue_review("req-1", "low confidence", "review")
    assert item.status == "pending" and [e.kind for e in sealed] == [KIND_REVIEW_ENQUEUED]
    assert queue.enqueue_review("req-1", "again", "review").status == "pending"
    assert len(sealed) == 1  # idempotent: nothing sealed twice
    claimed = queue.claim_next("rita")
    assert claimed is not None and claimed.claimed_by == "rita"
    queue.decide("req-1", "rita", "approve")
    assert [e.kind for e in sealed][-2:] == ["review_claimed", "review_decision"]
    assert store.get("req-1").review.status == "decided"  # the store reads the same table
    assert store.verify_chain().ok
    store.close()


def test_the_review_queue_refuses_what_it_cannot_queue(tmp_path):
    store = sqlite_store(tmp_path, auto_enqueue=False)
    queue = SQLReviewQueue(ChainLog(store._write, store._read, None))
    with pytest.raises(StoreError):  # RequestNotFound
        queue.enqueue_review("nobody", "x", "review")
    store.append_record(make_record("req-1"))
    with pytest.raises(InvalidRecord):
        queue.enqueue_review("req-1", "x", "pass")
    with pytest.raises(InvalidRecord):
        queue.claim_next(" ")
    with store._read() as cur:
        assert request_exists(cur, "req-1") and not request_exists(cur, "nobody")
        assert queue.item_in(cur, "req-1") is None
    store.close()


# -- the writer's buffers ----------------------------------------------------------------------
def test_the_memory_buffer_is_bounded_by_count_and_bytes_and_keeps_order():
    buffer = MemoryBuffer(max_items=3, max_bytes=10**6)
    items = [encode_record(make_record(f"req-{i}")) for i in range(4)]
    for item in items[:3]:
        assert not buffer.refuses(item)
        buffer.put(item)
    assert buffer.full() and buffer.refuses(items[3])
    assert buffer.head() is items[0]
    batch = buffer.peek(2, 10**6)
    assert batch == items[:2]
    buffer.ack(batch)
    assert buffer.head() is items[2] and len(buffer) == 1
    assert buffer.take_all() == [items[2]] and not buffer.has_work() and buffer.bytes == 0

    small = MemoryBuffer(max_items=100, max_bytes=items[0].size + 1)
    small.put(items[0])
    assert small.refuses(items[1])  # by bytes


def test_a_batch_holds_at_least_one_item_however_large():
    buffer = MemoryBuffer(max_items=10, max_bytes=10**9)
    big, other = encode_record(make_record("big")), encode_record(make_record("other"))
    buffer.put(big)
    buffer.put(other)
    assert buffer.peek(10, 1) == [big]


def test_encoding_quarantines_what_cannot_be_stored_as_given():
    assert encode_record(make_record("req-1")).type == FRAME_RECORD
    for bad in (["not", "a", "mapping"], {"request_id": ""}, {"request_id": "r", "x": "\ud800"}):
        assert encode_record(bad).type == FRAME_QUARANTINE
    assert request_id_of({"request_id": "a\x00b"}) is None


def test_the_journal_buffer_reads_back_what_it_wrote_and_releases_on_ack(tmp_path):
    journal = Journal(tmp_path / "journal")
    buffer = JournalBuffer(journal)
    assert not buffer.has_work()
    for i in range(3):
        buffer.put(encode_record(make_record(f"req-{i}")))
    batch = buffer.peek(2, 10**6)
    assert [i.request_id for i in batch] == ["req-0", "req-1"]
    assert batch[0].record["request_id"] == "req-0" and batch[0].type == FRAME_RECORD
    buffer.ack(batch)
    assert [i.request_id for i in buffer.peek(10, 10**6)] == ["req-2"]
    journal.close()


def test_the_journal_buffer_marks_a_frame_the_key_does_not_vouch_for(tmp_path):
    unkeyed = Journal(tmp_path / "journal")
    JournalBuffer(unkeyed).put(encode_record(make_record("forged")))
    unkeyed.close()
    keyed = Journal(tmp_path / "journal", key=KEY)
    (item,) = JournalBuffer(keyed).peek(10, 10**6)
    assert item.type == FRAME_REFUSED and item.frame is not None and item.record is None
    keyed.close()


# -- the retry policy --------------------------------------------------------------------------
def test_the_backoff_doubles_up_to_its_cap_with_jitter_below_the_initial_delay():
    policy = RetryPolicy(0.1, 1.0)
    for attempt, base in ((1, 0.1), (2, 0.2), (3, 0.4), (4, 0.8), (5, 1.0), (60, 1.0)):
        for _ in range(20):
            assert base <= policy.delay(attempt) <= base + 0.1
    assert [policy.probe_delay(n, 0.3) for n in (0, 1, 2, 3, 9)] == [0.1, 0.1, 0.2, 0.3, 0.3]


def test_only_real_attempts_failing_often_enough_make_a_batch_suspect():
    policy = RetryPolicy(0.1, 1.0)
    boom = ConnectionError("down")
    assert not policy.suspect(POISON_PROBE_AFTER - 1, boom)
    assert policy.suspect(POISON_PROBE_AFTER, boom)
    assert not policy.suspect(POISON_PROBE_AFTER + 5, StoreFailing("failed moments ago"))


def test_store_failures_are_transient_and_record_problems_are_not():
    assert is_transient(ConnectionError("down")) and is_transient(StoreError("locked"))
    assert is_transient(sqlite3.OperationalError("database is locked"))
    assert not is_transient(InvalidRecord("bad"))
    assert not is_transient(sqlite3.IntegrityError("constraint"))
    assert not is_transient(KeyError("a bug, not the store"))


# -- the store link ----------------------------------------------------------------------------
def test_the_link_opens_lazily_and_refuses_a_replaced_store(tmp_path):
    journal = Journal(tmp_path / "journal")
    opened: list[bool] = []

    def open_store(create: bool = True) -> SQLiteAuditStore:
        opened.append(create)
        return sqlite_store(tmp_path, create=create)

    link = StoreLink(open_store, journal)
    assert link.store is None and link.opens and link.identity is None
    store = link.ensure()
    assert link.ensure() is store and opened == [True]
    identity = link.identity
    assert identity is not None and identity["store_id"]
    link.close()
    (tmp_path / "audit.db").unlink()
    sqlite_store(tmp_path).close()  # a new, empty store where the old one was

    again = StoreLink(open_store, journal)  # the identity is remembered in the journal
    assert again.identity == identity
    with pytest.raises(StoreError):  # the replaced store is not created anew either
        again.ensure()
    assert opened[-1] is False and again.store is None
    replaced = StoreLink(lambda: sqlite_store(tmp_path), journal)
    with pytest.raises(StoreReplaced):
        replaced.ensure()
    journal.close()


def test_the_link_never_closes_a_store_it_was_given(tmp_path):
    store = sqlite_store(tmp_path)
    link = StoreLink(store, None)
    assert not link.opens and link.ensure() is store
    link.discard()
    link.close()
    assert link.store is store and not store.closed
    store.close()


# -- the store's health ------------------------------------------------------------------------
class _Flaky:
    def __init__(self) -> None:
        self.down = True
        self.interrupted = threading.Event()
        self.hold = threading.Event()

    def append_record(self, record: Any) -> None: ...

    def ping(self) -> None:
        if self.down:
            raise ConnectionError("down")

    def interrupt(self) -> None:
        self.interrupted.set()
        self.hold.set()


def _health(store: Any, **options: Any) -> tuple[StoreHealth, threading.Event]:
    stop = threading.Event()
    settings = {"op_timeout": 10.0, "probe_interval": 5.0, "probe_max": 0.05, **options}
    health = StoreHealth(
        StoreLink(store, None),
        RetryPolicy(0.01, 0.05),
        threading.Condition(),
        stop,
        pending=lambda: 0,
        journaled=False,
        **settings,
    )
    return health, stop


def test_health_follows_the_store_down_and_back_up():
    store = _Flaky()
    health, _ = _health(store)
    assert not health.probe() and health.failing
    assert isinstance(health.last_error, ConnectionError) and health.failing_for(time.monotonic())
    assert health.failures == 0  # a probe is not a write attempt
    assert health.failed(ConnectionError("again"), attempt=True) is False
    assert health.failures == 1
    store.down = False
    health.probe_idle()
    assert not health.failing and health.last_error is None and health.failing_for(0.0) is None


def test_waiting_to_retry_ends_once_a_store_that_was_down_answers_again():
    store = _Flaky()
    health, _ = _health(store)
    threading.Timer(0.1, lambda: setattr(store, "down", False)).start()
    began = time.monotonic()
    health.wait_to_retry(5.0)
    assert time.monotonic() - began < 2.0 and not store.down


def test_waiting_to_retry_ends_when_the_writer_stops():
    health, stop = _health(_Flaky())
    threading.Timer(0.05, stop.set).start()
    began = time.monotonic()
    health.wait_to_retry(5.0)
    assert time.monotonic() - began < 2.0


def test_the_watchdog_interrupts_an_operation_hanging_past_its_timeout():
    store = _Flaky()
    health, stop = _health(store, op_timeout=0.1)
    watchdog = threading.Thread(target=health.watch, args=(stop.is_set,), daemon=True)
    watchdog.start()
    assert health.hanging(time.monotonic()) is None
    health.timed(store.hold.wait, 5.0)  # returns once interrupted
    assert store.interrupted.is_set()
    stop.set()
    watchdog.join(2.0)
    assert not watchdog.is_alive()


# -- the writer's settings, kept by its parts --------------------------------------------------
def test_the_writer_settings_are_read_and_set_through_the_parts(tmp_path):
    store = sqlite_store(tmp_path)
    writer = AuditWriter(store, backoff_initial=0.02, batch_size=0, probe_max=0.5, op_timeout=3)
    try:
        assert (writer.backoff_initial, writer.batch_size, writer.probe_max) == (0.02, 1, 0.5)
        writer.op_timeout = 7.0
        writer.backoff_max = 2.0
        assert writer._health.op_timeout == 7.0 and writer._retry.maximum == 2.0
        assert writer.failures == 0 and writer.last_error is None
        assert writer.submit_durable(make_record("req-1"))
        assert writer.written == 1 and store.get("req-1").question
    finally:
        writer.close()
        store.close()


# -- the group commit --------------------------------------------------------------------------
class _Inserts:
    """The group commit's ``insert``: remembers each record, can hold the first transaction
    open, and can fail."""

    def __init__(self) -> None:
        self.ids: list[str] = []
        self.hold = threading.Event()
        self.hold.set()
        self.entered = threading.Event()
        self.fail: BaseException | None = None

    def __call__(self, cur: Any, head: Any, record: Any, entries: Any) -> None:
        self.entered.set()
        self.hold.wait(5)
        if self.fail is not None:
            raise self.fail
        if record.get("bad"):
            raise InvalidRecord("a record the store refuses")
        self.ids.append(record["request_id"])


def _group(tmp_path: Any, inserts: _Inserts) -> tuple[GroupCommit, SQLiteAuditStore]:
    store = sqlite_store(tmp_path)
    return GroupCommit(store._write, inserts, store.interrupt, lambda: store.location), store


def test_calls_that_arrive_during_a_commit_share_the_next_transaction(tmp_path):
    inserts = _Inserts()
    commits, store = _group(tmp_path, inserts)
    inserts.hold.clear()
    first = threading.Thread(target=commits.append_record, args=(make_record("req-0"),))
    first.start()
    assert inserts.entered.wait(5)  # the leader's transaction is open and held
    others = [
        threading.Thread(target=commits.append_record, args=(make_record(f"req-{i}"),))
        for i in range(1, 6)
    ]
    for t in others:
        t.start()
    deadline = time.monotonic() + 5
    while len(commits._waiting) < 5 and time.monotonic() < deadline:
        time.sleep(0.01)
    inserts.hold.set()
    for t in [first, *others]:
        t.join(5)
    assert sorted(inserts.ids) == [f"req-{i}" for i in range(6)]
    assert commits.commits == 2  # the leader's, then one for the five that waited
    store.close()


def test_a_refused_record_fails_alone_and_the_rest_of_its_group_is_written(tmp_path):
    inserts = _Inserts()
    commits, store = _group(tmp_path, inserts)
    with pytest.raises(InvalidRecord):
        commits.append_record(make_record("req-bad", bad=True))
    commits.append_record(make_record("req-good"))
    assert inserts.ids == ["req-good"] and commits.failed is None
    store.close()


def test_a_failing_store_is_not_waited_for_again_at_once(tmp_path):
    inserts = _Inserts()
    commits, store = _group(tmp_path, inserts)
    commits.fail_fast_seconds = 60.0
    inserts.fail = ConnectionError("the disk went away")
    with pytest.raises(ConnectionError):
        commits.append_record(make_record("req-1"))
    inserts.fail = None
    with pytest.raises(StoreFailing, match="failed"):
        commits.append_record(make_record("req-2"))
    assert inserts.ids == [] and commits.failed is not None
    commits.failed = None  # what a successful ping does
    commits.append_record(make_record("req-3"))
    assert inserts.ids == ["req-3"]
    store.close()


# -- checking the chain ------------------------------------------------------------------------
def test_check_chain_finds_a_changed_entry_a_removed_tail_and_a_foreign_anchor(tmp_path):
    store = sqlite_store(tmp_path)
    for i in range(3):
        store.append_record(make_record(f"req-{i}"))
    head = store.head()
    with store._snapshot() as cur:
        assert check_chain(cur, None).ok
        assert check_chain(cur, None, [head]).ok
        ahead = check_chain(cur, None, [{**head, "seq": head["seq"] + 5}])
        foreign = check_chain(cur, None, [{**head, "store_id": "another-store"}])
        with_key = check_chain(cur, KEY)
    assert ahead.removed and "removed" in ahead.summary()
    assert foreign.removed and not foreign.ok
    assert not with_key.ok  # a key given for a store never keyed: its keyed chain is gone
    raw = sqlite3.connect(str(tmp_path / "audit.db"), isolation_level=None)
    raw.execute("DROP TRIGGER IF EXISTS audit_entries_no_update")  # what an intruder does
    raw.execute("UPDATE audit_entries SET payload = ? WHERE seq = 2", ('{"x":1}',))
    raw.close()
    with store._snapshot() as cur:
        changed = check_chain(cur, None)
    assert changed.changed and {i.seq for i in changed.changed} >= {2}
    store.close()


# -- settings kept by a part -------------------------------------------------------------------
class _Part:
    def __init__(self) -> None:
        self.limit = 3
        self.hidden = 1.5


class _Owner:
    limit = Kept[int]("_part")
    shown = Kept[float]("_part", "hidden")

    def __init__(self) -> None:
        self._part = _Part()


def test_a_kept_attribute_is_read_and_set_on_the_part():
    owner = _Owner()
    assert (owner.limit, owner.shown) == (3, 1.5)
    owner.limit = 7
    owner.shown = 2.5
    assert (owner._part.limit, owner._part.hidden) == (7, 2.5)
    assert isinstance(_Owner.limit, Kept)
    with pytest.raises(AttributeError):
        _Owner.__dict__["limit"].__get__(object(), object)
