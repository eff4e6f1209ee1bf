"""Concurrent ``append_record`` calls share one transaction (group commit), and each caller
still gets its own outcome: stored, already stored, or the store's failure."""

from __future__ import annotations

import sqlite3
import threading
import time

import pytest
from store_fixtures import backend, make_record, store  # noqa: F401
from waiting import wait_until

from tracerag.store._base import DuplicateRequest, StoreError
from tracerag.store._sqlite import SQLiteAuditStore


def _submit_all(target, records) -> list[BaseException | None]:
    outcomes: list[BaseException | None] = [None] * len(records)
    start = threading.Barrier(len(records))

    def one(i: int) -> None:
        start.wait()
        try:
            target.append_record(records[i])
        except BaseException as exc:
            outcomes[i] = exc

    threads = [threading.Thread(target=one, args=(i,)) for i in range(len(records))]
    for t in threads:
        t.start()
    for t in threads:
        t.join(60)
    return outcomes


def test_records_appended_together_share_commits_and_the_chain_stays_intact(store) -> None:  # noqa: F811
    records = [make_record(f"req-{i:04d}") for i in range(24)]
    records.append(make_record("req-0003"))  # the same request twice in one group
    outcomes = _submit_all(store, records)
    duplicates = [o for o in outcomes if isinstance(o, DuplicateRequest)]
    assert len(duplicates) == 1 and [o for o in outcomes if o is not None] == duplicates
    stored = {s.request_id for s in store.list_requests(limit=100)}
    assert stored == {f"req-{i:04d}" for i in range(24)}
    assert store.group_commits < 24  # shared transactions, not one per record
    assert store.verify_chain().ok


def test_a_group_waiting_on_a_locked_store_commits_once_the_lock_is_gone(tmp_path) -> None:
    path = tmp_path / "audit.sqlite"
    sqlite_store = SQLiteAuditStore(str(path), busy_timeout_s=5.0)
    try:
        sqlite_store.append_record(make_record("req-first"))
        commits = sqlite_store.group_commits
        locked = threading.Event()

        def hold() -> None:
            lock = sqlite3.connect(str(path), isolation_level=None)
            lock.execute("BEGIN EXCLUSIVE")
            locked.set()
            time.sleep(1.0)  # sleep is the behaviour: the lock is held while the group waits
            lock.execute("ROLLBACK")
            lock.close()

        holder = threading.Thread(target=hold)
        holder.start()
        locked.wait(10)
        records = [make_record(f"req-{i:04d}") for i in range(16)]
        outcomes = _submit_all(sqlite_store, records)
        holder.join()
        assert outcomes == [None] * 16
        # the first leader waited for the lock while the others queued behind it
        assert sqlite_store.group_commits - commits <= 3
        assert len(sqlite_store.list_requests(limit=100)) == 17
        assert sqlite_store.verify_chain().ok
    finally:
        sqlite_store.close()


def test_every_caller_of_a_failed_group_commit_gets_the_failure_without_waiting_again(
    tmp_path,
) -> None:
    path = tmp_path / "audit.sqlite"
    sqlite_store = SQLiteAuditStore(str(path), busy_timeout_s=1.0)
    lock = sqlite3.connect(str(path), isolation_level=None)
    outcomes: dict[str, BaseException | None] = {}

    def one(rid: str) -> None:
        try:
            sqlite_store.append_record(make_record(rid))
            outcomes[rid] = None
        except BaseException as exc:
            outcomes[rid] = exc

    try:
        lock.execute("BEGIN EXCLUSIVE")
        t = time.monotonic()
        first = threading.Thread(target=one, args=("req-first",))
        first.start()
        # the first waits for the lock; the others queue behind it
        wait_until(lambda: sqlite_store._commits._leader, "the first call to lead a commit")
        later = [threading.Thread(target=one, args=(f"req-{i}",)) for i in range(7)]
        for thread in later:
            thread.start()
        for thread in [first, *later]:
            thread.join(30)
        elapsed = time.monotonic() - t
        assert len(outcomes) == 8
        assert all(isinstance(o, (StoreError, sqlite3.OperationalError)) for o in outcomes.values())
        # one busy timeout for all of them: the queued callers did not wait a second one
        assert elapsed < 1.8
        lock.execute("ROLLBACK")
        assert sqlite_store.list_requests(limit=10) == []
    finally:
        lock.close()
        sqlite_store.close()


def test_a_single_caller_is_its_own_group(store) -> None:  # noqa: F811
    store.append_record(make_record("req-alone"))
    with pytest.raises(DuplicateRequest):
        store.append_record(make_record("req-alone"))
    assert store.verify_chain().ok


@pytest.mark.integration
def test_a_commit_hanging_on_a_frozen_postgresql_is_interrupted() -> None:
    import os
    import signal

    from store_fixtures import PostgresBackend, postgres_dsn

    pg = PostgresBackend(postgres_dsn())
    pg_store = pg.open(max_connections=1, statement_timeout=60.0)
    pg_store.commit_timeout = 1.0
    pg_store.fail_fast_seconds = 0.0  # try again at once once the server is back
    try:
        with pg_store._db.connection() as conn:
            pid = conn.execute("SELECT pg_backend_pid()").fetchone()[0]
        os.kill(pid, signal.SIGSTOP)  # the server process behind the store's one connection
        try:
            t = time.monotonic()
            with pytest.raises(Exception):  # noqa: B017 - whatever the broken socket raises
                pg_store.append_record(make_record("req-hung"))
            assert time.monotonic() - t < 10  # not the 60 s statement timeout
        finally:
            os.kill(pid, signal.SIGCONT)
        pg_store.append_record(make_record("req-after"))  # a new connection: works again
        assert "req-after" in {s.request_id for s in pg_store.list_requests(limit=10)}
        assert pg_store.verify_chain().ok
    finally:
        pg_store.close()
        pg.cleanup()


def test_a_store_that_just_failed_is_not_waited_for_again_until_it_is_tried(tmp_path) -> None:
    from tracerag.store import StoreFailing

    path = tmp_path / "audit.sqlite"
    sqlite_store = SQLiteAuditStore(str(path), busy_timeout_s=0.5)
    sqlite_store.fail_fast_seconds = 1.0
    lock = sqlite3.connect(str(path), isolation_level=None)
    try:
        lock.execute("BEGIN EXCLUSIVE")
        with pytest.raises(sqlite3.OperationalError):
            sqlite_store.append_record(make_record("req-1"))  # waits the busy timeout
        t = time.monotonic()
        with pytest.raises(StoreFailing):
            sqlite_store.append_record(make_record("req-2"))
        assert time.monotonic() - t < 0.2  # told at once
        lock.execute("ROLLBACK")
        time.sleep(1.1)  # sleep is the behaviour: the window is over, the next call tries again
        sqlite_store.append_record(make_record("req-3"))
        assert [s.request_id for s in sqlite_store.list_requests(limit=10)] == ["req-3"]
    finally:
        lock.close()
        sqlite_store.close()
