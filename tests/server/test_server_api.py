"""The frontend API: answers, streamed stages, stored trails, trace context, keys and bad input."""

from __future__ import annotations

import asyncio
import json

import pytest

pytest.importorskip("fastapi")
import httpx
from fastapi.testclient import TestClient
from server_fixtures import (
    API_KEY,
    EVIL_ANSWER,
    EVIL_QUESTION,
    GOOD_ANSWER,
    GOOD_QUESTION,
    SUPPORTED_SENTENCE,
    make_app,
    make_pipeline,
    make_store,
    running,
)

from tracerag import validate_response
from tracerag.errors import ConfigurationError
from tracerag.testing import SpanCapture

JSON = {"Content-Type": "application/json"}
STRONG_TOKEN = "a-strong-token-for-this-test-7f3k"
STAGES = ["register", "retrieve", "plan", "sample", "verify", "assemble"]


@pytest.fixture
def store(tmp_path):
    s = make_store(tmp_path)
    yield s
    s.close()


def parse_sse(text: str) -> list[tuple[str, dict]]:
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


def test_answer_returns_the_response_and_stores_its_record(store):
    app = make_app(store, make_pipeline([GOOD_ANSWER]))
    with TestClient(app) as client:
        reply = client.post("/v1/answer", json={"question": GOOD_QUESTION, "channel": "web"})
    assert reply.status_code == 200
    body = reply.json()
    validate_response(body)
    assert body["decision"] == "pass" and body["answer"]
    assert body["audit_persisted"] is True
    assert reply.headers["x-request-id"] == body["request_id"]
    trail = store.get(body["request_id"])
    assert trail.record["channel"] == "web"
    assert trail.record["response"]["answer"] == body["answer"]
    assert "content-security-policy" in reply.headers


def test_escalated_answer_is_withheld_queued_and_readable_until_decided(store):
    app = make_app(store)
    with TestClient(app) as client:
        reply = client.post("/v1/answer", json={"question": EVIL_QUESTION})
        body = reply.json()
        assert body["decision"] == "escalate"
        assert body["answer"] is None and body["status"] == "pending_human_review"
        assert body["ticket_id"]
        polled = client.get(f"/v1/requests/{body['request_id']}")
        view = polled.json()
    assert view == {
        "request_id": body["request_id"],
        "state": "pending_human_review",
        "decision": "escalate",
        "final_answer": None,
        "ticket_id": body["ticket_id"],
        "trace_id": body["trace_id"],
        "review": None,
    }
    assert [i.request_id for i in store.list_queue()] == [body["request_id"]]
    # the full trail is the operator's: it keeps the withheld answer
    assert store.get(body["request_id"]).record["samples"][0]["answer"] == EVIL_ANSWER


WITHHELD_PIECES = [SUPPORTED_SENTENCE, "Keep the receipt", "onerror", "policy-99]"]


def test_a_withheld_answer_appears_nowhere_in_what_the_caller_gets(store):
    app = make_app(store)
    with TestClient(app) as client:
        reply = client.post("/v1/answer", json={"question": EVIL_QUESTION})
        body = reply.json()
        streamed = client.post("/v1/answer/stream", json={"question": EVIL_QUESTION})
        polled = client.get(f"/v1/requests/{body['request_id']}")
    validate_response(body)
    assert body["claims"] == [] and body["evidence"] == [] and body["materials"] == []
    assert body["signal_detail"]["confidence_caps"] == ["fabricated citation"]
    response_event = parse_sse(streamed.text)[-1]
    assert response_event[0] == "response" and response_event[1]["answer"] is None
    for text in (reply.text, streamed.text, polled.text):
        for piece in WITHHELD_PIECES:
            assert piece not in text
    assert len(polled.content) < 600


def test_a_passed_answer_keeps_its_claims_and_evidence(store):
    with TestClient(make_app(store, make_pipeline([GOOD_ANSWER]))) as client:
        body = client.post("/v1/answer", json={"question": GOOD_QUESTION}).json()
        view = client.get(f"/v1/requests/{body['request_id']}").json()
    assert body["claims"][0]["text"] and body["evidence"][0]["quote"]
    assert view["state"] == "answered" and view["final_answer"] == body["answer"]


def test_unknown_request_is_404(store):
    with TestClient(make_app(store)) as client:
        reply = client.get("/v1/requests/no-such-request")
    assert reply.status_code == 404
    assert reply.json()["error"] == "not_found"


def test_stream_sends_each_stage_then_the_response(store):
    app = make_app(store, make_pipeline([GOOD_ANSWER]))
    with TestClient(app) as client:
        reply = client.post("/v1/answer/stream", json={"question": GOOD_QUESTION})
    assert reply.status_code == 200
    assert reply.headers["content-type"].startswith("text/event-stream")
    events = parse_sse(reply.text)
    assert [e for e, _ in events] == ["stage"] * 6 + ["response"]
    stages = [data for kind, data in events if kind == "stage"]
    assert [s["stage"] for s in stages] == STAGES
    assert all(isinstance(s["duration_s"], float) and not s["skipped"] for s in stages)
    request_id = stages[0]["request_id"]
    assert all(s["request_id"] == request_id for s in stages)
    assert stages[1]["signals"]["count"] == 4
    assert stages[4]["signals"]["citation_valid"] is True
    assert stages[5]["signals"]["decision"] == "pass"
    response = events[-1][1]
    validate_response(response)
    assert response["request_id"] == request_id and response["audit_persisted"] is True
    assert store.get(request_id).record["decision"] == "pass"


def test_stream_marks_stages_a_tier_skips(store):
    app = make_app(store, make_pipeline([GOOD_ANSWER], tier="low"))
    with TestClient(app) as client:
        events = parse_sse(client.post("/v1/answer/stream", json={"question": "q?"}).text)
    skipped = {d["stage"]: d["skipped"] for k, d in events if k == "stage"}
    assert skipped == {
        "register": False,
        "retrieve": False,
        "plan": True,
        "sample": False,
        "verify": True,
        "assemble": False,
    }
    assert events[-1][0] == "response"


def test_on_stage_hook_failures_never_fail_the_request():
    pipeline = make_pipeline([GOOD_ANSWER])
    seen = []

    def hook(event):
        seen.append(event.stage)
        raise RuntimeError("a broken listener")

    response = asyncio.run(pipeline.arun(GOOD_QUESTION, on_stage=hook))
    assert seen == STAGES
    assert response.decision == "pass"


CALLER_TRACE = "4bf92f3577b34da6a3ce929d0e0e4736"
CALLER_SPAN = "00f067aa0ba902b7"


@pytest.mark.parametrize("path", ["/v1/answer", "/v1/answer/stream"])
def test_traceparent_continues_the_callers_trace(store, path):
    spans = SpanCapture()
    app = make_app(store, make_pipeline([GOOD_ANSWER], tracer_provider=spans.provider))
    with TestClient(app) as client:
        reply = client.post(
            path,
            json={"question": GOOD_QUESTION},
            headers={"traceparent": f"00-{CALLER_TRACE}-{CALLER_SPAN}-01"},
        )
    body = reply.json() if path == "/v1/answer" else parse_sse(reply.text)[-1][1]
    root = spans.root(body["request_id"])
    assert root.parent is not None
    assert f"{root.parent.trace_id:032x}" == CALLER_TRACE
    assert f"{root.parent.span_id:016x}" == CALLER_SPAN
    assert f"{root.context.trace_id:032x}" == CALLER_TRACE
    assert body["trace_id"] == CALLER_TRACE
    assert spans.tree_problems(body["request_id"]) == []


def test_without_traceparent_the_request_starts_its_own_trace(store):
    spans = SpanCapture()
    app = make_app(store, make_pipeline([GOOD_ANSWER], tracer_provider=spans.provider))
    with TestClient(app) as client:
        body = client.post("/v1/answer", json={"question": GOOD_QUESTION}).json()
    root = spans.root(body["request_id"])
    assert root.parent is None and body["trace_id"] != CALLER_TRACE


def test_api_key_guards_the_frontend_endpoints(store):
    app = make_app(store, make_pipeline([GOOD_ANSWER]), api_key=API_KEY)
    with TestClient(app) as client:
        q = {"question": GOOD_QUESTION}
        assert client.post("/v1/answer", json=q).status_code == 401
        assert client.post("/v1/answer/stream", json=q).status_code == 401
        bad = {"X-API-Key": "wrong"}
        assert client.post("/v1/answer", json=q, headers=bad).status_code == 401
        ok = client.post("/v1/answer", json=q, headers={"X-API-Key": API_KEY})
        assert ok.status_code == 200
        rid = ok.json()["request_id"]
        assert client.get(f"/v1/requests/{rid}").status_code == 401
        assert client.get(f"/v1/requests/{rid}", headers={"X-API-Key": API_KEY}).status_code == 200
    assert len(store.list_requests()) == 1


def test_api_key_from_the_environment(store, monkeypatch):
    monkeypatch.setenv("TRACERAG_API_KEY", API_KEY)
    with TestClient(make_app(store, make_pipeline([GOOD_ANSWER]))) as client:
        assert client.post("/v1/answer", json={"question": "q?"}).status_code == 401


@pytest.mark.parametrize(
    ("body", "status", "error"),
    [
        (b"{not json", 400, "bad_request"),
        (b"", 400, "bad_request"),
        (b"\xff\xfe", 400, "bad_request"),
        (b'["a list"]', 422, "invalid_input"),
        (b"{}", 422, "invalid_input"),
        (b'{"question": 42}', 422, "invalid_input"),
        (b'{"question": "   "}', 422, "invalid_input"),
        (b'{"question": "q?", "request_id": "mine"}', 422, "invalid_input"),
        (b'{"question": "q?", "extra": 1}', 422, "invalid_input"),
        (json.dumps({"question": "x" * 9000}).encode(), 422, "invalid_input"),
    ],
)
@pytest.mark.parametrize("path", ["/v1/answer", "/v1/answer/stream"])
def test_bad_input_is_a_clear_4xx_and_stores_nothing(store, path, body, status, error):
    with TestClient(make_app(store, make_pipeline([GOOD_ANSWER]))) as client:
        reply = client.post(path, content=body, headers={"Content-Type": "application/json"})
    assert reply.status_code == status, reply.text
    assert reply.json()["error"] == error and reply.json()["detail"]
    assert store.list_requests() == []


def test_oversize_bodies_are_413_declared_or_streamed(store):
    with TestClient(make_app(store, make_pipeline([GOOD_ANSWER]))) as client:
        big = json.dumps({"question": "x" * (70 * 1024)}).encode()
        declared = client.post("/v1/answer", content=big)
        assert declared.status_code == 413
        assert declared.json()["error"] == "request_too_large"

        def chunks():
            for _ in range(70):
                yield b"x" * 1024

        streamed = client.post("/v1/answer", content=chunks(), headers=JSON)
        assert streamed.status_code == 413
        assert streamed.json()["error"] == "request_too_large"
        limit = client.post("/review/signin", content=b"reviewer=a&token=" + b"y" * (65 * 1024))
        assert limit.status_code == 413 and limit.json()["error"] == "request_too_large"
        assert "content-security-policy" in limit.headers
    assert store.list_requests() == []


def test_body_limit_is_configurable(store):
    app = make_app(store, make_pipeline([GOOD_ANSWER]), max_body_bytes=100)
    with TestClient(app) as client:
        assert client.post("/v1/answer", json={"question": "x" * 200}).status_code == 413
        assert client.post("/v1/answer", json={"question": "q?"}).status_code == 200


class FlakyStore:
    """A store whose first write fails, as a database that is briefly down."""

    def __init__(self, inner):
        self.inner = inner
        self.failures = 1

    def append_record(self, record):
        if self.failures:
            self.failures -= 1
            raise ConnectionError("database restarting")
        return self.inner.append_record(record)

    def __getattr__(self, name):
        return getattr(self.inner, name)


def test_a_failing_store_journals_the_record_durably_and_writes_it_later(store):
    """The store is down for one write: the record goes to the crash-safe journal beside the
    store, so the answer may say persisted (it survives kill -9), and it reaches the store."""
    flaky = FlakyStore(store)
    app = make_app(flaky, make_pipeline([GOOD_ANSWER]))
    with TestClient(app) as client:
        body = client.post("/v1/answer", json={"question": GOOD_QUESTION}).json()
        assert body["audit_persisted"] is True
        assert app.state.answerer.writer.status()["journal"]
        assert app.state.answerer.writer.flush(timeout=10)
    assert store.get(body["request_id"]).record["response"]["answer"] == body["answer"]
    assert store.verify_chain().ok


def test_a_failing_store_without_a_journal_flags_the_answer_and_writes_it_later():
    """No journal (an in-memory store) and the store down past the writer's durable wait: the
    record only waits in memory, and the answer says it is not persisted; it is written once
    the store is back."""
    from tracerag.store import open_store

    inner = open_store("sqlite://")
    flaky = FlakyStore(inner)
    flaky.failures = 10**6  # down until the answer has gone out
    app = make_app(flaky, make_pipeline([GOOD_ANSWER]))
    with TestClient(app) as client:
        body = client.post("/v1/answer", json={"question": GOOD_QUESTION}).json()
        assert body["audit_persisted"] is False
        flaky.failures = 0  # back
        assert app.state.answerer.writer.status()["journal"] is None
        assert app.state.answerer.writer.flush(timeout=10)
        assert inner.get(body["request_id"]).record["response"]["answer"] == body["answer"]


def test_concurrent_answers_are_all_stored_once(store):
    app = make_app(store, make_pipeline([GOOD_ANSWER]))

    async def main():
        transport = httpx.ASGITransport(app=app)
        async with httpx.AsyncClient(transport=transport, base_url="http://test") as client:
            replies = await asyncio.gather(
                *[client.post("/v1/answer", json={"question": f"q {i}?"}) for i in range(24)]
            )
        return [r.json()["request_id"] for r in replies if r.status_code == 200]

    ids = asyncio.run(main())
    assert len(ids) == 24 == len(set(ids))
    assert sorted(s.request_id for s in store.list_requests(limit=100)) == sorted(ids)
    assert store.verify_chain().ok


def test_review_desk_will_not_run_without_a_token(store, monkeypatch):
    from tracerag.server._asgi import create_app

    monkeypatch.delenv("TRACERAG_REVIEWER_TOKEN", raising=False)
    with pytest.raises(ConfigurationError, match="TRACERAG_REVIEWER_TOKEN"):
        create_app(make_pipeline(), store)
    with pytest.raises(ConfigurationError, match="at least 16"):
        create_app(make_pipeline(), store, reviewer_token="short")
    app = create_app(make_pipeline([GOOD_ANSWER]), store, review_desk=False)
    with TestClient(app) as client:
        assert client.get("/review").status_code == 404
        assert client.post("/v1/answer", json={"question": "q?"}).status_code == 200
    monkeypatch.setenv("TRACERAG_REVIEWER_TOKEN", STRONG_TOKEN)
    assert create_app(make_pipeline(), store) is not None


def test_default_app_serves_the_demo_knowledge_base(store):
    from tracerag.server._asgi import create_app

    app = create_app(store=store, reviewer_token=STRONG_TOKEN)
    with TestClient(app) as client:
        body = client.post("/v1/answer", json={"question": "How long is the warranty on a laptop?"})
    assert body.status_code == 200
    assert body.json()["decision"] == "pass"
    assert any(e["material_id"] == "warranty" for e in body.json()["evidence"])


@pytest.mark.integration
def test_stream_over_a_real_socket(store):
    app = make_app(store, make_pipeline([GOOD_ANSWER]))
    with running(app) as base:
        seen = []
        with httpx.stream(
            "POST", f"{base}/v1/answer/stream", json={"question": GOOD_QUESTION}, timeout=30
        ) as reply:
            assert reply.status_code == 200
            for line in reply.iter_lines():
                if line.startswith("event: "):
                    seen.append(line.removeprefix("event: "))
        plain = httpx.post(f"{base}/v1/answer", json={"question": GOOD_QUESTION}, timeout=30)
    assert seen == ["stage"] * 6 + ["response"]
    assert plain.status_code == 200 and plain.json()["decision"] == "pass"
    assert len(store.list_requests()) == 2


def test_a_wrapped_chain_is_streamed_and_stored_like_a_pipeline(store):
    """The server runs wrap() through the same public hooks: stage events, its own record sink."""
    from langchain_core.output_parsers import StrOutputParser
    from langchain_core.prompts import ChatPromptTemplate
    from langchain_core.runnables import RunnablePassthrough
    from server_fixtures import documents

    from tracerag import _semconv as semconv
    from tracerag import wrap
    from tracerag.demo.kb import build_vectorstore
    from tracerag.testing import ScriptedChatModel

    retriever = build_vectorstore(documents()).as_retriever(search_kwargs={"k": 4})
    prompt = ChatPromptTemplate.from_messages([("human", "{context}\n{question}")])
    llm = ScriptedChatModel(responses=[GOOD_ANSWER], temperature=0.7)
    chain = (
        {"context": retriever, "question": RunnablePassthrough()} | prompt | llm | StrOutputParser()
    )
    spans = SpanCapture()
    wrapped = wrap(chain, n_samples=3, audit=None, tracer_provider=spans.provider)
    with TestClient(make_app(store, wrapped)) as client:
        events = parse_sse(client.post("/v1/answer/stream", json={"question": GOOD_QUESTION}).text)
    stages = [data for kind, data in events if kind == "stage"]
    ran = [s["stage"] for s in stages]
    assert ran == ["register", "retrieve", "sample", "plan", "verify", "assemble"]
    assert stages[3]["signals"]["mode"] == "wrap"
    kind, response = events[-1]
    assert kind == "response" and response["audit_persisted"] is True
    stored = store.get(response["request_id"])
    assert stored.audit.params["positional"] is True
    assert stored.audit.decision == response["decision"] == "pass"
    assert spans.root(response["request_id"]).attributes[semconv.MODE] == "wrap"
