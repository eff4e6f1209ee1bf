"""Registry gauges, collected by a real SDK reader from a real registry."""

from __future__ import annotations

import time
from collections.abc import Callable

from langchain_core.documents import Document
from opentelemetry.sdk.metrics import MeterProvider
from opentelemetry.sdk.metrics.export import InMemoryMetricReader

from tracerag.materials import MaterialRegistry
from tracerag.materials._gauges import STATS_SECONDS, observe_registry


def collected_once(
    reader: InMemoryMetricReader, holds: Callable[[dict[str, dict[tuple, float]]], bool]
) -> dict[str, dict[tuple, float]]:
    """The reader's figures once ``holds`` is true of them (the registry's figures are read at
    most once every ``STATS_SECONDS``), or as they are after a bounded wait."""
    deadline = time.monotonic() + STATS_SECONDS + 10.0
    while True:
        got = collect(reader)
        if holds(got) or time.monotonic() > deadline:
            return got
        time.sleep(0.02)


def _checks(got: dict[str, dict[tuple, float]]) -> bool:
    try:
        _check(got)
    except (AssertionError, KeyError):
        return False
    return True


def collect(reader: InMemoryMetricReader) -> dict[str, dict[tuple, float]]:
    out: dict[str, dict[tuple, float]] = {}
    data = reader.get_metrics_data()
    for rm in data.resource_metrics if data is not None else []:
        for sm in rm.scope_metrics:
            for metric in sm.metrics:
                for point in metric.data.data_points:
                    key = tuple(sorted((point.attributes or {}).items()))
                    out.setdefault(metric.name, {})[key] = point.value
    return out


def test_gauges_follow_the_registry(registry: MaterialRegistry) -> None:
    reader = InMemoryMetricReader()
    provider = MeterProvider(metric_readers=[reader])
    observe_registry(registry, meter_provider=provider)
    _fill(registry)
    got = collect(reader)
    assert got["tracerag.materials"][(("status", "active"),)] == 2
    assert got["tracerag.materials"][(("status", "quarantined"),)] == 1
    assert got["tracerag.materials"][(("status", "pending_review"),)] == 1
    assert got["tracerag.materials.pending_writes"][()] == 1
    assert got["tracerag.materials.conflicts"][()] == 1
    assert sum(got["tracerag.materials.credibility"].values()) == 2
    assert got["tracerag.materials.credibility"][(("bucket", "0.6-0.7"),)] == 2  # the prior
    provider.shutdown()


def _fill(registry: MaterialRegistry) -> None:
    registry.observe(
        [
            Document(page_content="已拆封商品可在签收后7天内退货。", metadata={"id": "a"}),
            Document(page_content="已拆封商品可在签收后30天内退货。", metadata={"id": "b"}),
            Document(page_content="礼品卡不可兑换现金。", metadata={"id": "c"}),
        ]
    )
    registry.register("memo", "Maybe gift cards expire?", operator="x", written_by="memory@1")
    registry.quarantine("c", operator="lead", reason="test")


def _check(got: dict[str, dict[tuple, float]]) -> None:
    assert got["tracerag.materials"][(("status", "quarantined"),)] == 1
    assert got["tracerag.materials.quarantined"][()] == 1
    assert got["tracerag.materials.quarantine_proposed"][()] == 0
    assert got["tracerag.materials.pending_writes"][()] == 1
    assert got["tracerag.materials.conflicts"][()] == 1
    assert sum(got["tracerag.materials.credibility"].values()) == 2


def test_an_open_registry_reports_on_tracerags_meter_in_library_mode(
    registry: MaterialRegistry,
) -> None:
    """No wiring by the application: tracerag's configured MeterProvider gets the gauges of
    every open registry, also one opened before the provider was configured."""
    from tracerag.telemetry import _meters

    _meters.reset()
    reader = InMemoryMetricReader()
    try:
        _meters.configure_metrics(readers=[reader])
        _fill(registry)  # the registry was opened before the provider existed
        _check(collect(reader))
        registry.close()
        got = collected_once(reader, lambda g: "tracerag.materials" not in g)
        assert "tracerag.materials" not in got  # a closed one stops reporting
    finally:
        _meters.reset()


def test_the_server_reports_its_registry_from_startup(tmp_path) -> None:
    """tracerag serve's app opens the registry beside its store when it starts, so the gauges
    are there before anyone used a material; they follow changes made elsewhere (the CLI)."""
    from fastapi.testclient import TestClient

    from tracerag.server._asgi import create_app
    from tracerag.store._sqlite import SQLiteAuditStore
    from tracerag.telemetry import _meters

    path = str(tmp_path / "audit.sqlite")
    _meters.reset()
    reader = InMemoryMetricReader()
    try:
        _meters.configure_metrics(readers=[reader])
        store = SQLiteAuditStore(path)
        app = create_app(store=store, api_key="k" * 20, review_desk=False)
        with TestClient(app):
            served = app.state.services.registry
            assert served is not None
            got = collect(reader)
            assert got["tracerag.materials"][(("status", "active"),)] == 0
            other = MaterialRegistry(SQLiteAuditStore(path), owns_store=True, metrics=False)
            _fill(other)  # another process's changes, in the same database
            other.close()
            _check(collected_once(reader, _checks))
        store.close()
    finally:
        _meters.reset()
