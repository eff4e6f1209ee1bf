"""``gen_ai.evaluation.result``: as a span event, and as a log record when logs are configured.

Every evaluation (each verify signal, and the request's verdict) is an event on the span of what
it evaluates: the default every trace backend shows. The OpenTelemetry project moves events to
log records correlated with their span (OTEP 4430); when the application has configured a
LoggerProvider (``opentelemetry._logs.set_logger_provider``), the same evaluation is also
emitted as a log record with ``event_name`` ``gen_ai.evaluation.result``, in the span's context
(its trace and span ids). The provider is the one in force at call time, looked up through the
API: tracerag never installs one. No log record is emitted while none is configured.
"""

from __future__ import annotations

import logging
import time

from opentelemetry import _logs, trace
from opentelemetry._logs import SeverityNumber
from opentelemetry.trace import Span
from opentelemetry.util.types import AttributeValue

from tracerag import _semconv as semconv
from tracerag._version import __version__

__all__ = ["evaluation", "logs_configured"]

logger = logging.getLogger("tracerag.tracing")

#: the API's stand-ins for "no LoggerProvider configured"
_UNCONFIGURED = (_logs.NoOpLoggerProvider, _logs._internal.ProxyLoggerProvider)


def logs_configured() -> bool:
    """Whether the application has configured a LoggerProvider (checked at each call)."""
    return not isinstance(_logs.get_logger_provider(), _UNCONFIGURED)


def evaluation(
    span: Span, name: str, score: float | None, label: str, explanation: str | None
) -> None:
    """One ``gen_ai.evaluation.result`` on ``span`` (and as a log record when logs are set up).

    ``score`` None (a request that was not scored, tier low) leaves the score value out.
    """
    attrs: dict[str, AttributeValue] = {
        semconv.GENAI_EVALUATION_NAME: name,
        semconv.GENAI_EVALUATION_SCORE_LABEL: label,
    }
    if score is not None:
        attrs[semconv.GENAI_EVALUATION_SCORE_VALUE] = float(score)
    if explanation:
        attrs[semconv.GENAI_EVALUATION_EXPLANATION] = explanation
    span.add_event(semconv.GENAI_EVALUATION_EVENT, attrs)
    provider = _logs.get_logger_provider()
    if isinstance(provider, _UNCONFIGURED):
        return
    try:
        provider.get_logger(semconv.INSTRUMENTATION_NAME, __version__).emit(
            timestamp=time.time_ns(),
            context=trace.set_span_in_context(span),
            severity_number=SeverityNumber.INFO,
            event_name=semconv.GENAI_EVALUATION_EVENT,
            attributes=attrs,
        )
    except Exception:  # telemetry never fails a request
        logger.exception("tracerag: could not emit the %s log record", name)
