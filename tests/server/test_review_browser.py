"""The review desk in a real browser: Debian's Chromium driven by Playwright.

A reviewer signs in with the token, opens an escalated item and approves it, and the frontend
endpoint then returns the approved answer; a hostile document's ``<script>``/``onerror`` never
runs; without the token every reviewer page leads to the sign-in page (and back), and the
review API answers 401.

Needs ``/usr/bin/chromium`` and the ``playwright`` package (``bash .ci/browser.sh``). Without
them these tests are skipped locally, and fail under CI (env ``CI`` set).
"""

from __future__ import annotations

import os
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

pytest.importorskip("fastapi")
import httpx
from server_fixtures import (
    EVIL_ANSWER,
    EVIL_QUESTION,
    FRONTEND,
    SUPPORTED_SENTENCE,
    TOKEN,
    make_app,
    make_store,
    running,
    skip_or_fail,
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

    page.goto(f"{base}/review")  # signed out: to the sign-in page, which comes back here
    assert page.url == f"{base}/review/signin?next=%2Freview"
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
    assert view["review"]["action"] == "approve"
    decision = store.get_decision(rid)
    assert decision.action == "approve" and decision.reviewer == "Li Wei"


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


def test_without_the_token_every_reviewer_route_refuses(served, page):
    base, store = served
    rid = escalated(base)
    for path in ("/review", f"/review/items/{rid}"):
        page.goto(base + path)
        assert page.url.startswith(f"{base}/review/signin?next="), path
        assert page.locator("#signin").count() == 1
    assert page.goto(f"{base}/review/api/queue").status == 401
    assert "unauthorized" in page.content()
    request = page.context.request
    for path, data, status in (
        (f"/review/items/{rid}/decision", {"action": "approve"}, 303),
        (f"/review/api/items/{rid}/decision", {"action": "approve"}, 401),
        ("/review/signout", {}, 303),
    ):
        reply = request.post(base + path, form=data, max_redirects=0)
        assert reply.status == status, path
        if status == 303:
            assert reply.headers["location"].startswith("/review/signin?next="), path
    page.goto(f"{base}/review/signin")
    page.fill("#reviewer", "mallory")
    page.fill("#token", "a-guess-that-is-wrong")
    with page.expect_response(f"{base}/review/signin") as answer:
        page.click("#signin button[type=submit]")
    assert answer.value.status == 401
    page.goto(f"{base}/review")
    assert page.url.startswith(f"{base}/review/signin")
    assert store.get_decision(rid) is None
    assert_nothing_ran(page)


# -- the desk at scale and for the person using it (issue items 6-12) ---------------------------

AXE = os.path.join(FRONTEND, "node_modules", "axe-core", "axe.min.js")
LI_TOKEN = "li-weis-personal-token-7x3q0"


@pytest.fixture
def desk(tmp_path) -> Iterator[tuple[str, Any]]:
    """A served desk with 500 escalated and 21 review items, a named reviewer 李伟, trace links."""
    from store_fixtures import make_record

    from tracerag.server._auth import hash_token

    store = make_store(tmp_path)
    records = [
        make_record(f"esc-{i:04d}", decision="escalate", confidence=0.3, question=f"退货问题 {i}")
        for i in range(500)
    ] + [
        make_record(f"rev-{i:04d}", decision="review", confidence=0.7, question=f"question {i}")
        for i in range(21)
    ]
    for start in range(0, len(records), 200):
        store.append_records(records[start : start + 200])
    app = make_app(
        store,
        reviewers={"李伟": hash_token(LI_TOKEN)},
        trace_ui="jaeger=http://127.0.0.1:16686",
    )
    try:
        with running(app) as base:
            yield base, store
    finally:
        store.close()


def sign_in_page(page: Any, base: str, token: str = TOKEN, name: str = "alice") -> None:
    page.goto(f"{base}/review/signin")
    page.fill("#reviewer", name)
    page.fill("#token", token)
    page.click("#signin button[type=submit]")
    page.wait_for_url(f"{base}/review")


def no_horizontal_overflow(page: Any) -> bool:
    return page.evaluate(
        "document.documentElement.scrollWidth <= document.documentElement.clientWidth"
    )


def axe_violations(page: Any) -> list[dict]:
    if not os.path.isfile(AXE):
        skip_or_fail("axe-core is not installed (bash .ci/frontend.sh)")
    with open(AXE, encoding="utf-8") as fh:
        page.evaluate(fh.read())  # through the DevTools protocol: the page's CSP still holds
    result = page.evaluate("async () => (await axe.run(document)).violations")
    return [{"id": v["id"], "nodes": len(v["nodes"])} for v in result]


def test_the_accessibility_check_reports_what_it_should(page):
    page.set_content("<html><body><img src='x.png'><input></body></html>")
    ids = {v["id"] for v in axe_violations(page)}
    assert {"image-alt", "label", "html-has-lang"} <= ids


def test_the_queue_shows_every_item_in_pages_and_filters_them(desk, page):
    base, _ = desk
    sign_in_page(page, base)
    assert page.inner_text("#counts") == "521 pending · 0 claimed · 0 decided"
    assert page.inner_text("#summary") == "521 items match · page 1 of 21"
    assert page.locator("a.item-link").count() == 25
    page.select_option("#f-route", "review")
    page.select_option("#f-per-page", "50")
    page.click("#apply")
    page.wait_for_url("**route=review**")
    assert page.inner_text("#summary") == "21 items match · page 1 of 1"
    assert page.locator("a.item-link").count() == 21
    page.goto(f"{base}/review?page=20")
    page.click("#next")
    page.wait_for_url("**page=21**")
    links = page.locator("a.item-link")
    assert links.count() == 21 and links.first.inner_text() == "question 0"
    assert axe_violations(page) == []


def test_why_names_the_signal_and_the_table_marks_it(desk, page):
    base, _ = desk
    sign_in_page(page, base)
    page.goto(f"{base}/review/items/rev-0003")
    reasons = page.inner_text("#why")
    assert "fabricated citation: M99 was never retrieved" in reasons
    assert "rule mentions_deadline failed" in reasons
    flagged = page.locator("#signals tr.flagged th")
    names = [n.split("\n")[0].removesuffix(" why").strip() for n in flagged.all_inner_texts()]
    assert "fabricated citations" in names and "errors" in names
    colour = page.evaluate(
        "getComputedStyle(document.querySelector('#signals tr.flagged td')).backgroundColor"
    )
    assert colour == "rgb(255, 241, 204)"
    assert axe_violations(page) == []


def test_a_named_reviewer_signs_in_and_out_for_good(desk, page):
    base, _ = desk
    sign_in_page(page, base, LI_TOKEN, name="")
    assert "李伟" in page.inner_text("header")
    kept = page.context.cookies()
    page.click("header button[type=submit]")
    page.wait_for_url(f"{base}/review/signin")
    page.context.add_cookies(kept)  # replay the session cookie after signing out
    page.goto(f"{base}/review")
    assert page.url.startswith(f"{base}/review/signin?next=")


def test_a_second_reviewer_sees_the_claim(desk, browser, page):
    base, _ = desk
    sign_in_page(page, base, TOKEN, "alice")
    page.goto(f"{base}/review/items/esc-0007")
    assert "You are working on this item" in page.inner_text("#claim")
    other = browser.new_context()
    bob = other.new_page()
    try:
        sign_in_page(bob, base, TOKEN, "bob")
        bob.goto(f"{base}/review/items/esc-0007")
        assert "alice is working on this item" in bob.inner_text("#claim")
        assert bob.is_disabled("#reject")
        bob.goto(f"{base}/review")
        row = bob.locator("tr", has=bob.locator('a[href="/review/items/esc-0007"]'))
        assert "claimed by alice" in row.inner_text()
    finally:
        other.close()


def test_a_failed_edit_keeps_the_text_and_a_decision_redirects(desk, page):
    base, store = desk
    sign_in_page(page, base)
    page.goto(f"{base}/review/items/esc-0011")
    mine = "退货期限为30天，运费由我们承担。[M01]"
    page.fill("#final_answer", mine)
    with page.expect_response(f"{base}/review/items/esc-0011/decision") as failed:
        page.click("#edit")
    assert failed.value.status == 422
    assert page.input_value("#final_answer") == mine
    assert "needs a reason" in page.inner_text("#decision-error")
    assert page.get_attribute("#reason", "aria-invalid") == "true"
    page.fill("#reason", "the answer cited a retired policy")
    page.click("#edit")
    page.wait_for_selector("#final-answer")
    assert page.url == f"{base}/review/items/esc-0011?done=1"  # redirected after the POST
    assert page.inner_text("#final-answer") == mine
    page.reload()  # a reload reads the page again, it does not post the form twice
    assert len(store.get("esc-0011").of_kind("review_decision")) == 1


def test_the_item_shows_uncited_materials_and_the_trace_link(desk, page):
    base, _ = desk
    sign_in_page(page, base)
    page.goto(f"{base}/review/items/esc-0002")
    uncited = page.inner_text("#uncited")
    assert "[M02]" in uncited and "[M01]" not in uncited
    href = page.get_attribute("#trace-link", "href")
    assert href == "http://127.0.0.1:16686/trace/4bf92f3577b34da6a3ce929d0e0e4736"
    assert axe_violations(page) == []


def test_the_desk_fits_a_phone_and_speaks_the_right_language(desk, browser):
    base, _ = desk
    context = browser.new_context(viewport={"width": 360, "height": 740}, is_mobile=True)
    phone = context.new_page()
    try:
        phone.goto(f"{base}/review/items/esc-0005")  # signed out: to the sign-in page
        assert phone.url.startswith(f"{base}/review/signin?next=")
        phone.fill("#reviewer", "alice")
        phone.fill("#token", TOKEN)
        phone.click("#signin button[type=submit]")
        phone.wait_for_url(f"{base}/review/items/esc-0005")  # back where the link pointed
        assert no_horizontal_overflow(phone)
        assert phone.get_attribute("#question", "lang") == "zh"
        meta = phone.inner_text("p.meta")
        assert "asked 2025-03-04 09:15 UTC" in meta and ".123456" not in meta
        phone.goto(f"{base}/review")
        assert no_horizontal_overflow(phone)
        assert axe_violations(phone) == []
        phone.goto(f"{base}/review/signin")
        assert axe_violations(phone) == []
    finally:
        context.close()


# -- the materials view ---------------------------------------------------------------------


@pytest.fixture
def materials_desk(tmp_path) -> Iterator[tuple[str, Any]]:
    """A served desk whose registry holds a gated memory write (Chinese), a quarantined
    material whose text is hostile markup, and a conflict; 李伟 signs in with a named token."""
    from langchain_core.documents import Document

    from tracerag.materials import MaterialRegistry
    from tracerag.server._auth import hash_token

    store = make_store(tmp_path)
    registry = MaterialRegistry(store)
    registry.observe(
        [
            Document(page_content="已拆封商品可在签收后30天内退货。", metadata={"id": "policy-30"}),
            Document(page_content="已拆封商品可在签收后15天内退货。", metadata={"id": "feed-15"}),
            Document(page_content=EVIL_ANSWER, metadata={"id": "evil"}),
        ]
    )
    registry.register(
        "memo-7",
        "好像是签收后7天内可以退货吧？",
        operator="agent-9",
        written_by="memory-writer@2",
        source_snippet="chat #881\ncustomer: 好像是签收后7天内可以退货吧？",
    )
    registry.quarantine("evil", operator="lead", reason="hostile feed")
    app = make_app(store, reviewers={"李伟": hash_token(LI_TOKEN)})
    app.state.services.registry = registry
    try:
        with running(app) as base:
            yield base, registry
    finally:
        registry.close()
        store.close()


def test_a_reviewer_decides_material_writes_on_the_desk(materials_desk, page):
    base, registry = materials_desk
    sign_in_page(page, base, token=LI_TOKEN, name="")
    page.click("#nav >> text=Materials")
    page.wait_for_url(f"{base}/review/materials")
    write = page.locator("article.pending-write", has_text="memo-7")
    assert "hedge" in write.inner_text() and "好像" in write.inner_text()
    assert "policy-30" in page.inner_text("#conflicts")
    assert "evil" in page.inner_text("#quarantine")
    assert_nothing_ran(page)  # the quarantined material's markup is shown, never run
    assert axe_violations(page) == []
    write.locator("input[name=reason]").fill("确认：政策是7天")
    write.locator("button[value=approve]").click()
    page.wait_for_url(f"{base}/review/materials")
    assert registry.get("memo-7").status == "active"
    assert registry.get("memo-7").current.operator == "李伟"
    assert "No write is waiting for review." in page.inner_text("#pending")

    page.goto(f"{base}/review/materials/history?id=memo-7")
    history = page.inner_text("#history")
    assert "v2 · approve → active" in history and "desk-named-token" in history
    assert "chat #881\ncustomer: 好像是签收后7天内可以退货吧？" in page.inner_text(
        "pre.snippet >> nth=1"
    )
    assert axe_violations(page) == []

    page.goto(f"{base}/review/materials/history?id=evil")
    page.fill("#reason", "the feed was cleaned")
    page.click("#material-action button[value=restore]")
    page.wait_for_url(f"{base}/review/materials/history?id=evil")
    assert page.inner_text("#status") == "active"
    assert registry.get("evil").status == "active"
    assert_nothing_ran(page)
    assert registry.verify().ok and registry.store.verify_chain().ok


def test_the_materials_view_fits_a_phone(materials_desk, browser):
    base, _ = materials_desk
    context = browser.new_context(viewport={"width": 360, "height": 740}, is_mobile=True)
    phone = context.new_page()
    try:
        sign_in_page(phone, base)
        for path in ("/review/materials", "/review/materials/history?id=memo-7", "/review"):
            phone.goto(base + path)
            assert no_horizontal_overflow(phone), path
        assert axe_violations(phone) == []
    finally:
        context.close()


# -- working the desk all day, on a phone and on a laptop (issue 23) -------------------------

WIDTHS = {
    "phone": {"viewport": {"width": 390, "height": 844}, "is_mobile": True, "has_touch": True},
    "laptop": {"viewport": {"width": 1366, "height": 900}},
}
DESK_CONFIG = {
    "queues": {
        "escalate": {
            "reviews": 2,
            "rubric": [
                {
                    "name": "grounded",
                    "label": "每个论断都有出处 (every claim is backed)",
                    "scale": [1, 5],
                    "low": "no",
                    "high": "fully",
                    "required": True,
                },
                {"name": "tone", "label": "Polite", "scale": [1, 3]},
            ],
        }
    }
}


@pytest.fixture
def team_desk(tmp_path) -> Iterator[tuple[str, Any]]:
    """A served desk of 12 escalated items (two reviewers each, a required rubric score) and 8
    review items (one reviewer, the default rubric)."""
    from store_fixtures import make_record

    store = make_store(tmp_path)
    store.append_records(
        [
            make_record(f"esc-{i:02d}", decision="escalate", confidence=0.3, question=f"退货 {i}")
            for i in range(12)
        ]
        + [
            make_record(f"rev-{i:02d}", decision="review", confidence=0.7, question=f"refund {i}")
            for i in range(8)
        ]
    )
    try:
        with running(make_app(store, desk_config=DESK_CONFIG)) as base:
            yield base, store
    finally:
        store.close()


@pytest.fixture(params=sorted(WIDTHS))
def width(request) -> str:
    return request.param


def person(browser: Any, width: str) -> Any:
    context = browser.new_context(**WIDTHS[width])
    p = context.new_page()
    p.set_default_timeout(15_000)
    return p


def top_of(page: Any, selector: str) -> float:
    return page.evaluate(
        "(s) => document.querySelector(s).getBoundingClientRect().top + window.scrollY", selector
    )


def test_the_claimed_count_filter_and_sign_out_agree(team_desk, browser, width):
    base, _ = team_desk
    alice, bob = person(browser, width), person(browser, width)
    try:
        sign_in_page(alice, base, name="alice")
        alice.goto(f"{base}/review/items/rev-03")
        assert "You are working on this item" in alice.inner_text("#claim")
        sign_in_page(bob, base, name="bob")
        assert bob.inner_text("#counts") == "19 pending · 1 claimed · 0 decided"
        bob.click("#counts >> text=1 claimed")
        bob.wait_for_url("**status=claimed**")
        assert bob.inner_text("#summary") == "1 item matches · page 1 of 1"
        row = bob.locator("tr", has=bob.locator('a[href="/review/items/rev-03"]'))
        assert "claimed by alice" in row.inner_text()
        assert no_horizontal_overflow(bob)
        assert axe_violations(bob) == []
        # signing out gives the item back at once
        alice.click("header button[type=submit]")
        alice.wait_for_url(f"{base}/review/signin")
        bob.goto(f"{base}/review")
        assert bob.inner_text("#counts") == "20 pending · 0 claimed · 0 decided"
        bob.goto(f"{base}/review/items/rev-03")
        assert "You are working on this item" in bob.inner_text("#claim")
    finally:
        alice.context.close()
        bob.context.close()


def test_decide_near_the_top_then_confirmation_and_next_item(team_desk, browser, width):
    base, store = team_desk
    page = person(browser, width)
    try:
        sign_in_page(page, base, name="alice")
        page.click("#take-next")
        page.wait_for_url(f"{base}/review/items/esc-00")
        assert no_horizontal_overflow(page)
        screen = page.evaluate("window.innerHeight")
        assert top_of(page, "#decide") < screen  # the form starts on the first screen
        assert axe_violations(page) == []
        page.click("#reject")  # no reason, no required score
        assert top_of(page, "#decision-error") < screen
        error = page.inner_text("#decision-error")
        assert "每个论断都有出处" in error and "needs a reason" not in error
        page.check("#score-grounded-2")
        page.click("#reject")
        assert "needs a reason" in page.inner_text("#decision-error")
        assert page.is_checked("#score-grounded-2")  # what was entered is kept
        page.fill("#reason", "M99 从未检索到")
        page.click("#reject")
        page.wait_for_url(f"{base}/review/items/esc-00?done=1")
        assert top_of(page, "#confirmation") < 200
        assert "Your review is recorded (1 of 2)" in page.inner_text("#confirmation")
        assert no_horizontal_overflow(page)
        assert axe_violations(page) == []
        page.click("#next-item")
        page.wait_for_url(f"{base}/review/items/esc-01")  # not esc-00 again: already judged
        vote = store.get("esc-00").of_kind("review_vote")[0]
        assert vote.payload["scores"] == {"grounded": 2} and vote.payload["action"] == "reject"
        # a one-reviewer queue: the decision is final, and says so
        page.goto(f"{base}/review/items/rev-00")
        page.check("#score-complete-4")
        page.click("#approve")
        page.wait_for_url(f"{base}/review/items/rev-00?done=1")
        assert "Saved: You approved this answer" in page.inner_text("#confirmation")
        assert page.inner_text("#decision-scores") == "Scores: It answers the whole question 4"
        assert store.get_decision("rev-00").action == "approve"
    finally:
        page.context.close()


def test_two_reviewers_comments_assignment_skip_and_export(team_desk, browser, width):
    base, store = team_desk
    alice, bob = person(browser, width), person(browser, width)
    try:
        sign_in_page(alice, base, name="alice")
        sign_in_page(bob, base, name="bob")
        alice.goto(f"{base}/review/items/esc-05")
        alice.fill("#comment", "M99 不存在，请核对 <b>bold?</b>")
        alice.click("#add-comment")
        alice.wait_for_url(f"{base}/review/items/esc-05#comments")
        assert "M99 不存在，请核对 <b>bold?</b>" in alice.inner_text("#comments")
        alice.fill("#assignee", "bob")
        alice.click("#assign")
        alice.wait_for_url(f"{base}/review/items/esc-05")
        assert "Assigned to bob" in alice.inner_text("#assignment")
        bob.goto(f"{base}/review")
        assert bob.inner_text("#mine") == "1 assigned to you"
        bob.click("#take-next")
        bob.wait_for_url(f"{base}/review/items/esc-05")  # assigned to bob: first in his queue
        bob.check("#score-grounded-5")
        bob.click("#approve")
        bob.wait_for_url("**done=1")
        alice.goto(f"{base}/review/items/esc-05")
        assert "1 of 2 reviews in" in alice.inner_text("#reviews-in")
        assert alice.locator("#judgements").count() == 0  # blind until alice has judged
        alice.check("#score-grounded-4")
        alice.click("#approve")
        alice.wait_for_url("**done=1")
        assert "All 2 reviewers agreed" in alice.inner_text("#confirmation")
        assert "bob" in alice.inner_text("#judgements")  # shown once settled
        assert axe_violations(alice) == []
        # skip: the next item for alice is another one, and the skipped one comes last
        alice.goto(f"{base}/review/items/esc-06")
        alice.click("#skip button")
        alice.wait_for_url(f"{base}/review/items/esc-00")
        assert store.get_decision("esc-05").action == "approve"
        # the export page and its files
        alice.goto(f"{base}/review/export")
        assert "1 decided item: 1 approved" in alice.inner_text("#export-counts")
        assert "100% unanimous" in alice.inner_text("#agreement")
        assert no_horizontal_overflow(alice)
        assert axe_violations(alice) == []
        with alice.expect_download() as download:
            alice.click("#export-csv")
        rows = Path(download.value.path()).read_text(encoding="utf-8").splitlines()
        assert rows[0].startswith("request_id,queue,question,answer") and len(rows) == 2
        assert rows[1].startswith("esc-05,escalate,退货 5,")
    finally:
        alice.context.close()
        bob.context.close()


def test_a_real_answers_item_fits_and_passes_axe_at_both_widths(served, browser, width):
    """A record from a real pipeline run carries the attribution table (six columns) that once
    made the item page 568 px wide at 390 px: it now scrolls inside its own region."""
    base, _ = served
    rid = escalated(base)
    page = person(browser, width)
    try:
        sign_in_page(page, base, name="alice")
        page.goto(f"{base}/review/items/{rid}")
        assert page.locator("table.attribution").count() == 1
        assert no_horizontal_overflow(page)
        assert axe_violations(page) == []  # the scrolling region takes the keyboard focus
        assert page.evaluate("typeof window.__pwned") == "undefined"
    finally:
        page.context.close()
