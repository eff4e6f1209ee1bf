"""Export: OTLP over HTTP and gRPC from code or env, the default without exporter, and that
an unreachable or stuck collector costs requests nothing while lost spans are counted."""

from __future__ import annotations

import logging
import socket
import threading
import time
from collections.abc import Iterator, Sequence

import pytest
from opentelemetry import trace
from opentelemetry.sdk.metrics.export import InMemoryMetricReader
from opentelemetry.sdk.trace import ReadableSpan
from opentelemetry.sdk.trace import TracerProvider as SDKTracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor, SpanExporter, SpanExportResult
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from otlp_receiver import OtlpGrpcReceiver, OtlpHttpReceiver, counter_total
from pipeline_fixtures import REPO
from waiting import wait_until

from tracerag import _semconv as semconv
from tracerag.telemetry import _export, _instruments, _lifecycle, _meters, _providers

OTEL_VARS = (
    "OTEL_EXPORTER_OTLP_ENDPOINT",
    "OTEL_EXPORTER_OTLP_TRACES_ENDPOINT",
    "OTEL_EXPORTER_OTLP_PROTOCOL",
    "OTEL_EXPORTER_OTLP_TRACES_PROTOCOL",
    "OTEL_EXPORTER_OTLP_HEADERS",
    "OTEL_EXPORTER_OTLP_TRACES_HEADERS",
    "OTEL_TRACES_EXPORTER",
    "OTEL_SERVICE_NAME",
    "OTEL_RESOURCE_ATTRIBUTES",
    "OTEL_METRICS_EXPORTER",
    "TRACERAG_PROMETHEUS_PORT",
)


@pytest.fixture(autouse=True)
def clean_state(monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    for name in OTEL_VARS:
        monkeypatch.delenv(name, raising=False)
    _providers.reset_for_tests()
    _meters.reset()
    yield
    _providers.reset_for_tests()
    _meters.reset()


@pytest.fixture
def metric_reader() -> InMemoryMetricReader:
    reader = InMemoryMetricReader()
    _meters.configure_metrics(readers=[reader])
    return reader


def unused_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def make_request_spans(provider: object, request_id: str = "req-1") -> str:
    tracer = _providers.get_tracer(provider)  # type: ignore[arg-type]
    with tracer.start_as_current_span(semconv.SPAN_REQUEST) as root:
        root.set_attribute(semconv.REQUEST_ID, request_id)
        for stage in semconv.STAGES:
            with tracer.start_as_current_span(semconv.STAGE_SPANS[stage]) as span:
                span.set_attribute(semconv.REQUEST_ID, request_id)
                span.set_attribute(semconv.STAGE, stage)
        return f"{root.get_span_context().trace_id:032x}"


@pytest.mark.integration
def test_configure_http_exports_protobuf_with_resource_and_headers() -> None:
    with OtlpHttpReceiver() as receiver:
        provider = _providers.configure(
            endpoint=receiver.endpoint,
            headers={"x-tenant": "acme"},
            service_name="svc-a",
            resource_attributes={"deployment.environment": "test"},
            schedule_delay_millis=50,
        )
        trace_id = make_request_spans(None, "req-http")
        assert provider.force_flush(5_000)
        assert receiver.wait_for(lambda spans: len(spans) >= 7)
        spans = receiver.spans
        assert {s.trace_id for s in spans} == {trace_id}
        assert spans[0].resource["service.name"] == "svc-a"
        assert spans[0].resource["deployment.environment"] == "test"
        assert spans[0].scope == _providers.INSTRUMENTATION_NAME
        assert receiver.store.requests[0]["headers"]["x-tenant"] == "acme"
        assert all(s.attributes[semconv.REQUEST_ID] == "req-http" for s in spans)


@pytest.mark.integration
def test_env_configures_http_export(monkeypatch: pytest.MonkeyPatch) -> None:
    with OtlpHttpReceiver() as receiver:
        monkeypatch.setenv("OTEL_EXPORTER_OTLP_ENDPOINT", receiver.endpoint)
        monkeypatch.setenv("OTEL_EXPORTER_OTLP_HEADERS", "authorization=Bearer%20t0k")
        monkeypatch.setenv("OTEL_SERVICE_NAME", "from-env")
        monkeypatch.setenv("OTEL_RESOURCE_ATTRIBUTES", "team.name=search,service.version=9")
        make_request_spans(None)
        assert _providers.force_flush(5_000)
        assert receiver.wait_for(lambda spans: len(spans) >= 7)
        span = receiver.spans[0]
        assert span.resource["service.name"] == "from-env"
        assert span.resource["team.name"] == "search"
        assert receiver.store.requests[0]["headers"]["authorization"] == "Bearer t0k"


@pytest.mark.integration
def test_grpc_export_from_code_and_env(monkeypatch: pytest.MonkeyPatch) -> None:
    with OtlpGrpcReceiver() as receiver:
        _providers.configure(endpoint=receiver.endpoint, protocol="grpc", headers="x-k=v")
        make_request_spans(None, "req-grpc")
        assert _providers.force_flush(5_000)
        assert receiver.wait_for(lambda spans: len(spans) >= 7)
        assert receiver.store.requests[0]["headers"]["x-k"] == "v"
        _providers.reset_for_tests()

        monkeypatch.setenv("OTEL_EXPORTER_OTLP_ENDPOINT", receiver.endpoint)
        monkeypatch.setenv("OTEL_EXPORTER_OTLP_PROTOCOL", "grpc")
        make_request_spans(None, "req-grpc-env")
        assert _providers.force_flush(5_000)
        assert receiver.wait_for(lambda spans: len(spans) >= 14)
        assert {s.attributes[semconv.REQUEST_ID] for s in receiver.spans} == {
            "req-grpc",
            "req-grpc-env",
        }


def test_default_without_env_records_but_exports_nothing(caplog: pytest.LogCaptureFixture) -> None:
    with caplog.at_level(logging.INFO, logger="tracerag.tracing"):
        trace_id = make_request_spans(None)
        make_request_spans(None)
    assert int(trace_id, 16) != 0
    provider = _providers.default_provider()
    assert isinstance(provider, SDKTracerProvider)
    assert provider._active_span_processor._span_processors == ()
    notices = [r for r in caplog.records if "not exported" in r.getMessage()]
    assert len(notices) == 1


def test_traces_exporter_none_is_respected(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("OTEL_TRACES_EXPORTER", "none")
    monkeypatch.setenv("OTEL_EXPORTER_OTLP_ENDPOINT", "http://127.0.0.1:9")
    make_request_spans(None)
    provider = _providers.default_provider()
    assert provider._active_span_processor._span_processors == ()  # type: ignore[union-attr]


def _memory_provider() -> tuple[SDKTracerProvider, InMemorySpanExporter]:
    exporter = InMemorySpanExporter()
    provider = SDKTracerProvider()
    provider.add_span_processor(SimpleSpanProcessor(exporter))
    return provider, exporter


def test_provider_order(monkeypatch: pytest.MonkeyPatch) -> None:
    explicit, explicit_spans = _memory_provider()
    global_, global_spans = _memory_provider()
    monkeypatch.setattr(trace, "_TRACER_PROVIDER", global_)
    # an installed global provider beats the env default
    _providers.get_tracer().start_span("a").end()
    assert [s.name for s in global_spans.get_finished_spans()] == ["a"]
    # configure() beats the global provider
    configured = _providers.configure(otlp=False)
    span = _providers.get_tracer().start_span("b")
    assert span._span_processor is configured._active_span_processor  # type: ignore[attr-defined]
    # an explicit provider beats everything
    _providers.get_tracer(explicit).start_span("c").end()
    assert [s.name for s in explicit_spans.get_finished_spans()] == ["c"]
    assert [s.name for s in global_spans.get_finished_spans()] == ["a"]


def test_file_exporter_writes_json_lines(tmp_path) -> None:
    path = tmp_path / "spans.jsonl"
    provider = _providers.configure(file=path, schedule_delay_millis=10)
    make_request_spans(None, "req-file")
    provider.force_flush(5_000)
    import json

    lines = [json.loads(line) for line in path.read_text().splitlines()]
    assert len(lines) == 7
    assert {line["name"] for line in lines} >= {semconv.SPAN_REQUEST, semconv.SPAN_VERIFY}
    assert all(line["attributes"][semconv.REQUEST_ID] == "req-file" for line in lines)


@pytest.mark.integration
def test_unreachable_collector_costs_requests_nothing_and_drops_are_counted(
    metric_reader: InMemoryMetricReader,
) -> None:
    port = unused_port()
    _providers.configure(endpoint=f"http://127.0.0.1:{port}", timeout=0.5, schedule_delay_millis=20)
    before = _export.dropped_spans()
    durations = []
    for i in range(20):
        start = time.perf_counter()
        make_request_spans(None, f"req-{i}")
        durations.append(time.perf_counter() - start)
    # spans are handed to the batch queue: no request waits on the network
    assert max(durations) < 0.05, durations
    _providers.force_flush(10_000)
    wait_until(lambda: _export.dropped_spans() - before >= 140, "140 dropped spans", timeout=10)
    assert _export.dropped_spans() - before == 140
    assert counter_total(metric_reader, semconv.METRIC_SPANS_DROPPED, reason="export_failed") == 140


@pytest.mark.integration
def test_failing_collector_counts_drops(metric_reader: InMemoryMetricReader) -> None:
    with OtlpHttpReceiver(status=400) as receiver:
        _providers.configure(endpoint=receiver.endpoint, schedule_delay_millis=20)
        make_request_spans(None)
        _providers.force_flush(5_000)
    assert counter_total(metric_reader, semconv.METRIC_SPANS_DROPPED) == 7


class BlockingExporter(SpanExporter):
    """Holds the first export until released, so the batch queue fills behind it."""

    def __init__(self) -> None:
        self.started = threading.Event()
        self.release = threading.Event()
        self.waited_out = False
        self.exported = 0

    def export(self, spans: Sequence[ReadableSpan]) -> SpanExportResult:
        self.started.set()
        if not self.release.wait(10):
            self.waited_out = True  # nobody released it: ending spans had waited for export
        self.exported += len(spans)
        return SpanExportResult.SUCCESS

    def shutdown(self) -> None:
        self.release.set()


def test_full_batch_queue_counts_drops_without_blocking(
    metric_reader: InMemoryMetricReader,
) -> None:
    exporter = BlockingExporter()
    provider = SDKTracerProvider()
    provider.add_span_processor(
        _export.batch_processor(
            exporter,
            max_queue_size=8,
            schedule_delay_millis=5,
            on_drop=_instruments.record_spans_dropped,
        )
    )
    tracer = _providers.get_tracer(provider)
    with tracer.start_as_current_span("first"):
        pass
    assert exporter.started.wait(10)  # the worker is now stuck in export with "first"
    for i in range(50):
        with tracer.start_as_current_span(f"s{i}"):
            pass
    exporter.release.set()
    provider.force_flush(5_000)
    provider.shutdown()
    dropped = counter_total(metric_reader, semconv.METRIC_SPANS_DROPPED, reason="queue_full")
    assert not exporter.waited_out  # 50 spans ended while the exporter was stuck
    assert dropped > 0
    assert exporter.exported + dropped == 51


def test_sdk_processor_metrics_count_queue_full_drops(
    monkeypatch: pytest.MonkeyPatch, metric_reader: InMemoryMetricReader
) -> None:
    monkeypatch.setenv("OTEL_PYTHON_SDK_INTERNAL_METRICS_ENABLED", "true")
    exporter = BlockingExporter()
    provider = SDKTracerProvider()
    provider.add_span_processor(
        _export.batch_processor(
            exporter,
            max_queue_size=8,
            schedule_delay_millis=5,
            meter_provider=_meters.get_meter_provider(),
            on_drop=_instruments.record_spans_dropped,
        )
    )
    tracer = _providers.get_tracer(provider)
    with tracer.start_as_current_span("first"):
        pass
    assert exporter.started.wait(10)
    for i in range(50):
        with tracer.start_as_current_span(f"s{i}"):
            pass
    exporter.release.set()
    provider.force_flush(5_000)
    provider.shutdown()
    sdk_dropped = counter_total(
        metric_reader, "otel.sdk.processor.span.processed", **{"error.type": "queue_full"}
    )
    ours = counter_total(metric_reader, semconv.METRIC_SPANS_DROPPED, reason="queue_full")
    assert sdk_dropped > 0
    assert sdk_dropped == ours


def test_raising_exporter_is_counted(metric_reader: InMemoryMetricReader) -> None:
    class Broken(SpanExporter):
        def export(self, spans: Sequence[ReadableSpan]) -> SpanExportResult:
            raise ConnectionError("down")

        def shutdown(self) -> None:
            pass

    provider = SDKTracerProvider()
    provider.add_span_processor(
        _export.batch_processor(
            Broken(), schedule_delay_millis=5, on_drop=_instruments.record_spans_dropped
        )
    )
    make_request_spans(provider)
    provider.force_flush(5_000)
    assert counter_total(metric_reader, semconv.METRIC_SPANS_DROPPED) == 7


class Broken(SpanExporter):
    def export(self, spans: Sequence[ReadableSpan]) -> SpanExportResult:
        raise ConnectionError("down")

    def shutdown(self) -> None:
        pass


def test_a_processor_without_on_drop_counts_its_drops_but_records_no_metric(
    metric_reader: InMemoryMetricReader,
) -> None:
    before = _export.dropped_spans()
    provider = SDKTracerProvider()
    provider.add_span_processor(_export.batch_processor(Broken(), schedule_delay_millis=5))
    make_request_spans(provider)
    provider.force_flush(5_000)
    assert _export.dropped_spans() - before == 7
    assert counter_total(metric_reader, semconv.METRIC_SPANS_DROPPED) == 0


def test_on_drop_is_told_each_loss_and_its_failure_never_breaks_export() -> None:
    told: list[tuple[int, str]] = []

    def on_drop(count: int, reason: str) -> None:
        told.append((count, reason))
        raise RuntimeError("a broken metric")

    provider = SDKTracerProvider()
    provider.add_span_processor(
        _export.batch_processor(Broken(), schedule_delay_millis=5, on_drop=on_drop)
    )
    make_request_spans(provider)
    assert provider.force_flush(5_000) is not None
    assert sum(count for count, _ in told) == 7
    assert {reason for _, reason in told} == {"export_failed"}
    provider.shutdown()


def test_tracerag_s_own_providers_record_drops_as_the_metric() -> None:
    provider = _providers._build_provider([Broken()], schedule_delay_millis=5)
    try:
        processors = provider._active_span_processor._span_processors
        assert [p.exporter.on_drop for p in processors] == [_instruments.record_spans_dropped]
    finally:
        _lifecycle.forget_at_exit(provider)
        provider.shutdown()


def test_bad_protocol_is_rejected() -> None:
    with pytest.raises(ValueError, match="protocol"):
        _providers.configure(endpoint="http://127.0.0.1:1", protocol="http/json")


SHUTDOWN_SCRIPT = """
import sys, time
from tracerag.telemetry import _export, _instruments, _meters, _providers
port = int(sys.argv[1])
_providers.configure(endpoint=f"http://127.0.0.1:{port}", schedule_delay_millis=60_000)
_meters.configure_metrics(otlp=True, endpoint=f"http://127.0.0.1:{port}")
tracer = _providers.get_tracer()
for i in range(30):
    with tracer.start_as_current_span(f"s{i}"):
        pass
_instruments.record_retry("sample", TimeoutError("x"))
if len(sys.argv) > 2:  # flush first, as tracerag demo does
    started = time.time()
    print("flushed", _providers.force_flush(), time.time() - started, flush=True)
print("ended", time.time(), flush=True)
"""


@pytest.mark.integration
def test_exit_with_a_dead_collector_is_bounded_and_counts_the_loss(tmp_path) -> None:
    import os
    import subprocess
    import sys

    root = REPO
    script = tmp_path / "exit.py"
    script.write_text(SHUTDOWN_SCRIPT)
    env = {k: v for k, v in os.environ.items() if not k.startswith("OTEL_")}
    env["PYTHONPATH"] = str(root)
    env.pop(_lifecycle.SHUTDOWN_TIMEOUT_ENV, None)
    for flush_first in (False, True):
        done = subprocess.run(
            [sys.executable, str(script), str(unused_port())] + (["flush"] if flush_first else []),
            env=env,
            capture_output=True,
            text=True,
            timeout=60,
        )
        exited = time.time()
        assert done.returncode == 0, done.stderr[-2000:]
        ended = float(done.stdout.split("ended", 1)[1])
        # the default bound is 2 s; the OTLP exporters alone retry a dead collector for about
        # 10 s per signal (15 s before tracerag bounded it)
        assert exited - ended < 4, exited - ended
        assert "30 spans not exported" in done.stderr, done.stderr[-2000:]
        if flush_first:
            ok, took = done.stdout.split("flushed", 1)[1].split()[:2]
            assert ok == "False"  # the flush says it did not finish
            assert float(took) < 4, took


def _metric_notices(caplog: pytest.LogCaptureFixture) -> list[logging.LogRecord]:
    return [r for r in caplog.records if "does not accept OTLP metrics" in r.getMessage()]


@pytest.mark.integration
def test_traces_only_http_backend_is_reported_once_and_metrics_stop(
    caplog: pytest.LogCaptureFixture,
) -> None:
    with OtlpHttpReceiver(metrics=False) as receiver, caplog.at_level(logging.INFO):
        provider = _meters.configure_metrics(
            otlp=True, endpoint=receiver.endpoint, export_interval_millis=50
        )
        for _ in range(3):
            _instruments.record_retry("sample", TimeoutError("slow"))
            provider.force_flush(5_000)  # type: ignore[attr-defined]
        _meters.reset()
    (notice,) = _metric_notices(caplog)
    assert "HTTP 404" in notice.getMessage()
    assert "OTEL_METRICS_EXPORTER=none" in notice.getMessage()
    assert [r for r in caplog.records if r.levelno >= logging.ERROR] == []
    # one probe, no metric export after it
    assert [r["path"] for r in receiver.store.requests] == []


@pytest.mark.integration
def test_traces_only_grpc_backend_is_reported_once(caplog: pytest.LogCaptureFixture) -> None:
    with OtlpGrpcReceiver() as receiver, caplog.at_level(logging.INFO):  # TraceService only
        provider = _meters.configure_metrics(
            otlp=True, endpoint=receiver.endpoint, protocol="grpc", export_interval_millis=50
        )
        for _ in range(3):
            _instruments.record_retry("sample", TimeoutError("slow"))
            provider.force_flush(5_000)  # type: ignore[attr-defined]
        _meters.reset()
    (notice,) = _metric_notices(caplog)
    assert "UNIMPLEMENTED" in notice.getMessage()
    assert [r for r in caplog.records if r.levelno >= logging.ERROR] == []


@pytest.mark.integration
def test_metrics_backend_that_takes_metrics_gets_them(caplog: pytest.LogCaptureFixture) -> None:
    with OtlpHttpReceiver() as receiver, caplog.at_level(logging.INFO):
        provider = _meters.configure_metrics(
            otlp=True, endpoint=receiver.endpoint, export_interval_millis=50
        )
        _instruments.record_retry("sample", TimeoutError("slow"))
        provider.force_flush(5_000)  # type: ignore[attr-defined]
        _meters.reset()
    assert _metric_notices(caplog) == []
    assert semconv.METRIC_RETRIES in receiver.store.metric_names
