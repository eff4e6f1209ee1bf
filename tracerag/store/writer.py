"""AuditWriter: audit records are written off the request path, and a lost one is never silent.

``submit(record)`` only appends to a bounded in-memory buffer and returns at once; one
background thread writes the buffer to the store in submission order. While the store fails,
the record at the head of the buffer is retried with exponential backoff and jitter (tenacity)
and the rest wait behind it, so the chain keeps request order.

Overflow policy: **the newest record is refused**. When the buffer is full, ``submit`` returns
False and the record is dropped; records already accepted are never evicted. The caller learns
at once that this very record is not kept, so the response that goes out with it can say
``audit_persisted=False``, while responses that went out earlier are not made wrong after the
fact. Every loss — a full buffer, an invalid record, records still buffered when ``close``
gives up — increments ``dropped``, calls ``on_drop(record, reason)`` and logs an ERROR line on
logger ``tracerag.audit`` naming the request_id.

How the pipeline uses it::

    accepted = writer.submit(record)
    response.audit_persisted = accepted and writer.healthy

``healthy`` is False while the store is failing (the last write attempt raised and none has
succeeded since), while the buffer is full, and after ``close``. ``audit_persisted`` is thus a
promise made at answer time ("accepted, and the store was writing"), not a confirmation;
``persisted(request_id)`` gives the confirmation later: True once written, False if dropped,
None while still pending (or when the writer does not remember the request_id).
"""

from __future__ import annotations

import atexit
import itertools
import logging
import threading
import time
from collections import OrderedDict, deque
from collections.abc import Callable, Mapping
from typing import Any

import tenacity

from tracerag.store.base import AuditStore, DuplicateRequest, InvalidRecord

logger = logging.getLogger("tracerag.audit")

DropHook = Callable[[Mapping[str, Any], str], None]

DROP_BUFFER_FULL = "buffer_full"
DROP_INVALID = "invalid_record"
DROP_SHUTDOWN = "shutdown"
DROP_CLOSED = "writer_closed"


def _request_id(record: Any) -> str:
    if isinstance(record, Mapping):
        rid = record.get("request_id")
        if rid:
            return str(rid)
    return "<no request_id>"


class _Aborted(Exception):
    """The writer is shutting down and gave up on the record in hand."""


class AuditWriter:
    """Writes audit records in a background thread, with a bounded buffer and retries.

    ``store`` is an ``AuditStore`` or a zero-argument callable that opens one; a callable is
    called (and retried) in the background, so an unreachable store at start-up does not stop
    the application.
    """

    def __init__(
        self,
        store: AuditStore | Callable[[], AuditStore],
        max_buffer: int = 10_000,
        *,
        on_drop: DropHook | None = None,
        backoff_initial: float = 0.1,
        backoff_max: float = 30.0,
        batch_size: int = 200,
        remember: int = 10_000,
        close_timeout: float = 5.0,
        name: str = "tracerag-audit-writer",
    ) -> None:
        if max_buffer < 1:
            raise ValueError("max_buffer must be at least 1")
        if hasattr(store, "append_record"):
            self._store: AuditStore | None = store  # type: ignore[assignment]
            self._open: Callable[[], AuditStore] | None = None
        else:
            self._store = None
            self._open = store  # type: ignore[assignment]
        self.max_buffer = max_buffer
        self.batch_size = max(1, batch_size)
        self.on_drop = on_drop
        self.close_timeout = close_timeout
        self._wait = tenacity.wait_exponential(
            multiplier=backoff_initial, max=backoff_max
        ) + tenacity.wait_random(0, backoff_initial)
        self._remember = max(remember, 2 * max_buffer)
        self._buffer: deque[Mapping[str, Any]] = deque()
        self._status: OrderedDict[str, bool | None] = OrderedDict()
        self._cond = threading.Condition()
        self._wake = threading.Event()  # cuts a backoff sleep short on abort
        self._busy = False
        self._closing = False
        self._closed = False
        self._abort = False
        self._failing = False
        self.last_error: BaseException | None = None
        self.written = 0
        self.dropped = 0
        self.failures = 0  # failed write attempts (each retry counts)
        self._thread = threading.Thread(target=self._run, name=name, daemon=True)
        self._thread.start()
        atexit.register(self._atexit)

    # -- caller side --------------------------------------------------------------------------
    def submit(self, record: Mapping[str, Any]) -> bool:
        """Queue a record for writing; returns at once. False if the record was dropped.

        The writer keeps a reference: do not change the record after submitting it.
        """
        reason = None
        with self._cond:
            if self._closing or self._closed:
                reason = DROP_CLOSED
            elif len(self._buffer) >= self.max_buffer:
                reason = DROP_BUFFER_FULL
            else:
                self._buffer.append(record)
                self._set_status(_request_id(record), None)
                self._cond.notify_all()
                return True
        self._drop(record, reason)
        return False

    def write_now(self, record: Mapping[str, Any]) -> None:
        """Write a record synchronously on the caller's thread, bypassing the buffer.

        Raises whatever the store raises (``DuplicateRequest``, ``InvalidRecord``, ...).
        """
        store = self._ensure_store()
        store.append_record(record)
        with self._cond:
            self.written += 1
            self._set_status(_request_id(record), True)

    def persisted(self, request_id: str) -> bool | None:
        """True once written, False if dropped, None while pending or when not remembered."""
        with self._cond:
            return self._status.get(request_id)

    @property
    def healthy(self) -> bool:
        """False while the store is failing, the buffer is full, or the writer is closed."""
        with self._cond:
            return not (self._failing or self._closing or len(self._buffer) >= self.max_buffer)

    @property
    def pending(self) -> int:
        """Records accepted and not yet written (including the one being written)."""
        with self._cond:
            return len(self._buffer)

    def flush(self, timeout: float | None = None) -> bool:
        """Wait until every accepted record is written (or dropped); True if the buffer drained."""
        deadline = None if timeout is None else time.monotonic() + timeout
        with self._cond:
            while self._buffer or self._busy:
                remaining = None if deadline is None else deadline - time.monotonic()
                if remaining is not None and remaining <= 0:
                    return False
                self._cond.wait(remaining)
            return True

    def close(self, timeout: float | None = None) -> bool:
        """Stop accepting records, write what is buffered (up to ``timeout``), then stop.

        Records still buffered when the timeout expires are dropped (reason ``shutdown``) and
        each is logged. Returns True if everything was written.
        """
        timeout = self.close_timeout if timeout is None else timeout
        with self._cond:
            if self._closed:
                return not self._buffer
            self._closing = True
            self._cond.notify_all()
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
        for record in leftover:
            self._drop(record, DROP_SHUTDOWN)
        atexit.unregister(self._atexit)
        return drained and not leftover

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

    def _drop(self, record: Mapping[str, Any], reason: str) -> None:
        request_id = _request_id(record)
        with self._cond:
            self.dropped += 1
            self._set_status(request_id, False)
            total = self.dropped
        logger.error(
            "audit record LOST: request_id=%s reason=%s (dropped so far: %d)",
            request_id,
            reason,
            total,
        )
        if self.on_drop is not None:
            try:
                self.on_drop(record, reason)
            except Exception:
                logger.exception("on_drop hook failed for request_id=%s", request_id)

    def _ensure_store(self) -> AuditStore:
        if self._store is None:
            assert self._open is not None
            self._store = self._open()
        return self._store

    # -- background thread --------------------------------------------------------------------
    def _batch_limit(self) -> int:
        store = self._store
        return self.batch_size if store is not None and hasattr(store, "append_records") else 1

    def _run(self) -> None:
        while True:
            with self._cond:
                while not self._buffer and not (self._closing or self._abort):
                    self._cond.wait()
                if not self._buffer or self._abort:
                    return
                batch = list(itertools.islice(self._buffer, self._batch_limit()))
                self._busy = True
            outcomes: list[str | None] | None
            try:
                outcomes = self._write_with_retry(batch)
            except _Aborted:
                outcomes = None  # left in the buffer; close() drops and logs them
            except Exception as exc:  # pragma: no cover - defensive: never lose silently
                outcomes = [f"{DROP_INVALID}: {type(exc).__name__}: {exc}"] * len(batch)
            if outcomes is not None:
                with self._cond:
                    for record in batch:
                        if self._buffer and self._buffer[0] is record:
                            self._buffer.popleft()
                    for record, outcome in zip(batch, outcomes, strict=True):
                        if outcome is None:
                            self.written += 1
                            self._set_status(_request_id(record), True)
                for record, outcome in zip(batch, outcomes, strict=True):
                    if outcome is not None:
                        self._drop(record, outcome)
            with self._cond:  # only now may flush() return: drops are counted and reported
                self._busy = False
                self._cond.notify_all()
            if outcomes is None:
                return

    def _write_once(self, batch: list[Mapping[str, Any]]) -> list[str | None]:
        """One attempt: None per record written (or already stored), else the drop reason."""
        if self._abort:
            raise _Aborted()
        store = self._ensure_store()
        if len(batch) > 1:
            results = store.append_records(batch)  # type: ignore[attr-defined]
            return [
                None if r is None or isinstance(r, DuplicateRequest) else f"{DROP_INVALID}: {r}"
                for r in results
            ]
        record = batch[0]
        try:
            store.append_record(record)
        except DuplicateRequest:
            # Already stored: an earlier attempt committed but its acknowledgement was lost.
            logger.info("audit record request_id=%s was already stored", _request_id(record))
        except InvalidRecord as exc:
            return [f"{DROP_INVALID}: {exc}"]
        return [None]

    def _write_with_retry(self, batch: list[Mapping[str, Any]]) -> list[str | None]:
        retrying = tenacity.Retrying(
            retry=tenacity.retry_if_exception(self._retryable),
            wait=self._wait,
            stop=self._should_stop,
            sleep=self._sleep,
            before_sleep=self._before_sleep,
            after=self._after_attempt,
            reraise=True,
        )
        try:
            outcomes = retrying(self._write_once, batch)
        except _Aborted:
            raise
        except InvalidRecord:
            # The store refused the batch as a whole: find the bad record one at a time.
            self._recovered()
            return [out for record in batch for out in self._write_with_retry([record])]
        except Exception:
            if self._abort:
                raise _Aborted() from None
            raise
        self._recovered()
        return outcomes

    def _retryable(self, exc: BaseException) -> bool:
        return not isinstance(exc, (InvalidRecord, _Aborted))

    def _should_stop(self, retry_state: tenacity.RetryCallState) -> bool:
        return self._abort

    def _sleep(self, seconds: float) -> None:
        self._wake.wait(seconds)

    def _after_attempt(self, retry_state: tenacity.RetryCallState) -> None:
        outcome = retry_state.outcome
        if outcome is None or not outcome.failed:
            return
        exc = outcome.exception()
        if isinstance(exc, (InvalidRecord, _Aborted)):
            return
        with self._cond:
            self.failures += 1
            self._failing = True
            self.last_error = exc

    def _before_sleep(self, retry_state: tenacity.RetryCallState) -> None:
        exc = retry_state.outcome.exception() if retry_state.outcome else None
        wait = retry_state.next_action.sleep if retry_state.next_action else 0.0
        batch = retry_state.args[0] if retry_state.args else []
        ids = _request_id(batch[0]) if batch else "?"
        if len(batch) > 1:
            ids += f" (+{len(batch) - 1} more in the batch)"
        logger.warning(
            "audit store write failed for request_id=%s (attempt %d, %d buffered), "
            "retrying in %.1fs: %s: %s",
            ids,
            retry_state.attempt_number,
            self.pending,
            wait,
            type(exc).__name__,
            exc,
        )

    def _recovered(self) -> None:
        with self._cond:
            if self._failing:
                logger.warning("audit store writing again (%d buffered)", len(self._buffer))
            self._failing = False
            self.last_error = None
