"""``tracerag show`` reads ``[1]``-style citations of wrap() as the verifier did: by position."""

from __future__ import annotations

from pipeline_fixtures import FAST_RETRY, QUESTION, positional_answer, standard_chain

from tracerag import wrap
from tracerag.store import RequestTrail
from tracerag.store._codec import entries_from_record
from tracerag.testing import ScriptedChatModel
from tracerag.tools._show import render_timeline


def wrapped_trail(retriever, responder, passes: bool = True) -> RequestTrail:
    records: list[dict] = []
    llm = ScriptedChatModel(responder=responder, model_name="scripted-x", temperature=0.7)
    chain = wrap(
        standard_chain(retriever, llm), n_samples=3, retry=FAST_RETRY, audit=records.append
    )
    response = chain.invoke(QUESTION)
    assert (response.decision == "pass") is passes
    (record,) = records
    assert record["response"]["claims"][0]["cited_ids"][0].isdigit()  # the operator's copy
    return RequestTrail(record["request_id"], entries_from_record(record))


def test_positional_citations_are_not_flagged_as_unretrieved(retriever):
    trail = wrapped_trail(retriever, positional_answer)
    cited, missing = trail.audit.resolved_citations()
    assert cited == {"returns"} and missing == []
    text = render_timeline(trail)
    assert "NOT retrieved" not in text
    returns = next(line for line in text.splitlines() if " returns " in line and "score" in line)
    assert "CITED" in returns


def test_a_position_past_the_retrieved_ones_is_still_flagged(retriever):
    def answer(call):
        return positional_answer(call) + " Shipping is free. [9]"

    trail = wrapped_trail(retriever, answer, passes=False)
    cited, missing = trail.audit.resolved_citations()
    assert "returns" in cited and missing == ["9"]
    assert "!! cited but NOT retrieved: 9" in render_timeline(trail)
