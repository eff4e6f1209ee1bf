"""Where tracerag's spans go and how much content they carry: set-up for applications.

Which provider a request's spans go to, the exporters, content capture and trace links are
described on the traces page of the documentation.
"""

from __future__ import annotations

from tracerag.telemetry._content_capture import (
    default_redactor,
    set_capture_content,
    set_redactor,
)
from tracerag.telemetry._export import dropped_spans
from tracerag.telemetry._links import trace_link
from tracerag.telemetry._phoenix import phoenix_evaluations
from tracerag.telemetry._providers import configure, force_flush

__all__ = [
    "configure",
    "default_redactor",
    "dropped_spans",
    "force_flush",
    "phoenix_evaluations",
    "set_capture_content",
    "set_redactor",
    "trace_link",
]
