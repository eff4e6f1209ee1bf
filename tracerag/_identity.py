"""Who made a change, and how that was established: operator identities and named tokens.

A named-token credentials file holds one ``name:sha256:<hex>`` line per person (``#``
comments); the token itself is never stored. Desk reviewers sign in with such tokens
(``TRACERAG_REVIEWERS_FILE``), and command-line operators prove theirs the same way
(``TRACERAG_OPERATOR_TOKEN`` against ``TRACERAG_OPERATORS_FILE``, else the reviewers file).

``OperatorIdentity`` is what an audited change records about its author: the name, the method
that established it, whether that method authenticated the name, and a fingerprint of the
credential (a prefix of its stored hash, never the token). A name given as free text is a
``declared`` identity: recorded as such, never as an authenticated one.
"""

from __future__ import annotations

import hashlib
import hmac
import re
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from tracerag.errors import AuthenticationError, ConfigurationError

OPERATOR_TOKEN_ENV = "TRACERAG_OPERATOR_TOKEN"
OPERATORS_FILE_ENV = "TRACERAG_OPERATORS_FILE"

#: the operator proved a named token from the operators (or reviewers) file
OPERATOR_TOKEN = "operator-token"
#: a desk reviewer signed in with a named token
DESK_NAMED = "desk-named-token"
#: a desk reviewer signed in with the shared token and named themself
DESK_SHARED = "desk-shared-token"
#: a name passed as text by a caller of the Python API (not authenticated)
DECLARED = "declared"
#: tracerag itself (first sight, rules)
SYSTEM_METHOD = "system"
#: an end user whose id the application signed (``tracerag.materials.UserTokens``)
SIGNED_USER = "signed-user-token"
#: a frontend application proving the API key (all its users as one principal)
API_KEY = "api-key"
#: a name the calling application passed in-process (its word for its own user)
APP_VOUCHED = "app-vouched"
#: a decision taken on the review desk, applied as an outcome
REVIEW_DECISION = "review-decision"
AUTHENTICATING = frozenset({OPERATOR_TOKEN, DESK_NAMED, SIGNED_USER, API_KEY})

_NAME = re.compile(r"^[\w .@+\-]{1,64}$", re.UNICODE)
_HASH = re.compile(r"^sha256:([0-9a-f]{64})$")


class UnknownOperator(AuthenticationError, ValueError):
    """The operator's credential is missing, unknown, or names someone else."""


def valid_name(name: str | None) -> bool:
    """True for a short printable name (letters of any script, digits, ``.@+-_``)."""
    return bool(name) and bool(_NAME.match(name or "")) and bool((name or "").strip())


def hash_token(token: str) -> str:
    """The at-rest form of a token (``sha256:<hex>``) for a credentials file."""
    return "sha256:" + hashlib.sha256(token.encode("utf-8")).hexdigest()


def read_token_file(path: str | Path) -> dict[str, str]:
    """``name -> sha256:<hex>`` from a file of ``name:sha256:<hex>`` lines (``#`` comments)."""
    out: dict[str, str] = {}
    text = Path(path).read_text("utf-8")
    for n, raw in enumerate(text.splitlines(), 1):
        line = raw.strip()
        if not line or line.startswith("#"):
            continue
        name, sep, digest = line.partition(":")
        name = name.strip()
        if not sep or not valid_name(name) or not _HASH.match(digest.strip()):
            raise ConfigurationError(
                f"{path}:{n}: expected 'name:sha256:<64 hex>' "
                "(make one with: tracerag serve --hash-token NAME)"
            )
        out[name] = digest.strip()
    return out


def token_owner(token: str | None, digests: Mapping[str, str]) -> str | None:
    """The name a token belongs to, or None; every entry is compared (no early exit)."""
    if not token:
        return None
    given = hash_token(token).encode("ascii")
    found: str | None = None
    for name, expected in digests.items():
        if hmac.compare_digest(given, expected.encode("ascii")):
            found = name
    return found


@dataclass(frozen=True)
class OperatorIdentity:
    """The author of a change and how the name was established."""

    name: str
    method: str = DECLARED
    credential: str | None = None  # a prefix of the credential's stored hash

    @property
    def authenticated(self) -> bool:
        """True when a credential, not the caller's word, established the name."""
        return self.method in AUTHENTICATING

    def to_dict(self) -> dict[str, Any]:
        """The JSON form recorded with a change."""
        return {
            "name": self.name,
            "method": self.method,
            "authenticated": self.authenticated,
            "credential": self.credential,
        }

    @classmethod
    def of(cls, operator: str | OperatorIdentity) -> OperatorIdentity:
        """An identity as given, or a bare name as a ``declared`` one."""
        if isinstance(operator, OperatorIdentity):
            return operator
        return cls(str(operator), DECLARED)


def fingerprint(digest: str) -> str:
    """The part of a stored token hash recorded with a change (enough to tell tokens apart)."""
    return digest[: len("sha256:") + 16]


def authenticate_operator(
    token: str | None, credentials: Mapping[str, str], claimed: str | None = None
) -> OperatorIdentity:
    """The identity a named token proves; ``UnknownOperator`` when it proves none.

    ``claimed``: a name the operator also gave; it must be the token's.
    """
    if not token:
        raise UnknownOperator(
            f"material changes need an authenticated operator: set {OPERATOR_TOKEN_ENV} "
            "(or --operator-token-file) to your named token"
        )
    if not credentials:
        raise UnknownOperator(
            f"no operator credentials configured: set {OPERATORS_FILE_ENV} (or "
            "TRACERAG_REVIEWERS_FILE) to a file of name:sha256:<hex> lines"
        )
    name = token_owner(token, credentials)
    if name is None:
        raise UnknownOperator("the operator token belongs to no configured operator")
    if claimed is not None and claimed.strip() != name:
        raise UnknownOperator(
            f"--operator says {claimed.strip()!r} but the operator token belongs to {name!r}"
        )
    return OperatorIdentity(name, OPERATOR_TOKEN, fingerprint(credentials[name]))


__all__ = [
    "API_KEY",
    "APP_VOUCHED",
    "AUTHENTICATING",
    "DECLARED",
    "DESK_NAMED",
    "DESK_SHARED",
    "OPERATORS_FILE_ENV",
    "OPERATOR_TOKEN",
    "OPERATOR_TOKEN_ENV",
    "REVIEW_DECISION",
    "SIGNED_USER",
    "SYSTEM_METHOD",
    "OperatorIdentity",
    "UnknownOperator",
    "authenticate_operator",
    "fingerprint",
    "hash_token",
    "read_token_file",
    "token_owner",
    "valid_name",
]
