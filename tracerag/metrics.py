"""Quality and health metrics of tracerag, through the OpenTelemetry metrics API.

MeterProvider choice, in order:

1. the ``meter_provider`` passed to a ``record_*`` function (``RAGPipeline(meter_provider=...)``);
2. the provider tracerag made on request: ``configure_metrics(...)`` or
   ``start_prometheus_server(port)``;
3. a MeterProvider the application installed globally (``metrics.set_meter_provider``);
4. one built once from the environment: ``TRACERAG_PROMETHEUS_PORT`` (and
   ``TRACERAG_PROMETHEUS_ADDR``, default ``127.0.0.1``) serves ``/metrics`` for Prometheus;
   ``OTEL_METRICS_EXPORTER`` (``otlp``, ``prometheus``, ``console``, ``none``) and
   ``OTEL_EXPORTER_OTLP_(METRICS_)ENDPOINT`` export over OTLP, like traces;
5. otherwise the API's global provider, a no-op until the application installs one.

Instruments (OpenTelemetry name → Prometheus name when exposed by the Prometheus exporter or
by the Collector's prometheus exporter):

- ``tracerag.requests`` {decision, tier} → ``tracerag_requests_total``; escalation and review
  rates are ratios of it (``decision="escalate"`` / ``"review"`` over all);
- ``tracerag.confidence`` {decision, tier} → ``tracerag_confidence_bucket|_sum|_count``;
- ``tracerag.request.duration`` {decision, tier}, seconds → ``tracerag_request_duration_seconds_*``;
- ``tracerag.stage.duration`` {stage, tier}, seconds → ``tracerag_stage_duration_seconds_*``;
- ``tracerag.samples`` {tier} → ``tracerag_samples_*`` (samples per request);
- ``tracerag.citation.coverage`` / ``tracerag.citation.accuracy`` {tier} →
  ``tracerag_citation_coverage_*`` / ``tracerag_citation_accuracy_*``;
- ``tracerag.citations.fabricated`` {tier} → ``tracerag_citations_fabricated_total``;
- ``tracerag.model.retries`` / ``tracerag.model.errors`` {stage, error_type} →
  ``tracerag_model_retries_total`` / ``tracerag_model_errors_total``;
- ``tracerag.audit.persist_failures`` {reason} and ``tracerag.audit.dropped`` {reason} →
  ``tracerag_audit_persist_failures_total`` / ``tracerag_audit_dropped_total``;
- ``tracerag.audit.backlog`` (up-down) → ``tracerag_audit_backlog``: records accepted by an
  audit writer and not yet stored;
- ``tracerag.spans.dropped`` {reason} → ``tracerag_spans_dropped_total``.

Histograms carry explicit bucket boundaries as advisory parameters, so any SDK MeterProvider
uses them without extra Views. Recording never raises into a request.
"""

from __future__ import annotations

import logging
import math
import os
import threading
import weakref
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any
from urllib.parse import urlsplit

from opentelemetry import metrics as otel_metrics
from opentelemetry.metrics import Meter, MeterProvider

from tracerag import __version__, semconv
from tracerag.context import RequestContext

logger = logging.getLogger(__name__)

INSTRUMENTATION_NAME = "tracerag"
PROMETHEUS_PORT_ENV = "TRACERAG_PROMETHEUS_PORT"
PROMETHEUS_ADDR_ENV = "TRACERAG_PROMETHEUS_ADDR"

RATIO_BUCKETS: tuple[float, ...] = (
    0.1,
    0.2,
    0.3,
    0.4,
    0.5,
    0.6,
    0.7,
    0.8,
    0.85,
    0.9,
    0.95,
    1.0,
)
STAGE_SECONDS_BUCKETS: tuple[float, ...] = (
    0.005,
    0.01,
    0.025,
    0.05,
    0.1,
    0.25,
    0.5,
    1.0,
    2.5,
    5.0,
    10.0,
    20.0,
    30.0,
)
REQUEST_SECONDS_BUCKETS: tuple[float, ...] = (
    0.005,
    0.01,
    0.025,
    0.05,
    0.1,
    0.25,
    0.5,
    1.0,
    2.5,
    5.0,
    10.0,
    20.0,
    30.0,
    60.0,
    120.0,
)
SAMPLES_BUCKETS: tuple[float, ...] = (0, 1, 2, 3, 4, 5, 6, 8, 10, 15, 20)

_lock = threading.Lock()
_configured: MeterProvider | None = None
_from_env: MeterProvider | None = None
_env_checked = False
_prometheus_servers: list[PrometheusServer] = []


# ---------------------------------------------------------------------------------------------
# Provider selection and instruments


def _user_global_provider() -> MeterProvider | None:
    provider = otel_metrics.get_meter_provider()
    name = type(provider).__name__
    if name in {"_ProxyMeterProvider", "NoOpMeterProvider"}:
        return None
    return provider


def get_meter_provider(meter_provider: MeterProvider | None = None) -> MeterProvider:
    """The MeterProvider tracerag records into (see the module docstring for the order).

    Calling it early (e.g. when a pipeline is built) starts an endpoint asked for by the env.
    """
    global _from_env, _env_checked
    if meter_provider is not None:
        return meter_provider
    if _configured is not None:
        return _configured
    user = _user_global_provider()
    if user is not None:
        return user
    with _lock:
        if not _env_checked:
            _env_checked = True
            _from_env = configure_metrics_from_env()
    return _from_env or otel_metrics.get_meter_provider()


def get_meter(meter_provider: MeterProvider | None = None) -> Meter:
    """The meter tracerag's instruments are made with."""
    return get_meter_provider(meter_provider).get_meter(INSTRUMENTATION_NAME, __version__)


@dataclass
class _Instruments:
    requests: Any
    confidence: Any
    request_duration: Any
    stage_duration: Any
    samples: Any
    coverage: Any
    accuracy: Any
    fabricated: Any
    retries: Any
    model_errors: Any
    audit_failures: Any
    audit_dropped: Any
    audit_backlog: Any
    spans_dropped: Any


def _histogram(
    meter: Meter, name: str, unit: str, description: str, buckets: Sequence[float]
) -> Any:
    try:
        return meter.create_histogram(
            name,
            unit=unit,
            description=description,
            explicit_bucket_boundaries_advisory=list(buckets),
        )
    except TypeError:  # an API without advisory parameters
        return meter.create_histogram(name, unit=unit, description=description)


def _make_instruments(meter: Meter) -> _Instruments:
    return _Instruments(
        requests=meter.create_counter(
            semconv.METRIC_REQUESTS,
            unit="{request}",
            description="Requests answered, by routing decision and tier",
        ),
        confidence=_histogram(
            meter,
            semconv.METRIC_CONFIDENCE,
            "1",
            "Confidence of answered requests",
            RATIO_BUCKETS,
        ),
        request_duration=_histogram(
            meter,
            semconv.METRIC_REQUEST_DURATION,
            "s",
            "Whole-request duration",
            REQUEST_SECONDS_BUCKETS,
        ),
        stage_duration=_histogram(
            meter,
            semconv.METRIC_STAGE_DURATION,
            "s",
            "Duration of each pipeline stage",
            STAGE_SECONDS_BUCKETS,
        ),
        samples=_histogram(
            meter,
            semconv.METRIC_SAMPLES,
            "{sample}",
            "Samples drawn per request",
            SAMPLES_BUCKETS,
        ),
        coverage=_histogram(
            meter,
            semconv.METRIC_CITATION_COVERAGE,
            "1",
            "Share of answer claims carrying a citation",
            RATIO_BUCKETS,
        ),
        accuracy=_histogram(
            meter,
            semconv.METRIC_CITATION_ACCURACY,
            "1",
            "Share of citations supported by the cited material",
            RATIO_BUCKETS,
        ),
        fabricated=meter.create_counter(
            semconv.METRIC_FABRICATED,
            unit="{citation}",
            description="Citations of material that was not retrieved",
        ),
        retries=meter.create_counter(
            semconv.METRIC_RETRIES,
            unit="{retry}",
            description="Model call retries, by stage and error type",
        ),
        model_errors=meter.create_counter(
            semconv.METRIC_MODEL_ERRORS,
            unit="{error}",
            description="Model calls that failed after retries, by stage and error type",
        ),
        audit_failures=meter.create_counter(
            semconv.METRIC_AUDIT_FAILURES,
            unit="{failure}",
            description="Failed attempts to persist an audit record",
        ),
        audit_dropped=meter.create_counter(
            semconv.METRIC_AUDIT_DROPPED,
            unit="{record}",
            description="Audit records given up on",
        ),
        audit_backlog=meter.create_up_down_counter(
            semconv.METRIC_AUDIT_BACKLOG,
            unit="{record}",
            description="Audit records accepted and not yet stored",
        ),
        spans_dropped=meter.create_counter(
            semconv.METRIC_SPANS_DROPPED,
            unit="{span}",
            description="Spans that could not be exported (failed export, full queue, shutdown)",
        ),
    )


_instrument_cache: weakref.WeakKeyDictionary[Any, _Instruments] = weakref.WeakKeyDictionary()


def _instruments(meter_provider: MeterProvider | None) -> _Instruments:
    provider = get_meter_provider(meter_provider)
    with _lock:
        found = _instrument_cache.get(provider)
        if found is None:
            found = _make_instruments(provider.get_meter(INSTRUMENTATION_NAME, __version__))
            _instrument_cache[provider] = found
    return found


# ---------------------------------------------------------------------------------------------
# What the pipeline records


def _label(value: Any, default: str = "none") -> str:
    if value is None:
        return default
    value = getattr(value, "value", value)  # enums
    text = str(value).strip()
    return text or default


def _ratio(value: Any) -> float | None:
    if isinstance(value, bool) or value is None:
        return None
    try:
        number = float(value)
    except (TypeError, ValueError):
        return None
    if math.isnan(number) or math.isinf(number):
        return None
    return min(1.0, max(0.0, number))


def _field(obj: Any, name: str) -> Any:
    if obj is None:
        return None
    if isinstance(obj, Mapping):
        return obj.get(name)
    return getattr(obj, name, None)


def _error_type(error: BaseException | str | None) -> str:
    if error is None:
        return "none"
    if isinstance(error, BaseException):
        return type(error).__name__
    return str(error) or "error"


def record_request(ctx: RequestContext, *, meter_provider: MeterProvider | None = None) -> None:
    """Record one finished request: decision, confidence, durations, samples and citations."""
    try:
        inst = _instruments(meter_provider)
        tier = _label(getattr(ctx, "tier", None))
        decision = _label(getattr(ctx, "decision", None))
        attrs = {semconv.METRIC_ATTR_DECISION: decision, semconv.METRIC_ATTR_TIER: tier}
        tier_only = {semconv.METRIC_ATTR_TIER: tier}
        inst.requests.add(1, attrs)
        confidence = _ratio(getattr(ctx, "confidence", None))
        if confidence is not None:
            inst.confidence.record(confidence, attrs)
        timings = getattr(ctx, "timings", None) or {}
        for stage, seconds in dict(timings).items():
            try:
                value = float(seconds)
            except (TypeError, ValueError):
                continue
            if math.isnan(value) or value < 0:
                continue
            if stage == "request":
                inst.request_duration.record(value, attrs)
            else:
                inst.stage_duration.record(
                    value, {semconv.METRIC_ATTR_STAGE: str(stage), semconv.METRIC_ATTR_TIER: tier}
                )
        samples = getattr(ctx, "samples", None)
        if samples is not None:
            inst.samples.record(len(samples), tier_only)
        signals = getattr(ctx, "signals", None) or {}
        citations = signals.get("citations") if isinstance(signals, Mapping) else None
        if citations is not None:
            coverage = _ratio(_field(citations, "coverage"))
            if coverage is not None:
                inst.coverage.record(coverage, tier_only)
            accuracy = _ratio(_field(citations, "accuracy"))
            if accuracy is not None:
                inst.accuracy.record(accuracy, tier_only)
            fabricated = _field(citations, "fabricated")
            count = 0
            if isinstance(fabricated, (int, float)) and not isinstance(fabricated, bool):
                count = int(fabricated)
            elif fabricated is not None:
                try:
                    count = len(fabricated)
                except TypeError:
                    count = 0
            inst.fabricated.add(max(0, count), tier_only)
    except Exception:
        logger.warning("tracerag: could not record request metrics", exc_info=True)


def record_retry(
    stage: str, error: BaseException, *, meter_provider: MeterProvider | None = None
) -> None:
    """Count one retried model call in ``stage``."""
    try:
        _instruments(meter_provider).retries.add(
            1,
            {
                semconv.METRIC_ATTR_STAGE: _label(stage),
                semconv.METRIC_ATTR_ERROR_TYPE: _error_type(error),
            },
        )
    except Exception:
        logger.warning("tracerag: could not record a retry", exc_info=True)


def record_model_error(
    stage: str, error: BaseException, *, meter_provider: MeterProvider | None = None
) -> None:
    """Count one model call in ``stage`` that failed for good."""
    try:
        _instruments(meter_provider).model_errors.add(
            1,
            {
                semconv.METRIC_ATTR_STAGE: _label(stage),
                semconv.METRIC_ATTR_ERROR_TYPE: _error_type(error),
            },
        )
    except Exception:
        logger.warning("tracerag: could not record a model error", exc_info=True)


def record_audit_failure(
    reason: str, dropped: bool = False, *, meter_provider: MeterProvider | None = None
) -> None:
    """Count a failed audit persist; ``dropped`` when the record was given up on."""
    try:
        inst = _instruments(meter_provider)
        attrs = {semconv.METRIC_ATTR_REASON: _label(reason, "unknown")}
        inst.audit_failures.add(1, attrs)
        if dropped:
            inst.audit_dropped.add(1, attrs)
    except Exception:
        logger.warning("tracerag: could not record an audit failure", exc_info=True)


def record_audit_backlog(
    delta: int, *, meter_provider: MeterProvider | None = None
) -> None:
    """Move the audit backlog by ``delta`` records (accepted: +1, stored or given up: -1)."""
    try:
        _instruments(meter_provider).audit_backlog.add(delta)
    except Exception:
        logger.warning("tracerag: could not record the audit backlog", exc_info=True)


def record_spans_dropped(
    count: int, reason: str, *, meter_provider: MeterProvider | None = None
) -> None:
    """Count spans that could not be exported (reason: export_failed, queue_full, shutdown)."""
    if count <= 0:
        return
    try:
        _instruments(meter_provider).spans_dropped.add(
            count, {semconv.METRIC_ATTR_REASON: _label(reason, "unknown")}
        )
    except Exception:
        logger.debug("tracerag: could not record dropped spans", exc_info=True)


# ---------------------------------------------------------------------------------------------
# Making a MeterProvider


@dataclass
class PrometheusServer:
    """A running ``/metrics`` endpoint for Prometheus to scrape."""

    addr: str
    port: int
    meter_provider: MeterProvider
    _httpd: Any = field(repr=False, default=None)
    _thread: Any = field(repr=False, default=None)

    @property
    def url(self) -> str:
        """The scrape URL."""
        host = f"[{self.addr}]" if ":" in self.addr else self.addr
        return f"http://{host}:{self.port}/metrics"

    def shutdown(self) -> None:
        """Stop serving (the MeterProvider keeps recording)."""
        if self._httpd is not None:
            self._httpd.shutdown()
            self._httpd.server_close()
            self._httpd = None
        if self in _prometheus_servers:
            _prometheus_servers.remove(self)


def _prometheus_reader_and_server(port: int, addr: str) -> tuple[Any, Any, Any]:
    try:
        from opentelemetry.exporter.prometheus import PrometheusMetricReader
        from prometheus_client import CollectorRegistry, start_http_server
    except ImportError as exc:  # pragma: no cover - depends on the optional extra
        raise RuntimeError(
            "the Prometheus endpoint needs opentelemetry-exporter-prometheus "
            "(pip install 'tracerag[prometheus]')"
        ) from exc
    registry = CollectorRegistry()
    reader = PrometheusMetricReader(registry=registry)
    httpd, thread = start_http_server(port, addr=addr, registry=registry)
    return reader, httpd, thread


def _otlp_metric_reader(
    endpoint: str | None,
    protocol: str | None,
    headers: Mapping[str, str] | str | None,
    export_interval_millis: float | None,
    timeout: float | None,
) -> Any:
    from opentelemetry.sdk.metrics.export import PeriodicExportingMetricReader

    from tracerag.tracing import _parse_headers  # one header syntax for both signals

    proto = (
        (
            protocol
            or os.environ.get("OTEL_EXPORTER_OTLP_METRICS_PROTOCOL")
            or os.environ.get("OTEL_EXPORTER_OTLP_PROTOCOL")
            or "http/protobuf"
        )
        .strip()
        .lower()
    )
    kwargs: dict[str, Any] = {}
    parsed = _parse_headers(headers)
    if parsed is not None:
        kwargs["headers"] = parsed
    if timeout is not None:
        kwargs["timeout"] = timeout
    if proto == "grpc":
        from opentelemetry.exporter.otlp.proto.grpc.metric_exporter import OTLPMetricExporter

        exporter: Any = OTLPMetricExporter(endpoint=endpoint, **kwargs)
    elif proto in {"http", "http/protobuf", "http/proto"}:
        from opentelemetry.exporter.otlp.proto.http.metric_exporter import (
            OTLPMetricExporter as HttpMetricExporter,
        )

        if endpoint is not None and urlsplit(endpoint).path in {"", "/"}:
            endpoint = endpoint.rstrip("/") + "/v1/metrics"
        exporter = HttpMetricExporter(endpoint=endpoint, **kwargs)
    else:
        raise ValueError(f"unsupported OTLP protocol {proto!r}: use 'http/protobuf' or 'grpc'")
    return PeriodicExportingMetricReader(exporter, export_interval_millis=export_interval_millis)


def configure_metrics(
    *,
    prometheus_port: int | None = None,
    prometheus_addr: str = "127.0.0.1",
    otlp: bool = False,
    endpoint: str | None = None,
    protocol: str | None = None,
    headers: Mapping[str, str] | str | None = None,
    export_interval_millis: float | None = None,
    timeout: float | None = None,
    console: bool = False,
    readers: Sequence[Any] = (),
    service_name: str | None = None,
    resource_attributes: Mapping[str, Any] | None = None,
    set_global: bool = False,
) -> MeterProvider:
    """Make (and use from now on) an SDK MeterProvider for tracerag's metrics.

    ``prometheus_port`` serves ``/metrics`` on ``prometheus_addr`` (0 picks a free port; see
    ``prometheus_servers()``). ``otlp`` (or an ``endpoint``) exports over OTLP, unset values from
    the ``OTEL_*`` variables. ``console`` prints metrics; ``readers`` adds readers of your own.
    """
    global _configured
    provider, _ = _build_meter_provider(
        prometheus_port=prometheus_port,
        prometheus_addr=prometheus_addr,
        otlp=otlp or endpoint is not None,
        endpoint=endpoint,
        protocol=protocol,
        headers=headers,
        export_interval_millis=export_interval_millis,
        timeout=timeout,
        console=console,
        readers=readers,
        service_name=service_name,
        resource_attributes=resource_attributes,
    )
    with _lock:
        _configured = provider
    if set_global:
        otel_metrics.set_meter_provider(provider)
    return provider


def _build_meter_provider(
    *,
    prometheus_port: int | None = None,
    prometheus_addr: str = "127.0.0.1",
    otlp: bool = False,
    endpoint: str | None = None,
    protocol: str | None = None,
    headers: Mapping[str, str] | str | None = None,
    export_interval_millis: float | None = None,
    timeout: float | None = None,
    console: bool = False,
    readers: Sequence[Any] = (),
    service_name: str | None = None,
    resource_attributes: Mapping[str, Any] | None = None,
) -> tuple[MeterProvider, PrometheusServer | None]:
    from opentelemetry.sdk.metrics import MeterProvider as SDKMeterProvider

    from tracerag.tracing import make_resource

    all_readers: list[Any] = list(readers)
    server_parts = None
    if prometheus_port is not None:
        server_parts = _prometheus_reader_and_server(prometheus_port, prometheus_addr)
        all_readers.append(server_parts[0])
    if otlp:
        all_readers.append(
            _otlp_metric_reader(endpoint, protocol, headers, export_interval_millis, timeout)
        )
    if console:
        from opentelemetry.sdk.metrics.export import (
            ConsoleMetricExporter,
            PeriodicExportingMetricReader,
        )

        all_readers.append(PeriodicExportingMetricReader(ConsoleMetricExporter()))
    provider = SDKMeterProvider(
        metric_readers=all_readers, resource=make_resource(service_name, resource_attributes)
    )
    server = None
    if server_parts is not None:
        _, httpd, thread = server_parts
        server = PrometheusServer(
            addr=prometheus_addr,
            port=int(httpd.server_port),
            meter_provider=provider,
            _httpd=httpd,
            _thread=thread,
        )
        _prometheus_servers.append(server)
        logger.info("tracerag: metrics for Prometheus at %s", server.url)
    return provider, server


def start_prometheus_server(port: int, addr: str = "127.0.0.1") -> PrometheusServer:
    """Serve tracerag's metrics at ``http://{addr}:{port}/metrics`` (port 0: a free port).

    Makes tracerag's MeterProvider (keeping an OTLP metrics export the env asks for). A
    MeterProvider passed to ``record_*`` or ``RAGPipeline`` bypasses it: add a
    ``PrometheusMetricReader`` to that provider instead.
    """
    global _configured
    env_otlp = _env_metric_exporters() or []
    provider, server = _build_meter_provider(
        prometheus_port=port,
        prometheus_addr=addr,
        otlp="otlp" in env_otlp,
    )
    assert server is not None
    with _lock:
        _configured = provider
    return server


def prometheus_servers() -> list[PrometheusServer]:
    """The ``/metrics`` endpoints this process serves."""
    return list(_prometheus_servers)


def _env_metric_exporters() -> list[str] | None:
    names = os.environ.get("OTEL_METRICS_EXPORTER", "").strip()
    if names:
        return [n.strip().lower() for n in names.split(",") if n.strip()]
    if (
        os.environ.get("OTEL_EXPORTER_OTLP_METRICS_ENDPOINT", "").strip()
        or os.environ.get("OTEL_EXPORTER_OTLP_ENDPOINT", "").strip()
    ):
        return ["otlp"]
    return None


def configure_metrics_from_env() -> MeterProvider | None:
    """A MeterProvider from ``TRACERAG_PROMETHEUS_PORT`` and the ``OTEL_*`` variables, or None
    when they ask for no metrics export."""
    wanted = _env_metric_exporters() or []
    port_text = os.environ.get(PROMETHEUS_PORT_ENV, "").strip()
    prometheus_port: int | None = None
    prometheus_addr = os.environ.get(PROMETHEUS_ADDR_ENV, "").strip() or "127.0.0.1"
    if port_text:
        try:
            prometheus_port = int(port_text)
        except ValueError:
            logger.warning("tracerag: %s=%r is not a port", PROMETHEUS_PORT_ENV, port_text)
    elif "prometheus" in wanted:
        prometheus_port = int(os.environ.get("OTEL_EXPORTER_PROMETHEUS_PORT", "9464"))
        prometheus_addr = os.environ.get("OTEL_EXPORTER_PROMETHEUS_HOST", "127.0.0.1")
    otlp = "otlp" in wanted
    console = "console" in wanted
    if prometheus_port is None and not otlp and not console:
        return None
    try:
        provider, _ = _build_meter_provider(
            prometheus_port=prometheus_port,
            prometheus_addr=prometheus_addr,
            otlp=otlp,
            console=console,
        )
    except Exception:
        logger.warning("tracerag: could not set up metrics from the environment", exc_info=True)
        return None
    return provider


def reset_for_tests() -> None:
    """Forget tracerag's own MeterProvider and stop its endpoints (test isolation)."""
    global _configured, _from_env, _env_checked
    for server in list(_prometheus_servers):
        server.shutdown()
    with _lock:
        for provider in (_configured, _from_env):
            if provider is not None and hasattr(provider, "shutdown"):
                try:
                    provider.shutdown()
                except Exception:
                    logger.debug("shutdown failed", exc_info=True)
        _configured = None
        _from_env = None
        _env_checked = False
