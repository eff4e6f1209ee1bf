"""The domain types signals work on: retrieved materials and answer plans.

They sit below the request state and the stages, so signal code (citations, rules, support
backends) and prompts can use them without importing the pipeline.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from datetime import date, datetime, timezone
from typing import Any

__all__ = ["Material", "Plan", "utcnow"]


def utcnow() -> datetime:
    """The current time in UTC (timezone-aware)."""
    return datetime.now(timezone.utc)


@dataclass(frozen=True)
class Material:
    """One retrieved document: the only kind of thing an answer may cite."""

    id: str
    text: str
    title: str = ""
    source: str | None = None
    score: float | None = None
    rank: int = 0
    metadata: Mapping[str, Any] = field(default_factory=dict)

    def stale_reason(self, today: date | None = None) -> str | None:
        """Why this material may not serve as support (superseded or expired), or None."""
        meta = self.metadata
        if meta.get("superseded_by"):
            return f"superseded by {meta['superseded_by']}"
        if meta.get("status") in {"superseded", "stale", "withdrawn", "expired"}:
            return f"marked {meta['status']}"
        until = meta.get("valid_until")
        if until:
            today = today or utcnow().date()
            try:
                until_date = (
                    until if isinstance(until, date) else date.fromisoformat(str(until)[:10])
                )
            except ValueError:
                return None
            if until_date < today:
                return f"valid until {until_date.isoformat()}, now past"
        return None


@dataclass(frozen=True)
class Plan:
    """What the model says it will rely on: material ids and key facts."""

    material_ids: tuple[str, ...] = ()
    key_facts: tuple[str, ...] = ()
    ok: bool = True
    error: str | None = None
    raw: str | None = None
    attempts: int = 1
    mode: str = "separate"
    agreement: float | None = None  # plans written by the samples: how far they agree


#: Material metadata naming the active materials it conflicts with (same quantity, another
#: value), set by a material registry (``tracerag.materials``); an answer citing it goes to
#: review.
CONFLICTS_WITH = "conflicts_with"
#: Material metadata saying why its quarantine was proposed (by denials) and waits for a person
#: to confirm or dismiss it, set by a material registry; an answer citing it goes to review.
QUARANTINE_PROPOSED = "quarantine_proposed"
