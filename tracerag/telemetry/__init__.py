"""tracerag's OpenTelemetry side, one concern per module.

- ``providers``: which TracerProvider a request's spans go to (decided per request), and the
  providers tracerag builds from ``configure()`` or the ``OTEL_*`` variables;
- ``export``: OTLP exporters, export batches that fit the backend, lost-span accounting, bounded
  shutdown, metrics that stop at a traces-only backend;
- ``capture``: the content-capture policy (read once), redaction and length caps;
- ``spans``: OpenInference attribute helpers for stage spans;
- ``links``: URLs that open a trace in Jaeger, Grafana Tempo or Phoenix;
- ``phoenix``: evaluations as Phoenix span annotations;
- ``meters``: which MeterProvider a measurement goes to, and the ones tracerag builds
  (``configure_metrics``, Prometheus endpoint, environment);
- ``instruments``: the metric instruments and what a request records into them.

``tracerag.tracing`` and ``tracerag.metrics`` re-export the public names.
"""
