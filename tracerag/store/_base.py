"""The ``AuditStore`` and ``ReviewQueue`` protocols, with the store's vocabulary re-exported.

One finished request becomes a run of append-only log entries
``(seq, request_id, kind, payload, actor, created_at, prev_hash, hash)`` (the codec is
``tracerag.store.record``), chained by hash (``tracerag.store.chain``). Reviewer and operator
actions are appended to the same log. A ``requests`` index (for listing) and the review queue
(``tracerag.store.review_queue``) sit beside the log; both are derived from it, and
``verify_chain`` checks them against it. ``tracerag.store.sql`` holds the SQL both backends
share. The vocabulary itself (kinds, errors, value types) is the leaf ``tracerag.store._types``.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from datetime import datetime
from typing import Any, Protocol, runtime_checkable

from tracerag.store._chain import ChainReport
from tracerag.store._codec import RequestTrail
from tracerag.store._types import (
    ACTION_KINDS,
    KIND_ERROR,
    KIND_EVALUATION,
    KIND_EXPLANATION,
    KIND_EXPLANATION_REQUESTED,
    KIND_MATERIAL_CHANGE,
    KIND_NOTE,
    KIND_OPERATOR_ACTION,
    KIND_PLAN,
    KIND_QUARANTINED,
    KIND_REGISTER,
    KIND_RESPONSE,
    KIND_RETRIEVE,
    KIND_REVIEW_ASSIGNED,
    KIND_REVIEW_CLAIMED,
    KIND_REVIEW_COMMENT,
    KIND_REVIEW_DECISION,
    KIND_REVIEW_ENQUEUED,
    KIND_REVIEW_RELEASED,
    KIND_REVIEW_VOTE,
    KIND_SAMPLE,
    KIND_VERIFY,
    QUEUE_STATUSES,
    RECORD_KINDS,
    REVIEW_ACTIONS,
    REVIEW_KINDS,
    REVIEW_ROUTES,
    SYSTEM_ACTOR,
    AlreadyDecided,
    AlreadyReviewed,
    ClaimedByOther,
    DuplicateRequest,
    Entry,
    InvalidRecord,
    NotQueued,
    QueueItem,
    RequestNotFound,
    RequestSummary,
    ReviewDecision,
    ReviewOutcome,
    SchemaTooNew,
    StoreError,
    StoreFailing,
    StoreMetrics,
    StoreMissing,
    StoreReplaced,
    StoreVanished,
    now_iso,
    to_iso,
)

__all__ = [
    "ACTION_KINDS",
    "KIND_ERROR",
    "KIND_EVALUATION",
    "KIND_EXPLANATION",
    "KIND_EXPLANATION_REQUESTED",
    "KIND_MATERIAL_CHANGE",
    "KIND_NOTE",
    "KIND_OPERATOR_ACTION",
    "KIND_PLAN",
    "KIND_QUARANTINED",
    "KIND_REGISTER",
    "KIND_RESPONSE",
    "KIND_RETRIEVE",
    "KIND_REVIEW_ASSIGNED",
    "KIND_REVIEW_CLAIMED",
    "KIND_REVIEW_COMMENT",
    "KIND_REVIEW_DECISION",
    "KIND_REVIEW_ENQUEUED",
    "KIND_REVIEW_RELEASED",
    "KIND_REVIEW_VOTE",
    "KIND_SAMPLE",
    "KIND_VERIFY",
    "QUEUE_STATUSES",
    "RECORD_KINDS",
    "REVIEW_ACTIONS",
    "REVIEW_KINDS",
    "REVIEW_ROUTES",
    "SYSTEM_ACTOR",
    "AlreadyDecided",
    "AlreadyReviewed",
    "AuditStore",
    "ChainReport",
    "ClaimedByOther",
    "DuplicateRequest",
    "Entry",
    "InvalidRecord",
    "NotQueued",
    "QueueItem",
    "RequestNotFound",
    "RequestSummary",
    "RequestTrail",
    "ReviewDecision",
    "ReviewOutcome",
    "ReviewQueue",
    "SchemaTooNew",
    "StoreError",
    "StoreFailing",
    "StoreMetrics",
    "StoreMissing",
    "StoreReplaced",
    "StoreVanished",
    "now_iso",
    "to_iso",
]

# ---------------------------------------------------------------------------------------------
# The protocol


@runtime_checkable
class ReviewQueue(Protocol):
    """A durable queue of requests waiting for a person's decision."""

    def enqueue_review(self, request_id: str, reason: str, decision: str) -> QueueItem:
        """Put a stored request in the review queue (idempotent: returns the existing item)."""
        ...

    def claim_next(self, reviewer: str) -> QueueItem | None:
        """Take the most urgent pending item for a reviewer; None when the queue is empty."""
        ...

    def release(self, request_id: str, actor: str, reason: str | None = None) -> QueueItem:
        """Put a claimed item back to pending."""
        ...

    def list_queue(self, status: str | None = None, limit: int = 100) -> list[QueueItem]:
        """Queue items, most urgent and oldest first, optionally of one status (``open``:
        pending and claimed)."""
        ...

    def decide(
        self,
        request_id: str,
        reviewer: str,
        action: str,
        final_answer: str | None = None,
        reason: str | None = None,
    ) -> ReviewDecision:
        """Record the final review decision; raises ``AlreadyDecided`` on a second one."""
        ...

    def get_decision(self, request_id: str) -> ReviewDecision | None:
        """The review decision on a request, or None if it has none yet."""
        ...

    def review(
        self,
        request_id: str,
        reviewer: str,
        action: str,
        final_answer: str | None = None,
        reason: str | None = None,
        *,
        scores: Mapping[str, float] | None = None,
        required: int = 1,
    ) -> ReviewOutcome:
        """One reviewer's judgement (with rubric scores) on an item needing ``required``
        reviewers: a vote, or the decision when it settles the item."""
        ...

    def comment(self, request_id: str, author: str, text: str) -> Entry:
        """Chain a reviewer's comment on a queued item."""
        ...

    def assign(self, request_id: str, assignee: str | None, actor: str) -> Entry | None:
        """Assign an undecided item to a reviewer (None: unassign)."""
        ...

    def review_entries(
        self,
        kinds: Sequence[str],
        request_ids: Sequence[str] | None = None,
        *,
        open_only: bool = False,
    ) -> list[Entry]:
        """Votes, comments, assignments... of some queued items, or of all, in seq order."""
        ...


@runtime_checkable
class AuditStore(ReviewQueue, Protocol):
    """Durable, append-only, hash-chained audit trail with a review queue."""

    def append_record(self, record: Mapping[str, Any]) -> None:
        """Store one finished request's record (all its entries, in one transaction).

        A record whose decision is ``review`` or ``escalate`` is also put in the review queue
        in the same transaction (unless the store was opened with ``auto_enqueue=False``).
        Raises ``DuplicateRequest`` if the request_id is already stored and ``InvalidRecord``
        if the record cannot be stored.
        """
        ...

    def append_action(
        self,
        request_id: str,
        kind: str,
        actor: str,
        payload: Mapping[str, Any] | None = None,
        reason: str | None = None,
    ) -> Entry:
        """Append a reviewer or operator action (who, what, before/after, why) to the log."""
        ...

    def append_material_change(
        self,
        material_id: str,
        actor: str,
        payload: Mapping[str, Any],
        reason: str | None = None,
    ) -> Entry:
        """Chain one material change (a ``material_change`` entry under the material's id)."""
        ...

    def material_changes(self, material_id: str | None = None) -> list[Entry]:
        """The ``material_change`` entries, of one material or of all, in seq order."""
        ...

    def get(self, request_id: str) -> RequestTrail:
        """Every entry stored under the request_id; raises ``RequestNotFound``."""
        ...

    def list_requests(
        self,
        since: datetime | str | None = None,
        until: datetime | str | None = None,
        decision: str | None = None,
        limit: int = 100,
    ) -> list[RequestSummary]:
        """Stored requests, newest first, optionally in ``[since, until)`` and by decision."""
        ...

    def verify_chain(self) -> ChainReport:
        """Re-check every entry's hash and link; report changed, removed, reordered entries."""
        ...

    def metrics(
        self, since: datetime | str | None = None, until: datetime | str | None = None
    ) -> StoreMetrics:
        """Raw counts for indicators over ``[since, until)``."""
        ...

    def close(self) -> None:
        """Release connections; the store is unusable afterwards."""
        ...
