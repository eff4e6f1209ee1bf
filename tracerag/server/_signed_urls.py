"""Signed events URLs: what a browser's ``EventSource`` shows instead of the API key.

``EventSource`` cannot send headers, so a page cannot give ``X-API-Key`` (and must not hold
it). The backend that holds the key starts a request (``POST /v1/requests``) and hands the
page the ``events_url`` it gets back: it carries a token good for reading the events of that
one request, until it expires. A URL ends up in logs (proxies, the browser's history); what
such a log line gives away is read access to one request's caller view for the token's life,
never the key, never another request, never a way to ask a question.

A token is itsdangerous's ``TimestampSigner`` signature of the request id without the id
itself: ``<timestamp>.<signature>`` (HMAC-SHA256, keyed by the API key), checked in constant
time against the request id of the URL and refused once its life is over. Every replica
sharing the API key accepts it, and changing the API key revokes every token.
"""

from __future__ import annotations

import hashlib
import time

from itsdangerous import BadSignature, TimestampSigner

#: seconds an events URL is good for, by default
DEFAULT_TOKEN_SECONDS = 3600.0
_SALT = "tracerag events token v2"
_MAX_TOKEN_CHARS = 200


class _SignerAt(TimestampSigner):
    """A signer whose clock reads ``at`` (a token made or checked at a given time)."""

    def __init__(self, key: str, at: float) -> None:
        super().__init__(key, salt=_SALT, digest_method=hashlib.sha256)
        self.at = int(at)

    def get_timestamp(self) -> int:
        return self.at


class StreamTokens:
    """Makes and checks the events-URL tokens of one API key."""

    def __init__(self, api_key: str, seconds: float = DEFAULT_TOKEN_SECONDS) -> None:
        self._key = api_key
        self.seconds = seconds

    def _signer(self, now: float | None) -> TimestampSigner:
        return _SignerAt(self._key, time.time() if now is None else now)

    def make(self, request_id: str, now: float | None = None) -> tuple[str, int]:
        """A token for the events of ``request_id`` and when it expires (epoch seconds)."""
        signer = self._signer(now)
        signed = signer.sign(request_id).decode("ascii")
        token = signed[len(request_id) + 1 :]  # the URL names the request: the token does not
        return token, int(signer.get_timestamp() + self.seconds)

    def check(self, request_id: str, token: str, now: float | None = None) -> bool:
        """True when ``token`` was made for ``request_id`` and has not expired. A token signed
        by a replica whose clock runs ahead is taken, as its expiry is what counts."""
        if not (token.isascii() and len(token) <= _MAX_TOKEN_CHARS and token.count(".") == 1):
            return False
        try:
            value, signed = self._signer(now).unsign(f"{request_id}.{token}", return_timestamp=True)
        except BadSignature:  # a wrong signature, another key's or another request's
            return False
        expires = signed.timestamp() + self.seconds
        return value == request_id.encode("utf-8") and expires > (
            time.time() if now is None else now
        )


__all__ = ["DEFAULT_TOKEN_SECONDS", "StreamTokens"]
