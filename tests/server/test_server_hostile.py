"""Hostile input and failing stores: every bad request is a JSON 4xx in the error shape, with
the security headers; a store outage is a JSON 503; nothing hangs."""

from __future__ import annotations

import json
import socket

import pytest

pytest.importorskip("fastapi")
from fastapi.testclient import TestClient
from server_fixtures import (
    BEARER_TOKEN_HEADER,
    GOOD_ANSWER,
    TOKEN,
    make_app,
    make_pipeline,
    make_store,
    running,
    signin_form,
)

JSON = {"Content-Type": "application/json"}
DEEP = b'{"question": ' + b"[" * 1500 + b"]" * 1500 + b"}"
DEEP_OBJECT = b'{"action": "approve", "reason": ' + b'{"a":' * 1200 + b"1" + b"}" * 1200 + b"}"


@pytest.fixture
def store(tmp_path):
    s = make_store(tmp_path)
    yield s
    s.close()


@pytest.fixture
def client(store):
    with TestClient(make_app(store, make_pipeline([GOOD_ANSWER]))) as c:
        yield c


def assert_problem(reply, status: int, error: str) -> None:
    assert reply.status_code == status, reply.text
    body = reply.json()
    assert set(body) == {"error", "detail"} and body["error"] == error and body["detail"]
    assert "default-src 'none'" in reply.headers["content-security-policy"]
    assert reply.headers["x-content-type-options"] == "nosniff"


@pytest.mark.parametrize("path", ["/v1/answer", "/v1/answer/stream"])
def test_deeply_nested_json_is_a_400_not_a_500(client, store, path):
    assert len(DEEP) < 4096
    assert_problem(client.post(path, content=DEEP, headers=JSON), 400, "bad_request")
    assert store.list_requests() == []


def test_deeply_nested_json_on_the_desk_api_is_a_400(client, store):
    rid = client.post("/v1/answer", json={"question": "q?"}).json()["request_id"]
    reply = client.post(
        f"/review/api/items/{rid}/decision",
        content=DEEP_OBJECT,
        headers={**JSON, **BEARER_TOKEN_HEADER},
    )
    assert_problem(reply, 400, "bad_request")


def test_a_sign_in_with_many_fields_is_a_400(client):
    body = "&".join(f"f{i}=x" for i in range(500)) + f"&reviewer=a&token={TOKEN}"
    reply = client.post(
        "/review/signin",
        content=body.encode(),
        headers={"Content-Type": "application/x-www-form-urlencoded"},
    )
    assert_problem(reply, 400, "bad_request")


@pytest.mark.parametrize(
    "question",
    ["\u200b\u200c\u200d\ufeff", " \u2060\u200b ", "\u200e\u200f", "\x00\x01"],
)
def test_a_question_of_invisible_characters_is_refused(client, store, question):
    reply = client.post("/v1/answer", json={"question": question})
    assert_problem(reply, 422, "invalid_input")
    assert store.list_requests() == []


def test_a_lone_surrogate_is_refused_not_stored(client, store):
    body = b'{"question": "refund \\ud800 policy?"}'
    assert_problem(client.post("/v1/answer", content=body, headers=JSON), 422, "invalid_input")
    assert store.list_requests() == []


def test_a_chinese_question_with_a_zero_width_space_is_answered(client):
    reply = client.post("/v1/answer", json={"question": "退货\u200b期限是多少天？"})
    assert reply.status_code == 200


@pytest.mark.parametrize(
    ("content_type", "status"),
    [
        ("text/plain", 415),
        ("application/x-www-form-urlencoded", 415),
        ("multipart/form-data; boundary=x", 415),
        (None, 415),
        ("application/json; charset=utf-8", 200),
    ],
)
def test_only_json_bodies_run_the_pipeline(client, store, content_type, status):
    headers = {"Content-Type": content_type} if content_type else {}
    body = json.dumps({"question": "How many days do I have to return an item?"}).encode()
    reply = client.post("/v1/answer", content=body, headers=headers)
    assert reply.status_code == status, reply.text
    if status == 415:
        assert reply.json()["error"] == "unsupported_media_type"
        assert store.list_requests() == []


def test_unknown_routes_and_methods_use_the_error_shape(client):
    assert_problem(client.get("/v1/nowhere"), 404, "not_found")
    assert_problem(client.get("/v1/answer"), 405, "method_not_allowed")
    assert_problem(client.delete("/v1/requests/x"), 405, "method_not_allowed")


class DownStore:
    """A store whose database is unreachable for every call."""

    def __init__(self, inner):
        self.inner = inner

    def __getattr__(self, name):
        if name in ("close",):
            return getattr(self.inner, name)

        def fail(*args, **kwargs):
            raise ConnectionError("could not connect to server: Connection refused")

        return fail

    def append_record(self, record):
        raise ConnectionError("could not connect to server: Connection refused")


def test_a_store_outage_is_json_with_the_security_headers(store):
    down = DownStore(store)
    app = make_app(down, make_pipeline([GOOD_ANSWER]))
    with TestClient(app, raise_server_exceptions=False) as client:
        answered = client.post("/v1/answer", json={"question": "q?"})
        assert answered.status_code == 200 and answered.json()["audit_persisted"] is False
        assert_problem(client.get("/v1/requests/anything"), 503, "store_unavailable")
        ready = client.get("/readyz")
        assert ready.status_code == 503 and ready.json()["ready"] is False
        client.post("/review/signin", data=signin_form(client, reviewer="alice", token=TOKEN))
        queue = client.get("/review")
        assert_problem(queue, 503, "store_unavailable")
        app.state.answerer.close()


def test_readyz_reports_a_working_store(client):
    reply = client.get("/readyz")
    assert reply.status_code == 200
    body = reply.json()
    assert body["ready"] is True
    # the audit writer's own state, as AuditWriter.status() reports it
    assert {k: body["store"][k] for k in ("ready", "backlog", "last_error", "failing")} == {
        "ready": True,
        "backlog": 0,
        "last_error": None,
        "failing": False,
    }


def test_an_unexpected_error_is_a_json_500_with_the_security_headers(store):
    class Broken:
        settings = None
        steps = None

        async def ainvoke(self, data):
            raise RuntimeError("boom")

    app = make_app(store, Broken())
    with TestClient(app, raise_server_exceptions=False) as client:
        reply = client.post("/v1/answer", json={"question": "q?"})
    assert_problem(reply, 500, "pipeline_failed")
    assert "boom" not in reply.text


def _raw(base: str, payload: bytes, timeout: float = 20.0) -> bytes:
    host, port = base.removeprefix("http://").split(":")
    with socket.create_connection((host, int(port)), timeout=timeout) as sock:
        sock.sendall(payload)
        chunks = []
        while True:
            try:
                data = sock.recv(65536)
            except TimeoutError:
                break
            if not data:
                break
            chunks.append(data)
    return b"".join(chunks)


@pytest.mark.integration  # a real uvicorn server on a socket: an integration test
def test_a_body_shorter_than_its_content_length_gets_a_408_not_a_hang(store):
    app = make_app(store, make_pipeline([GOOD_ANSWER]), body_timeout=0.5)
    with running(app) as base:
        head = (
            b"POST /v1/answer HTTP/1.1\r\nHost: 127.0.0.1\r\n"
            b"Content-Type: application/json\r\nContent-Length: 100\r\n\r\n"
        )
        reply = _raw(base, head + b'{"question": "q?"}')
    status_line, _, rest = reply.partition(b"\r\n")
    assert status_line.startswith(b"HTTP/1.1 408"), reply[:200]
    assert b'"error":"request_timeout"' in rest
    assert store.list_requests() == []


def test_readyz_reports_a_failing_store(store):
    """While the audit writer cannot reach the store, readiness says so (503)."""

    class Down:
        def __init__(self, inner):
            self.inner = inner

        def append_record(self, record):
            raise ConnectionError("database down")

        def __getattr__(self, name):
            return getattr(self.inner, name)

    app = make_app(Down(store), make_pipeline([GOOD_ANSWER]))
    with TestClient(app) as client:
        body = client.post("/v1/answer", json={"question": "How long is the warranty?"}).json()
        assert body["audit_persisted"] is True  # journaled beside the store: durable
        reply = client.get("/readyz")
        assert reply.status_code == 503
        assert reply.json()["ready"] is False
        assert reply.json()["store"]["last_error"]


@pytest.mark.parametrize("path", ["/v1/answer", "/v1/answer/stream"])
def test_a_number_with_thousands_of_digits_is_a_400_not_a_500(client, store, path, caplog):
    """Issue 22: Python refuses to convert integers past 4,300 digits; that was a 500 and two
    tracebacks per request."""
    body = b'{"question": "q?", "channel": ' + b"9" * 5000 + b"}"
    with caplog.at_level("WARNING"):
        reply = client.post(path, content=body, headers=JSON)
    assert_problem(reply, 400, "bad_request")
    assert "too many digits" in reply.json()["detail"]
    assert not [r for r in caplog.records if r.exc_info]
    assert store.list_requests() == []


def test_a_huge_id_is_not_echoed_back(client):
    long_id = "x" * 60_000
    reply = client.get(f"/v1/requests/{long_id}")
    assert_problem(reply, 404, "not_found")
    assert len(reply.content) < 1200 and "more characters" in reply.json()["detail"]
    reply = client.post(
        "/v1/answer", json={"question": "q?", "x" * 50_000: 1}
    )  # an unknown field named by a 50 KB key
    assert reply.status_code in (400, 422) and len(reply.content) < 2000
