"""What every tracerag telemetry provider is made and ended with: its resource, its exporters'
options, and a shutdown at exit that waits a bounded time.

A leaf: the exporters (``_export``), the meters (``_meters``) and the providers (``_providers``)
all use it, and it imports none of them.
"""

from __future__ import annotations

import atexit
import inspect
import logging
import threading
import time
import weakref
from collections.abc import Mapping
from typing import Any
from urllib.parse import unquote

from tracerag.config import get_config

__all__ = [
    "DEFAULT_MAX_BATCH_BYTES",
    "DEFAULT_SERVICE_NAME",
    "DEFAULT_SHUTDOWN_TIMEOUT",
    "MAX_BATCH_BYTES_ENV",
    "SHUTDOWN_TIMEOUT_ENV",
    "default_max_batch_bytes",
    "default_shutdown_timeout",
    "forget_at_exit",
    "make_resource",
    "otlp_exporter_options",
    "parse_headers",
    "shutdown_at_exit",
    "shutdown_providers",
]

logger = logging.getLogger("tracerag.tracing")

#: ``service.name`` of tracerag's providers when neither the caller nor the environment names one.
DEFAULT_SERVICE_NAME = "tracerag"

MAX_BATCH_BYTES_ENV = "TRACERAG_OTLP_MAX_BATCH_BYTES"
SHUTDOWN_TIMEOUT_ENV = "TRACERAG_EXPORT_SHUTDOWN_TIMEOUT"
_CONFIG_FIELD = {
    MAX_BATCH_BYTES_ENV: "otlp_max_batch_bytes",
    SHUTDOWN_TIMEOUT_ENV: "export_shutdown_timeout",
}
DEFAULT_MAX_BATCH_BYTES = 3 * 1024 * 1024
DEFAULT_SHUTDOWN_TIMEOUT = 2.0


def _env_number(name: str, default: float) -> float:
    value = (getattr(get_config(), _CONFIG_FIELD[name]) or "").strip()
    if not value:
        return default
    try:
        number = float(value)
    except ValueError:
        logger.warning("tracerag: %s=%r is not a number; using %s", name, value, default)
        return default
    return number if number > 0 else default


def default_max_batch_bytes() -> int:
    """The export batch size limit in bytes (``TRACERAG_OTLP_MAX_BATCH_BYTES``, default 3 MiB)."""
    return int(_env_number(MAX_BATCH_BYTES_ENV, DEFAULT_MAX_BATCH_BYTES))


def default_shutdown_timeout() -> float:
    """Seconds shutdown waits for exports (``TRACERAG_EXPORT_SHUTDOWN_TIMEOUT``, default 2)."""
    return _env_number(SHUTDOWN_TIMEOUT_ENV, DEFAULT_SHUTDOWN_TIMEOUT)


# ---------------------------------------------------------------------------------------------
# Exit: tracerag's own providers shut down together, within one bounded wait

_exit_lock = threading.Lock()
_exit_providers: weakref.WeakSet[Any] = weakref.WeakSet()
_exit_registered = False


def shutdown_at_exit(provider: Any) -> None:
    """Shut ``provider`` down when the process exits, together with tracerag's other
    providers, waiting at most ``TRACERAG_EXPORT_SHUTDOWN_TIMEOUT`` seconds for all of them."""
    global _exit_registered
    with _exit_lock:
        _exit_providers.add(provider)
        if not _exit_registered:
            atexit.register(shutdown_providers)
            _exit_registered = True


def forget_at_exit(provider: Any) -> None:
    """Take back ``shutdown_at_exit`` for a provider that was shut down already."""
    with _exit_lock:
        _exit_providers.discard(provider)


def shutdown_providers(timeout: float | None = None) -> None:
    """Shut down every provider registered with ``shutdown_at_exit``, in parallel, waiting at
    most ``timeout`` seconds (default ``TRACERAG_EXPORT_SHUTDOWN_TIMEOUT``); never raises."""
    seconds = timeout if timeout is not None else default_shutdown_timeout()
    with _exit_lock:
        providers = list(_exit_providers)
        _exit_providers.clear()
    workers = [
        threading.Thread(
            target=_shutdown_one, args=(p, seconds), name="tracerag-shutdown", daemon=True
        )
        for p in providers
    ]
    for worker in workers:
        worker.start()
    deadline = time.monotonic() + seconds + 0.25
    for worker in workers:
        worker.join(max(0.0, deadline - time.monotonic()))


def _shutdown_one(provider: Any, seconds: float) -> None:
    try:
        if "timeout_millis" in inspect.signature(provider.shutdown).parameters:
            provider.shutdown(timeout_millis=seconds * 1000)  # a MeterProvider
        else:
            provider.shutdown()  # a TracerProvider: tracerag's processors bound themselves
    except Exception as exc:
        logger.warning("tracerag: telemetry shutdown did not finish in %.1f s: %s", seconds, exc)


def parse_headers(headers: Mapping[str, str] | str | None) -> dict[str, str] | None:
    """Headers from a mapping or the ``k=v,k2=v2`` form (values URL-decoded)."""
    if headers is None:
        return None
    if isinstance(headers, str):
        out: dict[str, str] = {}
        for part in headers.split(","):
            if "=" in part:
                key, value = part.split("=", 1)
                out[unquote(key.strip()).lower()] = unquote(value.strip())
        return out
    return {str(k): str(v) for k, v in headers.items()}


def otlp_exporter_options(
    headers: Mapping[str, str] | str | None, timeout: float | None
) -> dict[str, Any]:
    """The keyword arguments an OTLP exporter takes for the given headers and timeout."""
    kwargs: dict[str, Any] = {}
    parsed = parse_headers(headers)
    if parsed is not None:
        kwargs["headers"] = parsed
    if timeout is not None:
        kwargs["timeout"] = timeout
    return kwargs


def make_resource(
    service_name: str | None = None, attributes: Mapping[str, Any] | None = None
) -> Any:
    """The SDK Resource for tracerag's providers: OTEL_RESOURCE_ATTRIBUTES, OTEL_SERVICE_NAME,
    then the given values; ``service.name`` falls back to ``tracerag``."""
    from opentelemetry.sdk.resources import SERVICE_NAME, Resource

    attrs: dict[str, Any] = dict(attributes or {})
    if service_name:
        attrs[SERVICE_NAME] = service_name
    resource = Resource.create(attrs)
    name = str(resource.attributes.get(SERVICE_NAME, ""))
    if not name or name.startswith("unknown_service"):
        resource = resource.merge(Resource({SERVICE_NAME: DEFAULT_SERVICE_NAME}))
    return resource
