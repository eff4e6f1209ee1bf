"""Getting spans and metrics out: OTLP exporters, batches that fit the backend, drop accounting,
a shutdown that never holds the process, and metrics that stop when the backend takes none.

- ``batch_processor(exporter)``: the SDK's ``BatchSpanProcessor`` behind tracerag's exporter
  wrapper. Export batches are split so none exceeds ``max_batch_bytes`` of span data (default
  3 MiB, ``TRACERAG_OTLP_MAX_BATCH_BYTES``), below the 4 MiB gRPC message limit that Jaeger and
  the OpenTelemetry Collector apply by default. Spans that a failed export loses, and spans that
  never left (queue full, still queued when shutdown gave up) are counted: ``dropped_spans()``
  and ``on_drop`` (tracerag's providers pass the ``tracerag.spans.dropped`` metric). Shutdown
  waits at most ``shutdown_timeout`` seconds (default 2, ``TRACERAG_EXPORT_SHUTDOWN_TIMEOUT``),
  so a dead collector cannot delay the process's exit by the exporters' retry schedule.
- ``MetricsEndpointCheck``: wraps an OTLP metric exporter; before the first export it asks the
  endpoint whether it takes metrics at all. A traces-only backend (Jaeger answers HTTP 404 or
  gRPC UNIMPLEMENTED) is reported once, with the fix, and metrics export stops.

The SDK's own processor metrics (``otel.sdk.processor.span.processed{error.type}``, on when
``OTEL_PYTHON_SDK_INTERNAL_METRICS_ENABLED=true``) count queue-full drops as they happen.
"""

from __future__ import annotations

import json
import logging
import os
import threading
import urllib.error
import urllib.request
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import IO, Any, Literal
from urllib.parse import urlsplit

from opentelemetry.context import Context
from opentelemetry.sdk.trace import ReadableSpan, Span, SpanProcessor
from opentelemetry.sdk.trace.export import BatchSpanProcessor, SpanExporter, SpanExportResult

from tracerag.errors import ConfigurationError
from tracerag.telemetry._env import env_value
from tracerag.telemetry._lifecycle import (
    SHUTDOWN_TIMEOUT_ENV,
    default_max_batch_bytes,
    default_shutdown_timeout,
    otlp_exporter_options,
)

logger = logging.getLogger("tracerag.tracing")

Protocol = Literal["http/protobuf", "grpc"]

#: Told of spans lost (``count``, ``reason``) besides ``dropped_spans()``: tracerag's providers
#: pass the ``tracerag.spans.dropped`` metric (``_instruments.record_spans_dropped``).
OnDrop = Callable[[int, str], object]

_dropped = 0
_dropped_lock = threading.Lock()


# ---------------------------------------------------------------------------------------------
# Drop accounting


def dropped_spans() -> int:
    """How many spans this process failed to deliver through tracerag's processors."""
    return _dropped


def count_dropped(count: int, reason: str, on_drop: OnDrop | None = None) -> None:
    """Add ``count`` lost spans (``reason``) to ``dropped_spans()`` and tell ``on_drop``."""
    global _dropped
    if count <= 0:
        return
    with _dropped_lock:
        _dropped += count
    if on_drop is None:
        return
    try:
        on_drop(count, reason)
    except Exception:  # metrics must never break export
        logger.debug("tracerag: could not record dropped spans", exc_info=True)


# ---------------------------------------------------------------------------------------------
# Batches that fit


def _value_bytes(value: Any) -> int:
    if isinstance(value, str):
        return len(value) if value.isascii() else len(value.encode("utf-8"))
    if isinstance(value, bytes):
        return len(value)
    if isinstance(value, (list, tuple)):
        return sum(_value_bytes(v) + 2 for v in value) + 4
    return 9


def _attributes_bytes(attributes: Mapping[str, Any] | None) -> int:
    if not attributes:
        return 0
    return sum(len(k) + _value_bytes(v) + 10 for k, v in attributes.items())


def span_bytes(span: ReadableSpan) -> int:
    """An upper estimate of one span's size in an OTLP export request."""
    size = 96 + len(span.name) + _attributes_bytes(span.attributes)
    for event in span.events:
        size += 24 + len(event.name) + _attributes_bytes(event.attributes)
    for link in span.links:
        size += 48 + _attributes_bytes(link.attributes)
    if span.status is not None and span.status.description:
        size += len(span.status.description) + 8
    return size


def split_batch(spans: Sequence[ReadableSpan], max_bytes: int) -> list[list[ReadableSpan]]:
    """``spans`` in order, cut into chunks of at most ``max_bytes`` (by ``span_bytes``)."""
    chunks: list[list[ReadableSpan]] = []
    current: list[ReadableSpan] = []
    size = 0
    overhead = 512  # resource and scope, once per request
    for span in spans:
        cost = span_bytes(span)
        if current and size + cost + overhead > max_bytes:
            chunks.append(current)
            current, size = [], 0
        current.append(span)
        size += cost
    if current:
        chunks.append(current)
    return chunks


class TraceragSpanExporter(SpanExporter):
    """Wraps an exporter: splits batches to fit ``max_batch_bytes`` and counts lost spans."""

    def __init__(
        self,
        exporter: SpanExporter,
        *,
        max_batch_bytes: int | None = None,
        on_drop: OnDrop | None = None,
    ) -> None:
        self.exporter = exporter
        self.on_drop = on_drop
        self.max_batch_bytes = max_batch_bytes or default_max_batch_bytes()
        self._lock = threading.Lock()
        self.settled = 0  # spans whose export finished, delivered or not
        self.failed = 0  # of those, spans whose export failed
        self._closed = False
        self._shut = False

    def export(self, spans: Sequence[ReadableSpan]) -> SpanExportResult:
        result = SpanExportResult.SUCCESS
        for chunk in split_batch(spans, self.max_batch_bytes):
            if self._export(chunk) is not SpanExportResult.SUCCESS:
                result = SpanExportResult.FAILURE
        return result

    def _export(self, chunk: list[ReadableSpan]) -> SpanExportResult:
        try:
            result = self.exporter.export(chunk)
        except Exception:
            logger.warning(
                "tracerag: span export raised; %d spans dropped", len(chunk), exc_info=True
            )
            result = SpanExportResult.FAILURE
        failed = result is not SpanExportResult.SUCCESS
        with self._lock:
            if self._closed:  # the processor already counted what was still out as lost
                return result
            self.settled += len(chunk)
            if failed:
                self.failed += len(chunk)
        if failed:
            count_dropped(len(chunk), "export_failed", self.on_drop)
        return result

    def stop_accounting(self) -> None:
        """From now on, finishing exports are not counted (they were counted as lost)."""
        with self._lock:
            self._closed = True

    def shutdown(self) -> None:
        with self._lock:
            if self._shut:
                return
            self._shut = True
        self.exporter.shutdown()

    def force_flush(self, timeout_millis: int = 30_000) -> bool:
        return self.exporter.force_flush(timeout_millis)


class TraceragBatchSpanProcessor(SpanProcessor):
    """The SDK's BatchSpanProcessor with batches that fit, lost spans counted, and a bounded
    shutdown (see the module docstring). Add it (as ``batch_processor(exporter, ...)``) to a
    TracerProvider of your own to give it tracerag's export behaviour; ``on_drop`` is told of
    every span lost (tracerag's providers pass the ``tracerag.spans.dropped`` metric)."""

    def __init__(
        self,
        exporter: SpanExporter,
        *,
        max_queue_size: int | None = None,
        schedule_delay_millis: float | None = None,
        max_export_batch_size: int | None = None,
        max_batch_bytes: int | None = None,
        shutdown_timeout: float | None = None,
        meter_provider: Any = None,
        on_drop: OnDrop | None = None,
    ) -> None:
        if max_export_batch_size is None and max_queue_size is not None:
            default_batch = int(os.environ.get("OTEL_BSP_MAX_EXPORT_BATCH_SIZE", "512"))
            max_export_batch_size = min(default_batch, max_queue_size)
        self.exporter = TraceragSpanExporter(
            exporter, max_batch_bytes=max_batch_bytes, on_drop=on_drop
        )
        self.shutdown_timeout = (
            shutdown_timeout if shutdown_timeout is not None else default_shutdown_timeout()
        )
        self._processor = BatchSpanProcessor(
            self.exporter,
            max_queue_size=max_queue_size,
            schedule_delay_millis=schedule_delay_millis,
            max_export_batch_size=max_export_batch_size,
            meter_provider=meter_provider,
        )
        self._lock = threading.Lock()
        self._handed = 0  # sampled spans given to the batch processor
        self._accounted = 0  # spans counted as lost without an export
        self._closed = False
        self._stuck: threading.Thread | None = None  # a flush that did not finish in time

    @property
    def span_exporter(self) -> SpanExporter:
        """The exporter spans are sent to (as given, without tracerag's wrapper)."""
        return self.exporter.exporter

    def on_start(self, span: Span, parent_context: Context | None = None) -> None:
        self._processor.on_start(span, parent_context)

    def on_end(self, span: ReadableSpan) -> None:
        if span.context is not None and span.context.trace_flags.sampled:
            with self._lock:
                self._handed += 1
        self._processor.on_end(span)

    def _settle(self, handed: int, reason: str) -> int:
        """Count spans of the first ``handed`` that neither were exported nor failed an export
        (after a flush or shutdown every one of them has done one or the other, or was dropped;
        spans handed later and already exported make this an underestimate, never an
        overestimate, and the next flush catches up)."""
        with self._lock:
            lost = handed - self.exporter.settled - self._accounted
            if lost > 0:
                self._accounted += lost
        if lost > 0:
            count_dropped(lost, reason, self.exporter.on_drop)
        return max(0, lost)

    def force_flush(self, timeout_millis: int | None = None) -> bool:
        """Export what is queued, waiting at most ``timeout_millis`` (default: the shutdown
        timeout); False when the export did not finish in time."""
        seconds = self.shutdown_timeout if timeout_millis is None else timeout_millis / 1000
        handed = self._handed
        outcome: list[bool] = []
        worker = threading.Thread(
            target=lambda: outcome.append(bool(self._processor.force_flush(int(seconds * 1000)))),
            name="tracerag-span-flush",
            daemon=True,
        )
        worker.start()
        worker.join(seconds)
        if worker.is_alive():  # the exporter is retrying a collector that does not answer
            self._stuck = worker
            logger.warning(
                "tracerag: span export did not finish within %.1f s; is the collector reachable?",
                seconds,
            )
            return False
        done = bool(outcome and outcome[0])
        if done:
            self._settle(handed, "queue_full")
        return done

    def shutdown(self) -> None:
        if self._closed:
            return
        self._closed = True
        stuck = self._stuck
        if stuck is not None and stuck.is_alive():
            # a flush already waited in vain for this collector: stop retrying it now
            self.exporter.shutdown()
        worker = threading.Thread(
            target=self._processor.shutdown, name="tracerag-span-shutdown", daemon=True
        )
        worker.start()
        worker.join(self.shutdown_timeout)
        timed_out = worker.is_alive()
        if timed_out:
            # the exporter is still retrying a dead collector: count what is out, stop it
            self.exporter.stop_accounting()
            self._settle(self._handed, "shutdown_timeout")
            try:
                self.exporter.shutdown()
            except Exception:
                logger.debug("tracerag: exporter shutdown failed", exc_info=True)
        else:
            self._settle(self._handed, "queue_full")
        lost = self.exporter.failed + self._accounted
        if lost:
            logger.warning(
                "tracerag: %d spans not exported%s (tracerag.spans.dropped)",
                lost,
                f"; export did not finish within {self.shutdown_timeout:.1f} s at shutdown "
                f"({SHUTDOWN_TIMEOUT_ENV})"
                if timed_out
                else "",
            )


#: A batch processor around an exporter whose batches fit the backend, that counts every span
#: it cannot deliver and whose shutdown is bounded.
batch_processor = TraceragBatchSpanProcessor


# ---------------------------------------------------------------------------------------------
# OTLP exporters


def otlp_protocol(protocol: str | None, signal: str = "TRACES") -> Protocol:
    """``http/protobuf`` or ``grpc``: the argument, else ``OTEL_EXPORTER_OTLP_{signal}_PROTOCOL``
    / ``OTEL_EXPORTER_OTLP_PROTOCOL``, else ``http/protobuf``."""
    value = (
        protocol
        or env_value(f"OTEL_EXPORTER_OTLP_{signal}_PROTOCOL", "OTEL_EXPORTER_OTLP_PROTOCOL")
        or "http/protobuf"
    ).lower()
    if value in {"http", "http/protobuf", "http/proto"}:
        return "http/protobuf"
    if value == "grpc":
        return "grpc"
    raise ConfigurationError(f"unsupported OTLP protocol {value!r}: use 'http/protobuf' or 'grpc'")


def signal_url(endpoint: str, path: str) -> str:
    """An OTLP/HTTP base URL with the signal path (``/v1/traces``) added when it has none."""
    parts = urlsplit(endpoint)
    if parts.path in {"", "/"}:
        return endpoint.rstrip("/") + path
    return endpoint


def otlp_span_exporter(
    endpoint: str | None = None,
    *,
    protocol: Protocol | str | None = None,
    headers: Mapping[str, str] | str | None = None,
    timeout: float | None = None,
) -> SpanExporter:
    """An OTLP span exporter (HTTP or gRPC); unset arguments come from the OTEL_* variables."""
    proto = otlp_protocol(protocol)
    kwargs = otlp_exporter_options(headers, timeout)
    if proto == "grpc":
        from opentelemetry.exporter.otlp.proto.grpc.trace_exporter import (
            OTLPSpanExporter as GrpcExporter,
        )

        return GrpcExporter(endpoint=endpoint, **kwargs)
    from opentelemetry.exporter.otlp.proto.http.trace_exporter import (
        OTLPSpanExporter as HttpExporter,
    )

    if endpoint is not None:
        endpoint = signal_url(endpoint, "/v1/traces")
    return HttpExporter(endpoint=endpoint, **kwargs)


class JsonLinesSpanExporter(SpanExporter):
    """Appends each span as one line of JSON (the SDK's ``to_json`` form) to a file or stream."""

    def __init__(self, target: str | os.PathLike[str] | IO[str]) -> None:
        self._lock = threading.Lock()
        if isinstance(target, (str, os.PathLike)):
            self._stream: IO[str] = Path(target).open("a", encoding="utf-8")  # noqa: SIM115
            self._owned = True
        else:
            self._stream = target
            self._owned = False

    def export(self, spans: Sequence[ReadableSpan]) -> SpanExportResult:
        # to_json(indent=None): the SDK's default indent makes json use its pure-Python encoder
        lines = "".join(
            json.dumps(json.loads(s.to_json(indent=None)), ensure_ascii=False) + "\n" for s in spans
        )
        with self._lock:
            self._stream.write(lines)
            self._stream.flush()
        return SpanExportResult.SUCCESS

    def shutdown(self) -> None:
        if self._owned:
            with self._lock:
                self._stream.close()

    def force_flush(self, timeout_millis: int = 30_000) -> bool:
        return True


# ---------------------------------------------------------------------------------------------
# Metrics to a backend that may take none

METRICS_FIX = (
    "set OTEL_METRICS_EXPORTER=none to stop sending metrics there, or point "
    "OTEL_EXPORTER_OTLP_METRICS_ENDPOINT at a collector that accepts metrics"
)


def metrics_endpoint(endpoint: str | None, protocol: Protocol) -> str:
    """The URL (HTTP) or address (gRPC) OTLP metrics go to, as the exporters resolve it."""
    if endpoint:
        return signal_url(endpoint, "/v1/metrics") if protocol != "grpc" else endpoint
    specific = env_value("OTEL_EXPORTER_OTLP_METRICS_ENDPOINT")
    if specific:
        return specific
    base = env_value("OTEL_EXPORTER_OTLP_ENDPOINT")
    if protocol == "grpc":
        return base or "http://localhost:4317"
    return signal_url(base or "http://localhost:4318", "/v1/metrics")


def probe_metrics_endpoint(
    url: str, protocol: Protocol, headers: Mapping[str, str] | None = None, timeout: float = 3.0
) -> str | None:
    """Whether ``url`` takes OTLP metrics: "ok", or why not ("HTTP 404", "gRPC UNIMPLEMENTED"),
    or None when it cannot tell (unreachable, another error)."""
    if protocol == "grpc":
        return _probe_grpc(url, headers, timeout)
    request = urllib.request.Request(
        url,
        data=b"",
        method="POST",
        headers={"Content-Type": "application/x-protobuf", **dict(headers or {})},
    )
    try:
        with urllib.request.urlopen(request, timeout=timeout) as response:
            return "ok" if 200 <= response.status < 300 else None
    except urllib.error.HTTPError as exc:
        if exc.code in {404, 405, 501}:
            return f"HTTP {exc.code}"
        return "ok" if exc.code == 400 else None  # 400: it parsed our empty request
    except Exception:
        return None


def _probe_grpc(url: str, headers: Mapping[str, str] | None, timeout: float) -> str | None:
    import grpc

    parts = urlsplit(url if "://" in url else f"http://{url}")
    target = parts.netloc or parts.path
    secure = parts.scheme == "https"
    channel = (
        grpc.secure_channel(target, grpc.ssl_channel_credentials())
        if secure
        else grpc.insecure_channel(target)
    )
    try:
        call = channel.unary_unary(
            "/opentelemetry.proto.collector.metrics.v1.MetricsService/Export",
            request_serializer=None,
            response_deserializer=None,
        )
        call(b"", timeout=timeout, metadata=list((headers or {}).items()) or None)
        return "ok"
    except grpc.RpcError as exc:
        code = exc.code() if hasattr(exc, "code") else None
        if code == grpc.StatusCode.UNIMPLEMENTED:
            return "gRPC UNIMPLEMENTED"
        return None
    except Exception:
        return None
    finally:
        channel.close()


_metrics_notice_lock = threading.Lock()
_metrics_notices: set[str] = set()


class MetricsEndpointCheck:
    """Wraps an OTLP metric exporter; stops it, saying so once, when the endpoint takes no
    metrics (see the module docstring)."""

    def __init__(
        self,
        exporter: Any,
        *,
        url: str,
        protocol: Protocol,
        headers: Mapping[str, str] | None = None,
    ) -> None:
        from opentelemetry.sdk.metrics.export import MetricExporter

        self.exporter = exporter
        self.url = url
        self.protocol = protocol
        self.headers = dict(headers or {})
        self.verdict: str | None = None  # "ok", a reason it takes none, or None (not known yet)
        outer = self

        class _Checked(MetricExporter):
            def __init__(self) -> None:
                # the reader asks its exporter for these; they are the wrapped exporter's
                super().__init__(
                    preferred_temporality=getattr(exporter, "_preferred_temporality", None),
                    preferred_aggregation=getattr(exporter, "_preferred_aggregation", None),
                )

            def export(
                self, metrics_data: Any, timeout_millis: float = 10_000, **kwargs: Any
            ) -> Any:
                return outer.export(metrics_data, timeout_millis, **kwargs)

            def force_flush(self, timeout_millis: float = 10_000) -> bool:
                return bool(exporter.force_flush(timeout_millis))

            def shutdown(self, timeout_millis: float = 30_000, **kwargs: Any) -> None:
                exporter.shutdown(timeout_millis=timeout_millis, **kwargs)

        self.checked = _Checked()

    @property
    def stopped(self) -> bool:
        """True once the endpoint said it takes no metrics."""
        return self.verdict not in (None, "ok")

    def export(self, metrics_data: Any, timeout_millis: float = 10_000, **kwargs: Any) -> Any:
        from opentelemetry.sdk.metrics.export import MetricExportResult

        if self.verdict is None:
            self.verdict = probe_metrics_endpoint(self.url, self.protocol, self.headers)
            if self.stopped:
                self._report()
        if self.stopped:
            return MetricExportResult.SUCCESS
        return self.exporter.export(metrics_data, timeout_millis=timeout_millis, **kwargs)

    def _report(self) -> None:
        with _metrics_notice_lock:
            if self.url in _metrics_notices:
                return
            _metrics_notices.add(self.url)
        logger.warning(
            "tracerag: %s does not accept OTLP metrics (%s); it looks like a traces-only "
            "backend such as Jaeger. Metrics export to it is switched off: %s.",
            self.url,
            self.verdict,
            METRICS_FIX,
        )


def forget_metrics_notices() -> None:
    """Let the traces-only notice be logged again (test isolation)."""
    with _metrics_notice_lock:
        _metrics_notices.clear()
