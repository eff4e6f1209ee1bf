"""Who gives a verdict, and whether it counts: principals, signed user tokens, limits.

A verdict moves credibility only when a principal whose name something other than the caller's
word established gives it; it then counts once per principal and request, within limits:

* an end user the application vouches for — over HTTP with a signed user token
  (``UserTokens``: the application's backend signs the id of a user it has signed in, with a
  key it shares with tracerag and never gives to browsers); in-process, the identity the
  application passes (a bare name given to ``record_feedback`` is the application's word);
* the application itself, by its API key (every user of an application that sends no user
  tokens is one principal);
* a named reviewer (the desk's named token) or an operator (the operator token).

A name the caller merely declares (the ``user`` field of ``POST /v1/feedback``) counts for
nothing: the verdict is kept as an unverified note, with the name, and moves no material.

``FeedbackLimits``: counted verdicts per principal per window (more are refused, 429 over
HTTP); one counted verdict per principal and material per window (further verdicts are kept but
do not move that material again); counted verdicts per material per window from end users and
applications (beyond it, kept but not counted); unverified notes per request.
"""

from __future__ import annotations

import base64
import hashlib
import hmac
import re
import time
import unicodedata
from collections.abc import Callable
from dataclasses import dataclass

from tracerag._identity import (
    API_KEY,
    APP_VOUCHED,
    DECLARED,
    DESK_NAMED,
    OPERATOR_TOKEN,
    REVIEW_DECISION,
    SIGNED_USER,
    OperatorIdentity,
)
from tracerag.errors import AuthenticationError, ConfigurationError, InputError

#: the prefix of a signed user token (the version of its format)
TOKEN_PREFIX = "tru1"
MIN_KEY_CHARS = 32
MAX_USER_ID_CHARS = 128
MAX_TOKEN_CHARS = 1024
#: the parts of a token as ``sign`` writes them: ASCII only (``str.isdigit`` also takes
#: superscript and full-width digits, which neither ``int`` nor the MAC's ASCII message read)
_B64URL = re.compile(r"[A-Za-z0-9_-]+")
_EXPIRES = re.compile(r"[0-9]{1,12}")
#: principals with authority over materials: no per-material cap on their verdicts
PERSONS_WITH_AUTHORITY = frozenset({DESK_NAMED, OPERATOR_TOKEN, REVIEW_DECISION})


class InvalidUserToken(AuthenticationError, ValueError):
    """A signed user token is malformed, forged, expired or signed with another key."""


@dataclass(frozen=True)
class FeedbackLimits:
    """How far verdicts count (windows in seconds)."""

    per_principal: int = 60  # counted verdicts of one principal per principal_window
    principal_window: float = 3600.0
    material_window: float = 86400.0  # a principal moves one material once per window
    per_material: int = 30  # counted verdicts on one material per material_window (end users)
    notes_per_request: int = 20  # unverified notes kept per request

    def __post_init__(self) -> None:
        if min(self.per_principal, self.per_material, self.notes_per_request) < 1:
            raise ConfigurationError("feedback limits must be at least 1")
        if min(self.principal_window, self.material_window) <= 0:
            raise ConfigurationError("feedback windows must be positive")


def counts(identity: OperatorIdentity) -> bool:
    """True when a verdict of this principal may move credibility (not a declared name)."""
    return identity.method != DECLARED


def capped(identity: OperatorIdentity) -> bool:
    """True when the per-material cap applies (end users and applications, not persons with
    authority over materials)."""
    return identity.method not in PERSONS_WITH_AUTHORITY


def principal_of(operator: str | OperatorIdentity) -> OperatorIdentity:
    """The principal of an in-process caller: an identity as given, or a bare name as the
    application's word for its user (``app-vouched``)."""
    if isinstance(operator, OperatorIdentity):
        return operator
    return OperatorIdentity(str(operator), APP_VOUCHED)


def signed_user(user_id: str, credential: str | None = None) -> OperatorIdentity:
    """The principal a verified user token proves: ``user:<id>``."""
    return OperatorIdentity(f"user:{user_id}", SIGNED_USER, credential)


def api_key_principal(fingerprint: str | None = None) -> OperatorIdentity:
    """The application calling with the API key (all its users, as one principal)."""
    return OperatorIdentity("app:api-key", API_KEY, fingerprint)


def declared_note(user: str | None) -> OperatorIdentity:
    """An unverified note under a name the caller declared (counts for nothing)."""
    return OperatorIdentity(f"unverified:{user or 'anonymous'}", DECLARED)


def _b64(data: bytes) -> str:
    return base64.urlsafe_b64encode(data).rstrip(b"=").decode("ascii")


def _unb64(text: str) -> bytes:
    return base64.urlsafe_b64decode(text + "=" * (-len(text) % 4))


def _valid_user_id(user_id: str) -> bool:
    return (
        0 < len(user_id) <= MAX_USER_ID_CHARS
        and user_id.strip() == user_id
        and all(unicodedata.category(ch)[0] != "C" for ch in user_id)
    )


class UserTokens:
    """Signed end-user ids: ``tru1.<id>.<expires>.<mac>`` (base64url id, Unix seconds,
    HMAC-SHA256 of the three with the key).

    The application's backend makes one per signed-in user (``sign``), with the key in
    ``TRACERAG_FEEDBACK_KEY`` (at least 32 characters, kept on servers only); its frontend
    sends it with the verdict (``user_token``); tracerag ``verify``-es it. A token lives at most
    ``max_age`` seconds (default a day): one that claims to live longer is refused.
    """

    def __init__(
        self,
        key: str | bytes,
        *,
        max_age: int = 86400,
        clock: Callable[[], float] = time.time,
    ) -> None:
        raw = key.encode("utf-8") if isinstance(key, str) else bytes(key)
        if len(raw) < MIN_KEY_CHARS:
            raise ConfigurationError(f"the feedback key needs at least {MIN_KEY_CHARS} characters")
        self._key = raw
        self.max_age = int(max_age)
        self.clock = clock

    @property
    def fingerprint(self) -> str:
        """A short, non-secret name of the key (recorded with the verdicts it proves)."""
        return "hmac:" + hashlib.sha256(b"tracerag-feedback-key|" + self._key).hexdigest()[:16]

    def _mac(self, ident: str, expires: str) -> str:
        message = f"{TOKEN_PREFIX}|{ident}|{expires}".encode("ascii")
        return _b64(hmac.new(self._key, message, hashlib.sha256).digest())

    def sign(self, user_id: str, *, ttl: int | None = None) -> str:
        """A token proving ``user_id`` for ``ttl`` seconds (default and at most ``max_age``)."""
        if not _valid_user_id(user_id):
            raise InputError(
                f"a user id has 1 to {MAX_USER_ID_CHARS} characters, no control characters "
                "and no surrounding spaces"
            )
        life = self.max_age if ttl is None else min(int(ttl), self.max_age)
        expires = str(int(self.clock()) + max(1, life))
        ident = _b64(user_id.encode("utf-8"))
        return f"{TOKEN_PREFIX}.{ident}.{expires}.{self._mac(ident, expires)}"

    def verify(self, token: str) -> str:
        """The user id a token proves; ``InvalidUserToken`` otherwise."""
        well_formed = isinstance(token, str) and len(token) < MAX_TOKEN_CHARS and token.isascii()
        parts = token.split(".") if well_formed else []
        if (
            len(parts) != 4
            or parts[0] != TOKEN_PREFIX
            or not _B64URL.fullmatch(parts[1])
            or not _EXPIRES.fullmatch(parts[2])
            or not _B64URL.fullmatch(parts[3])
        ):
            raise InvalidUserToken("the user token is not a tracerag user token")
        _prefix, ident, expires, mac = parts
        expected = self._mac(ident, expires).encode("ascii")
        if not hmac.compare_digest(mac.encode("ascii"), expected):
            raise InvalidUserToken("the user token's signature does not match")
        now = self.clock()
        if int(expires) <= now:
            raise InvalidUserToken("the user token has expired")
        if int(expires) - now > self.max_age + 60:
            raise InvalidUserToken("the user token claims to live longer than allowed")
        try:
            user_id = _unb64(ident).decode("utf-8")
        except (ValueError, UnicodeDecodeError):
            raise InvalidUserToken("the user token's id is unreadable") from None
        if not _valid_user_id(user_id):
            raise InvalidUserToken("the user token's id is not a valid user id")
        return user_id

    def principal(self, token: str) -> OperatorIdentity:
        """The principal a token proves (``user:<id>``, ``signed-user-token``)."""
        return signed_user(self.verify(token), self.fingerprint)


__all__ = [
    "MIN_KEY_CHARS",
    "FeedbackLimits",
    "InvalidUserToken",
    "UserTokens",
    "api_key_principal",
    "capped",
    "counts",
    "declared_note",
    "principal_of",
    "signed_user",
]
