"""The Response ``invoke()`` returns is the caller view: nothing computed from a withheld
answer's text is in it (its words, its claims and their number, ids, scores, lengths, hashes),
while the ticket and the audit record keep the whole candidate for the operator. The walk over
every surface (the library, wrap(), ``/v1/answer``, the stream, Idempotency replays, the polled
request) is in tests/server/test_caller_view_surfaces.py."""

from __future__ import annotations

from pipeline_fixtures import FABRICATED, FAST_RETRY, GOOD, QUESTION, WRONG_NUMBER, scripted

from tracerag import cli, validate_response
from tracerag.contract import caller_view
from tracerag.signals._rules import RuleResult
from tracerag.store._sqlite import SQLiteAuditStore
from tracerag.tools._replay import replay


def test_an_escalated_response_carries_no_answer_text(make_pipeline):
    records: list[dict] = []
    pipeline = make_pipeline(scripted([WRONG_NUMBER]), audit=lambda r: records.append(r) or True)
    response = pipeline.invoke(QUESTION)
    assert response.decision == "escalate" and response.answer is None
    text = response.model_dump_json()
    for piece in ("within 60 days", "60 days", "unused items"):
        assert piece not in text, piece
    assert response.claims == [] and response.evidence == [] and response.materials == []
    assert response.signal_detail.citation_valid is False  # the verdict stays
    validate_response(response)
    assert caller_view(response) == response.model_dump(mode="json")  # the server's view
    # the operator keeps everything: the ticket, and the audit record's samples and claims
    (ticket,) = pipeline.escalation.tickets
    assert ticket.candidate_answer == WRONG_NUMBER
    (record,) = records
    assert record["samples"][0]["answer"] == WRONG_NUMBER
    kept = record["response"]["claims"][0]
    assert "60 days" in kept["text"] and "60 days" in kept["reason"] and kept["quote"]
    assert record["response"]["evidence"] == [] or record["response"]["evidence"][0]["quote"]


def test_a_fabricated_id_is_the_answers_text_and_stays_with_the_operator(make_pipeline):
    records: list[dict] = []
    pipeline = make_pipeline(scripted([FABRICATED]), audit=lambda r: records.append(r) or True)
    response = pipeline.invoke(QUESTION)
    assert response.decision == "escalate" and response.claims == []
    assert response.signal_detail.confidence_caps == ["fabricated citation"]
    assert "policy-99" not in response.model_dump_json()
    (claim,) = records[0]["response"]["claims"]
    assert claim["verdict"] == "fabricated_citation"
    assert claim["reason"] == "cited but not retrieved: policy-99"


def test_rule_details_of_a_withheld_answer_are_dropped_and_kept_otherwise(make_pipeline):
    def echo(question, answer, materials):
        return RuleResult("echo", False, required=True, detail=f"the answer says: {answer}")

    withheld = make_pipeline(scripted([GOOD]), rules=[echo]).invoke(QUESTION)
    assert withheld.decision == "escalate"
    assert withheld.signal_detail.rules == [
        {"name": "echo", "passed": False, "required": True, "detail": ""}
    ]
    assert "30 days" not in withheld.model_dump_json()

    def lenient(question, answer, materials):
        return RuleResult("echo", True, detail=f"the answer says: {answer}")

    passed = make_pipeline(scripted([GOOD]), rules=[lenient]).invoke(QUESTION)
    assert passed.decision == "pass"
    assert passed.signal_detail.rules[0]["detail"] == f"the answer says: {GOOD}"


def test_a_flagged_answer_keeps_its_text(make_pipeline):
    response = make_pipeline(scripted([WRONG_NUMBER]), tier="medium").invoke(QUESTION)
    assert response.decision == "review" and response.answer == WRONG_NUMBER
    assert response.claims[0].text.startswith("Customers may return")
    assert "60 days" in response.claims[0].reason


def test_show_and_replay_still_read_the_whole_candidate(make_pipeline, tmp_path, capsys):
    path = str(tmp_path / "audit.sqlite")
    store = SQLiteAuditStore(path, auto_enqueue=False)
    try:
        pipeline = make_pipeline(
            scripted([WRONG_NUMBER]), audit=lambda r: store.append_record(r) or True
        )
        response = pipeline.invoke(QUESTION)
        assert response.claims == []
        assert (
            store.get(response.request_id)
            .audit.claims[0]
            .text.startswith("Customers may return unused items within 60 days")
        )
        llm = scripted([WRONG_NUMBER])
        replayed = replay(
            store,
            response.request_id,
            llm,
            prompt_version="test-prompt-v1",
            model_version=llm.model_name,
            retry=FAST_RETRY,
        )
        assert replayed.response.decision == "escalate"
        assert not [c for c in replayed.changes if c.changed]  # the same candidate, recorded
        new = store.get(replayed.replay_id).audit.claims[0].text
        assert new.startswith("Customers may return unused items within 60 days")
    finally:
        store.close()
    assert cli.main(["show", response.request_id, "--store", path]) == 0
    shown = capsys.readouterr().out
    assert "within 60 days" in shown and "60 days not in material" in shown
