"""The default escalation handler: bounded memory."""

from __future__ import annotations

import pytest

from tracerag._routing import InMemoryEscalationHandler, Ticket
from tracerag.errors import ConfigurationError


def _ticket(i: int) -> Ticket:
    return Ticket(
        ticket_id=f"T-{i}",
        request_id=f"r-{i}",
        decision="escalate",
        question="q",
        candidate_answer=None,
        confidence=0.1,
    )


def test_the_default_escalation_handler_keeps_only_the_most_recent_tickets():
    handler = InMemoryEscalationHandler(max_tickets=3)
    for i in range(5):
        handler.handle(_ticket(i))
    assert [t.ticket_id for t in handler.tickets] == ["T-2", "T-3", "T-4"]
    assert handler.get("T-0") is None and handler.get("T-4") is not None
    assert InMemoryEscalationHandler().max_tickets == 1000
    with pytest.raises(ConfigurationError):
        InMemoryEscalationHandler(max_tickets=0)
