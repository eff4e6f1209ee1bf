"""How ``tracerag serve`` runs uvicorn: whom it believes about client addresses, and the error
shape of requests its HTTP parser refuses.

- **Forwarded headers.** uvicorn believes ``X-Forwarded-For`` / ``X-Forwarded-Proto`` from
  127.0.0.1 by default, so any local caller could name its own address (and so dodge the
  sign-in lockout, which counts failures per address, and write made-up addresses to the log).
  tracerag believes them only from the proxies it is told of (``--forwarded-allow-ips`` or
  ``TRACERAG_FORWARDED_ALLOW_IPS``: addresses, networks, or ``*``); otherwise the client is the
  TCP peer.
- **Malformed HTTP.** A request uvicorn's parser (h11, or httptools when installed) refuses — a
  malformed ``Content-Length``, request line or header — never reaches the app; uvicorn answers
  it with a plain-text 400. The protocol class given to uvicorn answers it in the server's JSON
  error shape, with the security headers, and closes the connection (uvicorn logs one line).
"""

from __future__ import annotations

import json
from typing import Any

from tracerag.config import get_config
from tracerag.server._error_shape import SECURITY_HEADERS

__all__ = ["MALFORMED_DETAIL", "json_error_protocol", "trusted_proxies", "uvicorn_options"]

MALFORMED_DETAIL = (
    "the HTTP request is malformed (request line, a header, or Content-Length) and was not read"
)


def trusted_proxies(value: str | None = None) -> str:
    """The proxies whose forwarded headers are believed (``""``: none)."""
    if value is None:
        value = get_config().forwarded_allow_ips or ""
    return ",".join(part.strip() for part in value.split(",") if part.strip())


def _bad_request_bytes() -> bytes:
    body = json.dumps({"error": "bad_request", "detail": MALFORMED_DETAIL}).encode("ascii")
    lines = [
        b"HTTP/1.1 400 Bad Request",
        b"content-type: application/json",
        b"content-length: " + str(len(body)).encode("ascii"),
        b"connection: close",
        *(f"{k.lower()}: {v}".encode("latin-1") for k, v in SECURITY_HEADERS.items()),
    ]
    return b"\r\n".join(lines) + b"\r\n\r\n" + body


_PROTOCOL: type | None = None


def json_error_protocol() -> type:
    """uvicorn's HTTP protocol (httptools when installed, else h11), answering the requests
    its parser refuses in the JSON error shape."""
    global _PROTOCOL
    if _PROTOCOL is not None:
        return _PROTOCOL
    import importlib.util

    base: type
    if importlib.util.find_spec("httptools") is not None:  # what uvicorn's "auto" picks
        from uvicorn.protocols.http.httptools_impl import HttpToolsProtocol

        base = HttpToolsProtocol
    else:
        from uvicorn.protocols.http.h11_impl import H11Protocol

        base = H11Protocol

    response = _bad_request_bytes()

    def send_400_response(self: Any, msg: str) -> None:
        self.transport.write(response)
        self.transport.close()

    _PROTOCOL = type("JsonErrorProtocol", (base,), {"send_400_response": send_400_response})
    return _PROTOCOL


def uvicorn_options(forwarded_allow_ips: str | None = None) -> dict[str, Any]:
    """Keyword arguments for ``uvicorn.run`` / ``uvicorn.Config``."""
    trusted = trusted_proxies(forwarded_allow_ips)
    return {
        "proxy_headers": bool(trusted),
        "forwarded_allow_ips": trusted or None,
        "http": json_error_protocol(),
    }
