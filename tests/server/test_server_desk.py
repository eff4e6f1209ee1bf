"""The review desk at scale and for the person using it: real counts, pages, filters, the named
reasons, claims, kept input after a failed edit, uncited materials, trace links, dates, lang."""

from __future__ import annotations

import re

import pytest

pytest.importorskip("fastapi")
from fastapi.testclient import TestClient
from server_fixtures import TOKEN, csrf_of, make_app, make_store, sign_in, signin_form
from store_fixtures import make_record

BEARER = {"Authorization": f"Bearer {TOKEN}"}


@pytest.fixture
def store(tmp_path):
    s = make_store(tmp_path)
    yield s
    s.close()


def fill(store, escalated: int, reviewed: int) -> None:
    records = [
        make_record(f"esc-{i:04d}", decision="escalate", confidence=0.3, question=f"问题 {i}")
        for i in range(escalated)
    ] + [
        make_record(f"rev-{i:04d}", decision="review", confidence=0.7, question=f"question {i}")
        for i in range(reviewed)
    ]
    for start in range(0, len(records), 200):
        assert all(e is None for e in store.append_records(records[start : start + 200]))


def text_of(html: str, element_id: str) -> str:
    match = re.search(rf'id="{element_id}"[^>]*>(.*?)</(p|nav)>', html, re.S)
    assert match, element_id
    return " ".join(re.sub(r"<[^>]+>", " ", match.group(1)).split())


def item_ids(html: str) -> list[str]:
    return re.findall(r'class="item-link" href="/review/items/([^"]+)"', html)


@pytest.fixture(scope="module")
def crowded(tmp_path_factory):
    """A signed-in client on a queue of 521 items, filled once for the read-only tests."""
    store = make_store(tmp_path_factory.mktemp("crowded"))
    fill(store, 500, 21)
    try:
        with TestClient(make_app(store)) as client:
            sign_in(client)
            yield client
    finally:
        store.close()


def test_the_queue_counts_every_item_and_pages_through_them(crowded):
    first = crowded.get("/review").text
    assert text_of(first, "counts") == "521 pending · 0 claimed · 0 decided"
    assert text_of(first, "summary") == "521 items match · page 1 of 21"
    seen: list[str] = []
    for n in range(1, 22):
        seen += item_ids(crowded.get(f"/review?page={n}").text)
    assert len(seen) == 521 == len(set(seen))
    assert seen[0].startswith("esc-") and seen[-1].startswith("rev-")  # escalations first


def test_the_queue_filters_by_route_and_searches(crowded):
    review = crowded.get("/review?route=review&per_page=50").text
    assert text_of(review, "summary") == "21 items match · page 1 of 1"
    assert all(i.startswith("rev-") for i in item_ids(review)) and len(item_ids(review)) == 21
    found = crowded.get("/review?q=%E9%97%AE%E9%A2%98%20499").text  # "问题 499"
    assert item_ids(found) == ["esc-0499"]
    assert 'lang="zh"' in found


def test_the_queue_sorts_and_filters_by_signal(store):
    fill(store, 3, 2)
    store.append_record(
        make_record(
            "clean-1",
            decision="review",
            confidence=0.1,
            signals={"citations": {"claims": [], "fabricated": []}, "rules": []},
            errors=[],
        )
    )
    with TestClient(make_app(store)) as client:
        sign_in(client)
        low_first = item_ids(client.get("/review?sort=confidence").text)
        assert low_first[0] == "clean-1"
        fabricated = item_ids(client.get("/review?signal=fabricated").text)
        assert "clean-1" not in fabricated and len(fabricated) == 5


def test_a_long_question_is_cut_on_the_queue_and_whole_on_the_item(store):
    question = "How do refunds work? " * 40
    store.append_record(make_record("long-1", decision="escalate", question=question))
    with TestClient(make_app(store)) as client:
        sign_in(client)
        queue = client.get("/review").text
        item = client.get("/review/items/long-1").text
    link = re.search(r'class="item-link"[^>]*>(.*?)</a>', queue, re.S).group(1)
    assert link.endswith("…") and len(link) <= 141
    assert question.strip() in item


def test_why_names_the_failing_signals_and_marks_them(store):
    store.append_record(make_record("why-1", decision="review"))
    with TestClient(make_app(store)) as client:
        sign_in(client)
        queue = client.get("/review").text
        item = client.get("/review/items/why-1").text
    reasons = text_of(item.replace("</ul>", "</p>"), "why")
    assert "fabricated citation: M99 was never retrieved" in reasons
    assert "1 uncited claim(s)" in reasons
    assert "rule mentions_deadline failed (no deadline for reporting damage)" in reasons
    assert "2 error(s)" in reasons
    assert "fabricated citation: M99" in queue
    flagged = re.findall(r'<tr class="flagged"><th scope="row">([^<]+)', item)
    assert {f.strip() for f in flagged} >= {
        "fabricated citations",
        "citation coverage",
        "rule mentions_deadline",
        "errors",
    }
    assert "self-consistency" not in {f.strip() for f in flagged}  # 0.8 is not why


def test_the_item_shows_uncited_materials_and_links_the_trace(store):
    store.append_record(make_record("mat-1", decision="review"))
    with TestClient(make_app(store, trace_ui="jaeger=http://127.0.0.1:16686")) as client:
        sign_in(client)
        item = client.get("/review/items/mat-1").text
    uncited = item[item.index('id="uncited"') : item.index('id="comments"')]
    assert "[M02]" in uncited and "[M01]" not in uncited
    assert 'href="http://127.0.0.1:16686/trace/4bf92f3577b34da6a3ce929d0e0e4736"' in item


def test_dates_are_for_people(store):
    store.append_record(make_record("date-1", decision="review"))
    with TestClient(make_app(store)) as client:
        sign_in(client)
        item = client.get("/review/items/date-1").text
        queue = client.get("/review").text
    assert "asked 2025-03-04 09:15 UTC" in item
    assert not re.search(r"\d{2}:\d{2}:\d{2}\.\d{6}", item + queue)


def test_opening_an_item_claims_it_and_others_see_it(store):
    store.append_record(make_record("claim-1", decision="escalate"))
    app = make_app(store)
    with TestClient(app) as alice, TestClient(app) as bob:
        sign_in(alice, "alice")
        sign_in(bob, "bob")
        mine = alice.get("/review/items/claim-1").text
        assert "You are working on this item" in mine
        theirs = bob.get("/review/items/claim-1").text
        assert "<strong>alice</strong> is working on this item" in theirs
        assert re.search(r"claimed by <strong[^>]*>alice</strong>", bob.get("/review").text)
        blocked = bob.post(
            "/review/items/claim-1/decision",
            data={"csrf": csrf_of(theirs), "action": "reject", "reason": "no"},
        )
        assert blocked.status_code == 409 and "alice" in blocked.text
        api = bob.post(
            "/review/api/items/claim-1/decision",
            json={"action": "reject", "reason": "no", "reviewer": "bob"},
            headers=BEARER,
        )
        assert api.status_code == 409 and api.json()["error"] == "conflict"
        done = alice.post(
            "/review/items/claim-1/decision",
            data={"csrf": csrf_of(mine), "action": "reject", "reason": "wrong policy"},
            follow_redirects=False,
        )
        assert done.status_code == 303
    assert store.get_decision("claim-1").reviewer == "alice"
    assert app.state.services.claims.get("claim-1") is None


def test_a_claim_expires_and_can_be_released(store):
    store.append_record(make_record("claim-2", decision="escalate"))
    app = make_app(store)
    board = app.state.services.claims
    now = [1000.0]
    board.clock = lambda: now[0]
    with TestClient(app) as alice, TestClient(app) as bob:
        sign_in(alice, "alice")
        sign_in(bob, "bob")
        page = alice.get("/review/items/claim-2").text
        now[0] += board.seconds + 1
        assert "You are working on this item" in bob.get("/review/items/claim-2").text
        assert board.get("claim-2").reviewer == "bob"
        release = bob.post(
            "/review/items/claim-2/release",
            data={"csrf": csrf_of(bob.get("/review/items/claim-2").text)},
            follow_redirects=False,
        )
        assert release.status_code == 303 and board.get("claim-2") is None
        assert csrf_of(page)  # alice's page stayed readable throughout


def test_stuck_store_claims_return_to_the_queue(store):
    store.append_record(make_record("stuck-1", decision="escalate"))
    store.claim_next("carol")
    app = make_app(store, claim_seconds=0)
    with TestClient(app) as client:
        sign_in(client)
        client.get("/review")
    assert [i.request_id for i in store.list_queue("pending")] == ["stuck-1"]
    released = store.get("stuck-1").of_kind("review_released")
    assert released and released[0].payload["reason"] == "claim expired"


def test_a_failed_edit_keeps_what_the_reviewer_wrote(store):
    store.append_record(make_record("edit-1", decision="escalate"))
    with TestClient(make_app(store)) as client:
        sign_in(client)
        csrf = csrf_of(client.get("/review/items/edit-1").text)
        mine = "退货期限为30天，运费由我们承担。[M01]"
        reply = client.post(
            "/review/items/edit-1/decision",
            data={"csrf": csrf, "action": "edit", "final_answer": mine, "reason": ""},
        )
    assert reply.status_code == 422
    assert f">{mine}</textarea>" in reply.text
    assert 'aria-invalid="true"' in reply.text and "needs a reason" in reply.text
    assert store.get_decision("edit-1") is None


def test_signing_in_from_an_item_link_returns_to_the_item(store):
    store.append_record(make_record("next-1", decision="escalate"))
    with TestClient(make_app(store)) as client:
        first = client.get("/review/items/next-1?view=full", follow_redirects=False)
        assert first.status_code == 303  # signed out: to the sign-in page, and back
        target = first.headers["location"]
        assert target == "/review/signin?next=%2Freview%2Fitems%2Fnext-1%3Fview%3Dfull"
        form = client.get(target).text
        next_value = re.search(r'name="next" value="([^"]+)"', form).group(1)
        assert next_value.replace("&amp;", "&") == "/review/items/next-1?view=full"
        reply = client.post(
            "/review/signin",
            data={"reviewer": "alice", "token": TOKEN, "next": next_value, "csrf": csrf_of(form)},
            follow_redirects=False,
        )
        assert reply.headers["location"] == "/review/items/next-1?view=full"
        evil = client.post(
            "/review/signin",
            data=signin_form(client, reviewer="alice", token=TOKEN, next="//evil.example/x"),
            follow_redirects=False,
        )
        assert evil.headers["location"] == "/review"


def test_the_review_api_pages_with_a_real_total(store):
    fill(store, 30, 5)
    with TestClient(make_app(store)) as client:
        page = client.get("/review/api/queue?status=pending&limit=10&offset=30", headers=BEARER)
        trail = client.get("/review/api/requests/esc-0001", headers=BEARER)
    body = page.json()
    assert body["total"] == 35 and len(body["items"]) == 5
    assert trail.status_code == 200 and trail.json()["record"]["question"] == "问题 1"
