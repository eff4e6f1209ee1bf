"""The state of one request: its input and the typed, immutable output of each stage.

Each stage reads the ``RequestState`` built so far and returns its own output; the runner puts
that output into a new state, and no stage changes what an earlier one produced. ``_input``
reads the request, ``_outputs`` holds the stages' outputs, ``_response`` the Decision and the
Response it builds, ``_record`` the whole state and its audit record.
"""

from __future__ import annotations

from tracerag._state._input import (
    INPUT_KEYS,
    MAX_EARLIER_TURNS,
    Conversation,
    ConversationSource,
    RequestInput,
    parse_input,
)
from tracerag._state._outputs import (
    ErrorLog,
    PlanResult,
    Registration,
    Retrieval,
    RunVersions,
    Sample,
    SampleSet,
    Selection,
    StageError,
    StageRefusal,
    Verification,
)
from tracerag._state._record import RECORD_LAYOUT, RECORD_VERSION, RequestState
from tracerag._state._response import Decision

__all__ = [
    "INPUT_KEYS",
    "MAX_EARLIER_TURNS",
    "RECORD_LAYOUT",
    "RECORD_VERSION",
    "Conversation",
    "ConversationSource",
    "Decision",
    "ErrorLog",
    "PlanResult",
    "Registration",
    "RequestInput",
    "RequestState",
    "Retrieval",
    "RunVersions",
    "Sample",
    "SampleSet",
    "Selection",
    "StageError",
    "StageRefusal",
    "Verification",
    "parse_input",
]
