"""Pages in Chromium against ``tracerag serve --app`` serving the example's wrapped LangGraph app.

The page lives on another origin (a second 127.0.0.1 port on the CORS allow-list) and is typed
from the served OpenAPI document (tests/frontend). Its backend — here, the test — holds the
API key, starts each request with ``POST /v1/requests`` and hands the page the events URL:

- ``EventSource`` follows the request: six stages, then the response;
- a connection cut midway (a proxy drops it) is resumed by ``EventSource`` with
  ``Last-Event-ID``: every event arrives once, and there is one request and one review item;
- a caller page waits for an escalated request and receives the reviewer's decision, making
  no request but its ``EventSource``'s;
- the fetch-stream helper the server ships resumes a dropped ``POST`` stream the same way.

Needs ``bash .ci/frontend.sh`` and ``bash .ci/browser.sh``: skipped without them locally,
failed under CI.
"""

from __future__ import annotations

import json
import time
from collections.abc import Iterator
from typing import Any

import httpx
import pytest
from serve_process import API_KEY, EXAMPLE_APP, TOKEN, CuttingProxy, serve_process
from server_fixtures import (
    CHROMIUM,
    CHROMIUM_ARGS,
    FRONTEND,
    browser_missing,
    frontend_missing,
    skip_or_fail,
    static_site,
)

pytestmark = pytest.mark.integration

KEY = {"X-API-Key": API_KEY}
BEARER = {"Authorization": f"Bearer {TOKEN}"}
# a wrapped app's stages, in the order they run: its own runs are the samples the plan reads
STAGES = ["register", "retrieve", "sample", "plan", "verify", "assemble"]
PASSES = "How long is a Northwind gift card valid?"
ESCALATES = "What is the capital of Mars?"


@pytest.fixture(scope="module")
def site() -> Iterator[str]:
    problem = frontend_missing() or browser_missing()
    if problem:
        skip_or_fail(problem)
    with static_site(FRONTEND) as url:
        yield url


@pytest.fixture(scope="module")
def served(site, tmp_path_factory) -> Iterator[tuple[str, str]]:
    """``tracerag serve --app`` with the API key, reviewers and the page's origin allowed."""
    from test_server_frontend import build_client

    tmp = tmp_path_factory.mktemp("served")
    store = str(tmp / "audit.sqlite")
    env = {"TRACERAG_REVIEWER_TOKEN": TOKEN, "TRACERAG_API_KEY": API_KEY}
    args = ("--app", EXAMPLE_APP, "--store", store, "--cors-origin", site)
    with serve_process(*args, log=tmp / "serve.log", env=env) as base:
        build_client(base)  # the page's types come from this server's OpenAPI document
        yield base, store


@pytest.fixture(scope="module")
def browser(site) -> Iterator[Any]:
    from playwright.sync_api import sync_playwright

    with sync_playwright() as pw:
        chromium = pw.chromium.launch(executable_path=CHROMIUM, args=CHROMIUM_ARGS)
        try:
            yield chromium
        finally:
            chromium.close()


def requests_of(store: str) -> list[Any]:
    from tracerag.store import open_store

    with open_store(store, create=False) as s:
        return s.list_requests()


def queue_of(store: str) -> list[Any]:
    from tracerag.store import open_store

    with open_store(store, create=False) as s:
        return s.list_queue()


def start(base: str, question: str) -> dict[str, Any]:
    reply = httpx.post(f"{base}/v1/requests", json={"question": question}, headers=KEY, timeout=30)
    assert reply.status_code == 202, reply.text
    return reply.json()


class Page:
    """A page of the frontend origin and every request it made."""

    def __init__(self, browser: Any) -> None:
        self.context = browser.new_context()
        self.page = self.context.new_page()
        self.requests: list[tuple[str, str]] = []
        self.errors: list[str] = []
        self.page.on("request", lambda r: self.requests.append((r.method, r.url)))
        self.page.on("console", lambda m: self.errors.append(m.text) if m.type == "error" else None)

    def open(self, url: str) -> None:
        self.page.goto(url)

    def wait(self, selector: str, timeout: float = 60_000) -> dict[str, Any]:
        self.page.wait_for_selector(selector, timeout=timeout)
        return json.loads(self.page.inner_text("#out") or "{}")

    def api_requests(self, base: str) -> list[tuple[str, str]]:
        return [(m, u) for m, u in self.requests if u.startswith(base)]

    def close(self) -> None:
        self.context.close()


@pytest.fixture
def page(browser) -> Iterator[Page]:
    p = Page(browser)
    try:
        yield p
    finally:
        p.close()


def events_page(site: str, events_url: str) -> str:
    return f"{site}/events.html?{httpx.QueryParams({'events': events_url})}"


def test_eventsource_follows_a_request_of_the_served_langgraph_app(served, site, page):
    base, store = served
    before = len(requests_of(store))
    ticket = start(base, PASSES)
    page.open(events_page(site, base + ticket["events_url"]))
    result = page.wait("body[data-done='1']")
    seen = result["seen"]
    assert [e["event"] for e in seen] == ["stage"] * 6 + ["response"]
    assert [e["data"]["stage"] for e in seen[:6]] == STAGES
    rid = ticket["request_id"]
    assert [e["id"] for e in seen] == [f"{rid}:{s}" for s in STAGES] + [f"{rid}:response"]
    response = seen[-1]["data"]
    assert response["decision"] == "pass" and "3 years" in response["answer"]
    assert "3 years" in page.page.inner_text("#state")
    # the page sent no key and made one request to the API: its EventSource
    assert page.api_requests(base) == [("GET", base + ticket["events_url"])]
    assert not page.errors, page.errors
    assert len(requests_of(store)) == before + 1


def test_a_dropped_stream_resumes_without_a_second_request_or_review_item(served, site, page):
    base, store = served
    before = len(requests_of(store))
    queued = len(queue_of(store))
    proxy = CuttingProxy(int(base.rsplit(":", 1)[1]), cut_after=3)
    try:
        ticket = start(base, ESCALATES)
        rid = ticket["request_id"]
        page.open(events_page(site, proxy.base + ticket["events_url"]))
        result = page.wait("body[data-last='response']")
    finally:
        proxy.close()
    seen = result["seen"]
    assert proxy.cuts == 1 and result["errors"] >= 1  # the connection did drop
    heads = proxy.heads("/events")
    assert len(heads) == 2
    assert "last-event-id" not in heads[0].lower()
    assert f"last-event-id: {rid}:sample" in heads[1].lower()  # resumed after the 3rd event
    assert [e["id"] for e in seen] == [f"{rid}:{s}" for s in STAGES] + [f"{rid}:response"]
    assert seen[-1]["data"]["decision"] == "escalate"
    assert len(requests_of(store)) == before + 1
    assert len(queue_of(store)) == queued + 1


def test_a_caller_page_receives_the_reviewers_decision_without_polling(served, site, page):
    base, store = served
    ticket = start(base, ESCALATES)
    rid = ticket["request_id"]
    page.open(events_page(site, base + ticket["events_url"]))
    waiting = page.wait("body[data-last='response']")
    response = waiting["seen"][-1]["data"]
    assert response["decision"] == "escalate" and response["answer"] is None
    assert page.page.inner_text("#state") == "withheld (pending_human_review)"
    time.sleep(1.5)  # sleep is the behaviour: the page just waits, nothing is sent meanwhile
    decided = httpx.post(
        f"{base}/review/api/items/{rid}/decision",
        json={
            "action": "edit",
            "final_answer": "火星没有首都；请咨询我们的售后政策。",
            "reason": "超出知识库范围",
            "reviewer": "李伟",
        },
        headers=BEARER,
        timeout=30,
    )
    assert decided.status_code == 200, decided.text
    result = page.wait("body[data-done='1']", timeout=30_000)
    decision = result["seen"][-1]
    assert decision["event"] == "decision" and decision["id"] == f"{rid}:decision"
    assert decision["data"]["state"] == "edited"
    assert decision["data"]["final_answer"] == "火星没有首都；请咨询我们的售后政策。"
    assert page.page.inner_text("#state") == "edited: 火星没有首都；请咨询我们的售后政策。"
    assert page.api_requests(base) == [("GET", base + ticket["events_url"])]  # no polling
    assert [q.request_id for q in queue_of(store)].count(rid) == 1


def test_the_fetch_helper_resumes_a_dropped_stream_with_its_key(served, site, page):
    base, store = served
    before = len(requests_of(store))
    proxy = CuttingProxy(int(base.rsplit(":", 1)[1]), cut_after=2)
    try:
        query = httpx.QueryParams(
            {"api": base, "base": proxy.base, "q": PASSES, "key": API_KEY, "idem": "web-q-1"}
        )
        page.open(f"{site}/helper.html?{query}")
        result = page.wait("body[data-done='1']")
    finally:
        proxy.close()
    assert "failure" not in result, result
    seen = result["seen"]
    rid = seen[0]["data"]["request_id"]
    assert [e["id"] for e in seen] == [f"{rid}:{s}" for s in STAGES] + [f"{rid}:response"]
    assert result["last"]["event"] == "response" and "3 years" in result["last"]["data"]["answer"]
    posts = [h.lower() for h in proxy.heads("/v1/answer/stream") if h.startswith("POST")]
    assert proxy.cuts == 1 and len(posts) == 2
    assert all("idempotency-key: web-q-1" in h for h in posts)
    assert "last-event-id" not in posts[0]
    assert f"last-event-id: {rid}:retrieve" in posts[1]
    assert len(requests_of(store)) == before + 1
