"""The audit writer's drain loop: batches from the buffer or journal into the store, in order.

``Drain`` runs on the writer's background thread. It peeks a batch, writes it (records in
runs, a quarantined record in its place in the chain, a refused journal frame set aside),
retries store failures by the ``RetryPolicy`` (waiting through ``StoreHealth``, so a close or
abort cuts the wait short), finds a poisoned record by writing one at a time, then acks the
batch and hands the outcomes to the writer (``settle``).
"""

from __future__ import annotations

import json
import logging
import threading
import time
from collections.abc import Callable
from typing import Any

from tracerag.store._buffer import FRAME_REFUSED, Item, JournalBuffer, MemoryBuffer, quarantine_item
from tracerag.store._health import StoreHealth
from tracerag.store._journal import FRAME_QUARANTINE, FRAME_RECORD, JournalError
from tracerag.store._link import StoreLink
from tracerag.store._retry import RetryPolicy, is_transient
from tracerag.store._types import DuplicateRequest, InvalidRecord, StoreReplaced, StoreVanished
from tracerag.telemetry import _instruments as metrics

logger = logging.getLogger("tracerag.audit")

#: the outcome of a record stored as a quarantined entry
QUARANTINED = "quarantined"
#: the outcome of a journal frame the chain key does not vouch for: kept aside, never sealed
REFUSED = "refused"
#: the reason of a record neither stored nor quarantined (the store refused both)
DROP_INVALID = "invalid_record"

#: one outcome per item of a batch: None (written, or already stored), ``QUARANTINED``,
#: ``REFUSED``, or why it was dropped
Outcomes = list[str | None]


class Drain:
    """Writes what the buffer holds to the store until ``stop`` is set.

    ``settle`` receives each batch written and its outcomes; ``export_head`` runs after every
    pass while the store is open; ``closing`` tells that the writer takes no more records.
    """

    def __init__(
        self,
        buffer: MemoryBuffer | JournalBuffer,
        link: StoreLink,
        health: StoreHealth,
        retry: RetryPolicy,
        cond: threading.Condition,
        stop: threading.Event,
        *,
        settle: Callable[[list[Item], Outcomes], None],
        export_head: Callable[[], None],
        closing: Callable[[], bool],
        pending: Callable[[], int],
        batch_size: int,
        batch_bytes: int,
        batch_delay: float,
        probe_idle: bool,
    ) -> None:
        self._buffer = buffer
        self._link = link
        self._health = health
        self._retry = retry
        self._cond = cond
        self._stop = stop
        self._settle = settle
        self._export_head = export_head
        self._closing = closing
        self._pending = pending
        self.batch_size = max(1, batch_size)
        self.batch_bytes = max(1, batch_bytes)
        #: journaled, how long the drain lets records gather before a store commit (they are
        #: durable already; fewer, larger commits cost the store and the disk less)
        self.batch_delay = batch_delay
        self.probe_idle = probe_idle
        self._journaled = isinstance(buffer, JournalBuffer)
        #: True while a batch is being written (``flush`` waits for it)
        self.busy = False

    # -- the loop -----------------------------------------------------------------------------
    def has_work(self) -> bool:
        return self._buffer.has_work()

    def run(self) -> None:
        while True:
            with self._cond:
                if self._stop.is_set():
                    return
                work = self.has_work()
                if not work:
                    idle = 0.5 if self._closing() else 1.0
                    if self._health.failing and self.probe_idle:
                        # degraded: wake for the next probe, not a whole idle second later
                        idle = min(idle, max(0.01, self._health.until_probe(time.monotonic())))
                    self._cond.wait(idle)
                    if self._stop.is_set():
                        return
                    work = self.has_work()
                self.busy = work
            if work:
                buffer = self._buffer
                if (
                    isinstance(buffer, JournalBuffer)
                    and self.batch_delay > 0
                    and not self._closing()
                    and buffer.pending_bytes() < self.batch_bytes
                ):
                    # gather a fuller batch; a backlog of a full batch or more (at full load,
                    # after an outage) is written at once, else the wait caps the drain rate
                    self._stop.wait(self.batch_delay)
                try:
                    items = self._peek()
                except JournalError as exc:  # pragma: no cover - a corrupt segment mid-journal
                    logger.error("audit journal unreadable: %s", exc)
                    items = []
                outcomes = self.write_with_retry(items) if items else []
                if outcomes is None:  # aborted: records stay in the buffer or the journal
                    with self._cond:
                        self.busy = False
                        self._cond.notify_all()
                    return
                self._ack(items)
                self._settle(items, outcomes)
            if not work and not self._closing() and self.probe_idle:
                self._health.probe_idle()
            if self._link.store is not None:
                self._export_head()
            with self._cond:
                self.busy = False
                self._cond.notify_all()

    def _peek(self) -> list[Item]:
        if isinstance(self._buffer, MemoryBuffer):
            with self._cond:
                return self._buffer.peek(self.batch_size, self.batch_bytes)
        return self._buffer.peek(self.batch_size, self.batch_bytes)

    def _ack(self, items: list[Item]) -> None:
        if isinstance(self._buffer, MemoryBuffer):
            with self._cond:
                self._buffer.ack(items)
        else:
            self._buffer.ack(items)

    # -- writing a batch ----------------------------------------------------------------------
    def write_with_retry(self, items: list[Item]) -> Outcomes | None:
        """Write a batch until it is written; None if the writer is aborted meanwhile."""
        attempt = 0
        while True:
            if self._stop.is_set():
                return None
            try:
                outcomes = self.write_once(items)
            except Exception as exc:
                if not is_transient(exc):
                    # a record, not the store: find it by writing one at a time
                    self._health.recovered()
                    if len(items) > 1:
                        return self._write_each(items)
                    return [self._quarantine(items[0], f"{type(exc).__name__}: {exc}")]
                attempt += 1
                delay = self._retry.delay(attempt)
                self._failed(exc, items, attempt, delay)
                if isinstance(exc, (StoreReplaced, StoreVanished)):
                    self._link.discard()
                suspect = self._retry.suspect(attempt, exc)
                if suspect and len(items) == 1 and self._health.answers():
                    return [self._quarantine(items[0], f"{type(exc).__name__}: {exc}")]
                if suspect and len(items) > 1 and self._health.answers():
                    return self._write_each(items)
                self._health.wait_to_retry(delay)
                continue
            self._health.recovered()
            return outcomes

    def _write_each(self, items: list[Item]) -> Outcomes | None:
        """Write ``items`` one at a time (to find the record the store refuses); None: stopped."""
        out: Outcomes = []
        for item in items:
            one = self.write_with_retry([item])
            if one is None:
                return None
            out += one
        return out

    def write_once(self, items: list[Item]) -> Outcomes:
        """One attempt: None per record written (or already stored), else its outcome."""
        timed = self._health.timed
        store = timed(self._link.ensure)
        outcomes: Outcomes = [None] * len(items)
        run: list[tuple[int, dict[str, Any]]] = []  # consecutive records, written together

        def write_run() -> None:
            if len(run) > 1 and hasattr(store, "append_records"):
                results = timed(store.append_records, [r for _, r in run])
                for (i, _), result in zip(run, results, strict=True):
                    if isinstance(result, InvalidRecord):
                        outcomes[i] = self._quarantine(items[i], f"InvalidRecord: {result}")
            else:
                for i, record in run:
                    try:
                        timed(store.append_record, record)
                    except DuplicateRequest:
                        logger.info(
                            "audit record request_id=%s was already stored", items[i].request_id
                        )
                    except InvalidRecord as exc:
                        outcomes[i] = self._quarantine(items[i], f"InvalidRecord: {exc}")
            run.clear()

        # in submission order: a quarantined record takes its place in the chain
        for i, item in enumerate(items):
            if item.type == FRAME_REFUSED:
                write_run()
                outcomes[i] = self._refuse(item)
                continue
            if item.type == FRAME_RECORD:
                try:
                    record = item.record if item.record is not None else json.loads(item.payload)
                except ValueError as exc:
                    write_run()
                    outcomes[i] = self._quarantine(item, f"undecodable: {exc}")
                    continue
                run.append((i, record))
            else:
                write_run()
                outcomes[i] = self._quarantine(item, None)
        write_run()
        return outcomes

    def _refuse(self, item: Item) -> str:
        """Keep a journal frame the chain key does not vouch for aside; it is never sealed."""
        assert isinstance(self._buffer, JournalBuffer) and item.frame is not None
        journal = self._buffer.journal
        journal.set_aside(item.frame)
        logger.error(
            "audit journal %s: a record (request_id=%s, %d bytes) is NOT authentic (no valid "
            "tag under the chain key): REFUSED, kept aside in %s and not written to the store",
            journal.directory,
            (item.request_id or "?")[:200],
            len(item.payload),
            journal.directory / "refused.frames",
        )
        return REFUSED

    def _quarantine(self, item: Item, reason: str | None) -> str:
        """Store a poisoned record as a quarantined entry; the outcome for that record."""
        if item.type == FRAME_QUARANTINE:
            body = json.loads(item.payload)
        else:
            try:
                record: Any = json.loads(item.payload)
            except ValueError:
                record = item.payload.decode("utf-8", "backslashreplace")
            body = json.loads(quarantine_item(record, item.request_id, reason or "").payload)
        if reason is not None and item.type == FRAME_RECORD:
            logger.error("audit record request_id=%s QUARANTINED: %s", item.request_id, reason)
        append = getattr(self._link.store, "append_quarantined", None)
        if append is None:
            return f"{DROP_INVALID}: {body['reason']}"
        try:
            self._health.timed(
                append, body["request_id"], body["reason"], body["raw"], body["raw_truncated"]
            )
        except DuplicateRequest:
            pass
        except Exception as exc:
            if is_transient(exc):
                raise
            return f"{DROP_INVALID}: {body['reason']}; quarantine refused: {exc}"
        return QUARANTINED

    def _failed(self, exc: BaseException, items: list[Item], attempt: int, delay: float) -> None:
        self._health.failed(exc, attempt=True)
        pending = self._pending()
        try:
            metrics.record_audit_failure(type(exc).__name__)
        except Exception:  # pragma: no cover
            logger.debug("could not count an audit failure", exc_info=True)
        ids = items[0].request_id if items else "(none pending)"
        if len(items) > 1:
            ids += f" (+{len(items) - 1} more in the batch)"
        logger.warning(
            "audit store write failed for request_id=%s (attempt %d, %d pending%s), "
            "retrying in %.1fs: %s: %s",
            ids,
            attempt,
            pending,
            ", kept in the journal" if self._journaled else "",
            delay,
            type(exc).__name__,
            exc,
        )
