"""What a request tells while it runs: a ``StageEvent`` after each stage, for listeners.

``RAGPipeline.arun(..., on_stage=listener)`` (and ``wrap()``'s) calls the listener with a
``StageEvent`` after each stage, skipped ones included; the server streams them. Every
LangChain surface (``astream_events`` included) sends the same events to the caller's callback
handlers as custom events: ``STAGE_EVENT`` after each stage, with ``StageEvent.to_dict()`` as
its data, and ``ANSWER_EVENT`` once an answer is verified and released (routes pass and
review), with ``answer_data()``. A withheld answer's text is never sent.
"""

from __future__ import annotations

import inspect
import logging
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Any

from tracerag._choices import Route, Stage
from tracerag._declare import stream_signals
from tracerag._state import RequestState

__all__ = ["ANSWER_EVENT", "STAGE_EVENT", "StageEvent", "StageListener"]

logger = logging.getLogger("tracerag")

#: The custom event (``on_custom_event``, ``astream_events`` v2) sent after each stage; its data
#: is ``StageEvent.to_dict()``: the stage, the request and trace ids, timing and key signals.
STAGE_EVENT = "tracerag.stage"
#: The custom event that carries a released answer's text (routes pass and review), sent once
#: it is verified and routed: ``{request_id, trace_id, decision, status, confidence, text}``.
ANSWER_EVENT = "tracerag.answer"


@dataclass(frozen=True)
class StageEvent:
    """What a listener hears after each stage, skipped ones included."""

    stage: Stage
    skipped: bool
    duration_s: float | None
    state: RequestState

    @property
    def request_id(self) -> str:
        return self.state.request_id

    @property
    def trace_id(self) -> str | None:
        return self.state.trace_id

    @property
    def output(self) -> Any:
        """The stage's typed output (None when it was skipped)."""
        return self.state.output(self.stage)

    def signals(self) -> dict[str, Any]:
        """The stage's key signals, JSON-able (empty when it was skipped): those its output
        declares for the stream (``SIGNALS``, ``stream=``)."""
        output = None if self.skipped else self.output
        return stream_signals(output) if output is not None else {}

    def to_dict(self) -> dict[str, Any]:
        """The event as a stream sends it: stage, ids, skipped, duration and signals."""
        return {
            "stage": str(self.stage),
            "request_id": self.request_id,
            "trace_id": self.trace_id,
            "skipped": self.skipped,
            "duration_s": self.duration_s,
            "signals": self.signals(),
        }


#: Called with each ``StageEvent``; may be async. What it raises is logged, never re-raised.
StageListener = Callable[[StageEvent], "Awaitable[None] | None"]


async def tell(listener: StageListener, event: StageEvent) -> None:
    """Hand an event to a listener (awaited when async); what it raises is logged only."""
    try:
        result = listener(event)
        if inspect.isawaitable(result):
            await result
    except Exception:
        logger.exception("tracerag: on_stage listener failed after %s", event.stage)


def released_answer(state: RequestState) -> str | None:
    """The answer's text when the route releases it (pass, review), else None."""
    decision = state.decision
    if decision is None or decision.decision not in (Route.PASS, Route.REVIEW):
        return None
    return decision.answer


def answer_data(state: RequestState) -> dict[str, Any] | None:
    """The ``ANSWER_EVENT`` data of a finished request; None when no answer is released."""
    text = released_answer(state)
    decision = state.decision
    if text is None or decision is None:
        return None
    return {
        "request_id": state.request_id,
        "trace_id": state.trace_id,
        "decision": str(decision.decision),
        "status": decision.status,
        "confidence": decision.confidence,
        "text": text,
    }
