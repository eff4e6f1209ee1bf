"""Who may use the review desk and the frontend API.

Reviewer credentials are either named tokens (a file of ``name:sha256:<hex>`` lines, env
``TRACERAG_REVIEWERS_FILE``; the token itself is never stored) — the name recorded with a
decision is then the one the token belongs to — or one shared token
(``TRACERAG_REVIEWER_TOKEN``), with which reviewers name themselves. Both can be configured.

A reviewer proves a token on every request (``Authorization: Bearer <token>``) or once on the
sign-in form, which sets a signed (itsdangerous), HttpOnly, SameSite=Strict session cookie.
Sessions are also kept server-side: signing out revokes the session, so a copied cookie stops
working. Forms posted with the cookie carry a CSRF token bound to the session. The sign-in form
itself carries one bound to a nonce in a SameSite=Strict cookie set with the form
(``signin_csrf``), and a sign-in whose ``Origin`` is another site is refused: a cross-site form
cannot sign a victim's browser in as the attacker (login CSRF).

Failed sign-ins and failed Bearer tokens are counted per client address: the ``free``-th
failure (5 by default) locks the client out, then each further one for twice as long (429 with
``Retry-After``). A failure is logged with the client address, never with the token.

Sessions and the failure counts live in the audit store's database when it has one
(``SharedSessions``, ``SharedThrottle`` over ``tracerag.server._desk_db``), so every server
process on that store honours the same sessions and the same lockout; otherwise in this process
(``MemorySessions``, ``Throttle``). The cookie's signing key and the key under which session
ids are stored are derived from the desk's credentials (or ``session_secret``), never stored:
every process configured alike shares them, a row written into the database opens no session,
and changing the credentials ends every session.

Frontends send ``X-API-Key`` when ``TRACERAG_API_KEY`` is configured.
"""

from __future__ import annotations

import hashlib
import hmac
import logging
import secrets
import threading
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, Protocol

from itsdangerous import BadSignature, URLSafeTimedSerializer

from tracerag._identity import hash_token as _hash_token
from tracerag._identity import read_token_file, token_owner, valid_name
from tracerag.errors import ConfigurationError

if TYPE_CHECKING:
    from tracerag.server._desk_db import DeskDB

REVIEWER_TOKEN_ENV = "TRACERAG_REVIEWER_TOKEN"
REVIEWERS_FILE_ENV = "TRACERAG_REVIEWERS_FILE"
API_KEY_ENV = "TRACERAG_API_KEY"
COOKIE_NAME = "tracerag_review"
#: the sign-in form's nonce (its CSRF token is an HMAC of it): SameSite=Strict, the form's path
SIGNIN_COOKIE = "tracerag_signin"
SIGNIN_PATH = "/review/signin"
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
    return hmac.compare_digest(
        given.encode("utf-8", "surrogatepass"), expected.encode("utf-8", "surrogatepass")
    )


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
    #: the session's key in the session book (an HMAC of ``sid``); claims taken in this
    #: session carry it, so signing out releases them
    key: str = ""


# -- the failure count ----------------------------------------------------------------------


@dataclass
class _Client:
    failures: int = 0
    first: float = 0.0
    locked_until: float = 0.0


@dataclass(frozen=True)
class BackOff:
    """The lockout rule: after ``free`` failures within ``window`` seconds the client is locked
    out — the ``free``-th failure locks it for ``base`` seconds, each one after that for
    ``base * 2**k`` (k = failures beyond ``free``), at most ``cap``. So ``free`` wrong tokens
    are answered, and the next try within the lockout is refused (429)."""

    free: int = 5
    window: float = 900.0
    base: float = 1.0
    cap: float = 900.0

    def count(self, state: _Client, now: float) -> float | None:
        """Count one failure on ``state`` (changed in place); the lockout it starts, or None."""
        if now - state.first > self.window and state.locked_until <= now:
            state.failures, state.first = 0, now
        state.failures += 1
        over = state.failures - self.free
        if over < 0:
            return None
        lockout = min(self.cap, self.base * 2.0**over)
        state.locked_until = now + lockout
        return lockout


class Throttle:
    """Counts failed credentials per client in this process and locks a client out with a
    growing back-off (see ``BackOff``)."""

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

    @property
    def rule(self) -> BackOff:
        return BackOff(self.free, self.window, self.base, self.cap)

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
        return self.rule.count(state, now)

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


class SharedThrottle(Throttle):
    """The same count in the desk's tables, shared by every server process on the store.

    Each step is one short transaction (the client's row locked), so concurrent guesses
    through several processes are counted one by one, as in one process. Times are wall-clock
    seconds (``time.time``): keep the machines' clocks in sync (NTP).
    """

    def __init__(
        self,
        db: DeskDB,
        free: int = 5,
        window: float = 900.0,
        base: float = 1.0,
        cap: float = 900.0,
        clock: Callable[[], float] = time.time,
    ) -> None:
        super().__init__(free, window, base, cap, clock)
        self.db = db
        self._calls = 0

    def _locked_row(self, cur: Any, client: str, now: float) -> _Client:
        cur.execute(
            "INSERT INTO desk_throttle (client, failures, first_at, locked_until) "
            "VALUES (%s, 0, %s, 0) ON CONFLICT (client) DO NOTHING",
            (client, now),
        )
        lock = " FOR UPDATE" if self.db.dialect == "postgres" else ""
        cur.execute(
            "SELECT failures, first_at, locked_until FROM desk_throttle WHERE client = %s" + lock,
            (client,),
        )
        row = cur.fetchone()
        return _Client(int(row[0]), float(row[1]), float(row[2]))

    @staticmethod
    def _save(cur: Any, client: str, state: _Client) -> None:
        cur.execute(
            "UPDATE desk_throttle SET failures = %s, first_at = %s, locked_until = %s "
            "WHERE client = %s",
            (state.failures, state.first, state.locked_until, client),
        )

    def retry_after(self, client: str) -> float | None:
        now = self.clock()
        with self.db.read() as cur:
            cur.execute("SELECT locked_until FROM desk_throttle WHERE client = %s", (client,))
            row = cur.fetchone()
        if row is None or float(row[0]) <= now:
            return None
        return float(row[0]) - now

    def failed(self, client: str) -> float | None:
        now = self.clock()
        with self.db.write() as cur:
            state = self._locked_row(cur, client, now)
            lockout = self.rule.count(state, now)
            self._save(cur, client, state)
        return lockout

    def attempt(self, client: str) -> float | None:
        now = self.clock()
        self._calls += 1
        with self.db.write() as cur:
            if self._calls % 1000 == 0:
                self._prune_rows(cur, now)
            state = self._locked_row(cur, client, now)
            if state.locked_until > now:
                return state.locked_until - now
            self.rule.count(state, now)
            self._save(cur, client, state)
        return None

    def succeeded(self, client: str) -> None:
        with self.db.write() as cur:
            cur.execute("DELETE FROM desk_throttle WHERE client = %s", (client,))

    def _prune_rows(self, cur: Any, now: float) -> None:
        cur.execute(
            "DELETE FROM desk_throttle WHERE locked_until <= %s AND first_at < %s",
            (now, now - self.window),
        )


# -- sessions -------------------------------------------------------------------------------


class SessionBook(Protocol):
    """Where live sessions are kept, by key (an HMAC of the session id)."""

    def add(self, key: str, reviewer: str, kind: str, expires: float, now: float) -> None: ...

    def find(self, key: str, now: float) -> tuple[str, str, float] | None:
        """``(reviewer, kind, expires)`` of a live session."""
        ...

    def remove(self, key: str) -> None: ...

    def live(self, now: float) -> int: ...


class MemorySessions:
    """Sessions in this process."""

    def __init__(self) -> None:
        self._rows: dict[str, tuple[str, str, float]] = {}
        self._lock = threading.Lock()

    def add(self, key: str, reviewer: str, kind: str, expires: float, now: float) -> None:
        with self._lock:
            for old in [k for k, row in self._rows.items() if row[2] < now]:
                del self._rows[old]
            self._rows[key] = (reviewer, kind, expires)

    def find(self, key: str, now: float) -> tuple[str, str, float] | None:
        with self._lock:
            row = self._rows.get(key)
        return row if row is not None and row[2] >= now else None

    def remove(self, key: str) -> None:
        with self._lock:
            self._rows.pop(key, None)

    def live(self, now: float) -> int:
        with self._lock:
            return sum(1 for row in self._rows.values() if row[2] >= now)


class SharedSessions:
    """Sessions in the desk's tables, valid on every server process on the store."""

    def __init__(self, db: DeskDB) -> None:
        self.db = db

    def add(self, key: str, reviewer: str, kind: str, expires: float, now: float) -> None:
        with self.db.write() as cur:
            cur.execute("DELETE FROM desk_sessions WHERE expires_at < %s", (now,))
            cur.execute(
                "INSERT INTO desk_sessions (sid_key, reviewer, kind, created_at, expires_at) "
                "VALUES (%s, %s, %s, %s, %s)",
                (key, reviewer, kind, now, expires),
            )

    def find(self, key: str, now: float) -> tuple[str, str, float] | None:
        with self.db.read() as cur:
            cur.execute(
                "SELECT reviewer, kind, expires_at FROM desk_sessions "
                "WHERE sid_key = %s AND expires_at >= %s",
                (key, now),
            )
            row = cur.fetchone()
        return (str(row[0]), str(row[1]), float(row[2])) if row else None

    def remove(self, key: str) -> None:
        with self.db.write() as cur:
            cur.execute("DELETE FROM desk_sessions WHERE sid_key = %s", (key,))

    def live(self, now: float) -> int:
        with self.db.read() as cur:
            cur.execute("SELECT COUNT(*) FROM desk_sessions WHERE expires_at >= %s", (now,))
            return int(cur.fetchone()[0])


def derive_session_key(
    shared_token: str | None, reviewers: Mapping[str, str], secret: str | bytes | None = None
) -> bytes:
    """The key that signs cookies and stores session ids: from ``secret`` when given, else from
    the desk's credentials (the shared token, the named tokens' hashes). Every process
    configured alike derives the same key; it is never written anywhere."""
    if secret:
        material = secret if isinstance(secret, bytes) else secret.encode("utf-8")
    else:
        parts = [f"shared:{shared_token or ''}"]
        parts += [f"named:{name}:{reviewers[name]}" for name in sorted(reviewers)]
        material = "\n".join(parts).encode("utf-8")
    return hmac.new(material, b"tracerag-review-sessions-v2", hashlib.sha256).digest()


@dataclass
class ReviewerAuth:
    """Checks reviewer tokens, issues and revokes sessions, and makes CSRF tokens."""

    shared_token: str | None = None
    reviewers: Mapping[str, str] = field(default_factory=dict)
    session_seconds: int = SESSION_SECONDS
    throttle: Throttle = field(default_factory=Throttle)
    secret: str | bytes | None = None
    clock: Callable[[], float] = time.time
    sessions: MemorySessions | SharedSessions = field(default_factory=MemorySessions)

    def __post_init__(self) -> None:
        if not self.shared_token and not self.reviewers:
            raise ConfigurationError("no reviewer credentials configured")
        if self.shared_token:
            problem = token_problem(self.shared_token)
            if problem:
                raise ConfigurationError(
                    f"the reviewer token is too weak: {problem}; {GENERATE_HINT}"
                )
        self._key = derive_session_key(self.shared_token, self.reviewers, self.secret)
        self._serializer = URLSafeTimedSerializer(self._key, salt="tracerag-review-session")

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
    def _book_key(self, sid: str) -> str:
        return hmac.new(self._key, b"sid:" + sid.encode("ascii"), hashlib.sha256).hexdigest()

    def issue(self, reviewer: str, kind: str) -> str:
        """Start a session; the cookie value that carries it."""
        sid = secrets.token_urlsafe(24)
        now = self.clock()
        self.sessions.add(self._book_key(sid), reviewer, kind, now + self.session_seconds, now)
        return self._serializer.dumps({"sid": sid})

    def read_cookie(self, value: str | None) -> Session | None:
        """The live session a cookie names, or None (absent, forged, expired or revoked)."""
        if not value:
            return None
        try:
            data = self._serializer.loads(value, max_age=self.session_seconds)
            sid = str(data["sid"])
            key = self._book_key(sid)
        except (BadSignature, KeyError, TypeError, ValueError, UnicodeError):
            return None
        found = self.sessions.find(key, self.clock())
        if found is None:
            return None
        reviewer, kind, expires = found
        return Session(reviewer, sid, "cookie", kind, expires, key)

    def revoke(self, session: Session) -> None:
        """End a session now: its cookie is refused from here on."""
        self.sessions.remove(session.key or self._book_key(session.sid))

    @property
    def live_sessions(self) -> int:
        return int(self.sessions.live(self.clock()))

    # -- CSRF ---------------------------------------------------------------------------------
    def signin_csrf(self, nonce: str) -> str:
        """The CSRF token of a sign-in form whose nonce cookie holds ``nonce``."""
        message = b"signin-csrf:" + nonce.encode("utf-8", "surrogatepass")
        return hmac.new(self._key, message, hashlib.sha256).hexdigest()

    def check_signin_csrf(self, nonce: str | None, given: str | None) -> bool:
        """True when a sign-in form's CSRF token belongs to the nonce its cookie carries."""
        if not nonce or not given or len(nonce) > 200:
            return False
        return same_secret(given, self.signin_csrf(nonce))

    def csrf_token(self, session: Session) -> str:
        """The CSRF token that forms of this session must carry."""
        mac = hmac.new(self._key, b"csrf:" + session.sid.encode("ascii"), hashlib.sha256)
        return mac.hexdigest()

    def check_csrf(self, session: Session, given: str | None) -> bool:
        """True when a form's CSRF token belongs to this session (bearer requests need none)."""
        if session.via == "bearer":
            return True
        return same_secret(given, self.csrf_token(session))
