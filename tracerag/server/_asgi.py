"""The tracerag HTTP server: an answer API for frontends and a review desk for people.

Frontends (``X-API-Key`` when ``TRACERAG_API_KEY`` is set; bodies ``application/json`` only):

- ``POST /v1/answer`` — ``{"question", "session_id"?, "user_id"?, "channel"?}`` → the caller
  view of the Response (an escalated answer's text appears nowhere in it);
- ``POST /v1/answer/stream`` — the same as Server-Sent Events: one ``stage`` event per stage,
  then one ``response`` event (or ``error``), with ``retry:`` and keep-alive comments; with
  ``?until=decision`` also the reviewer's ``decision``;
- ``POST /v1/requests`` — start a request; its ``events_url`` is the same stream for a
  browser's ``EventSource`` (``GET /v1/requests/{id}/events``, see ``routes/events.py``);
- ``Idempotency-Key`` on the POSTs and ``Last-Event-ID`` on reconnect resume the same request
  instead of asking again (``tracerag.server._runs``);
- ``GET /v1/requests/{id}`` — the outcome: state, decision and the answer the caller may show;
- ``GET /v1/client/tracerag-stream.js`` — a small fetch-stream helper that resumes drops;
- ``GET /v1/openapi.json`` and ``GET /v1/schemas/response.json`` — the API and the Response
  JSON Schema; ``GET /healthz`` and ``GET /readyz`` (the store's state).

Browsers on other origins may call ``/v1`` when their origin is on the CORS allow-list
(``cors_origins=`` / ``TRACERAG_CORS_ORIGINS``; exact origins only).

Reviewers (see ``tracerag.server.auth``) use ``/review``: the queue (counts, filters, pages),
one item (question, answers, signals with the ones that routed it marked, each claim beside its
cited material, the retrieved materials nobody cited, a trace link) and the decision, which is
stored, audited and delivered (``tracerag.server.delivery``); per queue, a rubric and several
reviewers per item, comments, assignment, skipping and the labelled export. Desk sessions,
claims and the sign-in lockout live in the store's database, so several server processes on
one store are interchangeable. ``/review/api/...`` is the same
for programs, including a request's full trail. Without reviewer credentials the app refuses to
build the review desk.

Every served request is written to the app's audit store before its answer goes out; the
pipeline's own audit sink is bypassed so nothing is written twice. Every error is JSON
``{"error", "detail"}`` (see ``tracerag.server.errors``); every page carries a strict
Content-Security-Policy (no scripts at all).
"""

from __future__ import annotations

import asyncio
import functools
import logging
import os
import sys
from collections.abc import AsyncIterator, Iterable, Mapping
from contextlib import asynccontextmanager
from importlib import resources
from typing import TYPE_CHECKING, Any, Literal

from fastapi import FastAPI
from fastapi.openapi.utils import get_openapi
from fastapi.responses import JSONResponse, RedirectResponse, Response
from pydantic import BaseModel, TypeAdapter
from pydantic.json_schema import JsonSchemaMode
from starlette.middleware.body_limit import RequestBodyLimitMiddleware

from tracerag.config import get_config
from tracerag.errors import ConfigurationError, TraceragError
from tracerag.server._answerer import Answerer, DemoOptions, demo_pipeline
from tracerag.server._auth import (
    COOKIE_NAME,
    GENERATE_HINT,
    MIN_TOKEN_CHARS,
    REVIEWER_TOKEN_ENV,
    REVIEWERS_FILE_ENV,
    SESSION_SECONDS,
    ReviewerAuth,
    read_reviewers_file,
    token_problem,
)
from tracerag.server._bodies import (
    AnswerRequest,
    DecisionRequest,
    EventsTicket,
    FeedbackRequest,
    StreamEvent,
)
from tracerag.server._delivery import DecisionHook, Delivery
from tracerag.server._deps import Services, SignInRequired
from tracerag.server._desk_config import DeskConfig
from tracerag.server._error_shape import Problem, install_handlers
from tracerag.server._materials import usage_recorder
from tracerag.server._middleware import ApiCors, DeclaredBodyLimit, SecurityHeaders
from tracerag.server._review_claims import (
    CLAIM_SECONDS,
    ClaimBoard,
    SharedClaimBoard,
    SharedSkips,
    Skips,
)
from tracerag.server._runs import DEFAULT_MAX_RUNS, DEFAULT_TTL, DecisionWatch, RunBook
from tracerag.server._tokens import DEFAULT_TOKEN_SECONDS, StreamTokens
from tracerag.store._base import AuditStore, StoreError

if TYPE_CHECKING:
    import jinja2
    from langchain_core.runnables import Runnable

    from tracerag.contract import Response as RAGResponse
    from tracerag.materials import FeedbackLimits, MaterialRegistry, UserTokens

logger = logging.getLogger("tracerag.server")

__all__ = ["create_app", "demo_pipeline"]

MAX_BODY_BYTES = 64 * 1024
CORS_ENV = "TRACERAG_CORS_ORIGINS"
TRACE_UI_ENV = "TRACERAG_TRACE_UI"  # "jaeger", "tempo" or "phoenix", optionally "=BASE_URL"


def cors_origins_from(value: str | Iterable[str] | None) -> list[str]:
    """Exact origins (``scheme://host[:port]``) from a list or a comma-separated string."""
    if value is None:
        value = get_config().cors_origins or ""
    items = value.split(",") if isinstance(value, str) else list(value)
    out = []
    for raw in items:
        origin = raw.strip().rstrip("/")
        if not origin:
            continue
        scheme, sep, rest = origin.partition("://")
        if (
            origin == "*"
            or "*" in origin
            or not sep
            or scheme not in ("http", "https")
            or not rest
            or "/" in rest
        ):
            raise ConfigurationError(
                f"CORS origin {raw!r} is not an exact origin like https://app.example.com "
                "(no wildcard, no path)"
            )
        out.append(origin)
    return out


def trace_ui_from(value: str | None) -> tuple[str, str | None] | None:
    """``("jaeger", None)`` from ``jaeger``, ``("tempo", url)`` from ``tempo=url``."""
    value = (value if value is not None else get_config().trace_ui or "").strip()
    if not value:
        return None
    backend, _, base = value.partition("=")
    backend = backend.strip().lower()
    if backend not in ("jaeger", "tempo", "phoenix"):
        raise ConfigurationError(f"trace UI must be jaeger, tempo or phoenix, not {backend!r}")
    return backend, base.strip() or None


_templates: jinja2.Environment | None = None


def _template_env() -> jinja2.Environment:
    """The review desk's templates, compiled once per process and shared by every app."""
    global _templates
    if _templates is None:
        import jinja2

        _templates = jinja2.Environment(
            loader=jinja2.PackageLoader("tracerag.server", "templates"),
            autoescape=True,
            undefined=jinja2.ChainableUndefined,
        )
    return _templates


def _reviewer_auth(
    token: str, reviewers: Mapping[str, str] | str | None, session_seconds: int
) -> ReviewerAuth | None:
    if reviewers is None:
        reviewers = get_config().reviewers_file
    named: Mapping[str, str] = {}
    if isinstance(reviewers, str):
        try:
            named = read_reviewers_file(reviewers)
        except (OSError, ValueError) as exc:
            raise ConfigurationError(f"reviewers file: {exc}") from exc
    elif reviewers:
        named = dict(reviewers)
    if not token and not named:
        return None
    if token:
        problem_ = token_problem(token)
        if problem_:
            raise ConfigurationError(f"the reviewer token is too weak: {problem_}; {GENERATE_HINT}")
    secret = get_config().session_secret
    return ReviewerAuth(token or None, named, session_seconds, secret=secret)


def _desk_config(value: DeskConfig | Mapping[str, Any] | str | None) -> DeskConfig:
    if isinstance(value, DeskConfig):
        return value
    if value is None:
        value = get_config().desk_config
        if value is None:
            return DeskConfig()
    if isinstance(value, str):
        return DeskConfig.from_file(value)
    return DeskConfig.from_mapping(value)


def _shared_desk_state(svc: Services, store: AuditStore) -> None:
    """Keep desk sessions, claims, skips and the sign-in lockout in the store's database, so
    every server process on the store shares them (in this process when it has none)."""
    from tracerag.server._auth import SharedSessions, SharedThrottle
    from tracerag.server._desk_db import desk_db_like

    assert svc.auth is not None and svc.claims is not None
    try:
        db = desk_db_like(store)
    except (StoreError, TraceragError) as exc:
        raise ConfigurationError(
            f"the review desk cannot keep its state in the store: {exc}"
        ) from exc
    if db is None:
        logger.info(
            "desk sessions, claims and sign-in lockouts are kept in this process: the store "
            "has no database another process could share"
        )
        return
    svc.desk_db = db
    old = svc.auth.throttle
    svc.auth.throttle = SharedThrottle(db, old.free, old.window, old.base, old.cap)
    svc.auth.sessions = SharedSessions(db)
    svc.claims = SharedClaimBoard(db, svc.claims.seconds)
    svc.skips = SharedSkips(db)


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


class _App(FastAPI):
    """The server's app: its OpenAPI document declares the error shape, the security schemes
    and the stream's events (``_openapi``)."""

    def openapi(self) -> dict[str, Any]:
        return _openapi(self)


def _openapi(app: FastAPI) -> dict[str, Any]:
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
    from tracerag.text._unicode import is_invisible

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


def _events_as_sent(components: dict[str, Any]) -> None:
    """The stream's events as sent (``StreamEventSent``, the ``text/event-stream`` schema):
    ``data`` is a line of JSON text on the wire (the SSE ``data:`` field), declared as that
    string with its content's schema beside it (``contentSchema``). ``StreamEvent`` stays the
    same union once ``data`` is parsed, the type a client's ``JSON.parse`` gives."""
    from tracerag.server._bodies import STREAM_EVENT_MODELS

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


def _open_runs(svc: Services) -> None:
    """Open the answer-run table beside the store, so replicas share streams and keys (a store
    without a database of its own keeps them in this process, and says so)."""
    from tracerag.server._run_table import open_run_table

    assert svc.runs is not None and svc.decisions is not None
    try:
        table = open_run_table(svc.store)
    except Exception as exc:
        logger.warning(
            "no answer-run table beside this store (%s: %s): streams resume and "
            "Idempotency-Keys hold on this process only",
            type(exc).__name__,
            exc,
        )
        return
    if table is None:
        logger.info("this store keeps no answer runs: streams resume on this process only")
        return
    svc.runs.table = table
    svc.decisions.table = table


def path_is_readiness(op: dict[str, Any]) -> bool:
    """True for ``/readyz``, whose 503 carries the readiness report, not an error."""
    return str(op.get("operationId", "")).startswith("readyz")


def _feedback_tokens(key: str | None) -> UserTokens | None:
    """The signed user tokens of ``POST /v1/feedback`` (None: no key, no end-user verdicts)."""
    from tracerag.materials import UserTokens

    value = (key if key is not None else get_config().feedback_key or "").strip()
    if not value:
        return None
    try:
        return UserTokens(value)
    except ValueError as exc:
        raise ConfigurationError(f"TRACERAG_FEEDBACK_KEY: {exc}; {GENERATE_HINT}") from exc


def _default_limits() -> FeedbackLimits:
    from tracerag.materials import FeedbackLimits

    return FeedbackLimits()


def _registry_for(store: AuditStore) -> MaterialRegistry | None:
    """The material registry beside the store, or None when the store cannot hold one (the
    demo pipeline then retrieves without it, and the desk says so)."""
    from tracerag.materials import MaterialRegistry

    try:
        return MaterialRegistry(store)
    except Exception as exc:
        logger.warning(
            "no material registry beside this store (%s: %s): the served retrieval does not "
            "withhold quarantined materials",
            type(exc).__name__,
            exc,
        )
        return None


def _open_materials(svc: Services) -> None:
    """Open the material registry beside the store, so its figures are reported from the start
    (a store that cannot hold one, e.g. ``:memory:``, serves without it)."""
    try:
        svc.materials()
    except Exception as exc:
        logger.info("no material registry beside this store: %s: %s", type(exc).__name__, exc)


def _journal_for(
    store: AuditStore, journal: str | os.PathLike[str] | Literal[False] | None
) -> str | None:
    """The audit journal's directory for the server's store (None: no journal)."""
    from tracerag.store._open import journal_dir_for

    if journal is False:
        return None
    if journal is not None and str(journal).strip():
        return str(journal)
    path = getattr(store, "path", None)
    found = journal_dir_for(path) if isinstance(path, str) else get_config().audit_journal
    if found is None and getattr(store, "networked", False) is True:
        where = getattr(store, "location", "")
        where = where if isinstance(where, str) else ""
        raise ConfigurationError(
            f"the audit store{' ' + where if where else ''} can be down while the server runs, "
            "and then only a local "
            "journal keeps the records of the answers given meanwhile (and across a crash): set "
            "TRACERAG_AUDIT_JOURNAL to a directory on a persistent local disk (tracerag serve "
            "--journal DIR), or run without one on purpose (journal=False, tracerag serve "
            "--no-journal: answers then say audit_persisted: false while the store is down, and "
            "their records are lost if the process dies)"
        )
    return found


def _served(pipeline: Any) -> Any:
    """A ``create_agent`` app with ``TraceragMiddleware`` as the server runs it; anything else
    as it is."""
    from tracerag._runnable import StagedRunnable

    if isinstance(pipeline, StagedRunnable) or not hasattr(pipeline, "nodes"):
        return pipeline
    try:
        from tracerag.middleware._served import served_agent
    except ImportError:  # LangChain's agents are not installed: it cannot be one
        return pipeline
    return served_agent(pipeline) or pipeline


def create_app(
    pipeline: Runnable[Any, RAGResponse] | None = None,
    store: AuditStore | str | None = None,
    reviewer_token: str | None = None,
    api_key: str | None = None,
    *,
    review_desk: bool = True,
    reviewers: Mapping[str, str] | str | None = None,
    on_decision: DecisionHook | str | Delivery | None = None,
    max_body_bytes: int = MAX_BODY_BYTES,
    model: str = "extractive",
    secure_cookies: bool = False,
    session_seconds: int = SESSION_SECONDS,
    cors_origins: str | Iterable[str] | None = None,
    trace_ui: str | None = None,
    claim_seconds: float = CLAIM_SECONDS,
    body_timeout: float = 10.0,
    commit_wait: float | None = None,
    journal: str | os.PathLike[str] | Literal[False] | None = None,
    replay_seconds: float = DEFAULT_TTL,
    max_runs: int = DEFAULT_MAX_RUNS,
    events_token_seconds: float = DEFAULT_TOKEN_SECONDS,
    feedback_key: str | None = None,
    feedback_limits: FeedbackLimits | None = None,
    demo_options: DemoOptions | None = None,
    desk_config: DeskConfig | Mapping[str, Any] | str | None = None,
) -> FastAPI:
    """The server app.

    ``pipeline``: a ``RAGPipeline`` or ``wrap()``-ed chain (default: the demo knowledge base with
    the offline ``model``). ``store``: an ``AuditStore`` or a store URL/path (default:
    ``TRACERAG_STORE``, else ``./.tracerag/audit.sqlite``). The review desk needs
    ``reviewer_token`` (a shared token, default env ``TRACERAG_REVIEWER_TOKEN``) or
    ``reviewers`` (``{name: "sha256:<hex>"}`` or the path of a reviewers file, default env
    ``TRACERAG_REVIEWERS_FILE``); ``review_desk=False`` serves the answer API alone.
    ``api_key`` (default env ``TRACERAG_API_KEY``) guards ``/v1``. ``cors_origins`` (default env
    ``TRACERAG_CORS_ORIGINS``, comma-separated) lists the exact origins whose pages may call
    ``/v1``. ``on_decision``: a callable or webhook URL (or a configured ``Delivery``) told of
    every review decision (default env ``TRACERAG_DECISION_WEBHOOK``). ``trace_ui``
    (``jaeger``, ``tempo`` or ``phoenix``, optionally ``=BASE_URL``; env ``TRACERAG_TRACE_UI``)
    links items to their trace. ``commit_wait``: the longest an answer waits for its record's
    store commit before the record goes to the journal (default env
    ``TRACERAG_AUDIT_COMMIT_WAIT``, else 1 s). ``journal``: the audit journal's directory
    (default env ``TRACERAG_AUDIT_JOURNAL``, else beside a SQLite store); a store that can be
    down while the server runs (PostgreSQL) needs one — without it the app refuses to build —
    unless ``journal=False`` says to run without (answers then say ``audit_persisted: false``
    while the store is down, and those records are lost if the process dies).
    ``replay_seconds``: how long a request's events are kept for reconnects and its
    ``Idempotency-Key`` honoured (default 600); at most
    ``max_runs`` finished requests are kept in memory (default 1000), all of them in the
    ``answer_runs`` table beside the store. ``events_token_seconds``: how long an events URL
    opens its stream (default 3600). ``feedback_key`` (default env
    ``TRACERAG_FEEDBACK_KEY``, at least 32 characters) checks the signed user tokens with which
    ``POST /v1/feedback`` verdicts count per end user (``tracerag.materials.UserTokens``);
    ``feedback_limits``: the ``FeedbackLimits`` of those verdicts. The default pipeline (the
    demo's, with ``demo_options`` for ``demo_pipeline``: ``n_samples``, ``temperature``,
    ``plan``, ``seed``) retrieves through the store's material registry (quarantined, deleted,
    pending and expired materials withheld); a given pipeline does when it retrieves through
    ``registry.govern(retriever)``.
    ``desk_config``: the desk's queues — their
    rubric and how many reviewers an item needs (a ``DeskConfig``, its JSON as a mapping, or
    the path of the JSON file; default env ``TRACERAG_DESK_CONFIG``). Desk sessions, claims and
    the sign-in lockout live in the store's database, so several server processes on one store
    are interchangeable. Raises ``ConfigurationError`` on an unusable configuration.
    """
    token = (
        reviewer_token if reviewer_token is not None else get_config().reviewer_token or ""
    ).strip()
    auth = _reviewer_auth(token, reviewers, session_seconds) if review_desk else None
    if review_desk and auth is None:
        raise ConfigurationError(
            "the review desk needs reviewer credentials and will not run open: set "
            f"{REVIEWER_TOKEN_ENV} (a token of at least {MIN_TOKEN_CHARS} characters) or "
            f"{REVIEWERS_FILE_ENV}, or serve the answer API alone with review_desk=False "
            "(tracerag serve --no-review-desk)"
        )
    key = (api_key if api_key is not None else get_config().api_key or "").strip() or None
    if on_decision is None:
        on_decision = get_config().decision_webhook
    try:
        delivery = on_decision if isinstance(on_decision, Delivery) else Delivery(on_decision)
    except ValueError as exc:
        raise ConfigurationError(str(exc)) from exc
    origins = cors_origins_from(cors_origins)
    trace = trace_ui_from(trace_ui)
    if not (replay_seconds > 0 and max_runs >= 1 and events_token_seconds > 0):
        raise ConfigurationError(
            "replay_seconds and events_token_seconds are positive, max_runs at least 1"
        )
    desk = _desk_config(desk_config) if review_desk else None

    owned_store = store is None or isinstance(store, str)
    if store is None or isinstance(store, str):
        from tracerag.store import open_store

        audit_store = open_store(store)
    elif hasattr(store, "append_record"):
        audit_store = store
    else:
        raise ConfigurationError(
            f"store is an AuditStore or a store URL or path, not {type(store).__name__}"
        )
    try:
        journal_dir = _journal_for(audit_store, journal)
    except ConfigurationError:
        if owned_store:
            audit_store.close()
        raise
    tokens = _feedback_tokens(feedback_key)
    registry = None
    if pipeline is None:  # the demo pipeline retrieves through the store's material registry
        registry = _registry_for(audit_store)
        pipeline = demo_pipeline(model, registry=registry, **(demo_options or {}))
    pipeline = _served(pipeline)
    answerer = Answerer(pipeline, audit_store, journal=journal_dir, commit_wait=commit_wait)
    svc = Services(
        store=audit_store,
        answerer=answerer,
        delivery=delivery,
        review_desk=review_desk,
        api_key=key,
        auth=auth,
        templates=_template_env() if review_desk else None,
        claims=ClaimBoard(claim_seconds) if review_desk else None,
        skips=Skips() if review_desk else None,
        desk=desk,
        trace_ui=trace,
        body_timeout=body_timeout,
        runs=RunBook(audit_store, None, scope=key or "", ttl=replay_seconds, max_runs=max_runs),
        tokens=StreamTokens(key, events_token_seconds) if key else None,
        registry=registry,
        owns_registry=registry is not None,
        feedback_tokens=tokens,
        feedback_limits=feedback_limits or _default_limits(),
    )
    answerer.after_record = usage_recorder(svc)
    from tracerag.server._routes.api import request_status

    svc.decisions = DecisionWatch(audit_store, None, request_status)
    if review_desk:
        try:
            _shared_desk_state(svc, audit_store)
        except BaseException:
            if owned_store:
                audit_store.close()
            raise

    @asynccontextmanager
    async def lifespan(app: FastAPI) -> AsyncIterator[None]:
        await asyncio.to_thread(_open_materials, svc)
        await asyncio.to_thread(_open_runs, svc)
        yield
        if svc.background:
            await asyncio.wait(svc.background, timeout=30)
        assert svc.decisions is not None and svc.runs is not None
        await svc.decisions.close()
        await svc.runs.close()
        answerer.close()
        if svc.registry is not None and svc.owns_registry:
            svc.registry.close()
        if svc.desk_db is not None:  # the app opened it, on its own store or the caller's
            svc.desk_db.close()
        if owned_store:
            audit_store.close()

    app = _App(
        title="tracerag",
        summary="Verified answers with their evidence, and a desk for human review.",
        version="1",
        lifespan=lifespan,
        docs_url=None,
        redoc_url=None,
        openapi_url="/v1/openapi.json",
    )
    app.state.services = svc
    app.state.store = audit_store
    app.state.answerer = answerer
    app.state.delivery = delivery
    app.state.review_desk = review_desk
    app.state.secure_cookies = secure_cookies
    install_handlers(app)

    from tracerag.server._routes import api as api_routes
    from tracerag.server._routes import events as event_routes
    from tracerag.server._routes import feedback as feedback_routes

    app.include_router(api_routes.router)
    app.include_router(event_routes.router)
    app.include_router(feedback_routes.router)
    app.include_router(api_routes.health)

    @app.get("/static/review.css", include_in_schema=False)
    async def stylesheet() -> Response:
        css = resources.files("tracerag.server").joinpath("static/review.css").read_text("utf-8")
        return Response(css, media_type="text/css", headers={"Cache-Control": "max-age=3600"})

    @app.get("/v1/client/tracerag-stream.js", include_in_schema=False)
    async def stream_helper() -> Response:
        # under /v1 for CORS: a page on an allowed origin imports it as a module
        js = resources.files("tracerag.server").joinpath("static/tracerag-stream.js")
        return Response(
            js.read_text("utf-8"),
            media_type="text/javascript",
            headers={"Cache-Control": "max-age=3600"},
        )

    @app.get("/", include_in_schema=False)
    async def home() -> Response:
        if review_desk:
            return RedirectResponse("/review", status_code=303)
        return JSONResponse({"service": "tracerag", "answer": "/v1/answer"})

    if review_desk:
        from tracerag.server._routes import review as review_routes

        app.state.why_cache = review_routes.WhyCache()
        app.include_router(review_routes.desk)
        app.include_router(review_routes.api)
        from tracerag.server._routes import materials as material_routes

        app.include_router(material_routes.materials)

        app.add_exception_handler(SignInRequired, review_routes.sign_in_required)

    app.add_middleware(RequestBodyLimitMiddleware, max_body_size=max_body_bytes)
    app.add_middleware(DeclaredBodyLimit, limit=max_body_bytes)
    if origins:
        app.add_middleware(ApiCors, origins=origins)
    app.add_middleware(SecurityHeaders)
    return app
