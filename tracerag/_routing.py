"""From confidence to decision, and where withheld answers go.

``pass`` (confidence ≥ ``thresholds.pass_at``) returns the answer; ``review`` (≥ ``review_at``)
returns it flagged for human review; ``escalate`` withholds it. Both hand a ticket to the
escalation handler, once the request's audit record has been handed to its sink: the ticket's
``audit_persisted`` says whether that record is durable (None: the app keeps no records). A
handler that raises never fails the request: the failure is logged and the Response says the
ticket was not handed on. The handler is a seam: the default keeps the most recent tickets in
memory and logs each one; the audit record keeps every request's ticket id, route and candidate.
"""

from __future__ import annotations

import logging
import threading
import uuid
from collections import deque
from dataclasses import dataclass, field
from datetime import datetime, timezone
from typing import Any, Final, Protocol, runtime_checkable

from tracerag._choices import Route, RouteName, Tier
from tracerag.errors import ConfigurationError

__all__ = [
    "ESCALATE",
    "PASS",
    "REVIEW",
    "EscalationHandler",
    "InMemoryEscalationHandler",
    "Route",
    "RouteName",
    "Thresholds",
    "Ticket",
    "decide",
    "new_ticket_id",
]

logger = logging.getLogger("tracerag.escalation")

PASS: Final = Route.PASS
REVIEW: Final = Route.REVIEW
ESCALATE: Final = Route.ESCALATE


@dataclass(frozen=True)
class Thresholds:
    """Confidence lines: at or above ``pass_at`` pass; at or above ``review_at`` review."""

    pass_at: float = 0.85
    review_at: float = 0.6

    def __post_init__(self) -> None:
        if not 0.0 <= self.review_at <= self.pass_at <= 1.0:
            raise ConfigurationError(
                f"thresholds must satisfy 0 <= review_at <= pass_at <= 1, got {self}"
            )

    @property
    def cap(self) -> float:
        """The highest confidence that still escalates: where hard failures are capped."""
        return max(0.0, round(self.review_at - 0.01, 4))


def decide(confidence: float, thresholds: Thresholds, *, tier: Tier = Tier.HIGH) -> Route:
    """The route for a confidence; tier ``medium`` flags for review instead of withholding."""
    if confidence >= thresholds.pass_at:
        return PASS
    if confidence >= thresholds.review_at or tier == Tier.MEDIUM:
        return REVIEW
    return ESCALATE


@dataclass
class Ticket:
    """A request handed to humans: withheld (escalate) or flagged (review).

    ``audit_persisted`` is the fate of the request's audit record when the ticket was handed on:
    True when the sink took it, False when it could not (the ticket may then name a request the
    audit trail does not hold), None when the app keeps no audit records.
    """

    ticket_id: str
    request_id: str
    decision: Route
    question: str
    candidate_answer: str | None
    confidence: float | None
    reasons: list[str] = field(default_factory=list)
    trace_id: str | None = None
    created_at: datetime = field(default_factory=lambda: datetime.now(timezone.utc))
    detail: dict[str, Any] = field(default_factory=dict)
    audit_persisted: bool | None = None


_FATE = {True: "persisted", False: "NOT persisted", None: "not kept"}


def new_ticket_id() -> str:
    """A fresh ticket id."""
    return f"T-{uuid.uuid4().hex[:12]}"


@runtime_checkable
class EscalationHandler(Protocol):
    """Receives every escalated or review-flagged request."""

    def handle(self, ticket: Ticket) -> None: ...


class InMemoryEscalationHandler:
    """The default handler: logs each ticket and keeps the last ``max_tickets`` in memory.

    Older tickets are dropped from memory (never from the audit store, which holds them all),
    so a long-running process does not grow without bound. Thread-safe.
    """

    DEFAULT_MAX_TICKETS = 1000

    def __init__(self, max_tickets: int = DEFAULT_MAX_TICKETS) -> None:
        if max_tickets < 1:
            raise ConfigurationError(f"max_tickets must be at least 1, got {max_tickets}")
        self._lock = threading.Lock()
        self._tickets: deque[Ticket] = deque(maxlen=max_tickets)

    @property
    def max_tickets(self) -> int:
        """How many of the most recent tickets are kept."""
        return self._tickets.maxlen or 0

    def handle(self, ticket: Ticket) -> None:
        with self._lock:
            self._tickets.append(ticket)
        logger.warning(
            "tracerag %s: request %s ticket %s confidence %s (%s); audit record %s",
            ticket.decision,
            ticket.request_id,
            ticket.ticket_id,
            ticket.confidence,
            "; ".join(ticket.reasons) or "low confidence",
            _FATE[ticket.audit_persisted],
        )

    @property
    def tickets(self) -> list[Ticket]:
        """The kept tickets, oldest first."""
        with self._lock:
            return list(self._tickets)

    def get(self, ticket_id: str) -> Ticket | None:
        """A kept ticket by id, or None (never seen, or dropped as older than the last ones)."""
        with self._lock:
            return next((t for t in self._tickets if t.ticket_id == ticket_id), None)
