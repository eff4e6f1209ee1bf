"""The tracerag HTTP server: an answer API for frontends and a review desk for people.

Frontends (``X-API-Key`` when ``TRACERAG_API_KEY`` is set; bodies ``application/json`` only):

- ``POST /v1/answer`` — ``{"question", "session_id"?, "user_id"?, "channel"?}`` → the caller
  view of the Response (an escalated answer's text appears nowhere in it);
- ``POST /v1/answer/stream`` — the same as Server-Sent Events: one ``stage`` event per stage,
  then one ``response`` event (or ``error``), with ``retry:`` and keep-alive comments;
- ``GET /v1/requests/{id}`` — the outcome: state, decision and the answer the caller may show;
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
import logging
from collections.abc import Iterable, Mapping
from contextlib import asynccontextmanager
from importlib import resources
from typing import Any

from fastapi import FastAPI
from fastapi.openapi.utils import get_openapi
from fastapi.responses import JSONResponse, RedirectResponse, Response
from starlette.middleware.body_limit import RequestBodyLimitMiddleware

from tracerag.config import get_config
from tracerag.errors import ConfigurationError, TraceragError
from tracerag.server._desk_config import DeskConfig
from tracerag.server.answerer import Answerer, demo_pipeline
from tracerag.server.auth import (
    GENERATE_HINT,
    MIN_TOKEN_CHARS,
    REVIEWER_TOKEN_ENV,
    REVIEWERS_FILE_ENV,
    SESSION_SECONDS,
    ReviewerAuth,
    read_reviewers_file,
    token_problem,
)
from tracerag.server.claims import (
    CLAIM_SECONDS,
    ClaimBoard,
    SharedClaimBoard,
    SharedSkips,
    Skips,
)
from tracerag.server.delivery import DecisionHook, Delivery
from tracerag.server.deps import Services, SignInRequired
from tracerag.server.errors import Problem, install_handlers
from tracerag.server.middleware import ApiCors, DeclaredBodyLimit, SecurityHeaders
from tracerag.server.models import (
    AnswerRequest,
    DecisionRequest,
    FeedbackRequest,
    StreamEvents,
)
from tracerag.store.base import AuditStore, StoreError

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


_templates: Any = None


def _template_env() -> Any:
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
    from tracerag.server._desk_db import desk_db_like
    from tracerag.server.auth import SharedSessions, SharedThrottle

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


def _openapi(app: FastAPI) -> dict[str, Any]:
    if app.openapi_schema:
        return app.openapi_schema
    schema = get_openapi(
        title=app.title,
        version=app.version,
        summary=app.summary,
        description=app.description,
        routes=app.routes,
    )
    components = schema.setdefault("components", {}).setdefault("schemas", {})
    for model in (AnswerRequest, DecisionRequest, FeedbackRequest, StreamEvents):
        full = model.model_json_schema(ref_template="#/components/schemas/{model}")
        for name, sub in full.pop("$defs", {}).items():
            components.setdefault(name, sub)
        components[model.__name__] = full
    # every error is JSON in the one error shape, whatever the route's success media type
    problem_ref = {"$ref": "#/components/schemas/Problem"}
    components.setdefault("Problem", Problem.model_json_schema())
    for item in schema.get("paths", {}).values():
        for op in item.values():
            responses = op.setdefault("responses", {})
            responses.setdefault("default", {"description": "an error"})
            for status, response in responses.items():
                if status.startswith(("4", "5")) or status == "default":
                    if path_is_readiness(op) and status == "503":
                        continue
                    response["content"] = {"application/json": {"schema": problem_ref}}
    app.openapi_schema = schema
    return schema


def path_is_readiness(op: dict[str, Any]) -> bool:
    """True for ``/readyz``, whose 503 carries the readiness report, not an error."""
    return op.get("operationId", "").startswith("readyz")


def _open_materials(svc: Services) -> None:
    """Open the material registry beside the store, so its figures are reported from the start
    (a store that cannot hold one, e.g. ``:memory:``, serves without it)."""
    try:
        svc.materials()
    except Exception as exc:
        logger.info("no material registry beside this store: %s: %s", type(exc).__name__, exc)


def create_app(
    pipeline: Any = None,
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
    ``TRACERAG_AUDIT_COMMIT_WAIT``, else 1 s). ``desk_config``: the desk's queues — their
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
    desk = _desk_config(desk_config) if review_desk else None

    owned_store = not hasattr(store, "append_record")
    if owned_store:
        from tracerag.store import open_store

        store = open_store(store)  # type: ignore[arg-type]
    assert store is not None and not isinstance(store, str)
    audit_store: AuditStore = store
    from tracerag.store import journal_dir_for

    path = getattr(audit_store, "path", None)
    journal = journal_dir_for(path) if isinstance(path, str) else get_config().audit_journal
    answerer = Answerer(
        pipeline if pipeline is not None else demo_pipeline(model),
        audit_store,
        journal=journal,
        commit_wait=commit_wait,
    )
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
    )
    if review_desk:
        try:
            _shared_desk_state(svc, audit_store)
        except BaseException:
            if owned_store:
                audit_store.close()
            raise

    @asynccontextmanager
    async def lifespan(app: FastAPI):
        await asyncio.to_thread(_open_materials, svc)
        yield
        if svc.background:
            await asyncio.wait(svc.background, timeout=30)
        answerer.close()
        if svc.registry is not None and svc.owns_registry:
            svc.registry.close()
        if owned_store:
            if svc.desk_db is not None:
                svc.desk_db.close()
            audit_store.close()

    app = FastAPI(
        title="tracerag",
        summary="Verified answers with their evidence, and a desk for human review.",
        version="1",
        lifespan=lifespan,
        docs_url=None,
        redoc_url=None,
        openapi_url="/v1/openapi.json",
    )
    app.openapi = lambda: _openapi(app)  # type: ignore[method-assign]
    app.state.services = svc
    app.state.store = audit_store
    app.state.answerer = answerer
    app.state.delivery = delivery
    app.state.review_desk = review_desk
    app.state.secure_cookies = secure_cookies
    install_handlers(app)

    from tracerag.server.routes import api as api_routes

    app.include_router(api_routes.router)
    app.include_router(api_routes.health)

    @app.get("/static/review.css", include_in_schema=False)
    async def stylesheet() -> Response:
        css = resources.files("tracerag.server").joinpath("static/review.css").read_text("utf-8")
        return Response(css, media_type="text/css", headers={"Cache-Control": "max-age=3600"})

    @app.get("/", include_in_schema=False)
    async def home() -> Response:
        if review_desk:
            return RedirectResponse("/review", status_code=303)
        return JSONResponse({"service": "tracerag", "answer": "/v1/answer"})

    if review_desk:
        from tracerag.server.routes import review as review_routes

        app.state.why_cache = review_routes.WhyCache()
        app.include_router(review_routes.desk)
        app.include_router(review_routes.api)
        from tracerag.server.routes import materials as material_routes

        app.include_router(material_routes.materials)

        app.add_exception_handler(SignInRequired, review_routes.sign_in_required)

    app.add_middleware(RequestBodyLimitMiddleware, max_body_size=max_body_bytes)
    app.add_middleware(DeclaredBodyLimit, limit=max_body_bytes)
    if origins:
        app.add_middleware(ApiCors, origins=origins)
    app.add_middleware(SecurityHeaders)
    return app
