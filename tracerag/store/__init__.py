"""The durable audit trail: every request's artifacts, hash-chained, with a review queue.

``open_store()`` opens a store; ``AuditWriter`` writes records to it off the request path. The
audit trail page of the documentation says what each guarantees.
"""

from __future__ import annotations

from tracerag.store._base import (
    AlreadyDecided,
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
    StoreMissing,
    StoreReplaced,
    StoreVanished,
)
from tracerag.store._chain import ChainIssue, ChainReport
from tracerag.store._codec import RequestTrail
from tracerag.store._journal import Journal
from tracerag.store._open import open_store
from tracerag.store._writer import AuditWriter

__all__ = [
    "AlreadyDecided",
    "AuditStore",
    "AuditWriter",
    "ChainIssue",
    "ChainReport",
    "ClaimedByOther",
    "DuplicateRequest",
    "InvalidRecord",
    "Journal",
    "NotQueued",
    "QueueItem",
    "RequestNotFound",
    "RequestSummary",
    "RequestTrail",
    "ReviewDecision",
    "SchemaTooNew",
    "StoreError",
    "StoreMissing",
    "StoreReplaced",
    "StoreVanished",
    "open_store",
]
