"""The answer streams as FastAPI's EventSourceResponse frames them: the preamble, each event's
fields, the JSON of its data as the run made it, and the 204 of a stream with nothing left."""

from __future__ import annotations

import json

import pytest

pytest.importorskip("fastapi")

from fastapi.sse import ServerSentEvent
from fastapi.testclient import TestClient
from server_fixtures import GOOD_ANSWER, GOOD_QUESTION, make_app, make_pipeline, make_store

from tracerag.server._routes.sse import decision_sent


@pytest.fixture
def store(tmp_path):
    s = make_store(tmp_path)
    yield s
    s.close()


def blocks(text: str) -> list[str]:
    assert text.endswith("\n\n"), "every block ends with a blank line"
    return text[:-2].split("\n\n")


def test_the_stream_opens_with_its_name_and_retry_hint_then_frames_each_event(store):
    with TestClient(make_app(store, make_pipeline([GOOD_ANSWER]), review_desk=False)) as client:
        reply = client.post("/v1/answer/stream", json={"question": GOOD_QUESTION})
    assert reply.status_code == 200
    assert reply.headers["content-type"] == "text/event-stream; charset=utf-8"
    assert reply.headers["cache-control"] == "no-cache"
    assert reply.headers["x-accel-buffering"] == "no"
    rid = reply.headers["x-request-id"]
    assert reply.text.startswith(": tracerag answer stream\nretry: 3000\n\n")
    events = [b for b in blocks(reply.text)[1:] if b != ": ping"]
    parts = ["register", "retrieve", "plan", "sample", "verify", "assemble", "response"]
    assert len(events) == len(parts)
    for block, part in zip(events, parts, strict=True):
        event, data, id_ = block.split("\n")
        assert event == ("event: response" if part == "response" else "event: stage")
        assert id_ == f"id: {rid}:{part}"
        assert data.startswith("data: {") and ", " not in data[:40]  # compact, one line
        assert json.loads(data[len("data: ") :])["request_id"] == rid


def test_a_decision_is_one_line_of_compact_json_with_chinese_as_it_is():
    sent = decision_sent("r1", {"state": "edited", "final_answer": "退款在5个工作日内到账"})
    assert sent == ServerSentEvent(
        event="decision",
        id="r1:decision",
        raw_data='{"state":"edited","final_answer":"退款在5个工作日内到账"}',
    )


def test_a_stream_with_nothing_left_answers_204_with_its_headers(store):
    with TestClient(make_app(store, make_pipeline([GOOD_ANSWER]), review_desk=False)) as client:
        first = client.post("/v1/answer/stream", json={"question": GOOD_QUESTION})
        rid = first.headers["x-request-id"]
        again = client.post(
            "/v1/answer/stream",
            json={"question": GOOD_QUESTION},
            headers={"Last-Event-ID": f"{rid}:response"},
        )
        unknown = client.post(
            "/v1/answer/stream",
            json={"question": GOOD_QUESTION},
            headers={"Last-Event-ID": f"{rid}:nonsense"},
        )
    assert again.status_code == 204 and again.content == b""
    assert again.headers["x-request-id"] == rid
    assert again.headers["idempotency-replayed"] == "true"
    assert unknown.status_code == 400
    assert unknown.json()["error"] == "bad_request"


@pytest.mark.integration
def test_a_stream_left_while_it_waits_for_the_decision_stops_waiting(store):
    """A caller that closes its stream while a reviewer has not decided leaves no waiter
    behind on the server (a real server on 127.0.0.1, a real HTTP connection)."""
    import time

    import httpx
    from server_fixtures import EVIL_QUESTION, running

    app = make_app(store, make_pipeline())
    watch = app.state.services.decisions
    with running(app) as base, httpx.Client(base_url=base, timeout=10.0) as client:
        with client.stream(
            "POST", "/v1/answer/stream?until=decision", json={"question": EVIL_QUESTION}
        ) as stream:
            assert stream.status_code == 200
            seen = ""
            for chunk in stream.iter_text():
                seen += chunk
                if "event: response" in seen and seen.endswith("\n\n"):
                    break
            deadline = time.monotonic() + 10
            while not watch._waiting and time.monotonic() < deadline:
                time.sleep(0.02)  # the stream now waits for the reviewer
            assert watch._waiting, "the stream never waited for the decision"
        # the connection is closed: the server's stream ends and forgets its waiter
        deadline = time.monotonic() + 10
        while watch._waiting and time.monotonic() < deadline:
            time.sleep(0.02)
    assert watch._waiting == {}
