"""What the desk's pages show, as plain values: the queue's query (filters, sort, page), the
routed-because signals of stored requests, and the judgements and banner of one item."""

from __future__ import annotations

import dataclasses
import urllib.parse
from typing import Any

from fastapi import Request

from tracerag.server._deps import Services
from tracerag.server._desk_config import QueueRules
from tracerag.server._views import why
from tracerag.store._base import (
    KIND_REVIEW_DECISION,
    KIND_REVIEW_VOTE,
    REVIEW_ACTIONS,
    RequestNotFound,
)
from tracerag.store._codec import RequestTrail

PAGE_SIZES = (25, 50, 100)


SIGNALS = {
    "fabricated": "fabricated citations",
    "stale": "outdated materials cited",
    "uncited": "citation coverage",
    "unsupported": "citation accuracy",
    "rule": "rule ",
    "consistency": "self-consistency",
    "plan": "plan",
    "errors": "errors",
}


SORTS = {
    "priority": "escalations first, then oldest",
    "oldest": "oldest first",
    "newest": "newest first",
    "confidence": "lowest confidence first",
}


@dataclasses.dataclass
class QueueQuery:
    """What the queue page shows: which items, in which order, which page."""

    status: str = "open"  # open | pending | claimed | decided
    route: str = ""  # escalate | review
    action: str = ""  # approve | edit | reject (decided items)
    signal: str = ""  # a key of SIGNALS
    assignee: str = ""  # "" (anyone) | "me" | "none" (unassigned)
    q: str = ""
    sort: str = "priority"
    page: int = 1
    per_page: int = PAGE_SIZES[0]

    @classmethod
    def from_request(cls, request: Request) -> QueueQuery:
        p = request.query_params

        def pick(name: str, allowed: Any, default: str = "") -> str:
            value = (p.get(name) or "").strip()
            return value if value in allowed else default

        try:
            number = max(1, int(p.get("page") or 1))
        except ValueError:
            number = 1
        try:
            size = int(p.get("per_page") or PAGE_SIZES[0])
        except ValueError:
            size = PAGE_SIZES[0]
        return cls(
            status=pick("status", ("open", "pending", "claimed", "decided"), "open"),
            route=pick("route", ("escalate", "review")),
            action=pick("action", REVIEW_ACTIONS),
            signal=pick("signal", SIGNALS),
            assignee=pick("assignee", ("me", "none")),
            q=(p.get("q") or "").strip()[:200],
            sort=pick("sort", SORTS, "priority"),
            page=number,
            per_page=size if size in PAGE_SIZES else PAGE_SIZES[0],
        )

    def link(self, **changes: Any) -> str:
        """The queue URL for this query with some parameters changed."""
        values = {**dataclasses.asdict(self), **changes}
        defaults = dataclasses.asdict(QueueQuery())
        kept = {k: v for k, v in values.items() if v != defaults[k]}
        return "/review" + ("?" + urllib.parse.urlencode(kept) if kept else "")


class WhyCache:
    """The routed-because signals of stored requests (records never change)."""

    def __init__(self, size: int = 50_000) -> None:
        self.size = size
        self._rows: dict[str, list[Any]] = {}

    def get(self, svc: Services, request_id: str) -> list[Any]:
        found = self._rows.get(request_id)
        if found is None:
            try:
                found = why(svc.store.get(request_id))
            except RequestNotFound:
                found = []
            if len(self._rows) >= self.size:
                self._rows.clear()
            self._rows[request_id] = found
        return found


@dataclasses.dataclass(frozen=True)
class JudgementView:
    reviewer: str
    action: str
    scores: list[tuple[str, Any]]
    at: str
    settled: bool


def judgement_views(trail: RequestTrail, rules: QueueRules) -> list[JudgementView]:
    labels = {d.name: d.label for d in rules.rubric}
    order = {d.name: i for i, d in enumerate(rules.rubric)}
    out = []
    for e in trail.of_kind(KIND_REVIEW_VOTE, KIND_REVIEW_DECISION):
        scores = e.payload.get("scores") or {}
        pairs = sorted(
            scores.items() if isinstance(scores, dict) else [],
            key=lambda kv: (order.get(str(kv[0]), len(order)), str(kv[0])),
        )
        out.append(
            JudgementView(
                reviewer=e.actor,
                action=str(e.payload.get("action") or ""),
                scores=[(labels.get(str(k), str(k)), v) for k, v in pairs],
                at=e.created_at,
                settled=e.kind == KIND_REVIEW_DECISION,
            )
        )
    return out


def confirmation(
    trail: RequestTrail, me: str, votes: list[JudgementView], required: int
) -> tuple[str, str] | None:
    """The banner after a judgement, from what the store holds: (kind, text)."""
    decision = trail.review_decision
    if decision is not None:
        payload = decision.payload
        action = payload.get("action")
        verbs = {"approve": "approved", "edit": "edited", "reject": "rejected"}
        who = "You" if decision.actor == me else decision.actor
        how = {
            "unanimous": f" All {len(votes)} reviewers agreed.",
            "adjudicated": " That settled the reviewers' disagreement.",
        }.get(str(payload.get("agreement")), "")
        delivered = (
            " The caller now gets the reviewed answer."
            if action in ("approve", "edit")
            else " The answer stays withheld from the caller."
        )
        return "done", f"Saved: {who} {verbs.get(str(action), action)} this answer.{how}" + (
            delivered
        )
    mine = [v for v in votes if v.reviewer == me and not v.settled]
    if mine:
        if len(votes) >= required:
            return "disputed", (
                f"Your review is recorded. The {len(votes)} reviews disagree: the next "
                "decision settles this item."
            )
        return "done", (
            f"Your review is recorded ({len(votes)} of {required}); the item waits for "
            "another reviewer."
        )
    return None


__all__ = [
    "PAGE_SIZES",
    "SIGNALS",
    "SORTS",
    "JudgementView",
    "QueueQuery",
    "WhyCache",
    "confirmation",
    "judgement_views",
]
