"""The assemble stage's output, ``Decision``, and what it builds from the request: the caller's
``Response`` and the response part of the audit record.

The route, the confidence and the ticket are decided here; a withheld answer's text never
reaches the Response.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, ClassVar

from tracerag import _semconv as semconv
from tracerag._choices import Route, Tier
from tracerag._declare import (
    OMIT,
    Signal,
)
from tracerag.contract import Response
from tracerag.telemetry._content_capture import capture

if TYPE_CHECKING:
    from tracerag._routing import Ticket
    from tracerag._state._record import RequestState
    from tracerag.contract import ClaimCheck, Evidence, MaterialUse, SignalDetail
    from tracerag.contract import Versions as ResponseVersions
    from tracerag.signals._attribution import Attribution
from tracerag._state._outputs import StageError

__all__ = [
    "Decision",
]


def _meta_versions(s: RequestState) -> dict[str, Any]:
    versions = s.versions
    return {"prompt": versions.prompt, "model": versions.model, "tracerag": versions.tracerag}


def _response_record(s: RequestState) -> dict[str, Any]:
    decision = s.decision
    assert decision is not None
    return decision.response_record(s.request_id, s.trace_id)


@dataclass(frozen=True)
class Decision:
    """Stage 6: the confidence, the route and everything the Response will say."""

    decision: Route
    status: str
    tier: Tier
    confidence: float | None
    answer: str | None
    signal_detail: SignalDetail
    evidence: tuple[Evidence, ...]
    claims: tuple[ClaimCheck, ...]
    versions: ResponseVersions
    ticket_id: str | None = None
    calibration: str | None = None
    warnings: tuple[str, ...] = ()
    errors: tuple[StageError, ...] = ()
    #: the compact per-material summary the Response carries (no material text)
    materials: tuple[MaterialUse, ...] = ()
    #: tiers 1 and 2 of attribution, as the audit record keeps them (``signals.attribution``)
    attribution: Mapping[str, Any] | None = None
    #: the ticket for people (escalate, review), handed on once the record's fate is known
    ticket: Ticket | None = None
    #: why the route is not the confidence's own (a clustered retrieval, conflicting citations)
    route_reason: str | None = None
    #: the attribution the record's ``attribution`` was made from
    attributed: Attribution | None = field(default=None, compare=False, repr=False)

    #: the route's span and root attributes are set once the Response is made (see
    #: ``RequestState.root_attributes``)
    SIGNALS: ClassVar[tuple[Signal, ...]] = (
        Signal(
            lambda d: d.confidence,
            span=semconv.CONFIDENCE,
            stream="confidence",
            record="confidence",
            metric="confidence",
            root=semconv.CONFIDENCE,
            meta="confidence",
        ),
        Signal(
            lambda d: d.decision,
            span=semconv.DECISION,
            stream="decision",
            record="decision",
            metric="decision",
            root=semconv.DECISION,
            meta="decision",
        ),
        Signal(lambda d: d.status, span=semconv.STATUS, root=semconv.STATUS),
        Signal(lambda d: d.ticket_id, span=semconv.TICKET_ID, root=semconv.TICKET_ID, when=bool),
        Signal(
            lambda d: d.calibration,
            span=semconv.CALIBRATION,
            root=semconv.CALIBRATION,
            when=bool,
            record="calibration",
            meta="calibration",
        ),
        Signal(lambda d: d.answer, span=semconv.OI_OUTPUT_VALUE, span_as=capture),
        Signal(lambda d: d.route_reason, span=semconv.ROUTE_REASON, when=bool),
        Signal(
            lambda d: list(d.attributed.used_ids) if d.attributed is not None else None,
            span=semconv.ATTRIBUTION_USED,
        ),
        Signal(
            lambda d: list(d.attributed.key_ids) if d.attributed is not None else None,
            span=semconv.ATTRIBUTION_KEY,
        ),
        Signal(
            lambda d: d.attributed.unattributed if d.attributed is not None else None,
            span=semconv.ATTRIBUTION_UNATTRIBUTED,
        ),
        Signal(_response_record, across=True, record="response", is_json=True),
        Signal(
            lambda d: d.attribution if d.attribution is not None else OMIT,
            record="signals.attribution",
        ),
    )

    def _fields(self, request_id: str, trace_id: str | None) -> dict[str, Any]:
        return {
            "request_id": request_id,
            "trace_id": trace_id,
            "answer": self.answer,
            "confidence": self.confidence,
            # the Response's fields are the plain names
            "decision": str(self.decision),
            "status": self.status,
            "tier": str(self.tier),
            "signal_detail": self.signal_detail,
            "evidence": list(self.evidence),
            "claims": list(self.claims),
            "versions": self.versions,
            "ticket_id": self.ticket_id,
            "calibration": self.calibration,
            "warnings": list(self.warnings),
            "materials": list(self.materials),
        }

    def response(
        self, request_id: str, trace_id: str | None, audit_persisted: bool | None
    ) -> Response:
        """The Response, validated (its one construction)."""
        return Response(**self._fields(request_id, trace_id), audit_persisted=audit_persisted)

    def response_record(self, request_id: str, trace_id: str | None) -> dict[str, Any]:
        """The Response as the audit record keeps it, before the record is persisted."""
        draft = Response.model_construct(**self._fields(request_id, trace_id))
        return draft.model_dump(mode="json")
