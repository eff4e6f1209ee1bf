"""``tracerag serve --app`` as a real process on 127.0.0.1, serving the example's wrapped
LangGraph app; and two such processes on one store (SQLite, PostgreSQL) acting as replicas: a
key, a stream and a decision reach across them, each record stored once."""

from __future__ import annotations

import json
import threading
import uuid
from collections.abc import Iterator
from typing import Any

import httpx
import pytest
from serve_process import API_KEY, EXAMPLE_APP, TOKEN, serve_process

from tracerag.store import open_store

pytestmark = pytest.mark.integration

KEY = {"X-API-Key": API_KEY}
BEARER = {"Authorization": f"Bearer {TOKEN}"}
ENV = {"TRACERAG_REVIEWER_TOKEN": TOKEN, "TRACERAG_API_KEY": API_KEY}
PASSES = "How long is a Northwind gift card valid?"
ESCALATES = "What is the capital of Mars?"
MODEL_VERSION = "tracerag-extractive-1"  # the example app's model, learned by wrap()
STAGES = ["register", "retrieve", "plan", "sample", "verify", "assemble"]


def events(text: str) -> list[tuple[str, str, Any]]:
    out = []
    for block in text.strip().split("\n\n"):
        fields = dict(line.split(": ", 1) for line in block.split("\n") if not line.startswith(":"))
        if "event" in fields:
            out.append((fields["event"], fields["id"], json.loads(fields["data"])))
    return out


def test_serve_app_runs_the_wrapped_langgraph_app(tmp_path):
    store = tmp_path / "audit.sqlite"
    log = tmp_path / "serve.log"
    with (
        serve_process("--app", EXAMPLE_APP, "--store", str(store), log=log, env=ENV) as base,
        httpx.Client(base_url=base, timeout=60) as http,
    ):
        passed = http.post("/v1/answer", json={"question": PASSES}, headers=KEY).json()
        ticket = http.post("/v1/requests", json={"question": ESCALATES}, headers=KEY).json()
        with http.stream("GET", ticket["events_url"]) as stream:  # no key: the token
            body = ""
            for chunk in stream.iter_text():
                body += chunk
                if "event: response" in chunk:
                    decision = http.post(
                        f"/review/api/items/{ticket['request_id']}/decision",
                        json={
                            "action": "edit",
                            "final_answer": "Mars has no capital; ask about our policies.",
                            "reason": "not in the knowledge base",
                            "reviewer": "lin",
                        },
                        headers=BEARER,
                    )
    assert "examples.serve_langgraph_app:app" in log.read_text("utf-8")
    assert passed["decision"] == "pass" and "3 years" in passed["answer"]
    got = events(body)
    assert [e[0] for e in got] == ["stage"] * 6 + ["response", "decision"]
    assert got[6][2]["decision"] == "escalate" and got[6][2]["answer"] is None
    assert decision.status_code == 200
    assert got[7][2]["state"] == "edited" and got[7][2]["final_answer"].startswith("Mars has")
    with open_store(str(store), create=False) as stored:
        record = stored.get(passed["request_id"]).record
        assert record["retrieval"]["source"] == "runs"  # the graph's own retrieval
        assert record["versions"]["model"] == MODEL_VERSION
        assert len(stored.list_requests()) == 2
        assert stored.verify_chain().ok


@pytest.fixture(params=["sqlite", pytest.param("postgres")])
def shared_store(request, tmp_path) -> Iterator[str]:
    """A store URL two processes share."""
    if request.param == "sqlite":
        yield str(tmp_path / "audit.sqlite")
        return
    import psycopg
    from store_fixtures import postgres_dsn

    dsn = postgres_dsn()
    schema = "t_" + uuid.uuid4().hex[:12]
    with psycopg.connect(dsn, autocommit=True) as conn:
        conn.execute(f'CREATE SCHEMA "{schema}"')
    sep = "&" if "?" in dsn else "?"
    try:
        yield f"{dsn}{sep}options=-csearch_path%3D{schema}"
    finally:
        with psycopg.connect(dsn, autocommit=True) as conn:
            conn.execute(f'DROP SCHEMA IF EXISTS "{schema}" CASCADE')


def test_two_processes_share_keys_streams_and_decisions(tmp_path, shared_store):
    args = ("--app", EXAMPLE_APP, "--store", shared_store)
    # each process keeps its own audit journal on its own disk (PostgreSQL needs one)
    journal_a = ("--journal", str(tmp_path / "journal-a"))
    journal_b = ("--journal", str(tmp_path / "journal-b"))
    with (
        serve_process(*args, *journal_a, log=tmp_path / "a.log", env=ENV) as a,
        serve_process(*args, *journal_b, log=tmp_path / "b.log", env=ENV) as b,
        httpx.Client(timeout=120) as http,
    ):
        # a retry reaches the other replica while the first is under way: one request
        replies: dict[str, httpx.Response] = {}
        headers = {**KEY, "Idempotency-Key": "order-4711-question-1"}

        under_way = threading.Event()  # a's first event arrived: its run holds the key
        texts: dict[str, str] = {}

        def ask(name: str, base: str) -> None:
            url, body = f"{base}/v1/answer/stream", {"question": PASSES}
            with http.stream("POST", url, json=body, headers=headers) as reply:
                replies[name], texts[name] = reply, ""
                for chunk in reply.iter_text():
                    texts[name] += chunk
                    under_way.set()

        first = threading.Thread(target=ask, args=("a", a))
        first.start()
        assert under_way.wait(60), "a's stream sent nothing"
        ask("b", b)
        first.join()
        got_a, got_b = events(texts["a"]), events(texts["b"])
        assert [e[0] for e in got_a] == ["stage"] * 6 + ["response"]
        assert got_b == got_a
        assert replies["b"].headers["idempotency-replayed"] == "true"
        rid = got_a[0][2]["request_id"]

        # a request started on a, followed on b (events URL), decided on a: b's stream ends
        # with the decision
        ticket = http.post(f"{a}/v1/requests", json={"question": ESCALATES}, headers=KEY).json()
        decided: list[httpx.Response] = []

        def reviewer() -> None:
            decided.append(
                http.post(
                    f"{a}/review/api/items/{ticket['request_id']}/decision",
                    json={"action": "reject", "reason": "off topic", "reviewer": "wang"},
                    headers=BEARER,
                )
            )

        # the reviewer decides once b's stream has given the response and waits for the decision
        thread = threading.Thread(target=reviewer)
        text = ""
        with http.stream("GET", f"{b}{ticket['events_url']}") as stream:
            for chunk in stream.iter_text():
                text += chunk
                if "event: response" in text and not thread.is_alive() and not decided:
                    thread.start()
        followed = events(text)
        thread.join()
        assert decided[0].status_code == 200
        assert [e[0] for e in followed][-2:] == ["response", "decision"]
        assert followed[-1][2]["state"] == "rejected" and followed[-1][2]["final_answer"] is None
        # a reconnect to either replica after the decision: nothing left
        for base in (a, b):
            done = http.get(
                f"{base}{ticket['events_url']}", headers={"Last-Event-ID": followed[-1][1]}
            )
            assert done.status_code == 204
    with open_store(shared_store, create=False) as stored:
        ids = [r.request_id for r in stored.list_requests()]
        assert sorted(ids) == sorted([rid, ticket["request_id"]])  # each stored once
        assert [q.request_id for q in stored.list_queue()] == [ticket["request_id"]]
        assert stored.verify_chain().ok
    assert "Traceback" not in (tmp_path / "a.log").read_text("utf-8") + (
        tmp_path / "b.log"
    ).read_text("utf-8")
