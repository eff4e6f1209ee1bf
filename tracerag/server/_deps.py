"""What routes share, as FastAPI dependencies: the app's services, the API key, JSON bodies,
forms, the signed-in reviewer and store calls that turn an outage into a 503."""

from __future__ import annotations

import asyncio
import json
import logging
import urllib.parse
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Annotated, Any, TypeVar

from fastapi import Depends, Request
from pydantic import ValidationError

from tracerag.materials import MaterialRegistry
from tracerag.server._answerer import Answerer
from tracerag.server._auth import COOKIE_NAME, NAMED, ReviewerAuth, Session, same_secret
from tracerag.server._bodies import AnswerRequest
from tracerag.server._delivery import Delivery
from tracerag.server._error_shape import ApiError
from tracerag.server._review_claims import ClaimBoard, Skips
from tracerag.server._run_book import DecisionWatch, RunBook, key_problem
from tracerag.server._signed_urls import StreamTokens
from tracerag.store._base import AuditStore, StoreError
from tracerag.text._unicode import is_invisible

if TYPE_CHECKING:
    import jinja2

    from tracerag.materials import FeedbackLimits, UserTokens
    from tracerag.server._desk_config import DeskConfig
    from tracerag.server._desk_db import DeskDB

logger = logging.getLogger("tracerag.server")
security_log = logging.getLogger("tracerag.server.security")

MAX_JSON_DEPTH = 32
SHARED_BEARER_NAME = "api-reviewer"
MAX_FORM_FIELDS = 20
T = TypeVar("T")


@dataclass
class Services:
    """Everything a request handler may need; one per app, on ``app.state.services``."""

    store: AuditStore
    answerer: Answerer
    delivery: Delivery
    review_desk: bool
    api_key: str | None = None
    auth: ReviewerAuth | None = None
    templates: jinja2.Environment | None = None
    claims: ClaimBoard | None = None
    skips: Skips | None = None
    desk: DeskConfig | None = None  # the desk's queues and their rubrics
    desk_db: DeskDB | None = None  # the desk's tables in the store's database, if it has one
    trace_ui: tuple[str, str | None] | None = None  # (backend, base URL) for trace links
    body_timeout: float = 10.0
    store_timeout: float = 15.0
    background: set[asyncio.Task[None]] = field(default_factory=set)
    registry: MaterialRegistry | None = None  # the material registry beside the store
    owns_registry: bool = False  # opened here (closed with the app), not given
    runs: RunBook | None = None  # answer runs: resumable streams, idempotency keys
    decisions: DecisionWatch | None = None  # streams waiting for a reviewer's decision
    tokens: StreamTokens | None = None  # events-URL tokens (when the API has a key)
    feedback_tokens: UserTokens | None = None  # signed end-user ids
    feedback_limits: FeedbackLimits | None = None  # the limits of POST /v1/feedback
    #: whether the served retrieval consults the registry (None: not known yet)
    governed: bool | None = None

    def materials(self) -> MaterialRegistry:
        """The material registry kept in the app's store, opened on first use."""
        if self.registry is None:
            self.registry = MaterialRegistry(self.store)
            self.owns_registry = True
        return self.registry


def services(request: Request) -> Services:
    """The app's services."""
    svc: Services = request.app.state.services
    return svc


ServicesDep = Annotated[Services, Depends(services)]


async def store_call(svc: Services, fn: Callable[..., T], *args: Any, **kwargs: Any) -> T:
    """Run a blocking store call off the loop; an outage or a hang becomes 503."""
    try:
        return await asyncio.wait_for(
            asyncio.to_thread(fn, *args, **kwargs), timeout=svc.store_timeout
        )
    except (StoreError, ValueError, LookupError):
        raise
    except asyncio.TimeoutError:
        logger.warning("the audit store did not answer within %.0f s", svc.store_timeout)
        raise ApiError(503, "store_unavailable", "the audit store is not answering") from None
    except Exception as exc:
        logger.warning("the audit store failed: %s: %s", type(exc).__name__, exc)
        raise ApiError(
            503, "store_unavailable", f"the audit store is unavailable ({type(exc).__name__})"
        ) from None


async def desk_call(svc: Services, fn: Callable[..., T], *args: Any, **kwargs: Any) -> T:
    """Run a call on the desk's shared state (sessions, claims, lockout) off the loop; an
    outage or a hang becomes 503."""
    try:
        return await asyncio.wait_for(
            asyncio.to_thread(fn, *args, **kwargs), timeout=svc.store_timeout
        )
    except ApiError:
        raise
    except asyncio.TimeoutError:
        logger.warning("the desk's shared state did not answer within %.0f s", svc.store_timeout)
        raise ApiError(503, "store_unavailable", "the desk's state is not answering") from None
    except Exception as exc:
        raise _desk_down(exc) from None


def desk_now(fn: Callable[..., T], *args: Any, **kwargs: Any) -> T:
    """``desk_call`` for code already off the loop (sync dependencies)."""
    try:
        return fn(*args, **kwargs)
    except ApiError:
        raise
    except Exception as exc:
        raise _desk_down(exc) from None


def _desk_down(exc: BaseException) -> ApiError:
    logger.warning("the desk's shared state failed: %s: %s", type(exc).__name__, exc)
    return ApiError(
        503, "store_unavailable", f"the desk's state is unavailable ({type(exc).__name__})"
    )


# -- frontends --------------------------------------------------------------------------------


def has_api_key(request: Request, svc: Services) -> bool:
    """True when no API key is configured or the request carries it."""
    return svc.api_key is None or same_secret(request.headers.get("x-api-key"), svc.api_key)


def require_api_key(request: Request, svc: ServicesDep) -> None:
    """The frontend API key, when one is configured."""
    if has_api_key(request, svc):
        return
    raise ApiError(401, "unauthorized", "a valid X-API-Key header is required")


def idempotency_key(request: Request) -> str | None:
    """The request's ``Idempotency-Key`` (400 when it cannot be one), or None."""
    key = request.headers.get("idempotency-key")
    if key is None:
        return None
    problem = key_problem(key)
    if problem:
        raise ApiError(400, "bad_request", problem)
    return key


IdempotencyKey = Annotated[str | None, Depends(idempotency_key)]


async def read_body(request: Request, timeout: float) -> bytes:
    """The request body; 408 when the client sends less than it declared and stalls."""
    try:
        return await asyncio.wait_for(request.body(), timeout=timeout)
    except asyncio.TimeoutError:
        raise ApiError(
            408,
            "request_timeout",
            "the request body did not arrive in time (shorter than its Content-Length?)",
            {"Connection": "close"},
        ) from None


def json_depth(text: str) -> int:
    """The deepest nesting of arrays and objects in a JSON text (strings skipped)."""
    depth = deepest = 0
    in_string = escaped = False
    for ch in text:
        if in_string:
            if escaped:
                escaped = False
            elif ch == "\\":
                escaped = True
            elif ch == '"':
                in_string = False
        elif ch == '"':
            in_string = True
        elif ch in "[{":
            depth += 1
            deepest = max(deepest, depth)
        elif ch in "]}":
            depth -= 1
    return deepest


async def json_body(request: Request, svc: ServicesDep) -> Any:
    """The body as JSON: 415 unless ``application/json``, 400 when empty, invalid or too deep."""
    media = request.headers.get("content-type", "").split(";", 1)[0].strip().lower()
    if media != "application/json":
        raise ApiError(
            415,
            "unsupported_media_type",
            "send the body as JSON with 'Content-Type: application/json'",
        )
    raw = await read_body(request, svc.body_timeout)
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError:
        raise ApiError(400, "bad_request", "the request body is not UTF-8") from None
    if not text.strip():
        raise ApiError(400, "bad_request", "the request body is empty; send a JSON object")
    if json_depth(text) > MAX_JSON_DEPTH:
        raise ApiError(400, "bad_request", f"the JSON is nested deeper than {MAX_JSON_DEPTH}")
    try:
        return json.loads(text)
    except (json.JSONDecodeError, RecursionError) as exc:
        raise ApiError(400, "bad_request", f"the request body is not valid JSON: {exc}") from None
    except ValueError:  # an integer longer than Python converts (sys.get_int_max_str_digits())
        raise ApiError(
            400, "bad_request", "the request body holds a number with too many digits"
        ) from None


JsonBody = Annotated[Any, Depends(json_body)]


def validation_detail(exc: ValidationError) -> list[dict[str, Any]]:
    """Pydantic errors as ``{loc, msg, type}`` items (never the input itself)."""
    return [
        {"loc": [str(p) for p in e.get("loc", ())], "msg": e.get("msg"), "type": e.get("type")}
        for e in exc.errors(include_url=False, include_input=False)
    ]


def visible(text: str) -> bool:
    """True when the text has a character a person can see (``tracerag.text.is_invisible``'s
    rule, as the pipeline applies it: the OpenAPI document states the same)."""
    return not is_invisible(text)


def text_problem(name: str, text: str) -> str | None:
    """Why a text field cannot be used, or None."""
    if any(0xD800 <= ord(ch) <= 0xDFFF for ch in text):
        return f"{name} contains a lone UTF-16 surrogate"
    if "\x00" in text:
        return f"{name} contains a NUL character"
    return None


def answer_input(body: JsonBody, svc: ServicesDep) -> dict[str, Any]:
    """A valid answer request as the pipeline's input dict."""
    if not isinstance(body, dict):
        raise ApiError(422, "invalid_input", "the body must be a JSON object with 'question'")
    try:
        parsed = AnswerRequest.model_validate(body)
    except ValidationError as exc:
        raise ApiError(422, "invalid_input", validation_detail(exc)) from None
    data = parsed.model_dump(exclude_none=True)
    texts = [(k, v) for k, v in data.items() if isinstance(v, str)]
    texts += [("chat_history", turn["content"]) for turn in data.get("chat_history", ())]
    for key, value in texts:
        problem = text_problem(key, value)
        if problem:
            raise ApiError(422, "invalid_input", problem)
    question = data["question"]
    if not visible(question):
        raise ApiError(422, "invalid_input", "the question must have visible text")
    limit = svc.answerer.max_question_chars
    if len(question) > limit:
        raise ApiError(
            422,
            "invalid_input",
            f"the question is {len(question)} characters; the limit is {limit}",
        )
    return data


AnswerInput = Annotated[dict[str, Any], Depends(answer_input)]


# -- reviewers --------------------------------------------------------------------------------


def client_of(request: Request) -> str:
    """The address a request came from (the peer; behind a proxy, the proxy)."""
    return request.client.host if request.client else "unknown"


def retry_after_header(wait: float) -> dict[str, str]:
    """``Retry-After`` in whole seconds, at least 1."""
    return {"Retry-After": str(max(1, int(wait + 0.999)))}


def begin_attempt(svc: Services, client: str) -> None:
    """Count a credential check for this client; 429 while it is locked out."""
    assert svc.auth is not None
    wait = desk_now(svc.auth.throttle.attempt, client)
    if wait is not None:
        raise ApiError(
            429,
            "too_many_requests",
            "too many failed sign-ins from this address; try again later",
            retry_after_header(wait),
        )


def credential_failed(svc: Services, client: str, path: str, how: str) -> None:
    """Log a failed credential (already counted by ``begin_attempt``), never the token."""
    assert svc.auth is not None
    try:
        lockout = svc.auth.throttle.retry_after(client)
    except Exception:  # the failure is logged all the same
        lockout = None
    security_log.warning(
        "failed reviewer %s from %s on %s%s",
        how,
        client,
        path,
        f"; locked out for {lockout:.0f} s" if lockout else "",
    )


def optional_reviewer(request: Request, svc: ServicesDep) -> Session | None:
    """The reviewer a request is signed in as (Bearer token or session cookie), or None."""
    auth = svc.auth
    if auth is None:
        raise ApiError(404, "not_found", "the review desk is not enabled")
    header = request.headers.get("authorization")
    if header:
        scheme, _, given = header.partition(" ")
        if scheme.lower() != "bearer":
            return None
        client = client_of(request)
        begin_attempt(svc, client)
        found = auth.identify(given.strip())
        if found is None:
            credential_failed(svc, client, request.url.path, "bearer token")
            return None
        kind, name = found
        desk_now(auth.throttle.succeeded, client)
        if kind == NAMED:
            assert name is not None
            return Session(name, "", "bearer", NAMED)
        # a shared token names nobody: a decision names its reviewer in the JSON body
        return Session(SHARED_BEARER_NAME, "", "bearer", kind)
    value = request.cookies.get(COOKIE_NAME)
    return desk_now(auth.read_cookie, value) if value else None


OptionalReviewer = Annotated[Session | None, Depends(optional_reviewer)]


class SignInRequired(Exception):
    """Raised when a reviewer route is called without a valid session."""

    def __init__(self, api: bool, path: str) -> None:
        super().__init__(path)
        self.api = api
        self.path = path


def reviewer(request: Request, session: OptionalReviewer) -> Session:
    """The signed-in reviewer; 401 (a JSON error or the sign-in page) otherwise."""
    if session is None:
        raise SignInRequired(request.url.path.startswith("/review/api/"), request.url.path)
    return session


Reviewer = Annotated[Session, Depends(reviewer)]


async def form_of(request: Request, svc: Services) -> dict[str, str]:
    """A url-encoded form; 400 when it has too many fields or is not one."""
    raw = await read_body(request, svc.body_timeout)
    body = raw.decode("utf-8", errors="replace")
    try:
        pairs = urllib.parse.parse_qsl(body, keep_blank_values=True, max_num_fields=MAX_FORM_FIELDS)
    except ValueError:
        raise ApiError(400, "bad_request", f"a form has at most {MAX_FORM_FIELDS} fields") from None
    return {k: v for k, v in pairs}
