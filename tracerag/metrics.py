"""tracerag's quality and health metrics: set-up for applications.

Which MeterProvider the measurements go to and the instruments a request records are described
on the traces page of the documentation.
"""

from __future__ import annotations

from tracerag.telemetry._meters import configure_metrics, start_prometheus_server

__all__ = ["configure_metrics", "start_prometheus_server"]
