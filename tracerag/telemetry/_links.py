"""Links that open one trace in a trace UI (Jaeger, Grafana Tempo, Phoenix)."""

from __future__ import annotations

import json
import re
from typing import Literal
from urllib.parse import quote

from tracerag.config import get_config
from tracerag.errors import ConfigurationError, InputError

Backend = Literal["jaeger", "tempo", "phoenix"]
DEFAULT_BASE_URLS = {
    "jaeger": "http://localhost:16686",
    "tempo": "http://localhost:3000",
    "phoenix": "http://localhost:6006",
}


def format_trace_id(trace_id: str | int) -> str:
    """A trace id as 32 lower-case hex digits."""
    if isinstance(trace_id, int):
        return f"{trace_id:032x}"
    value = trace_id.strip().lower()
    value = value.removeprefix("0x")
    if not re.fullmatch(r"[0-9a-f]{1,32}", value):
        raise InputError(f"not a trace id: {trace_id!r}")
    return value.rjust(32, "0")


def trace_link(
    trace_id: str | int,
    backend: Backend | str = "jaeger",
    base_url: str | None = None,
    *,
    datasource_uid: str = "tempo",
    org_id: int = 1,
    time_range: tuple[str, str] = ("now-1h", "now"),
    project: str | None = None,
) -> str:
    """A URL that opens one trace in a trace UI.

    - ``jaeger``: ``{base}/trace/{trace_id}`` (base default ``http://localhost:16686``);
    - ``tempo``: Grafana Explore on the Tempo datasource ``datasource_uid`` with the trace id
      as the TraceQL query (``{base}/explore?schemaVersion=1&panes=...&orgId=1``; base default
      ``http://localhost:3000``);
    - ``phoenix``: ``{base}/redirects/traces/{trace_id}`` (Phoenix finds the project; base
      default ``http://localhost:6006``), or ``{base}/projects/{project}/traces/{trace_id}``
      when the Phoenix ``project`` id is given.
    """
    tid = format_trace_id(trace_id)
    backend = backend.lower()
    if backend not in DEFAULT_BASE_URLS:
        raise ConfigurationError(f"unknown trace backend {backend!r}: jaeger, tempo or phoenix")
    base = (base_url or DEFAULT_BASE_URLS[backend]).rstrip("/")
    if backend == "jaeger":
        return f"{base}/trace/{tid}"
    if backend == "phoenix":
        if project:
            return f"{base}/projects/{quote(project, safe='')}/traces/{tid}"
        return f"{base}/redirects/traces/{tid}"
    panes = {
        "t": {
            "datasource": datasource_uid,
            "queries": [
                {
                    "refId": "A",
                    "datasource": {"type": "tempo", "uid": datasource_uid},
                    "queryType": "traceql",
                    "limit": 20,
                    "query": tid,
                }
            ],
            "range": {"from": time_range[0], "to": time_range[1]},
        }
    }
    encoded = quote(json.dumps(panes, separators=(",", ":")), safe="")
    return f"{base}/explore?schemaVersion=1&panes={encoded}&orgId={org_id}"


TRACE_UI_ENV = "TRACERAG_TRACE_UI"


def configured_trace_ui() -> tuple[str, str | None] | None:
    """``(backend, base_url)`` from ``TRACERAG_TRACE_UI`` (``jaeger``,
    ``jaeger=http://127.0.0.1:16686``, ``tempo=http://grafana:3000``, ``phoenix=...``), or None
    when it is unset."""
    value = (get_config().trace_ui or "").strip()
    if not value:
        return None
    backend, _, base = value.partition("=")
    backend = backend.strip().lower()
    if backend not in DEFAULT_BASE_URLS:
        raise ConfigurationError(f"{TRACE_UI_ENV}={value!r}: start with jaeger, tempo or phoenix")
    return backend, base.strip() or None


def trace_ui_link(trace_id: str | int | None) -> str | None:
    """The link to ``trace_id`` in the trace UI named by ``TRACERAG_TRACE_UI``, or None."""
    ui = configured_trace_ui()
    if ui is None or not trace_id:
        return None
    return trace_link(trace_id, ui[0], ui[1])
