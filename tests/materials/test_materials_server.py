"""``POST /v1/feedback`` of ``tracerag serve``'s app (the demo pipeline, governed by the store's
material registry) over a real store on both backends: verdicts count per authenticated
principal, declared names count for nothing, limits hold, denials only propose a quarantine,
and the reply tells the caller nothing about materials."""

from __future__ import annotations

import time
from collections.abc import Iterator
from typing import Any

import pytest
from fastapi.testclient import TestClient
from store_fixtures import Backend

from tracerag._identity import hash_token
from tracerag.materials import FeedbackLimits, MaterialRegistry, UserTokens
from tracerag.server._asgi import create_app

API_KEY = "frontend-key-for-tests-0123"
FEEDBACK_KEY = "feedback-key-for-tests-0123456789abcdef"
REVIEWER = "rita-reviewer-token-0123456789"
GIFT = "How long is a Northwind gift card valid?"
CALLER_KEYS = {
    "request_id",
    "verdict",
    "feedback_id",
    "recorded_as",
    "counted",
    "note",
    "correction_held",
}


def serve(backend: Backend, **options: Any) -> Iterator[tuple[TestClient, MaterialRegistry]]:
    store = backend.open()
    options.setdefault("api_key", API_KEY)
    app = create_app(
        store=store,
        review_desk=False,
        feedback_key=FEEDBACK_KEY,
        model="extractive",
        **options,
    )
    try:
        with TestClient(app) as client:
            yield client, app.state.services.registry
    finally:
        store.close()


@pytest.fixture
def served(backend: Backend) -> Iterator[tuple[TestClient, MaterialRegistry]]:
    yield from serve(backend)


def headers(client: TestClient) -> dict[str, str]:
    key = client.app.state.services.api_key  # type: ignore[attr-defined]
    return {"X-API-Key": key} if key else {}


def ask(client: TestClient, question: str = GIFT) -> str:
    reply = client.post("/v1/answer", json={"question": question}, headers=headers(client))
    assert reply.status_code == 200, reply.text
    assert "gift-cards" in [e["material_id"] for e in reply.json()["evidence"]]
    client.app.state.answerer.wait_handed_on()  # type: ignore[attr-defined]  # first sight
    return str(reply.json()["request_id"])


def verdict(client: TestClient, rid: str, kind: str = "deny", **fields: Any) -> Any:
    body = {"request_id": rid, "verdict": kind, **fields}
    return client.post("/v1/feedback", json=body, headers=headers(client))


def caller_view(reply: Any) -> dict[str, Any]:
    """The reply, checked to tell nothing about materials or credibility."""
    data = reply.json()
    assert set(data) == CALLER_KEYS, data
    text = reply.text.lower()
    for secret in ("ema", "gift-cards", "credib", "quarantin", "updates", "audit_seq"):
        assert secret not in text, (secret, data)
    return data


def untouched(registry: MaterialRegistry) -> None:
    state = registry.get("gift-cards")
    assert state.denials == 0 and state.outcomes == 0
    assert state.ema == registry.policy.prior
    assert state.status == "active" and state.proposed_quarantine is None


def test_invented_names_count_for_nothing(backend: Backend) -> None:
    """The red-team's attack: four verdicts under invented names (three deny, one clarify) on
    a server without an API key. Each is kept as an unverified note; nothing moves."""
    for client, registry in serve(backend, api_key=""):
        rid = ask(client)
        for name in ("alice", "bob", "carol"):
            reply = verdict(client, rid, "deny", user=name, comment="wrong")
            assert reply.status_code == 200, reply.text
            data = caller_view(reply)
            assert data["recorded_as"] == "note" and data["counted"] is False
            assert "unverified" in data["note"]
        reply = verdict(client, rid, "clarify", user="dave", correction="Gift cards never expire.")
        data = caller_view(reply)
        assert data["counted"] is False and data["correction_held"] is False
        untouched(registry)
        assert registry.pending() == [] and registry.proposals() == []
        notes = registry.feedback_for(rid)
        assert [(n["principal"], n["declared_user"], n["counted"]) for n in notes] == [
            (None, "alice", False),
            (None, "bob", False),
            (None, "carol", False),
            (None, "dave", False),
        ]
        assert registry.verify().ok, registry.verify().issues


def test_the_api_key_is_one_principal_whatever_name_it_declares(
    served: tuple[TestClient, MaterialRegistry],
) -> None:
    client, registry = served
    rid = ask(client)
    first = caller_view(verdict(client, rid, "deny", user="alice"))
    assert first["recorded_as"] == "verdict" and first["counted"] is True
    for name in ("bob", "carol"):
        reply = verdict(client, rid, "deny", user=name)
        assert reply.status_code == 409 and reply.json()["error"] == "duplicate"
    assert registry.get("gift-cards").denials == 1
    # on other answers, the same principal does not move the same material again in the window
    for _ in range(2):
        data = caller_view(verdict(client, ask(client), "deny"))
        assert data["recorded_as"] == "verdict" and data["counted"] is False
        assert "within the window" in data["note"]
    assert registry.get("gift-cards").denials == 1
    (row,) = registry.feedback_for(rid)
    assert row["principal"] == "app:api-key" and row["method"] == "api-key"
    assert row["declared_user"] == "alice"


def test_signed_users_count_once_each_and_only_propose_a_quarantine(
    served: tuple[TestClient, MaterialRegistry],
) -> None:
    client, registry = served
    tokens = UserTokens(FEEDBACK_KEY)
    rid = ask(client)
    assert client.get(f"/v1/requests/{rid}", headers=headers(client)).json()["decision"] == "pass"
    for n, user in enumerate(("u1", "u2", "u3"), 1):
        data = caller_view(verdict(client, rid, "deny", user_token=tokens.sign(user)))
        assert data["recorded_as"] == "verdict" and data["counted"] is True
        assert registry.get("gift-cards").denials == n
        again = verdict(client, rid, "deny", user_token=tokens.sign(user))
        assert again.status_code == 409
    state = registry.get("gift-cards")
    assert state.status == "active" and state.proposed_quarantine  # proposed, not quarantined
    assert [p.material_id for p in registry.proposals()] == ["gift-cards"]
    # still in retrieval, but an answer citing it now goes to a person
    again = client.post("/v1/answer", json={"question": GIFT}, headers=headers(client)).json()
    assert "gift-cards" in [e["material_id"] for e in again["evidence"]]
    assert again["decision"] == "review"
    stored = registry.store.get(again["request_id"]).record["materials"]
    gift = next(m for m in stored if m["id"] == "gift-cards")
    assert "quarantine proposed" in gift["metadata"]["quarantine_proposed"]
    assert [r["principal"] for r in registry.feedback_for(rid)] == ["user:u1", "user:u2", "user:u3"]
    assert registry.verify().ok, registry.verify().issues


def test_user_tokens_that_do_not_verify_are_refused(
    served: tuple[TestClient, MaterialRegistry],
) -> None:
    client, registry = served
    rid = ask(client)
    good = UserTokens(FEEDBACK_KEY).sign("u1")
    forged = good[:-2] + ("AA" if not good.endswith("AA") else "BB")
    other_key = UserTokens("another-key-of-at-least-32-characters!!").sign("u1")
    expired = UserTokens(FEEDBACK_KEY, clock=lambda: time.time() - 10 * 86400).sign("u1")
    for token in (forged, other_key, expired, "u1", "tru1.x.y.z"):
        reply = verdict(client, rid, "deny", user_token=token)
        assert reply.status_code == 401 and reply.json()["error"] == "unauthorized", token
    untouched(registry)


def test_a_server_without_the_key_refuses_user_tokens(backend: Backend) -> None:
    store = backend.open()
    app = create_app(store=store, api_key=API_KEY, review_desk=False, feedback_key="")
    try:
        with TestClient(app) as client:
            rid = ask(client)
            token = UserTokens(FEEDBACK_KEY).sign("u1")
            reply = verdict(client, rid, "deny", user_token=token)
            assert reply.status_code == 400 and "TRACERAG_FEEDBACK_KEY" in reply.json()["detail"]
    finally:
        store.close()


def test_a_principal_over_its_rate_is_refused(backend: Backend) -> None:
    for client, _registry in serve(backend, feedback_limits=FeedbackLimits(per_principal=2)):
        token = UserTokens(FEEDBACK_KEY).sign("busy")
        for _ in range(2):
            assert verdict(client, ask(client), "confirm", user_token=token).status_code == 200
        reply = verdict(client, ask(client), "confirm", user_token=token)
        assert reply.status_code == 429 and reply.json()["error"] == "too_many_requests"
        assert int(reply.headers["Retry-After"]) > 3000
        # another user is not held up
        other = UserTokens(FEEDBACK_KEY).sign("calm")
        assert verdict(client, ask(client), "confirm", user_token=other).status_code == 200


def test_a_named_reviewer_token_is_a_principal(backend: Backend) -> None:
    store = backend.open()
    app = create_app(
        store=store,
        api_key=API_KEY,
        reviewers={"rita": hash_token(REVIEWER)},
        feedback_key=FEEDBACK_KEY,
    )
    try:
        with TestClient(app) as client:
            rid = ask(client)
            bearer = {"X-API-Key": API_KEY, "Authorization": f"Bearer {REVIEWER}"}
            body = {"request_id": rid, "verdict": "deny"}
            reply = client.post("/v1/feedback", json=body, headers=bearer)
            assert caller_view(reply)["counted"] is True
            registry = app.state.services.registry
            assert registry.feedback_for(rid)[0]["principal"] == "reviewer:rita"
            wrong = {"X-API-Key": API_KEY, "Authorization": "Bearer not-a-token-0123456789"}
            assert client.post("/v1/feedback", json=body, headers=wrong).status_code == 401
    finally:
        store.close()


def test_text_a_store_cannot_keep_is_refused_before_it_counts(
    served: tuple[TestClient, MaterialRegistry],
) -> None:
    client, registry = served
    rid = ask(client)
    for field in ("comment", "user", "correction"):
        reply = verdict(client, rid, "clarify", **{"correction": "ok", field: "a\x00b"})
        assert reply.status_code == 422 and "NUL" in reply.json()["detail"], field
    untouched(registry)


def test_user_token_round_trip_and_limits() -> None:
    tokens = UserTokens(FEEDBACK_KEY, max_age=3600)
    assert tokens.verify(tokens.sign("李雷")) == "李雷"
    with pytest.raises(ValueError):
        UserTokens("short")
    with pytest.raises(ValueError):
        tokens.sign(" padded ")
    long_lived = UserTokens(FEEDBACK_KEY, max_age=10 * 86400).sign("u1")
    from tracerag.materials import InvalidUserToken

    with pytest.raises(InvalidUserToken, match="longer"):
        tokens.verify(long_lived)
