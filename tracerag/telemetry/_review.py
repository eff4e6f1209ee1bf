"""The review desk's queue as OpenTelemetry gauges, read from its database at each collection.

Every open audit store with a review queue is watched (``watch_review_queue``; the SQL stores
do it when they are made, in library and server mode alike): tracerag's MeterProvider
(``tracerag.metrics``) gets, summed over the watched databases (a database watched by several
stores of one process counts once):

* ``tracerag.review.backlog`` — queued requests not decided yet, by ``status`` (``pending``,
  ``claimed``) and ``route`` (``review``, ``escalate``);
* ``tracerag.review.oldest_wait`` — seconds the longest-waiting undecided request has waited,
  by ``route``.

Each process reports the whole queue of its database: several processes on one database (an app
and ``tracerag serve``) report the same figures, so dashboards take ``max`` over them. How long
decided requests waited is a histogram recorded where the decision is made
(``tracerag.review.time_to_decision``, ``_instruments.record_review_decision``).
"""

from __future__ import annotations

import logging
import threading
import time
import weakref
from collections.abc import Iterable, Mapping
from typing import Any, Protocol

from opentelemetry.metrics import CallbackOptions, MeterProvider, Observation

from tracerag import _semconv as semconv
from tracerag.telemetry._meters import get_meter, get_meter_provider

__all__ = ["ReviewFigures", "observe_review_queue", "watch_review_queue"]

log = logging.getLogger("tracerag.metrics")

#: figures read once serve both gauges of one collection
STATS_SECONDS = 1.0


class ReviewFigures(Protocol):
    """A review queue that can say what waits in it (``SQLReviewQueue.review_backlog``)."""

    def review_backlog(self) -> tuple[Mapping[tuple[str, str], int], Mapping[str, float]]:
        """``({(status, route): count}, {route: oldest wait in seconds})`` of undecided items."""
        ...


_lock = threading.Lock()
_watched: weakref.WeakValueDictionary[str, Any] = weakref.WeakValueDictionary()
_instrumented: list[Any] = []  # providers that have the watched queues' gauges


def watch_review_queue(queue: ReviewFigures) -> None:
    """Report a queue's backlog on tracerag's MeterProvider while the queue object lives (and
    on a provider the application installed since the last call)."""
    key = str(getattr(queue, "location", None) or f"queue-{id(queue)}")
    with _lock:
        _watched[key] = queue
    try:
        provider = get_meter_provider()
        with _lock:
            if any(p is provider for p in _instrumented):
                return
            _instrumented.append(provider)
        _gauges(provider, lambda: list(_watched.values()))
    except Exception:  # metrics never fail the store
        log.warning("tracerag: could not set up the review queue gauges", exc_info=True)


def observe_review_queue(queue: ReviewFigures, meter_provider: MeterProvider) -> None:
    """Put one queue's gauges on ``meter_provider`` (tests, and apps with their own provider)."""
    _gauges(meter_provider, lambda: [queue])


def _gauges(provider: MeterProvider, queues: Any) -> None:
    meter = get_meter(provider)
    cache: dict[str, Any] = {"at": 0.0, "figures": ({}, {})}
    cache_lock = threading.Lock()

    def figures() -> tuple[dict[tuple[str, str], int], dict[str, float]]:
        with cache_lock:
            if time.monotonic() - cache["at"] < STATS_SECONDS:
                return cache["figures"]  # type: ignore[no-any-return]
            counts: dict[tuple[str, str], int] = {}
            oldest: dict[str, float] = {}
            for queue in queues():
                try:
                    found, waits = queue.review_backlog()
                except Exception:  # a closed or unreachable store reports nothing
                    log.debug("tracerag: review queue figures unavailable", exc_info=True)
                    continue
                for key, n in found.items():
                    counts[key] = counts.get(key, 0) + int(n)
                for route, seconds in waits.items():
                    oldest[route] = max(oldest.get(route, 0.0), float(seconds))
            cache["at"], cache["figures"] = time.monotonic(), (counts, oldest)
            return counts, oldest

    def backlog(options: CallbackOptions) -> Iterable[Observation]:
        counts, _ = figures()
        observed = {(s, r): 0 for s in ("pending", "claimed") for r in ("review", "escalate")}
        observed.update(counts)
        return [
            Observation(n, {semconv.METRIC_ATTR_STATUS: s, semconv.METRIC_ATTR_ROUTE: r})
            for (s, r), n in sorted(observed.items())
        ]

    def oldest_wait(options: CallbackOptions) -> Iterable[Observation]:
        _, oldest = figures()
        return [
            Observation(seconds, {semconv.METRIC_ATTR_ROUTE: route})
            for route, seconds in sorted(oldest.items())
        ]

    meter.create_observable_gauge(
        semconv.METRIC_REVIEW_BACKLOG,
        [backlog],
        unit="{request}",
        description="Queued requests waiting for a reviewer's decision, by status and route",
    )
    meter.create_observable_gauge(
        semconv.METRIC_REVIEW_OLDEST,
        [oldest_wait],
        unit="s",
        description="How long the longest-waiting undecided request has waited, by route",
    )


def reset_for_tests() -> None:
    with _lock:
        _watched.clear()
        _instrumented.clear()
