"""Which TracerProvider tracerag's spans go to, decided again for every request.

Order:

1. the ``tracer_provider`` passed to ``get_tracer`` (and so to ``RAGPipeline`` / ``wrap``);
2. the provider made by ``configure(...)``, if the application called it;
3. the global TracerProvider, as installed by the application (``trace.set_tracer_provider``)
   at any time, also after the pipeline was built;
4. while no global provider is installed: a provider built once from the standard environment
   variables (``configure_from_env``): ``OTEL_TRACES_EXPORTER`` (``otlp``, ``console``,
   ``none``), ``OTEL_EXPORTER_OTLP_ENDPOINT`` / ``OTEL_EXPORTER_OTLP_TRACES_ENDPOINT``,
   ``OTEL_EXPORTER_OTLP_(TRACES_)PROTOCOL`` (``http/protobuf`` or ``grpc``),
   ``OTEL_EXPORTER_OTLP_(TRACES_)HEADERS``, ``_TIMEOUT``, ``OTEL_SERVICE_NAME``,
   ``OTEL_RESOURCE_ATTRIBUTES`` and ``OTEL_BSP_*``. When none of them names an exporter, spans
   are still real SDK spans (trace ids exist and appear on every Response) but nothing is
   exported; one warning (logger ``tracerag.tracing``) says so. Once the application installs
   a global provider, the next request goes there.
"""

from __future__ import annotations

import logging
import os
import threading
import weakref
from collections.abc import Mapping, Sequence
from typing import IO, TYPE_CHECKING, Any

from opentelemetry import trace
from opentelemetry.trace import Tracer, TracerProvider

from tracerag._version import __version__
from tracerag.config import Once
from tracerag.telemetry import _content_capture
from tracerag.telemetry._env import env_exporters, env_value
from tracerag.telemetry._instruments import record_spans_dropped
from tracerag.telemetry._lifecycle import (
    default_shutdown_timeout,
    forget_at_exit,
    make_resource,
    shutdown_at_exit,
)

if TYPE_CHECKING:  # types only
    from opentelemetry.sdk.trace import TracerProvider as SDKTracerProvider
    from opentelemetry.sdk.trace.export import SpanExporter

    from tracerag.telemetry._export import Protocol

logger = logging.getLogger("tracerag.tracing")

INSTRUMENTATION_NAME = "tracerag"

_lock = threading.Lock()
_configured: TracerProvider | None = None  # made by configure()
# made from the environment on first need, used while no global provider is installed
_from_env: Once[TracerProvider] = Once(lambda: configure_from_env())
_default_notice_logged = False
_tracers: weakref.WeakKeyDictionary[Any, Tracer] = weakref.WeakKeyDictionary()


def _tracer_of(provider: TracerProvider) -> Tracer:
    try:
        tracer = _tracers.get(provider)
    except TypeError:  # a provider that cannot be weakly referenced
        return provider.get_tracer(INSTRUMENTATION_NAME, __version__)
    if tracer is None:
        tracer = provider.get_tracer(INSTRUMENTATION_NAME, __version__)
        _tracers[provider] = tracer
    return tracer


def current_provider(tracer_provider: TracerProvider | None = None) -> TracerProvider:
    """The provider a request starting now uses (see the module docstring for the order)."""
    if tracer_provider is not None:
        return tracer_provider
    configured = _configured
    if configured is not None:
        return configured
    installed = trace.get_tracer_provider()
    if not isinstance(installed, trace.ProxyTracerProvider):
        return installed
    return _env_provider()


def _env_provider() -> TracerProvider:
    return _from_env.get()


def get_tracer(tracer_provider: TracerProvider | None = None) -> Tracer:
    """The tracer for a request starting now; cheap enough to call for every request."""
    return _tracer_of(current_provider(tracer_provider))


def default_provider() -> TracerProvider | None:
    """The provider tracerag made itself (by ``configure`` or from the env), if any yet."""
    return _configured or _from_env.made


def force_flush(timeout_millis: int | None = None) -> bool:
    """Export what tracerag's own providers still hold, waiting at most ``timeout_millis``
    (default ``TRACERAG_EXPORT_SHUTDOWN_TIMEOUT``, 2 s); True when nothing failed or timed out."""
    millis = int(default_shutdown_timeout() * 1000) if timeout_millis is None else timeout_millis
    ok = True
    for provider in (_configured, _from_env.made):
        if provider is not None and hasattr(provider, "force_flush"):
            ok = bool(provider.force_flush(millis)) and ok
    return ok


def configure_from_env() -> TracerProvider:
    """A TracerProvider built from the standard OTEL_* variables (batch processor per exporter).

    With no exporter named by the environment the provider records spans (so trace ids exist)
    but exports none; this is logged once.
    """
    global _default_notice_logged
    wanted = env_exporters("TRACES")
    if wanted is None:
        if not _default_notice_logged:
            _default_notice_logged = True
            logger.warning(
                "tracerag: no TracerProvider was set and no OTLP endpoint is configured "
                "(OTEL_EXPORTER_OTLP_ENDPOINT); spans get trace ids but are not exported. "
                "Call tracerag.tracing.configure(endpoint=...) or set the OTEL_* variables."
            )
        return _build_provider([])
    unknown = [n for n in wanted if n not in {"otlp", "console", "none"}]
    if unknown:
        logger.warning("tracerag: unsupported OTEL_TRACES_EXPORTER value(s) %s ignored", unknown)
    from tracerag.telemetry._export import otlp_span_exporter  # the SDK: making a provider

    exporters = [otlp_span_exporter()] if "otlp" in wanted else []
    provider = _build_provider(exporters + _local_exporters(console="console" in wanted))
    if "otlp" in wanted:
        logger.info(
            "tracerag: no TracerProvider was set; exporting spans over OTLP as the OTEL_* "
            "variables say (until the application installs its own)"
        )
    return provider


def configure(
    endpoint: str | None = None,
    *,
    protocol: Protocol | str | None = None,
    headers: Mapping[str, str] | str | None = None,
    service_name: str | None = None,
    resource_attributes: Mapping[str, Any] | None = None,
    console: bool = False,
    file: str | os.PathLike[str] | IO[str] | None = None,
    otlp: bool | None = None,
    timeout: float | None = None,
    max_queue_size: int | None = None,
    schedule_delay_millis: float | None = None,
    max_batch_bytes: int | None = None,
    shutdown_timeout: float | None = None,
    set_global: bool = False,
) -> SDKTracerProvider:
    """Make (and use from now on) a TracerProvider exporting tracerag's spans.

    ``endpoint``: OTLP endpoint; for ``http/protobuf`` a base URL (``http://host:4318``, the
    ``/v1/traces`` path is added) or a full URL with a path, for ``grpc`` ``http://host:4317``.
    Anything left as None falls back to the ``OTEL_*`` variables. ``headers`` as a mapping or
    the ``k=v,k2=v2`` form. ``console`` prints spans to stderr; ``file`` appends one JSON span
    per line to a path or text stream. ``otlp`` defaults to True unless only ``console`` or
    ``file`` was asked for. ``timeout`` is the per-export timeout in seconds.
    ``max_batch_bytes`` caps one export request (default 3 MiB); ``shutdown_timeout`` bounds
    the wait for exports at shutdown (default 2 s). ``set_global`` also installs the provider
    as the OpenTelemetry global one.
    """
    global _configured
    if otlp is None:
        otlp = (
            endpoint is not None
            or env_value("OTEL_EXPORTER_OTLP_TRACES_ENDPOINT", "OTEL_EXPORTER_OTLP_ENDPOINT")
            is not None
            or not (console or file is not None)
        )
    from tracerag.telemetry._export import otlp_span_exporter  # the SDK: making a provider

    exporters = (
        [otlp_span_exporter(endpoint, protocol=protocol, headers=headers, timeout=timeout)]
        if otlp
        else []
    )
    provider = _build_provider(
        exporters + _local_exporters(console=console, file=file),
        make_resource(service_name, resource_attributes),
        max_queue_size=max_queue_size,
        schedule_delay_millis=schedule_delay_millis,
        max_batch_bytes=max_batch_bytes,
        shutdown_timeout=shutdown_timeout,
    )
    with _lock:
        _configured = provider
    if set_global:
        trace.set_tracer_provider(provider)
    return provider


def reset() -> None:
    """Shut down and forget tracerag's own TracerProviders (test isolation)."""
    global _configured, _default_notice_logged
    with _lock:
        providers = [p for p in (_configured, _from_env.reset()) if p is not None]
        _configured = None
    for provider in providers:
        forget_at_exit(provider)
        if hasattr(provider, "shutdown"):
            provider.shutdown()
    _default_notice_logged = False


def reset_for_tests() -> None:
    """Shut down and forget tracerag's own TracerProviders and capture settings."""
    reset()
    _content_capture.reset()
    from tracerag.telemetry._export import forget_metrics_notices  # the SDK: tests make providers

    forget_metrics_notices()


def _local_exporters(
    *, console: bool = False, file: str | os.PathLike[str] | IO[str] | None = None
) -> list[SpanExporter]:
    from tracerag.telemetry._export import JsonLinesSpanExporter  # the SDK: making a provider

    exporters: list[SpanExporter] = []
    if console:
        from opentelemetry.sdk.trace.export import ConsoleSpanExporter

        exporters.append(ConsoleSpanExporter())
    if file is not None:
        exporters.append(JsonLinesSpanExporter(file))
    return exporters


def _build_provider(
    exporters: Sequence[SpanExporter], resource: Any = None, **batch_options: Any
) -> SDKTracerProvider:
    """A provider sending spans to each of ``exporters`` through tracerag's batch processor."""
    from opentelemetry.sdk.trace import TracerProvider as SDKTracerProvider

    from tracerag.telemetry._export import batch_processor  # the SDK: making a provider

    provider = SDKTracerProvider(
        resource=resource if resource is not None else make_resource(),
        shutdown_on_exit=False,  # shut down with tracerag's other providers, bounded
    )
    shutdown_at_exit(provider)
    for exporter in exporters:
        provider.add_span_processor(
            batch_processor(exporter, on_drop=record_spans_dropped, **batch_options)
        )
    return provider
