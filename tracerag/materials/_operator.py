"""Who makes a material change: an ``OperatorIdentity``, or a bare name (recorded as declared).

``require_operator`` turns what a caller gave into the identity every version and outcome
records, and refuses a change without a named author (``InputError``).
"""

from __future__ import annotations

from typing import Union

from tracerag._identity import SYSTEM_METHOD, OperatorIdentity
from tracerag.errors import InputError
from tracerag.materials._records import SYSTEM

#: who makes a change: an identity, or a bare name (recorded as declared, not authenticated)
Operator = Union[str, OperatorIdentity]  # noqa: UP007


def require_operator(operator: Operator) -> OperatorIdentity:
    """The identity of a change's author (a bare name is declared; tracerag's own is system)."""
    if not isinstance(operator, (str, OperatorIdentity)):
        raise InputError("every material change needs a named operator")
    who = OperatorIdentity.of(operator)
    if not who.name.strip():
        raise InputError("every material change needs a named operator")
    if who.name == SYSTEM and not isinstance(operator, OperatorIdentity):
        who = OperatorIdentity(SYSTEM, SYSTEM_METHOD)
    return who


#: the identity of tracerag's own rules (first sight, the quarantine proposal)
SYSTEM_IDENTITY = OperatorIdentity(SYSTEM, SYSTEM_METHOD)

__all__ = ["SYSTEM_IDENTITY", "Operator", "require_operator"]
