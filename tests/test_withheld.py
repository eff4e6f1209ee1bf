"""The message that stands for a withheld answer: one text for every front door."""

from __future__ import annotations

import pytest

from tracerag._withheld import (
    DEFAULT_WITHHELD,
    DEFAULT_WITHHELD_ZH,
    check_withheld_message,
    withheld_text,
)
from tracerag.errors import ConfigurationError


def test_the_default_speaks_the_question_s_language_and_names_the_ticket():
    en = withheld_text(None, question="How long is the warranty?", ticket_id="t-1", request_id="r")
    zh = withheld_text(None, question="保修期是多久？", ticket_id="t-2", request_id="r")
    assert en == DEFAULT_WITHHELD.format(ticket_id="t-1")
    assert zh == DEFAULT_WITHHELD_ZH.format(ticket_id="t-2")
    assert "t-1" in en and "t-2" in zh


def test_without_a_ticket_the_request_id_is_named():
    text = withheld_text(None, question="q?", ticket_id=None, request_id="req-9")
    assert "req-9" in text


def test_a_caller_s_template_fills_both_fields():
    template = check_withheld_message("Ticket {ticket_id} for request {request_id}.")
    assert withheld_text(template, question="保修？", ticket_id="t", request_id="r") == (
        "Ticket t for request r."
    )


@pytest.mark.parametrize("bad", ["", "   ", "{answer} withheld", "{0}", "{ticket_id"])
def test_a_template_that_cannot_be_filled_is_refused(bad):
    with pytest.raises(ConfigurationError, match="withheld_message"):
        check_withheld_message(bad)
