"""One error shape for every error the server sends: ``{"error": code, "detail": ...}``.

``ApiError`` is raised by routes and dependencies; the handlers installed by
``install_handlers`` turn it, a ``TraceragError`` no route answered (by ``error_statuses``:
the status of the nearest class the table names), FastAPI's own 404/405/413/422 and any
unexpected exception into that shape, with the security headers (a 500 is sent outside the
middleware stack, so it carries them itself).
"""

from __future__ import annotations

import functools
import logging
from typing import Any, Literal, get_args

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse
from pydantic import BaseModel, Field
from starlette.exceptions import HTTPException as StarletteHTTPException

from tracerag import errors as tracerag_errors
from tracerag.errors import TraceragError
from tracerag.materials import (
    ConcurrentChange,
    DuplicateFeedback,
    FeedbackLimited,
    InvalidTransition,
    MaterialNotFound,
    MaterialStoreError,
)
from tracerag.server._desk_db import DeskStateError
from tracerag.server._run_book import KeyReused
from tracerag.server._run_table import RunTableError
from tracerag.store import (
    AlreadyDecided,
    AlreadyReviewed,
    ClaimedByOther,
    DuplicateRequest,
    InvalidRecord,
    NotQueued,
    RequestNotFound,
    StoreError,
)

logger = logging.getLogger("tracerag.server")

CONTENT_SECURITY_POLICY = (
    "default-src 'none'; style-src 'self'; img-src 'self'; form-action 'self'; "
    "frame-ancestors 'none'; base-uri 'none'"
)
SECURITY_HEADERS: dict[str, str] = {
    "Content-Security-Policy": CONTENT_SECURITY_POLICY,
    "X-Content-Type-Options": "nosniff",
    # no referrer to another site; this site's own forms keep their Origin (with no-referrer a
    # browser sends ``Origin: null`` on a same-origin POST, and sign-in refuses a null Origin)
    "Referrer-Policy": "same-origin",
    "X-Frame-Options": "DENY",
}

#: Every code the ``error`` field of an error response can hold (the OpenAPI document's enum).
ErrorCode = Literal[
    "bad_request",
    "unauthorized",
    "forbidden",
    "not_found",
    "method_not_allowed",
    "request_timeout",
    "conflict",
    "duplicate",
    "idempotency_key_reused",
    "request_too_large",
    "unsupported_media_type",
    "invalid_input",
    "too_many_requests",
    "internal_error",
    "pipeline_failed",
    "request_unfinished",
    "store_unavailable",
    "no_registry",
    "unavailable",
    "error",
]
ERROR_CODES: tuple[str, ...] = get_args(ErrorCode)

# HTTP status -> the error code sent when nothing more specific is known
CODES: dict[int, ErrorCode] = {
    400: "bad_request",
    401: "unauthorized",
    403: "forbidden",
    404: "not_found",
    405: "method_not_allowed",
    408: "request_timeout",
    409: "conflict",
    413: "request_too_large",
    415: "unsupported_media_type",
    422: "invalid_input",
    429: "too_many_requests",
    500: "internal_error",
    503: "unavailable",
}


class Problem(BaseModel):
    """Every error response of the server."""

    error: ErrorCode = Field(
        description="A stable machine-readable code: `invalid_input` (422: the body or a "
        "field is wrong), `bad_request` (400), `unauthorized` (401), `forbidden` (403), "
        "`not_found` (404), `method_not_allowed` (405), `request_timeout` (408), `conflict` "
        "(409: decided already, claimed by another reviewer, or a resume names another "
        "question), `duplicate` (409: this user already gave feedback on the request), "
        "`idempotency_key_reused` (422: the Idempotency-Key was used for another question), "
        "`request_too_large` (413), `unsupported_media_type` (415), `too_many_requests` "
        "(429), `pipeline_failed` and `internal_error` (500), `store_unavailable` and "
        "`unavailable` (503), `no_registry` (503: this store holds no material registry), "
        "`request_unfinished` (a stream's `error` event: the replica "
        "running the request stopped before it finished); `error` for any other status."
    )
    detail: Any = Field(
        description="What went wrong, for people: a sentence, or for invalid_input a list of "
        "{loc, msg, type} items."
    )


class ApiError(Exception):
    """An error answered with ``status`` and the error shape."""

    def __init__(
        self, status: int, error: ErrorCode, detail: Any, headers: dict[str, str] | None = None
    ) -> None:
        super().__init__(f"{status} {error}: {detail}")
        self.status = status
        self.error = error
        self.detail = detail
        self.headers = headers or {}


#: the longest text an error echoes (a caller's id, path or field name is cut past it)
MAX_DETAIL_CHARS = 200


def bounded(value: Any, limit: int = MAX_DETAIL_CHARS) -> Any:
    """``value`` with every text in it cut to ``limit`` characters (a hostile caller's 60 KB id
    is not echoed back, nor logged)."""
    if isinstance(value, str):
        if len(value) <= limit:
            return value
        return f"{value[:limit]}…[{len(value) - limit} more characters]"
    if isinstance(value, dict):
        return {bounded(k, limit): bounded(v, limit) for k, v in list(value.items())[:50]}
    if isinstance(value, (list, tuple)):
        return [bounded(v, limit) for v in list(value)[:50]]
    return value


def problem(
    status: int, error: ErrorCode, detail: Any, headers: dict[str, str] | None = None
) -> JSONResponse:
    """A JSON error response in the server's error shape (texts in ``detail`` bounded)."""
    return JSONResponse(
        {"error": error, "detail": bounded(detail)}, status_code=status, headers=headers or None
    )


def error_responses(*statuses: int) -> dict[int | str, dict[str, Any]]:
    """OpenAPI ``responses`` entries for these statuses, all with the error schema."""
    return {
        s: {"model": Problem, "description": CODES.get(s, "error").replace("_", " ")}
        for s in statuses
    }


@functools.cache
def error_statuses() -> dict[type[TraceragError], tuple[int, ErrorCode]]:
    """The status and code the server answers for a ``TraceragError`` no route answered.

    An error takes the entry of the nearest class in its MRO: a request's fault is a 4xx, a
    store that cannot be used a 503, a pipeline or a setting of the server's own a 500.
    """
    return {
        tracerag_errors.TraceragError: (500, "internal_error"),
        tracerag_errors.InputError: (422, "invalid_input"),
        tracerag_errors.ConfigurationError: (500, "internal_error"),
        tracerag_errors.AuthenticationError: (401, "unauthorized"),
        tracerag_errors.ContractError: (500, "internal_error"),
        tracerag_errors.PlanError: (500, "pipeline_failed"),
        tracerag_errors.CallError: (500, "pipeline_failed"),
        StoreError: (503, "store_unavailable"),
        RequestNotFound: (404, "not_found"),
        NotQueued: (404, "not_found"),
        DuplicateRequest: (409, "conflict"),
        AlreadyDecided: (409, "conflict"),
        ClaimedByOther: (409, "conflict"),
        AlreadyReviewed: (409, "conflict"),
        InvalidRecord: (422, "invalid_input"),
        MaterialStoreError: (503, "store_unavailable"),
        MaterialNotFound: (404, "not_found"),
        ConcurrentChange: (409, "conflict"),
        InvalidTransition: (422, "invalid_input"),
        DuplicateFeedback: (409, "duplicate"),
        FeedbackLimited: (429, "too_many_requests"),
        KeyReused: (422, "idempotency_key_reused"),
        RunTableError: (503, "store_unavailable"),
        DeskStateError: (503, "store_unavailable"),
    }


def status_of(error: TraceragError) -> tuple[int, ErrorCode]:
    """What the server answers for this error (``error_statuses``)."""
    table = error_statuses()
    for cls in type(error).__mro__:
        if cls in table:
            return table[cls]
    return table[TraceragError]


def _validation_detail(errors: Any) -> list[dict[str, Any]]:
    out = []
    for e in errors:
        out.append(
            {
                "loc": [str(p) for p in e.get("loc", ())],
                "msg": str(e.get("msg")),
                "type": str(e.get("type")),
            }
        )
    return out


def install_handlers(app: FastAPI) -> None:
    """Send every error in the error shape."""

    @app.exception_handler(ApiError)
    async def _api_error(request: Request, exc: ApiError) -> JSONResponse:
        return problem(exc.status, exc.error, exc.detail, exc.headers)

    @app.exception_handler(TraceragError)
    async def _tracerag_error(request: Request, exc: TraceragError) -> JSONResponse:
        status, code = status_of(exc)
        if status >= 500:  # the server's own failure: what, not why (that is in the log)
            logger.error(
                "%s on %s %s: %s",
                type(exc).__name__,
                request.method,
                bounded(request.url.path),
                bounded(str(exc)),
                exc_info=exc,
            )
            detail = type(exc).__name__
        else:
            detail = str(exc)
        retry_after = getattr(exc, "retry_after", None)
        headers = None
        if isinstance(retry_after, (int, float)) and status == 429:
            headers = {"Retry-After": str(max(1, int(retry_after + 0.999)))}
        return problem(status, code, detail, headers)

    @app.exception_handler(StarletteHTTPException)
    async def _http_error(request: Request, exc: StarletteHTTPException) -> JSONResponse:
        code = CODES.get(exc.status_code, "error")
        detail = exc.detail
        if exc.status_code == 404 and detail == "Not Found":
            detail = f"no route {bounded(request.url.path)}"
        elif exc.status_code == 405:
            detail = f"{request.method} is not allowed on {bounded(request.url.path)}"
        return problem(exc.status_code, code, detail, dict(exc.headers or {}))

    @app.exception_handler(RequestValidationError)
    async def _invalid(request: Request, exc: RequestValidationError) -> JSONResponse:
        return problem(422, "invalid_input", _validation_detail(exc.errors()))

    @app.exception_handler(RecursionError)
    async def _too_deep(request: Request, exc: RecursionError) -> JSONResponse:
        return problem(400, "bad_request", "the input is nested too deeply")

    @app.exception_handler(Exception)
    async def _unexpected(request: Request, exc: Exception) -> JSONResponse:
        # One line here; the server logs the traceback once when the exception reaches it
        # (Starlette raises it on after this response is sent).
        logger.error(
            "unhandled %s on %s %s",
            type(exc).__name__,
            request.method,
            bounded(request.url.path),
        )
        return problem(500, "internal_error", type(exc).__name__, SECURITY_HEADERS)
