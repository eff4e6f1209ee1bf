"""The review desk's queue in metrics, read through the real SDK.

``tracerag.review.backlog`` (by status and route) and ``tracerag.review.oldest_wait`` are read
from the queue's database at collection; ``tracerag.review.time_to_decision`` is recorded when a
reviewer decides, from the request's queueing to the decision.
"""

from __future__ import annotations

from typing import Any

from opentelemetry.sdk.metrics import MeterProvider
from opentelemetry.sdk.metrics.export import InMemoryMetricReader
from store_fixtures import make_record

from tracerag import _semconv as semconv
from tracerag.telemetry import _review


def points(reader: InMemoryMetricReader, name: str) -> list[Any]:
    data = reader.get_metrics_data()
    assert data is not None
    return [
        p
        for rm in data.resource_metrics
        for sm in rm.scope_metrics
        for m in sm.metrics
        if m.name == name
        for p in m.data.data_points
    ]


def by_labels(found: list[Any]) -> dict[tuple[tuple[str, Any], ...], Any]:
    return {tuple(sorted(p.attributes.items())): p for p in found}


def test_backlog_wait_and_time_to_decision(store, monkeypatch) -> None:
    reader = InMemoryMetricReader()
    provider = MeterProvider(metric_readers=[reader])
    from tracerag.telemetry import _instruments

    # the decision is recorded on the provider in force: this test's
    record = _instruments.record_review_decision
    monkeypatch.setattr(
        "tracerag.store._review_queue.record_review_decision",
        lambda route, action, seconds: record(route, action, seconds, meter_provider=provider),
    )
    _review.observe_review_queue(store, provider)
    for i, decision in enumerate(["escalate", "escalate", "review", "pass"]):
        store.append_record(make_record(f"q{i}", decision=decision))
    store.claim_next("alice")  # the highest priority: an escalation

    backlog = by_labels(points(reader, semconv.METRIC_REVIEW_BACKLOG))
    value = {k: p.value for k, p in backlog.items()}
    assert value[(("route", "escalate"), ("status", "pending"))] == 1
    assert value[(("route", "escalate"), ("status", "claimed"))] == 1
    assert value[(("route", "review"), ("status", "pending"))] == 1
    assert value[(("route", "review"), ("status", "claimed"))] == 0  # zero, not missing
    waits = {k: p.value for k, p in by_labels(points(reader, semconv.METRIC_REVIEW_OLDEST)).items()}
    assert set(waits) == {(("route", "escalate"),), (("route", "review"),)}
    assert all(0 <= w < 600 for w in waits.values())

    (claimed,) = [i for i in store.list_queue("claimed")]
    store.decide(claimed.request_id, "alice", "reject", reason="wrong policy")
    decided = points(reader, semconv.METRIC_REVIEW_TIME_TO_DECISION)
    (point,) = decided
    assert dict(point.attributes) == {"route": "escalate", "action": "reject"}
    assert point.count == 1 and point.sum >= 0
    _review.STATS_SECONDS = 0.0  # the gauges read the database again at once
    try:
        value = {
            k: p.value for k, p in by_labels(points(reader, semconv.METRIC_REVIEW_BACKLOG)).items()
        }
    finally:
        _review.STATS_SECONDS = 1.0
    assert value[(("route", "escalate"), ("status", "claimed"))] == 0
    assert sum(value.values()) == 2
    provider.shutdown()


def test_a_closed_store_reports_nothing_instead_of_failing_the_collection(store) -> None:
    reader = InMemoryMetricReader()
    provider = MeterProvider(metric_readers=[reader])
    _review.observe_review_queue(store, provider)
    store.close()
    backlog = points(reader, semconv.METRIC_REVIEW_BACKLOG)
    assert all(p.value == 0 for p in backlog)
    provider.shutdown()
