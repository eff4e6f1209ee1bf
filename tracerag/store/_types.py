"""The audit store's vocabulary: entry kinds, errors and the value types stores return.

A leaf of the store package: the chain, the codec, the SQL store and the protocols in
``tracerag.store._base`` all build on it, and it imports none of them.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from datetime import datetime, timezone
from typing import Any

from tracerag.errors import TraceragError

# ---------------------------------------------------------------------------------------------
# Entry kinds

KIND_REGISTER = "register"
KIND_RETRIEVE = "retrieve"
KIND_PLAN = "plan"
KIND_SAMPLE = "sample"
KIND_VERIFY = "verify"
KIND_RESPONSE = "response"
KIND_ERROR = "error"
#: a record that could not be stored as given (its reason and an escaped copy)
KIND_QUARANTINED = "quarantined"
RECORD_KINDS = (
    KIND_REGISTER,
    KIND_RETRIEVE,
    KIND_PLAN,
    KIND_SAMPLE,
    KIND_VERIFY,
    KIND_RESPONSE,
    KIND_ERROR,
    KIND_QUARANTINED,
)

KIND_REVIEW_ENQUEUED = "review_enqueued"
KIND_REVIEW_CLAIMED = "review_claimed"
KIND_REVIEW_RELEASED = "review_released"
KIND_REVIEW_DECISION = "review_decision"
#: one reviewer's judgement (action, rubric scores) on an item that needs several reviewers,
#: before they settle it; the judgement that settles it is the decision itself
KIND_REVIEW_VOTE = "review_vote"
#: a reviewer's comment on a queued item
KIND_REVIEW_COMMENT = "review_comment"
#: an item assigned to a reviewer (``assignee`` null: unassigned)
KIND_REVIEW_ASSIGNED = "review_assigned"
KIND_OPERATOR_ACTION = "operator_action"
KIND_NOTE = "note"
# an offline attribution report (``tracerag explain``) on a stored request
KIND_EXPLANATION = "explanation"
# a reviewer's reject or a user's complaint asked for one (``tracerag explain --queued``)
KIND_EXPLANATION_REQUESTED = "explanation_requested"
# the results of a ``tracerag eval`` run, appended to the run's own record
KIND_EVALUATION = "evaluation"
ACTION_KINDS = (
    KIND_REVIEW_ENQUEUED,
    KIND_REVIEW_CLAIMED,
    KIND_REVIEW_RELEASED,
    KIND_REVIEW_DECISION,
    KIND_REVIEW_VOTE,
    KIND_REVIEW_COMMENT,
    KIND_REVIEW_ASSIGNED,
    KIND_OPERATOR_ACTION,
    KIND_NOTE,
    KIND_EXPLANATION,
    KIND_EXPLANATION_REQUESTED,
    KIND_EVALUATION,
)
#: one change to a material in the registry (``tracerag.materials``), chained under the
#: material's id rather than a request's: it belongs to no request, and the request index, the
#: review queue and ``get(request_id)`` leave it out. Stores written before this kind existed
#: hold such changes as ``operator_action`` entries of the request ``tracerag.materials``.
KIND_MATERIAL_CHANGE = "material_change"
#: written only by the review queue's own operations (``append_action`` refuses them)
REVIEW_KINDS = (
    KIND_REVIEW_ENQUEUED,
    KIND_REVIEW_CLAIMED,
    KIND_REVIEW_RELEASED,
    KIND_REVIEW_DECISION,
    KIND_REVIEW_VOTE,
    KIND_REVIEW_COMMENT,
    KIND_REVIEW_ASSIGNED,
)

SYSTEM_ACTOR = "tracerag"

# Routes that put a request in the review queue, most urgent first.
REVIEW_ROUTES = ("escalate", "review")
REVIEW_ACTIONS = ("approve", "edit", "reject")
QUEUE_STATUSES = ("pending", "claimed", "decided")

# ---------------------------------------------------------------------------------------------
# Errors


class StoreError(TraceragError):
    """The audit store failed or refused an operation."""


class RequestNotFound(StoreError, KeyError):
    """No request with this request_id is in the audit store."""

    def __init__(self, request_id: str) -> None:
        super().__init__(request_id)
        self.request_id = request_id

    def __str__(self) -> str:
        return f"no audit record for request_id {self.request_id!r}"


class DuplicateRequest(StoreError):
    """A record for this request_id is already stored; records are written once."""

    def __init__(self, request_id: str) -> None:
        super().__init__(f"an audit record for request_id {request_id!r} is already stored")
        self.request_id = request_id


class InvalidRecord(StoreError, ValueError):
    """The record or action cannot be stored as given (no request_id, not JSON-able, ...)."""


class NotQueued(StoreError, KeyError):
    """The request exists but is not in the review queue."""

    def __init__(self, request_id: str) -> None:
        super().__init__(request_id)
        self.request_id = request_id

    def __str__(self) -> str:
        return f"request {self.request_id!r} is not in the review queue"


class AlreadyDecided(StoreError):
    """The review item has been decided already; a decision is final."""

    def __init__(self, request_id: str, decided_by: str | None, action: str | None) -> None:
        super().__init__(
            f"review of request {request_id!r} was already decided ({action} by {decided_by})"
        )
        self.request_id = request_id
        self.decided_by = decided_by
        self.action = action


class ClaimedByOther(StoreError):
    """The review item is claimed by another reviewer."""

    def __init__(self, request_id: str, claimed_by: str | None) -> None:
        super().__init__(f"review of request {request_id!r} is claimed by {claimed_by}")
        self.request_id = request_id
        self.claimed_by = claimed_by


class AlreadyReviewed(StoreError):
    """This reviewer has already given their judgement on the item; another reviewer's is due."""

    def __init__(self, request_id: str, reviewer: str) -> None:
        super().__init__(
            f"{reviewer} has already reviewed request {request_id!r}; "
            "the item waits for another reviewer"
        )
        self.request_id = request_id
        self.reviewer = reviewer


class SchemaTooNew(StoreError):
    """The database was written by a newer tracerag (its schema version is unknown here)."""


class StoreMissing(StoreError):
    """No audit store exists at the location, and this operation does not create one."""


class StoreVanished(StoreError):
    """The store's file disappeared or was replaced while it was open."""


class StoreFailing(StoreError):
    """The store failed moments ago (or is being tried again): not waited for now."""


class StoreReplaced(StoreError):
    """The store found is not the one written before (another, or a new empty one)."""


# ---------------------------------------------------------------------------------------------
# Data types


def now_iso() -> str:
    """The current UTC time as the fixed-width ISO-8601 text the store writes."""
    return datetime.now(timezone.utc).isoformat(timespec="microseconds")


def to_iso(value: datetime | str | None) -> str | None:
    """A time bound in the store's text form (naive datetimes are taken as UTC)."""
    if value is None:
        return None
    if isinstance(value, str):
        value = datetime.fromisoformat(value.replace("Z", "+00:00"))
    if value.tzinfo is None:
        value = value.replace(tzinfo=timezone.utc)
    return value.astimezone(timezone.utc).isoformat(timespec="microseconds")


@dataclass(frozen=True, kw_only=True)
class Entry:
    """One audit log entry. Unsealed (``seq == 0``, no hash) until a store appends it."""

    seq: int = 0
    request_id: str
    kind: str
    payload: dict[str, Any]
    actor: str = SYSTEM_ACTOR
    created_at: str = ""
    prev_hash: str = ""
    hash: str = ""
    # the payload's canonical JSON, when already computed (saves encoding it twice)
    payload_json: str = field(default="", repr=False, compare=False)
    # the rule that sealed it (``tracerag.store.chain``); 0 while unsealed
    chain_version: int = field(default=0, compare=False)

    @property
    def sealed(self) -> bool:
        """True once the entry has a place (seq) and a hash in the chain."""
        return self.seq > 0 and bool(self.hash)

    def to_dict(self) -> dict[str, Any]:
        """A JSON-able form of the entry."""
        return {
            "seq": self.seq,
            "request_id": self.request_id,
            "kind": self.kind,
            "payload": self.payload,
            "actor": self.actor,
            "created_at": self.created_at,
            "prev_hash": self.prev_hash,
            "hash": self.hash,
            "chain_version": self.chain_version,
        }


@dataclass(frozen=True)
class QueueItem:
    """The review-queue state of one request."""

    request_id: str
    route: str  # the pipeline's decision that queued it: "escalate" or "review"
    reason: str
    status: str  # pending | claimed | decided
    enqueued_at: str
    claimed_by: str | None = None
    claimed_at: str | None = None
    decided_by: str | None = None
    decided_at: str | None = None
    action: str | None = None  # approve | edit | reject
    final_answer: str | None = None
    decision_reason: str | None = None
    question: str | None = None
    confidence: float | None = None

    def to_dict(self) -> dict[str, Any]:
        """A JSON-able form of the item."""
        return dict(self.__dict__)


@dataclass(frozen=True)
class ReviewDecision:
    """A reviewer's final word on a queued request."""

    request_id: str
    reviewer: str
    action: str
    final_answer: str | None
    reason: str | None
    decided_at: str


@dataclass(frozen=True)
class ReviewOutcome:
    """What one reviewer's judgement did to an item that may need several reviewers.

    ``decision`` is set when it settled the item: it was the last of the ``required``
    judgements and they all chose the same action, or the item was disputed (the required
    judgements disagreed) and this one settled it. Otherwise it was recorded as a vote:
    ``reviews`` of ``required`` so far, ``disputed`` when they disagree.
    """

    request_id: str
    reviewer: str
    action: str
    reviews: int
    required: int
    decision: ReviewDecision | None = None
    disputed: bool = False
    #: how the decision came about: "single", "unanimous" or "adjudicated" (None: a vote)
    agreement: str | None = None


@dataclass(frozen=True)
class RequestSummary:
    """One line of ``list_requests``."""

    request_id: str
    trace_id: str | None
    created_at: str
    question: str | None
    decision: str | None
    confidence: float | None
    tier: str | None
    channel: str | None
    entries: int
    review_status: str | None = None


@dataclass
class StoreMetrics:
    """Raw counts over a time window, the material for indicators and dashboards.

    ``queue`` is the current state of the queue (not windowed); review figures cover the
    decisions made in the window.
    """

    since: str | None
    until: str | None
    requests: int = 0
    by_decision: dict[str, int] = field(default_factory=dict)
    with_errors: int = 0
    confidence_mean: float | None = None
    queue: dict[str, int] = field(default_factory=dict)
    oldest_pending_at: str | None = None
    review_actions: dict[str, int] = field(default_factory=dict)
    review_seconds_median: float | None = None
    entries: int = 0

    def rate(self, decision: str) -> float | None:
        """The share of requests in the window routed to ``decision``."""
        return self.by_decision.get(decision, 0) / self.requests if self.requests else None

    @property
    def overturn_rate(self) -> float | None:
        """The share of review decisions that edited or rejected the answer."""
        total = sum(self.review_actions.values())
        if not total:
            return None
        changed = self.review_actions.get("edit", 0) + self.review_actions.get("reject", 0)
        return changed / total

    def to_dict(self) -> dict[str, Any]:
        """A JSON-able form of the metrics."""
        return dict(self.__dict__)
