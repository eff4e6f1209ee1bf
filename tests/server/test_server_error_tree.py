"""A tracerag error no route answers is answered by its place in the tree: a caller's fault a
4xx with the message, a store that cannot be used a 503, the server's own failure a 500 that
names the class only; always in the error shape, with the security headers."""

from __future__ import annotations

import pytest

pytest.importorskip("fastapi")
from fastapi import FastAPI
from fastapi.testclient import TestClient
from server_fixtures import GOOD_ANSWER, make_app, make_pipeline, make_store

from tracerag.errors import (
    AuthenticationError,
    CallError,
    ConfigurationError,
    InputError,
    InputTypeError,
    MissingVersionError,
    PlanError,
    TraceragError,
)
from tracerag.materials import DuplicateFeedback, FeedbackLimited, MaterialNotFound
from tracerag.server._error_shape import (
    ERROR_CODES,
    SECURITY_HEADERS,
    error_statuses,
    install_handlers,
    status_of,
)
from tracerag.store import (
    AlreadyDecided,
    JournalBusy,
    NotQueued,
    RequestNotFound,
    StoreError,
    StoreVanished,
)


def _raising(error: Exception) -> TestClient:
    app = FastAPI()
    install_handlers(app)

    @app.get("/boom")
    async def boom() -> None:
        raise error

    return TestClient(app, raise_server_exceptions=False)


def test_every_mapped_class_is_a_tree_class_with_a_known_code():
    for cls, (status, code) in error_statuses().items():
        assert issubclass(cls, TraceragError)
        assert code in ERROR_CODES and 400 <= status < 600


@pytest.mark.parametrize(
    ("error", "status", "code"),
    [
        (InputError("the question is empty"), 422, "invalid_input"),
        (InputTypeError("text must be str, not int"), 422, "invalid_input"),
        (AuthenticationError("the token belongs to no one"), 401, "unauthorized"),
        (RequestNotFound("r-1"), 404, "not_found"),
        (NotQueued("r-1"), 404, "not_found"),
        (MaterialNotFound("m-1"), 404, "not_found"),
        (AlreadyDecided("r-1", "ana", "approve"), 409, "conflict"),
        (DuplicateFeedback("one verdict each"), 409, "duplicate"),
    ],
)
def test_a_callers_fault_is_a_4xx_with_its_message(error, status, code):
    with _raising(error) as client:
        reply = client.get("/boom")
    assert reply.status_code == status and reply.json() == {"error": code, "detail": str(error)}


def test_a_feedback_limit_says_when_to_try_again():
    with _raising(FeedbackLimited("10 verdicts an hour", retry_after=41.2)) as client:
        reply = client.get("/boom")
    assert reply.status_code == 429 and reply.json()["error"] == "too_many_requests"
    assert reply.headers["retry-after"] == "42"


@pytest.mark.parametrize(
    ("error", "status", "code"),
    [
        (StoreVanished("/srv/audit.sqlite was replaced"), 503, "store_unavailable"),
        (JournalBusy("the journal /srv/j is in use"), 503, "store_unavailable"),
        (StoreError("postgres said no"), 503, "store_unavailable"),
        (ConfigurationError("TRACERAG_SECRET is 3 characters"), 500, "internal_error"),
        (MissingVersionError("no prompt version"), 500, "internal_error"),
        (CallError("the model failed"), 500, "pipeline_failed"),
        (PlanError("plan is not JSON"), 500, "pipeline_failed"),
        (TraceragError("something of tracerag's own"), 500, "internal_error"),
    ],
)
def test_the_servers_own_failure_names_the_class_not_the_message(error, status, code, caplog):
    with _raising(error) as client:
        reply = client.get("/boom")
    assert reply.status_code == status
    assert reply.json() == {"error": code, "detail": type(error).__name__}
    assert str(error) not in reply.text  # paths, settings: for the log, not the caller
    assert str(error) in caplog.text


def test_the_most_specific_class_decides():
    class Custom(RequestNotFound):
        pass

    assert status_of(Custom("r")) == (404, "not_found")
    assert status_of(JournalBusy("x")) == status_of(StoreError("x")) == (503, "store_unavailable")


def test_a_store_error_behind_a_route_is_a_503_not_a_500(tmp_path, monkeypatch):
    store = make_store(tmp_path)
    app = make_app(store, make_pipeline([GOOD_ANSWER]))
    try:
        with TestClient(app, raise_server_exceptions=False) as client:
            answered = client.post("/v1/answer", json={"question": "How long do refunds take?"})
            rid = answered.json()["request_id"]

            def vanished(request_id: str) -> None:
                raise StoreVanished(f"{tmp_path}/audit.sqlite was replaced while open")

            monkeypatch.setattr(store, "get", vanished)
            reply = client.get(f"/v1/requests/{rid}")
    finally:
        store.close()
    assert reply.status_code == 503
    assert reply.json() == {"error": "store_unavailable", "detail": "StoreVanished"}
    assert str(tmp_path) not in reply.text
    for name, value in SECURITY_HEADERS.items():
        assert reply.headers[name] == value
