"""AuditWriter: audit records reach the store off the request path; none is lost in silence.

Two modes:

- **journaled** (``journal=DIR``; what ``audit=`` URLs and ``TRACERAG_STORE`` use for a SQLite
  file, and for any store when ``TRACERAG_AUDIT_JOURNAL`` is set): ``submit``
  appends the record to a local crash-safe journal (``tracerag.store._journal``: append +
  ``fdatasync``, group commit) and returns True only once it is on disk. A background thread
  drains the journal into the store and deletes what is stored; at start it drains what an
  earlier process left behind. A ``kill -9`` therefore loses no record that was acknowledged.
- **in memory** (no journal): ``submit`` appends to a buffer bounded by count
  (``max_buffer``) and bytes (``max_buffer_bytes``) and returns at once; ``submit_durable``
  waits (up to ``durable_timeout``) until the store has committed the record.

What a Response's ``audit_persisted`` means, via ``submit_durable`` (see ``tracerag.store._sink``):
``True`` only when the record is durable at answer time — in the journal, or committed to the
store; ``False`` when it was refused (buffer or journal full, writer closed), quarantined, or
not yet committed when the wait ended (store slow or failing; it may still be written later:
``persisted(request_id)`` tells); ``None`` when no audit trail is configured.

Records the writer cannot encode or the store refuses as invalid (a lone UTF-16 surrogate, a
value JSON cannot carry, no request_id, text the database rejects) are **quarantined**: stored
as a ``quarantined`` entry carrying the reason and an ASCII-escaped copy of the record, so they
never block the records behind them. Store failures (unreachable, locked, vanished, replaced)
are **transient**: the batch at the head is retried with exponential backoff and jitter, in
order, and logged at WARNING. A record that keeps failing while the store accepts a write
transaction (``ping``) is treated as poisoned and quarantined. A store operation hanging longer
than ``op_timeout`` is interrupted (``store.interrupt()``).

For an event loop, ``asubmit_durable`` writes and waits for the disk off the loop, so the
answers that finish together share one ``fdatasync``.

Health: ``healthy`` is False while the store is failing, the buffer/journal is full, or the
writer is closed; ``ready()`` adds "the store was opened and is the expected one" and "no
store operation has been hanging for longer than ``op_timeout``"; ``status()`` gives the
details (for ``/readyz``). The store is pinged while idle (every ``probe_interval``) and, once it
failed (or ``report_failure`` said so), with a short backoff up to ``probe_max``: readiness turns
true again, and a batch waiting out a long retry delay is written, about a second after the
store answers, with or without traffic.

Tamper evidence outside the store: with the chain key (``chain_key``, default
``TRACERAG_CHAIN_KEY``) the journal's records are authenticated, and a record the key does not
vouch for is refused (kept aside, logged, counted in ``refused``), never sealed. The chain head is
exported to the anchor (``anchor``, default ``TRACERAG_AUDIT_ANCHOR``, else the journal
directory's ``head.json``) at most ``head_export_interval`` after it changes and at close, only
ever forward (a head behind the anchor, or a rewritten anchored entry, is reported as
``anchor_conflict`` instead). Metrics (``tracerag.metrics``): ``persist_failures`` per failed
attempt, ``dropped`` per lost record, ``backlog`` (records accepted and not yet stored).

The store's identity (``store_id`` and chain genesis, see ``SQLAuditStore.identity``) is
remembered — in the journal directory when there is one — and every later open must find the
same store: a store that vanished or was replaced by another (an empty one included) is never
written to; the records wait in the journal and the writer reports not ready.

The writer composes its parts, each a module of its own: the buffer or journal
(``_buffer``), the drain loop (``_drain``), the retry policy (``_retry``), the store's health
and the watchdog (``_health``), the store link and its identity (``_link``), the head export
(``_anchor``) and the journal's group commit (``_committer``).
"""

from __future__ import annotations

import asyncio
import atexit
import json
import logging
import threading
import time
from collections import OrderedDict
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

from tracerag.config import get_config
from tracerag.errors import ConfigurationError
from tracerag.store._anchor import HeadAnchor, anchor_path
from tracerag.store._base import AuditStore
from tracerag.store._buffer import Item, JournalBuffer, MemoryBuffer, encode_record, request_id_of
from tracerag.store._committer import JournalCommitter
from tracerag.store._drain import QUARANTINED, REFUSED, Drain, Outcomes
from tracerag.store._health import StoreHealth
from tracerag.store._journal import FRAME_QUARANTINE, Journal, JournalError, open_journal
from tracerag.store._kept import Kept
from tracerag.store._link import StoreLink
from tracerag.store._retry import RetryPolicy
from tracerag.telemetry import _instruments as metrics

logger = logging.getLogger("tracerag.audit")

DropHook = Callable[[Mapping[str, Any], str], None]

DROP_BUFFER_FULL = "buffer_full"
DROP_SHUTDOWN = "shutdown"
DROP_CLOSED = "writer_closed"
DROP_JOURNAL = "journal_failed"

_UNSET: Any = object()


class AuditWriter:
    """Writes audit records to a store in a background thread, journaled or buffered.

    ``store`` is an ``AuditStore`` or a callable that opens one (called, and retried, in the
    background, so an unreachable store at start-up does not stop the application; when it
    accepts ``create=``, it is called with ``create=False`` once a store identity is expected).
    ``journal`` is a directory (or a ``Journal``) for the crash-safe journal; None keeps the
    buffer in memory. ``chain_key`` authenticates the journal's records (default: the store's
    key, else ``TRACERAG_CHAIN_KEY``); ``anchor`` is where the chain head is exported (a file or
    a directory; default ``TRACERAG_AUDIT_ANCHOR``, else the journal directory; False: nowhere).
    """

    # settings kept by the parts that use them
    max_buffer = Kept[int]("_buffer", "max_items")
    max_buffer_bytes = Kept[int]("_buffer", "max_bytes")
    batch_size = Kept[int]("_drain")
    batch_bytes = Kept[int]("_drain")
    batch_delay = Kept[float]("_drain")
    #: open the store at start and ping it while idle (every ``probe_interval`` seconds;
    #: while it fails, with a backoff from ``backoff_initial`` up to ``probe_max``), so
    #: ``ready()`` follows the store without traffic and a recovered store is written to at once
    probe_idle = Kept[bool]("_drain")
    op_timeout = Kept[float]("_health")
    probe_interval = Kept[float]("_health")
    probe_max = Kept[float]("_health")
    last_error = Kept["BaseException | None"]("_health")
    failures = Kept[int]("_health")  # failed write attempts (each retry counts)
    backoff_initial = Kept[float]("_retry", "initial")
    backoff_max = Kept[float]("_retry", "maximum")

    def __init__(
        self,
        store: AuditStore | Callable[..., AuditStore],
        max_buffer: int = 10_000,
        *,
        max_buffer_bytes: int = 64 * 1024 * 1024,
        journal: str | Path | Journal | None = None,
        durable_timeout: float = 2.0,
        op_timeout: float = 10.0,
        on_drop: DropHook | None = None,
        backoff_initial: float = 0.1,
        backoff_max: float = 30.0,
        batch_size: int = 200,
        batch_bytes: int = 512 * 1024,
        batch_delay: float = 0.2,
        remember: int = 10_000,
        close_timeout: float = 5.0,
        head_export_interval: float = 1.0,
        probe_idle: bool = True,
        probe_interval: float = 5.0,
        probe_max: float = 1.0,
        chain_key: str | bytes | None = _UNSET,
        anchor: str | Path | bool | None = None,
        name: str = "tracerag-audit-writer",
    ) -> None:
        if max_buffer < 1:
            raise ConfigurationError("max_buffer must be at least 1")
        self.on_drop = on_drop
        self.close_timeout = close_timeout
        self.durable_timeout = durable_timeout
        self._remember = max(remember, 2 * max_buffer)
        if chain_key is _UNSET:
            given = store if hasattr(store, "append_record") else None
            chain_key = getattr(given, "chain_key", None) or get_config().chain_key
        if journal is not None and not isinstance(journal, Journal):
            journal = open_journal(journal, key=chain_key)
        self.journal: Journal | None = journal
        self._head_anchor = HeadAnchor(anchor_path(anchor, journal), head_export_interval)
        if self.anchor is None and anchor is not False:
            logger.info(
                "the audit chain head is not exported (no journal and no TRACERAG_AUDIT_ANCHOR): "
                "without an anchor, tracerag audit verify cannot see the newest entries removed"
            )
        self._buffer = MemoryBuffer(max_buffer, max_buffer_bytes)
        self._records: MemoryBuffer | JournalBuffer = (
            self._buffer if journal is None else JournalBuffer(journal)
        )
        self._status: OrderedDict[str, bool | None] = OrderedDict()
        self._cond = threading.Condition()
        self._stop = threading.Event()  # set on abort: cuts every wait of the parts short
        self._closing = False
        self._closed = False
        self.written = 0
        self.dropped = 0
        self.quarantined = 0
        self.refused = 0  # journal frames refused as not authentic (kept aside)
        self.durable_timeouts = 0  # submit_durable waits that ended without a commit
        self.recovered = journal.recovered if journal is not None else 0
        self._backlog = 0
        self._link = StoreLink(store, journal)
        self._retry = RetryPolicy(backoff_initial, backoff_max)
        self._health = StoreHealth(
            self._link,
            self._retry,
            self._cond,
            self._stop,
            op_timeout=op_timeout,
            probe_interval=probe_interval,
            probe_max=probe_max,
            pending=lambda: self._backlog,
            journaled=journal is not None,
        )
        self._drain = Drain(
            self._records,
            self._link,
            self._health,
            self._retry,
            self._cond,
            self._stop,
            settle=self._settle,
            export_head=self._export_head,
            closing=lambda: self._closing,
            pending=lambda: self._backlog,
            batch_size=batch_size,
            batch_bytes=batch_bytes,
            batch_delay=batch_delay,
            probe_idle=probe_idle,
        )
        if journal is not None and journal.recovered:
            self._backlog_add(journal.recovered)
            logger.warning(
                "audit journal %s holds %d records from an earlier run; writing them to the store",
                journal.directory,
                journal.recovered,
            )
        # event-loop submissions waiting for the journal committer (see asubmit_durable)
        self._committer: JournalCommitter | None = (
            JournalCommitter(journal, self._journal_unsynced, f"{name}-journal")
            if journal is not None
            else None
        )
        self._thread = threading.Thread(target=self._drain.run, name=name, daemon=True)
        self._thread.start()
        self._watchdog = threading.Thread(
            target=self._health.watch,
            args=(lambda: self._stop.is_set() or self._closed,),
            name=f"{name}-watchdog",
            daemon=True,
        )
        self._watchdog.start()
        atexit.register(self._atexit)

    @property
    def anchor(self) -> Path | None:
        """The anchor file the chain head is exported to (None: not exported)."""
        return self._head_anchor.path

    @property
    def anchor_conflict(self) -> str | None:
        """Why the chain head was last not exported to the anchor (None: no conflict)."""
        return self._head_anchor.conflict

    @property
    def head_export_interval(self) -> float:
        """The most seconds between a change of the chain head and its export."""
        return self._head_anchor.interval

    @head_export_interval.setter
    def head_export_interval(self, value: float) -> None:
        self._head_anchor.interval = value

    # -- caller side --------------------------------------------------------------------------
    def submit(self, record: Mapping[str, Any]) -> bool:
        """Accept a record for writing. False if it was refused (and so is lost).

        Journaled: True means the record is on disk. In memory: True means buffered.
        A record that cannot be encoded is quarantined (accepted; see ``quarantined``).
        """
        return self._accept(record) is not False

    def submit_durable(self, record: Mapping[str, Any], timeout: float | None = None) -> bool:
        """Accept a record; True only if it is durable (journaled or committed) on return."""
        outcome = self._accept(record)
        if outcome is not True:
            return False
        if self.journal is not None:
            return True
        rid = request_id_of(record)
        if rid is None:
            return False
        wait = self.durable_timeout if timeout is None else timeout
        now = time.monotonic()
        deadline = now + wait
        with self._cond:
            head = self._buffer.head()
            if head is not None and head.request_id != rid and head.accepted_at < now - wait:
                # the store has been stuck for a whole wait already: do not wait again (one
                # stalled store must not stall every answer in turn)
                return False
            while True:
                state = self._status.get(rid)
                if state is not None:
                    return state is True
                remaining = deadline - time.monotonic()
                if remaining <= 0 or self._health.failing or self._closed:
                    if remaining <= 0:
                        self.durable_timeouts += 1
                    return False
                self._cond.wait(remaining)

    async def asubmit_durable(self, record: Mapping[str, Any]) -> bool:
        """``submit_durable`` for an event loop: neither the journal write nor the wait for the
        disk runs on the loop.

        Journaled, a committer thread writes every record waiting and syncs once for all of
        them (group commit), without holding the loop's executor threads (the pipeline needs
        them). The write is kept off the loop too: a ``write`` to a file being synced can block
        in the kernel until the sync ends, which would stall every request of the loop.
        """
        loop = asyncio.get_running_loop()
        if self.journal is None or self._committer is None:
            return await loop.run_in_executor(None, self.submit_durable, record)
        future: asyncio.Future[bool] = loop.create_future()

        def settle(durable: bool) -> None:
            def set_result() -> None:
                if not future.done():
                    future.set_result(durable)

            loop.call_soon_threadsafe(set_result)

        if not self._committer.submit(record, settle):
            return False  # closed
        return await future

    def _journal_unsynced(self, record: Mapping[str, Any]) -> bool | str | int:
        return self._accept(record, sync=False)

    def _accept(self, record: Mapping[str, Any], sync: bool = True) -> bool | str | int:
        """True when accepted, ``QUARANTINED`` when accepted as quarantined, else False.

        With ``sync=False`` (journaled) an accepted record's journal ticket is returned instead
        of True; the caller waits for ``journal.sync_upto(ticket)``.
        """
        item = encode_record(record)
        reason: str | None = None
        if item.type == FRAME_QUARANTINE:
            logger.error(
                "audit record request_id=%s QUARANTINED: %s",
                item.request_id,
                json.loads(item.payload)["reason"],
            )
        with self._cond:
            if self._closing or self._closed:
                reason = DROP_CLOSED
            elif self.journal is None and self._buffer.refuses(item):
                reason = DROP_BUFFER_FULL
        ticket = 0
        if reason is None and isinstance(self._records, JournalBuffer):
            try:
                ticket = self._records.put(item, sync)
            except (JournalError, OSError) as exc:
                reason = f"{DROP_JOURNAL}: {exc}"
        if reason is not None:
            self._drop_item(item, reason, record)
            return False
        with self._cond:
            if self.journal is None:
                self._buffer.put(item)
            self._set_status(item.request_id, None)
            self._cond.notify_all()
        self._backlog_add(1)
        if item.type == FRAME_QUARANTINE:
            return QUARANTINED
        return ticket if ticket else True

    def write_now(self, record: Mapping[str, Any]) -> None:
        """Write a record synchronously on the caller's thread, bypassing buffer and journal.

        Raises whatever the store raises (``DuplicateRequest``, ``InvalidRecord``, ...).
        """
        store = self._link.ensure()
        store.append_record(record)
        with self._cond:
            self.written += 1
            self._set_status(str(record.get("request_id")), True)

    def persisted(self, request_id: str) -> bool | None:
        """True once stored, False if dropped or quarantined, None while pending/unknown."""
        with self._cond:
            return self._status.get(request_id)

    @property
    def healthy(self) -> bool:
        """False while the store is failing, the buffer is full, or the writer is closed."""
        with self._cond:
            return not (self._health.failing or self._closing or self._records.full())

    def ready(self) -> bool:
        """True when the store is open, is the expected one, writes succeed and none hangs."""
        return bool(self.status()["ready"])

    def status(self) -> dict[str, Any]:
        """The writer's state for a readiness probe or an operator."""
        with self._cond:
            now = time.monotonic()
            health = self._health
            hanging = health.hanging(now)
            failing_for = health.failing_for(now)
            store_open = self._link.store is not None
            out = {
                "ready": (
                    store_open
                    and not health.failing
                    and not self._closing
                    and not self._records.full()
                    and hanging is None
                ),
                "store_open": store_open,
                "failing": health.failing,
                "failing_for_s": None if failing_for is None else round(failing_for, 3),
                "last_error": None
                if self.last_error is None
                else f"{type(self.last_error).__name__}: {self.last_error}",
                "operation_hanging_s": None if hanging is None else round(hanging, 3),
                "backlog": self._backlog,
                "buffered_bytes": self._buffer.bytes,
                "journal": str(self.journal.directory) if self.journal else None,
                "journal_bytes": self.journal.size if self.journal else None,
                "journal_keyed": self.journal.keyed if self.journal else None,
                "anchor": str(self.anchor) if self.anchor else None,
                "anchor_conflict": self.anchor_conflict,
                "written": self.written,
                "dropped": self.dropped,
                "quarantined": self.quarantined,
                "refused": self.refused,
                "failures": self.failures,
                "closed": self._closed,
            }
        return out

    @property
    def pending(self) -> int:
        """Records accepted and not yet stored (including those being written)."""
        with self._cond:
            return self._backlog

    def flush(self, timeout: float | None = None) -> bool:
        """Wait until every accepted record is stored (or given up on); True if none is left."""
        deadline = None if timeout is None else time.monotonic() + timeout
        with self._cond:
            self._cond.notify_all()
            while self._backlog > 0 or self._drain.busy:
                remaining = None if deadline is None else deadline - time.monotonic()
                if remaining is not None and remaining <= 0:
                    return False
                self._cond.wait(remaining if remaining is not None else 1.0)
            return True

    def close(self, timeout: float | None = None) -> bool:
        """Stop accepting records, write what is pending (up to ``timeout``), then stop.

        In memory, records still buffered when the timeout expires are dropped (reason
        ``shutdown``) and each is logged. Journaled, they stay in the journal for the next
        start (logged at WARNING). Returns True if everything was written.
        """
        timeout = self.close_timeout if timeout is None else timeout
        with self._cond:
            if self._closed:
                return self._backlog == 0
            self._closing = True
            self._cond.notify_all()
        if self._committer is not None:  # it journals what was submitted, then stops
            self._committer.stop(timeout)
        drained = self.flush(timeout)
        with self._cond:
            self._stop.set()
            self._cond.notify_all()
        self._thread.join(max(1.0, timeout))
        with self._cond:
            self._closed = True
            leftover = self._buffer.take_all()
            backlog = self._backlog
        for item in leftover:
            self._drop_item(item, DROP_SHUTDOWN, None)
        if self.journal is not None and backlog:
            logger.warning(
                "audit writer closed with %d records not yet stored; they are kept in the "
                "journal %s and written at the next start",
                backlog,
                self.journal.directory,
            )
        self._export_head(force=True)
        if self.journal is not None:
            self.journal.close(drained=backlog == 0 and not self._drain.has_work())
        self._link.close()
        atexit.unregister(self._atexit)
        return drained and not leftover and (self.journal is None or backlog == 0)

    def __enter__(self) -> AuditWriter:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def _atexit(self) -> None:
        self.close()

    # -- bookkeeping --------------------------------------------------------------------------
    def _set_status(self, request_id: str, value: bool | None) -> None:
        self._status[request_id] = value
        self._status.move_to_end(request_id)
        while len(self._status) > self._remember:
            self._status.popitem(last=False)

    def _backlog_add(self, n: int) -> None:
        with self._cond:
            self._backlog += n
        try:
            metrics.record_audit_backlog(n)
        except Exception:  # pragma: no cover - metrics never break the writer
            logger.debug("could not record the audit backlog", exc_info=True)

    def _drop_item(self, item: Item, reason: str, record: Mapping[str, Any] | None) -> None:
        with self._cond:
            self.dropped += 1
            self._set_status(item.request_id, False)
            total = self.dropped
            self._cond.notify_all()
        logger.error(
            "audit record LOST: request_id=%s reason=%s (dropped so far: %d)",
            item.request_id,
            reason,
            total,
        )
        try:
            metrics.record_audit_failure(reason.split(":", 1)[0], dropped=True)
        except Exception:  # pragma: no cover
            logger.debug("could not count a dropped record", exc_info=True)
        if self.on_drop is not None:
            if record is None:
                try:
                    record = json.loads(item.payload)
                except ValueError:
                    record = {"request_id": item.request_id}
            try:
                self.on_drop(record, reason)
            except Exception:
                logger.exception("on_drop hook failed for request_id=%s", item.request_id)

    def _export_head(self, force: bool = False) -> None:
        """Export the store's chain head to the anchor (see ``HeadAnchor.export``)."""
        self._head_anchor.export(self._link.store, self._health.timed, force=force)

    def report_failure(self, exc: BaseException) -> None:
        """A store failure seen outside the writer (a direct commit that failed or hung).

        The writer then reports not ready and probes the store (see ``probe_max``) until it
        answers again.
        """
        self._health.report(exc)

    def _settle(self, items: list[Item], outcomes: Outcomes) -> None:
        drops: list[tuple[Item, str]] = []
        with self._cond:
            for item, outcome in zip(items, outcomes, strict=True):
                if outcome is None:
                    self.written += 1
                    self._set_status(item.request_id, True)
                elif outcome == QUARANTINED:
                    self.quarantined += 1
                    self._set_status(item.request_id, False)
                elif outcome == REFUSED:
                    self.refused += 1  # not a record of this writer's: no status to settle
                else:
                    drops.append((item, outcome))
            self._cond.notify_all()
        self._backlog_add(-len(items))
        for item, reason in drops:
            self._drop_item(item, reason, None)
