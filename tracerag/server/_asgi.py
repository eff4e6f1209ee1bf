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
  instead of asking again (``tracerag.server._run_book``);
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
import logging
import os
from collections.abc import AsyncIterator, Callable, Iterable, Mapping
from contextlib import AbstractAsyncContextManager, asynccontextmanager
from importlib import resources
from typing import TYPE_CHECKING, Any, Literal

from fastapi import FastAPI
from fastapi.responses import JSONResponse, RedirectResponse, Response
from starlette.middleware.body_limit import RequestBodyLimitMiddleware

from tracerag._runnable import StagedRunnable
from tracerag.config import get_config
from tracerag.errors import ConfigurationError, TraceragError
from tracerag.materials import FeedbackLimits, MaterialRegistry, UserTokens
from tracerag.server._answerer import Answerer, DemoOptions, demo_pipeline
from tracerag.server._auth import (
    GENERATE_HINT,
    MIN_TOKEN_CHARS,
    REVIEWER_TOKEN_ENV,
    REVIEWERS_FILE_ENV,
    SESSION_SECONDS,
    ReviewerAuth,
    SharedSessions,
    SharedThrottle,
    read_reviewers_file,
    token_problem,
)
from tracerag.server._delivery import DecisionHook, Delivery
from tracerag.server._deps import Services, SignInRequired
from tracerag.server._desk_config import DeskConfig
from tracerag.server._desk_db import desk_db_like
from tracerag.server._error_shape import install_handlers
from tracerag.server._middleware import ApiCors, DeclaredBodyLimit, SecurityHeaders
from tracerag.server._openapi import App
from tracerag.server._registry_wiring import usage_recorder
from tracerag.server._review_claims import (
    CLAIM_SECONDS,
    ClaimBoard,
    SharedClaimBoard,
    SharedSkips,
    Skips,
)
from tracerag.server._routes import (
    api as api_routes,
)
from tracerag.server._routes import (
    desk_export,
    desk_items,
    desk_materials,
    desk_queue,
    desk_signin,
    review_api,
)
from tracerag.server._routes import feedback as feedback_routes
from tracerag.server._routes import sse as sse_routes
from tracerag.server._routes.desk_form import FormRefused, form_refused
from tracerag.server._routes.desk_views import WhyCache
from tracerag.server._routes.sse import NothingToSend, nothing_to_send
from tracerag.server._run_book import DEFAULT_MAX_RUNS, DEFAULT_TTL, DecisionWatch, RunBook
from tracerag.server._run_table import open_run_table
from tracerag.server._signed_urls import DEFAULT_TOKEN_SECONDS, StreamTokens
from tracerag.store import open_store
from tracerag.store._base import AuditStore, StoreError
from tracerag.store._open import journal_dir_for

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
        import jinja2  # the desk's pages only: an app without the desk never loads it

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


def _open_runs(svc: Services) -> None:
    """Open the answer-run table beside the store, so replicas share streams and keys (a store
    without a database of its own keeps them in this process, and says so)."""
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


def _feedback_tokens(key: str | None) -> UserTokens | None:
    """The signed user tokens of ``POST /v1/feedback`` (None: no key, no end-user verdicts)."""
    value = (key if key is not None else get_config().feedback_key or "").strip()
    if not value:
        return None
    try:
        return UserTokens(value)
    except ValueError as exc:
        raise ConfigurationError(f"TRACERAG_FEEDBACK_KEY: {exc}; {GENERATE_HINT}") from exc


def _default_limits() -> FeedbackLimits:
    return FeedbackLimits()


def _registry_for(store: AuditStore) -> MaterialRegistry | None:
    """The material registry beside the store, or None when the store cannot hold one (the
    demo pipeline then retrieves without it, and the desk says so)."""
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
    if isinstance(pipeline, StagedRunnable) or not hasattr(pipeline, "nodes"):
        return pipeline
    try:
        from tracerag.middleware._served import served_agent
    except ImportError:  # LangChain's agents are not installed: it cannot be one
        return pipeline
    return served_agent(pipeline) or pipeline


def _desk_auth(
    review_desk: bool,
    reviewer_token: str | None,
    reviewers: Mapping[str, str] | str | None,
    session_seconds: int,
) -> ReviewerAuth | None:
    """The desk's reviewer credentials (None without a desk); a desk never runs open."""
    if not review_desk:
        return None
    token = (
        reviewer_token if reviewer_token is not None else get_config().reviewer_token or ""
    ).strip()
    auth = _reviewer_auth(token, reviewers, session_seconds)
    if auth is None:
        raise ConfigurationError(
            "the review desk needs reviewer credentials and will not run open: set "
            f"{REVIEWER_TOKEN_ENV} (a token of at least {MIN_TOKEN_CHARS} characters) or "
            f"{REVIEWERS_FILE_ENV}, or serve the answer API alone with review_desk=False "
            "(tracerag serve --no-review-desk)"
        )
    return auth


def _delivery_for(on_decision: DecisionHook | str | Delivery | None) -> Delivery:
    """Who is told of each review decision (default env ``TRACERAG_DECISION_WEBHOOK``)."""
    if on_decision is None:
        on_decision = get_config().decision_webhook
    try:
        return on_decision if isinstance(on_decision, Delivery) else Delivery(on_decision)
    except ValueError as exc:
        raise ConfigurationError(str(exc)) from exc


def _audit_store(store: AuditStore | str | None) -> tuple[AuditStore, bool]:
    """The server's audit store, and whether the app opened it (and so closes it)."""
    if store is None or isinstance(store, str):
        return open_store(store), True
    if hasattr(store, "append_record"):
        return store, False
    raise ConfigurationError(
        f"store is an AuditStore or a store URL or path, not {type(store).__name__}"
    )


def _lifespan(
    svc: Services, owned_store: bool
) -> Callable[[FastAPI], AbstractAsyncContextManager[None]]:
    """The app's life: the registry and the run table opened at start; at the end, the
    background work awaited and everything the app opened closed."""

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
        svc.answerer.close()
        if svc.registry is not None and svc.owns_registry:
            svc.registry.close()
        if svc.desk_db is not None:  # the app opened it, on its own store or the caller's
            svc.desk_db.close()
        if owned_store:
            svc.store.close()

    return lifespan


async def _stylesheet() -> Response:
    css = resources.files("tracerag.server").joinpath("static/review.css").read_text("utf-8")
    return Response(css, media_type="text/css", headers={"Cache-Control": "max-age=3600"})


async def _stream_helper() -> Response:
    # under /v1 for CORS: a page on an allowed origin imports it as a module
    js = resources.files("tracerag.server").joinpath("static/tracerag-stream.js")
    return Response(
        js.read_text("utf-8"),
        media_type="text/javascript",
        headers={"Cache-Control": "max-age=3600"},
    )


def _include_routes(app: FastAPI, review_desk: bool) -> None:
    """The answer API, its streams, feedback and health; with the desk, its pages, its JSON
    API and the material pages."""
    for router in (api_routes.router, sse_routes.router, feedback_routes.router):
        app.include_router(router)
    app.include_router(api_routes.health)
    app.add_api_route("/static/review.css", _stylesheet, include_in_schema=False)
    app.add_api_route("/v1/client/tracerag-stream.js", _stream_helper, include_in_schema=False)

    async def home() -> Response:
        if review_desk:
            return RedirectResponse("/review", status_code=303)
        return JSONResponse({"service": "tracerag", "answer": "/v1/answer"})

    app.add_api_route("/", home, include_in_schema=False)
    if not review_desk:
        return
    app.state.why_cache = WhyCache()
    for router in (
        desk_signin.router,
        desk_queue.router,
        desk_items.router,
        desk_export.router,
        review_api.router,
        desk_materials.materials,
    ):
        app.include_router(router)
    app.add_exception_handler(SignInRequired, desk_signin.sign_in_required)
    app.add_exception_handler(FormRefused, form_refused)


def _add_middleware(app: FastAPI, max_body_bytes: int, origins: list[str]) -> None:
    """Body limits, CORS for the listed origins, and the security headers (outermost)."""
    app.add_middleware(RequestBodyLimitMiddleware, max_body_size=max_body_bytes)
    app.add_middleware(DeclaredBodyLimit, limit=max_body_bytes)
    if origins:
        app.add_middleware(ApiCors, origins=origins)
    app.add_middleware(SecurityHeaders)


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
    auth = _desk_auth(review_desk, reviewer_token, reviewers, session_seconds)
    key = (api_key if api_key is not None else get_config().api_key or "").strip() or None
    delivery = _delivery_for(on_decision)
    origins = cors_origins_from(cors_origins)
    trace = trace_ui_from(trace_ui)
    if not (replay_seconds > 0 and max_runs >= 1 and events_token_seconds > 0):
        raise ConfigurationError(
            "replay_seconds and events_token_seconds are positive, max_runs at least 1"
        )
    desk = _desk_config(desk_config) if review_desk else None

    audit_store, owned_store = _audit_store(store)
    try:
        journal_dir = _journal_for(audit_store, journal)
        tokens = _feedback_tokens(feedback_key)
        registry = None
        if pipeline is None:  # the demo pipeline retrieves through the store's material registry
            registry = _registry_for(audit_store)
            pipeline = demo_pipeline(model, registry=registry, **(demo_options or {}))
        answerer = Answerer(
            _served(pipeline), audit_store, journal=journal_dir, commit_wait=commit_wait
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
            runs=RunBook(audit_store, None, scope=key or "", ttl=replay_seconds, max_runs=max_runs),
            tokens=StreamTokens(key, events_token_seconds) if key else None,
            registry=registry,
            owns_registry=registry is not None,
            feedback_tokens=tokens,
            feedback_limits=feedback_limits or _default_limits(),
        )
        answerer.after_record = usage_recorder(svc)
        svc.decisions = DecisionWatch(audit_store, None, api_routes.request_status)
        if review_desk:
            _shared_desk_state(svc, audit_store)
    except BaseException:
        if owned_store:
            audit_store.close()
        raise

    app = App(
        title="tracerag",
        summary="Verified answers with their evidence, and a desk for human review.",
        version="1",
        lifespan=_lifespan(svc, owned_store),
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
    app.add_exception_handler(NothingToSend, nothing_to_send)
    _include_routes(app, review_desk)
    _add_middleware(app, max_body_bytes, origins)
    return app
