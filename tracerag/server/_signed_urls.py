"""Event-stream tokens: what a browser's ``EventSource`` shows instead of the API key.

``EventSource`` cannot send headers, so a page cannot give ``X-API-Key`` (and must not hold
it). The backend that holds the key starts a request (``POST /v1/requests``) and hands the
page the ``events_url`` it gets back: it carries a token good for reading the events of that
one request, until it expires. A URL ends up in logs (proxies, the browser's history); what
such a log line gives away is read access to one request's caller view for the token's life,
never the key, never another request, never a way to ask a question.

A token is ``<expiry>.<signature>``: HMAC-SHA256 over the request id and the expiry, with a
key derived from the API key, so every replica sharing the API key accepts it and changing
the API key revokes every token.
"""

from __future__ import annotations

import hashlib
import hmac
import time

#: seconds an events URL is good for, by default
DEFAULT_TOKEN_SECONDS = 3600.0
_CONTEXT = b"tracerag events token v1\x00"


class StreamTokens:
    """Makes and checks the tokens of one API key."""

    def __init__(self, api_key: str, seconds: float = DEFAULT_TOKEN_SECONDS) -> None:
        self._key = hmac.new(api_key.encode("utf-8"), _CONTEXT, hashlib.sha256).digest()
        self.seconds = seconds

    def _sign(self, request_id: str, expires: int) -> str:
        message = f"{request_id}\x00{expires}".encode()
        return hmac.new(self._key, message, hashlib.sha256).hexdigest()

    def make(self, request_id: str, now: float | None = None) -> tuple[str, int]:
        """A token for the events of ``request_id`` and when it expires (epoch seconds)."""
        expires = int((time.time() if now is None else now) + self.seconds)
        return f"{expires}.{self._sign(request_id, expires)}", expires

    def check(self, request_id: str, token: str, now: float | None = None) -> bool:
        """True when ``token`` was made for ``request_id`` and has not expired."""
        expiry, dot, signature = token.partition(".")
        if not (dot and token.isascii() and expiry.isdigit() and len(expiry) <= 12):
            return False
        expires = int(expiry)
        if expires <= (time.time() if now is None else now):
            return False
        return hmac.compare_digest(signature, self._sign(request_id, expires))
