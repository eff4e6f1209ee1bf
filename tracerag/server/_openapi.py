"""The server's OpenAPI document as the server behaves: the error shape on every operation,
the security each route takes, the request schemas as the server checks them (beyond
pydantic), and the streams' events as sent (``StreamEventSent``).

``App`` is the FastAPI app whose ``openapi()`` is this document.
"""

from __future__ import annotations

import functools
import sys
from typing import Any

from fastapi import FastAPI
from fastapi.openapi.utils import get_openapi
from pydantic import BaseModel, TypeAdapter
from pydantic.json_schema import JsonSchemaMode

from tracerag.server._auth import COOKIE_NAME
from tracerag.server._bodies import (
    STREAM_EVENT_MODELS,
    AnswerRequest,
    DecisionRequest,
    EventsTicket,
    FeedbackRequest,
    StreamEvent,
)
from tracerag.server._deps import Services
from tracerag.server._error_shape import Problem
from tracerag.text._unicode import is_invisible

SECURITY_SCHEMES: dict[str, dict[str, Any]] = {
    "ApiKey": {
        "type": "apiKey",
        "in": "header",
        "name": "X-API-Key",
        "description": "The frontend API key (TRACERAG_API_KEY); keep it on your backend.",
    },
    "EventsToken": {
        "type": "apiKey",
        "in": "query",
        "name": "token",
        "description": "The token of an events URL (from POST /v1/requests): reads the "
        "events of that one request until it expires.",
    },
    "ReviewerBearer": {
        "type": "http",
        "scheme": "bearer",
        "description": "A reviewer token (TRACERAG_REVIEWER_TOKEN or a named token of the "
        "reviewers file).",
    },
    "ReviewerSession": {
        "type": "apiKey",
        "in": "cookie",
        "name": COOKIE_NAME,
        "description": "The desk's sign-in session.",
    },
}


def _security(path: str, method: str, svc: Services) -> list[dict[str, list[str]]] | None:
    """Who may call an operation on this server, as OpenAPI security requirements."""
    if path.startswith("/v1/"):
        if svc.api_key is None:
            return None  # the API is open on this server
        if path.endswith("/events") and method == "get":
            return [{"ApiKey": []}, {"EventsToken": []}]
        return [{"ApiKey": []}]
    if path.startswith("/review/api/"):
        if method == "get":
            return [{"ReviewerBearer": []}, {"ReviewerSession": []}]
        return [{"ReviewerBearer": []}]
    return None


class App(FastAPI):
    """The server's app: its OpenAPI document declares the error shape, the security schemes
    and the stream's events (``_openapi``)."""

    def openapi(self) -> dict[str, Any]:
        return openapi_document(self)


def openapi_document(app: FastAPI) -> dict[str, Any]:
    if app.openapi_schema:
        return app.openapi_schema
    svc: Services = app.state.services
    schema = get_openapi(
        title=app.title,
        version=app.version,
        summary=app.summary,
        description=app.description,
        routes=app.routes,
    )
    components = schema.setdefault("components", {}).setdefault("schemas", {})
    ref = "#/components/schemas/{model}"
    models: tuple[tuple[type[BaseModel], JsonSchemaMode], ...] = (
        (AnswerRequest, "validation"),
        (DecisionRequest, "validation"),
        (FeedbackRequest, "validation"),
        (EventsTicket, "serialization"),
    )
    for model, mode in models:
        full = model.model_json_schema(ref_template=ref, mode=mode)
        for name, sub in full.pop("$defs", {}).items():
            components.setdefault(name, sub)
        components[model.__name__] = full
    union = TypeAdapter(StreamEvent).json_schema(ref_template=ref, mode="serialization")
    for name, sub in union.pop("$defs", {}).items():
        components.setdefault(name, sub)
    components["StreamEvent"] = {
        "title": "StreamEvent",
        "description": "One event of an answer stream, told apart by `event` (the SSE "
        "`event:` field); `data` is the event's line of JSON, `id` its `id:` field.",
        **union,
    }
    _as_accepted(components, svc)
    _events_as_sent(components)
    _streams_as_sent(schema)
    # every error is JSON in the one error shape, whatever the route's success media type
    problem_ref = {"$ref": "#/components/schemas/Problem"}
    components["Problem"] = Problem.model_json_schema()
    schemes: set[str] = set()
    for path, item in schema.get("paths", {}).items():
        for method, op in item.items():
            responses = op.setdefault("responses", {})
            responses.setdefault("default", {"description": "an error"})
            for status, response in responses.items():
                if status.startswith(("4", "5")) or status == "default":
                    if path_is_readiness(op) and status == "503":
                        continue
                    response["content"] = {"application/json": {"schema": problem_ref}}
            security = _security(path, method, svc)
            if security:
                op["security"] = security
                schemes.update(name for option in security for name in option)
    if schemes:
        schema["components"]["securitySchemes"] = {
            name: SECURITY_SCHEMES[name] for name in sorted(schemes)
        }
    app.openapi_schema = schema
    return schema


@functools.cache
def _not_visible() -> str:
    """A regex class of the characters a question cannot be made of alone (what
    ``tracerag.text.is_invisible`` counts as showing nothing: whitespace, control, format,
    private-use, unassigned and combining characters, blank fillers), listed from the Unicode
    database this Python has."""
    ranges: list[tuple[int, int]] = []
    for code in range(sys.maxunicode + 1):
        if 0xD800 <= code <= 0xDFFF or not is_invisible(chr(code)):
            continue
        if ranges and ranges[-1][1] == code - 1:
            ranges[-1] = (ranges[-1][0], code)
        else:
            ranges.append((code, code))

    def char(code: int) -> str:
        return f"\\u{code:04x}" if code <= 0xFFFF else chr(code)

    return "".join(char(a) if a == b else f"{char(a)}-{char(b)}" for a, b in ranges)


#: no NUL (``text_problem``): every text field of a request body
NO_NUL = "^[^\\u0000]*$"


def _as_accepted(components: dict[str, Any], svc: Services) -> None:
    """Say in the request schemas what the server checks beyond pydantic: a question with a
    visible character and at most the pipeline's length, no NUL in any text, the shared
    reviewer's name, and the fields a choice needs (``clarify`` its correction, ``edit`` its
    final answer, ``edit`` and ``reject`` a reason) as one schema per choice."""
    answer = components["AnswerRequest"]["properties"]
    answer["question"].update(
        minLength=1,
        maxLength=svc.answerer.max_question_chars,
        pattern=f"^[^\\u0000]*[^{_not_visible()}][^\\u0000]*$",
    )
    for name in ("session_id", "user_id", "channel"):
        for option in answer[name].get("anyOf", [answer[name]]):
            if option.get("type") == "string":
                option["pattern"] = NO_NUL
    if "ChatTurn" in components:  # an earlier message is refused with a NUL, as the question
        components["ChatTurn"]["properties"]["content"]["pattern"] = NO_NUL

    visible_text = {
        "type": "string",
        "minLength": 1,
        "pattern": "^[^\\u0000]*[^\\s\\u0000][^\\u0000]*$",
    }

    def union(model: str, field: str, required: dict[str, list[str]]) -> dict[str, Any]:
        """The model as one component per choice of ``field`` (``<Model>_<choice>``), told
        apart by that field."""
        base = components[model]
        mapping = {}
        for variant in variants(model, field, required):
            choice = variant["properties"][field]["const"]
            name = f"{model}_{choice}"
            components[name] = variant
            mapping[choice] = f"#/components/schemas/{name}"
        return {
            "title": model,
            "description": base.get("description", ""),
            "discriminator": {"propertyName": field, "mapping": mapping},
            "oneOf": [{"$ref": ref} for ref in mapping.values()],
        }

    def variants(model: str, field: str, required: dict[str, list[str]]) -> list[dict[str, Any]]:
        base = components[model]
        out = []
        for choice, needs in required.items():
            properties = dict(base["properties"])
            properties[field] = {"const": choice, "type": "string"}
            for name in needs:
                limit = next((o.get("maxLength") for o in properties[name].get("anyOf", [])), None)
                properties[name] = {**visible_text, **({"maxLength": limit} if limit else {})}
            out.append(
                {
                    **{k: v for k, v in base.items() if k not in ("properties", "required")},
                    "title": f"{model} ({choice})",
                    "properties": properties,
                    "required": sorted({*base.get("required", []), field, *needs}),
                }
            )
        return out

    decision = components["DecisionRequest"]
    reviewer = decision["properties"]["reviewer"]
    for option in reviewer.get("anyOf", [reviewer]):
        if option.get("type") == "string":
            option["pattern"] = "^[\\w .@+\\-]*[\\w.@+\\-][\\w .@+\\-]*$"
            option["maxLength"] = 64
    for field in ("final_answer", "reason"):
        for option in decision["properties"][field].get("anyOf", []):
            if option.get("type") == "string":
                option["pattern"] = NO_NUL
    components["DecisionRequest"] = union(
        "DecisionRequest",
        "action",
        {"approve": [], "edit": ["final_answer", "reason"], "reject": ["reason"]},
    )
    feedback = components["FeedbackRequest"]
    for field in ("request_id", "comment", "correction", "user_token", "user"):
        prop = feedback["properties"][field]
        for option in prop.get("anyOf", [prop]):
            if option.get("type") == "string":
                option["pattern"] = NO_NUL
    components["FeedbackRequest"] = union(
        "FeedbackRequest", "verdict", {"confirm": [], "deny": [], "clarify": ["correction"]}
    )


def _streams_as_sent(schema: dict[str, Any]) -> None:
    """A stream's ``text/event-stream`` content says its events as sent (``StreamEventSent``,
    declared by each route), not FastAPI's generic ``itemSchema`` of any SSE event."""
    for path in schema.get("paths", {}).values():
        for op in path.values():
            for reply in op.get("responses", {}).values():
                reply.get("content", {}).get("text/event-stream", {}).pop("itemSchema", None)


def _events_as_sent(components: dict[str, Any]) -> None:
    """The stream's events as sent (``StreamEventSent``, the ``text/event-stream`` schema):
    ``data`` is a line of JSON text on the wire (the SSE ``data:`` field), declared as that
    string with its content's schema beside it (``contentSchema``). ``StreamEvent`` stays the
    same union once ``data`` is parsed, the type a client's ``JSON.parse`` gives."""
    variants = []
    for model in STREAM_EVENT_MODELS:
        parsed = components[model.__name__]
        properties = dict(parsed["properties"])
        properties["data"] = {
            "type": "string",
            "description": "The event's data: one line of JSON text, of this schema.",
            "contentMediaType": "application/json",
            "contentSchema": parsed["properties"]["data"],
        }
        variants.append(
            {
                "title": f"{parsed['title']} (as sent)",
                "type": "object",
                "properties": properties,
                "required": parsed["required"],
            }
        )
    components["StreamEventSent"] = {
        "title": "StreamEventSent",
        "description": "One event of an answer stream as the wire carries it: `event`, `id` "
        "and `data` (a line of JSON text) are its SSE fields. Parsed, it is a `StreamEvent`.",
        "oneOf": variants,
    }


def path_is_readiness(op: dict[str, Any]) -> bool:
    """True for ``/readyz``, whose 503 carries the readiness report, not an error."""
    return str(op.get("operationId", "")).startswith("readyz")


__all__ = ["App", "openapi_document", "path_is_readiness"]
