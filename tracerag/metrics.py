"""Quality and health metrics of tracerag, through the OpenTelemetry metrics API.

MeterProvider choice, in order, decided at every measurement:

1. the ``meter_provider`` passed to a ``record_*`` function (``RAGPipeline(meter_provider=...)``);
2. the provider tracerag made on request: ``configure_metrics(...)`` or
   ``start_prometheus_server(port)``;
3. a MeterProvider the application installed globally (``metrics.set_meter_provider``), also
   when it did so after the pipeline was built;
4. while none is installed, one built once from the environment: ``TRACERAG_PROMETHEUS_PORT``
   (and ``TRACERAG_PROMETHEUS_ADDR``, default ``127.0.0.1``) serves ``/metrics`` for
   Prometheus; ``OTEL_METRICS_EXPORTER`` (``otlp``, ``prometheus``, ``console``, ``none``) and
   ``OTEL_EXPORTER_OTLP_(METRICS_)ENDPOINT`` export over OTLP, like traces. Before its first
   OTLP export tracerag asks the endpoint whether it takes metrics: a traces-only backend
   (Jaeger) is reported once, with the fix, and metrics export to it stops;
5. otherwise the API's global provider, a no-op until the application installs one.

Providers tracerag builds shut down at exit within ``TRACERAG_EXPORT_SHUTDOWN_TIMEOUT``
seconds (default 2), together with its TracerProviders.

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
- ``tracerag.spans.dropped`` {reason} → ``tracerag_spans_dropped_total``;
- while a material registry is open (``tracerag.materials.metrics``): ``tracerag.materials``
  {status}, ``tracerag.materials.pending_writes``, ``.conflicts``, ``.quarantined`` and
  ``.credibility`` {bucket} → ``tracerag_materials``, ``tracerag_materials_pending_writes``,
  ``tracerag_materials_conflicts``, ``tracerag_materials_quarantined``,
  ``tracerag_materials_credibility``.

Histograms carry explicit bucket boundaries as advisory parameters, so any SDK MeterProvider
uses them without extra Views. Recording never raises into a request.
"""

from __future__ import annotations

from tracerag.telemetry import _meters
from tracerag.telemetry._instruments import (
    RATIO_BUCKETS,
    REQUEST_SECONDS_BUCKETS,
    SAMPLES_BUCKETS,
    STAGE_SECONDS_BUCKETS,
    TOKENS_PER_REQUEST_BUCKETS,
    RequestOutcome,
    record_audit_backlog,
    record_audit_failure,
    record_model_error,
    record_request,
    record_retry,
    record_spans_dropped,
    record_usage,
)
from tracerag.telemetry._meters import (
    INSTRUMENTATION_NAME,
    PROMETHEUS_ADDR_ENV,
    PROMETHEUS_PORT_ENV,
    PrometheusServer,
    configure_metrics,
    configure_metrics_from_env,
    get_meter,
    get_meter_provider,
    prometheus_servers,
    shutdown_bounded,
    start_prometheus_server,
)


def reset_for_tests() -> None:
    """Forget tracerag's own MeterProvider and stop its endpoints (test isolation)."""
    _meters.reset()


__all__ = [
    "INSTRUMENTATION_NAME",
    "PROMETHEUS_ADDR_ENV",
    "PROMETHEUS_PORT_ENV",
    "RATIO_BUCKETS",
    "REQUEST_SECONDS_BUCKETS",
    "SAMPLES_BUCKETS",
    "STAGE_SECONDS_BUCKETS",
    "TOKENS_PER_REQUEST_BUCKETS",
    "PrometheusServer",
    "RequestOutcome",
    "configure_metrics",
    "configure_metrics_from_env",
    "get_meter",
    "get_meter_provider",
    "prometheus_servers",
    "record_audit_backlog",
    "record_audit_failure",
    "record_model_error",
    "record_request",
    "record_retry",
    "record_spans_dropped",
    "record_usage",
    "reset_for_tests",
    "shutdown_bounded",
    "start_prometheus_server",
]
