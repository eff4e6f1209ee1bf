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
"""

from __future__ import annotations

import atexit
import contextlib
import inspect
import itertools
import json
import logging
import random
import sqlite3
import threading
import time
import uuid
from collections import OrderedDict, deque
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from tracerag.config import get_config
from tracerag.errors import ConfigurationError
from tracerag.store._anchor import HeadAnchor, anchor_path
from tracerag.store._base import AuditStore
from tracerag.store._committer import JournalCommitter
from tracerag.store._journal import (
    FRAME_QUARANTINE,
    FRAME_RECORD,
    IDENTITY_FILE,
    Frame,
    Journal,
    JournalError,
    open_journal,
)
from tracerag.store._sql import StoreFailing
from tracerag.store._types import (
    DuplicateRequest,
    InvalidRecord,
    StoreError,
    StoreReplaced,
    StoreVanished,
)

logger = logging.getLogger("tracerag.audit")

DropHook = Callable[[Mapping[str, Any], str], None]

DROP_BUFFER_FULL = "buffer_full"
DROP_INVALID = "invalid_record"
DROP_SHUTDOWN = "shutdown"
DROP_CLOSED = "writer_closed"
DROP_JOURNAL = "journal_failed"

QUARANTINED = "quarantined"
#: the outcome of a journal frame the chain key does not vouch for: kept aside, never sealed
REFUSED = "refused"
#: the type of an item read from a journal frame that is not authentic
FRAME_REFUSED = b"X"
_UNSET: Any = object()
#: the longest escaped copy of a poisoned record kept in its quarantined entry
MAX_QUARANTINE_RAW = 256 * 1024
#: failed attempts on one batch before the writer asks the store whether it is the record
POISON_PROBE_AFTER = 3


def _request_id(record: Any) -> str | None:
    if isinstance(record, Mapping):
        rid = record.get("request_id")
        if isinstance(rid, str) and rid.strip() and "\x00" not in rid:
            return rid
    return None


@dataclass
class _Item:
    """One accepted record: its encoded form and where it sits in the journal."""

    request_id: str
    type: bytes
    payload: bytes
    position: tuple[int, int] | None = None
    record: Any = None  # the payload decoded, once read back from the journal
    accepted_at: float = 0.0  # monotonic time it was accepted (in memory)
    frame: Frame | None = None  # the journal frame, kept for a refused one

    @property
    def size(self) -> int:
        return len(self.payload)


def encode_record(record: Any) -> _Item:
    """The record as journal payload, or its quarantine form when it cannot be encoded."""
    rid = _request_id(record)
    try:
        if not isinstance(record, Mapping):
            raise InvalidRecord(f"an audit record must be a mapping, not {type(record).__name__}")
        if rid is None:
            raise InvalidRecord("an audit record needs a non-empty string request_id")
        text = json.dumps(record, ensure_ascii=False, allow_nan=True, separators=(",", ":"))
        return _Item(rid, FRAME_RECORD, text.encode("utf-8"))
    except (TypeError, ValueError, UnicodeError, RecursionError, InvalidRecord) as exc:
        return quarantine_item(record, rid, f"{type(exc).__name__}: {exc}")


def quarantine_item(record: Any, request_id: str | None, reason: str) -> _Item:
    """A quarantine frame for a record: the reason and an ASCII-escaped copy of it."""
    rid = request_id or f"<no request_id>-{uuid.uuid4().hex}"
    try:
        raw = json.dumps(record, ensure_ascii=True, allow_nan=True, default=repr)
    except (TypeError, ValueError, RecursionError):
        raw = ascii(record)
    truncated = len(raw) > MAX_QUARANTINE_RAW
    body = {
        "request_id": rid,
        "reason": reason[:2000],
        "raw": raw[:MAX_QUARANTINE_RAW],
        "raw_truncated": truncated,
    }
    return _Item(rid, FRAME_QUARANTINE, json.dumps(body, ensure_ascii=True).encode("ascii"))


def is_transient(exc: BaseException) -> bool:
    """True for failures of the store (retry later), False for problems of the record itself."""
    if isinstance(exc, InvalidRecord):
        return False
    if isinstance(exc, (sqlite3.IntegrityError, sqlite3.DataError, sqlite3.ProgrammingError)):
        return False
    try:
        import psycopg

        if isinstance(exc, psycopg.DataError):
            return False
        if isinstance(exc, psycopg.Error):
            return True
    except ImportError:  # pragma: no cover - without the postgres extra
        pass
    return isinstance(exc, (StoreError, OSError, sqlite3.Error, TimeoutError))


def _metrics() -> Any:
    from tracerag.telemetry import _instruments as metrics

    return metrics


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
        if hasattr(store, "append_record"):
            self._store: Any = store
            self._open: Callable[..., AuditStore] | None = None
            self._open_takes_create = False
        else:
            self._store = None
            self._open = store
            try:
                params = inspect.signature(store).parameters
                self._open_takes_create = "create" in params or any(
                    p.kind is inspect.Parameter.VAR_KEYWORD for p in params.values()
                )
            except (TypeError, ValueError):
                self._open_takes_create = False
        self.max_buffer = max_buffer
        self.max_buffer_bytes = max_buffer_bytes
        self.batch_size = max(1, batch_size)
        self.batch_bytes = max(1, batch_bytes)
        #: journaled, how long the drain lets records gather before a store commit (they are
        #: durable already; fewer, larger commits cost the store and the disk less)
        self.batch_delay = batch_delay
        self.on_drop = on_drop
        self.close_timeout = close_timeout
        self.durable_timeout = durable_timeout
        self.op_timeout = op_timeout
        self.backoff_initial = backoff_initial
        self.backoff_max = backoff_max
        #: open the store at start and ping it while idle (every ``probe_interval`` seconds;
        #: while it fails, with a backoff from ``backoff_initial`` up to ``probe_max``), so
        #: ``ready()`` follows the store without traffic and a recovered store is written to
        #: at once
        self.probe_idle = probe_idle
        self.probe_interval = probe_interval
        self.probe_max = probe_max
        self._remember = max(remember, 2 * max_buffer)
        if chain_key is _UNSET:
            chain_key = getattr(self._store, "chain_key", None) or get_config().chain_key
        if journal is not None and not isinstance(journal, Journal):
            journal = open_journal(journal, key=chain_key)
        self.journal: Journal | None = journal
        self._head_anchor = HeadAnchor(anchor_path(anchor, journal), head_export_interval)
        if self.anchor is None and anchor is not False:
            logger.info(
                "the audit chain head is not exported (no journal and no TRACERAG_AUDIT_ANCHOR): "
                "without an anchor, tracerag audit verify cannot see the newest entries removed"
            )
        self._buffer: deque[_Item] = deque()
        self._buffer_bytes = 0
        self._cursor: tuple[int, int] | None = journal.first_position() if journal else None
        self._status: OrderedDict[str, bool | None] = OrderedDict()
        self._cond = threading.Condition()
        self._wake = threading.Event()  # cuts a backoff sleep short on close/abort
        self._busy = False
        self._closing = False
        self._closed = False
        self._abort = False
        self._failing = False
        self._failing_since: float | None = None
        self._op_started: float | None = None
        self._identity: dict[str, Any] | None = (
            journal.read_json(IDENTITY_FILE) if journal is not None else None
        )
        self.last_error: BaseException | None = None
        self.written = 0
        self.dropped = 0
        self.quarantined = 0
        self.refused = 0  # journal frames refused as not authentic (kept aside)
        self.failures = 0  # failed write attempts (each retry counts)
        self.durable_timeouts = 0  # submit_durable waits that ended without a commit
        self.recovered = journal.recovered if journal is not None else 0
        self._backlog = 0
        if journal is not None and journal.recovered:
            self._backlog_add(journal.recovered)
            logger.warning(
                "audit journal %s holds %d records from an earlier run; writing them to the store",
                journal.directory,
                journal.recovered,
            )
        self._op_seq = 0
        self._next_probe = 0.0
        self._idle_failures = 0
        # event-loop submissions waiting for the journal committer (see asubmit_durable)
        self._committer: JournalCommitter | None = (
            JournalCommitter(journal, self._journal_unsynced, f"{name}-journal")
            if journal is not None
            else None
        )
        self._thread = threading.Thread(target=self._run, name=name, daemon=True)
        self._thread.start()
        self._watchdog = threading.Thread(target=self._watch, name=f"{name}-watchdog", daemon=True)
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
        rid = _request_id(record)
        if rid is None:
            return False
        wait = self.durable_timeout if timeout is None else timeout
        now = time.monotonic()
        deadline = now + wait
        with self._cond:
            head = self._buffer[0] if self._buffer else None
            if head is not None and head.request_id != rid and head.accepted_at < now - wait:
                # the store has been stuck for a whole wait already: do not wait again (one
                # stalled store must not stall every answer in turn)
                return False
            while True:
                state = self._status.get(rid)
                if state is not None:
                    return state is True
                remaining = deadline - time.monotonic()
                if remaining <= 0 or self._failing or self._closed:
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
        import asyncio

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
            elif self.journal is None and (
                len(self._buffer) >= self.max_buffer
                or self._buffer_bytes + item.size > self.max_buffer_bytes
            ):
                reason = DROP_BUFFER_FULL
        ticket = 0
        if reason is None and self.journal is not None:
            try:
                if sync:
                    self.journal.append(item.type, item.payload)
                else:
                    ticket = self.journal.write(item.type, item.payload)
            except (JournalError, OSError) as exc:
                reason = f"{DROP_JOURNAL}: {exc}"
        if reason is not None:
            self._drop_item(item, reason, record)
            return False
        with self._cond:
            if self.journal is None:
                item.accepted_at = time.monotonic()
                self._buffer.append(item)
                self._buffer_bytes += item.size
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
        store = self._ensure_store()
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
            return not (self._failing or self._closing or self._full())

    def _full(self) -> bool:
        if self.journal is not None:
            return self.journal.size >= self.journal.max_bytes
        return len(self._buffer) >= self.max_buffer or self._buffer_bytes >= self.max_buffer_bytes

    def ready(self) -> bool:
        """True when the store is open, is the expected one, writes succeed and none hangs."""
        return bool(self.status()["ready"])

    def status(self) -> dict[str, Any]:
        """The writer's state for a readiness probe or an operator."""
        with self._cond:
            now = time.monotonic()
            hanging = (
                now - self._op_started
                if self._op_started is not None and now - self._op_started > self.op_timeout
                else None
            )
            store_open = self._store is not None
            out = {
                "ready": (
                    store_open
                    and not self._failing
                    and not self._closing
                    and not self._full()
                    and hanging is None
                ),
                "store_open": store_open,
                "failing": self._failing,
                "failing_for_s": None
                if self._failing_since is None
                else round(now - self._failing_since, 3),
                "last_error": None
                if self.last_error is None
                else f"{type(self.last_error).__name__}: {self.last_error}",
                "operation_hanging_s": None if hanging is None else round(hanging, 3),
                "backlog": self._backlog,
                "buffered_bytes": self._buffer_bytes,
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
            while self._backlog > 0 or self._busy:
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
            self._abort = True
            self._wake.set()
            self._cond.notify_all()
        self._thread.join(max(1.0, timeout))
        with self._cond:
            self._closed = True
            leftover = list(self._buffer)
            self._buffer.clear()
            self._buffer_bytes = 0
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
            self.journal.close(drained=backlog == 0 and not self._has_work())
        with contextlib.suppress(Exception):
            if self._open is not None and self._store is not None:
                self._store.close()
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
            _metrics().record_audit_backlog(n)
        except Exception:  # pragma: no cover - metrics never break the writer
            logger.debug("could not record the audit backlog", exc_info=True)

    def _drop_item(self, item: _Item, reason: str, record: Mapping[str, Any] | None) -> None:
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
            _metrics().record_audit_failure(reason.split(":", 1)[0], dropped=True)
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

    # -- the store ----------------------------------------------------------------------------
    def _ensure_store(self) -> Any:
        if self._store is None:
            assert self._open is not None
            if self._identity is not None and self._open_takes_create:
                store = self._open(create=False)
            else:
                store = self._open()
            try:
                self._check_identity(store)
            except BaseException:
                with contextlib.suppress(Exception):
                    store.close()
                raise
            self._store = store
        else:
            check = getattr(self._store, "check", None)
            if check is not None:
                check()  # raises when the store vanished under us
        return self._store

    def _check_identity(self, store: Any) -> None:
        identity_of = getattr(store, "identity", None)
        if identity_of is None:
            return
        found = identity_of()
        expected = self._identity
        if expected is None:
            self._identity = found
            if self.journal is not None:
                self.journal.write_json(IDENTITY_FILE, found)
            return
        if found.get("store_id") != expected.get("store_id") or found.get(
            "genesis"
        ) != expected.get("genesis"):
            raise StoreReplaced(
                f"the audit store at {found.get('location')} is not the one written before "
                f"(store_id {found.get('store_id')}, expected {expected.get('store_id')}): "
                "it was replaced or recreated; records are kept"
                + (f" in the journal {self.journal.directory}" if self.journal else "")
                + " and not written to it"
            )

    def _discard_store(self) -> None:
        """Forget a store that vanished or was replaced; it is reopened (never created)."""
        if self._open is None:
            return
        store, self._store = self._store, None
        if store is not None:
            with contextlib.suppress(Exception):
                store.close()

    def _export_head(self, force: bool = False) -> None:
        """Export the store's chain head to the anchor (see ``HeadAnchor.export``)."""
        self._head_anchor.export(self._store, self._timed, force=force)

    # -- background thread --------------------------------------------------------------------
    def _peek(self) -> list[_Item]:
        if self.journal is None:
            with self._cond:
                items: list[_Item] = []
                size = 0
                for item in itertools.islice(self._buffer, self.batch_size):
                    if items and size + item.size > self.batch_bytes:
                        break
                    items.append(item)
                    size += item.size
                return items
        assert self._cursor is not None
        frames = self.journal.read(
            *self._cursor, max_frames=self.batch_size, max_bytes=self.batch_bytes
        )
        items = []
        for f in frames:
            decoded: Any = None
            with contextlib.suppress(ValueError):
                decoded = json.loads(f.payload)
            rid = decoded.get("request_id") if isinstance(decoded, dict) else None
            if not f.authentic:
                items.append(_Item(str(rid or ""), FRAME_REFUSED, f.payload, (f.segment, f.end)))
                items[-1].frame = f
                continue
            record = decoded if f.type == FRAME_RECORD else None
            items.append(_Item(str(rid or ""), f.type, f.payload, (f.segment, f.end), record))
        return items

    def _ack(self, items: list[_Item]) -> None:
        if not items:
            return
        if self.journal is None:
            with self._cond:
                for item in items:
                    if self._buffer and self._buffer[0] is item:
                        self._buffer.popleft()
                        self._buffer_bytes -= item.size
        else:
            last = items[-1].position
            assert last is not None
            self._cursor = last
            self.journal.release(*last)

    def _has_work(self) -> bool:
        if self.journal is None:
            return bool(self._buffer)
        assert self._cursor is not None
        return self.journal.pending_after(*self._cursor) > 0

    def _run(self) -> None:
        while True:
            with self._cond:
                if self._abort:
                    return
                work = self._has_work()
                if not work:
                    idle = 0.5 if self._closing else 1.0
                    if self._failing and self.probe_idle:
                        # degraded: wake for the next probe, not a whole idle second later
                        idle = min(idle, max(0.01, self._next_probe - time.monotonic()))
                    self._cond.wait(idle)
                    if self._abort:
                        return
                    work = self._has_work()
                self._busy = work
            if work:
                if (
                    self.journal is not None
                    and self.batch_delay > 0
                    and not self._closing
                    and self._cursor is not None
                    and self.journal.pending_after(*self._cursor) < self.batch_bytes
                ):
                    # gather a fuller batch; a backlog of a full batch or more (at full load,
                    # after an outage) is written at once, else the wait caps the drain rate
                    self._wake.wait(self.batch_delay)
                try:
                    items = self._peek()
                except JournalError as exc:  # pragma: no cover - a corrupt segment mid-journal
                    logger.error("audit journal unreadable: %s", exc)
                    items = []
                outcomes = self._write_with_retry(items) if items else []
                if outcomes is None:  # aborted: records stay in the buffer or the journal
                    with self._cond:
                        self._busy = False
                        self._cond.notify_all()
                    return
                self._ack(items)
                self._settle(items, outcomes)
            if not work and not self._closing and self.probe_idle:
                self._probe_idle()
            if self._store is not None:
                self._export_head()
            with self._cond:
                self._busy = False
                self._cond.notify_all()

    def _probe_idle(self) -> None:
        """While idle, keep readiness true to the store: open it, ping it, notice it vanish.

        Healthy, the store is pinged every ``probe_interval`` seconds; failing, with a short
        backoff (``backoff_initial`` doubling up to ``probe_max``), so a store that comes back
        is known to be back within about ``probe_max`` seconds, with or without traffic.
        """
        now = time.monotonic()
        if now < self._next_probe:
            return
        if self._probe_store():
            self._next_probe = time.monotonic() + self.probe_interval
            if self._idle_failures or self._failing:
                self._idle_failures = 0
                self._recovered()
            return
        self._idle_failures += 1
        self._next_probe = time.monotonic() + self._probe_delay(self._idle_failures)

    def _probe_delay(self, failures: int) -> float:
        exponent = min(max(0, failures - 1), 30)
        return float(min(self.probe_max, self.backoff_initial * (2.0**exponent)))

    def _probe_store(self) -> bool:
        """Open the store if needed and ping it; False (the store marked failing) if it fails."""
        try:
            store = self._timed(self._ensure_store)
            ping = getattr(store, "ping", None)
            if ping is not None:
                self._timed(ping)
            return True
        except Exception as exc:
            with self._cond:
                first = not self._failing
                if first:
                    self._failing_since = time.monotonic()
                self._failing = True
                changed = type(exc) is not type(self.last_error)
                self.last_error = exc
                self._cond.notify_all()
            if isinstance(exc, (StoreReplaced, StoreVanished)):
                self._discard_store()
            (logger.warning if first or changed else logger.debug)(
                "audit store not answering (%d pending%s): %s: %s",
                self._backlog,
                ", kept in the journal" if self.journal is not None else "",
                type(exc).__name__,
                exc,
            )
            return False

    def report_failure(self, exc: BaseException) -> None:
        """A store failure seen outside the writer (a direct commit that failed or hung).

        The writer then reports not ready and probes the store (see ``probe_max``) until it
        answers again.
        """
        with self._cond:
            if not self._failing:
                self._failing_since = time.monotonic()
            self._failing = True
            self.last_error = exc
            self._next_probe = time.monotonic() + self.backoff_initial
            self._cond.notify_all()

    def _wait_to_retry(self, delay: float) -> None:
        """Wait ``delay`` before retrying a batch, cut short once a store that was down
        answers again (probed with a short backoff meanwhile)."""
        deadline = time.monotonic() + delay
        probes = 0
        was_down = False
        while not self._abort:
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                return
            probes += 1
            self._wake.wait(min(remaining, self._probe_delay(probes)))
            if self._abort or time.monotonic() >= deadline:
                return
            if self._probe_store():
                if was_down:
                    self._recovered()
                    return  # back: retry now, not at the end of a long backoff
            else:
                was_down = True

    def _settle(self, items: list[_Item], outcomes: list[str | None]) -> None:
        drops: list[tuple[_Item, str]] = []
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

    def _write_with_retry(self, items: list[_Item]) -> list[str | None] | None:
        """Write a batch until it is written; None if the writer is aborted meanwhile."""
        attempt = 0
        while True:
            if self._abort:
                return None
            try:
                outcomes = self._write_once(items)
            except Exception as exc:
                if not is_transient(exc):
                    # a record, not the store: find it by writing one at a time
                    self._recovered()
                    if len(items) > 1:
                        return self._write_each(items)
                    return [self._quarantine(items[0], f"{type(exc).__name__}: {exc}")]
                attempt += 1
                delay = min(self.backoff_max, self.backoff_initial * 2 ** min(attempt - 1, 30))
                delay += random.uniform(0, self.backoff_initial)
                self._failed(exc, items, attempt, delay)
                if isinstance(exc, (StoreReplaced, StoreVanished)):
                    self._discard_store()
                # a store refusing without trying (it failed moments ago) says nothing of the
                # record: only failures of real attempts make it a suspect
                suspect = attempt >= POISON_PROBE_AFTER and not isinstance(exc, StoreFailing)
                if suspect and len(items) == 1 and self._store_answers():
                    return [self._quarantine(items[0], f"{type(exc).__name__}: {exc}")]
                if suspect and len(items) > 1 and self._store_answers():
                    return self._write_each(items)
                self._wait_to_retry(delay)
                continue
            self._recovered()
            return outcomes

    def _write_each(self, items: list[_Item]) -> list[str | None] | None:
        """Write ``items`` one at a time (to find the record the store refuses); None: stopped."""
        out: list[str | None] = []
        for item in items:
            one = self._write_with_retry([item])
            if one is None:
                return None
            out += one
        return out

    def _store_answers(self) -> bool:
        ping = getattr(self._store, "ping", None) if self._store is not None else None
        if ping is None:
            return False
        try:
            self._timed(ping)
            return True
        except Exception:
            return False

    def _watch(self) -> None:
        """Interrupt a store operation that hangs past ``op_timeout`` (e.g. a frozen server)."""
        interrupted = -1
        while True:
            with self._cond:
                if self._abort or self._closed:
                    return
                started, op = self._op_started, self._op_seq
            if (
                started is not None
                and op != interrupted
                and time.monotonic() - started > self.op_timeout
            ):
                interrupted = op
                logger.warning(
                    "audit store operation hanging for more than %.1fs: interrupting it "
                    "(records are kept%s)",
                    self.op_timeout,
                    " in the journal" if self.journal is not None else " in memory",
                )
                interrupt = getattr(self._store, "interrupt", None)
                if interrupt is not None:
                    try:
                        interrupt()
                    except Exception:
                        logger.warning("could not interrupt the audit store", exc_info=True)
            self._wake.wait(min(1.0, max(0.05, self.op_timeout / 4)))

    def _timed(self, fn: Callable[..., Any], *args: Any) -> Any:
        with self._cond:
            self._op_started = time.monotonic()
            self._op_seq += 1
        try:
            return fn(*args)
        finally:
            with self._cond:
                self._op_started = None

    def _write_once(self, items: list[_Item]) -> list[str | None]:
        """One attempt: None per record written (or already stored), else its outcome."""
        store = self._timed(self._ensure_store)
        outcomes: list[str | None] = [None] * len(items)
        run: list[tuple[int, dict[str, Any]]] = []  # consecutive records, written together

        def write_run() -> None:
            if len(run) > 1 and hasattr(store, "append_records"):
                results = self._timed(store.append_records, [r for _, r in run])
                for (i, _), result in zip(run, results, strict=True):
                    if isinstance(result, InvalidRecord):
                        outcomes[i] = self._quarantine(items[i], f"InvalidRecord: {result}")
            else:
                for i, record in run:
                    try:
                        self._timed(store.append_record, record)
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

    def _refuse(self, item: _Item) -> str:
        """Keep a journal frame the chain key does not vouch for aside; it is never sealed."""
        assert self.journal is not None and item.frame is not None
        self.journal.set_aside(item.frame)
        logger.error(
            "audit journal %s: a record (request_id=%s, %d bytes) is NOT authentic (no valid "
            "tag under the chain key): REFUSED, kept aside in %s and not written to the store",
            self.journal.directory,
            (item.request_id or "?")[:200],
            len(item.payload),
            self.journal.directory / "refused.frames",
        )
        return REFUSED

    def _quarantine(self, item: _Item, reason: str | None) -> str:
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
        store = self._store
        append = getattr(store, "append_quarantined", None)
        if append is None:
            return f"{DROP_INVALID}: {body['reason']}"
        try:
            self._timed(
                append, body["request_id"], body["reason"], body["raw"], body["raw_truncated"]
            )
        except DuplicateRequest:
            pass
        except Exception as exc:
            if is_transient(exc):
                raise
            return f"{DROP_INVALID}: {body['reason']}; quarantine refused: {exc}"
        return QUARANTINED

    def _failed(self, exc: BaseException, items: list[_Item], attempt: int, delay: float) -> None:
        with self._cond:
            self.failures += 1
            if not self._failing:
                self._failing_since = time.monotonic()
            self._failing = True
            self.last_error = exc
            self._cond.notify_all()
            pending = self._backlog
        try:
            _metrics().record_audit_failure(type(exc).__name__)
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
            ", kept in the journal" if self.journal is not None else "",
            delay,
            type(exc).__name__,
            exc,
        )

    def _recovered(self) -> None:
        with self._cond:
            if self._failing:
                logger.warning("audit store writing again (%d pending)", self._backlog)
            self._failing = False
            self._failing_since = None
            self.last_error = None
