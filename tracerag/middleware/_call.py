"""What the server gives one request the middleware answers (``_served``), for its run."""

from __future__ import annotations

import contextvars
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from tracerag._runner import SETTINGS_SINK
from tracerag.events import StageListener

__all__ = ["CALL_HOOKS", "CallHooks"]


@dataclass(frozen=True)
class CallHooks:
    """What the server gives one request: its id, its record sink and its stage listener, and,
    on a resume, the candidate the desk read from the request's record."""

    request_id: str | None = None
    record_sink: Any = SETTINGS_SINK
    on_stage: StageListener | None = None
    approved: Mapping[str, str] | None = None  # request_id -> candidate


#: The hooks of the request being served (read by the middleware's run).
CALL_HOOKS: contextvars.ContextVar[CallHooks | None] = contextvars.ContextVar(
    "tracerag_middleware_call", default=None
)
