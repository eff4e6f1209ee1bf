"""The pipeline's audit seam: where each finished request's record goes.

``RAGPipeline(audit=...)`` and ``wrap(..., audit=...)`` accept:

- ``"auto"`` (default): the store named by ``TRACERAG_STORE``; when it is unset, no audit trail
  (``audit_persisted`` is null) and no file is written anywhere;
- a store URL or path (``postgresql://…``, ``sqlite:///…``, ``/path/audit.sqlite``);
- an ``AuditStore`` or an ``AuditWriter``;
- any callable ``(record) -> bool`` (True when the record was accepted);
- ``None`` or ``False``: no audit trail.

Stores are written through an ``AuditWriter``: off the request path, with a bounded buffer and
retries while the store is down. A response says ``audit_persisted=False`` when its record was
refused or the store is failing; every lost record is counted and logged by request_id.
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Mapping
from typing import Any

from tracerag import metrics
from tracerag.errors import ConfigurationError

Sink = Callable[[dict[str, Any]], bool]

_lock = threading.Lock()
_writers: dict[str, Any] = {}


def _on_drop(record: Mapping[str, Any], reason: str) -> None:
    metrics.record_audit_failure(reason, dropped=True)


def writer_for(target: str | None) -> Any:
    """The shared AuditWriter for a store URL or path (None: TRACERAG_STORE)."""
    from tracerag.store import open_store, resolve_store_url
    from tracerag.store.writer import AuditWriter

    url = resolve_store_url(target)
    with _lock:
        writer = _writers.get(url)
        if writer is None:
            writer = AuditWriter(lambda: open_store(url), on_drop=_on_drop)
            _writers[url] = writer
        return writer


def writer_sink(writer: Any) -> Sink:
    """A sink writing through an AuditWriter; True only if accepted while the store is healthy."""

    def submit(record: dict[str, Any]) -> bool:
        accepted = bool(writer.submit(record))
        healthy = bool(writer.healthy)
        if not (accepted and healthy):
            metrics.record_audit_failure("refused" if not accepted else "store_unhealthy")
        return accepted and healthy

    submit.writer = writer  # type: ignore[attr-defined]
    return submit


def resolve_sink(audit: Any) -> Sink | None:
    """The record sink for a pipeline's ``audit`` argument (see module docstring)."""
    if audit is None or audit is False:
        return None
    if audit == "auto":
        from tracerag.config import get_config

        store = get_config().store
        return writer_sink(writer_for(store)) if store else None
    if isinstance(audit, str):
        return writer_sink(writer_for(audit))
    if hasattr(audit, "submit") and hasattr(audit, "healthy"):
        return writer_sink(audit)
    if hasattr(audit, "append_record"):
        from tracerag.store.writer import AuditWriter

        return writer_sink(AuditWriter(audit, on_drop=_on_drop))
    if callable(audit):
        return audit
    raise ConfigurationError(
        f"audit must be 'auto', a store URL, an AuditStore, an AuditWriter, a callable or None; "
        f"got {type(audit).__name__}"
    )
