"""Readiness and durability follow the store's real state: a store that comes back is known to be
back within about a second, with or without traffic.

Issue 22: ``/readyz`` stayed 503 after the store recovered until some request arrived, and after
an outage every answer said ``audit_persisted: false`` for tens of seconds (the retry delay grew
to 30 s).
"""

from __future__ import annotations

import sqlite3
import time

from store_fixtures import make_record

from tracerag.store import AuditWriter, open_store
from tracerag.store._sqlite import SQLiteAuditStore


def _opener(path, busy: float = 0.1):
    def opener(create: bool = True):
        return open_store(str(path), create=create, busy_timeout_s=busy)

    return opener


def _lock(path) -> sqlite3.Connection:
    locker = sqlite3.connect(str(path), isolation_level=None)
    locker.execute("BEGIN IMMEDIATE")
    return locker


def test_after_an_outage_answers_are_durable_again_within_about_a_second(tmp_path) -> None:
    """Without a journal, ``true`` means committed: it must come back with the store, not at the
    end of a backoff that grew during the outage."""
    path = tmp_path / "a.sqlite"
    SQLiteAuditStore(path).close()
    writer = AuditWriter(_opener(path), backoff_initial=0.5, backoff_max=30.0, durable_timeout=2.0)
    locker = _lock(path)
    try:
        assert writer.submit_durable(make_record("during", decision="pass")) is False
        time.sleep(6.0)  # the retry delay has grown past 4 s, and would go on growing
        assert not writer.ready()
    finally:
        locker.execute("ROLLBACK")
        locker.close()
    released = time.monotonic()
    try:
        time.sleep(1.5)  # the probe (at most 1 s apart) has seen the store back
        assert writer.submit_durable(make_record("after", decision="pass")) is True
        assert time.monotonic() - released < 4.0
        assert writer.persisted("during") is True  # the record of the outage was written too
        assert writer.ready()
    finally:
        writer.close()


def test_a_reported_failure_clears_without_any_traffic(tmp_path) -> None:
    """A failure seen outside the writer (a direct commit in ``tracerag serve``) makes it not
    ready; its probe makes it ready again when the store answers, with no record written."""
    path = tmp_path / "a.sqlite"
    writer = AuditWriter(_opener(path), journal=tmp_path / "journal", backoff_initial=0.05)
    try:
        deadline = time.monotonic() + 10
        while not writer.ready():
            assert time.monotonic() < deadline
            time.sleep(0.02)
        locker = _lock(path)
        try:
            writer.report_failure(TimeoutError("a direct commit took over 1s"))
            assert not writer.ready()
            time.sleep(1.0)
            assert not writer.ready()  # still locked: the probe fails
            assert writer.status()["failing"] is True
        finally:
            locker.execute("ROLLBACK")
            locker.close()
        deadline = time.monotonic() + 3.0
        while not writer.ready():
            assert time.monotonic() < deadline, writer.status()
            time.sleep(0.02)
        assert writer.status()["last_error"] is None and writer.written == 0
    finally:
        writer.close()


def test_an_idle_writer_notices_the_store_going_away_and_coming_back(tmp_path) -> None:
    """No traffic at all: the idle ping sees a store locked by another process, and its end."""
    path = tmp_path / "a.sqlite"
    writer = AuditWriter(_opener(path), backoff_initial=0.05)  # pinged every 5 s when idle
    try:
        deadline = time.monotonic() + 10
        while not writer.ready():
            assert time.monotonic() < deadline
            time.sleep(0.02)
        locker = _lock(path)
        try:
            deadline = time.monotonic() + 8
            while writer.ready():
                assert time.monotonic() < deadline, "a locked store still reported ready"
                time.sleep(0.02)
        finally:
            locker.execute("ROLLBACK")
            locker.close()
        deadline = time.monotonic() + 3
        while not writer.ready():
            assert time.monotonic() < deadline, writer.status()
            time.sleep(0.02)
    finally:
        writer.close()
