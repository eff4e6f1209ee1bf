"""Desk state lives in the store's database: two apps on one store are interchangeable.

Two apps built on the same SQLite file stand for two server processes (the PostgreSQL test with
real processes is ``test_desk_replicas.py``): a session signed in on one works on the other, a
claim taken on one blocks a decision on the other, failed sign-ins on both count towards one
lockout, signing out on one ends the session and its claims everywhere. A row written into the
database by someone without the credentials opens no session.
"""

from __future__ import annotations

import asyncio
import re

import httpx
import pytest

pytest.importorskip("fastapi")
from fastapi.testclient import TestClient
from server_fixtures import TOKEN, csrf_of, make_app, make_pipeline, signin_cookie, signin_form
from store_fixtures import make_record

from tracerag.server._auth import COOKIE_NAME, MemorySessions, SharedSessions, SharedThrottle
from tracerag.server._review_claims import ClaimBoard, SharedClaimBoard
from tracerag.store._sqlite import SQLiteAuditStore


@pytest.fixture
def stores(tmp_path):
    """Two store objects (two connections) on one SQLite file, with one escalated item."""
    path = str(tmp_path / "audit.sqlite")
    one, two = SQLiteAuditStore(path), SQLiteAuditStore(path)
    one.append_record(make_record("esc-1", decision="escalate", confidence=0.3))
    yield one, two
    one.close()
    two.close()


@pytest.fixture
def replicas(stores):
    """Two apps, each on its own connection to the store."""
    one, two = stores
    apps = (make_app(one, make_pipeline()), make_app(two, make_pipeline()))
    with TestClient(apps[0]) as a, TestClient(apps[1]) as b:
        yield a, b


def cookie_of(client: TestClient) -> str:
    value = client.cookies.get(COOKIE_NAME)
    assert value
    return value


def move(cookie: str, to: TestClient) -> None:
    to.cookies.clear()
    to.cookies.set(COOKIE_NAME, cookie, path="/review")


def sign_in(client: TestClient, name: str) -> str:
    form = signin_form(client, reviewer=name, token=TOKEN)
    reply = client.post("/review/signin", data=form, follow_redirects=False)
    assert reply.status_code == 303, reply.text
    return cookie_of(client)


def _file_of(db) -> str:
    """The file a desk database's connection has open (SQLite's own answer)."""
    with db.read() as cur:
        cur.execute("PRAGMA database_list")
        return next(str(row[2]) for row in cur.fetchall() if row[1] == "main")


def test_the_desk_keeps_its_state_in_the_store(replicas) -> None:
    a, b = replicas
    for client in (a, b):
        svc = client.app.state.services
        assert isinstance(svc.auth.sessions, SharedSessions)
        assert isinstance(svc.auth.throttle, SharedThrottle)
        assert isinstance(svc.claims, SharedClaimBoard)
        # all three on the app's own connection to the store's file
        assert svc.auth.sessions.db is svc.auth.throttle.db is svc.claims.db is svc.desk_db
    one, two = (client.app.state.services for client in (a, b))
    assert one.desk_db is not two.desk_db
    assert _file_of(one.desk_db) == _file_of(two.desk_db)  # two connections, one file
    # what one writes the other reads: a session and a claim
    one.auth.sessions.add("key-1", "alice", "session", expires=2e9, now=1e9)
    assert two.auth.sessions.find("key-1", now=1e9) == ("alice", "session", 2e9)
    assert one.claims.get("esc-1") is None
    one.claims.take("esc-1", "alice", session="key-1")
    claim = two.claims.get("esc-1")
    assert claim is not None and claim.reviewer == "alice"


def test_a_memory_store_keeps_desk_state_in_the_process() -> None:
    app = make_app(SQLiteAuditStore(":memory:"), make_pipeline())
    svc = app.state.services
    assert svc.desk_db is None
    assert isinstance(svc.auth.sessions, MemorySessions) and type(svc.claims) is ClaimBoard


def test_sign_in_on_one_decide_on_the_other(replicas, stores) -> None:
    a, b = replicas
    cookie = sign_in(a, "alice")
    move(cookie, b)
    page = b.get("/review/items/esc-1")
    assert page.status_code == 200 and "You are working on this item" in page.text
    # the CSRF token of a page served by one app is good on the other
    move(cookie, a)
    done = a.post(
        "/review/items/esc-1/decision",
        data={"csrf": csrf_of(page.text), "action": "reject", "reason": "wrong policy"},
        follow_redirects=False,
    )
    assert done.status_code == 303
    assert stores[1].get_decision("esc-1").reviewer == "alice"
    assert stores[0].verify_chain().ok


def test_a_claim_on_one_blocks_a_decision_on_the_other(replicas, stores) -> None:
    a, b = replicas
    sign_in(a, "alice")
    assert "You are working on this item" in a.get("/review/items/esc-1").text
    sign_in(b, "bob")
    theirs = b.get("/review/items/esc-1").text
    assert re.search(r"<strong>alice</strong> is working on this item", theirs)
    blocked = b.post(
        "/review/items/esc-1/decision",
        data={"csrf": csrf_of(theirs), "action": "reject", "reason": "no"},
    )
    assert blocked.status_code == 409 and "alice" in blocked.text
    api = b.post(
        "/review/api/items/esc-1/decision",
        json={"action": "reject", "reason": "no", "reviewer": "bob"},
        headers={"Authorization": f"Bearer {TOKEN}"},
    )
    assert api.status_code == 409 and api.json()["error"] == "conflict"
    queue = b.get("/review").text
    assert "0 pending · 1 claimed · 0 decided" in " ".join(re.sub(r"<[^>]+>", " ", queue).split())
    assert stores[0].get_decision("esc-1") is None


def test_signing_out_on_one_ends_the_session_and_its_claims_everywhere(replicas) -> None:
    a, b = replicas
    cookie = sign_in(a, "alice")
    page = a.get("/review/items/esc-1").text
    board = b.app.state.services.claims
    assert board.get("esc-1").reviewer == "alice"
    move(cookie, b)
    out = b.post("/review/signout", data={"csrf": csrf_of(page)}, follow_redirects=False)
    assert out.status_code == 303
    assert board.get("esc-1") is None  # back in the queue now, not in 15 minutes
    move(cookie, a)
    assert a.get("/review", follow_redirects=False).status_code == 303  # to sign in
    assert a.app.state.services.auth.live_sessions == 0


def call_from(app, address: str, method: str, path: str, **kwargs):
    async def go():
        transport = httpx.ASGITransport(app=app, client=(address, 40000))
        async with httpx.AsyncClient(transport=transport, base_url="http://desk") as client:
            return await client.request(method, path, **kwargs)

    return asyncio.run(go())


def signin_from(app, address: str, form: dict[str, str]):
    cookie, csrf = signin_cookie(app)
    return call_from(
        app, address, "POST", "/review/signin", data={**form, "csrf": csrf}, headers=cookie
    )


def test_the_lockout_holds_across_both(replicas) -> None:
    a, b = replicas
    for client in (a, b):
        client.app.state.services.auth.throttle.base = 60.0  # a lockout no test outlasts
    guess = {"reviewer": "x", "token": "guess-guess-guess-0000"}
    codes = [
        signin_from(app, "127.0.0.9", guess).status_code
        for app in (a.app, b.app, a.app, b.app, a.app, b.app)
    ]
    # exactly five wrong tokens are answered, the next try is refused: counted on either app
    assert codes == [401, 401, 401, 401, 401, 429]
    right = {"reviewer": "x", "token": TOKEN}
    for app in (a.app, b.app):
        locked = signin_from(app, "127.0.0.9", right)
        assert locked.status_code == 429 and int(locked.headers["retry-after"]) >= 1
        bearer = call_from(
            app,
            "127.0.0.9",
            "GET",
            "/review/api/queue",
            headers={"Authorization": f"Bearer {TOKEN}"},
        )
        assert bearer.status_code == 429
    assert signin_from(b.app, "127.0.0.10", right).status_code == 303


def test_concurrent_guesses_through_both_are_counted_one_by_one(replicas) -> None:
    a, b = replicas

    async def main():
        clients = [
            httpx.AsyncClient(
                transport=httpx.ASGITransport(app=app, client=("127.0.0.11", 40000)),
                base_url="http://desk",
            )
            for app in (a.app, b.app)
        ]
        try:
            return await asyncio.gather(
                *[
                    clients[i % 2].get(
                        "/review/api/queue",
                        headers={"Authorization": f"Bearer wrong-guess-{i:04d}-abcdef"},
                    )
                    for i in range(40)
                ]
            )
        finally:
            for c in clients:
                await c.aclose()

    replies = asyncio.run(main())
    codes = sorted(r.status_code for r in replies)
    free = a.app.state.services.auth.throttle.free
    assert codes.count(401) == free and codes.count(429) == 40 - free


def test_a_session_row_written_into_the_database_opens_nothing(replicas, stores) -> None:
    """Someone who can write the database but holds no credential cannot make a session: the
    table keys sessions by an HMAC under a key derived from the credentials."""
    a, _ = replicas
    import sqlite3

    from itsdangerous import URLSafeTimedSerializer

    path = stores[0].path
    forged_sid = "attacker-chosen-session-id"
    with sqlite3.connect(path) as conn:
        for key in (forged_sid, __import__("hashlib").sha256(forged_sid.encode()).hexdigest()):
            conn.execute(
                "INSERT INTO desk_sessions VALUES (?, 'mallory', 'shared', 0, 9e12)", (key,)
            )
    auth = a.app.state.services.auth
    cookies = [
        URLSafeTimedSerializer(b"guess", salt="tracerag-review-session").dumps({"sid": forged_sid}),
        # even a cookie signed with the real key finds no row: rows are keyed by an HMAC
        auth._serializer.dumps({"sid": forged_sid}),
    ]
    for cookie in cookies:
        a.cookies.clear()
        a.cookies.set(COOKIE_NAME, cookie, path="/review")
        assert a.get("/review", follow_redirects=False).status_code == 303  # to sign in


def test_changing_the_credentials_ends_every_session(tmp_path) -> None:
    path = str(tmp_path / "audit.sqlite")
    store = SQLiteAuditStore(path)
    try:
        with TestClient(make_app(store, make_pipeline())) as before:
            cookie = sign_in(before, "alice")
            assert before.get("/review").status_code == 200
        rotated = make_app(store, make_pipeline(), reviewer_token="a-new-token-after-rotation-42")
        with TestClient(rotated) as after:
            move(cookie, after)
            assert after.get("/review", follow_redirects=False).status_code == 303
    finally:
        store.close()
