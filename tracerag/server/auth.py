"""Who may use the review desk and the frontend API.

Reviewers prove the reviewer token (``TRACERAG_REVIEWER_TOKEN``) either on every request
(``Authorization: Bearer <token>``, the reviewer named by ``X-Reviewer``) or once, on the
sign-in form, which sets a signed, HttpOnly, SameSite=Strict session cookie naming the
reviewer. The cookie is signed with a key derived from the token, so changing the token signs
everyone out. Forms posted with the cookie carry a CSRF token bound to that session.

The reviewer's name is what they type when signing in: with one shared token, names are
accountable only as far as the people holding the token are.

Frontends send ``X-API-Key`` when ``TRACERAG_API_KEY`` is configured.
"""

from __future__ import annotations

import base64
import hashlib
import hmac
import json
import re
import secrets
import time
from dataclasses import dataclass

REVIEWER_TOKEN_ENV = "TRACERAG_REVIEWER_TOKEN"
API_KEY_ENV = "TRACERAG_API_KEY"
COOKIE_NAME = "tracerag_review"
MIN_TOKEN_CHARS = 16
SESSION_SECONDS = 12 * 3600
_NAME = re.compile(r"^[\w .@+\-]{1,64}$", re.UNICODE)


def valid_reviewer_name(name: str | None) -> bool:
    """True for a short printable reviewer name (letters, digits, space and ``.@+-_``)."""
    return bool(name) and bool(_NAME.match(name or "")) and bool((name or "").strip())


def same_secret(given: str | None, expected: str) -> bool:
    """Constant-time comparison of a presented secret with the configured one."""
    if not given:
        return False
    return hmac.compare_digest(given.encode("utf-8"), expected.encode("utf-8"))


@dataclass(frozen=True)
class Session:
    """A signed-in reviewer."""

    reviewer: str
    expires: int
    nonce: str
    via: str  # "cookie" or "bearer"


class ReviewerAuth:
    """Checks reviewer credentials and issues session cookies for one reviewer token."""

    def __init__(self, token: str, session_seconds: int = SESSION_SECONDS) -> None:
        self._token = token
        self._key = hashlib.sha256(b"tracerag-review-session\x00" + token.encode("utf-8")).digest()
        self.session_seconds = session_seconds

    def check_token(self, given: str | None) -> bool:
        """True when ``given`` is the reviewer token."""
        return same_secret(given, self._token)

    def _sign(self, data: bytes) -> str:
        return hmac.new(self._key, data, hashlib.sha256).hexdigest()

    def issue(self, reviewer: str, now: float | None = None) -> str:
        """A session cookie value for a reviewer who just proved the token."""
        now = time.time() if now is None else now
        payload = json.dumps(
            {"r": reviewer, "exp": int(now) + self.session_seconds, "n": secrets.token_hex(8)},
            separators=(",", ":"),
            ensure_ascii=False,
        ).encode("utf-8")
        body = base64.urlsafe_b64encode(payload).decode("ascii").rstrip("=")
        return f"{body}.{self._sign(body.encode('ascii'))}"

    def read_cookie(self, value: str | None, now: float | None = None) -> Session | None:
        """The session a cookie value carries, or None if it is absent, forged or expired."""
        if not value or "." not in value:
            return None
        body, _, sig = value.rpartition(".")
        expected = self._sign(body.encode("utf-8", "replace")).encode("ascii")
        if not hmac.compare_digest(sig.encode("utf-8", "replace"), expected):
            return None
        try:
            data = json.loads(base64.urlsafe_b64decode(body + "=" * (-len(body) % 4)))
            reviewer, expires, nonce = str(data["r"]), int(data["exp"]), str(data["n"])
        except (ValueError, KeyError, TypeError):
            return None
        if expires < (time.time() if now is None else now) or not valid_reviewer_name(reviewer):
            return None
        return Session(reviewer, expires, nonce, "cookie")

    def read_bearer(self, header: str | None, reviewer: str | None) -> Session | None:
        """The session of a request that carries the token as ``Authorization: Bearer``."""
        if not header:
            return None
        scheme, _, given = header.partition(" ")
        if scheme.lower() != "bearer" or not self.check_token(given.strip()):
            return None
        name = (reviewer or "").strip() or "api-reviewer"
        if not valid_reviewer_name(name):
            return None
        return Session(name, 0, "", "bearer")

    def csrf_token(self, session: Session) -> str:
        """The CSRF token that forms of this session must carry."""
        return self._sign(f"csrf\x00{session.reviewer}\x00{session.nonce}".encode())

    def check_csrf(self, session: Session, given: str | None) -> bool:
        """True when a form's CSRF token belongs to this session (bearer requests need none)."""
        if session.via == "bearer":
            return True
        return same_secret(given, self.csrf_token(session))
