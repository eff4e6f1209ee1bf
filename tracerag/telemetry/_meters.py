"""Which MeterProvider tracerag's measurements go to, and the providers tracerag builds
(``configure_metrics``, ``start_prometheus_server``, the environment). See ``tracerag.metrics``
for the order."""

from __future__ import annotations

import logging
import os
import threading
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from opentelemetry import metrics as otel_metrics
from opentelemetry.metrics import Meter, MeterProvider

from tracerag.config import get_config

try:
    from opentelemetry.metrics._internal import _ProxyMeterProvider as _ApiProxy
except ImportError:  # pragma: no cover - an API without the placeholder class
    _ApiProxy = None  # type: ignore[assignment,misc]

from tracerag._version import __version__
from tracerag.errors import MissingDependencyError
from tracerag.telemetry._env import env_exporters
from tracerag.telemetry._lifecycle import (
    default_shutdown_timeout,
    forget_at_exit,
    make_resource,
    otlp_exporter_options,
    parse_headers,
    shutdown_at_exit,
)

logger = logging.getLogger("tracerag.metrics")

INSTRUMENTATION_NAME = "tracerag"
PROMETHEUS_PORT_ENV = "TRACERAG_PROMETHEUS_PORT"
PROMETHEUS_ADDR_ENV = "TRACERAG_PROMETHEUS_ADDR"

_lock = threading.Lock()
_configured: MeterProvider | None = None
_from_env: MeterProvider | None = None
_env_checked = False
_prometheus_servers: list[PrometheusServer] = []


# ---------------------------------------------------------------------------------------------
# Provider selection


def _installed_provider() -> MeterProvider | None:
    """The global MeterProvider the application installed, or None while none is."""
    provider = otel_metrics.get_meter_provider()
    # the metrics API has no public proxy type: its own placeholder class, imported, not named
    if _ApiProxy is not None and isinstance(provider, _ApiProxy):
        return None
    return provider


def get_meter_provider(meter_provider: MeterProvider | None = None) -> MeterProvider:
    """The MeterProvider a measurement made now is recorded into (see the module docstring).

    Decided at every call, so a provider the application installs after the pipeline was built
    receives every later measurement. The first call builds the provider the environment asks
    for (e.g. starts the Prometheus endpoint); it is used while no global provider is installed.
    """
    global _from_env, _env_checked
    if meter_provider is not None:
        return meter_provider
    if _configured is not None:
        return _configured
    if not _env_checked:
        with _lock:
            if not _env_checked:
                _from_env = configure_metrics_from_env()
                _env_checked = True
    installed = _installed_provider()
    if installed is not None:
        return installed
    return _from_env or otel_metrics.get_meter_provider()


def get_meter(meter_provider: MeterProvider | None = None) -> Meter:
    """The meter tracerag's instruments are made with."""
    return get_meter_provider(meter_provider).get_meter(INSTRUMENTATION_NAME, __version__)


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
        raise MissingDependencyError(
            "the Prometheus endpoint needs opentelemetry-exporter-prometheus "
            '(from the tracerag source tree: pip install ".[prometheus]")'
        ) from exc
    registry = CollectorRegistry()
    reader = PrometheusMetricReader(registry=registry)
    httpd, thread = start_http_server(port, addr=addr, registry=registry)
    return reader, httpd, thread


@dataclass(frozen=True)
class _OtlpMetrics:
    """Where and how to export metrics over OTLP (None: from the ``OTEL_*`` variables)."""

    endpoint: str | None = None
    protocol: str | None = None
    headers: Mapping[str, str] | str | None = None
    export_interval_millis: float | None = None
    timeout: float | None = None


def _otlp_metric_reader(options: _OtlpMetrics) -> Any:
    from opentelemetry.sdk.metrics.export import PeriodicExportingMetricReader

    from tracerag.telemetry._export import (  # imports the SDK: only making a provider does
        MetricsEndpointCheck,
        metrics_endpoint,
        otlp_protocol,
        signal_url,
    )

    endpoint = options.endpoint
    proto = otlp_protocol(options.protocol, "METRICS")
    kwargs = otlp_exporter_options(options.headers, options.timeout)
    if proto == "grpc":
        from opentelemetry.exporter.otlp.proto.grpc.metric_exporter import OTLPMetricExporter

        exporter: Any = OTLPMetricExporter(endpoint=endpoint, **kwargs)
    else:
        from opentelemetry.exporter.otlp.proto.http.metric_exporter import (
            OTLPMetricExporter as HttpMetricExporter,
        )

        if endpoint is not None:
            endpoint = signal_url(endpoint, "/v1/metrics")
        exporter = HttpMetricExporter(endpoint=endpoint, **kwargs)
    probe_headers = kwargs.get("headers") or parse_headers(
        os.environ.get("OTEL_EXPORTER_OTLP_METRICS_HEADERS")
        or os.environ.get("OTEL_EXPORTER_OTLP_HEADERS")
    )
    check = MetricsEndpointCheck(
        exporter,
        url=metrics_endpoint(endpoint, proto),
        protocol=proto,
        headers=probe_headers,
    )
    return PeriodicExportingMetricReader(
        check.checked, export_interval_millis=options.export_interval_millis
    )


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
        otlp=(
            _OtlpMetrics(endpoint, protocol, headers, export_interval_millis, timeout)
            if otlp or endpoint is not None
            else None
        ),
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
    otlp: _OtlpMetrics | None = None,
    console: bool = False,
    readers: Sequence[Any] = (),
    service_name: str | None = None,
    resource_attributes: Mapping[str, Any] | None = None,
) -> tuple[MeterProvider, PrometheusServer | None]:
    from opentelemetry.sdk.metrics import MeterProvider as SDKMeterProvider

    all_readers: list[Any] = list(readers)
    server_parts = None
    if prometheus_port is not None:
        server_parts = _prometheus_reader_and_server(prometheus_port, prometheus_addr)
        all_readers.append(server_parts[0])
    if otlp is not None:
        all_readers.append(_otlp_metric_reader(otlp))
    if console:
        from opentelemetry.sdk.metrics.export import (
            ConsoleMetricExporter,
            PeriodicExportingMetricReader,
        )

        all_readers.append(PeriodicExportingMetricReader(ConsoleMetricExporter()))
    provider = SDKMeterProvider(
        metric_readers=all_readers,
        resource=make_resource(service_name, resource_attributes),
        shutdown_on_exit=False,  # shut down at exit with a bounded wait instead
    )
    shutdown_at_exit(provider)
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


def shutdown_bounded(provider: Any, timeout: float | None = None) -> None:
    """Shut down a MeterProvider, waiting for its last export at most ``timeout`` seconds
    (default ``TRACERAG_EXPORT_SHUTDOWN_TIMEOUT``, 2 s); never raises."""
    forget_at_exit(provider)
    seconds = timeout if timeout is not None else default_shutdown_timeout()
    try:
        provider.shutdown(timeout_millis=seconds * 1000)
    except Exception as exc:
        logger.warning("tracerag: metrics shutdown did not finish in %.1f s: %s", seconds, exc)


def start_prometheus_server(port: int, addr: str = "127.0.0.1") -> PrometheusServer:
    """Serve tracerag's metrics at ``http://{addr}:{port}/metrics`` (port 0: a free port).

    Makes tracerag's MeterProvider (keeping an OTLP metrics export the env asks for). A
    MeterProvider passed to ``record_*`` or ``RAGPipeline`` bypasses it: add a
    ``PrometheusMetricReader`` to that provider instead.
    """
    global _configured
    env_otlp = env_exporters("METRICS") or []
    provider, server = _build_meter_provider(
        prometheus_port=port,
        prometheus_addr=addr,
        otlp=_OtlpMetrics() if "otlp" in env_otlp else None,
    )
    assert server is not None
    with _lock:
        _configured = provider
    return server


def prometheus_servers() -> list[PrometheusServer]:
    """The ``/metrics`` endpoints this process serves."""
    return list(_prometheus_servers)


def configure_metrics_from_env() -> MeterProvider | None:
    """A MeterProvider from ``TRACERAG_PROMETHEUS_PORT`` and the ``OTEL_*`` variables, or None
    when they ask for no metrics export."""
    wanted = env_exporters("METRICS") or []
    port_text = (get_config().prometheus_port or "").strip()
    prometheus_port: int | None = None
    prometheus_addr = (get_config().prometheus_addr or "").strip() or "127.0.0.1"
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
            otlp=_OtlpMetrics() if otlp else None,
            console=console,
        )
    except Exception:
        logger.warning("tracerag: could not set up metrics from the environment", exc_info=True)
        return None
    return provider


def reset() -> None:
    """Forget tracerag's own MeterProvider and stop its endpoints (test isolation)."""
    global _configured, _from_env, _env_checked
    for server in list(_prometheus_servers):
        server.shutdown()
    with _lock:
        for provider in (_configured, _from_env):
            if provider is not None and hasattr(provider, "shutdown"):
                shutdown_bounded(provider)
        _configured = None
        _from_env = None
        _env_checked = False
