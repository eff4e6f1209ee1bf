"""Where tracerag's spans go, how much content they carry, and how to open them in a trace UI.

Provider choice (decided for every request, so a provider installed after the pipeline was
built receives every span):

1. the ``tracer_provider`` passed to ``get_tracer`` (and so to ``RAGPipeline``);
2. the provider made by ``configure(...)``, if the application called it;
3. a TracerProvider the application installed globally (``trace.set_tracer_provider``);
4. while none is installed, a provider built once from the standard environment variables
   (``configure_from_env``): ``OTEL_TRACES_EXPORTER`` (``otlp``, ``console``, ``none``),
   ``OTEL_EXPORTER_OTLP_ENDPOINT`` / ``OTEL_EXPORTER_OTLP_TRACES_ENDPOINT``,
   ``OTEL_EXPORTER_OTLP_(TRACES_)PROTOCOL`` (``http/protobuf`` or ``grpc``),
   ``OTEL_EXPORTER_OTLP_(TRACES_)HEADERS``, ``_TIMEOUT``, ``OTEL_SERVICE_NAME``,
   ``OTEL_RESOURCE_ATTRIBUTES`` and ``OTEL_BSP_*``. When none of them names an exporter, spans
   are still real SDK spans (trace ids exist and appear on every Response) but nothing is
   exported; one warning (logger ``tracerag.tracing``) says so.

Every exporter tracerag sets up sits behind ``batch_processor``: a slow or unreachable
collector never delays a request, export requests stay under ``TRACERAG_OTLP_MAX_BATCH_BYTES``
(default 3 MiB, below the 4 MiB gRPC limit of Jaeger and the Collector), shutdown waits at most
``TRACERAG_EXPORT_SHUTDOWN_TIMEOUT`` seconds (default 2), and spans that could not be
delivered are counted: ``dropped_spans()`` in process and the ``tracerag.spans.dropped``
metric.

Content capture (``TRACERAG_CAPTURE_CONTENT`` or ``set_capture_content``): ``true`` keeps prompt,
answer and material text on spans, ``false`` omits it, ``redact`` masks personal data with the
redactor (``set_redactor``; ``default_redactor`` when none is set). Captured text is cut to
``TRACERAG_CAPTURE_MAX_CHARS`` (default 8192, or ``OTEL_ATTRIBUTE_VALUE_LENGTH_LIMIT`` when
lower) and marked ``…[truncated N chars]``. Ids, scores and verdicts are never affected.
The policy is read once, not per attribute.
"""

from __future__ import annotations

from tracerag.telemetry import _content_capture as _capture
from tracerag.telemetry import _providers
from tracerag.telemetry._content_capture import (
    CAPTURE_ENV,
    DEFAULT_MAX_CHARS,
    MAX_CHARS_ENV,
    REDACTION_PATTERNS,
    CaptureMode,
    CapturePolicy,
    capture,
    capture_content_mode,
    capture_enabled,
    default_redactor,
    set_capture_content,
    set_capture_max_chars,
    set_redactor,
)
from tracerag.telemetry._export import (
    MAX_BATCH_BYTES_ENV,
    SHUTDOWN_TIMEOUT_ENV,
    JsonLinesSpanExporter,
    Protocol,
    TraceragBatchSpanProcessor,
    TraceragSpanExporter,
    batch_processor,
    dropped_spans,
    otlp_span_exporter,
)
from tracerag.telemetry._links import (
    DEFAULT_BASE_URLS,
    TRACE_UI_ENV,
    Backend,
    format_trace_id,
    trace_link,
    trace_ui_link,
)
from tracerag.telemetry._phoenix import PhoenixEvaluationExporter, phoenix_evaluations
from tracerag.telemetry._providers import (
    DEFAULT_SERVICE_NAME,
    INSTRUMENTATION_NAME,
    configure,
    configure_from_env,
    current_provider,
    default_provider,
    force_flush,
    get_tracer,
    make_resource,
)
from tracerag.telemetry._spans import (
    MODEL_SPAN_KIND,
    set_prompt_template,
    set_span_io,
    set_span_metadata,
)


def reset_for_tests() -> None:
    """Shut down and forget tracerag's own TracerProviders and capture settings."""
    _providers.reset()
    _capture.reset()
    from tracerag.telemetry._export import forget_metrics_notices

    forget_metrics_notices()


__all__ = [
    "CAPTURE_ENV",
    "DEFAULT_BASE_URLS",
    "DEFAULT_MAX_CHARS",
    "DEFAULT_SERVICE_NAME",
    "INSTRUMENTATION_NAME",
    "MAX_BATCH_BYTES_ENV",
    "MAX_CHARS_ENV",
    "MODEL_SPAN_KIND",
    "REDACTION_PATTERNS",
    "SHUTDOWN_TIMEOUT_ENV",
    "TRACE_UI_ENV",
    "Backend",
    "CaptureMode",
    "CapturePolicy",
    "JsonLinesSpanExporter",
    "PhoenixEvaluationExporter",
    "Protocol",
    "TraceragBatchSpanProcessor",
    "TraceragSpanExporter",
    "batch_processor",
    "capture",
    "capture_content_mode",
    "capture_enabled",
    "configure",
    "configure_from_env",
    "current_provider",
    "default_provider",
    "default_redactor",
    "dropped_spans",
    "force_flush",
    "format_trace_id",
    "get_tracer",
    "make_resource",
    "otlp_span_exporter",
    "phoenix_evaluations",
    "reset_for_tests",
    "set_capture_content",
    "set_capture_max_chars",
    "set_prompt_template",
    "set_redactor",
    "set_span_io",
    "set_span_metadata",
    "trace_link",
    "trace_ui_link",
]
