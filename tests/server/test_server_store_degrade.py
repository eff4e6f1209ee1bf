"""A hung store does not hold the answers: past the commit wait, records go to the journal.

A SQLite store locked by another connection, and a store whose commit freezes: every answer
comes back (its record durable in the journal, so ``audit_persisted`` is true), the commit that
ends late leaves no duplicate, and after the lock is released (or a restart) every record is in
the store exactly once and the chain verifies. Timings are the benchmark's
(``benchmarks/audit_faults.py``); here a generous wait only turns a hang into a failure.
"""

from __future__ import annotations

import asyncio
import sqlite3
import subprocess
import sys
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import pytest
from fastapi.testclient import TestClient
from server_fixtures import GOOD_ANSWER, GOOD_QUESTION, make_app, make_pipeline, running
from store_fixtures import make_record, stored_request_ids
from waiting import wait_until

from tracerag import cli
from tracerag.server._answerer import Answerer
from tracerag.store._sqlite import SQLiteAuditStore

#: a hang, not a slow answer: far above any commit wait used here
HANG = 60.0


def ask_all(client: TestClient, n: int) -> list[dict[str, Any]]:
    """``n`` answers asked at once; fails (instead of hanging) when one does not come back."""
    pool = ThreadPoolExecutor(n)
    try:
        futures = [
            pool.submit(client.post, "/v1/answer", json={"question": GOOD_QUESTION})
            for _ in range(n)
        ]
        responses = [f.result(timeout=HANG) for f in futures]
    finally:
        pool.shutdown(wait=False)  # a hung answer fails the test; the caller ends the hang
    assert [r.status_code for r in responses] == [200] * n
    return [r.json() for r in responses]


def lock(path: Any) -> sqlite3.Connection:
    """Another connection holding the store's write lock."""
    locker = sqlite3.connect(str(path), isolation_level=None)
    locker.execute("BEGIN IMMEDIATE")
    return locker


def test_a_locked_store_answers_from_the_journal_and_stores_each_record_once(tmp_path) -> None:
    path = tmp_path / "audit.sqlite"
    # the store would wait 10 minutes for the lock: only the commit wait bounds an answer
    store = SQLiteAuditStore(str(path), busy_timeout_s=600)
    app = make_app(store, make_pipeline([GOOD_ANSWER]), commit_wait=0.2)
    with TestClient(app) as client:
        assert client.get("/readyz").status_code == 200
        locker = lock(path)
        try:
            bodies = ask_all(client, 6)
            answerer = app.state.answerer
            assert all(b["audit_persisted"] is True for b in bodies)  # durable in the journal
            assert answerer.commit_timeouts >= 1
            assert answerer.writer.pending == len(bodies)  # every record journaled, none lost
            assert client.get("/readyz").status_code == 503  # the store is not taking records
        finally:
            locker.execute("ROLLBACK")
            locker.close()
        assert answerer.writer.flush(timeout=HANG)
        settled(answerer)
        ids = [b["request_id"] for b in bodies]
        # the commits that were running when their answers went out end now: their records are
        # then stored directly and their journal copies skipped, or the other way round
        for rid in ids:
            assert store.get(rid).record["response"]["answer"] == bodies[0]["answer"]
    assert sorted(stored_request_ids(path)) == sorted(ids)  # each exactly once
    report = SQLiteAuditStore(str(path)).verify_chain()
    assert report.ok, report.issues


def test_records_journaled_during_a_lock_are_stored_once_after_a_restart(tmp_path) -> None:
    path = tmp_path / "audit.sqlite"
    store = SQLiteAuditStore(str(path), busy_timeout_s=2)
    app = make_app(store, make_pipeline([GOOD_ANSWER]), commit_wait=0.2)
    locker = None
    try:
        with TestClient(app) as client:
            locker = lock(path)
            bodies = ask_all(client, 4)
            assert all(b["audit_persisted"] is True for b in bodies)
        # the app stopped with the store still locked: the records wait in the journal
    finally:
        if locker is not None:
            locker.execute("ROLLBACK")
            locker.close()
    store.close()
    ids = [b["request_id"] for b in bodies]
    restarted = SQLiteAuditStore(str(path))
    app = make_app(restarted, make_pipeline([GOOD_ANSWER]))
    with TestClient(app) as client:
        assert app.state.answerer.writer.flush(timeout=HANG)
        more = ask_all(client, 2)
    assert sorted(stored_request_ids(path)) == sorted(ids + [b["request_id"] for b in more])
    report = restarted.verify_chain()
    assert report.ok, report.issues
    restarted.close()
    assert cli.main(["audit", "verify", "--store", str(path)]) == 0


class FrozenCommits(SQLiteAuditStore):
    """A store whose direct commits (any thread but the audit writer's) freeze until thawed;
    the journal's drain still writes."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.thaw = threading.Event()
        self.frozen = 0

    def append_record(self, record: Any) -> None:
        if not threading.current_thread().name.startswith("tracerag-audit-writer"):
            self.frozen += 1
            self.thaw.wait(HANG)
        super().append_record(record)


def test_a_frozen_commit_does_not_hold_the_answer_nor_duplicate_the_record(tmp_path) -> None:
    path = tmp_path / "audit.sqlite"
    store = FrozenCommits(str(path))
    app = make_app(store, make_pipeline([GOOD_ANSWER]), commit_wait=0.2)
    try:
        with TestClient(app) as client:
            bodies = ask_all(client, 3)
            assert all(b["audit_persisted"] is True for b in bodies)
            assert store.frozen >= 1
            # the journal's copies reach the store while the direct commits are still frozen
            assert app.state.answerer.writer.flush(timeout=HANG)
            ids = [b["request_id"] for b in bodies]
            assert sorted(stored_request_ids(path)) == sorted(ids)
            store.thaw.set()  # the late commits find their records stored: no second copy
            settled(app.state.answerer)
    finally:
        store.thaw.set()
    assert sorted(stored_request_ids(path)) == sorted(ids)
    report = store.verify_chain()
    assert report.ok, report.issues


def settled(answerer: Answerer) -> None:
    """Wait until no direct commit is queued or running (late ones have ended)."""
    done = threading.Event()
    for _ in range(int(HANG / 0.05)):
        if answerer.commits_in_flight == 0:
            return
        done.wait(0.05)
    raise AssertionError(f"{answerer.commits_in_flight} store commits never ended")


def test_store_commits_leave_the_pipelines_executor_free(tmp_path) -> None:
    """A frozen commit holds a store thread, not a thread of the loop's default executor."""
    store = FrozenCommits(str(tmp_path / "audit.sqlite"))
    answerer = Answerer(object(), store, journal=str(tmp_path / "journal"), commit_wait=0.2)

    async def scenario() -> tuple[bool, int]:
        loop = asyncio.get_running_loop()
        loop.set_default_executor(ThreadPoolExecutor(1))
        persisted = asyncio.ensure_future(answerer.persist_async(make_record("req-frozen")))
        await asyncio.sleep(0)  # a yield, not a wait: the persist task starts
        try:
            # the pipeline's one executor thread is free while the commit is frozen
            value = await asyncio.wait_for(loop.run_in_executor(None, lambda: 7), HANG / 2)
            return await asyncio.wait_for(persisted, HANG / 2), value
        except BaseException:
            store.thaw.set()  # end the hang, so the loop can close
            raise

    try:
        persisted, value = asyncio.run(scenario())
        assert (persisted, value) == (True, 7)
        assert store.frozen == 1 and answerer.commit_timeouts == 1
        assert answerer.writer.flush(timeout=HANG)
        store.thaw.set()
        settled(answerer)
    finally:
        store.thaw.set()
        answerer.close()
    assert stored_request_ids(tmp_path / "audit.sqlite") == ["req-frozen"]


def test_without_a_journal_a_frozen_commit_answers_not_persisted_and_is_stored_later(
    tmp_path,
) -> None:
    """No journal: past the commit wait the record is not durable, and the answer says so; it
    is stored once when the store thaws."""
    store = FrozenCommits(str(tmp_path / "audit.sqlite"))
    answerer = Answerer(object(), store, journal=None, commit_wait=0.2)
    try:
        persisted = asyncio.run(
            asyncio.wait_for(answerer.persist_async(make_record("req-memory")), HANG)
        )
        assert persisted is False
        store.thaw.set()
        assert answerer.writer.flush(timeout=HANG)
        settled(answerer)
    finally:
        store.thaw.set()
        answerer.close()
    assert stored_request_ids(tmp_path / "audit.sqlite") == ["req-memory"]


LOCKER = """
import sqlite3, sys, time
conn = sqlite3.connect(sys.argv[1], isolation_level=None)
conn.execute("BEGIN EXCLUSIVE")
print("locked", flush=True)
time.sleep(float(sys.argv[2]))
conn.execute("ROLLBACK")
"""


@pytest.mark.integration  # a real server on a socket, another process, wall-clock bounds
def test_answers_during_a_lock_by_another_process_come_within_the_commit_wait(tmp_path) -> None:
    """The issue's figure: latency during a hung store is bounded by the commit wait."""
    import httpx

    path = tmp_path / "audit.sqlite"
    store = SQLiteAuditStore(str(path), busy_timeout_s=60)
    wait, margin, lock_seconds = 0.5, 2.0, 4.0
    app = make_app(store, make_pipeline([GOOD_ANSWER]), commit_wait=wait)
    latencies: list[float] = []
    bodies: list[dict[str, Any]] = []
    guard = threading.Lock()
    with running(app) as base:
        with httpx.Client(base_url=base, timeout=HANG) as client:
            assert client.post("/v1/answer", json={"question": GOOD_QUESTION}).status_code == 200
        with subprocess.Popen(
            [sys.executable, "-c", LOCKER, str(path), str(lock_seconds)],
            stdout=subprocess.PIPE,
            text=True,
        ) as locker:
            assert locker.stdout is not None and locker.stdout.readline().strip() == "locked"
            until = time.monotonic() + lock_seconds - 0.5

            def load() -> None:
                with httpx.Client(base_url=base, timeout=HANG) as client:
                    while time.monotonic() < until:
                        t0 = time.monotonic()
                        response = client.post("/v1/answer", json={"question": GOOD_QUESTION})
                        with guard:
                            latencies.append(time.monotonic() - t0)
                            bodies.append(response.json())

            threads = [threading.Thread(target=load) for _ in range(8)]
            for t in threads:
                t.start()
            for t in threads:
                t.join(HANG)
            assert locker.wait(HANG) == 0
        assert app.state.answerer.writer.flush(timeout=HANG)
        settled(app.state.answerer)
    assert len(bodies) >= 8 and all(b["audit_persisted"] is True for b in bodies)
    assert max(latencies) < wait + margin, sorted(latencies)[-5:]
    assert app.state.answerer.commit_timeouts >= 1
    ids = [b["request_id"] for b in bodies]
    assert set(ids) <= set(stored_request_ids(path))
    assert len(stored_request_ids(path)) == len(set(stored_request_ids(path)))
    report = store.verify_chain()
    assert report.ok, report.issues


def test_readyz_comes_back_with_the_store_without_waiting_for_a_request(tmp_path) -> None:
    """Issue 22: after a failed commit, /readyz stayed 503 once the store was back, until some
    request arrived (behind a readiness-gated load balancer, none ever does)."""
    path = tmp_path / "audit.sqlite"
    store = SQLiteAuditStore(str(path), busy_timeout_s=0.5)
    app = make_app(store, make_pipeline([GOOD_ANSWER]), commit_wait=0.2)
    with TestClient(app) as client:
        assert client.get("/readyz").status_code == 200
        locker = lock(path)
        try:
            (body,) = ask_all(client, 1)
            assert body["audit_persisted"] is True  # journaled
            reply = client.get("/readyz")
            assert reply.status_code == 503 and reply.json()["store"]["last_error"]
        finally:
            locker.execute("ROLLBACK")
            locker.close()
        # no answer asked meanwhile
        reply = wait_until(
            lambda: (r := client.get("/readyz")).status_code == 200 and r,
            "/readyz to come back with the store",
            timeout=5.0,
            interval=0.1,
        )
        assert reply.json()["store"]["last_error"] is None
        assert app.state.answerer.writer.flush(timeout=HANG)
    assert stored_request_ids(path) == [body["request_id"]]
