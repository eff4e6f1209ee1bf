"""Every malformed credential is a 4xx in the error shape, never a 5xx: user tokens of any
Unicode and any number of parts, API keys and Bearer tokens of any bytes."""

from __future__ import annotations

import json
from collections.abc import Iterator
from typing import Any

import pytest

pytest.importorskip("fastapi")
from fastapi.testclient import TestClient
from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st
from hypothesis_budget import examples

from tracerag._identity import hash_token
from tracerag.materials import InvalidUserToken, UserTokens
from tracerag.server._asgi import create_app
from tracerag.server._error_shape import ERROR_CODES
from tracerag.store._sqlite import SQLiteAuditStore

API_KEY = "frontend-key-for-tests-0123"
FEEDBACK_KEY = "feedback-key-for-tests-0123456789abcdef"
REVIEWER = "rita-reviewer-token-0123456789"
QUESTION = "How long is a Northwind gift card valid?"

# the shapes the report named, then a few more of the same kind
NAMED = [
    "tru1.é.1999999999.abc",
    "tru1.dTE.¹⁹⁹⁹⁹⁹⁹⁹⁹⁹.abc",  # superscript digits: str.isdigit() says yes, int() says no
    "tru1.dTE.１９９９９９９９９９.abc",  # full-width digits: int() reads them, ASCII does not
    "tru1.dTE.1999999999.é",
    "tru1.dTE." + "9" * 900 + ".abc",  # an expiry no float can hold
    "tru1.\x00.1.a",
    "tru1...",
    "tru1.....",
    "",
    ".",
    "tru1",
]


@pytest.fixture(scope="module")
def client(tmp_path_factory: pytest.TempPathFactory) -> Iterator[TestClient]:
    store = SQLiteAuditStore(str(tmp_path_factory.mktemp("creds") / "audit.sqlite"))
    app = create_app(
        store=store,
        api_key=API_KEY,
        feedback_key=FEEDBACK_KEY,
        reviewers={"rita": hash_token(REVIEWER)},
        model="extractive",
    )
    try:
        with TestClient(app) as c:
            yield c
    finally:
        store.close()


@pytest.fixture(scope="module")
def request_id(client: TestClient) -> str:
    reply = client.post("/v1/answer", json={"question": QUESTION}, headers={"X-API-Key": API_KEY})
    assert reply.status_code == 200, reply.text
    return str(reply.json()["request_id"])


def refused(reply: Any, status: int = 401, code: str = "unauthorized") -> None:
    """A refusal in the error shape with the status the docs promise."""
    assert reply.status_code == status, (reply.status_code, reply.text)
    assert reply.headers["content-type"].startswith("application/json")
    body = reply.json()
    assert set(body) == {"error", "detail"}, body
    assert body["error"] in ERROR_CODES and body["error"] == code, body
    assert isinstance(body["detail"], str | list) and body["detail"]


def refused_token(reply: Any, token: str) -> None:
    """401, but for a NUL or a lone surrogate, which no text field of a body takes (422)."""
    if "\x00" in token or any("\ud800" <= ch <= "\udfff" for ch in token):
        refused(reply, 422, "invalid_input")
    else:
        refused(reply)


def feedback(client: TestClient, rid: str, token: str) -> Any:
    # ASCII JSON: a lone surrogate travels as its escape, as any client may send it
    body = json.dumps({"request_id": rid, "verdict": "deny", "user_token": token})
    headers = {"X-API-Key": API_KEY, "Content-Type": "application/json"}
    return client.post("/v1/feedback", content=body, headers=headers)


# a token of any parts: each part any Unicode but the separator, digits of every script
_part = st.text(st.characters(codec=None, exclude_characters="."), max_size=12) | st.text(
    st.characters(categories=["Nd", "No"]), min_size=1, max_size=14
)
_tokens = st.text(max_size=64) | st.lists(_part, max_size=8).map(".".join)
_tru1 = st.tuples(_part, _part, _part).map(lambda p: "tru1." + ".".join(p))


@settings(
    max_examples=examples(300),
    deadline=None,
    suppress_health_check=[HealthCheck.function_scoped_fixture],
)
@given(token=_tokens | _tru1)
@example(token=NAMED[0])
def test_any_user_token_that_is_not_one_is_a_401(
    client: TestClient, request_id: str, token: str
) -> None:
    refused_token(feedback(client, request_id, token), token)


@pytest.mark.parametrize("token", NAMED)
def test_the_reported_user_tokens_are_401s(client: TestClient, request_id: str, token: str) -> None:
    refused_token(feedback(client, request_id, token), token)


@settings(max_examples=examples(300), deadline=None)
@given(token=_tokens | _tru1)
def test_user_tokens_verify_raises_only_its_own_error(token: str) -> None:
    tokens = UserTokens(FEEDBACK_KEY)
    with pytest.raises(InvalidUserToken):
        tokens.verify(token)


def test_a_good_token_still_counts(client: TestClient, request_id: str) -> None:
    reply = feedback(client, request_id, UserTokens(FEEDBACK_KEY).sign("李雷"))
    assert reply.status_code == 200, reply.text
    assert reply.json()["counted"] is True


# header values as bytes on the wire: any UTF-8 text, and Latin-1 bytes that are not UTF-8
_header_text = st.text(
    st.characters(exclude_categories=["Cc", "Cs"], exclude_characters="\x7f"), max_size=40
).map(str.strip)
_header_bytes = _header_text.map(lambda t: t.encode("utf-8")) | st.binary(max_size=40).map(
    lambda b: bytes(c for c in b if c >= 0x20 and c != 0x7F).strip()
)


@settings(
    max_examples=examples(200),
    deadline=None,
    suppress_health_check=[HealthCheck.function_scoped_fixture],
)
@given(value=_header_bytes)
@example(value="ключ-é-１２３".encode())
def test_any_wrong_api_key_is_a_401(client: TestClient, request_id: str, value: bytes) -> None:
    reply = client.get(f"/v1/requests/{request_id}", headers={"X-API-Key": value})  # type: ignore[dict-item]
    refused(reply)


@settings(
    max_examples=examples(200),
    deadline=None,
    suppress_health_check=[HealthCheck.function_scoped_fixture],
)
@given(value=_header_bytes)
@example(value="ключ-é-１２３".encode())
def test_any_wrong_bearer_token_is_a_4xx(client: TestClient, request_id: str, value: bytes) -> None:
    throttle = client.app.state.services.auth.throttle  # type: ignore[attr-defined]
    throttle.succeeded("testclient")  # each example its own first try: a 401, not a 429
    reply = client.post(
        "/v1/feedback",
        json={"request_id": request_id, "verdict": "deny"},
        headers={"X-API-Key": API_KEY, "Authorization": b"Bearer " + value},  # type: ignore[dict-item]
    )
    refused(reply)


@settings(
    max_examples=examples(200),
    deadline=None,
    suppress_health_check=[HealthCheck.function_scoped_fixture],
)
@given(
    token=_tokens | _tru1 | st.from_regex(r"\A[0-9]{1,14}\.[0-9a-f]{0,70}\Z"),
    request_id=st.sampled_from(["", "%FF", "%C3%A9", "%ED%A0%80", "é", "a%00b"])
    | st.text(st.characters(codec="utf-8", exclude_characters="/?#%"), min_size=1, max_size=20),
)
@example(token="1999999999.abc", request_id="%FF")
@example(token="\ud800", request_id="")
def test_any_events_token_that_is_not_one_is_a_401(
    client: TestClient, request_id: str, token: str
) -> None:
    """The events URL's token (its query parameter) and the request id it is checked for."""
    from urllib.parse import quote

    rid = request_id if "%" in request_id else quote(request_id, safe="")
    # sent as a client sends it: percent-encoded UTF-8 (a lone surrogate as its raw bytes,
    # which no UTF-8 decoder takes)
    sent = quote(token.encode("utf-8", "surrogatepass"), safe="")
    reply = client.get(f"/v1/requests/{rid or 'x'}/events?token={sent}")
    assert reply.status_code < 500, (reply.status_code, reply.text)
    if reply.status_code != 404:  # an id no router path takes (an encoded NUL, a slash)
        refused(reply)
