"""Registry figures as OpenTelemetry gauges, read from the database at each collection.

``observe_registry(registry)`` registers:

* ``tracerag.materials`` — materials by ``status``;
* ``tracerag.materials.pending_writes`` — new materials and edits waiting for review;
* ``tracerag.materials.conflicts`` — open conflicts;
* ``tracerag.materials.credibility`` — active materials by credibility ``bucket`` (tenths).

Prometheus names: ``tracerag_materials``, ``tracerag_materials_pending_writes``,
``tracerag_materials_conflicts``, ``tracerag_materials_credibility``.
"""

from __future__ import annotations

import logging
from collections.abc import Iterable
from typing import Any

from opentelemetry.metrics import CallbackOptions, Observation

from tracerag.materials.model import STATUSES
from tracerag.metrics import get_meter

log = logging.getLogger(__name__)


def observe_registry(registry: Any, meter_provider: Any = None) -> list[Any]:
    """Register the registry's gauges on tracerag's meter; returns the instruments."""
    meter = get_meter(meter_provider)

    def stats() -> dict[str, Any] | None:
        try:
            found: dict[str, Any] | None = registry.stats()
            return found
        except Exception:  # a scrape must not fail because the database is away
            log.warning("material registry figures unavailable", exc_info=True)
            return None

    def by_status(_options: CallbackOptions) -> Iterable[Observation]:
        s = stats()
        if s is None:
            return []
        return [Observation(s["by_status"].get(st, 0), {"status": st}) for st in STATUSES]

    def pending(_options: CallbackOptions) -> Iterable[Observation]:
        s = stats()
        return [] if s is None else [Observation(s["pending_writes"])]

    def conflicts(_options: CallbackOptions) -> Iterable[Observation]:
        s = stats()
        return [] if s is None else [Observation(s["open_conflicts"])]

    def credibility(_options: CallbackOptions) -> Iterable[Observation]:
        s = stats()
        if s is None:
            return []
        return [Observation(n, {"bucket": b}) for b, n in s["credibility_histogram"].items()]

    return [
        meter.create_observable_gauge(
            "tracerag.materials", [by_status], unit="{material}", description="by status"
        ),
        meter.create_observable_gauge(
            "tracerag.materials.pending_writes",
            [pending],
            unit="{write}",
            description="new materials and edits waiting for review",
        ),
        meter.create_observable_gauge(
            "tracerag.materials.conflicts",
            [conflicts],
            unit="{conflict}",
            description="open conflicts between active materials",
        ),
        meter.create_observable_gauge(
            "tracerag.materials.credibility",
            [credibility],
            unit="{material}",
            description="active materials by credibility bucket",
        ),
    ]


__all__ = ["observe_registry"]
