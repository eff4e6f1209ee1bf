"""An answer that does not address the question cannot pass, on any surface.

The defect: "What is the capital of Mars?" answered with the returns policy passed at confidence
1.0 — every claim was supported by the sentence it cited and every sample agreed. These tests
reproduce that pass (with the check off) and show that it now goes to review with the reason,
through ``invoke``, ``ainvoke``, ``stream``, ``astream_events``, ``batch``, ``wrap()`` of an LCEL
chain, and the server's answer and its stream; a paraphrased answer to the question still
passes.
"""

from __future__ import annotations

import asyncio
import json
from typing import Any

import pytest
from fastapi.testclient import TestClient
from langchain_core.output_parsers import StrOutputParser
from langchain_core.prompts import ChatPromptTemplate
from langchain_core.runnables import RunnablePassthrough
from pipeline_fixtures import FAST_RETRY, GOOD, scripted

from tracerag import AnswerRelevance, RAGPipeline, Response, wrap
from tracerag import _semconv as sc
from tracerag.errors import ConfigurationError
from tracerag.testing import ScriptCall, ScriptedChatModel
from tracerag.tools._show import render_timeline

MARS = "What is the capital of Mars?"
MARS_ZH = "火星的首都是哪里？"
WARRANTY_ZH = "笔记本电脑和平板电脑享受24个月保修。[warranty-zh]"
PARAPHRASE = "How long do I have to send something back?"


def keep(records: list[dict[str, Any]]):
    return lambda record: records.append(record) or True


def test_the_capital_of_mars_passed_before_and_goes_to_review_now(make_pipeline, spans):
    before = make_pipeline(scripted([GOOD]), answer_relevance=False).invoke(MARS)
    assert before.decision == "pass" and before.confidence == 1.0  # the defect, reproduced
    assert before.signal_detail.answers_question is None

    records: list[dict[str, Any]] = []
    pipeline = make_pipeline(scripted([GOOD]), audit=keep(records))
    response = pipeline.invoke(MARS)
    assert response.decision == "review" and response.status == "flagged_for_review"
    assert response.answer == before.answer  # flagged for a person, not withheld
    assert response.confidence == before.confidence
    assert all(c.verdict == "supported" for c in response.claims)
    detail = response.signal_detail
    assert detail.answers_question is False
    reason = detail.relevance["reason"]
    assert reason.startswith("the answer does not address the question")
    assert "capital, Mars" in reason
    assert detail.relevance["method"] == "lexical" and detail.relevance["coverage"] == 0.0
    # the reason reaches the reviewer's ticket, the audit record and the trace
    assert pipeline.escalation.tickets[-1].reasons == [reason]
    assert records[-1]["signals"]["relevance"]["addresses"] is False
    assert records[-1]["response"]["signal_detail"]["relevance"]["reason"] == reason
    assemble = spans.named(sc.SPAN_ASSEMBLE, response.request_id)[0]
    assert assemble.attributes[sc.ROUTE_REASON] == reason
    verify = spans.named(sc.SPAN_VERIFY, response.request_id)[0]
    assert verify.attributes[sc.SIGNAL_ANSWER_RELEVANT] is False
    evaluations = [e.attributes for e in verify.events if e.name == sc.GENAI_EVALUATION_EVENT]
    relevance = [e for e in evaluations if e[sc.GENAI_EVALUATION_NAME] == "answer_relevance"]
    assert relevance and relevance[0][sc.GENAI_EVALUATION_SCORE_LABEL] == "off_topic"


def test_its_chinese_twin_goes_to_review_with_the_reason_in_english(make_pipeline):
    before = make_pipeline(scripted([WARRANTY_ZH]), answer_relevance=False).invoke(MARS_ZH)
    assert before.decision == "pass"
    response = make_pipeline(scripted([WARRANTY_ZH])).invoke(MARS_ZH)
    assert response.decision == "review"
    assert response.signal_detail.answers_question is False
    reason = response.signal_detail.relevance["reason"]
    assert reason.startswith("the answer does not address the question") and "火星" in reason


def test_a_paraphrased_question_still_passes(make_pipeline):
    response = make_pipeline(scripted([GOOD])).invoke(PARAPHRASE)
    assert response.decision == "pass", response.signal_detail
    assert response.signal_detail.answers_question is True
    assert "duration" in response.signal_detail.relevance["reason"]
    same_words = make_pipeline(scripted([GOOD])).invoke("Can I return an item for a refund?")
    assert same_words.decision == "pass" and same_words.signal_detail.answers_question is True


def _decisions(received: list[Any]) -> list[str]:
    return [r.decision for r in received if isinstance(r, Response)]


@pytest.mark.parametrize("surface", ["invoke", "ainvoke", "stream", "astream_events", "batch"])
def test_no_surface_passes_it(make_pipeline, surface):
    pipeline = make_pipeline(scripted([GOOD]), n_samples=3)
    if surface == "invoke":
        got = [pipeline.invoke(MARS)]
    elif surface == "ainvoke":
        got = [asyncio.run(pipeline.ainvoke(MARS))]
    elif surface == "stream":
        got = list(pipeline.stream(MARS))
    elif surface == "astream_events":

        async def events() -> list[Any]:
            return [e async for e in pipeline.astream_events(MARS, version="v2")]

        got = [
            e["data"]["output"]
            for e in asyncio.run(events())
            if e["event"] == "on_chain_end" and not e["parent_ids"]
        ]
    else:
        got = pipeline.batch([MARS, MARS_ZH])
    assert _decisions(got) and set(_decisions(got)) == {"review"}


def test_a_wrapped_chain_that_answers_another_question_goes_to_review(retriever):
    prompt = ChatPromptTemplate.from_template(
        "Answer from the context. Cite passages as [n].\n\nContext:\n{context}\n\n"
        "Question: {question}"
    )

    def numbered(docs: list[Any]) -> str:
        return "\n\n".join(f"[{i}] {d.page_content}" for i, d in enumerate(docs, 1))

    def returns_policy(call: ScriptCall) -> str:
        """Whatever the question, the passage on returns, cited by its number."""
        for line in call.prompt.splitlines():
            if line.startswith("[") and "30 days of delivery for a full refund" in line:
                return (
                    f"{line[line.index(']') + 2 :].split('. ')[0]}. [{line[1 : line.index(']')]}]"
                )
        return "I don't know."

    llm = ScriptedChatModel(responder=returns_policy, model_name="scripted-x", temperature=0.7)
    chain = (
        {"context": retriever | numbered, "question": RunnablePassthrough()}
        | prompt
        | llm
        | StrOutputParser()
    )
    off = wrap(chain, n_samples=3, retry=FAST_RETRY, audit=None, answer_relevance=False)
    assert off.invoke(MARS).decision == "pass"
    app = wrap(chain, n_samples=3, retry=FAST_RETRY, audit=None)
    response = app.invoke(MARS)
    assert response.decision == "review"
    assert response.signal_detail.answers_question is False
    assert app.invoke(PARAPHRASE).decision == "pass"


def test_the_http_answer_and_its_stream_do_not_pass_it(tmp_path, retriever):
    from server_fixtures import make_app, make_store

    pipeline = RAGPipeline(
        retriever,
        scripted([GOOD]),
        prompt_version="test-prompt-v1",
        model_version="scripted-chat-model",
        n_samples=3,
        retry=FAST_RETRY,
        audit=None,
    )
    store = make_store(tmp_path)
    try:
        with TestClient(make_app(store, pipeline, review_desk=False)) as client:
            body = client.post("/v1/answer", json={"question": MARS}).json()
            assert body["decision"] == "review" and body["answer"]
            assert body["signal_detail"]["answers_question"] is False
            assert "capital, Mars" in body["signal_detail"]["relevance"]["reason"]
            stored = store.get(body["request_id"]).record
            assert stored["decision"] == "review"
            assert stored["signals"]["relevance"]["addresses"] is False

            events = _sse(client.post("/v1/answer/stream", json={"question": MARS_ZH}).text)
            stages = {data["stage"]: data for kind, data in events if kind == "stage"}
            assert stages["verify"]["signals"]["answers_question"] is False
            assert stages["assemble"]["signals"]["decision"] == "review"
            final = next(data for kind, data in events if kind == "response")
            assert final["decision"] == "review"
            assert final["signal_detail"]["answers_question"] is False

            good = client.post("/v1/answer", json={"question": PARAPHRASE}).json()
            assert good["decision"] == "pass"
    finally:
        store.close()


def test_the_desk_says_why_it_was_flagged(tmp_path, retriever):
    from server_fixtures import make_app, make_store, sign_in

    pipeline = RAGPipeline(
        retriever,
        scripted([GOOD]),
        prompt_version="test-prompt-v1",
        model_version="scripted-chat-model",
        n_samples=3,
        retry=FAST_RETRY,
        audit=None,
    )
    store = make_store(tmp_path)
    try:
        with TestClient(make_app(store, pipeline)) as client:
            rid = client.post("/v1/answer", json={"question": MARS}).json()["request_id"]
            sign_in(client)
            queue = client.get("/review").text
            assert f"/review/items/{rid}" in queue
            assert "the answer does not address the question" in queue
            item = client.get(f"/review/items/{rid}").text
            assert "none of the question&#39;s words (capital, Mars)" in item
            assert "answers the question" in item
        timeline = render_timeline(store.get(rid))  # tracerag show
        assert "relevance (lexical): DOES NOT ANSWER THE QUESTION" in timeline
        assert "(capital, Mars)" in timeline
    finally:
        store.close()


def _sse(text: str) -> list[tuple[str, dict[str, Any]]]:
    events = []
    for block in text.strip().split("\n\n"):
        fields = dict(
            line.split(": ", 1)
            for line in block.splitlines()
            if ": " in line and not line.startswith(":")
        )
        if "event" in fields:
            events.append((fields["event"], json.loads(fields["data"])))
    return events


def test_a_medium_tier_flags_it_and_a_low_tier_does_not_judge(make_pipeline):
    medium = make_pipeline(scripted([GOOD]), tier="medium").invoke(MARS)
    assert medium.decision == "review" and medium.answer
    low = make_pipeline(scripted([GOOD]), tier="low").invoke(MARS)
    assert low.status == "unverified" and low.signal_detail.answers_question is None


def test_an_escalated_answer_keeps_its_route_and_says_it_is_off_topic_too(make_pipeline):
    wrong = "Customers may return unused items within 60 days of delivery. [returns]"
    records: list[dict[str, Any]] = []
    response = make_pipeline(scripted([wrong]), audit=keep(records)).invoke(MARS)
    assert response.decision == "escalate" and response.answer is None
    assert response.signal_detail.answers_question is False
    # which of the question's words the withheld answer names is of its text: the operator's
    assert response.signal_detail.relevance == {}
    assert "capital, Mars" in records[0]["response"]["signal_detail"]["relevance"]["reason"]


class Failing:
    def embed_documents(self, texts: list[str]) -> list[list[float]]:
        raise RuntimeError("embedding service down")

    def embed_query(self, text: str) -> list[float]:
        raise RuntimeError("embedding service down")


def test_failing_embeddings_leave_the_lexical_verdict_and_say_so(make_pipeline):
    records: list[dict[str, Any]] = []
    pipeline = make_pipeline(
        scripted([GOOD]),
        answer_relevance=AnswerRelevance(embeddings=Failing()),
        audit=keep(records),
    )
    response = pipeline.invoke(MARS)
    assert response.decision == "review"
    assert response.signal_detail.relevance["method"] == "lexical"
    errors = [e for e in records[-1]["errors"] if e.get("signal") == "answer_relevance"]
    assert errors and "embedding service down" in errors[0]["message"]
    assert pipeline.invoke(PARAPHRASE).decision == "pass"


@pytest.mark.parametrize("bad", ["yes", 1, AnswerRelevance])
def test_a_bad_option_is_refused(retriever, bad):
    with pytest.raises(ConfigurationError, match="answer_relevance"):
        RAGPipeline(
            retriever, scripted([GOOD]), prompt_version="p", model_version="m", answer_relevance=bad
        )


@pytest.mark.integration
def test_a_served_answer_to_another_question_does_not_pass_over_a_real_socket(tmp_path, retriever):
    """The served app on 127.0.0.1, as ``tracerag serve --app`` runs it: the answer and the
    stream both say review, with the reason."""
    import httpx
    from server_fixtures import make_app, make_store, running

    pipeline = RAGPipeline(
        retriever,
        scripted([GOOD]),
        prompt_version="test-prompt-v1",
        model_version="scripted-chat-model",
        n_samples=3,
        retry=FAST_RETRY,
        audit=None,
    )
    store = make_store(tmp_path)
    try:
        with running(make_app(store, pipeline, review_desk=False)) as base:
            body = httpx.post(f"{base}/v1/answer", json={"question": MARS}, timeout=30).json()
            assert body["decision"] == "review"
            assert "capital, Mars" in body["signal_detail"]["relevance"]["reason"]
            streamed = httpx.post(
                f"{base}/v1/answer/stream", json={"question": MARS_ZH}, timeout=30
            ).text
            final = next(data for kind, data in _sse(streamed) if kind == "response")
            assert final["decision"] == "review"
            assert final["signal_detail"]["answers_question"] is False
            ok = httpx.post(f"{base}/v1/answer", json={"question": PARAPHRASE}, timeout=30)
            assert ok.json()["decision"] == "pass"
    finally:
        store.close()
