"""The durable audit trail: every request's artifacts, hash-chained, with a review queue.

``open_store()`` opens a store; ``AuditWriter`` writes records to it off the request path. The
audit trail page of the documentation says what each guarantees.
"""

from __future__ import annotations

from tracerag.store._audit_record import AuditRecord
from tracerag.store._base import (
    AlreadyDecided,
    AlreadyReviewed,
    AuditStore,
    ClaimedByOther,
    DuplicateRequest,
    InvalidRecord,
    NotQueued,
    QueueItem,
    RequestNotFound,
    RequestSummary,
    ReviewDecision,
    SchemaTooNew,
    StoreError,
    StoreFailing,
    StoreMetrics,
    StoreMissing,
    StoreReplaced,
    StoreVanished,
)
from tracerag.store._chain import ChainIssue, ChainReport
from tracerag.store._codec import RequestTrail
from tracerag.store._journal import Journal, JournalBusy, JournalError
from tracerag.store._open import open_store
from tracerag.store._writer import AuditWriter

__all__ = [
    "AlreadyDecided",
    "AlreadyReviewed",
    "AuditRecord",
    "AuditStore",
    "AuditWriter",
    "ChainIssue",
    "ChainReport",
    "ClaimedByOther",
    "DuplicateRequest",
    "InvalidRecord",
    "Journal",
    "JournalBusy",
    "JournalError",
    "NotQueued",
    "QueueItem",
    "RequestNotFound",
    "RequestSummary",
    "RequestTrail",
    "ReviewDecision",
    "SchemaTooNew",
    "StoreError",
    "StoreFailing",
    "StoreMetrics",
    "StoreMissing",
    "StoreReplaced",
    "StoreVanished",
    "open_store",
]
