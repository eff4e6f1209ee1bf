"""Readiness and durability follow the store's real state: a store that comes back is known to be
back within about a second, with or without traffic.

Issue 22: ``/readyz`` stayed 503 after the store recovered until some request arrived, and after
an outage every answer said ``audit_persisted: false`` for tens of seconds (the retry delay grew
to 30 s).
"""

from __future__ import annotations

import logging
import sqlite3
import time

from store_fixtures import make_record
from waiting import wait_until

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


def _probed_in_the_long_wait(caplog) -> bool:
    """A probe failed after the fourth attempt: the store went on being down in its wait."""
    messages = [r.getMessage() for r in caplog.records]
    fourth = next((i for i, m in enumerate(messages) if "(attempt 4," in m), None)
    return fourth is not None and any("not answering" in m for m in messages[fourth + 1 :])


def test_after_an_outage_answers_are_durable_again_within_about_a_second(tmp_path, caplog) -> None:
    """Without a journal, ``true`` means committed: it must come back with the store, not at the
    end of a backoff that grew during the outage."""
    path = tmp_path / "a.sqlite"
    SQLiteAuditStore(path).close()
    writer = AuditWriter(_opener(path), backoff_initial=0.5, backoff_max=30.0, durable_timeout=2.0)
    locker = _lock(path)
    try:
        assert writer.submit_durable(make_record("during", decision="pass")) is False
        # the fourth failed attempt sets the retry delay past 4 s, and it would go on growing;
        # a probe in that wait finds the store still down
        with caplog.at_level(logging.DEBUG, logger="tracerag.audit"):
            wait_until(
                lambda: _probed_in_the_long_wait(caplog),
                "a failed probe after the fourth failed attempt",
                timeout=15,
            )
        assert writer.failures >= 4 and not writer.ready()
    finally:
        locker.execute("ROLLBACK")
        locker.close()
    released = time.monotonic()
    try:
        # the probe (at most 1 s apart) sees the store back, and the record of the outage is
        # written at once, not at the end of the 4 s delay
        wait_until(lambda: writer.persisted("during"), "the outage's record written", timeout=4)
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
        wait_until(writer.ready, "the writer to open the store", timeout=10)
        locker = _lock(path)
        try:
            writer.report_failure(TimeoutError("a direct commit took over 1s"))
            assert not writer.ready()
            reported = "TimeoutError: a direct commit took over 1s"
            assert writer.status()["last_error"] == reported
            wait_until(
                lambda: writer.status()["last_error"] != reported, "a probe of the locked store"
            )
            assert not writer.ready()  # still locked: the probe fails
            assert writer.status()["failing"] is True
        finally:
            locker.execute("ROLLBACK")
            locker.close()
        wait_until(writer.ready, "the probe to see the store back", timeout=3.0)
        assert writer.status()["last_error"] is None and writer.written == 0
    finally:
        writer.close()


def test_an_idle_writer_notices_the_store_going_away_and_coming_back(tmp_path) -> None:
    """No traffic at all: the idle ping sees a store locked by another process, and its end."""
    path = tmp_path / "a.sqlite"
    writer = AuditWriter(_opener(path), backoff_initial=0.05)  # pinged every 5 s when idle
    try:
        wait_until(writer.ready, "the writer to open the store", timeout=10)
        locker = _lock(path)
        try:
            # the idle ping comes every 5 s: this wait is the ping's interval, not a guess
            wait_until(
                lambda: not writer.ready(), "the idle ping to see the store locked", timeout=8
            )
        finally:
            locker.execute("ROLLBACK")
            locker.close()
        wait_until(writer.ready, "the probe to see the store back", timeout=3)
    finally:
        writer.close()
