"""The desk's form dependency: every desk POST on an item reaches its handler only with this
session's CSRF token; a refused form is audited on the item's trail and changes nothing."""

from __future__ import annotations

import pytest

pytest.importorskip("fastapi")

from fastapi.testclient import TestClient
from server_fixtures import csrf_of, make_app, make_store, sign_in

# (path, fields, what the audit note calls the form, the redirect a valid form gets)
FORMS = [
    ("decision", {"action": "reject", "reason": "wrong figure"}, "decision", "/review/items/"),
    ("release", {}, "release", "/review"),
    ("claim", {}, "claim", "/review/items/"),
    ("skip", {}, "skip", "/review/next"),
    ("comments", {"comment": "see the policy page"}, "comment", "/review/items/"),
    ("assign", {"assignee": "me"}, "assignment", "/review/items/"),
]


@pytest.fixture
def store(tmp_path):
    s = make_store(tmp_path)
    yield s
    s.close()


def escalate(client) -> str:
    body = client.post("/v1/answer", json={"question": "How fast are refunds?"}).json()
    assert body["decision"] == "escalate"
    return str(body["request_id"])


def trail_kinds(store, rid: str) -> list[str]:
    return [e.kind for e in store.get(rid).entries]


@pytest.mark.parametrize("path, fields, what, _", FORMS, ids=[f[0] for f in FORMS])
@pytest.mark.parametrize("csrf", [None, "forged"], ids=["no-token", "forged-token"])
def test_a_refused_form_is_audited_and_changes_nothing(store, path, fields, what, _, csrf):
    with TestClient(make_app(store)) as client:
        rid = escalate(client)
        sign_in(client)
        before = trail_kinds(store, rid)
        data = dict(fields) if csrf is None else {**fields, "csrf": csrf}
        reply = client.post(f"/review/items/{rid}/{path}", data=data, follow_redirects=False)
        assert reply.status_code == 403
        assert "The form was not sent from this desk." in reply.text
        assert reply.headers["content-type"].startswith("text/html")
        claims = client.app.state.services.claims
        assert claims.get(rid) is None  # not even a claim was taken
    after = store.get(rid)
    notes = after.of_kind("note")
    assert [n.payload.get("refused") for n in notes] == [f"{what} without CSRF token"]
    assert notes[0].actor == "alice"
    assert trail_kinds(store, rid) == [*before, "note"]
    assert store.get_decision(rid) is None


@pytest.mark.parametrize("path, fields, what, redirect", FORMS, ids=[f[0] for f in FORMS])
def test_a_form_with_the_sessions_token_reaches_its_handler(store, path, fields, what, redirect):
    with TestClient(make_app(store)) as client:
        rid = escalate(client)
        sign_in(client)
        page = client.get(f"/review/items/{rid}")  # opening it claims it for alice
        assert page.status_code == 200
        data = {**fields, "csrf": csrf_of(page.text)}
        reply = client.post(f"/review/items/{rid}/{path}", data=data, follow_redirects=False)
        assert reply.status_code == 303, reply.text
        assert reply.headers["location"].startswith(redirect)
        claim = client.app.state.services.claims.get(rid)
    refused = [n for n in store.get(rid).of_kind("note") if n.payload.get("refused")]
    assert refused == []
    if path == "decision":
        decision = store.get_decision(rid)
        assert decision is not None and decision.action == "reject"
    if path in ("release", "skip"):
        assert claim is None  # given back to the queue
    if path == "claim":
        assert claim is not None and claim.reviewer == "alice"
    if path == "comments":
        assert [e.payload.get("text") for e in store.get(rid).of_kind("review_comment")] == [
            "see the policy page"
        ]
    if path == "assign":
        assigned = store.get(rid).of_kind("review_assigned")
        assert [e.payload.get("assignee") for e in assigned] == ["alice"]


def test_a_form_needs_a_signed_in_reviewer_before_its_token_is_looked_at(store):
    with TestClient(make_app(store)) as client:
        rid = escalate(client)
        reply = client.post(
            f"/review/items/{rid}/claim", data={"csrf": "anything"}, follow_redirects=False
        )
    assert reply.status_code == 303
    assert reply.headers["location"].startswith("/review/signin")
    assert store.get(rid).of_kind("note") == []  # nobody to audit: no refusal recorded
