"""The pipeline's audit seam: where each finished request's record goes.

``RAGPipeline(audit=...)`` and ``wrap(..., audit=...)`` accept:

- ``"auto"`` (default): the store named by ``TRACERAG_STORE``; when it is unset, no audit trail
  (``audit_persisted`` is null) and no file is written anywhere;
- a store URL or path (``postgresql://…``, ``sqlite:///…``, ``/path/audit.sqlite``);
- an ``AuditStore`` or an ``AuditWriter``;
- any callable ``(record) -> bool`` (True when the record was accepted);
- ``None`` or ``False``: no audit trail.

Stores are written through an ``AuditWriter``, off the request
path. A store URL or path gets a crash-safe journal (``TRACERAG_AUDIT_JOURNAL``, else beside a
SQLite file; see ``journal_dir_for``).

``audit_persisted`` in a Response:

- ``True``: the record is durable — fsynced to the journal, or committed to the store — and
  survives ``kill -9`` of the process;
- ``False``: it is not (yet) durable: refused (buffer or journal full, writer closed),
  quarantined (stored only as an escaped copy with the reason), or not committed within the
  writer's ``durable_timeout`` when there is no journal (a slow or failing store);
- ``None``: no audit trail is configured.

Every lost record is counted and logged by request_id. ``AuditWriter.ready()`` reflects the
store (for a readiness probe).
"""

from __future__ import annotations

import threading
from collections.abc import Awaitable, Callable, Mapping
from typing import Any

from tracerag.telemetry import _instruments as metrics

#: ``(record) -> accepted``; the runner awaits a sink that returns an awaitable.
Sink = Callable[[dict[str, Any]], "bool | Awaitable[bool]"]

_lock = threading.Lock()
_writers: dict[str, Any] = {}


def _on_drop(record: Mapping[str, Any], reason: str) -> None:
    metrics.record_audit_failure(reason, dropped=True)


def writer_for(target: str | None) -> Any:
    """The shared AuditWriter for a store URL or path (None: TRACERAG_STORE), journaled."""
    from tracerag.store import open_store
    from tracerag.store._open import journal_dir_for, resolve_store_url
    from tracerag.store._writer import AuditWriter

    url = resolve_store_url(target)
    with _lock:
        writer = _writers.get(url)
        if writer is None or writer.status()["closed"]:

            def opener(create: bool = True) -> Any:
                return open_store(url, create=create)

            writer = AuditWriter(opener, journal=journal_dir_for(url), on_drop=_on_drop)
            _writers[url] = writer
        return writer


def writer_sink(writer: Any) -> Sink:
    """A sink writing through an AuditWriter; True only if the record is durable on return.

    The wait for the disk happens off the event loop, and the requests that finish together
    share one ``fdatasync`` of the journal (``AuditWriter.asubmit_durable``).
    """

    async def submit(record: dict[str, Any]) -> bool:
        if hasattr(writer, "asubmit_durable"):
            durable = bool(await writer.asubmit_durable(record))
        else:  # a writer-like object of the application's
            durable = bool(writer.submit(record)) and bool(writer.healthy)
        if not durable:
            metrics.record_audit_failure("not_durable")
        return durable

    submit.writer = writer  # type: ignore[attr-defined]
    return submit


def store_sink(audit: object) -> Sink | None:
    """The sink for a store URL or path, an AuditStore or an AuditWriter; None for other values.

    tracerag's resolver in the ``tracerag.audit_sinks`` entry-point group: the pipeline's
    ``audit=`` reaches it through ``tracerag._sinks.resolve_sink`` (``"auto"`` arrives as the
    URL ``TRACERAG_STORE`` names).
    """
    if isinstance(audit, str):
        return writer_sink(writer_for(audit))
    if hasattr(audit, "submit") and hasattr(audit, "healthy"):
        return writer_sink(audit)
    if hasattr(audit, "append_record"):
        from tracerag.store._writer import AuditWriter

        store: Any = audit  # an AuditStore by its shape
        return writer_sink(AuditWriter(store, on_drop=_on_drop))
    if callable(audit):
        sink: Sink = audit
        return sink
    return None
