"""Reviewer credentials: named tokens hashed at rest, sessions revoked on sign-out, guessing
throttled per client on both the form and the Bearer path, failures logged without the token."""

from __future__ import annotations

import asyncio
import logging

import pytest

pytest.importorskip("fastapi")
import httpx
from fastapi.testclient import TestClient
from server_fixtures import (
    TOKEN,
    csrf_of,
    make_app,
    make_store,
    sign_in,
    signin_cookie,
    signin_form,
)

from tracerag.errors import ConfigurationError
from tracerag.server._auth import COOKIE_NAME, Throttle, hash_token, read_reviewers_file

ALICE = "alices-personal-token-9f2k1"
LI = "li-weis-personal-token-7x3q0"
REVIEWERS = {"alice": hash_token(ALICE), "李伟": hash_token(LI)}


class Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


@pytest.fixture
def store(tmp_path):
    s = make_store(tmp_path)
    yield s
    s.close()


@pytest.fixture
def app(store):
    app = make_app(store, reviewers=REVIEWERS)
    clock = Clock()
    app.state.services.auth.throttle = Throttle(free=3, base=2.0, clock=clock)
    app.state.clock = clock
    return app


def escalate(client) -> str:
    body = client.post("/v1/answer", json={"question": "How fast are refunds?"}).json()
    assert body["decision"] == "escalate"
    return body["request_id"]


def call_from(app, address: str, method: str, path: str, **kwargs):
    """One request as if from ``address`` (the ASGI client, as a proxy-less server sees it)."""

    async def go():
        transport = httpx.ASGITransport(app=app, client=(address, 40000))
        async with httpx.AsyncClient(transport=transport, base_url="http://desk") as client:
            return await client.request(method, path, **kwargs)

    return asyncio.run(go())


def signin_from(app, address: str, **form: str):
    """A sign-in from ``address`` with the form's CSRF token and nonce cookie."""
    cookie, csrf = signin_cookie(app)
    return call_from(
        app, address, "POST", "/review/signin", data={**form, "csrf": csrf}, headers=cookie
    )


def test_sign_out_revokes_the_session_on_the_server(app):
    with TestClient(app) as client:
        sign_in(client)
        cookie = client.cookies.get(COOKIE_NAME)
        page = client.get("/review")
        assert page.status_code == 200
        reply = client.post(
            "/review/signout", data={"csrf": csrf_of(page.text)}, follow_redirects=False
        )
        assert reply.status_code == 303
        client.cookies.clear()
        client.cookies.set(COOKIE_NAME, cookie, path="/review")  # a copy kept by an attacker
        assert client.get("/review", follow_redirects=False).status_code == 303  # to sign in
    assert app.state.services.auth.live_sessions == 0


def test_a_named_token_names_the_reviewer(app, store):
    with TestClient(app) as client:
        rid = escalate(client)
        reply = client.post(
            f"/review/api/items/{rid}/decision",
            json={"action": "reject", "reason": "wrong policy", "reviewer": "someone-else"},
            headers={"Authorization": f"Bearer {LI}"},
        )
        assert reply.status_code == 200, reply.text
        form = signin_form(client, reviewer="mallory", token=ALICE)
        signed = client.post("/review/signin", data=form, follow_redirects=False)
        assert signed.status_code == 303
        assert 'signed in as <strong lang="en">alice</strong>' in client.get("/review").text
    assert store.get_decision(rid).reviewer == "李伟"


def test_with_the_shared_token_a_non_ascii_name_goes_in_the_json_body(store):
    with TestClient(make_app(store)) as client:
        rid = escalate(client)
        reply = client.post(
            f"/review/api/items/{rid}/decision",
            json={"action": "reject", "reason": "政策已过期", "reviewer": "王芳"},
            headers={"Authorization": f"Bearer {TOKEN}"},
        )
    assert reply.status_code == 200 and reply.json()["reviewer"] == "王芳"
    assert store.get_decision(rid).reviewer == "王芳"


def test_failed_sign_ins_lock_out_that_client_only(app, caplog):
    caplog.set_level(logging.WARNING, logger="tracerag.server.security")
    form = {"reviewer": "x", "token": "guess-guess-guess-0000"}
    with TestClient(app):
        # free=3: exactly three wrong tokens are answered, the next try is refused
        codes = [signin_from(app, "127.0.0.2", **form).status_code for _ in range(4)]
        assert codes == [401, 401, 401, 429]
        right = signin_from(app, "127.0.0.2", reviewer="x", token=ALICE)
        assert right.status_code == 429 and int(right.headers["retry-after"]) >= 1
        other = signin_from(app, "127.0.0.3", reviewer="x", token=ALICE)
        assert other.status_code == 303
    failures = [r for r in caplog.records if "failed reviewer" in r.getMessage()]
    assert len(failures) == 3 and all("127.0.0.2" in r.getMessage() for r in failures)
    assert "locked out" in failures[-1].getMessage()
    assert not any(
        "guess-guess" in r.getMessage() or ALICE in r.getMessage() for r in caplog.records
    )


def test_bearer_guesses_are_throttled_like_the_form(app, caplog):
    caplog.set_level(logging.WARNING, logger="tracerag.server.security")
    wrong = {"Authorization": "Bearer not-the-token-0000000000"}
    right = {"Authorization": f"Bearer {ALICE}"}
    with TestClient(app):
        codes = [
            call_from(app, "127.0.0.4", "GET", "/review/api/queue", headers=wrong).status_code
            for _ in range(3)
        ]
        assert codes == [401, 401, 401]
        locked = call_from(app, "127.0.0.4", "GET", "/review/api/queue", headers=right)
        assert locked.status_code == 429 and locked.json()["error"] == "too_many_requests"
        # the form shares the count: the same client cannot switch paths
        form = signin_from(app, "127.0.0.4", reviewer="x", token=ALICE)
        assert form.status_code == 429
        app.state.clock.now += 60  # the back-off has passed
        assert (
            call_from(app, "127.0.0.4", "GET", "/review/api/queue", headers=right).status_code
            == 200
        )
    assert not any("not-the-token" in r.getMessage() for r in caplog.records)


def test_the_back_off_grows_and_is_capped():
    clock = Clock()
    throttle = Throttle(free=2, base=1.0, cap=8.0, clock=clock)
    lockouts = [throttle.failed("c") for _ in range(7)]
    assert lockouts == [None, 1.0, 2.0, 4.0, 8.0, 8.0, 8.0]  # the 2nd failure locks
    assert throttle.retry_after("c") == 8.0
    clock.now += 8.0
    assert throttle.retry_after("c") is None
    throttle.succeeded("c")
    assert throttle.failed("c") is None


@pytest.mark.parametrize("token", ["a" * 16, "abababababababab", "short-token"])
def test_weak_shared_tokens_are_refused(store, token):
    with pytest.raises(ConfigurationError, match="too weak"):
        make_app(store, reviewer_token=token)


def test_the_reviewers_file_holds_hashes_only(tmp_path):
    path = tmp_path / "reviewers"
    path.write_text(f"# the desk's reviewers\nalice:{hash_token(ALICE)}\n", encoding="utf-8")
    assert read_reviewers_file(path) == {"alice": hash_token(ALICE)}
    path.write_text(f"alice:{ALICE}\n", encoding="utf-8")  # a plain token is refused
    with pytest.raises(ValueError, match="sha256"):
        read_reviewers_file(path)


def test_a_csrf_refusal_is_audited_on_the_request(app, store, caplog):
    caplog.set_level(logging.WARNING, logger="tracerag.server.security")
    with TestClient(app) as client:
        rid = escalate(client)
        client.post("/review/signin", data=signin_form(client, reviewer="", token=ALICE))
        reply = client.post(
            f"/review/items/{rid}/decision", data={"action": "approve", "csrf": "forged"}
        )
    assert reply.status_code == 403
    notes = store.get(rid).of_kind("note")
    assert [n.payload.get("refused") for n in notes] == ["decision without CSRF token"]
    assert notes[0].actor == "alice"
    assert store.get_decision(rid) is None
    assert any("refused decision" in r.getMessage() for r in caplog.records)


def test_concurrent_guesses_from_one_client_are_counted_one_by_one(app):
    """64 guesses at once: each is counted as it is checked, so exactly ``free`` are checked."""

    async def main():
        transport = httpx.ASGITransport(app=app, client=("127.0.0.5", 40000))
        async with httpx.AsyncClient(transport=transport, base_url="http://desk") as client:
            return await asyncio.gather(
                *[
                    client.get(
                        "/review/api/queue",
                        headers={"Authorization": f"Bearer wrong-guess-{i:04d}-abcdef"},
                    )
                    for i in range(64)
                ]
            )

    with TestClient(app):
        replies = asyncio.run(main())
    codes = sorted(r.status_code for r in replies)
    free = app.state.services.auth.throttle.free
    assert codes.count(401) == free and codes.count(429) == 64 - free
