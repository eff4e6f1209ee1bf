"""The review desk in a real browser: Debian's Chromium driven by Playwright.

A reviewer signs in with the token, opens an escalated item and approves it, and the frontend
endpoint then returns the approved answer; a hostile document's ``<script>``/``onerror`` never
runs; without the token every reviewer route answers 401.

Needs ``/usr/bin/chromium`` and the ``playwright`` package (``bash .ci/browser.sh``). Without
them these tests are skipped locally, and fail under CI (env ``CI`` set).
"""

from __future__ import annotations

import os
from collections.abc import Iterator
from typing import Any

import pytest

pytest.importorskip("fastapi")
import httpx
from server_fixtures import (
    EVIL_ANSWER,
    EVIL_QUESTION,
    SUPPORTED_SENTENCE,
    TOKEN,
    make_app,
    make_store,
    running,
)

pytestmark = pytest.mark.integration

CHROMIUM = "/usr/bin/chromium"
LAUNCH_ARGS = [
    "--no-sandbox",
    "--disable-gpu",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
    "--no-first-run",
]


def _missing() -> str | None:
    try:
        import playwright.sync_api  # noqa: F401
    except ImportError:
        return "the playwright package is not installed (bash .ci/browser.sh)"
    if not os.access(CHROMIUM, os.X_OK):
        return f"{CHROMIUM} is not installed (bash .ci/browser.sh)"
    return None


@pytest.fixture(scope="module")
def browser() -> Iterator[Any]:
    problem = _missing()
    if problem:
        if os.environ.get("CI"):
            pytest.fail(f"browser tests cannot run under CI: {problem}", pytrace=False)
        pytest.skip(problem)
    from playwright.sync_api import sync_playwright

    with sync_playwright() as pw:
        chromium = pw.chromium.launch(executable_path=CHROMIUM, args=LAUNCH_ARGS)
        try:
            yield chromium
        finally:
            chromium.close()


@pytest.fixture
def served(tmp_path) -> Iterator[tuple[str, Any]]:
    store = make_store(tmp_path)
    try:
        with running(make_app(store)) as base:
            yield base, store
    finally:
        store.close()


@pytest.fixture
def page(browser) -> Iterator[Any]:
    context = browser.new_context()
    p = context.new_page()
    p.set_default_timeout(15_000)
    p.dialogs = []  # every alert/confirm a page opens would land here
    p.on("dialog", lambda d: (p.dialogs.append(d.message), d.dismiss()))
    p.on("pageerror", lambda e: p.dialogs.append(f"page error: {e}"))
    try:
        yield p
    finally:
        context.close()


def escalated(base: str) -> str:
    body = httpx.post(f"{base}/v1/answer", json={"question": EVIL_QUESTION}, timeout=30).json()
    assert body["decision"] == "escalate" and body["answer"] is None
    return body["request_id"]


def assert_nothing_ran(page: Any) -> None:
    page.wait_for_timeout(300)  # an <img onerror> would fire asynchronously
    assert page.evaluate("typeof window.__pwned") == "undefined"
    assert page.dialogs == []
    assert page.evaluate("document.scripts.length") == 0
    assert page.evaluate("document.images.length") == 0


def test_reviewer_approves_an_escalated_item_and_the_frontend_gets_the_answer(served, page):
    base, store = served
    rid = escalated(base)

    first = page.goto(f"{base}/review")
    assert first.status == 401
    page.click("a[href='/review/signin']")
    page.fill("#reviewer", "Li Wei")
    page.fill("#token", TOKEN)
    page.click("#signin button[type=submit]")
    page.wait_for_url(f"{base}/review")
    assert "Li Wei" in page.inner_text("header")

    page.click(f'a.item-link[href="/review/items/{rid}"]')
    page.wait_for_url(f"{base}/review/items/{rid}")
    assert page.inner_text("#question") == EVIL_QUESTION  # shown as text, not run
    assert page.inner_text("#candidate") == EVIL_ANSWER
    marks = page.locator("mark")
    assert marks.count() == 1 and marks.first.inner_text() == SUPPORTED_SENTENCE
    assert "<script>window.__pwned = 1" in page.inner_text("blockquote.text")
    assert_nothing_ran(page)

    page.click("#approve")
    page.wait_for_selector("#final-answer")
    assert page.inner_text("#final-answer") == EVIL_ANSWER
    assert "Li Wei" in page.inner_text("#decision")
    assert_nothing_ran(page)

    view = httpx.get(f"{base}/v1/requests/{rid}", timeout=10).json()
    assert view["state"] == "approved"
    assert view["final_answer"] == EVIL_ANSWER
    assert view["decision"]["reviewer"] == "Li Wei"
    assert store.get_decision(rid).action == "approve"


def test_a_hostile_document_never_runs_in_the_reviewers_browser(served, page):
    base, _ = served
    rid = escalated(base)
    csp: list[str] = []
    page.on("console", lambda m: csp.append(m.text) if "Content Security" in m.text else None)
    page.goto(f"{base}/review/signin")
    page.fill("#reviewer", "alice")
    page.fill("#token", TOKEN)
    page.click("#signin button[type=submit]")
    page.wait_for_url(f"{base}/review")
    assert_nothing_ran(page)
    reply = page.goto(f"{base}/review/items/{rid}")
    assert reply.status == 200
    assert "default-src 'none'" in reply.headers["content-security-policy"]
    text = page.inner_text("main")
    assert 'onerror="window.__pwned = 2' in text  # the markup is visible as text
    assert "window.__pwned = 4" in text  # so is the model's
    assert_nothing_ran(page)
    assert csp == []  # nothing even tried to run
    # the stylesheet is the only subresource, and it loaded under the policy
    assert page.evaluate("getComputedStyle(document.body).margin") == "0px"


def test_without_the_token_every_reviewer_route_answers_401(served, page):
    base, store = served
    rid = escalated(base)
    for path in ("/review", f"/review/items/{rid}", "/review/api/queue"):
        assert page.goto(base + path).status == 401, path
    assert "Sign in required" in page.content() or "unauthorized" in page.content()
    request = page.context.request
    for path, data in (
        (f"/review/items/{rid}/decision", {"action": "approve"}),
        (f"/review/api/items/{rid}/decision", {"action": "approve"}),
        ("/review/signout", {}),
    ):
        assert request.post(base + path, form=data).status == 401, path
    page.goto(f"{base}/review/signin")
    page.fill("#reviewer", "mallory")
    page.fill("#token", "a-guess-that-is-wrong")
    with page.expect_response(f"{base}/review/signin") as answer:
        page.click("#signin button[type=submit]")
    assert answer.value.status == 401
    assert page.goto(f"{base}/review").status == 401
    assert store.get_decision(rid) is None
    assert_nothing_ran(page)
