"""The OpenAPI document is the server: schemathesis fuzzes every documented operation of a real
server on 127.0.0.1, from the document that server serves, and finds nothing — no 5xx, every
response matching its documented status, schema, headers and content type (the stream's events
as sent: a line of JSON text each), and every request the document allows accepted (no 4xx
for schema-valid data but the documented 401/403/404/409/429 of state and credentials).

Bounded: each operation draws ``examples(30)`` requests (a quarter of that in the fast
profile), with a deadline per operation; the whole run stays under two minutes on two cores.
"""

from __future__ import annotations

import time
import uuid
from collections.abc import Iterator
from typing import Any

import pytest

pytest.importorskip("fastapi")
import schemathesis
from hypothesis import HealthCheck, Phase, given, settings
from hypothesis_budget import examples
from schemathesis.checks import ignored_auth
from server_fixtures import (
    API_KEY,
    EVIL_ANSWER,
    GOOD_ANSWER,
    TOKEN,
    make_app,
    make_pipeline,
    make_store,
    running,
)

pytestmark = pytest.mark.integration

FEEDBACK_KEY = "feedback-key-for-the-fuzz-0123456789abcdef"
CREDENTIALS = {"X-API-Key": API_KEY, "Authorization": f"Bearer {TOKEN}"}
#: the wall-clock time one operation may take at most (its examples stop being drawn after)
SECONDS_PER_OPERATION = 8.0


@pytest.fixture(scope="module")
def served(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    """A real server on 127.0.0.1: the API key, the desk with the shared reviewer token, user
    tokens for feedback, over a scripted one-sample pipeline (fast, and some answers escalate,
    so the queue and the desk API have items)."""
    store = make_store(tmp_path_factory.mktemp("fuzz"))
    app = make_app(
        store,
        make_pipeline([GOOD_ANSWER, EVIL_ANSWER], n_samples=1),
        api_key=API_KEY,
        feedback_key=FEEDBACK_KEY,
    )
    try:
        with running(app) as base:
            yield base
    finally:
        store.close()


@pytest.fixture(scope="module")
def api_schema(served: str) -> Any:
    loaded = schemathesis.openapi.from_url(f"{served}/v1/openapi.json")
    loaded.config.generation.update(modes=[schemathesis.GenerationMode.POSITIVE])
    return loaded


def fuzz(operation: Any, budget: float) -> list[str]:
    """Draw ``examples(30)`` requests of one operation (while ``budget`` seconds last), send
    each to the server and check its response; the failures, one line each."""
    failures: list[str] = []
    deadline = time.monotonic() + budget

    @settings(
        max_examples=examples(30),
        deadline=None,
        phases=[Phase.explicit, Phase.generate],
        suppress_health_check=list(HealthCheck),
        database=None,
    )
    @given(operation.as_strategy())
    def send(case: Any) -> None:
        if time.monotonic() > deadline:
            return  # this operation's time is spent: the requests sent so far are its run
        headers = dict(case.headers or {})
        if "Idempotency-Key" in headers:
            # a key names one question: the same key drawn again for another one is refused
            # by design (422 idempotency_key_reused, tested on its own); each draw its own key
            key = str(headers["Idempotency-Key"]) + uuid.uuid4().hex
            headers["Idempotency-Key"] = key[-255:]
        case.headers = headers
        try:
            # the server's own credentials (their refusal has its own tests): the check that
            # generated credentials are refused does not apply to requests sent with these
            case.call_and_validate(headers=CREDENTIALS, excluded_checks=[ignored_auth], timeout=30)
        except BaseException as exc:  # a FailureGroup of every check that failed
            failures.append(" | ".join(str(exc).split("\n"))[:1500])

    send()
    return failures


# schemathesis's strategies draw from the `random` module, which Hypothesis warns about
@pytest.mark.filterwarnings("ignore::hypothesis.errors.HypothesisDeprecationWarning")
def test_the_server_is_its_openapi_document(api_schema: Any) -> None:
    found: dict[str, list[str]] = {}
    for result in api_schema.get_all_operations():
        operation = result.ok()
        failures = fuzz(operation, SECONDS_PER_OPERATION)
        if failures:
            found[operation.label] = sorted(set(failures))[:3]
    assert found == {}, "\n".join(f"{k}:\n  " + "\n  ".join(v) for k, v in found.items())


def test_the_fuzz_covers_every_documented_operation(api_schema: Any) -> None:
    documented = {
        (method.upper(), path)
        for path, item in api_schema.raw_schema["paths"].items()
        for method in item
        if method in ("get", "post", "put", "patch", "delete")
    }
    fuzzed = {
        (result.ok().method.upper(), result.ok().path) for result in api_schema.get_all_operations()
    }
    assert documented == fuzzed
    assert len(documented) >= 14
