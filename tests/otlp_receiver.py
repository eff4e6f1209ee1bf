"""A small OTLP receiver for tests: decodes what exporters really put on the wire.

``OtlpHttpReceiver`` serves ``POST /v1/traces`` and ``POST /v1/metrics`` (protobuf, optionally
gzip) on 127.0.0.1 with an ephemeral port; ``OtlpGrpcReceiver`` serves the gRPC TraceService.
Both decode with ``opentelemetry-proto`` into ``WireSpan`` records.
"""

from __future__ import annotations

import gzip
import threading
import time
import zlib
from collections.abc import Callable
from concurrent import futures
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

from opentelemetry.proto.collector.metrics.v1 import metrics_service_pb2
from opentelemetry.proto.collector.trace.v1 import trace_service_pb2
from opentelemetry.proto.common.v1 import common_pb2


def any_value(value: common_pb2.AnyValue) -> Any:
    """The Python value of an OTLP AnyValue."""
    kind = value.WhichOneof("value")
    if kind is None:
        return None
    if kind == "array_value":
        return [any_value(v) for v in value.array_value.values]
    if kind == "kvlist_value":
        return {kv.key: any_value(kv.value) for kv in value.kvlist_value.values}
    return getattr(value, kind)


def attributes(kvs: Any) -> dict[str, Any]:
    """OTLP KeyValue list → dict."""
    return {kv.key: any_value(kv.value) for kv in kvs}


@dataclass
class WireEvent:
    name: str
    attributes: dict[str, Any]


@dataclass
class WireSpan:
    """One span as decoded from an export request."""

    name: str
    trace_id: str
    span_id: str
    parent_span_id: str | None
    attributes: dict[str, Any]
    events: list[WireEvent]
    resource: dict[str, Any]
    scope: str
    status_code: int
    kind: int
    start_unix_nano: int
    end_unix_nano: int


def decode_traces(body: bytes) -> list[WireSpan]:
    """Spans of one serialized ``ExportTraceServiceRequest``."""
    request = trace_service_pb2.ExportTraceServiceRequest()
    request.ParseFromString(body)
    return spans_of(request)


def spans_of(request: trace_service_pb2.ExportTraceServiceRequest) -> list[WireSpan]:
    out: list[WireSpan] = []
    for rs in request.resource_spans:
        resource = attributes(rs.resource.attributes)
        for ss in rs.scope_spans:
            for s in ss.spans:
                out.append(
                    WireSpan(
                        name=s.name,
                        trace_id=s.trace_id.hex(),
                        span_id=s.span_id.hex(),
                        parent_span_id=s.parent_span_id.hex() or None,
                        attributes=attributes(s.attributes),
                        events=[WireEvent(e.name, attributes(e.attributes)) for e in s.events],
                        resource=resource,
                        scope=ss.scope.name,
                        status_code=s.status.code,
                        kind=s.kind,
                        start_unix_nano=s.start_time_unix_nano,
                        end_unix_nano=s.end_time_unix_nano,
                    )
                )
    return out


def metric_names(body: bytes) -> list[str]:
    """Metric names in one serialized ``ExportMetricsServiceRequest``."""
    request = metrics_service_pb2.ExportMetricsServiceRequest()
    request.ParseFromString(body)
    return [
        m.name for rm in request.resource_metrics for sm in rm.scope_metrics for m in sm.metrics
    ]


class _Store:
    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._cond = threading.Condition(self._lock)
        self.spans: list[WireSpan] = []
        self.metric_names: list[str] = []
        self.requests: list[dict[str, Any]] = []

    def add(self, spans: list[WireSpan], headers: dict[str, str], path: str) -> None:
        with self._cond:
            self.spans.extend(spans)
            self.requests.append({"path": path, "headers": headers, "spans": len(spans)})
            self._cond.notify_all()

    def add_metrics(self, names: list[str], headers: dict[str, str], path: str) -> None:
        with self._cond:
            self.metric_names.extend(names)
            self.requests.append({"path": path, "headers": headers, "metrics": len(names)})
            self._cond.notify_all()

    def wait_for(self, predicate: Callable[[list[WireSpan]], bool], timeout: float) -> bool:
        deadline = time.monotonic() + timeout
        with self._cond:
            while not predicate(self.spans):
                remaining = deadline - time.monotonic()
                if remaining <= 0:
                    return False
                self._cond.wait(remaining)
            return True


class OtlpHttpReceiver:
    """OTLP/HTTP (protobuf) receiver on 127.0.0.1; use as a context manager.

    ``status`` is the HTTP status answered to exports (set to 503 to simulate a failing
    collector); ``delay`` seconds are slept before answering; ``metrics=False`` answers 404 to
    ``/v1/metrics``, as a traces-only backend (Jaeger) does.
    """

    def __init__(self, status: int = 200, delay: float = 0.0, *, metrics: bool = True) -> None:
        self.status = status
        self.delay = delay
        self.metrics = metrics
        self.store = _Store()
        receiver = self

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self) -> None:
                length = int(self.headers.get("Content-Length") or 0)
                body = self.rfile.read(length)
                encoding = (self.headers.get("Content-Encoding") or "").lower()
                if encoding == "gzip":
                    body = gzip.decompress(body)
                elif encoding == "deflate":
                    body = zlib.decompress(body)
                headers = {k.lower(): v for k, v in self.headers.items()}
                if receiver.delay:
                    time.sleep(receiver.delay)
                path = self.path.split("?", 1)[0]
                if receiver.status != 200:
                    self.send_response(receiver.status)
                    self.send_header("Content-Length", "0")
                    self.end_headers()
                    return
                if path == "/v1/traces":
                    receiver.store.add(decode_traces(body), headers, path)
                    reply = trace_service_pb2.ExportTraceServiceResponse().SerializeToString()
                elif path == "/v1/metrics" and receiver.metrics:
                    receiver.store.add_metrics(metric_names(body), headers, path)
                    reply = metrics_service_pb2.ExportMetricsServiceResponse().SerializeToString()
                else:
                    self.send_response(404)
                    self.send_header("Content-Length", "0")
                    self.end_headers()
                    return
                self.send_response(200)
                self.send_header("Content-Type", "application/x-protobuf")
                self.send_header("Content-Length", str(len(reply)))
                self.end_headers()
                self.wfile.write(reply)

            def log_message(self, format: str, *args: Any) -> None:
                pass

        self._server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self._server.daemon_threads = True
        self._thread = threading.Thread(target=self._server.serve_forever, daemon=True)

    @property
    def port(self) -> int:
        return int(self._server.server_address[1])

    @property
    def endpoint(self) -> str:
        """Base URL, as for ``OTEL_EXPORTER_OTLP_ENDPOINT``."""
        return f"http://127.0.0.1:{self.port}"

    @property
    def traces_url(self) -> str:
        return f"{self.endpoint}/v1/traces"

    @property
    def spans(self) -> list[WireSpan]:
        return list(self.store.spans)

    def wait_for(self, predicate: Callable[[list[WireSpan]], bool], timeout: float = 10) -> bool:
        return self.store.wait_for(predicate, timeout)

    def start(self) -> OtlpHttpReceiver:
        self._thread.start()
        return self

    def stop(self) -> None:
        self._server.shutdown()
        self._server.server_close()

    def __enter__(self) -> OtlpHttpReceiver:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()


class OtlpGrpcReceiver:
    """OTLP/gRPC TraceService receiver on 127.0.0.1; use as a context manager."""

    def __init__(self) -> None:
        import grpc
        from opentelemetry.proto.collector.trace.v1 import trace_service_pb2_grpc

        self.store = _Store()
        receiver = self

        class Service(trace_service_pb2_grpc.TraceServiceServicer):
            def Export(self, request: Any, context: Any) -> Any:
                headers = {k.lower(): v for k, v in context.invocation_metadata()}
                receiver.store.add(spans_of(request), headers, "grpc")
                return trace_service_pb2.ExportTraceServiceResponse()

        self._server = grpc.server(futures.ThreadPoolExecutor(max_workers=2))
        trace_service_pb2_grpc.add_TraceServiceServicer_to_server(Service(), self._server)
        self.port = self._server.add_insecure_port("127.0.0.1:0")

    @property
    def endpoint(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    @property
    def spans(self) -> list[WireSpan]:
        return list(self.store.spans)

    def wait_for(self, predicate: Callable[[list[WireSpan]], bool], timeout: float = 10) -> bool:
        return self.store.wait_for(predicate, timeout)

    def __enter__(self) -> OtlpGrpcReceiver:
        self._server.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._server.stop(grace=None)


@dataclass
class SpanTree:
    """The spans of one trace, indexed for assertions."""

    spans: list[WireSpan]
    by_id: dict[str, WireSpan] = field(init=False)

    def __post_init__(self) -> None:
        self.by_id = {s.span_id: s for s in self.spans}

    def roots(self) -> list[WireSpan]:
        return [s for s in self.spans if s.parent_span_id is None]

    def children(self, span: WireSpan) -> list[WireSpan]:
        return [s for s in self.spans if s.parent_span_id == span.span_id]

    def named(self, name: str) -> list[WireSpan]:
        """The spans named ``name`` or whose tracerag name (``tracerag.span``) is ``name``."""
        return [
            s for s in self.spans if s.name == name or s.attributes.get("tracerag.span") == name
        ]

    def parent(self, span: WireSpan) -> WireSpan | None:
        return self.by_id.get(span.parent_span_id or "")


def metric_points(reader: Any, name: str) -> list[Any]:
    """Data points of metric ``name`` in an ``InMemoryMetricReader`` (empty when absent)."""
    data = reader.get_metrics_data()
    points: list[Any] = []
    if data is None:
        return points
    for rm in data.resource_metrics:
        for sm in rm.scope_metrics:
            for metric in sm.metrics:
                if metric.name == name:
                    points.extend(metric.data.data_points)
    return points


def counter_total(reader: Any, name: str, **attrs: str) -> float:
    """Sum of a counter's points whose attributes include ``attrs``."""
    return sum(
        p.value
        for p in metric_points(reader, name)
        if all(p.attributes.get(k) == v for k, v in attrs.items())
    )


def backend_missing(reason: str) -> None:
    """Skip with ``reason`` locally; fail when the ``CI`` environment variable is set."""
    import os

    import pytest

    if os.environ.get("CI"):
        pytest.fail(f"backend missing in CI: {reason} (run .ci/observability.sh)")
    pytest.skip(reason)
