"""Registry figures as OpenTelemetry gauges, read from the database at each collection.

Every open ``MaterialRegistry`` is watched (``watch_registry``; the registry does it when it
opens, in library and server mode alike, and stops when it closes). tracerag's MeterProvider
(``tracerag.metrics``) gets these gauges, summed over the watched databases (a database
watched by several registries counts once):

* ``tracerag.materials`` — materials by ``status`` (``active``, ``pending_review``,
  ``quarantined``, ``deleted``);
* ``tracerag.materials.pending_writes`` — new materials and edits waiting for review;
* ``tracerag.materials.conflicts`` — open conflicts;
* ``tracerag.materials.quarantined`` — materials out of retrieval until a person restores them;
* ``tracerag.materials.quarantine_proposed`` — quarantines the denial rule proposed, waiting for
  a person to confirm or dismiss them (the materials stay in retrieval meanwhile);
* ``tracerag.materials.credibility`` — active materials by credibility ``bucket`` (tenths,
  ``0.0-0.1`` … ``0.9-1.0``): the credibility distribution.

Prometheus names: ``tracerag_materials``, ``tracerag_materials_pending_writes``,
``tracerag_materials_conflicts``, ``tracerag_materials_quarantined``,
``tracerag_materials_quarantine_proposed``, ``tracerag_materials_credibility``.
``observe_registry(registry, meter_provider)`` puts the
gauges of one registry on a given provider.
"""

from __future__ import annotations

import logging
import threading
import time
import weakref
from collections.abc import Callable, Iterable
from typing import Any

from opentelemetry.metrics import CallbackOptions, Observation

from tracerag.materials._model import STATUSES
from tracerag.telemetry._meters import get_meter, get_meter_provider

log = logging.getLogger("tracerag.materials")

#: figures read once serve every gauge of one collection
STATS_SECONDS = 1.0

_lock = threading.Lock()
# database -> the registry that reports it (a registry dropped without closing is forgotten)
_watched: weakref.WeakValueDictionary[str, Any] = weakref.WeakValueDictionary()
_instrumented: list[Any] = []  # providers that have the watched registries' gauges


def _database(registry: Any) -> str:
    store = getattr(registry, "store", None)
    location = getattr(store, "location", None) or f"registry-{id(registry)}"
    return f"{location}|{getattr(store, 'schema', None) or ''}"


def watch_registry(registry: Any) -> None:
    """Report a registry's figures on tracerag's meter until ``unwatch_registry``."""
    with _lock:
        _watched[_database(registry)] = registry
    ensure_instruments()


def unwatch_registry(registry: Any) -> None:
    """Stop reporting a registry (it closed)."""
    with _lock:
        key = _database(registry)
        if _watched.get(key) is registry:
            del _watched[key]


def ensure_instruments() -> None:
    """Give tracerag's current MeterProvider the watched registries' gauges (once each)."""
    provider = get_meter_provider()
    with _lock:
        if any(p is provider for p in _instrumented):
            return
        _instrumented.append(provider)
    _instruments(lambda: list(_watched.values()), provider)


def reset_for_tests() -> None:
    """Forget watched registries and instrumented providers."""
    with _lock:
        _watched.clear()
        _instrumented.clear()


def observe_registry(registry: Any, meter_provider: Any = None) -> list[Any]:
    """Register one registry's gauges on tracerag's meter; returns the instruments."""
    return _instruments(lambda: [registry], meter_provider)


def _figures(registries: list[Any]) -> dict[str, Any] | None:
    """The watched registries' figures, summed; None when none could be read."""
    total: dict[str, Any] | None = None
    for registry in registries:
        try:
            found: dict[str, Any] = registry.stats()
        except Exception:  # a scrape must not fail because a database is away or closed
            log.warning("material registry figures unavailable", exc_info=True)
            continue
        if total is None:
            total = {
                "by_status": dict.fromkeys(STATUSES, 0),
                "pending_writes": 0,
                "open_conflicts": 0,
                "quarantined": 0,
                "quarantine_proposed": 0,
                "credibility_histogram": dict.fromkeys(found["credibility_histogram"], 0),
            }
        for status, n in found["by_status"].items():
            total["by_status"][status] = total["by_status"].get(status, 0) + n
        for name in ("pending_writes", "open_conflicts", "quarantined", "quarantine_proposed"):
            total[name] += found.get(name, 0)
        for bucket, n in found["credibility_histogram"].items():
            total["credibility_histogram"][bucket] += n
    return total


def _instruments(registries: Callable[[], list[Any]], meter_provider: Any) -> list[Any]:
    meter = get_meter(meter_provider)
    cache: dict[str, Any] = {"at": -STATS_SECONDS, "figures": None}
    cache_lock = threading.Lock()

    def stats() -> dict[str, Any] | None:
        with cache_lock:
            now = time.monotonic()
            if now - cache["at"] >= STATS_SECONDS:
                cache["figures"], cache["at"] = _figures(registries()), now
            figures: dict[str, Any] | None = cache["figures"]
            return figures

    def one(name: str) -> Callable[[CallbackOptions], Iterable[Observation]]:
        def read(_options: CallbackOptions) -> Iterable[Observation]:
            s = stats()
            return [] if s is None else [Observation(s[name])]

        return read

    def by_status(_options: CallbackOptions) -> Iterable[Observation]:
        s = stats()
        if s is None:
            return []
        return [Observation(s["by_status"].get(st, 0), {"status": st}) for st in STATUSES]

    def credibility(_options: CallbackOptions) -> Iterable[Observation]:
        s = stats()
        if s is None:
            return []
        return [Observation(n, {"bucket": b}) for b, n in s["credibility_histogram"].items()]

    gauges = [  # (instrument name, callback, unit, description)
        ("tracerag.materials", by_status, "{material}", "by status"),
        (
            "tracerag.materials.pending_writes",
            one("pending_writes"),
            "{write}",
            "new materials and edits waiting for review",
        ),
        (
            "tracerag.materials.conflicts",
            one("open_conflicts"),
            "{conflict}",
            "open conflicts between active materials",
        ),
        (
            "tracerag.materials.quarantined",
            one("quarantined"),
            "{material}",
            "materials out of retrieval until a person restores them",
        ),
        (
            "tracerag.materials.quarantine_proposed",
            one("quarantine_proposed"),
            "{material}",
            "quarantines proposed by denials, waiting for a person",
        ),
        (
            "tracerag.materials.credibility",
            credibility,
            "{material}",
            "active materials by credibility bucket",
        ),
    ]
    return [
        meter.create_observable_gauge(name, [callback], unit=unit, description=description)
        for name, callback, unit, description in gauges
    ]


__all__ = [
    "STATS_SECONDS",
    "ensure_instruments",
    "observe_registry",
    "reset_for_tests",
    "unwatch_registry",
    "watch_registry",
]
