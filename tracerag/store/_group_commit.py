"""Group commit: concurrent ``append_record`` calls of one SQL store share one transaction.

``GroupCommit`` makes the first caller with no transaction in progress the leader, who writes
every record waiting (and those that arrive while its transaction waits for the chain head)
in one commit; each caller still gets its own outcome. A failing store holds one caller at a
time: for ``fail_fast_seconds`` the others fail at once (``StoreFailing``).
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable, Mapping
from typing import Any

from tracerag.store._chain_log import Cursor, Head, WriteTransaction, request_exists
from tracerag.store._codec import entries_from_record
from tracerag.store._types import DuplicateRequest, Entry, InvalidRecord, StoreFailing

logger = logging.getLogger("tracerag.audit")

#: writes one record's entries (and its index rows) in a write transaction
InsertRecord = Callable[[Cursor, Head, Mapping[str, Any], list[Entry]], None]


#: the most records one group commit writes in one transaction
MAX_GROUP = 256


class _GroupItem:
    """One record waiting for a group commit, and its outcome once ``done``."""

    __slots__ = ("done", "entries", "error", "record")

    def __init__(self, record: Mapping[str, Any], entries: list[Entry]) -> None:
        self.record, self.entries = record, entries
        self.done = False
        self.error: BaseException | None = None


class GroupCommit:
    """The group commit of one store: ``write`` opens its transactions, ``insert`` writes a
    record in one, ``interrupt`` makes a hung one fail, ``location`` names the store."""

    def __init__(
        self,
        write: WriteTransaction,
        insert: InsertRecord,
        interrupt: Callable[[], None],
        location: Callable[[], str],
    ) -> None:
        self._write = write
        self._insert = insert
        self._interrupt = interrupt
        self._location = location
        self._cond = threading.Condition()
        self._waiting: list[_GroupItem] = []
        self._leader = False
        #: transactions that committed records of append_record (fewer than calls: grouped)
        self.commits = 0
        #: seconds an append_record transaction may take before it is interrupted (a hung
        #: server or disk; the backends' own timeouts normally fire first); 0: no bound
        self.commit_timeout = 5.0
        #: after the store failed a group, for this many seconds (and while another attempt
        #: is under way) append_record fails at once instead of waiting for the store again
        self.fail_fast_seconds = 2.0
        #: since when, and why, the store failed (None: it works)
        self.failed: tuple[float, BaseException] | None = None

    def append_record(self, record: Mapping[str, Any]) -> None:
        """Store one record; return once it is committed.

        Calls from several threads at once share one transaction (group commit: one commit,
        one disk sync): the first caller to find no transaction in progress writes everything
        waiting, and what arrives while its transaction waits for the chain head (held by
        another process on the same store) joins it once the head is held (at most
        ``MAX_GROUP`` records); each caller still gets its own outcome (``DuplicateRequest``,
        ``InvalidRecord``, or the store's failure when the shared transaction failed). A
        transaction hanging past ``commit_timeout`` is interrupted (it fails). When the store
        fails a group, the calls that queued behind it fail at once with the same error, and
        so do new calls (``StoreFailing``) for ``fail_fast_seconds`` and while one call tries
        the store again: a failing store holds one caller at a time, not every caller.
        """
        item = _GroupItem(record, entries_from_record(record))
        with self._cond:
            failed = self.failed
            if failed is not None and (
                self._leader or time.monotonic() - failed[0] < self.fail_fast_seconds
            ):
                since, why = failed
                raise StoreFailing(
                    f"the audit store failed {time.monotonic() - since:.1f}s ago "
                    f"({type(why).__name__}: {why}); not waiting for it again yet"
                ) from why
            self._waiting.append(item)
            while self._leader and not item.done:
                self._cond.wait()
            if not item.done:
                self._leader = True
                batch, self._waiting = self._waiting, []
        if not item.done:
            timer = None
            if self.commit_timeout > 0:
                timer = threading.Timer(self.commit_timeout, self._interrupt_hung)
                timer.daemon = True
                timer.start()
            failure: BaseException | None = None
            try:
                failure = self._commit_group(batch)
            finally:
                if timer is not None:
                    timer.cancel()
                with self._cond:
                    self._leader = False
                    self.failed = None if failure is None else (time.monotonic(), failure)
                    if failure is not None:
                        # the store is failing: the callers who queued meanwhile are told now
                        # instead of each group waiting the store's timeout in turn
                        for queued in self._waiting:
                            queued.error, queued.done = failure, True
                        self._waiting = []
                    self._cond.notify_all()
        if item.error is not None:
            raise item.error

    def _interrupt_hung(self) -> None:
        logger.warning(
            "audit store %s: a commit took more than %.1fs; interrupting it",
            self._location(),
            self.commit_timeout,
        )
        try:
            self._interrupt()
        except Exception:
            logger.warning("could not interrupt the audit store", exc_info=True)

    def _commit_group(self, batch: list[_GroupItem]) -> BaseException | None:
        """Write a group of records in one transaction; settle each item's outcome.

        Returns the store's failure when the whole group failed with it (else None).
        """
        failure: BaseException | None = None
        try:
            with self._write() as (cur, head):
                # the chain head is ours now (other processes wait for it): the records that
                # arrived while this transaction waited for it join it, instead of waiting for
                # the lock again in a transaction of their own
                self._join_late(batch)
                self._insert_group(cur, head, batch)
            self.commits += 1
        except InvalidRecord:
            # a record, not the store: each record in a transaction of its own
            for item in batch:
                item.error = None
                try:
                    with self._write() as (cur, head):
                        self._insert_group(cur, head, [item])
                    self.commits += 1
                except BaseException as exc:
                    item.error = exc
        except BaseException as exc:
            failure = exc
            for item in batch:
                item.error = exc
        for item in batch:
            item.done = True
        return failure

    def _join_late(self, batch: list[_GroupItem]) -> None:
        """Move the records queued since ``batch`` was taken into it (up to ``MAX_GROUP``)."""
        with self._cond:
            room = MAX_GROUP - len(batch)
            if room > 0 and self._waiting:
                batch += self._waiting[:room]
                del self._waiting[:room]

    def _insert_group(self, cur: Cursor, head: Head, batch: list[_GroupItem]) -> None:
        seen: set[str] = set()
        for item in batch:
            request_id = item.entries[0].request_id
            if request_id in seen or request_exists(cur, request_id):
                item.error = DuplicateRequest(request_id)
                continue
            seen.add(request_id)
            self._insert(cur, head, item.record, item.entries)
