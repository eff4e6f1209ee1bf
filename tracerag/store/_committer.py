"""Group commit for event loops: a thread journals every waiting record, then syncs once for all."""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable, Mapping
from typing import Any

from tracerag.store._journal import Journal

logger = logging.getLogger("tracerag.audit")

#: called with True once the record is durable in the journal, False when it is not
Settle = Callable[[bool], None]
#: journals a record without syncing: its journal ticket (an int) when accepted, else the outcome
Accept = Callable[[Mapping[str, Any]], "bool | str | int"]


class JournalCommitter:
    """Journals the records submitted from event loops off the loop, one ``fdatasync`` per batch.

    ``accept`` writes a record to ``journal`` without syncing and returns its ticket; the
    thread (named ``name``, started on the first ``submit``) then syncs up to the highest
    ticket and settles every record of the batch.
    """

    def __init__(self, journal: Journal, accept: Accept, name: str) -> None:
        self.journal = journal
        self._accept = accept
        self._name = name
        self._queue: list[tuple[Mapping[str, Any], Settle]] = []
        self._cond = threading.Condition()
        self._thread: threading.Thread | None = None
        self._stop = False

    def submit(self, record: Mapping[str, Any], settle: Settle) -> bool:
        """Queue ``record``; ``settle`` is called with its outcome. False: stopped (not queued)."""
        with self._cond:
            if self._stop:
                return False  # closed
            if self._thread is None:
                self._thread = threading.Thread(target=self._run, name=self._name, daemon=True)
                self._thread.start()
            self._queue.append((record, settle))
            self._cond.notify()
        return True

    def stop(self, timeout: float) -> None:
        """Journal what was submitted, then stop (waiting up to ``timeout``, at least a second)."""
        with self._cond:
            self._stop = True
            self._cond.notify_all()
            thread = self._thread
        if thread is not None:
            thread.join(max(1.0, timeout))

    def _run(self) -> None:
        """Journal what the event loops submitted: all waiting records, then one sync."""
        while True:
            with self._cond:
                while not self._queue:
                    if self._stop:
                        return
                    self._cond.wait()
                batch, self._queue = self._queue, []
            accepted: list[tuple[Settle, bool]] = []
            last = 0
            for record, settle in batch:
                try:
                    outcome = self._accept(record)
                except Exception:  # never leave an answer waiting
                    logger.exception("audit record could not be journaled")
                    outcome = False
                if isinstance(outcome, int) and not isinstance(outcome, bool):
                    last = max(last, outcome)
                    accepted.append((settle, True))
                else:
                    accepted.append((settle, False))
            synced = True
            if last:
                try:
                    self.journal.sync_upto(last)
                except OSError as exc:
                    logger.error("audit journal sync failed: %s", exc)
                    synced = False
            for settle, ok in accepted:
                settle(ok and synced)
