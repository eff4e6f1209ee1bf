"""The answer-run table beside the audit store, on SQLite and PostgreSQL: one run per key,
events stored without the answer, expiry, and the decided requests among those asked about."""

from __future__ import annotations

import json
import threading
import time

import pytest
from store_fixtures import make_record

from tracerag.server._run_table import RunTableError, open_run_table


@pytest.fixture
def table(store):
    t = open_run_table(store)
    assert t is not None
    yield t
    t.close()


def test_a_key_names_one_run_until_it_expires(table):
    now = time.time()
    assert table.claim("r1", "key", "fp-1", now, ttl=60) is None
    found = table.claim("r2", "key", "fp-2", now + 1, ttl=60)
    assert found is not None and found.request_id == "r1" and found.fingerprint == "fp-1"
    assert found.events is None  # under way
    assert table.get("r2", now) is None  # the second claim recorded nothing
    assert table.claim("r3", "key", "fp-3", now + 61, ttl=60) is None  # expired: taken anew
    assert table.get("r3", now + 61).fingerprint == "fp-3"


def test_runs_without_a_key_are_kept_by_request_id(table):
    now = time.time()
    assert table.claim("a", None, "fp", now, ttl=60) is None
    assert table.claim("b", None, "fp", now, ttl=60) is None
    assert {table.get("a", now).request_id, table.get("b", now).request_id} == {"a", "b"}


def test_the_events_are_stored_without_the_answer(table):
    now = time.time()
    table.claim("r1", "k", "fp", now, ttl=60)
    stage = {"stage": "register", "request_id": "r1", "signals": {"tier": "high"}}
    answer = json.dumps({"answer": "the answer text"})
    table.finish("r1", [("stage", json.dumps(stage)), ("response", answer)])
    stored = table.get("r1", now)
    assert stored.events == [("stage", stage), ("response", None)]


def test_expired_runs_are_purged(table):
    now = time.time()
    table.claim("old", None, "fp", now - 100, ttl=60)
    table.claim("new", "k", "fp", now, ttl=60)
    assert table.count() == 2
    assert table.purge(now) == 1
    assert table.get("old", now) is None and table.get("new", now) is not None


def test_concurrent_claims_of_one_key_give_one_run(store):
    """Replicas race for a key: exactly one records its run, the others get that one."""
    tables = [open_run_table(store) for _ in range(4)]
    now = time.time()
    results: list = [None] * 8
    barrier = threading.Barrier(8)

    def claim(i: int) -> None:
        barrier.wait()
        results[i] = tables[i % 4].claim(f"r{i}", "raced", f"fp{i}", now, 60)

    threads = [threading.Thread(target=claim, args=(i,)) for i in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    for t in tables:
        t.close()
    winners = [i for i, r in enumerate(results) if r is None]
    assert len(winners) == 1
    assert {r.request_id for r in results if r is not None} == {f"r{winners[0]}"}


def test_decided_requests_are_found_among_many(store, table):
    for i in range(3):
        store.append_record(make_record(request_id=f"q{i}", decision="escalate"))
    store.decide("q1", "alice", "reject", None, "wrong policy")
    ids = ["q0", "q1", "q2", *(f"missing-{i}" for i in range(1200))]
    assert table.decided_among(ids) == {"q1"}


def test_events_that_are_not_a_list_of_pairs_are_refused(store, table, backend):
    now = time.time()
    table.claim("r1", None, "fp", now, ttl=60)
    backend.execute(
        "UPDATE answer_runs SET events = ? WHERE request_id = ?", ('{"not": "a list"}', "r1")
    )
    with pytest.raises(RunTableError):
        table.get("r1", now)


def test_an_in_memory_store_has_no_table():
    from tracerag.store._sqlite import SQLiteAuditStore

    with SQLiteAuditStore(":memory:") as memory:
        assert open_run_table(memory) is None
