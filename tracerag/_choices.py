"""The closed sets of names a request is described with: stages, tiers, plan modes, routes,
and the keyword options a function declares (``check_options``).

Each member *is* its string (``Tier.HIGH == "high"``, ``str(Tier.HIGH) == "high"``), so every
record, span attribute, metric label and JSON document shows the same plain strings as before
these types existed, and an option given as a string is accepted (``tier="low"``).
"""

from __future__ import annotations

from collections.abc import Iterable
from enum import Enum
from typing import Literal, TypeVar

from tracerag.errors import ConfigurationError, UnknownOptionError

__all__ = [
    "PlanMode",
    "PlanModeName",
    "Route",
    "RouteName",
    "Stage",
    "StageName",
    "StrChoice",
    "Tier",
    "TierName",
    "check_options",
]

C = TypeVar("C", bound="StrChoice")


class StrChoice(str, Enum):
    """A member of a closed set of strings, equal to (and shown as) its value.

    Like the standard library's ``enum.StrEnum`` (Python 3.11+), for every Python tracerag
    supports; its ``repr`` is its value's too, so a list of stages prints as it did when they
    were plain strings.
    """

    # str's own methods, so a member shows as its value without a call into Python code
    __str__ = str.__str__
    __repr__ = str.__repr__

    def __format__(self, format_spec: str) -> str:
        return str.__format__(str.__str__(self), format_spec)

    @classmethod
    def parse(cls: type[C], value: object, what: str) -> C:
        """The member named by ``value`` (a member or its string); ``ConfigurationError`` when
        ``value`` names none: ``what`` is the option's name in the message."""
        try:
            return cls(value)
        except ValueError:
            names = tuple(member.value for member in cls)
            raise ConfigurationError(f"{what} must be one of {names}, got {value!r}") from None


class Stage(StrChoice):
    """The six stages of a request, in the order the stage table names them."""

    REGISTER = "register"
    RETRIEVE = "retrieve"
    PLAN = "plan"
    SAMPLE = "sample"
    VERIFY = "verify"
    ASSEMBLE = "assemble"


class Tier(StrChoice):
    """How much a request is checked: ``high`` plans, samples N and verifies; ``medium`` samples
    up to 3 and verifies, and flags for review what it would withhold; ``low`` draws one
    answer and does not verify it."""

    HIGH = "high"
    MEDIUM = "medium"
    LOW = "low"


class PlanMode(StrChoice):
    """``separate``: one plan call before sampling; ``inline``: each sample writes its plan."""

    SEPARATE = "separate"
    INLINE = "inline"


class Route(StrChoice):
    """Where an answer goes: ``pass`` returns it, ``review`` returns it flagged for a person,
    ``escalate`` withholds it and hands it to a person."""

    PASS = "pass"
    REVIEW = "review"
    ESCALATE = "escalate"


#: The names, for options typed as plain strings (``tier="high"``).
StageName = Literal["register", "retrieve", "plan", "sample", "verify", "assemble"]
TierName = Literal["high", "medium", "low"]
PlanModeName = Literal["separate", "inline"]
RouteName = Literal["pass", "review", "escalate"]


def check_options(caller: str, options: Iterable[str], declared: frozenset[str]) -> None:
    """``UnknownOptionError`` (a ``TypeError``) for the first of ``options`` not ``declared``.

    A function taking ``**options: Unpack[SomeOptions]`` is checked by type checkers; at run
    time this refuses a keyword the ``TypedDict`` does not name, as Python refuses a keyword a
    signature does not name.
    """
    for name in options:
        if name not in declared:
            raise UnknownOptionError(f"{caller}() got an unexpected keyword argument {name!r}")
