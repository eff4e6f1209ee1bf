"""Streams a caller can resume, keys that make a retry the same request, and the decision.

A reconnect (``Last-Event-ID``) or a retry (``Idempotency-Key``) never asks the question
again: one stored request, one run of the model, one review item. ``POST /v1/requests`` gives
an events URL an ``EventSource`` can open without the API key; a request routed to a reviewer
keeps its stream open until the decision. Two apps on one store file stand for two replicas.
"""

from __future__ import annotations

import asyncio
import json
import logging
import threading
import time
from typing import Any

import pytest

pytest.importorskip("fastapi")
from fastapi.testclient import TestClient
from server_fixtures import (
    API_KEY,
    BEARER_TOKEN_HEADER,
    EVIL_QUESTION,
    GOOD_ANSWER,
    GOOD_QUESTION,
    make_app,
    make_pipeline,
    make_store,
)
from waiting import await_until, wait_until

from tracerag.server._run_book import RunBook
from tracerag.server._run_table import open_run_table
from tracerag.server._signed_urls import StreamTokens
from tracerag.store._sqlite import SQLiteAuditStore

KEY = {"X-API-Key": API_KEY}
STAGES = ["register", "retrieve", "plan", "sample", "verify", "assemble"]


def events(text: str) -> list[tuple[str, str, Any]]:
    """``(event, id, data)`` of each event of an SSE body (comments left out)."""
    out = []
    for block in text.strip().split("\n\n"):
        fields: dict[str, str] = {}
        for line in block.split("\n"):
            if line.startswith(":"):
                continue
            name, _, value = line.partition(": ")
            fields[name] = value
        if "event" in fields:
            out.append((fields["event"], fields["id"], json.loads(fields["data"])))
    return out


def model_calls(pipeline: Any) -> int:
    return len(pipeline.settings.llm.calls)


@pytest.fixture
def store(tmp_path):
    s = make_store(tmp_path)
    yield s
    s.close()


def decide(client: TestClient, request_id: str, **body: Any) -> Any:
    body = {"action": "edit", "reason": "the policy says so", "reviewer": "bob", **body}
    return client.post(
        f"/review/api/items/{request_id}/decision", json=body, headers=BEARER_TOKEN_HEADER
    )


# -- Idempotency-Key ---------------------------------------------------------------------------


def test_a_key_sent_again_replays_the_request_instead_of_asking_again(store):
    pipeline = make_pipeline([GOOD_ANSWER])
    with TestClient(make_app(store, pipeline)) as client:
        first = client.post(
            "/v1/answer", json={"question": GOOD_QUESTION}, headers={"Idempotency-Key": "k-1"}
        )
        calls = model_calls(pipeline)
        again = client.post(
            "/v1/answer", json={"question": GOOD_QUESTION}, headers={"Idempotency-Key": "k-1"}
        )
        other = client.post(
            "/v1/answer", json={"question": GOOD_QUESTION}, headers={"Idempotency-Key": "k-2"}
        )
    assert first.status_code == again.status_code == 200
    assert again.json() == first.json()
    assert "idempotency-replayed" not in first.headers
    assert again.headers["idempotency-replayed"] == "true"
    assert again.headers["x-request-id"] == first.json()["request_id"]
    assert other.json()["request_id"] != first.json()["request_id"]
    assert model_calls(pipeline) == 2 * calls  # k-1 once, k-2 once
    assert len(store.list_requests()) == 2


def test_a_key_used_for_another_question_is_refused(store):
    with TestClient(make_app(store, make_pipeline([GOOD_ANSWER]))) as client:
        client.post(
            "/v1/answer", json={"question": GOOD_QUESTION}, headers={"Idempotency-Key": "k"}
        )
        reply = client.post(
            "/v1/answer",
            json={"question": GOOD_QUESTION, "user_id": "someone-else"},
            headers={"Idempotency-Key": "k"},
        )
    assert reply.status_code == 422
    assert reply.json()["error"] == "idempotency_key_reused"
    assert len(store.list_requests()) == 1


@pytest.mark.parametrize("key", ["", "with space", "x" * 256, "tab\tkey"])
def test_a_key_that_cannot_be_one_is_a_400(store, key):
    with TestClient(make_app(store, make_pipeline([GOOD_ANSWER]))) as client:
        reply = client.post(
            "/v1/answer", json={"question": GOOD_QUESTION}, headers={"Idempotency-Key": key}
        )
    assert reply.status_code == 400 and reply.json()["error"] == "bad_request"
    assert store.list_requests() == []


def test_an_escalated_request_retried_with_its_key_makes_one_review_item(store):
    with TestClient(make_app(store, make_pipeline())) as client:
        replies = [
            client.post(path, json={"question": EVIL_QUESTION}, headers={"Idempotency-Key": "esc"})
            for path in ("/v1/answer", "/v1/answer/stream", "/v1/requests", "/v1/answer")
        ]
    assert [r.status_code for r in replies] == [200, 200, 202, 200]
    rid = replies[0].json()["request_id"]
    assert replies[0].json()["decision"] == "escalate" and replies[0].json()["answer"] is None
    assert [e[0] for e in events(replies[1].text)] == ["stage"] * 6 + ["response"]
    assert {r.headers["x-request-id"] for r in replies} == {rid}
    assert len(store.list_requests()) == 1
    assert [item.request_id for item in store.list_queue()] == [rid]


# -- Last-Event-ID ------------------------------------------------------------------------------


def test_a_stream_resumes_after_the_last_event_without_asking_again(store):
    pipeline = make_pipeline([GOOD_ANSWER])
    with TestClient(make_app(store, pipeline)) as client:
        whole = events(client.post("/v1/answer/stream", json={"question": GOOD_QUESTION}).text)
        calls = model_calls(pipeline)
        rid = whole[0][2]["request_id"]
        assert [e[1] for e in whole] == [f"{rid}:{s}" for s in STAGES] + [f"{rid}:response"]
        resumed = client.post(
            "/v1/answer/stream",
            json={"question": GOOD_QUESTION},
            headers={"Last-Event-ID": f"{rid}:plan"},
        )
        done = client.post(
            "/v1/answer/stream",
            json={"question": GOOD_QUESTION},
            headers={"Last-Event-ID": f"{rid}:response"},
        )
    assert resumed.status_code == 200 and resumed.headers["x-request-id"] == rid
    assert events(resumed.text) == whole[3:]  # sample, verify, assemble, response
    assert done.status_code == 204  # nothing left: EventSource stops
    assert model_calls(pipeline) == calls
    assert len(store.list_requests()) == 1


def test_a_resume_that_names_another_question_or_no_event_is_refused(store):
    with TestClient(make_app(store, make_pipeline([GOOD_ANSWER]))) as client:
        rid = client.post("/v1/answer", json={"question": GOOD_QUESTION}).json()["request_id"]
        other = client.post(
            "/v1/answer/stream",
            json={"question": "Another question?"},
            headers={"Last-Event-ID": f"{rid}:plan"},
        )
        garbage = client.post(
            "/v1/answer/stream",
            json={"question": GOOD_QUESTION},
            headers={"Last-Event-ID": "<script>"},
        )
        unknown = client.post(
            "/v1/answer/stream",
            json={"question": GOOD_QUESTION},
            headers={"Last-Event-ID": "0123abcd:plan"},
        )
    assert other.status_code == 409 and other.json()["error"] == "conflict"
    assert garbage.status_code == 400 and garbage.json()["error"] == "bad_request"
    assert unknown.status_code == 404 and unknown.json()["error"] == "not_found"
    assert len(store.list_requests()) == 1


# -- the events URL ------------------------------------------------------------------------------


def test_post_requests_gives_an_events_url_that_needs_no_api_key(store):
    app = make_app(store, make_pipeline([GOOD_ANSWER]), api_key=API_KEY)
    with TestClient(app) as client:
        started = client.post("/v1/requests", json={"question": GOOD_QUESTION}, headers=KEY)
        assert started.status_code == 202
        ticket = started.json()
        rid = ticket["request_id"]
        assert started.headers["location"] == ticket["status_url"] == f"/v1/requests/{rid}"
        assert ticket["events_url"].startswith(f"/v1/requests/{rid}/events?token=")
        assert GOOD_QUESTION not in ticket["events_url"]
        assert ticket["expires_at"] > time.time() + 3000
        stream = client.get(ticket["events_url"])  # what EventSource does: no headers
        assert stream.status_code == 200
        assert stream.headers["content-type"].startswith("text/event-stream")
        got = events(stream.text)
        assert [e[0] for e in got] == ["stage"] * 6 + ["response"]
        assert got[-1][2]["answer"].startswith("Customers may return")
        # the browser reconnects after the last event: 204 tells it to stop
        again = client.get(ticket["events_url"], headers={"Last-Event-ID": got[-1][1]})
        assert again.status_code == 204
        fresh = client.get(f"/v1/requests/{rid}/events-url", headers=KEY).json()
        assert fresh["request_id"] == rid and client.get(fresh["events_url"]).status_code == 200
    assert len(store.list_requests()) == 1


def test_the_events_take_the_key_or_a_live_token_of_that_request(store, caplog):
    app = make_app(store, make_pipeline([GOOD_ANSWER]), api_key=API_KEY)
    tokens = StreamTokens(API_KEY)
    with TestClient(app) as client:
        a = client.post("/v1/requests", json={"question": GOOD_QUESTION}, headers=KEY).json()
        b = client.post("/v1/requests", json={"question": GOOD_QUESTION}, headers=KEY).json()
        path = f"/v1/requests/{a['request_id']}/events"
        b_token = b["events_url"].split("token=")[1]
        expired, _ = tokens.make(a["request_id"], now=time.time() - 7200)
        other_key, _ = StreamTokens("another-key-0123456789").make(a["request_id"])
        with caplog.at_level(logging.WARNING, logger="tracerag.server.security"):
            refused = {
                "none": client.get(path),
                "another request's": client.get(f"{path}?token={b_token}"),
                "expired": client.get(f"{path}?token={expired}"),
                "another key's": client.get(f"{path}?token={other_key}"),
                "garbage": client.get(f"{path}?token=1.%E6%88%91"),
                "wrong key": client.get(path, headers={"X-API-Key": "nope"}),
            }
        assert {k: r.status_code for k, r in refused.items()} == dict.fromkeys(refused, 401)
        assert all(r.json()["error"] == "unauthorized" for r in refused.values())
        assert client.get(path, headers=KEY).status_code == 200
        assert client.get(a["events_url"]).status_code == 200
        # the token opens the events only: not the outcome, not another question
        token_only = a["events_url"].split("?")[1]
        assert client.get(f"/v1/requests/{a['request_id']}?{token_only}").status_code == 401
        assert client.post(f"/v1/requests?{token_only}", json={"question": "q?"}).status_code == 401
    logged = " ".join(r.getMessage() for r in caplog.records)
    assert "refused the events" in logged and b_token not in logged and expired not in logged


def test_a_caller_waits_on_its_stream_for_the_reviewers_decision(store):
    with TestClient(make_app(store, make_pipeline())) as client:
        ticket = client.post("/v1/requests", json={"question": EVIL_QUESTION}).json()
        rid = ticket["request_id"]
        seen: list[tuple[float, str]] = []
        decided: list[Any] = []

        def reviewer() -> None:
            watch = client.app.state.services.decisions
            wait_until(lambda: watch.waiting, "the stream to wait for the decision")
            decided.append(decide(client, rid, final_answer="Refunds take 5 business days."))

        start = time.monotonic()
        with client.stream("GET", ticket["events_url"]) as stream:
            body = ""
            for chunk in stream.iter_text():
                body += chunk
                if "event: response" in chunk:
                    seen.append((time.monotonic() - start, "response"))
                    thread = threading.Thread(target=reviewer)
                    thread.start()
            seen.append((time.monotonic() - start, "end"))
        thread.join()
    got = events(body)
    assert [e[0] for e in got] == ["stage"] * 6 + ["response", "decision"]
    assert got[6][2]["decision"] == "escalate" and got[6][2]["answer"] is None
    decision = got[7]
    assert decision[1] == f"{rid}:decision"
    assert decision[2]["state"] == "edited"
    assert decision[2]["final_answer"] == "Refunds take 5 business days."
    assert decided[0].status_code == 200
    # a reconnect after the decision has nothing more to send
    with TestClient(make_app(store, make_pipeline())) as client:
        again = client.get(ticket["events_url"], headers={"Last-Event-ID": decision[1]})
        late = client.get(ticket["events_url"])  # a new page: the response, then the decision
    assert again.status_code == 204
    assert [e[0] for e in events(late.text)][-2:] == ["response", "decision"]


def test_the_answer_stream_can_wait_for_the_decision_too(store):
    with TestClient(make_app(store, make_pipeline())) as client:
        first = client.post("/v1/answer", json={"question": EVIL_QUESTION})
        rid = first.json()["request_id"]
        assert decide(client, rid, action="reject").status_code == 200
        reply = client.post(
            "/v1/answer/stream?until=decision",
            json={"question": EVIL_QUESTION},
            headers={"Last-Event-ID": f"{rid}:response"},
        )
    assert [e[0] for e in events(reply.text)] == ["decision"]
    assert events(reply.text)[0][2]["state"] == "rejected"
    assert events(reply.text)[0][2]["final_answer"] is None


def test_a_passed_answer_does_not_wait_for_a_decision(store):
    with TestClient(make_app(store, make_pipeline([GOOD_ANSWER]))) as client:
        reply = client.post("/v1/answer/stream?until=decision", json={"question": GOOD_QUESTION})
    assert [e[0] for e in events(reply.text)][-1] == "response"


# -- two replicas on one store ----------------------------------------------------------------


def test_a_key_reaches_another_replica_through_the_store(tmp_path):
    path = str(tmp_path / "audit.sqlite")
    store_a, store_b = SQLiteAuditStore(path), SQLiteAuditStore(path)
    pipe_a, pipe_b = make_pipeline([GOOD_ANSWER], latency=0.4), make_pipeline([GOOD_ANSWER])
    try:
        with (
            TestClient(make_app(store_a, pipe_a)) as a,
            TestClient(make_app(store_b, pipe_b)) as b,
        ):
            replies: dict[str, Any] = {}

            def ask(name: str, client: TestClient) -> None:
                replies[name] = client.post(
                    "/v1/answer/stream",
                    json={"question": GOOD_QUESTION},
                    headers={"Idempotency-Key": "shared"},
                )

            first = threading.Thread(target=ask, args=("a", a))
            first.start()
            table_b = b.app.state.services.runs.table
            wait_until(lambda: table_b.count() == 1, "a's run to be claimed in the shared table")
            under_way = store_b.list_requests() == []  # a has not stored its record yet
            ask("b", b)
            first.join()
            later = b.post(
                "/v1/answer",
                json={"question": GOOD_QUESTION},
                headers={"Idempotency-Key": "shared"},
            )
        got_a, got_b = events(replies["a"].text), events(replies["b"].text)
        assert under_way  # b followed a run still under way on a
        assert got_b == got_a  # the same events, the response read from the stored record
        assert [e[0] for e in got_b] == ["stage"] * 6 + ["response"]
        assert replies["b"].headers["idempotency-replayed"] == "true"
        assert later.json()["request_id"] == got_a[0][2]["request_id"]
        assert model_calls(pipe_b) == 0
        assert len(store_a.list_requests()) == 1
        assert store_a.verify_chain().ok
    finally:
        store_a.close()
        store_b.close()


def test_a_replay_reads_the_answer_from_the_audit_record_not_the_run_table(tmp_path):
    """Someone with database access rewrites a stored run: the replayed answer is still the
    one the chained record holds."""
    import sqlite3

    path = str(tmp_path / "audit.sqlite")
    store_a, store_b = SQLiteAuditStore(path), SQLiteAuditStore(path)
    try:
        with TestClient(make_app(store_a, make_pipeline([GOOD_ANSWER]))) as a:
            true = events(a.post("/v1/answer/stream", json={"question": GOOD_QUESTION}).text)
        rid = true[0][2]["request_id"]
        forged = [[name, data] for name, _, data in true[:-1]]
        forged.append(["response", {**true[-1][2], "answer": "FORGED: refunds within 365 days."}])
        with sqlite3.connect(path) as db:
            db.execute(
                "UPDATE answer_runs SET events = ? WHERE request_id = ?", (json.dumps(forged), rid)
            )
        with TestClient(make_app(store_b, make_pipeline([GOOD_ANSWER]))) as b:
            replay = events(b.get(f"/v1/requests/{rid}/events").text)
        assert replay[-1][2]["answer"] == true[-1][2]["answer"]
        assert "FORGED" not in json.dumps(replay)
    finally:
        store_a.close()
        store_b.close()


def test_a_decision_taken_on_another_replica_reaches_the_waiting_stream(tmp_path):
    path = str(tmp_path / "audit.sqlite")
    store_a, store_b = SQLiteAuditStore(path), SQLiteAuditStore(path)
    try:
        with (
            TestClient(make_app(store_a, make_pipeline())) as a,
            TestClient(make_app(store_b, make_pipeline())) as b,
        ):
            ticket = a.post("/v1/requests", json={"question": EVIL_QUESTION}).json()
            results: list[Any] = []

            def on_b() -> None:
                watch = a.app.state.services.decisions
                wait_until(lambda: watch.waiting, "a's stream to wait for the decision")
                results.append(decide(b, ticket["request_id"], action="approve"))

            thread = threading.Thread(target=on_b)
            thread.start()
            start = time.monotonic()
            body = a.get(ticket["events_url"]).text  # the stream ends with the decision
            waited = time.monotonic() - start
            thread.join()
        assert results[0].status_code == 200
        got = events(body)
        assert got[-1][0] == "decision" and got[-1][2]["state"] == "approved"
        assert waited < 10  # within the watch's poll, not a caller's
    finally:
        store_a.close()
        store_b.close()


# -- bounds ------------------------------------------------------------------------------------


async def _answer_runs(book: RunBook, n: int, key_prefix: str | None = None) -> list[str]:
    async def runner(data: dict[str, Any], on_stage: Any) -> Any:
        return {"request_id": data["request_id"], "answer": "a" * 500, "decision": "pass"}

    ids = []
    for i in range(n):
        key = f"{key_prefix}-{i}" if key_prefix else None
        run, _ = await book.start({"question": f"q{i}?"}, runner, key=key)
        await run.final()
        ids.append(run.request_id)
    await asyncio.sleep(0)  # a yield, not a wait: the runs' done callbacks run
    return ids


def all_expired(book: RunBook) -> bool:
    """Every run the book keeps ended more than its time to live ago."""
    now = time.monotonic()
    return all(r.ended_at is not None and now - r.ended_at > book.ttl for r in book.runs.values())


def test_the_run_book_keeps_at_most_its_bound_and_forgets_after_its_time(store):
    async def scenario() -> None:
        book = RunBook(store, None, ttl=0.3, max_runs=5)
        ids = await _answer_runs(book, 20, "k")
        assert len(book.runs) == 5 and list(book.runs) == ids[-5:]
        assert book.stats()["keys"] == 5
        await await_until(lambda: all_expired(book), "the kept runs to outlive their time")
        await _answer_runs(book, 1)
        assert len(book.runs) == 1  # the others expired

    asyncio.run(scenario())


def test_the_run_table_forgets_expired_runs(tmp_path):
    store = make_store(tmp_path)
    table = open_run_table(store)
    assert table is not None
    try:
        now = time.time()
        assert table.claim("r1", "key-1", "fp", now, ttl=10) is None
        assert table.claim("r2", "key-1", "fp", now, ttl=10).request_id == "r1"
        assert table.claim("r3", None, "fp", now - 20, ttl=10) is None
        assert table.get("r3", now) is None  # expired: gone for readers at once
        assert table.purge(now) == 1
        # an expired key is free again
        assert table.claim("r4", "key-1", "fp", now + 11, ttl=10) is None
    finally:
        table.close()
        store.close()


def test_concurrent_requests_with_one_key_run_once(store):
    calls = []

    async def scenario() -> None:
        book = RunBook(store, None)

        async def runner(data: dict[str, Any], on_stage: Any) -> Any:
            calls.append(data["request_id"])
            await asyncio.sleep(0.05)  # sleep is the behaviour: a slow run the others join
            return {"request_id": data["request_id"], "decision": "pass"}

        results = await asyncio.gather(
            *[book.start({"question": "q?"}, runner, key="same") for _ in range(8)]
        )
        assert len({run.request_id for run, _ in results}) == 1
        assert sorted(replayed for _, replayed in results) == [False] + [True] * 7

    asyncio.run(scenario())
    assert len(calls) == 1


def test_without_the_table_a_key_still_holds_on_this_replica(store, caplog):
    class Broken:
        def claim(self, *args: Any) -> Any:
            raise OSError("disk gone")

        def finish(self, *args: Any) -> None:
            raise OSError("disk gone")

        def close(self) -> None:
            pass

    async def scenario() -> None:
        book = RunBook(store, Broken())  # type: ignore[arg-type]
        first = await _answer_runs(book, 1, "k")
        again = await _answer_runs(book, 1, "k")
        assert first == again
        await asyncio.gather(*book.tasks)
        assert book.table_failures == 1  # the claim; its events are kept here only

    with caplog.at_level(logging.WARNING, logger="tracerag.server"):
        asyncio.run(scenario())
    assert "on this replica only" in caplog.text


def test_a_run_whose_replica_stopped_ends_in_request_unfinished(store):
    """Another replica took the key and stopped before it finished: a follower does not wait
    for ever, and says what is true."""
    from tracerag.server._run_book import fingerprint

    table = open_run_table(store)
    assert table is not None
    book = RunBook(store, table, follow_seconds=0.5)
    table.claim("lost-run", book.key_hash("k"), fingerprint({"question": "q?"}), time.time(), 60)

    async def scenario() -> tuple[tuple[str, Any], bool, bool]:
        async def never(data: dict[str, Any], on_stage: Any) -> Any:
            raise AssertionError("a key already taken must not run again")

        run, replayed = await book.start({"question": "q?"}, never, key="k")
        final = await run.final()
        return (final.name, final.data), replayed, run.local

    try:
        (name, data), replayed, local = asyncio.run(scenario())
    finally:
        table.close()
    assert replayed and not local
    assert name == "error" and data["error"] == "request_unfinished"
    assert "lost-run" in data["detail"]
    assert store.list_requests() == []


def test_a_run_whose_replica_stopped_after_storing_its_record_is_replayed_from_it(tmp_path):
    """The other replica stored the record, then stopped before storing its events."""
    path = str(tmp_path / "audit.sqlite")
    store_a = SQLiteAuditStore(path)
    try:
        with TestClient(make_app(store_a, make_pipeline([GOOD_ANSWER]))) as a:
            rid = a.post("/v1/answer", json={"question": GOOD_QUESTION}).json()["request_id"]
        table = open_run_table(store_a)
        assert table is not None
        from tracerag.server._run_book import fingerprint

        book = RunBook(store_a, table, follow_seconds=5)
        table.claim(
            rid, book.key_hash("k2"), fingerprint({"question": GOOD_QUESTION}), time.time(), 60
        )

        async def scenario() -> tuple[str, Any]:
            async def never(data: dict[str, Any], on_stage: Any) -> Any:
                raise AssertionError("asked again")

            run, replayed = await book.start({"question": GOOD_QUESTION}, never, key="k2")
            assert replayed and run.request_id == rid
            final = await run.final()
            return final.name, final.data

        name, data = asyncio.run(scenario())
        table.close()
    finally:
        store_a.close()
    assert name == "response" and data["request_id"] == rid
    assert data["audit_persisted"] is True and data["answer"].startswith("Customers may")


def test_after_its_events_expired_a_stream_gives_the_response_and_the_decision(store):
    with TestClient(make_app(store, make_pipeline(), replay_seconds=0.2)) as client:
        rid = client.post("/v1/answer", json={"question": EVIL_QUESTION}).json()["request_id"]
        assert decide(client, rid, action="reject").status_code == 200
        book = client.app.state.services.runs
        wait_until(lambda: all_expired(book), "the run's events to outlive the replay window")
        client.app.state.services.runs.runs.clear()  # as after a restart
        table = client.app.state.services.runs.table
        assert table.get(rid, time.time()) is None  # a plain answer is not kept there
        whole = client.get(f"/v1/requests/{rid}/events")
        resumed = client.get(f"/v1/requests/{rid}/events", headers={"Last-Event-ID": f"{rid}:plan"})
    assert [e[0] for e in events(whole.text)] == ["response", "decision"]
    assert [e[0] for e in events(resumed.text)] == ["response", "decision"]
    assert events(whole.text)[0][2]["answer"] is None  # still withheld
    assert events(whole.text)[1][2]["state"] == "rejected"


def test_a_decision_wait_outlives_a_failing_store(store, caplog):
    """The store fails while a caller waits: the wait goes on, and ends with the decision."""
    from tracerag.server._routes.api import request_status
    from tracerag.server._run_book import DecisionWatch

    with TestClient(make_app(store, make_pipeline())) as client:
        rid = client.post("/v1/answer", json={"question": EVIL_QUESTION}).json()["request_id"]

    class Flaky:
        failures = 6

        def __getattr__(self, name: str) -> Any:
            return getattr(store, name)

        def _maybe_fail(self) -> None:
            if Flaky.failures > 0:
                Flaky.failures -= 1
                raise OSError("database is locked")

        def get(self, request_id: str) -> Any:
            self._maybe_fail()
            return store.get(request_id)

        def get_decision(self, request_id: str) -> Any:
            self._maybe_fail()
            return store.get_decision(request_id)

    async def scenario() -> dict[str, Any]:
        watch = DecisionWatch(Flaky(), None, request_status, poll_interval=0.05)  # type: ignore[arg-type]
        waiting = asyncio.create_task(watch.wait(rid))
        await await_until(lambda: Flaky.failures == 0, "the store to fail six times")
        assert not waiting.done()
        await asyncio.to_thread(store.decide, rid, "alice", "reject", None, "off topic")
        status = await asyncio.wait_for(waiting, 10)
        await watch.close()
        return status

    with caplog.at_level(logging.WARNING, logger="tracerag.server"):
        status = asyncio.run(scenario())
    assert status["state"] == "rejected" and status["request_id"] == rid
    assert "database is locked" in caplog.text
