
"""Registry gauges, collected by a real SDK reader from a real registry."""

from __future__ import annotations

from langchain_core.documents import Document
from opentelemetry.sdk.metrics import MeterProvider
from opentelemetry.sdk.metrics.export import InMemoryMetricReader

from tracerag.materials import MaterialRegistry
from tracerag.materials.metrics import observe_registry


def collect(reader: InMemoryMetricReader) -> dict[str, dict[tuple, float]]:
    out: dict[str, dict[tuple, float]] = {}
    data = reader.get_metrics_data()
    for rm in data.resource_metrics:
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
    registry.observe(
        [
            Document(page_content="已拆封商品可在签收后7天内退货。", metadata={"id": "a"}),
            Document(page_content="已拆封商品可在签收后30天内退货。", metadata={"id": "b"}),
            Document(page_content="礼品卡不可兑换现金。", metadata={"id": "c"}),
        ]
    )
    registry.register("memo", "Maybe gift cards expire?", operator="x", written_by="memory@1")
    registry.quarantine("c", operator="lead", reason="test")
    got = collect(reader)
    assert got["tracerag.materials"][(("status", "active"),)] == 2
    assert got["tracerag.materials"][(("status", "quarantined"),)] == 1
    assert got["tracerag.materials"][(("status", "pending_review"),)] == 1
    assert got["tracerag.materials.pending_writes"][()] == 1
    assert got["tracerag.materials.conflicts"][()] == 1
    assert sum(got["tracerag.materials.credibility"].values()) == 2
    assert got["tracerag.materials.credibility"][(("bucket", "0.6-0.7"),)] == 2  # the prior
    provider.shutdown()
