"""Signing in to the desk: locked out after exactly the documented count of wrong tokens; a
CSRF token and an Origin check, so a cross-site form cannot sign a victim in as the attacker
(login CSRF); signed out, a desk page is a 303 to the sign-in page and back, whose ``next`` is
only ever a path of the desk."""

from __future__ import annotations

import re
import urllib.parse
from pathlib import Path

import pytest

pytest.importorskip("fastapi")
from fastapi.testclient import TestClient
from server_fixtures import TOKEN, csrf_of, make_app, make_store, signin_form

from tracerag.server._auth import COOKIE_NAME, SIGNIN_COOKIE, Throttle

DOCS = Path(__file__).resolve().parents[2] / "docs" / "desk.md"
WRONG = "a-wrong-token-of-some-length-0000"
ATTACKER = "mallory"


class Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


@pytest.fixture
def app(tmp_path):
    store = make_store(tmp_path)
    app = make_app(store)
    yield app
    store.close()


def signed_in(client: TestClient) -> bool:
    return client.get("/review", follow_redirects=False).status_code == 200


# -- the lockout --------------------------------------------------------------------------------


def test_the_documented_count_is_the_throttles():
    text = DOCS.read_text(encoding="utf-8")
    (count,) = re.findall(r"counted per client address: after (\d+),", text)
    assert int(count) == Throttle().free == 5


def test_exactly_five_wrong_tokens_are_answered_then_429(app):
    throttle = app.state.services.auth.throttle
    assert throttle.free == 5  # the default the docs name
    throttle.clock = Clock()  # no lockout runs out while the test runs
    with TestClient(app) as client:
        codes = [
            client.post("/review/signin", data=signin_form(client, token=WRONG)).status_code
            for _ in range(5)
        ]
        assert codes == [401] * 5
        right = client.post("/review/signin", data=signin_form(client, reviewer="a", token=TOKEN))
        assert right.status_code == 429 and int(right.headers["retry-after"]) >= 1
        assert not signed_in(client)
        throttle.clock.now += 2  # the first lockout (1 s) has passed
        again = client.post(
            "/review/signin",
            data=signin_form(client, reviewer="a", token=TOKEN),
            follow_redirects=False,
        )
        assert again.status_code == 303 and signed_in(client)


def test_five_wrong_bearer_tokens_then_429(app):
    app.state.services.auth.throttle.clock = Clock()
    wrong = {"Authorization": f"Bearer {WRONG}"}
    with TestClient(app) as client:
        codes = [client.get("/review/api/queue", headers=wrong).status_code for _ in range(5)]
        assert codes == [401] * 5
        right = client.get("/review/api/queue", headers={"Authorization": f"Bearer {TOKEN}"})
        assert right.status_code == 429 and right.json()["error"] == "too_many_requests"


# -- login CSRF ---------------------------------------------------------------------------------


def test_the_form_carries_a_token_bound_to_its_strict_cookie(app):
    with TestClient(app) as client:
        page = client.get("/review/signin")
        assert page.status_code == 200 and csrf_of(page.text)
        cookie = page.headers["set-cookie"]
        assert cookie.startswith(f"{SIGNIN_COOKIE}=")
        assert "HttpOnly" in cookie and "SameSite=strict" in cookie
        assert "Path=/review/signin" in cookie
        assert page.headers["cache-control"] == "no-store"
        # each form its own token
        assert csrf_of(client.get("/review/signin").text) != csrf_of(page.text)


@pytest.mark.parametrize(
    "headers",
    [
        {"Origin": "https://evil.example"},
        {"Origin": "http://testserver.evil.example"},
        {"Origin": "null"},  # a sandboxed or data: page
        {"Referer": "https://evil.example/login-csrf.html"},
    ],
    ids=["other-site", "look-alike", "null", "referer"],
)
def test_a_cross_site_sign_in_is_refused(app, headers):
    with TestClient(app) as client:
        form = signin_form(client, reviewer="a", token=TOKEN)
        reply = client.post("/review/signin", data=form, headers=headers, follow_redirects=False)
        assert reply.status_code == 403 and "not sent from this desk" in reply.text
        assert COOKIE_NAME not in reply.headers.get("set-cookie", "").split("=")[0]
        assert not signed_in(client)
        # not a guess: the lockout count is untouched
        assert app.state.services.auth.throttle.retry_after("testclient") is None


def test_a_same_site_origin_signs_in(app):
    with TestClient(app) as client:
        form = signin_form(client, reviewer="a", token=TOKEN)
        origin = {"Origin": "http://testserver", "Referer": "http://testserver/review/signin"}
        reply = client.post("/review/signin", data=form, headers=origin, follow_redirects=False)
        assert reply.status_code == 303 and signed_in(client)


def test_a_sign_in_without_the_forms_token_is_refused(app):
    with TestClient(app) as client:
        right = {"reviewer": "a", "token": TOKEN}
        form = signin_form(client, **right)
        cases = {
            "no token": right,
            "wrong token": {**right, "csrf": "0" * 64},
            "empty token": {**right, "csrf": ""},
            "non-ASCII token": {**right, "csrf": "é" * 64},
        }
        for label, data in cases.items():
            reply = client.post("/review/signin", data=data, follow_redirects=False)
            assert reply.status_code == 403, label
            assert "expired or was not this desk" in reply.text, label
            assert not signed_in(client), label
            # the refusal brings a fresh form: a reviewer whose form expired signs in from it
            assert csrf_of(reply.text)
        # the right token without its cookie: refused too
        client.cookies.delete(SIGNIN_COOKIE, path="/review/signin")
        client.cookies.clear()
        reply = client.post("/review/signin", data=form, follow_redirects=False)
        assert reply.status_code == 403 and not signed_in(client)


def test_an_attackers_own_form_cannot_sign_a_victim_in(app):
    """The attacker fetches a form of their own and makes the victim's browser post it with the
    attacker's token: the victim's browser holds its own nonce (or none), never the attacker's."""
    with TestClient(app) as attacker, TestClient(app) as victim:
        stolen = signin_form(attacker, reviewer=ATTACKER, token=TOKEN)
        victim.get("/review/signin")  # the victim's own nonce, as a visit to the desk leaves it
        reply = victim.post("/review/signin", data=stolen, follow_redirects=False)
        assert reply.status_code == 403
        assert not signed_in(victim)
        victim.cookies.clear()  # a victim that never visited the desk
        reply = victim.post("/review/signin", data=stolen, follow_redirects=False)
        assert reply.status_code == 403 and not signed_in(victim)
        # the attacker's own browser signs in with it, as it should
        mine = attacker.post("/review/signin", data=stolen, follow_redirects=False)
        assert mine.status_code == 303


def test_signing_in_spends_the_forms_nonce(app):
    with TestClient(app) as client:
        reply = client.post(
            "/review/signin",
            data=signin_form(client, reviewer="a", token=TOKEN),
            follow_redirects=False,
        )
        assert reply.status_code == 303
        assert any(
            h.startswith(f"{SIGNIN_COOKIE}=") and "Max-Age=0" in h
            for h in reply.headers.get_list("set-cookie")
        )


# -- signed out: to the sign-in page and back -----------------------------------------------------


@pytest.mark.parametrize("path", ["/review", "/review?route=escalate&sort=oldest", "/review/next"])
def test_a_signed_out_page_redirects_to_sign_in_and_back(app, path):
    with TestClient(app) as client:
        first = client.get(path, follow_redirects=False)
        assert first.status_code == 303
        location = first.headers["location"]
        assert location == "/review/signin?" + urllib.parse.urlencode({"next": path})
        form = client.get(location)
        next_value = re.search(r'name="next" value="([^"]*)"', form.text).group(1)
        assert next_value.replace("&amp;", "&") == path
        reply = client.post(
            "/review/signin",
            data={
                "reviewer": "a",
                "token": TOKEN,
                "next": next_value.replace("&amp;", "&"),
                "csrf": csrf_of(form.text),
            },
            follow_redirects=False,
        )
        assert reply.status_code == 303 and reply.headers["location"] == path


def test_the_review_api_signed_out_stays_a_json_401(app):
    with TestClient(app) as client:
        reply = client.get("/review/api/queue", follow_redirects=False)
        assert reply.status_code == 401 and reply.json()["error"] == "unauthorized"


EVIL_NEXT = [
    "//evil.example/x",
    "///evil.example",
    "/\\evil.example",
    "\\\\evil.example",
    "https://evil.example/review",
    "javascript:alert(1)",
    "/\t/evil.example",
    "/review\n/evil",
    " /review",
    "/reviewer-not-the-desk",
    "/review/signin?next=//evil.example",
    "/review/../\\evil.example",
    "/review/é",
    "",
]


@pytest.mark.parametrize("target", EVIL_NEXT)
def test_an_unsafe_next_goes_to_the_queue(app, target):
    with TestClient(app) as client:
        page = client.get("/review/signin", params={"next": target})
        assert re.search(r'name="next" value="([^"]*)"', page.text).group(1) == "/review"
        reply = client.post(
            "/review/signin",
            data=signin_form(client, reviewer="a", token=TOKEN, next=target),
            follow_redirects=False,
        )
        assert reply.status_code == 303 and reply.headers["location"] == "/review", target


@pytest.mark.parametrize("target", ["/review/items/abc?view=full", "/review/materials", "/review"])
def test_a_desk_path_is_a_safe_next(app, target):
    with TestClient(app) as client:
        reply = client.post(
            "/review/signin",
            data=signin_form(client, reviewer="a", token=TOKEN, next=target),
            follow_redirects=False,
        )
        assert reply.headers["location"] == target


@pytest.mark.parametrize(
    ("origin", "host", "allowed"),
    [
        ("http://desk.example", "desk.example", True),
        ("http://desk.example:80", "desk.example", True),
        ("https://desk.example", "desk.example:443", True),
        ("http://DESK.example", "desk.example", True),
        ("http://desk.example:8080", "desk.example", False),
        ("http://desk.example.evil", "desk.example", False),
        ("http://evil@desk.example", "desk.example", True),  # userinfo is not the host
        ("ftp://desk.example", "desk.example", False),
        ("http://desk.example:notaport", "desk.example", False),
        ("http://[::1", "desk.example", False),
    ],
)
def test_the_origin_check_compares_host_and_port(app, origin, host, allowed):
    with TestClient(app, base_url=f"http://{host}") as client:
        form = signin_form(client, reviewer="a", token=TOKEN)
        reply = client.post(
            "/review/signin", data=form, headers={"Origin": origin}, follow_redirects=False
        )
        assert (reply.status_code == 303) is allowed, (origin, host, reply.status_code)


def test_the_sign_in_page_lets_a_browser_send_its_origin(app):
    """A browser sends ``Origin: null`` with a same-origin form post under ``no-referrer``, and
    sign-in refuses a null Origin: the page's policy must keep this site's Origin (and still
    send no referrer to another site)."""
    with TestClient(app) as client:
        page = client.get("/review/signin")
    assert page.headers["referrer-policy"] == "same-origin"
    assert '<meta name="referrer" content="same-origin">' in page.text
