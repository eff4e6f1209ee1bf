"""Where tracerag's spans go, and how much content they carry.

``get_tracer`` uses the TracerProvider the user passed or installed globally; when there is none
it configures one from the standard ``OTEL_*`` environment variables (OTLP, batch processor).
``capture`` applies the content-capture policy to any prompt, answer or material text before it
becomes a span attribute.
"""

from __future__ import annotations

import os
import threading
from collections.abc import Callable

from opentelemetry import trace
from opentelemetry.trace import Tracer, TracerProvider

from tracerag import __version__

INSTRUMENTATION_NAME = "tracerag"
CAPTURE_ENV = "TRACERAG_CAPTURE_CONTENT"  # "true" (default) | "false" | "redact"

_lock = threading.Lock()
_configured: TracerProvider | None = None
_redactor: Callable[[str], str] | None = None


def _user_provider() -> TracerProvider | None:
    provider = trace.get_tracer_provider()
    if (
        isinstance(provider, trace.ProxyTracerProvider)
        or type(provider).__name__ == "NoOpTracerProvider"
    ):
        return None
    return provider


def configure_from_env() -> TracerProvider:
    """A TracerProvider built from OTEL_* variables (OTLP over HTTP or gRPC, batch processor)."""
    from opentelemetry.sdk.resources import Resource
    from opentelemetry.sdk.trace import TracerProvider as SDKTracerProvider
    from opentelemetry.sdk.trace.export import BatchSpanProcessor

    resource = Resource.create({"service.name": os.environ.get("OTEL_SERVICE_NAME", "tracerag")})
    provider = SDKTracerProvider(resource=resource)
    protocol = os.environ.get(
        "OTEL_EXPORTER_OTLP_TRACES_PROTOCOL",
        os.environ.get("OTEL_EXPORTER_OTLP_PROTOCOL", "http/protobuf"),
    )
    if protocol == "grpc":
        from opentelemetry.exporter.otlp.proto.grpc.trace_exporter import OTLPSpanExporter
    else:
        from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter
    provider.add_span_processor(BatchSpanProcessor(OTLPSpanExporter()))
    return provider


def get_tracer(tracer_provider: TracerProvider | None = None) -> Tracer:
    """The tracer tracerag's spans are made with."""
    global _configured
    provider = tracer_provider or _user_provider()
    if provider is None:
        with _lock:
            if _configured is None:
                _configured = configure_from_env()
            provider = _configured
    return provider.get_tracer(INSTRUMENTATION_NAME, __version__)


def set_redactor(redactor: Callable[[str], str] | None) -> None:
    """Install a function applied to all captured text (e.g. to mask personal data)."""
    global _redactor
    _redactor = redactor


def capture(text: str | None) -> str | None:
    """Text as it may appear on a span under the capture policy, or None when it is omitted."""
    if text is None:
        return None
    policy = os.environ.get(CAPTURE_ENV, "true").strip().lower()
    if policy in {"false", "0", "no", "off", "omit"}:
        return None
    if _redactor is not None:
        text = _redactor(text)
    return text
