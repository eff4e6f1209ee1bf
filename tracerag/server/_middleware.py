"""The server's ASGI middleware: security headers, the declared body limit, CORS for /v1."""

from __future__ import annotations

from starlette.middleware.cors import CORSMiddleware
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from tracerag.server._error_shape import SECURITY_HEADERS, problem

CORS_HEADERS = [
    "Content-Type",
    "X-API-Key",
    "traceparent",
    "tracestate",
    "Last-Event-ID",
    "Idempotency-Key",
]
EXPOSED_HEADERS = ["X-Request-Id", "Idempotency-Replayed", "Location"]


class SecurityHeaders:
    """Adds the Content-Security-Policy and related headers to every response."""

    def __init__(self, app: ASGIApp) -> None:
        self.app = app
        self.headers = [(k.lower().encode(), v.encode()) for k, v in SECURITY_HEADERS.items()]

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        review = scope.get("path", "").startswith("/review")

        async def wrapped(message: Message) -> None:
            if message["type"] == "http.response.start":
                headers = list(message.get("headers") or [])
                present = {k.lower() for k, _ in headers}
                headers += [(k, v) for k, v in self.headers if k not in present]
                if review:
                    headers.append((b"cache-control", b"no-store"))
                message = {**message, "headers": headers}
            await send(message)

        await self.app(scope, receive, wrapped)


class DeclaredBodyLimit:
    """Answers a declared ``Content-Length`` over the limit with the JSON 413 at once.

    Bodies without a declared length are counted as they stream in by Starlette's
    ``RequestBodyLimitMiddleware`` (inside this one), whose 413 goes through the error handlers.
    """

    def __init__(self, app: ASGIApp, limit: int) -> None:
        self.app = app
        self.limit = limit

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] == "http":
            declared = dict(scope.get("headers") or []).get(b"content-length")
            status = None
            if declared is not None:
                try:
                    status = 413 if int(declared) > self.limit else None
                except ValueError:
                    status = 400
            if status is not None:
                detail = (
                    f"request body over {self.limit} bytes"
                    if status == 413
                    else "invalid Content-Length"
                )
                response = problem(
                    status,
                    "request_too_large" if status == 413 else "bad_request",
                    detail,
                    {"Connection": "close"},
                )
                await response(scope, receive, send)
                return
        await self.app(scope, receive, send)


class ApiCors:
    """CORS for the frontend API only (``/v1/...``): the desk is never reachable cross-origin."""

    def __init__(self, app: ASGIApp, origins: list[str]) -> None:
        self.app = app
        self.cors = CORSMiddleware(
            app,
            allow_origins=origins,
            allow_methods=["GET", "POST"],
            allow_headers=CORS_HEADERS,
            expose_headers=EXPOSED_HEADERS,
            allow_credentials=False,
            max_age=600,
        )

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] == "http" and scope.get("path", "").startswith("/v1/"):
            await self.cors(scope, receive, send)
        else:
            await self.app(scope, receive, send)
