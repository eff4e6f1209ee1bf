"""The tracerag HTTP server: an answer API for frontends and a review desk for people.

Frontends (``X-API-Key`` when ``TRACERAG_API_KEY`` is set):

- ``POST /v1/answer`` — ``{"question", "session_id"?, "user_id"?, "channel"?}`` → the Response;
- ``POST /v1/answer/stream`` — the same as Server-Sent Events: one ``stage`` event per stage as
  it completes (name, duration, key signals), then one ``response`` event (or ``error``);
- ``GET /v1/requests/{id}`` — the stored trail, the review state and, once a reviewer decided,
  the final answer.

A W3C ``traceparent`` header is honoured: the request's spans join the caller's trace.

Reviewers (token ``TRACERAG_REVIEWER_TOKEN``; see ``tracerag.server.auth``): ``/review`` lists
the queue, ``/review/items/{id}`` shows one item (question, sampled answers, signals, each claim
with its cited material and the supporting sentence marked) and takes the decision, which is
stored, audited and delivered (``tracerag.server.delivery``). ``/review/api/...`` is the same
for programs. Without a configured token the app refuses to build the review desk.

Every served request is written to the app's audit store before its answer goes out (when
the store fails, the record is handed to a background writer that retries, and the answer says
``audit_persisted=false``); the pipeline's own audit sink is bypassed so nothing is written
twice. Bodies over ``max_body_bytes`` are refused with 413; every page carries a strict
Content-Security-Policy (no scripts at all).
"""

from __future__ import annotations

import asyncio
import dataclasses
import json
import logging
import os
import urllib.parse
from collections.abc import Awaitable, Callable, Mapping
from contextlib import asynccontextmanager
from importlib import resources
from typing import Any

from fastapi import FastAPI, Request
from fastapi.responses import HTMLResponse, JSONResponse, RedirectResponse, Response
from opentelemetry import context as otel_context
from opentelemetry import propagate
from pydantic import BaseModel, ConfigDict, ValidationError
from starlette.background import BackgroundTasks
from starlette.responses import StreamingResponse

from tracerag.contract import Response as RAGResponse
from tracerag.errors import ConfigurationError, InputError
from tracerag.runner import StagedRunnable, StageEvent, parse_input
from tracerag.server.auth import (
    API_KEY_ENV,
    COOKIE_NAME,
    MIN_TOKEN_CHARS,
    REVIEWER_TOKEN_ENV,
    SESSION_SECONDS,
    ReviewerAuth,
    Session,
    same_secret,
    valid_reviewer_name,
)
from tracerag.server.delivery import WEBHOOK_ENV, DecisionHook, Delivery, decision_payload
from tracerag.store.base import (
    KIND_OPERATOR_ACTION,
    REVIEW_ACTIONS,
    AlreadyDecided,
    AuditStore,
    ClaimedByOther,
    DuplicateRequest,
    InvalidRecord,
    NotQueued,
    RequestNotFound,
    RequestTrail,
    ReviewDecision,
)

logger = logging.getLogger("tracerag.server")

MAX_BODY_BYTES = 64 * 1024
QUEUE_PAGE_LIMIT = 500  # open items listed per status on the queue page
DECIDED_SCAN_LIMIT = 5000  # decided items read to show the most recent ones
CONTENT_SECURITY_POLICY = (
    "default-src 'none'; style-src 'self'; img-src 'self'; form-action 'self'; "
    "frame-ancestors 'none'; base-uri 'none'"
)
SECURITY_HEADERS = [
    (b"content-security-policy", CONTENT_SECURITY_POLICY.encode()),
    (b"x-content-type-options", b"nosniff"),
    (b"referrer-policy", b"no-referrer"),
    (b"x-frame-options", b"DENY"),
]
STATES = {"approve": "approved", "edit": "edited", "reject": "rejected"}


class AnswerRequest(BaseModel):
    """The body of ``POST /v1/answer``."""

    model_config = ConfigDict(extra="forbid", strict=True)

    question: str
    session_id: str | None = None
    user_id: str | None = None
    channel: str | None = None


class DecisionRequest(BaseModel):
    """The body of ``POST /review/api/items/{id}/decision``."""

    model_config = ConfigDict(extra="forbid", strict=True)

    action: str
    final_answer: str | None = None
    reason: str | None = None


# -- ASGI middleware ------------------------------------------------------------------------


class BodyLimit:
    """Refuses request bodies over ``limit`` bytes with 413, declared or streamed."""

    def __init__(self, app: Any, limit: int) -> None:
        self.app = app
        self.limit = limit

    async def __call__(self, scope: dict, receive: Callable, send: Callable) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        declared = dict(scope.get("headers") or []).get(b"content-length")
        if declared is not None:
            try:
                too_big = int(declared) > self.limit
            except ValueError:
                await _plain(send, 400, "invalid Content-Length")
                return
            if too_big:
                await _too_large(send, self.limit)
                return
        chunks: list[bytes] = []
        size = 0
        while True:
            message = await receive()
            if message["type"] == "http.disconnect":
                return
            body = message.get("body", b"")
            size += len(body)
            if size > self.limit:
                await _too_large(send, self.limit)
                return
            chunks.append(body)
            if not message.get("more_body", False):
                break
        replayed = False

        async def replay() -> dict:
            nonlocal replayed
            if not replayed:
                replayed = True
                return {"type": "http.request", "body": b"".join(chunks), "more_body": False}
            return await receive()

        await self.app(scope, replay, send)


async def _too_large(send: Callable, limit: int) -> None:
    await _plain(send, 413, f"request body over {limit} bytes", as_json=True)


async def _plain(send: Callable, status: int, message: str, as_json: bool = True) -> None:
    body = json.dumps(
        {"error": "request_too_large" if status == 413 else "bad_request", "detail": message}
    ).encode()
    await send(
        {
            "type": "http.response.start",
            "status": status,
            "headers": [
                (b"content-type", b"application/json"),
                (b"content-length", str(len(body)).encode()),
                (b"connection", b"close"),
                *SECURITY_HEADERS,
            ],
        }
    )
    await send({"type": "http.response.body", "body": body})


class SecurityHeaders:
    """Adds the Content-Security-Policy and related headers to every response."""

    def __init__(self, app: Any) -> None:
        self.app = app

    async def __call__(self, scope: dict, receive: Callable, send: Callable) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        review = scope.get("path", "").startswith("/review")

        async def wrapped(message: dict) -> None:
            if message["type"] == "http.response.start":
                headers = list(message.get("headers") or [])
                present = {k.lower() for k, _ in headers}
                headers += [(k, v) for k, v in SECURITY_HEADERS if k not in present]
                if review:
                    headers.append((b"cache-control", b"no-store"))
                message = {**message, "headers": headers}
            await send(message)

        await self.app(scope, receive, wrapped)


# -- running requests -----------------------------------------------------------------------


def demo_pipeline(
    model: str = "extractive",
    *,
    n_samples: int = 5,
    temperature: float = 0.7,
    plan: str = "separate",
    seed: int | None = None,
) -> Any:
    """The pipeline served by default: the bundled knowledge base and an offline model."""
    from tracerag.demo.kb import build_retriever
    from tracerag.demo.run import build_model
    from tracerag.llm import model_name
    from tracerag.pipeline import RAGPipeline
    from tracerag.prompts import DEFAULT_PROMPT_VERSION

    llm = build_model(model, seed)
    return RAGPipeline(
        build_retriever(k=4),
        llm,
        prompt_version=DEFAULT_PROMPT_VERSION,
        model_version=model_name(llm) or type(llm).__name__,
        n_samples=n_samples,
        temperature=temperature,
        plan=plan,
        audit=None,
    )


StageHook = Callable[[StageEvent], None]


class Answerer:
    """Runs a pipeline for the server and keeps every request's record in the store."""

    def __init__(self, pipeline: Any, store: AuditStore) -> None:
        self.pipeline = pipeline
        self.store = store
        self._writer: Any = None

    @property
    def staged(self) -> bool:
        """True when the pipeline runs tracerag's stages (and so can be streamed and recorded)."""
        return isinstance(self.pipeline, StagedRunnable)

    @property
    def max_question_chars(self) -> int:
        if isinstance(self.pipeline, StagedRunnable):
            return self.pipeline.settings.max_question_chars
        return 8000

    def persist(self, record: Mapping[str, Any]) -> bool:
        """Write a record now; on a store failure hand it to a retrying background writer."""
        try:
            self.store.append_record(record)
            return True
        except DuplicateRequest:
            return True
        except InvalidRecord:
            logger.exception("audit record of request %s refused", record.get("request_id"))
            return False
        except Exception as exc:
            logger.warning(
                "audit store failed for request %s (%s); retrying in the background",
                record.get("request_id"),
                exc,
            )
            self.writer().submit(record)
            return False

    async def persist_async(self, record: dict[str, Any]) -> bool:
        """``persist`` off the event loop: the record sink of every request run here."""
        return await asyncio.to_thread(self.persist, record)

    def writer(self) -> Any:
        if self._writer is None:
            from tracerag.store.writer import AuditWriter

            self._writer = AuditWriter(self.store)
        return self._writer

    def close(self) -> None:
        if self._writer is not None:
            self._writer.close()

    async def run(
        self,
        data: dict[str, Any],
        *,
        on_stage: StageHook | None = None,
        parent: Any = None,
    ) -> RAGResponse:
        """Answer one request inside the caller's trace context; store its record first."""
        token = otel_context.attach(parent) if parent is not None else None
        try:
            if not isinstance(self.pipeline, StagedRunnable):
                return await self.pipeline.ainvoke(data)
            # tracerag's own request form: a wrapped app gets the question in its question field
            request = self.pipeline.parse_input(data)
            return await self.pipeline.arun(
                request, on_stage=on_stage, record_sink=self.persist_async
            )
        finally:
            if token is not None:
                otel_context.detach(token)


def stage_event(event: StageEvent) -> dict[str, Any]:
    """What a stream tells about a completed stage: its name, duration and key signals."""
    return event.to_dict()


def sse(event: str, data: Any, event_id: int | None = None) -> str:
    """One Server-Sent Event (the data is one line of JSON)."""
    lines = [f"event: {event}"]
    if event_id is not None:
        lines.append(f"id: {event_id}")
    lines.append("data: " + json.dumps(data, ensure_ascii=False, default=str))
    return "\n".join(lines) + "\n\n"


def request_view(trail: RequestTrail) -> dict[str, Any]:
    """What ``GET /v1/requests/{id}`` returns: state, final answer, response, review, trail."""
    rec = trail.record
    response = rec.get("response") if isinstance(rec.get("response"), Mapping) else {}
    review = trail.review
    decided = review is not None and review.status == "decided"
    if decided:
        assert review is not None
        state = STATES.get(str(review.action), "decided")
        final = review.final_answer if review.action != "reject" else None
    else:
        state = str(response.get("status") or rec.get("decision") or "unknown")
        final = response.get("answer") if rec.get("decision") == "pass" else None
    replays = [
        e.payload.get("replay_request_id")
        for e in trail.of_kind(KIND_OPERATOR_ACTION)
        if e.payload.get("action") == "replay"
    ]
    return {
        "request_id": trail.request_id,
        "state": state,
        "final_answer": final,
        "decision": {
            "action": review.action,
            "final_answer": review.final_answer,
            "reason": review.decision_reason,
            "reviewer": review.decided_by,
            "decided_at": review.decided_at,
        }
        if decided and review is not None
        else None,
        "response": response or None,
        "review": review.to_dict() if review is not None else None,
        "replays": [r for r in replays if r],
        "trail": trail.to_dict(),
    }


# -- helpers --------------------------------------------------------------------------------


def problem(status: int, error: str, detail: Any, **headers: str) -> JSONResponse:
    """A JSON error response."""
    return JSONResponse({"error": error, "detail": detail}, status_code=status, headers=headers)


async def read_json(request: Request) -> Any:
    """The request body as JSON; raises ``_BadBody`` (400) when it is not."""
    body = await request.body()
    if not body.strip():
        raise _BadBody("the request body is empty; send a JSON object")
    try:
        return json.loads(body)
    except (UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise _BadBody(f"the request body is not valid JSON: {exc}") from None


class _BadBody(Exception):
    pass


def _validation_detail(exc: ValidationError) -> list[dict[str, Any]]:
    return [
        {"loc": list(e.get("loc", ())), "msg": e.get("msg"), "type": e.get("type")}
        for e in exc.errors(include_url=False)
    ]


def _template_env() -> Any:
    import jinja2

    return jinja2.Environment(
        loader=jinja2.PackageLoader("tracerag.server", "templates"),
        autoescape=True,
        undefined=jinja2.ChainableUndefined,
    )


# -- the app --------------------------------------------------------------------------------


def create_app(
    pipeline: Any = None,
    store: AuditStore | str | None = None,
    reviewer_token: str | None = None,
    api_key: str | None = None,
    *,
    review_desk: bool = True,
    on_decision: DecisionHook | str | Delivery | None = None,
    max_body_bytes: int = MAX_BODY_BYTES,
    model: str = "extractive",
    secure_cookies: bool = False,
    session_seconds: int = SESSION_SECONDS,
) -> FastAPI:
    """The server app.

    ``pipeline``: a ``RAGPipeline`` or ``wrap()``-ed chain (default: the demo knowledge base with
    the offline ``model``). ``store``: an ``AuditStore`` or a store URL/path (default:
    ``TRACERAG_STORE``, else ``./.tracerag/audit.sqlite``). ``reviewer_token`` (default env
    ``TRACERAG_REVIEWER_TOKEN``) is required for the review desk; ``review_desk=False`` serves
    the answer API alone. ``api_key`` (default env ``TRACERAG_API_KEY``) guards ``/v1``.
    ``on_decision``: a callable or webhook URL (or a configured ``Delivery``) told of every
    review decision (default env ``TRACERAG_DECISION_WEBHOOK``). Raises ``ConfigurationError``
    on an unusable configuration.
    """
    token = (
        reviewer_token if reviewer_token is not None else os.environ.get(REVIEWER_TOKEN_ENV, "")
    ).strip()
    if review_desk and not token:
        raise ConfigurationError(
            "the review desk needs a reviewer token and will not run open: set "
            f"{REVIEWER_TOKEN_ENV} (or pass reviewer_token=), or serve the answer API alone "
            "with review_desk=False (tracerag serve --no-review-desk)"
        )
    if review_desk and len(token) < MIN_TOKEN_CHARS:
        raise ConfigurationError(
            f"the reviewer token must have at least {MIN_TOKEN_CHARS} characters; "
            "generate one with: python -c 'import secrets; print(secrets.token_urlsafe(32))'"
        )
    key = (api_key if api_key is not None else os.environ.get(API_KEY_ENV, "")).strip() or None
    if on_decision is None:
        on_decision = os.environ.get(WEBHOOK_ENV, "").strip() or None
    try:
        delivery = on_decision if isinstance(on_decision, Delivery) else Delivery(on_decision)
    except ValueError as exc:
        raise ConfigurationError(str(exc)) from exc

    owned_store = not hasattr(store, "append_record")
    if owned_store:
        from tracerag.store import open_store

        store = open_store(store)  # type: ignore[arg-type]
    assert store is not None and not isinstance(store, str)
    audit_store: AuditStore = store
    answerer = Answerer(pipeline if pipeline is not None else demo_pipeline(model), audit_store)
    auth = ReviewerAuth(token, session_seconds) if review_desk else None
    templates = _template_env() if review_desk else None
    background: set[asyncio.Task] = set()

    @asynccontextmanager
    async def lifespan(app: FastAPI):
        yield
        if background:
            await asyncio.wait(background, timeout=30)
        answerer.close()
        if owned_store:
            audit_store.close()

    app = FastAPI(
        title="tracerag",
        summary="Verified answers with their evidence, and a desk for human review.",
        lifespan=lifespan,
        docs_url=None,
        redoc_url=None,
        openapi_url="/v1/openapi.json",
    )
    app.state.store = audit_store
    app.state.answerer = answerer
    app.state.delivery = delivery
    app.state.review_desk = review_desk

    def call(fn: Callable[..., Any], *args: Any, **kwargs: Any) -> Awaitable[Any]:
        return asyncio.to_thread(fn, *args, **kwargs)

    # -- frontends ------------------------------------------------------------------------

    def api_key_problem(request: Request) -> JSONResponse | None:
        if key is None or same_secret(request.headers.get("x-api-key"), key):
            return None
        return problem(401, "unauthorized", "a valid X-API-Key header is required")

    async def answer_input(request: Request) -> dict[str, Any] | JSONResponse:
        denied = api_key_problem(request)
        if denied is not None:
            return denied
        try:
            raw = await read_json(request)
        except _BadBody as exc:
            return problem(400, "bad_request", str(exc))
        if not isinstance(raw, dict):
            return problem(422, "invalid_input", "the body must be a JSON object with 'question'")
        try:
            body = AnswerRequest.model_validate(raw)
        except ValidationError as exc:
            return problem(422, "invalid_input", _validation_detail(exc))
        data = body.model_dump(exclude_none=True)
        try:
            parse_input(data, max_chars=answerer.max_question_chars)
        except InputError as exc:
            return problem(422, "invalid_input", str(exc))
        return data

    @app.post("/v1/answer")
    async def answer(request: Request) -> Response:
        data = await answer_input(request)
        if isinstance(data, JSONResponse):
            return data
        parent = propagate.extract(request.headers)
        try:
            result = await answerer.run(data, parent=parent)
        except InputError as exc:
            return problem(422, "invalid_input", str(exc))
        except Exception as exc:
            logger.exception("request failed")
            return problem(500, "pipeline_failed", f"{type(exc).__name__}: {exc}")
        return JSONResponse(
            result.model_dump(mode="json"), headers={"X-Request-Id": result.request_id}
        )

    @app.post("/v1/answer/stream")
    async def answer_stream(request: Request) -> Response:
        data = await answer_input(request)
        if isinstance(data, JSONResponse):
            return data
        parent = propagate.extract(request.headers)
        queue: asyncio.Queue[tuple[str, Any] | None] = asyncio.Queue()

        def on_stage(event: StageEvent) -> None:
            queue.put_nowait(("stage", stage_event(event)))

        async def job() -> None:
            try:
                result = await answerer.run(data, on_stage=on_stage, parent=parent)
                if not answerer.staged:
                    queue.put_nowait(("stage", {"stage": "all", "note": "not streamable"}))
                queue.put_nowait(("response", result.model_dump(mode="json")))
            except Exception as exc:
                logger.exception("streamed request failed")
                queue.put_nowait(
                    ("error", {"error": "pipeline_failed", "detail": f"{type(exc).__name__}"})
                )
            finally:
                queue.put_nowait(None)

        # the run completes (and is stored) even if the caller goes away mid-stream
        task = asyncio.create_task(job())
        background.add(task)
        task.add_done_callback(background.discard)

        async def events():
            n = 0
            while True:
                item = await queue.get()
                if item is None:
                    return
                n += 1
                yield sse(item[0], item[1], n)

        return StreamingResponse(
            events(),
            media_type="text/event-stream",
            headers={"Cache-Control": "no-cache", "X-Accel-Buffering": "no"},
        )

    @app.get("/v1/requests/{request_id}")
    async def get_request(request_id: str, request: Request) -> Response:
        denied = api_key_problem(request)
        if denied is not None:
            return denied
        try:
            trail = await call(audit_store.get, request_id)
        except RequestNotFound:
            return problem(404, "not_found", f"no request {request_id!r}")
        return JSONResponse(request_view(trail))

    @app.get("/healthz")
    async def healthz() -> dict[str, Any]:
        return {"ok": True, "review_desk": review_desk}

    @app.get("/static/review.css")
    async def stylesheet() -> Response:
        css = resources.files("tracerag.server").joinpath("static/review.css").read_text("utf-8")
        return Response(css, media_type="text/css", headers={"Cache-Control": "max-age=3600"})

    @app.get("/")
    async def home() -> Response:
        if review_desk:
            return RedirectResponse("/review", status_code=303)
        return JSONResponse({"service": "tracerag", "answer": "/v1/answer"})

    if not review_desk:
        return _wrap(app, max_body_bytes)
    assert auth is not None and templates is not None

    # -- review desk ----------------------------------------------------------------------

    def page(template: str, code: int = 200, session: Session | None = None, **values: Any):
        html = templates.get_template(template).render(
            reviewer=session.reviewer if session else None,
            csrf=auth.csrf_token(session) if session else "",
            **values,
        )
        return HTMLResponse(html, status_code=code)

    def error_page(
        status: int,
        heading: str,
        message: str,
        session: Session | None = None,
        back: str | None = None,
    ) -> HTMLResponse:
        response = page(
            "error.html",
            status,
            session,
            status=status,
            heading=heading,
            message=message,
            back=back,
        )
        if status == 401:
            response.headers["WWW-Authenticate"] = 'Bearer realm="tracerag-review"'
        return response

    def session_of(request: Request) -> Session | None:
        bearer = auth.read_bearer(
            request.headers.get("authorization"), request.headers.get("x-reviewer")
        )
        if bearer is not None:
            return bearer
        return auth.read_cookie(request.cookies.get(COOKIE_NAME))

    def unauthorized(request: Request) -> Response:
        if request.url.path.startswith("/review/api/"):
            return problem(
                401,
                "unauthorized",
                "reviewer token required",
                **{"WWW-Authenticate": 'Bearer realm="tracerag-review"'},
            )
        return error_page(401, "Sign in required", "Reviewer pages need the reviewer token.")

    async def form_of(request: Request) -> dict[str, str]:
        body = (await request.body()).decode("utf-8", errors="replace")
        pairs = urllib.parse.parse_qsl(body, keep_blank_values=True, max_num_fields=20)
        return {k: v for k, v in pairs}

    def decide(
        request_id: str, reviewer: str, action: str, final_answer: str | None, reason: str | None
    ) -> tuple[ReviewDecision, dict[str, Any]]:
        if action not in REVIEW_ACTIONS:
            raise ValueError(f"action must be one of {', '.join(REVIEW_ACTIONS)}")
        trail = audit_store.get(request_id)
        if trail.review is None:
            raise NotQueued(request_id)
        reason = (reason or "").strip() or None
        if action == "approve":
            final_answer = trail.audit.candidate_answer
            if not final_answer:
                raise ValueError("there is no candidate answer to approve: edit or reject")
        elif action == "reject":
            final_answer = None
        else:
            final_answer = (final_answer or "").strip() or None
        decision = audit_store.decide(request_id, reviewer, action, final_answer, reason)
        return decision, trail.record

    async def decide_or_problem(
        request_id: str,
        session: Session,
        action: str,
        final_answer: str | None,
        reason: str | None,
    ) -> tuple[ReviewDecision, BackgroundTasks] | tuple[int, str]:
        try:
            decision, record = await call(
                decide, request_id, session.reviewer, action, final_answer, reason
            )
        except (RequestNotFound, NotQueued) as exc:
            return 404, str(exc)
        except (AlreadyDecided, ClaimedByOther) as exc:
            return 409, str(exc)
        except (ValueError, InvalidRecord) as exc:
            return 422, str(exc)
        tasks = BackgroundTasks()
        if delivery.enabled:
            tasks.add_task(delivery.deliver, audit_store, decision_payload(decision, record))
        return decision, tasks

    @app.get("/review/signin")
    async def signin_form(request: Request) -> Response:
        return page("signin.html", session=None, error=None, name="")

    @app.post("/review/signin")
    async def signin(request: Request) -> Response:
        form = await form_of(request)
        name = form.get("reviewer", "").strip()
        if not auth.check_token(form.get("token")):
            await asyncio.sleep(0.25)  # slows down guessing
            return page("signin.html", 401, None, error="That token is not right.", name=name)
        if not valid_reviewer_name(name):
            return page(
                "signin.html",
                422,
                None,
                name=name,
                error="Give your name (up to 64 letters, digits, spaces or .@+-_).",
            )
        response = RedirectResponse("/review", status_code=303)
        response.set_cookie(
            COOKIE_NAME,
            auth.issue(name),
            max_age=auth.session_seconds,
            path="/review",
            httponly=True,
            samesite="strict",
            secure=secure_cookies,
        )
        return response

    @app.post("/review/signout")
    async def signout(request: Request) -> Response:
        session = session_of(request)
        if session is None:
            return unauthorized(request)
        form = await form_of(request)
        if not auth.check_csrf(session, form.get("csrf")):
            return error_page(403, "Forbidden", "The form was not sent from this desk.", session)
        response = RedirectResponse("/review/signin", status_code=303)
        response.delete_cookie(COOKIE_NAME, path="/review")
        return response

    @app.get("/review")
    async def queue_page(request: Request) -> Response:
        session = session_of(request)
        if session is None:
            return unauthorized(request)
        open_items = [
            *await call(audit_store.list_queue, "pending", QUEUE_PAGE_LIMIT),
            *await call(audit_store.list_queue, "claimed", QUEUE_PAGE_LIMIT),
        ]
        decided_all = await call(audit_store.list_queue, "decided", DECIDED_SCAN_LIMIT)
        counts: dict[str, int] = {}
        for item in [*open_items, *decided_all]:
            counts[item.status] = counts.get(item.status, 0) + 1
        decided = sorted(decided_all, key=lambda i: i.decided_at or "", reverse=True)[:20]
        return page(
            "queue.html",
            session=session,
            counts=counts,
            open_items=open_items,
            decided_items=decided,
        )

    @app.get("/review/items/{request_id}")
    async def item_page(request_id: str, request: Request) -> Response:
        session = session_of(request)
        if session is None:
            return unauthorized(request)
        return await _item(request_id, session)

    async def _item(
        request_id: str, session: Session, status: int = 200, error: str | None = None
    ) -> Response:
        from tracerag.server.views import item_context

        try:
            trail = await call(audit_store.get, request_id)
        except RequestNotFound:
            return error_page(404, "Not found", f"No request {request_id!r}.", session, "/review")
        if trail.review is None:
            return error_page(
                404,
                "Not in the queue",
                f"Request {request_id!r} is not in the review queue.",
                session,
                "/review",
            )
        return page("item.html", status, session, error=error, **item_context(trail))

    @app.post("/review/items/{request_id}/decision")
    async def decide_form(request_id: str, request: Request) -> Response:
        session = session_of(request)
        if session is None:
            return unauthorized(request)
        form = await form_of(request)
        if not auth.check_csrf(session, form.get("csrf")):
            return error_page(403, "Forbidden", "The form was not sent from this desk.", session)
        outcome = await decide_or_problem(
            request_id,
            session,
            form.get("action", ""),
            form.get("final_answer"),
            form.get("reason"),
        )
        if isinstance(outcome[0], int):
            status, message = outcome
            if status == 422:
                return await _item(request_id, session, 422, message)
            heading = "Not found" if status == 404 else "Already decided"
            return error_page(status, heading, message, session, f"/review/items/{request_id}")
        _, tasks = outcome
        target = f"/review/items/{urllib.parse.quote(request_id, safe='')}"
        return RedirectResponse(target, status_code=303, background=tasks)

    @app.get("/review/api/queue")
    async def queue_api(request: Request, status: str | None = None) -> Response:
        session = session_of(request)
        if session is None:
            return unauthorized(request)
        try:
            items = await call(audit_store.list_queue, status, 500)
        except ValueError as exc:
            return problem(422, "invalid_input", str(exc))
        return JSONResponse({"items": [i.to_dict() for i in items]})

    @app.post("/review/api/items/{request_id}/decision")
    async def decide_api(request_id: str, request: Request) -> Response:
        session = session_of(request)
        if session is None:
            return unauthorized(request)
        if session.via != "bearer":
            return problem(403, "forbidden", "the review API takes the token as a bearer header")
        try:
            raw = await read_json(request)
        except _BadBody as exc:
            return problem(400, "bad_request", str(exc))
        try:
            body = DecisionRequest.model_validate(raw)
        except ValidationError as exc:
            return problem(422, "invalid_input", _validation_detail(exc))
        outcome = await decide_or_problem(
            request_id, session, body.action, body.final_answer, body.reason
        )
        if isinstance(outcome[0], int):
            status, message = outcome
            error = {404: "not_found", 409: "conflict", 422: "invalid_input"}[status]
            return problem(status, error, message)
        decision, tasks = outcome
        return JSONResponse(dataclasses.asdict(decision), background=tasks)

    return _wrap(app, max_body_bytes)


def _wrap(app: FastAPI, max_body_bytes: int) -> FastAPI:
    app.add_middleware(BodyLimit, limit=max_body_bytes)
    app.add_middleware(SecurityHeaders)
    return app
