"""Tickets go to the escalation handler after the audit record's fate is known, and say it."""

from __future__ import annotations

import asyncio
import logging

import pytest
from pipeline_fixtures import FABRICATED, FAST_RETRY, QUESTION, scripted, standard_chain

from tracerag import _semconv as sc
from tracerag import wrap
from tracerag._routing import InMemoryEscalationHandler
from tracerag.testing import ScriptedChatModel


class Handler(InMemoryEscalationHandler):
    """Keeps tickets and notes, in ``order``, when it was called."""

    def __init__(self, order: list[str]) -> None:
        super().__init__()
        self.order = order

    def handle(self, ticket):
        self.order.append("handler")
        super().handle(ticket)


def test_the_ticket_follows_the_record_and_says_it_was_persisted(make_pipeline):
    order: list[str] = []
    records: list[dict] = []

    async def sink(record):
        await asyncio.sleep(0.01)  # sleep is the behaviour: a slow sink the ticket waits for
        records.append(record)
        order.append("sink")
        return True

    handler = Handler(order)
    response = make_pipeline(scripted([FABRICATED]), escalation=handler, audit=sink).invoke(
        QUESTION
    )
    assert order == ["sink", "handler"]
    (ticket,) = handler.tickets
    assert ticket.audit_persisted is True and response.audit_persisted is True
    assert ticket.ticket_id == response.ticket_id == records[0]["response"]["ticket_id"]
    assert ticket.request_id == response.request_id == records[0]["request_id"]
    assert ticket.candidate_answer == FABRICATED


@pytest.mark.parametrize("sink", ["raises", "refuses"])
def test_a_ticket_names_a_request_whose_record_failed_and_says_so(make_pipeline, sink, caplog):
    order: list[str] = []

    def failing(record):
        order.append("sink")
        if sink == "raises":
            raise OSError("disk full")
        return False

    handler = Handler(order)
    response = make_pipeline(scripted([FABRICATED]), escalation=handler, audit=failing).invoke(
        QUESTION
    )
    assert order == ["sink", "handler"]
    (ticket,) = handler.tickets
    assert ticket.audit_persisted is False and response.audit_persisted is False
    assert response.decision == "escalate" and response.answer is None
    assert any("NOT persisted" in r.getMessage() for r in caplog.records)


def test_without_records_the_ticket_says_none_was_kept(make_pipeline):
    handler = Handler([])
    make_pipeline(scripted([FABRICATED]), escalation=handler, audit=None).invoke(QUESTION)
    assert handler.tickets[0].audit_persisted is None


def test_a_failing_handler_never_fails_the_request_and_is_logged(make_pipeline, spans, caplog):
    class Broken:
        def handle(self, ticket):
            raise ConnectionError("queue down")

    records: list[dict] = []
    response = make_pipeline(
        scripted([FABRICATED]), escalation=Broken(), audit=lambda r: records.append(r) or True
    ).invoke(QUESTION)
    assert response.decision == "escalate" and response.answer is None
    assert response.audit_persisted is True and records  # the record went first
    assert response.warnings == [
        f"ticket {response.ticket_id} was not taken by the escalation handler (ConnectionError)"
    ]
    logged = [r for r in caplog.records if r.levelno == logging.ERROR and r.exc_info]
    assert any(response.ticket_id in r.getMessage() for r in logged)
    assert isinstance(logged[-1].exc_info[1], ConnectionError)
    root = spans.named(sc.SPAN_REQUEST, response.request_id)[0]
    assert [e.attributes["exception.type"] for e in root.events if e.name == "exception"] == [
        "ConnectionError"
    ]


def test_a_failing_handler_and_a_failing_sink_together(make_pipeline):
    class Broken:
        def handle(self, ticket):
            raise ConnectionError("queue down")

    def sink(record):
        raise OSError("disk full")

    response = make_pipeline(scripted([FABRICATED]), escalation=Broken(), audit=sink).invoke(
        QUESTION
    )
    assert response.decision == "escalate" and response.answer is None
    assert response.audit_persisted is False
    assert "not taken by the escalation handler" in response.warnings[0]


def test_a_review_ticket_goes_out_after_the_record_and_the_answer_stays(make_pipeline):
    order: list[str] = []
    handler = Handler(order)

    def sink(record):
        order.append("sink")
        return True

    response = make_pipeline(
        scripted([FABRICATED]), escalation=handler, audit=sink, tier="medium"
    ).invoke(QUESTION)
    assert response.decision == "review" and response.answer == FABRICATED
    assert response.claims[0].text and response.claims[0].reason  # flagged, not withheld
    assert order == ["sink", "handler"]
    assert handler.tickets[0].decision == "review" and handler.tickets[0].audit_persisted


def test_wrap_hands_its_ticket_on_after_the_record_too(retriever):
    order: list[str] = []
    handler = Handler(order)

    def sink(record):
        order.append("sink")
        raise OSError("disk full")

    llm = ScriptedChatModel(
        responder=lambda call: "Items may be returned within 30 days. [policy-99]",
        model_name="scripted-x",
        temperature=0.7,
    )
    app = wrap(
        standard_chain(retriever, llm),
        n_samples=2,
        retry=FAST_RETRY,
        escalation=handler,
        audit=sink,
    )
    response = app.invoke(QUESTION)
    assert response.decision == "escalate"
    assert order == ["sink", "handler"]
    assert handler.tickets[0].audit_persisted is False
