"""Where a request's audit record goes: a pipeline's ``audit=`` resolved to a ``RecordSink``.

The core knows a sink only as a ``RecordSink`` callable. Every other ``audit=`` value (a store
URL or path, a store or writer object) goes to the sink resolvers an application provides:
registered with ``register_sink_resolver`` or declared in the ``tracerag.audit_sinks``
entry-point group, as tracerag's own audit store declares ``store``.
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Mapping
from importlib.metadata import EntryPoint, entry_points
from typing import Any, Literal, Protocol, TypeAlias

from tracerag._settings import RecordSink
from tracerag.config import get_config
from tracerag.errors import ConfigurationError

__all__ = [
    "ENTRY_POINT_GROUP",
    "AuditTarget",
    "RecordStore",
    "RecordWriter",
    "SinkResolver",
    "register_sink_resolver",
    "resolve_sink",
    "sink_resolvers",
]

#: The entry-point group an installed application declares its sink resolvers in.
ENTRY_POINT_GROUP = "tracerag.audit_sinks"

#: The resolver tracerag's audit store declares in pyproject.toml. It is also used when the
#: installed distribution's metadata predates the group (an editable install made before it),
#: so ``audit="sqlite:///…"`` resolves the same way in either case.
_OWN_ENTRY_POINT = EntryPoint(
    name="store", value="tracerag.store._sink:store_sink", group=ENTRY_POINT_GROUP
)


class RecordWriter(Protocol):
    """A writer of audit records (``tracerag.store.AuditWriter`` is one)."""

    @property
    def healthy(self) -> bool: ...

    def submit(self, record: Mapping[str, Any]) -> bool: ...


class RecordStore(Protocol):
    """A store of audit records (``tracerag.store.AuditStore`` is one)."""

    def append_record(self, record: Mapping[str, Any]) -> None: ...


#: Where audit records go: ``"auto"`` (the store named by ``TRACERAG_STORE``, else none), a store
#: URL or path, a store, a writer, a callable ``(record) -> accepted``, or ``None``/``False`` for
#: no audit trail.
AuditTarget: TypeAlias = "str | RecordStore | RecordWriter | RecordSink | Literal[False] | None"


class SinkResolver(Protocol):
    """Turns an ``audit=`` value into a sink; None when the value is not one it knows."""

    def __call__(self, audit: object) -> RecordSink | None: ...


_lock = threading.Lock()
_registered: list[SinkResolver] = []
_declared: list[SinkResolver] | None = None


def register_sink_resolver(resolver: SinkResolver) -> Callable[[], None]:
    """Consult ``resolver`` (before the declared ones) for ``audit=`` values; returns an undo."""
    if not callable(resolver):
        raise ConfigurationError(f"a sink resolver must be callable, got {type(resolver).__name__}")
    with _lock:
        _registered.insert(0, resolver)

    def unregister() -> None:
        with _lock:
            if resolver in _registered:
                _registered.remove(resolver)

    return unregister


def _declared_resolvers() -> list[SinkResolver]:
    global _declared
    with _lock:
        if _declared is None:
            found = {ep.name: ep for ep in entry_points(group=ENTRY_POINT_GROUP)}
            found.setdefault(_OWN_ENTRY_POINT.name, _OWN_ENTRY_POINT)
            _declared = [_load(ep) for _, ep in sorted(found.items())]
        return list(_declared)


def _load(entry_point: EntryPoint) -> SinkResolver:
    try:
        resolver: SinkResolver = entry_point.load()
    except Exception as exc:
        raise ConfigurationError(
            f"the audit sink resolver {entry_point.name!r} ({entry_point.value}) declared in "
            f"{ENTRY_POINT_GROUP!r} could not be loaded: {type(exc).__name__}: {exc}"
        ) from exc
    return resolver


def sink_resolvers() -> tuple[SinkResolver, ...]:
    """The resolvers consulted, in order: the registered ones, then the declared ones."""
    with _lock:
        registered = list(_registered)
    return (*registered, *_declared_resolvers())


def resolve_sink(audit: AuditTarget) -> RecordSink | None:
    """The record sink for a pipeline's ``audit`` argument (see ``AuditTarget``)."""
    if audit is None or audit is False:
        return None
    target: object = audit
    if audit == "auto":
        target = get_config().store
        if not target:
            return None
    elif not isinstance(audit, str) and _is_plain_sink(audit):
        return audit  # type: ignore[return-value]  # a (record) -> accepted callable
    for resolver in sink_resolvers():
        sink = resolver(target)
        if sink is not None:
            return sink
    raise ConfigurationError(
        f"audit must be 'auto', a store URL, an AuditStore, an AuditWriter, a callable or None; "
        f"got {type(audit).__name__}"
    )


def _is_plain_sink(audit: object) -> bool:
    """A callable that is not a writer or store an application resolver should wrap."""
    return callable(audit) and not (hasattr(audit, "submit") or hasattr(audit, "append_record"))
