"""Who may use the review desk and the frontend API.

Reviewer credentials are either named tokens (a file of ``name:sha256:<hex>`` lines, env
``TRACERAG_REVIEWERS_FILE``; the token itself is never stored) — the name recorded with a
decision is then the one the token belongs to — or one shared token
(``TRACERAG_REVIEWER_TOKEN``), with which reviewers name themselves. Both can be configured.

A reviewer proves a token on every request (``Authorization: Bearer <token>``) or once on the
sign-in form, which sets a signed (itsdangerous), HttpOnly, SameSite=Strict session cookie.
Sessions are also kept server-side: signing out revokes the session, so a copied cookie stops
working. Forms posted with the cookie carry a CSRF token bound to the session.

Failed sign-ins and failed Bearer tokens are counted per client address: after a few, the
client is locked out with a growing back-off (429 with ``Retry-After``). A failure is logged
with the client address, never with the token.

Frontends send ``X-API-Key`` when ``TRACERAG_API_KEY`` is configured.
"""

from __future__ import annotations

import hmac
import logging
import secrets
import threading
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path

from itsdangerous import BadSignature, Signer, URLSafeTimedSerializer

from tracerag.identity import hash_token as _hash_token
from tracerag.identity import read_token_file, token_owner, valid_name

REVIEWER_TOKEN_ENV = "TRACERAG_REVIEWER_TOKEN"
REVIEWERS_FILE_ENV = "TRACERAG_REVIEWERS_FILE"
API_KEY_ENV = "TRACERAG_API_KEY"
COOKIE_NAME = "tracerag_review"
MIN_TOKEN_CHARS = 16
MIN_DISTINCT_CHARS = 6
SESSION_SECONDS = 12 * 3600
SHARED = "shared"
NAMED = "named"

security_log = logging.getLogger("tracerag.server.security")


def valid_reviewer_name(name: str | None) -> bool:
    """True for a short printable reviewer name (letters of any script, digits, ``.@+-_``)."""
    return valid_name(name)


def token_problem(token: str) -> str | None:
    """Why a token is too weak to guard the desk, or None when it is acceptable."""
    if len(token) < MIN_TOKEN_CHARS:
        return f"a token must have at least {MIN_TOKEN_CHARS} characters"
    if len(set(token)) < MIN_DISTINCT_CHARS:
        return f"a token must use at least {MIN_DISTINCT_CHARS} different characters"
    return None


GENERATE_HINT = "generate one with: python -c 'import secrets; print(secrets.token_urlsafe(32))'"


def hash_token(token: str) -> str:
    """The at-rest form of a reviewer token (``sha256:<hex>``) for the reviewers file."""
    return _hash_token(token)


def same_secret(given: str | None, expected: str) -> bool:
    """Constant-time comparison of a presented secret with the configured one."""
    if not given:
        return False
    return hmac.compare_digest(given.encode("utf-8"), expected.encode("utf-8"))


def read_reviewers_file(path: str | Path) -> dict[str, str]:
    """``name -> sha256:<hex>`` from a file of ``name:sha256:<hex>`` lines (``#`` comments)."""
    return read_token_file(path)


@dataclass(frozen=True)
class Session:
    """A signed-in reviewer."""

    reviewer: str
    sid: str
    via: str  # "cookie" or "bearer"
    kind: str = SHARED  # NAMED: the token names the reviewer; SHARED: self-declared name
    expires: float = 0.0


@dataclass
class _Client:
    failures: int = 0
    first: float = 0.0
    locked_until: float = 0.0


class Throttle:
    """Counts failed credentials per client and locks a client out with a growing back-off.

    ``free`` failures within ``window`` seconds cost nothing; each one after that locks the
    client out for ``base * 2**k`` seconds (k = failures beyond ``free``), at most ``cap``.
    """

    def __init__(
        self,
        free: int = 5,
        window: float = 900.0,
        base: float = 1.0,
        cap: float = 900.0,
        clock: Callable[[], float] = time.monotonic,
        max_clients: int = 100_000,
    ) -> None:
        self.free, self.window, self.base, self.cap = free, window, base, cap
        self.clock = clock
        self.max_clients = max_clients
        self._clients: dict[str, _Client] = {}
        self._lock = threading.Lock()

    def retry_after(self, client: str) -> float | None:
        """Seconds until this client may try again, or None when it may try now."""
        now = self.clock()
        with self._lock:
            state = self._clients.get(client)
            if state is None or state.locked_until <= now:
                return None
            return state.locked_until - now

    def failed(self, client: str) -> float | None:
        """Count a failure; the lockout it starts, in seconds, or None."""
        with self._lock:
            return self._count(client, self.clock())

    def attempt(self, client: str) -> float | None:
        """Start a credential check: the wait (seconds) while locked out, else None.

        The attempt is counted as a failure at once, in the same step as the check, so
        concurrent guesses cannot all pass the check before any is counted; ``succeeded``
        clears the count when the credential proves right.
        """
        now = self.clock()
        with self._lock:
            state = self._clients.get(client)
            if state is not None and state.locked_until > now:
                return state.locked_until - now
            self._count(client, now)
            return None

    def _count(self, client: str, now: float) -> float | None:
        if len(self._clients) >= self.max_clients and client not in self._clients:
            self._prune(now)
        state = self._clients.setdefault(client, _Client(first=now))
        if now - state.first > self.window and state.locked_until <= now:
            state.failures, state.first = 0, now
        state.failures += 1
        over = state.failures - self.free
        if over <= 0:
            return None
        lockout = min(self.cap, self.base * 2 ** (over - 1))
        state.locked_until = now + lockout
        return lockout

    def succeeded(self, client: str) -> None:
        """Forget a client's failures."""
        with self._lock:
            self._clients.pop(client, None)

    def _prune(self, now: float) -> None:
        stale = [
            k
            for k, s in self._clients.items()
            if s.locked_until <= now and now - s.first > self.window
        ]
        for k in stale or list(self._clients)[: len(self._clients) // 2]:
            del self._clients[k]


@dataclass
class ReviewerAuth:
    """Checks reviewer tokens, issues and revokes sessions, and makes CSRF tokens."""

    shared_token: str | None = None
    reviewers: Mapping[str, str] = field(default_factory=dict)
    session_seconds: int = SESSION_SECONDS
    throttle: Throttle = field(default_factory=Throttle)
    secret: bytes = field(default_factory=lambda: secrets.token_bytes(32))
    clock: Callable[[], float] = time.time

    def __post_init__(self) -> None:
        if not self.shared_token and not self.reviewers:
            raise ValueError("no reviewer credentials configured")
        if self.shared_token:
            problem = token_problem(self.shared_token)
            if problem:
                raise ValueError(f"the reviewer token is too weak: {problem}; {GENERATE_HINT}")
        self._serializer = URLSafeTimedSerializer(self.secret, salt="tracerag-review-session")
        self._csrf = Signer(self.secret, salt="tracerag-review-csrf")
        self._sessions: dict[str, Session] = {}
        self._lock = threading.Lock()

    def identify(self, given: str | None) -> tuple[str, str | None] | None:
        """``(NAMED, name)`` or ``(SHARED, None)`` for a valid token; None otherwise."""
        if not given:
            return None
        found = token_owner(given, self.reviewers)  # every entry is compared: no early exit
        if found is not None:
            return NAMED, found
        if self.shared_token and same_secret(given, self.shared_token):
            return SHARED, None
        return None

    # -- sessions -----------------------------------------------------------------------------
    def issue(self, reviewer: str, kind: str) -> str:
        """Start a session; the cookie value that carries it."""
        sid = secrets.token_urlsafe(16)
        session = Session(reviewer, sid, "cookie", kind, self.clock() + self.session_seconds)
        with self._lock:
            now = self.clock()
            for old in [k for k, s in self._sessions.items() if s.expires < now]:
                del self._sessions[old]
            self._sessions[sid] = session
        return self._serializer.dumps({"sid": sid})

    def read_cookie(self, value: str | None) -> Session | None:
        """The live session a cookie names, or None (absent, forged, expired or revoked)."""
        if not value:
            return None
        try:
            data = self._serializer.loads(value, max_age=self.session_seconds)
            sid = str(data["sid"])
        except (BadSignature, KeyError, TypeError, ValueError):
            return None
        with self._lock:
            session = self._sessions.get(sid)
        if session is None or session.expires < self.clock():
            return None
        return session

    def revoke(self, session: Session) -> None:
        """End a session now: its cookie is refused from here on."""
        with self._lock:
            self._sessions.pop(session.sid, None)

    @property
    def live_sessions(self) -> int:
        with self._lock:
            return len(self._sessions)

    # -- CSRF ---------------------------------------------------------------------------------
    def csrf_token(self, session: Session) -> str:
        """The CSRF token that forms of this session must carry."""
        return self._csrf.get_signature(session.sid).decode("ascii")

    def check_csrf(self, session: Session, given: str | None) -> bool:
        """True when a form's CSRF token belongs to this session (bearer requests need none)."""
        if session.via == "bearer":
            return True
        return same_secret(given, self.csrf_token(session))
