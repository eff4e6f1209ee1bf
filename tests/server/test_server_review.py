"""The review desk: sign-in, what an item shows (escaped), decisions, conflicts and delivery."""

from __future__ import annotations

import http.server
import json
import re
import threading
import time
import urllib.parse
from concurrent.futures import ThreadPoolExecutor

import pytest

pytest.importorskip("fastapi")
import httpx
from fastapi.testclient import TestClient
from server_fixtures import (
    EVIL_ANSWER,
    EVIL_TEXT,
    GOOD_ANSWER,
    SUPPORTED_SENTENCE,
    TOKEN,
    csrf_of,
    free_port,
    make_app,
    make_pipeline,
    make_store,
    running,
    sign_in,
    signin_form,
)

from tracerag.server._auth import COOKIE_NAME, ReviewerAuth
from tracerag.server._delivery import Delivery
from tracerag.server._views import highlight

BEARER = {"Authorization": f"Bearer {TOKEN}"}
JSON = {"Content-Type": "application/json"}
CANDIDATE = EVIL_ANSWER


@pytest.fixture
def store(tmp_path):
    s = make_store(tmp_path)
    yield s
    s.close()


@pytest.fixture
def delivered():
    return []


@pytest.fixture
def client(store, delivered):
    app = make_app(store, on_decision=delivered.append)
    with TestClient(app) as c:
        yield c


def escalate(client) -> str:
    body = client.post(
        "/v1/answer", json={"question": "How fast are refunds? <script>alert(1)</script>"}
    ).json()
    assert body["decision"] == "escalate", body
    return body["request_id"]


def parsed_tags(html: str) -> list[tuple[str, list[tuple[str, str | None]]]]:
    """Every start tag of a page, with its attributes, as a browser's parser sees them."""
    from html.parser import HTMLParser

    found: list[tuple[str, list[tuple[str, str | None]]]] = []

    class Parser(HTMLParser):
        def handle_starttag(self, tag, attrs):
            found.append((tag, attrs))

    Parser().feed(html)
    return found


def reviewer_routes(rid: str) -> list[tuple[str, str]]:
    return [
        ("GET", "/review"),
        ("GET", f"/review/items/{rid}"),
        ("POST", f"/review/items/{rid}/decision"),
        ("POST", "/review/signout"),
        ("GET", "/review/api/queue"),
        ("POST", f"/review/api/items/{rid}/decision"),
    ]


def test_every_reviewer_route_refuses_without_the_token(client, store):
    rid = escalate(client)
    auth_other = ReviewerAuth("another-token-entirely-000000")
    auth = client.app.state.services.auth
    auth.throttle.free = 1000  # this test guesses on purpose; the lockout has its own tests
    auth.clock = lambda: 0.0  # a session that ended long ago
    expired = auth.issue("alice", "shared")
    auth.clock = time.time
    forged = {
        "no credentials": ({}, {}),
        "wrong bearer": ({"Authorization": "Bearer not-the-token"}, {}),
        "basic auth": ({"Authorization": "Basic YWxpY2U6c2VjcmV0"}, {}),
        "cookie from another server": ({}, {COOKIE_NAME: auth_other.issue("mallory", "shared")}),
        "expired cookie": ({}, {COOKIE_NAME: expired}),
        "garbage cookie": ({}, {COOKIE_NAME: "eyJyIjoiYSJ9.deadbeef"}),
    }
    assert reviewer_routes(rid)
    for label, (headers, cookies) in forged.items():
        client.cookies.clear()
        for name, value in cookies.items():
            client.cookies.set(name, value, path="/review")
        for method, path in reviewer_routes(rid):
            reply = client.request(
                method,
                path,
                headers=headers,
                data={"action": "approve"} if method == "POST" else None,
                follow_redirects=False,
            )
            if path.startswith("/review/api/"):
                assert reply.status_code == 401, (label, method, path, reply.status_code)
                assert "Bearer" in reply.headers.get("www-authenticate", "")
                continue
            # a page: to the sign-in page, coming back to it (a form's post: to the queue)
            assert reply.status_code == 303, (label, method, path, reply.status_code)
            back = path if method == "GET" else "/review"
            signin = "/review/signin?" + urllib.parse.urlencode({"next": back})
            assert reply.headers["location"] == signin, (label, method, path)
    client.cookies.clear()
    assert client.get("/review/signin").status_code == 200
    assert store.get_decision(rid) is None


def test_sign_in_sets_a_strict_http_only_cookie(client):
    wrong = client.post("/review/signin", data=signin_form(client, reviewer="alice", token="no"))
    assert wrong.status_code == 401 and "not right" in wrong.text
    nameless = client.post("/review/signin", data=signin_form(client, reviewer="<b>", token=TOKEN))
    assert nameless.status_code == 422
    reply = client.post(
        "/review/signin",
        data=signin_form(client, reviewer="alice", token=TOKEN),
        follow_redirects=False,
    )
    assert reply.status_code == 303 and reply.headers["location"] == "/review"
    cookie = reply.headers["set-cookie"]
    assert "HttpOnly" in cookie and "SameSite=strict" in cookie and "Path=/review" in cookie
    page = client.get("/review")
    assert page.status_code == 200 and "alice" in page.text


def test_sign_out_ends_the_session(client):
    sign_in(client)
    page = client.get("/review")
    reply = client.post(
        "/review/signout", data={"csrf": csrf_of(page.text)}, follow_redirects=False
    )
    assert reply.status_code == 303
    assert client.get("/review", follow_redirects=False).status_code == 303  # to sign in


def test_queue_lists_escalated_items_escaped(client):
    rid = escalate(client)
    sign_in(client)
    page = client.get("/review")
    assert page.status_code == 200
    assert f"/review/items/{rid}" in page.text
    assert "<script>alert(1)</script>" not in page.text
    assert "&lt;script&gt;alert(1)&lt;/script&gt;" in page.text
    assert page.headers["cache-control"] == "no-store"
    assert "script-src" not in page.headers["content-security-policy"]
    assert "default-src 'none'" in page.headers["content-security-policy"]


def test_item_page_shows_question_samples_signals_and_marked_evidence(client):
    rid = escalate(client)
    sign_in(client)
    page = client.get(f"/review/items/{rid}")
    assert page.status_code == 200
    html = page.text
    # the supporting sentence is marked inside the (escaped) material text
    assert f"<mark>{SUPPORTED_SENTENCE}</mark>" in html
    assert "This policy covers goods that arrive damaged. <mark>" in html
    assert "&lt;script&gt;window.__pwned = 1" in html
    # no markup from the document, the title, the answer or the question survives unescaped
    assert "<script" not in html and "<img" not in html
    tags = parsed_tags(html)
    assert not {"script", "img", "iframe", "object"} & {tag for tag, _ in tags}
    assert not [(tag, a) for tag, attrs in tags for a, _ in attrs if a.startswith("on")]
    assert "policy-99" in html and "fabricated citation" in html
    assert "fabricated_citation" in html  # the claim's verdict
    assert "citation accuracy" in html and "self-consistency" in html
    # the sampled answers, and how many of the three allowed were drawn and why it stopped
    drawn = html.count('class="tag">#')
    assert 2 <= drawn <= 3
    assert f"{drawn} of at most 3 samples drawn in " in html
    assert "sampling stopped once the samples not drawn could change the route" in html or (
        drawn == 3 and "every sample drawn" in html
    )
    assert 'name="action" value="approve"' in html


def test_approve_stores_audits_delivers_and_the_frontend_sees_the_answer(client, store, delivered):
    rid = escalate(client)
    sign_in(client, "alice")
    page = client.get(f"/review/items/{rid}")
    reply = client.post(
        f"/review/items/{rid}/decision",
        data={"csrf": csrf_of(page.text), "action": "approve", "final_answer": "ignored"},
        follow_redirects=False,
    )
    assert reply.status_code == 303
    assert reply.headers["location"] == f"/review/items/{rid}?done=1"  # the confirmation
    decision = store.get_decision(rid)
    assert decision.action == "approve" and decision.reviewer == "alice"
    assert decision.final_answer == CANDIDATE
    view = client.get(f"/v1/requests/{rid}").json()
    assert view["state"] == "approved" and view["final_answer"] == CANDIDATE
    assert view["review"]["action"] == "approve" and "alice" not in json.dumps(view)
    assert len(delivered) == 1
    assert delivered[0]["request_id"] == rid and delivered[0]["action"] == "approve"
    assert delivered[0]["final_answer"] == CANDIDATE and delivered[0]["ticket_id"]
    trail = store.get(rid)
    assert [e.actor for e in trail.of_kind("review_decision")] == ["alice"]
    notes = trail.of_kind("note")
    assert len(notes) == 1 and notes[0].payload["delivery"]["ok"] is True
    decided = client.get(f"/review/items/{rid}").text
    assert 'id="decide"' not in decided and "approve" in decided
    assert store.verify_chain().ok


def test_edit_needs_a_reason_and_sends_the_edited_answer(client, store, delivered):
    rid = escalate(client)
    sign_in(client)
    csrf = csrf_of(client.get(f"/review/items/{rid}").text)
    form = {"csrf": csrf, "action": "edit", "final_answer": "Refunds take 5 business days."}
    missing = client.post(f"/review/items/{rid}/decision", data=form)
    assert missing.status_code == 422 and "reason" in missing.text
    assert store.get_decision(rid) is None and delivered == []
    form["reason"] = "the second sentence cited a policy that does not exist"
    assert client.post(f"/review/items/{rid}/decision", data=form).status_code == 200
    view = client.get(f"/v1/requests/{rid}").json()
    assert view["state"] == "edited"
    assert view["final_answer"] == "Refunds take 5 business days."
    assert view["review"]["action"] == "edit"
    assert store.get_decision(rid).reason.startswith("the second sentence")


def test_reject_withholds_the_answer_for_good(client, store):
    rid = escalate(client)
    reply = client.post(
        f"/review/api/items/{rid}/decision",
        json={"action": "reject", "reason": "cites a policy that does not exist"},
        headers={**BEARER, "X-Reviewer": "bob"},
    )
    assert reply.status_code == 200 and reply.json()["reviewer"] == "bob"
    view = client.get(f"/v1/requests/{rid}").json()
    assert view["state"] == "rejected" and view["final_answer"] is None


def test_a_second_decision_is_409_and_nothing_is_duplicated(client, store, delivered):
    rid = escalate(client)
    first = client.post(
        f"/review/api/items/{rid}/decision", json={"action": "approve"}, headers=BEARER
    )
    assert first.status_code == 200
    again = client.post(
        f"/review/api/items/{rid}/decision",
        json={"action": "reject", "reason": "changed my mind"},
        headers=BEARER,
    )
    assert again.status_code == 409 and again.json()["error"] == "conflict"
    sign_in(client)
    csrf = csrf_of(client.get("/review").text)
    form = client.post(f"/review/items/{rid}/decision", data={"csrf": csrf, "action": "approve"})
    assert form.status_code == 409 and "already decided" in form.text
    trail = store.get(rid)
    assert len(trail.of_kind("review_decision")) == 1
    assert store.get_decision(rid).action == "approve"
    assert len(delivered) == 1


def test_concurrent_decisions_on_one_item_give_one_winner(client, store, delivered):
    rid = escalate(client)
    barrier = threading.Barrier(8)

    def decide(i: int) -> int:
        barrier.wait()
        reply = client.post(
            f"/review/api/items/{rid}/decision",
            json={"action": "edit", "final_answer": f"answer {i}", "reason": f"reviewer {i}"},
            headers={**BEARER, "X-Reviewer": f"reviewer-{i}"},
        )
        return reply.status_code

    with ThreadPoolExecutor(8) as pool:
        codes = list(pool.map(decide, range(8)))
    assert sorted(codes) == [200] + [409] * 7
    trail = store.get(rid)
    (entry,) = trail.of_kind("review_decision")
    assert store.get_decision(rid).reviewer == entry.actor
    assert len(delivered) == 1 and delivered[0]["reviewer"] == entry.actor
    assert store.verify_chain().ok


def test_decisions_need_a_csrf_token_from_the_same_session(client, store):
    rid = escalate(client)
    sign_in(client, "alice")
    assert (
        client.post(f"/review/items/{rid}/decision", data={"action": "approve"}).status_code == 403
    )
    other = TestClient(client.app)
    sign_in(other, "mallory")
    foreign = csrf_of(other.get("/review").text)
    reply = client.post(
        f"/review/items/{rid}/decision", data={"csrf": foreign, "action": "approve"}
    )
    assert reply.status_code == 403
    assert store.get_decision(rid) is None


def test_unknown_and_unqueued_items_are_404_and_bad_decisions_422(client, store):
    from store_fixtures import make_record

    passed = "req-passed"
    store.append_record(make_record(passed, decision="pass"))
    rid = escalate(client)
    post = client.post
    assert client.get("/review/items/nope", headers=BEARER).status_code == 404
    assert client.get(f"/review/items/{passed}", headers=BEARER).status_code == 404
    api = "/review/api/items/{}/decision"
    assert post(api.format("nope"), json={"action": "approve"}, headers=BEARER).status_code == 404
    assert post(api.format(passed), json={"action": "approve"}, headers=BEARER).status_code == 404
    assert post(api.format(rid), json={"action": "publish"}, headers=BEARER).status_code == 422
    assert post(api.format(rid), json={"action": "reject"}, headers=BEARER).status_code == 422
    assert post(api.format(rid), json={"action": 1}, headers=BEARER).status_code == 422
    bad_json = post(api.format(rid), content=b"{oops", headers={**BEARER, **JSON})
    assert bad_json.status_code == 400 and bad_json.json()["error"] == "bad_request"
    as_form = post(api.format(rid), data={"action": "approve"}, headers=BEARER)
    assert as_form.status_code == 415 and as_form.json()["error"] == "unsupported_media_type"
    assert store.get_decision(rid) is None
    assert store.get(rid).of_kind("review_decision") == []


def test_review_api_lists_the_queue_for_bearer_callers(client):
    rid = escalate(client)
    items = client.get("/review/api/queue", headers=BEARER).json()["items"]
    assert [i["request_id"] for i in items] == [rid]
    assert client.get("/review/api/queue?status=bogus", headers=BEARER).status_code == 422


def test_the_review_api_does_not_take_cookies(client):
    rid = escalate(client)
    sign_in(client)
    reply = client.post(f"/review/api/items/{rid}/decision", json={"action": "approve"})
    assert reply.status_code == 403


def test_a_failing_callback_is_audited_and_the_decision_stands(store):
    def broken(payload):
        raise RuntimeError("frontend is down")

    with TestClient(make_app(store, on_decision=broken)) as client:
        rid = escalate(client)
        reply = client.post(
            f"/review/api/items/{rid}/decision", json={"action": "approve"}, headers=BEARER
        )
    assert reply.status_code == 200
    (note,) = store.get(rid).of_kind("note")
    assert note.payload["delivery"]["ok"] is False
    assert "frontend is down" in note.payload["delivery"]["error"]
    assert store.get_decision(rid).action == "approve"


class Receiver(http.server.BaseHTTPRequestHandler):
    received: list = []  # noqa: RUF012

    def do_POST(self):
        length = int(self.headers["Content-Length"])
        Receiver.received.append(json.loads(self.rfile.read(length)))
        self.send_response(204)
        self.end_headers()

    def log_message(self, *args):
        pass


@pytest.mark.integration
def test_decisions_are_posted_to_a_webhook(store):
    Receiver.received = []
    hook = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Receiver)
    threading.Thread(target=hook.serve_forever, daemon=True).start()
    url = f"http://127.0.0.1:{hook.server_address[1]}/decisions?secret=s3"
    try:
        with TestClient(make_app(store, on_decision=url)) as client:
            rid = escalate(client)
            reply = client.post(
                f"/review/api/items/{rid}/decision", json={"action": "approve"}, headers=BEARER
            )
            assert reply.status_code == 200
    finally:
        hook.shutdown()
        hook.server_close()
    assert [r["request_id"] for r in Receiver.received] == [rid]
    assert Receiver.received[0]["final_answer"] == CANDIDATE
    (note,) = store.get(rid).of_kind("note")
    assert note.payload["delivery"]["ok"] is True and note.payload["delivery"]["http_status"] == 204
    assert "secret" not in json.dumps(note.payload)


@pytest.mark.integration
def test_an_unreachable_webhook_is_retried_then_audited(store):
    dead = f"http://127.0.0.1:{free_port()}/hook"
    delivery = Delivery(dead, timeout=1.0, attempts=2, backoff=0.01)
    with TestClient(make_app(store, on_decision=delivery)) as client:
        rid = escalate(client)
        started = time.monotonic()
        reply = client.post(
            f"/review/api/items/{rid}/decision", json={"action": "approve"}, headers=BEARER
        )
    assert reply.status_code == 200 and time.monotonic() - started < 10
    (note,) = store.get(rid).of_kind("note")
    assert (
        note.payload["delivery"]["ok"] is False
        and "ConnectError" in note.payload["delivery"]["error"]
    )


@pytest.mark.integration
def test_reviewer_routes_over_a_real_socket(store):
    with running(make_app(store, make_pipeline([GOOD_ANSWER]))) as base:
        assert httpx.get(f"{base}/review").status_code == 303  # to sign in
        with httpx.Client(base_url=base, follow_redirects=False) as c:
            form = signin_form(c, reviewer="a", token=TOKEN)
            assert c.post("/review/signin", data=form).status_code == 303
            assert c.get("/review").status_code == 200


def test_highlight_uses_offsets_only_when_they_cut_out_the_sentence():
    text = "第一句。退货须在签收后7天内申请。第三句。"
    sentence = "退货须在签收后7天内申请。"
    start = text.index(sentence)
    h = highlight(text, start, start + len(sentence), sentence)
    assert (h.before, h.marked, h.after) == ("第一句。", sentence, "第三句。")
    moved = highlight(text, 0, 4, sentence)  # stale offsets: found by search
    assert moved.marked == sentence and moved.before == "第一句。"
    assert not highlight(text, 0, 4, "not in the text").found
    assert not highlight(text, None, None, None).found
    assert highlight(text, 0, 4, None).marked == "第一句。"
    assert not highlight(text, 5, 500, None).found
    assert highlight(EVIL_TEXT, None, None, SUPPORTED_SENTENCE).marked == SUPPORTED_SENTENCE


def test_queue_page_separates_open_and_recently_decided_items(client, store):
    first, second, third = escalate(client), escalate(client), escalate(client)
    for rid in (first, third):
        reply = client.post(
            f"/review/api/items/{rid}/decision", json={"action": "approve"}, headers=BEARER
        )
        assert reply.status_code == 200
    sign_in(client)
    html = client.get("/review").text
    counts = re.sub(r"<[^>]+>", "", re.search(r'id="counts">(.*?)</p>', html).group(1))
    assert counts == "1 pending · 0 claimed · 2 decided"
    assert f"/review/items/{second}" in html and f"/review/items/{first}" not in html
    decided = client.get("/review?status=decided").text
    assert f"/review/items/{second}" not in decided
    assert decided.index(third) < decided.index(first)  # the newest decision first


def test_a_reviewer_reject_lowers_the_credibility_of_what_the_answer_used(client, store):
    """A decision on the desk is an outcome: the materials the answer relied on learn from it."""
    from tracerag.materials import MaterialRegistry
    from tracerag.store._audit_record import AuditRecord

    rid = escalate(client)
    used = AuditRecord.parse(store.get(rid).record).retrieved_ids
    assert used
    reply = client.post(
        f"/review/api/items/{rid}/decision",
        json={"action": "reject", "reason": "cites a policy that does not exist"},
        headers=BEARER,
    )
    assert reply.status_code == 200
    registry = MaterialRegistry(store)
    feedback = registry.feedback_for(rid)
    assert [f["operator"] for f in feedback] == ["review:api-reviewer"]
    moved = [registry.get(mid) for mid in used]
    assert any(m is not None and m.ema < 0.6 for m in moved), [(m.id, m.ema) for m in moved if m]
    # and the reject queues an offline explanation (tracerag explain --queued)
    from tracerag.tools.explain import queued

    assert queued(store) == [rid]


def test_the_item_page_shows_what_made_the_answer(client, store):
    """Attribution tiers 1 and 2 on the desk: each material's role, share and reason."""
    from tracerag.store._audit_record import AuditRecord

    rid = escalate(client)
    attribution = AuditRecord.parse(store.get(rid).record).signals.attribution
    assert attribution and attribution["materials"]
    sign_in(client)
    page = client.get(f"/review/items/{rid}").text
    section = page[page.index('id="attribution"') : page.index('id="uncited"')]
    assert "What made the answer" in section
    for m in attribution["materials"]:
        assert f'<th scope="row">{m["id"]}</th>' in section
        assert f"<td>{m['role']}</td>" in section
    assert "compares materials within this request only" in section


def test_the_item_page_shows_stored_explanations(client, store):
    """A report of ``tracerag explain`` kept in the trail is shown on the item page."""
    from tracerag.store._base import KIND_EXPLANATION

    rid = escalate(client)
    store.append_action(
        rid, KIND_EXPLANATION, "ops-lead", {"request_id": rid, "flags": ["answering_from_prior"]}
    )
    sign_in(client)
    page = client.get(f"/review/items/{rid}").text
    section = page[page.index('id="attribution"') : page.index('id="uncited"')]
    assert "Offline explanation by ops-lead" in section
    assert "answering_from_prior" in section
