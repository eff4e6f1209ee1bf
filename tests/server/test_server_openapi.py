"""The API is describable: a complete OpenAPI document, the Response JSON Schema served, CORS by
an exact allow-list, and the stream's retry hint and keep-alive."""

from __future__ import annotations

import fastapi.routing
import pytest

pytest.importorskip("fastapi")
from fastapi.testclient import TestClient
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from hypothesis_budget import examples
from server_fixtures import (
    API_KEY,
    GOOD_ANSWER,
    GOOD_QUESTION,
    TOKEN,
    make_app,
    make_pipeline,
    make_store,
)

from tracerag.contract import response_schema
from tracerag.errors import ConfigurationError
from tracerag.server._error_shape import ERROR_CODES

ORIGIN = "http://127.0.0.1:5173"


@pytest.fixture
def store(tmp_path):
    s = make_store(tmp_path)
    yield s
    s.close()


@pytest.fixture(scope="module")
def doc(tmp_path_factory):
    """The served OpenAPI document, fetched once for the tests that only read it."""
    store = make_store(tmp_path_factory.mktemp("openapi"))
    try:
        with TestClient(make_app(store, make_pipeline([GOOD_ANSWER]))) as client:
            return client.get("/v1/openapi.json").json()
    finally:
        store.close()


def resolve(doc, node):
    while "$ref" in node:
        node = doc["components"]["schemas"][node["$ref"].rsplit("/", 1)[-1]]
    return node


def test_every_json_operation_has_a_request_and_response_schema(doc):
    ops = {(m.upper(), p): op for p, item in doc["paths"].items() for m, op in item.items()}
    assert ("POST", "/v1/answer") in ops and ("GET", "/v1/requests/{request_id}") in ops
    assert not any(p.startswith("/review/items") or p == "/review" for _, p in ops), ops.keys()
    for (method, path), op in ops.items():
        if method == "POST":
            content = op["requestBody"]["content"]
            assert list(content) == ["application/json"], path
            body = resolve(doc, content["application/json"]["schema"])
            # an object, or one object per choice (a verdict, a decision's action)
            for option in [resolve(doc, o) for o in body.get("oneOf", [body])]:
                assert option["properties"], path
        success = next(s for s in ("200", "202") if s in op["responses"])
        ok = op["responses"][success]["content"]
        schema = next(iter(ok.values()))["schema"]
        assert schema != {}, (method, path)
        assert "default" in op["responses"], (method, path)


def test_the_answer_response_is_the_response_schema(doc):
    op = doc["paths"]["/v1/answer"]["post"]
    schema = resolve(doc, op["responses"]["200"]["content"]["application/json"]["schema"])
    shipped = response_schema()
    assert set(schema["properties"]) == set(shipped["properties"])
    assert schema["required"] == shipped["required"]


def test_every_error_response_uses_the_one_error_schema(doc):
    problem = doc["components"]["schemas"]["Problem"]
    assert set(problem["properties"]) == {"error", "detail"}
    seen = 0
    for item in doc["paths"].values():
        for op in item.values():
            for status, response in op["responses"].items():
                if op["operationId"].startswith("readyz") and status == "503":
                    continue  # the readiness report itself
                if status.startswith(("4", "5")) or status == "default":
                    ref = response["content"]["application/json"]["schema"]["$ref"]
                    assert ref.endswith("/Problem"), (status, ref)
                    seen += 1
    assert seen > 15
    assert "HTTPValidationError" not in doc["components"]["schemas"]


def test_the_stream_events_are_a_discriminated_union(doc):
    """Each event type is its own object, told apart by ``event``: not one object with all."""
    for path, method in (
        ("/v1/answer/stream", "post"),
        ("/v1/requests/{request_id}/events", "get"),
    ):
        op = doc["paths"][path][method]
        stream = op["responses"]["200"]["content"]["text/event-stream"]["schema"]
        assert stream == {"$ref": "#/components/schemas/StreamEventSent"}, path
    union = doc["components"]["schemas"]["StreamEvent"]
    assert "properties" not in union and "required" not in union
    assert union["discriminator"]["propertyName"] == "event"
    mapping = union["discriminator"]["mapping"]
    assert set(mapping) == {"stage", "response", "error", "decision"}
    assert sorted(o["$ref"] for o in union["oneOf"]) == sorted(mapping.values())
    data = {}
    for name, ref in mapping.items():
        message = resolve(doc, {"$ref": ref})
        assert message["properties"]["event"]["const"] == name
        assert set(message["required"]) == {"event", "id", "data"}
        data[name] = resolve(doc, message["properties"]["data"])
    # as sent: the same events, each data a line of JSON text of the parsed event's schema
    sent = doc["components"]["schemas"]["StreamEventSent"]["oneOf"]
    assert sorted(o["properties"]["event"]["const"] for o in sent) == sorted(mapping)
    for option in sent:
        wire = option["properties"]["data"]
        assert wire["type"] == "string" and wire["contentMediaType"] == "application/json"
        parsed = resolve(doc, {"$ref": mapping[option["properties"]["event"]["const"]]})
        assert wire["contentSchema"] == parsed["properties"]["data"]
    assert data["stage"]["properties"]["stage"]["enum"] == [
        "register",
        "retrieve",
        "plan",
        "sample",
        "verify",
        "assemble",
    ]
    assert data["response"]["title"] == "Response"
    assert set(data["error"]["properties"]["error"]["enum"]) <= set(ERROR_CODES)
    assert "final_answer" in data["decision"]["properties"]


def test_the_error_codes_are_an_enum_with_duplicate(doc):
    codes = doc["components"]["schemas"]["Problem"]["properties"]["error"]["enum"]
    assert set(codes) == set(ERROR_CODES)
    assert {"duplicate", "idempotency_key_reused", "conflict", "no_registry"} <= set(codes)
    feedback = doc["paths"]["/v1/feedback"]["post"]["responses"]
    assert "409" in feedback


def test_security_schemes_are_declared_and_applied(store):
    with TestClient(make_app(store, make_pipeline([GOOD_ANSWER]), api_key=API_KEY)) as client:
        keyed = client.get("/v1/openapi.json", headers={"X-API-Key": API_KEY}).json()
    schemes = keyed["components"]["securitySchemes"]
    assert schemes["ApiKey"] == {**schemes["ApiKey"], "type": "apiKey", "in": "header"}
    assert schemes["ApiKey"]["name"] == "X-API-Key"
    assert schemes["ReviewerBearer"]["type"] == "http"
    assert schemes["ReviewerBearer"]["scheme"] == "bearer"
    assert schemes["EventsToken"]["in"] == "query"
    ops = {(m, p): op for p, item in keyed["paths"].items() for m, op in item.items()}
    for (_, path), op in ops.items():
        if path == "/v1/requests/{request_id}/events":
            assert op["security"] == [{"ApiKey": []}, {"EventsToken": []}]
        elif path.startswith("/v1/"):
            assert op["security"] == [{"ApiKey": []}], path
        elif path == "/review/api/items/{request_id}/decision":
            assert op["security"] == [{"ReviewerBearer": []}]
        elif path.startswith("/review/api/"):
            assert {"ReviewerBearer": []} in op["security"], path
        else:
            assert "security" not in op, path
    # without a key the /v1 API is open on this server, and the document says so
    with TestClient(make_app(store, make_pipeline([GOOD_ANSWER]))) as client:
        open_doc = client.get("/v1/openapi.json").json()
    assert "security" not in open_doc["paths"]["/v1/answer"]["post"]
    assert "ApiKey" not in open_doc["components"]["securitySchemes"]


def test_the_response_schema_is_served(store):
    with TestClient(make_app(store, make_pipeline([GOOD_ANSWER]))) as client:
        reply = client.get("/v1/schemas/response.json")
    assert reply.status_code == 200
    assert reply.headers["content-type"].startswith("application/schema+json")
    assert reply.json() == response_schema()


def test_cors_allows_listed_origins_only(store):
    app = make_app(store, make_pipeline([GOOD_ANSWER]), cors_origins=[ORIGIN])
    with TestClient(app) as client:
        preflight = client.options(
            "/v1/answer",
            headers={
                "Origin": ORIGIN,
                "Access-Control-Request-Method": "POST",
                "Access-Control-Request-Headers": "content-type,x-api-key",
            },
        )
        assert preflight.status_code == 200
        assert preflight.headers["access-control-allow-origin"] == ORIGIN
        assert "access-control-allow-credentials" not in preflight.headers
        other = client.options(
            "/v1/answer",
            headers={"Origin": "http://evil.example", "Access-Control-Request-Method": "POST"},
        )
        assert other.status_code == 400
        assert "access-control-allow-origin" not in other.headers
        reply = client.post(
            "/v1/answer", json={"question": GOOD_QUESTION}, headers={"Origin": ORIGIN}
        )
        assert reply.headers["access-control-allow-origin"] == ORIGIN
        assert "x-request-id" in reply.headers["access-control-expose-headers"].lower()
        desk = client.options(
            "/review/signin",
            headers={"Origin": ORIGIN, "Access-Control-Request-Method": "POST"},
        )
        assert "access-control-allow-origin" not in desk.headers


def test_without_an_allow_list_there_is_no_cors(store):
    with TestClient(make_app(store, make_pipeline([GOOD_ANSWER]))) as client:
        reply = client.options(
            "/v1/answer", headers={"Origin": ORIGIN, "Access-Control-Request-Method": "POST"}
        )
    assert "access-control-allow-origin" not in reply.headers


@pytest.mark.parametrize(
    "origins", ["*", "https://*.example.com", "example.com", "https://app.example.com/path"]
)
def test_cors_refuses_anything_but_exact_origins(store, origins):
    with pytest.raises(ConfigurationError, match="exact origin"):
        make_app(store, make_pipeline([GOOD_ANSWER]), cors_origins=origins)


def test_cors_origins_from_the_environment(store, monkeypatch):
    monkeypatch.setenv("TRACERAG_CORS_ORIGINS", f"{ORIGIN}, https://app.example.com")
    with TestClient(make_app(store, make_pipeline([GOOD_ANSWER]))) as client:
        reply = client.options(
            "/v1/answer",
            headers={"Origin": "https://app.example.com", "Access-Control-Request-Method": "POST"},
        )
    assert reply.headers["access-control-allow-origin"] == "https://app.example.com"


def test_the_stream_sends_a_retry_hint_and_keep_alive_pings(store, monkeypatch):
    # the keep-alive pings are FastAPI's (EventSourceResponse): its interval, shortened
    monkeypatch.setattr(fastapi.routing, "_PING_INTERVAL", 0.05)
    pipeline = make_pipeline([GOOD_ANSWER], latency=0.3)  # each model call outlasts a ping
    with TestClient(make_app(store, pipeline)) as client:
        text = client.post("/v1/answer/stream", json={"question": GOOD_QUESTION}).text
    blocks = text.strip().split("\n\n")
    assert blocks[0].startswith(": tracerag answer stream") and "retry: 3000" in blocks[0]
    assert ": ping" in blocks
    events = [b.split("\n", 1)[0] for b in blocks if b.startswith("event: ")]
    assert events == ["event: stage"] * 6 + ["event: response"]


# -- the request schemas say what the server accepts ------------------------------------------


@settings(
    max_examples=examples(300),
    deadline=None,
    suppress_health_check=[HealthCheck.function_scoped_fixture],
)
@given(
    question=st.text(max_size=12)
    | st.text(st.characters(categories=["Cc", "Cf", "Co", "Cn", "Zs", "Mn", "Me"]), max_size=6)
    | st.sampled_from(["\u3164", "\u2800 ", "a\x00", "\u200b", "问", " x ", "\U000e0001"])
)
def test_the_documented_question_is_the_accepted_one(doc, question):
    """The question's pattern matches exactly the text the server (and the pipeline) takes."""
    import re

    from tracerag.server._deps import text_problem, visible

    spec = doc["components"]["schemas"]["AnswerRequest"]["properties"]["question"]
    documented = re.fullmatch(spec["pattern"], question) is not None
    accepted = visible(question) and text_problem("question", question) is None
    assert documented == accepted, repr(question)


def test_a_nul_in_the_chat_history_is_documented_as_refused(doc, store):
    """The server refuses a NUL in an earlier message (422): the document says so, as it does
    for the question (a schema-driven fuzzer found the turn's content undocumented)."""
    import re

    content = doc["components"]["schemas"]["ChatTurn"]["properties"]["content"]
    assert re.fullmatch(content["pattern"], "a\x00b") is None
    assert re.fullmatch(content["pattern"], "退货 ok") is not None
    body = {"question": GOOD_QUESTION, "chat_history": [{"role": "user", "content": "a\x00b"}]}
    with TestClient(make_app(store, make_pipeline([GOOD_ANSWER]))) as client:
        reply = client.post("/v1/answer", json=body, headers={"X-API-Key": API_KEY})
    assert reply.status_code == 422, reply.text
    assert reply.json()["error"] == "invalid_input"


def test_the_queues_bounds_are_documented_and_a_huge_offset_is_a_422(doc, tmp_path):
    params = {
        p["name"]: p["schema"] for p in doc["paths"]["/review/api/queue"]["get"]["parameters"]
    }
    assert (params["limit"]["minimum"], params["limit"]["maximum"]) == (1, 1000)
    assert params["offset"]["minimum"] == 0 and params["offset"]["maximum"] == 1_000_000_000
    store = make_store(tmp_path)
    try:
        with TestClient(make_app(store, make_pipeline([GOOD_ANSWER]))) as client:
            bearer = {"Authorization": f"Bearer {TOKEN}"}
            for query in ("offset=851812249183660382617600", "limit=0", "status=open"):
                reply = client.get(f"/review/api/queue?{query}", headers=bearer)
                assert reply.status_code == 422, (query, reply.text)
                assert reply.json()["error"] == "invalid_input"
            assert client.get("/review/api/queue?offset=5", headers=bearer).status_code == 200
    finally:
        store.close()


def test_a_decision_and_a_verdict_are_one_schema_per_choice(doc):
    schemas = doc["components"]["schemas"]
    decision = schemas["DecisionRequest"]["discriminator"]["mapping"]
    assert set(decision) == {"approve", "edit", "reject"}
    edit = schemas["DecisionRequest_edit"]
    assert {"action", "final_answer", "reason"} <= set(edit["required"])
    assert "final_answer" not in schemas["DecisionRequest_approve"]["required"]
    feedback = schemas["FeedbackRequest"]["discriminator"]["mapping"]
    assert set(feedback) == {"confirm", "deny", "clarify"}
    assert "correction" in schemas["FeedbackRequest_clarify"]["required"]
    assert "correction" not in schemas["FeedbackRequest_deny"]["required"]
    response = doc["paths"]["/v1/schemas/response.json"]["get"]["responses"]["200"]
    assert list(response["content"]) == ["application/schema+json"]


@pytest.mark.parametrize(
    "content, accepted", [("我的笔记本还在保修期内吗？", True), ("a\x00b", False)]
)
def test_an_earlier_message_is_documented_as_the_server_takes_it(doc, store, content, accepted):
    """A chat_history message with a NUL is refused (422), and the document says so."""
    import re

    pattern = doc["components"]["schemas"]["ChatTurn"]["properties"]["content"]["pattern"]
    assert (re.fullmatch(pattern, content) is not None) is accepted
    body = {"question": GOOD_QUESTION, "chat_history": [{"role": "user", "content": content}]}
    with TestClient(make_app(store, make_pipeline([GOOD_ANSWER]))) as client:
        reply = client.post("/v1/answer", json=body)
    if accepted:
        assert reply.status_code == 200, reply.text
    else:
        assert reply.status_code == 422
        assert reply.json() == {
            "error": "invalid_input",
            "detail": "chat_history contains a NUL character",
        }
