"""Metrics: what record_* put into the OpenTelemetry instruments, and the Prometheus endpoint."""

from __future__ import annotations

import math
import socket
import urllib.request
from collections.abc import Iterator
from dataclasses import dataclass, field
from types import SimpleNamespace

import pytest
from opentelemetry.sdk.metrics import MeterProvider
from opentelemetry.sdk.metrics.export import InMemoryMetricReader
from otlp_receiver import OtlpHttpReceiver, counter_total, metric_points

from tracerag import _semconv as semconv
from tracerag.telemetry import _instruments, _meters


@pytest.fixture(autouse=True)
def clean(monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    for name in (
        "TRACERAG_PROMETHEUS_PORT",
        "OTEL_METRICS_EXPORTER",
        "OTEL_EXPORTER_OTLP_ENDPOINT",
        "OTEL_EXPORTER_OTLP_METRICS_ENDPOINT",
    ):
        monkeypatch.delenv(name, raising=False)
    _meters.reset()
    yield
    _meters.reset()


@pytest.fixture
def reader() -> InMemoryMetricReader:
    return InMemoryMetricReader()


@pytest.fixture
def provider(reader: InMemoryMetricReader) -> MeterProvider:
    return MeterProvider(metric_readers=[reader])


@dataclass
class CitationReport:
    coverage: float
    accuracy: float
    fabricated: list[str] = field(default_factory=list)


def make_ctx(
    decision: str = "pass", confidence: float = 0.9, **kw: object
) -> _instruments.RequestOutcome:
    citations = kw.get("citations", CitationReport(0.75, 0.5, ["m9", "m10"]))
    field = citations.get if isinstance(citations, dict) else lambda k: getattr(citations, k)
    return _instruments.RequestOutcome(
        tier=str(kw.get("tier", "high")),
        decision=decision,
        confidence=confidence,
        timings={
            "register": 0.001,
            "retrieve": 0.02,
            "plan": 0.3,
            "sample": 1.2,
            "verify": 0.04,
            "assemble": 0.002,
            "request": 1.6,
        },
        n_samples=int(kw.get("n", 5)),  # type: ignore[call-overload]
        citation_coverage=field("coverage"),
        citation_accuracy=field("accuracy"),
        fabricated=field("fabricated"),
    )


def test_record_request_fills_every_instrument(
    provider: MeterProvider, reader: InMemoryMetricReader
) -> None:
    _instruments.record_request(make_ctx(), meter_provider=provider)
    _instruments.record_request(make_ctx("escalate", 0.3, tier="low", n=1), meter_provider=provider)

    assert counter_total(reader, semconv.METRIC_REQUESTS, decision="pass", tier="high") == 1
    assert counter_total(reader, semconv.METRIC_REQUESTS, decision="escalate", tier="low") == 1
    (conf_high,) = [
        p
        for p in metric_points(reader, semconv.METRIC_CONFIDENCE)
        if p.attributes["decision"] == "pass"
    ]
    assert conf_high.sum == pytest.approx(0.9)
    assert list(conf_high.explicit_bounds) == list(_instruments.RATIO_BUCKETS)
    stages = {
        p.attributes["stage"]: p
        for p in metric_points(reader, semconv.METRIC_STAGE_DURATION)
        if p.attributes["tier"] == "high"
    }
    assert set(stages) == set(semconv.STAGES)
    assert stages["sample"].sum == pytest.approx(1.2)
    assert list(stages["sample"].explicit_bounds) == list(_instruments.STAGE_SECONDS_BUCKETS)
    assert _instruments.STAGE_SECONDS_BUCKETS[0] == 0.005
    assert _instruments.STAGE_SECONDS_BUCKETS[-1] == 30
    (req,) = [
        p
        for p in metric_points(reader, semconv.METRIC_REQUEST_DURATION)
        if p.attributes["decision"] == "pass"
    ]
    assert req.sum == pytest.approx(1.6)
    samples = {p.attributes["tier"]: p.sum for p in metric_points(reader, semconv.METRIC_SAMPLES)}
    assert samples == {"high": 5, "low": 1}
    coverage = metric_points(reader, semconv.METRIC_CITATION_COVERAGE)
    assert sum(p.sum for p in coverage) == pytest.approx(1.5)
    accuracy = metric_points(reader, semconv.METRIC_CITATION_ACCURACY)
    assert sum(p.count for p in accuracy) == 2
    assert counter_total(reader, semconv.METRIC_FABRICATED) == 4


def test_confidence_buckets_match_the_router_thresholds() -> None:
    assert _instruments.RATIO_BUCKETS[:6] == (0.1, 0.2, 0.3, 0.4, 0.5, 0.6)
    assert {0.6, 0.85}.issubset(_instruments.RATIO_BUCKETS)
    assert _instruments.RATIO_BUCKETS[-5:] == (0.8, 0.85, 0.9, 0.95, 1.0)


def test_record_request_is_defensive(provider: MeterProvider, reader: InMemoryMetricReader) -> None:
    _instruments.record_request(
        make_ctx(citations={"coverage": "0.5", "accuracy": None, "fabricated": 3}),
        meter_provider=provider,
    )
    _instruments.record_request(make_ctx(citations={"coverage": math.nan}), meter_provider=provider)
    odd = SimpleNamespace(decision=None, confidence=float("inf"), timings={"x": "slow"})
    _instruments.record_request(odd, meter_provider=provider)  # type: ignore[arg-type]
    _instruments.record_request(object(), meter_provider=provider)  # type: ignore[arg-type]
    bare = _instruments.RequestOutcome()
    _instruments.record_request(bare, meter_provider=provider)
    assert counter_total(reader, semconv.METRIC_REQUESTS) == 5
    assert counter_total(reader, semconv.METRIC_REQUESTS, decision="none") == 3
    assert counter_total(reader, semconv.METRIC_FABRICATED) == 3
    assert sum(p.count for p in metric_points(reader, semconv.METRIC_CITATION_COVERAGE)) == 1
    assert sum(p.count for p in metric_points(reader, semconv.METRIC_CONFIDENCE)) == 2


def test_confidence_is_clamped(provider: MeterProvider, reader: InMemoryMetricReader) -> None:
    _instruments.record_request(make_ctx(confidence=1.2), meter_provider=provider)
    (point,) = metric_points(reader, semconv.METRIC_CONFIDENCE)
    assert point.max == 1.0


def test_retries_errors_audit_and_spans(
    provider: MeterProvider, reader: InMemoryMetricReader
) -> None:
    _instruments.record_retry("sample", TimeoutError("slow"), meter_provider=provider)
    _instruments.record_retry("sample", TimeoutError("slow"), meter_provider=provider)
    _instruments.record_model_error("plan", ValueError("bad json"), meter_provider=provider)
    _instruments.record_audit_failure("OperationalError", meter_provider=provider)
    _instruments.record_audit_failure("OperationalError", dropped=True, meter_provider=provider)
    _instruments.record_spans_dropped(7, "export_failed", meter_provider=provider)
    assert (
        counter_total(reader, semconv.METRIC_RETRIES, stage="sample", error_type="TimeoutError")
        == 2
    )
    assert counter_total(reader, semconv.METRIC_MODEL_ERRORS, stage="plan") == 1
    assert counter_total(reader, semconv.METRIC_AUDIT_FAILURES, reason="OperationalError") == 2
    assert counter_total(reader, semconv.METRIC_AUDIT_DROPPED) == 1
    assert counter_total(reader, semconv.METRIC_SPANS_DROPPED, reason="export_failed") == 7


def test_configured_provider_is_used_without_argument(reader: InMemoryMetricReader) -> None:
    _meters.configure_metrics(readers=[reader])
    _instruments.record_retry("retrieve", OSError())
    assert counter_total(reader, semconv.METRIC_RETRIES, stage="retrieve") == 1


def test_without_configuration_recording_is_a_noop() -> None:
    _instruments.record_request(make_ctx())  # the API's no-op provider: nothing raises
    assert _meters.configure_metrics_from_env() is None


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _scrape(url: str) -> str:
    with urllib.request.urlopen(url, timeout=5) as response:
        return response.read().decode()


@pytest.mark.integration
def test_prometheus_endpoint_exposes_names_and_buckets() -> None:
    server = _meters.start_prometheus_server(0)
    assert server.addr == "127.0.0.1"
    _instruments.record_request(make_ctx())
    _instruments.record_retry("sample", TimeoutError())
    text = _scrape(server.url)
    assert 'tracerag_requests_total{decision="pass"' in text
    assert 'tracerag_stage_duration_seconds_bucket{le="0.005"' in text
    assert 'tracerag_confidence_bucket{decision="pass",le="0.85"' in text
    assert "tracerag_model_retries_total" in text
    assert "tracerag_citations_fabricated_total" in text
    server.shutdown()


@pytest.mark.integration
def test_prometheus_port_from_env(monkeypatch: pytest.MonkeyPatch) -> None:
    port = _free_port()
    monkeypatch.setenv(_meters.PROMETHEUS_PORT_ENV, str(port))
    _meters.get_meter_provider()  # as RAGPipeline does when it is built
    (server,) = _meters.prometheus_servers()
    assert server.port == port and server.addr == "127.0.0.1"
    _instruments.record_request(make_ctx("review", 0.7))
    assert 'decision="review"' in _scrape(f"http://127.0.0.1:{port}/metrics")


@pytest.mark.integration
def test_otlp_metrics_from_env(monkeypatch: pytest.MonkeyPatch) -> None:
    with OtlpHttpReceiver() as receiver:
        monkeypatch.setenv("OTEL_EXPORTER_OTLP_ENDPOINT", receiver.endpoint)
        _instruments.record_request(make_ctx())
        provider = _meters.get_meter_provider()
        assert provider.force_flush(5_000)  # type: ignore[attr-defined]
        names = set(receiver.store.metric_names)
        _meters.reset()  # shut down while the receiver still answers
    assert {semconv.METRIC_REQUESTS, semconv.METRIC_CONFIDENCE} <= names
