"""The audit store: what it keeps, the ``AuditStore`` protocol, and the SQL both backends share.

One finished request becomes a run of append-only log entries
``(seq, request_id, kind, payload, actor, created_at, prev_hash, hash)`` — see
``entries_from_record`` — chained by hash (``tracerag.store.chain``). Reviewer and operator
actions are appended to the same log. A small ``requests`` index (for listing) and a durable
review queue sit beside the log; the log alone is the evidence.

``SQLAuditStore`` holds the SQL that the SQLite and PostgreSQL backends share; each backend
supplies connections, the transaction that serialises appends, and its migrations.
"""

from __future__ import annotations

import json
import statistics
from collections.abc import Iterator, Mapping, Sequence
from contextlib import AbstractContextManager
from dataclasses import dataclass, field
from datetime import datetime, timezone
from typing import Any, Protocol, runtime_checkable

from tracerag.errors import TraceragError
from tracerag.record import AuditRecord
from tracerag.store.chain import (
    GENESIS_HASH,
    ChainReport,
    ChainVerifier,
    StoredRow,
    canonical_json,
    entry_hash,
)

# ---------------------------------------------------------------------------------------------
# Entry kinds

KIND_REGISTER = "register"
KIND_RETRIEVE = "retrieve"
KIND_PLAN = "plan"
KIND_SAMPLE = "sample"
KIND_VERIFY = "verify"
KIND_RESPONSE = "response"
KIND_ERROR = "error"
RECORD_KINDS = (
    KIND_REGISTER,
    KIND_RETRIEVE,
    KIND_PLAN,
    KIND_SAMPLE,
    KIND_VERIFY,
    KIND_RESPONSE,
    KIND_ERROR,
)

KIND_REVIEW_ENQUEUED = "review_enqueued"
KIND_REVIEW_CLAIMED = "review_claimed"
KIND_REVIEW_RELEASED = "review_released"
KIND_REVIEW_DECISION = "review_decision"
KIND_OPERATOR_ACTION = "operator_action"
KIND_NOTE = "note"
# an offline attribution report (``tracerag explain``) on a stored request
KIND_EXPLANATION = "explanation"
# the results of a ``tracerag eval`` run, appended to the run's own record
KIND_EVALUATION = "evaluation"
ACTION_KINDS = (
    KIND_REVIEW_ENQUEUED,
    KIND_REVIEW_CLAIMED,
    KIND_REVIEW_RELEASED,
    KIND_REVIEW_DECISION,
    KIND_OPERATOR_ACTION,
    KIND_NOTE,
    KIND_EXPLANATION,
    KIND_EVALUATION,
)
REVIEW_KINDS = (
    KIND_REVIEW_ENQUEUED,
    KIND_REVIEW_CLAIMED,
    KIND_REVIEW_RELEASED,
    KIND_REVIEW_DECISION,
)

SYSTEM_ACTOR = "tracerag"

# Routes that put a request in the review queue, most urgent first.
REVIEW_ROUTES = ("escalate", "review")
REVIEW_ACTIONS = ("approve", "edit", "reject")
QUEUE_STATUSES = ("pending", "claimed", "decided")

# Which top-level record keys go into which entry (any other key travels in the response
# entry under "extra", so nothing in a record is lost).
REGISTER_KEYS = (
    "record_version",
    "trace_id",
    "question",
    "session_id",
    "user_id",
    "channel",
    "tier",
    "versions",
    "params",
    "started_at",
)
RETRIEVE_KEYS = ("materials", "retrieval")
PLAN_KEYS = ("plan",)
VERIFY_KEYS = ("signals",)
RESPONSE_KEYS = (
    "confidence",
    "decision",
    "response",
    "calibration",
    "skipped",
    "timings",
    "warnings",
)
RECORD_ORDER = (
    "request_id",
    *REGISTER_KEYS,
    *RETRIEVE_KEYS,
    *PLAN_KEYS,
    "samples",
    *VERIFY_KEYS,
    *RESPONSE_KEYS[:3],
    "errors",
    *RESPONSE_KEYS[3:],
)

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


class SchemaTooNew(StoreError):
    """The database was written by a newer tracerag (its schema version is unknown here)."""


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


# ---------------------------------------------------------------------------------------------
# Records <-> entries


def _encode(value: Any, what: str) -> str:
    """The canonical JSON text of a value, or ``InvalidRecord`` if it has none."""
    try:
        return canonical_json(value)
    except (TypeError, ValueError) as exc:
        raise InvalidRecord(f"{what} is not JSON-able: {exc}") from exc


def _normalise(value: Any, what: str) -> Any:
    """The value as it will read back from the store (a JSON round trip)."""
    return json.loads(_encode(value, what))


def entries_from_record(record: Mapping[str, Any]) -> list[Entry]:
    """Split one request record into unsealed log entries, in the order they are written.

    register (input, versions, trace_id) → retrieve (materials with scores and ranks) → plan →
    one sample entry per raw sample → verify (signals and per-claim verdicts) → response
    (confidence, decision, response, timings, ...) → one error entry per error or retry.
    Keys this function does not know travel in the response entry under ``extra``.
    """
    if not isinstance(record, Mapping):
        raise InvalidRecord(f"an audit record must be a mapping, not {type(record).__name__}")
    request_id = record.get("request_id")
    if not isinstance(request_id, str) or not request_id.strip() or "\x00" in request_id:
        raise InvalidRecord("an audit record needs a non-empty string request_id")
    record = dict(record)
    what = f"record {request_id!r}"

    def entry(kind: str, payload: dict[str, Any]) -> Entry:
        text = _encode(payload, what)
        return Entry(request_id=request_id, kind=kind, payload=json.loads(text), payload_json=text)

    def part(keys: Sequence[str]) -> dict[str, Any]:
        return {k: record[k] for k in keys if k in record}

    entries = [
        entry(KIND_REGISTER, part(REGISTER_KEYS)),
        entry(KIND_RETRIEVE, part(RETRIEVE_KEYS)),
        entry(KIND_PLAN, part(PLAN_KEYS)),
    ]
    known = {"request_id", *REGISTER_KEYS, *RETRIEVE_KEYS, *PLAN_KEYS, *VERIFY_KEYS}
    known |= set(RESPONSE_KEYS)
    samples = record.get("samples")
    if isinstance(samples, (list, tuple)):
        known.add("samples")
        entries += [entry(KIND_SAMPLE, _wrap(s)) for s in samples]
    entries.append(entry(KIND_VERIFY, part(VERIFY_KEYS)))
    response = part(RESPONSE_KEYS)
    errors = record.get("errors")
    if isinstance(errors, (list, tuple)):
        known.add("errors")
    extra = {k: v for k, v in record.items() if k not in known}
    if extra:
        response["extra"] = extra
    entries.append(entry(KIND_RESPONSE, response))
    if isinstance(errors, (list, tuple)):
        entries += [entry(KIND_ERROR, _wrap(e)) for e in errors]
    return entries


def _wrap(item: Any) -> dict[str, Any]:
    return item if isinstance(item, dict) else {"_value": item}


def _unwrap(payload: dict[str, Any]) -> Any:
    return payload["_value"] if set(payload) == {"_value"} else payload


def record_from_entries(entries: Sequence[Entry]) -> dict[str, Any]:
    """Reassemble the request record from its entries (the inverse of ``entries_from_record``).

    ``samples`` and ``errors`` are always present (possibly empty); action entries are ignored.
    """
    merged: dict[str, Any] = {}
    samples: list[Any] = []
    errors: list[Any] = []
    extra: dict[str, Any] = {}
    for entry in entries:
        if not merged.get("request_id"):
            merged["request_id"] = entry.request_id
        if entry.kind == KIND_SAMPLE:
            samples.append(_unwrap(entry.payload))
        elif entry.kind == KIND_ERROR:
            errors.append(_unwrap(entry.payload))
        elif entry.kind in (KIND_REGISTER, KIND_RETRIEVE, KIND_PLAN, KIND_VERIFY):
            merged.update(entry.payload)
        elif entry.kind == KIND_RESPONSE:
            payload = dict(entry.payload)
            extra.update(payload.pop("extra", None) or {})
            merged.update(payload)
    merged["samples"] = samples
    merged["errors"] = errors
    ordered = {k: merged[k] for k in RECORD_ORDER if k in merged}
    ordered.update({k: v for k, v in merged.items() if k not in ordered})
    ordered.update({k: v for k, v in extra.items() if k not in ordered})
    return ordered


@dataclass
class RequestTrail:
    """Everything stored under one request_id: its entries in seq order and review state."""

    request_id: str
    entries: list[Entry]
    review: QueueItem | None = None
    _record: dict[str, Any] | None = field(default=None, repr=False, compare=False)
    _audit: AuditRecord | None = field(default=None, repr=False, compare=False)

    @property
    def record(self) -> dict[str, Any]:
        """The request record, reassembled from the entries."""
        if self._record is None:
            self._record = record_from_entries(self.entries)
        return self._record

    @property
    def audit(self) -> AuditRecord:
        """The request record, typed (``tracerag.record.AuditRecord``)."""
        if self._audit is None:
            self._audit = AuditRecord.parse(self.record)
        return self._audit

    def of_kind(self, *kinds: str) -> list[Entry]:
        """The entries of the given kinds, in seq order."""
        return [e for e in self.entries if e.kind in kinds]

    def first(self, kind: str) -> Entry | None:
        """The first entry of a kind, or None."""
        found = self.of_kind(kind)
        return found[0] if found else None

    @property
    def trace_id(self) -> str | None:
        return self.record.get("trace_id")

    @property
    def question(self) -> str | None:
        return self.record.get("question")

    @property
    def versions(self) -> dict[str, Any]:
        return self.record.get("versions") or {}

    @property
    def materials(self) -> list[dict[str, Any]]:
        return [m for m in self.record.get("materials") or [] if isinstance(m, dict)]

    @property
    def plan(self) -> dict[str, Any] | None:
        return self.record.get("plan")

    @property
    def samples(self) -> list[Any]:
        return self.record.get("samples") or []

    @property
    def signals(self) -> dict[str, Any]:
        signals = self.record.get("signals")
        return signals if isinstance(signals, dict) else {}

    @property
    def claims(self) -> list[dict[str, Any]]:
        return [c.model_dump(exclude_unset=True) for c in self.audit.claims]

    @property
    def confidence(self) -> float | None:
        return self.record.get("confidence")

    @property
    def decision(self) -> str | None:
        return self.record.get("decision")

    @property
    def response(self) -> Any:
        return self.record.get("response")

    @property
    def errors(self) -> list[Any]:
        return self.record.get("errors") or []

    @property
    def actions(self) -> list[Entry]:
        """Reviewer and operator actions, in the order they happened."""
        return [e for e in self.entries if e.kind not in RECORD_KINDS]

    @property
    def retrieved_ids(self) -> list[str]:
        return [str(m.get("id")) for m in self.materials if m.get("id") is not None]

    @property
    def cited_ids(self) -> list[str]:
        """Every material id the answer cited, in first-cited order."""
        return self.audit.cited_ids

    @property
    def cited_not_retrieved(self) -> list[str]:
        """Cited ids that are not among the retrieved materials (fabricated citations)."""
        return self.audit.cited_not_retrieved

    @property
    def review_decision(self) -> Entry | None:
        """The review decision entry, if the request was decided by a reviewer."""
        found = self.of_kind(KIND_REVIEW_DECISION)
        return found[-1] if found else None

    def to_dict(self) -> dict[str, Any]:
        """A JSON-able form: the reassembled record, every entry and the review state."""
        return {
            "request_id": self.request_id,
            "record": self.record,
            "entries": [e.to_dict() for e in self.entries],
            "review": self.review.to_dict() if self.review else None,
        }


def _summary_fields(record: Mapping[str, Any]) -> dict[str, Any]:
    confidence = record.get("confidence")
    return {
        "trace_id": _str_or_none(record.get("trace_id")),
        "question": _str_or_none(record.get("question")),
        "decision": _str_or_none(record.get("decision")),
        "confidence": float(confidence)
        if isinstance(confidence, (int, float)) and not isinstance(confidence, bool)
        else None,
        "tier": _str_or_none(record.get("tier")),
        "channel": _str_or_none(record.get("channel")),
    }


def _str_or_none(value: Any) -> str | None:
    # PostgreSQL text cannot hold NUL characters
    return None if value is None else str(value).replace("\x00", "\ufffd")


def review_reason(record: Mapping[str, Any]) -> str:
    """Why a routed record needs a human, in one line, from its confidence and signals."""
    parts = [f"decision {record.get('decision')}"]
    confidence = record.get("confidence")
    if isinstance(confidence, (int, float)):
        parts.append(f"confidence {confidence:.2f}")
    typed = AuditRecord.parse(record)
    fabricated = typed.citations.fabricated
    if fabricated:
        parts.append("fabricated citations " + ", ".join(fabricated))
    failed = typed.rules_failed
    if failed:
        parts.append("rules failed " + ", ".join(failed))
    errors = record.get("errors") or []
    if errors:
        parts.append(f"{len(errors)} errors")
    return "; ".join(parts)


# ---------------------------------------------------------------------------------------------
# The protocol


@runtime_checkable
class AuditStore(Protocol):
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
        """Queue items, most urgent and oldest first, optionally of one status."""
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

    def metrics(
        self, since: datetime | str | None = None, until: datetime | str | None = None
    ) -> StoreMetrics:
        """Raw counts for indicators over ``[since, until)``."""
        ...

    def close(self) -> None:
        """Release connections; the store is unusable afterwards."""
        ...


# ---------------------------------------------------------------------------------------------
# Shared SQL implementation


class Cursor(Protocol):
    """The part of a DB-API cursor the shared SQL uses (``?`` placeholders)."""

    def execute(self, sql: str, params: Sequence[Any] = ()) -> Any: ...

    def fetchone(self) -> Any: ...

    def fetchall(self) -> list[Any]: ...


_ENTRY_COLUMNS = "seq, request_id, kind, payload, actor, created_at, prev_hash, hash"
_QUEUE_COLUMNS = (
    "q.request_id, q.route, q.reason, q.status, q.enqueued_at, q.claimed_by, q.claimed_at, "
    "q.decided_by, q.decided_at, q.action, q.final_answer, q.decision_reason, "
    "r.question, r.confidence"
)
_QUEUE_FROM = "review_queue q JOIN requests r ON r.request_id = q.request_id"
_QUEUE_ORDER = "q.priority, q.enqueued_seq"


class _Head:
    """The chain head while a write transaction holds it."""

    def __init__(self, seq: int, hash_: str) -> None:
        self.seq, self.hash = seq, hash_
        self.appended: list[Entry] = []


class SQLAuditStore:
    """The audit store over any SQL database; backends provide connections and locking."""

    #: appended to the claim query (PostgreSQL: ``FOR UPDATE SKIP LOCKED``)
    claim_lock_clause = ""
    #: appended to single-item queue reads inside write transactions
    row_lock_clause = ""

    def __init__(self, auto_enqueue: bool = True) -> None:
        self.auto_enqueue = auto_enqueue

    # -- to be provided by backends -----------------------------------------------------------
    def _write(self) -> AbstractContextManager[tuple[Cursor, _Head]]:
        """A transaction holding the chain head exclusively; commits on normal exit."""
        raise NotImplementedError

    def _read(self) -> AbstractContextManager[Cursor]:
        """A cursor for reads."""
        raise NotImplementedError

    def _snapshot(self) -> AbstractContextManager[Cursor]:
        """A cursor for long reads (verification) that should not hold up writers."""
        return self._read()

    def close(self) -> None:
        raise NotImplementedError

    # -- helpers ------------------------------------------------------------------------------
    @staticmethod
    def _read_head(cur: Cursor) -> _Head:
        cur.execute("SELECT last_seq, last_hash FROM chain_head WHERE id = 1")
        row = cur.fetchone()
        if row is None:
            raise StoreError("the audit store has no chain head row")
        return _Head(int(row[0]), str(row[1]))

    @staticmethod
    def _append(cur: Cursor, head: _Head, entries: Sequence[Entry]) -> list[Entry]:
        """Seal entries onto the chain and insert them (inside a write transaction)."""
        sealed: list[Entry] = []
        for entry in entries:
            seq = head.seq + 1
            created_at = now_iso()
            payload_json = entry.payload_json or canonical_json(entry.payload)
            digest = entry_hash(
                head.hash, seq, entry.request_id, entry.kind, payload_json, entry.actor, created_at
            )
            cur.execute(
                f"INSERT INTO audit_entries ({_ENTRY_COLUMNS}) VALUES (?, ?, ?, ?, ?, ?, ?, ?)",
                (
                    seq,
                    entry.request_id,
                    entry.kind,
                    payload_json,
                    entry.actor,
                    created_at,
                    head.hash,
                    digest,
                ),
            )
            sealed.append(
                Entry(
                    seq=seq,
                    request_id=entry.request_id,
                    kind=entry.kind,
                    payload=entry.payload,
                    actor=entry.actor,
                    created_at=created_at,
                    prev_hash=head.hash,
                    hash=digest,
                    payload_json=payload_json,
                )
            )
            head.seq, head.hash = seq, digest
        head.appended += sealed
        if sealed:
            cur.execute(
                "UPDATE chain_head SET last_seq = ?, last_hash = ? WHERE id = 1",
                (head.seq, head.hash),
            )
            counts: dict[str, int] = {}
            for e in sealed:
                counts[e.request_id] = counts.get(e.request_id, 0) + 1
            for request_id, n in counts.items():
                cur.execute(
                    "UPDATE requests SET n_entries = n_entries + ? WHERE request_id = ?",
                    (n, request_id),
                )
        return sealed

    @staticmethod
    def _exists(cur: Cursor, request_id: str) -> bool:
        cur.execute("SELECT 1 FROM requests WHERE request_id = ?", (request_id,))
        return cur.fetchone() is not None

    def _queue_item(self, cur: Cursor, request_id: str, lock: bool = False) -> QueueItem | None:
        clause = f" {self.row_lock_clause}" if lock and self.row_lock_clause else ""
        if clause:
            # FOR UPDATE cannot lock the nullable side of a join; lock the queue row first.
            cur.execute(
                f"SELECT request_id FROM review_queue WHERE request_id = ?{clause}",
                (request_id,),
            )
        cur.execute(
            f"SELECT {_QUEUE_COLUMNS} FROM {_QUEUE_FROM} WHERE q.request_id = ?", (request_id,)
        )
        row = cur.fetchone()
        return _queue_item_from_row(row) if row else None

    # -- records and actions ------------------------------------------------------------------
    def append_record(self, record: Mapping[str, Any]) -> None:
        entries = entries_from_record(record)
        with self._write() as (cur, head):
            if self._exists(cur, entries[0].request_id):
                raise DuplicateRequest(entries[0].request_id)
            self._insert_record(cur, head, record, entries)

    def append_records(self, records: Sequence[Mapping[str, Any]]) -> list[StoreError | None]:
        """Store several records in one transaction (one commit, one disk sync).

        Returns one outcome per record: None when written, ``DuplicateRequest`` when it was
        already stored (or repeated in the batch), ``InvalidRecord`` when it cannot be stored;
        those records are skipped and the rest are written. Store failures raise and write
        nothing.
        """
        outcomes: list[StoreError | None] = [None] * len(records)
        prepared: list[tuple[int, Mapping[str, Any], list[Entry]]] = []
        for i, record in enumerate(records):
            try:
                prepared.append((i, record, entries_from_record(record)))
            except InvalidRecord as exc:
                outcomes[i] = exc
        if prepared:
            with self._write() as (cur, head):
                seen: set[str] = set()
                for i, record, entries in prepared:
                    request_id = entries[0].request_id
                    if request_id in seen or self._exists(cur, request_id):
                        outcomes[i] = DuplicateRequest(request_id)
                        continue
                    seen.add(request_id)
                    self._insert_record(cur, head, record, entries)
        return outcomes

    def _insert_record(
        self, cur: Cursor, head: _Head, record: Mapping[str, Any], entries: list[Entry]
    ) -> None:
        request_id = entries[0].request_id
        summary = _summary_fields(record)
        cur.execute(
            "INSERT INTO requests (request_id, trace_id, created_at, question, first_seq, "
            "n_entries, decision, confidence, tier, channel) "
            "VALUES (?, ?, ?, ?, ?, 0, ?, ?, ?, ?)",
            (
                request_id,
                summary["trace_id"],
                now_iso(),
                summary["question"],
                head.seq + 1,
                summary["decision"],
                summary["confidence"],
                summary["tier"],
                summary["channel"],
            ),
        )
        self._append(cur, head, entries)
        decision = summary["decision"]
        if self.auto_enqueue and decision in REVIEW_ROUTES:
            self._enqueue(cur, head, request_id, review_reason(record), decision, SYSTEM_ACTOR)

    def append_action(
        self,
        request_id: str,
        kind: str,
        actor: str,
        payload: Mapping[str, Any] | None = None,
        reason: str | None = None,
    ) -> Entry:
        if kind not in ACTION_KINDS:
            raise InvalidRecord(f"unknown action kind {kind!r}; expected one of {ACTION_KINDS}")
        if kind in REVIEW_KINDS:
            raise InvalidRecord(f"{kind} entries are written by the review queue operations")
        body = _action_payload(actor, payload, reason)
        with self._write() as (cur, head):
            if not self._exists(cur, request_id):
                raise RequestNotFound(request_id)
            (entry,) = self._append(
                cur, head, [Entry(request_id=request_id, kind=kind, payload=body, actor=actor)]
            )
        return entry

    def get(self, request_id: str) -> RequestTrail:
        with self._read() as cur:
            cur.execute(
                f"SELECT {_ENTRY_COLUMNS} FROM audit_entries WHERE request_id = ? ORDER BY seq",
                (request_id,),
            )
            rows = cur.fetchall()
            if not rows:
                raise RequestNotFound(request_id)
            review = self._queue_item(cur, request_id)
        return RequestTrail(request_id, [_entry_from_row(r) for r in rows], review)

    def list_requests(
        self,
        since: datetime | str | None = None,
        until: datetime | str | None = None,
        decision: str | None = None,
        limit: int = 100,
    ) -> list[RequestSummary]:
        where, params = _window("r.created_at", since, until)
        if decision is not None:
            where.append("r.decision = ?")
            params.append(decision)
        sql = (
            "SELECT r.request_id, r.trace_id, r.created_at, r.question, r.decision, r.confidence, "
            "r.tier, r.channel, r.n_entries, q.status FROM requests r "
            "LEFT JOIN review_queue q ON q.request_id = r.request_id"
        )
        if where:
            sql += " WHERE " + " AND ".join(where)
        sql += " ORDER BY r.first_seq DESC LIMIT ?"
        params.append(int(limit))
        with self._read() as cur:
            cur.execute(sql, params)
            rows = cur.fetchall()
        return [
            RequestSummary(
                request_id=r[0],
                trace_id=r[1],
                created_at=r[2],
                question=r[3],
                decision=r[4],
                confidence=r[5],
                tier=r[6],
                channel=r[7],
                entries=int(r[8]),
                review_status=r[9],
            )
            for r in rows
        ]

    # -- verification -------------------------------------------------------------------------
    def verify_chain(self, batch: int = 2000, max_issues: int = 1000) -> ChainReport:
        with self._snapshot() as cur:

            def find(h: str) -> StoredRow | None:
                cur.execute(f"SELECT {_ENTRY_COLUMNS} FROM audit_entries WHERE hash = ?", (h,))
                row = cur.fetchone()
                return _stored_row(row) if row else None

            verifier = ChainVerifier(find, max_issues=max_issues)
            last = None
            while True:
                if last is None:
                    cur.execute(
                        f"SELECT {_ENTRY_COLUMNS} FROM audit_entries ORDER BY seq LIMIT ?",
                        (batch,),
                    )
                else:
                    cur.execute(
                        f"SELECT {_ENTRY_COLUMNS} FROM audit_entries WHERE seq > ? "
                        "ORDER BY seq LIMIT ?",
                        (last, batch),
                    )
                rows = cur.fetchall()
                if not rows:
                    break
                for row in rows:
                    verifier.feed(_stored_row(row))
                last = rows[-1][0]
            head = self._read_head(cur)
            cur.execute(
                "SELECT r.request_id, r.n_entries, COUNT(e.seq) FROM requests r "
                "LEFT JOIN audit_entries e ON e.request_id = r.request_id "
                "GROUP BY r.request_id, r.n_entries HAVING COUNT(e.seq) <> r.n_entries "
                "ORDER BY r.request_id"
            )
            counts = [(str(r[0]), int(r[1]), int(r[2])) for r in cur.fetchall()]
        return verifier.finish(head.seq, head.hash, counts)

    # -- review queue -------------------------------------------------------------------------
    def _enqueue(
        self, cur: Cursor, head: _Head, request_id: str, reason: str, route: str, actor: str
    ) -> QueueItem:
        existing = self._queue_item(cur, request_id)
        if existing is not None:
            return existing
        (entry,) = self._append(
            cur,
            head,
            [
                Entry(
                    request_id=request_id,
                    kind=KIND_REVIEW_ENQUEUED,
                    actor=actor,
                    payload=_action_payload(
                        actor,
                        {
                            "route": route,
                            "before": None,
                            "after": {"status": "pending", "route": route},
                        },
                        reason,
                    ),
                )
            ],
        )
        cur.execute(
            "INSERT INTO review_queue (request_id, route, priority, reason, status, "
            "enqueued_seq, enqueued_at) VALUES (?, ?, ?, ?, 'pending', ?, ?)",
            (
                request_id,
                route,
                _priority(route),
                _str_or_none(reason),
                entry.seq,
                entry.created_at,
            ),
        )
        item = self._queue_item(cur, request_id)
        assert item is not None
        return item

    def enqueue_review(
        self, request_id: str, reason: str, decision: str, actor: str = SYSTEM_ACTOR
    ) -> QueueItem:
        if decision not in REVIEW_ROUTES:
            raise InvalidRecord(f"only {REVIEW_ROUTES} requests are queued, not {decision!r}")
        with self._write() as (cur, head):
            if not self._exists(cur, request_id):
                raise RequestNotFound(request_id)
            return self._enqueue(cur, head, request_id, reason, decision, actor)

    def claim_next(self, reviewer: str) -> QueueItem | None:
        _require_actor(reviewer)
        with self._write() as (cur, head):
            cur.execute(
                "SELECT request_id FROM review_queue WHERE status = 'pending' "
                f"ORDER BY priority, enqueued_seq LIMIT 1 {self.claim_lock_clause}"
            )
            row = cur.fetchone()
            if row is None:
                return None
            request_id = row[0]
            claimed_at = now_iso()
            cur.execute(
                "UPDATE review_queue SET status = 'claimed', claimed_by = ?, claimed_at = ? "
                "WHERE request_id = ? AND status = 'pending'",
                (reviewer, claimed_at, request_id),
            )
            self._append(
                cur,
                head,
                [
                    Entry(
                        request_id=request_id,
                        kind=KIND_REVIEW_CLAIMED,
                        actor=reviewer,
                        payload=_action_payload(
                            reviewer,
                            {
                                "before": {"status": "pending"},
                                "after": {"status": "claimed", "claimed_by": reviewer},
                            },
                            None,
                        ),
                    )
                ],
            )
            return self._queue_item(cur, request_id)

    def release(self, request_id: str, actor: str, reason: str | None = None) -> QueueItem:
        _require_actor(actor)
        with self._write() as (cur, head):
            item = self._locked_item(cur, request_id)
            if item.status == "decided":
                raise AlreadyDecided(request_id, item.decided_by, item.action)
            if item.status != "claimed":
                return item
            cur.execute(
                "UPDATE review_queue SET status = 'pending', claimed_by = NULL, claimed_at = NULL "
                "WHERE request_id = ?",
                (request_id,),
            )
            self._append(
                cur,
                head,
                [
                    Entry(
                        request_id=request_id,
                        kind=KIND_REVIEW_RELEASED,
                        actor=actor,
                        payload=_action_payload(
                            actor,
                            {
                                "before": {"status": "claimed", "claimed_by": item.claimed_by},
                                "after": {"status": "pending"},
                            },
                            reason,
                        ),
                    )
                ],
            )
            released = self._queue_item(cur, request_id)
            assert released is not None
            return released

    def _locked_item(self, cur: Cursor, request_id: str) -> QueueItem:
        item = self._queue_item(cur, request_id, lock=True)
        if item is None:
            if not self._exists(cur, request_id):
                raise RequestNotFound(request_id)
            raise NotQueued(request_id)
        return item

    def list_queue(self, status: str | None = None, limit: int = 100) -> list[QueueItem]:
        if status is not None and status not in QUEUE_STATUSES:
            raise ValueError(f"status must be one of {QUEUE_STATUSES}, not {status!r}")
        sql = f"SELECT {_QUEUE_COLUMNS} FROM {_QUEUE_FROM}"
        params: list[Any] = []
        if status is not None:
            sql += " WHERE q.status = ?"
            params.append(status)
        sql += f" ORDER BY {_QUEUE_ORDER} LIMIT ?"
        params.append(int(limit))
        with self._read() as cur:
            cur.execute(sql, params)
            return [_queue_item_from_row(r) for r in cur.fetchall()]

    def decide(
        self,
        request_id: str,
        reviewer: str,
        action: str,
        final_answer: str | None = None,
        reason: str | None = None,
    ) -> ReviewDecision:
        _require_actor(reviewer)
        if action not in REVIEW_ACTIONS:
            raise ValueError(f"action must be one of {REVIEW_ACTIONS}, not {action!r}")
        if action == "edit" and not (final_answer and final_answer.strip()):
            raise ValueError("an edit needs the final answer")
        if action in ("edit", "reject") and not (reason and reason.strip()):
            raise ValueError(f"a {action} needs a reason")
        with self._write() as (cur, head):
            item = self._locked_item(cur, request_id)
            if item.status == "decided":
                raise AlreadyDecided(request_id, item.decided_by, item.action)
            if item.status == "claimed" and item.claimed_by != reviewer:
                raise ClaimedByOther(request_id, item.claimed_by)
            decided_at = now_iso()
            cur.execute(
                "UPDATE review_queue SET status = 'decided', decided_by = ?, decided_at = ?, "
                "action = ?, final_answer = ?, decision_reason = ? "
                "WHERE request_id = ? AND status <> 'decided'",
                (reviewer, decided_at, action, final_answer, reason, request_id),
            )
            self._append(
                cur,
                head,
                [
                    Entry(
                        request_id=request_id,
                        kind=KIND_REVIEW_DECISION,
                        actor=reviewer,
                        payload=_action_payload(
                            reviewer,
                            {
                                "action": action,
                                "final_answer": final_answer,
                                "before": {"status": item.status, "claimed_by": item.claimed_by},
                                "after": {"status": "decided", "action": action},
                            },
                            reason,
                        ),
                    )
                ],
            )
        return ReviewDecision(request_id, reviewer, action, final_answer, reason, decided_at)

    def get_decision(self, request_id: str) -> ReviewDecision | None:
        with self._read() as cur:
            item = self._queue_item(cur, request_id)
            if item is None and not self._exists(cur, request_id):
                raise RequestNotFound(request_id)
        if item is None or item.status != "decided":
            return None
        return ReviewDecision(
            request_id,
            item.decided_by or "",
            item.action or "",
            item.final_answer,
            item.decision_reason,
            item.decided_at or "",
        )

    # -- metrics ------------------------------------------------------------------------------
    def metrics(
        self, since: datetime | str | None = None, until: datetime | str | None = None
    ) -> StoreMetrics:
        out = StoreMetrics(since=to_iso(since), until=to_iso(until))
        where, params = _window("r.created_at", since, until)
        cond = (" WHERE " + " AND ".join(where)) if where else ""
        dwhere, dparams = _window("q.decided_at", since, until)
        dcond = " AND ".join(["q.status = 'decided'", *dwhere])
        with self._read() as cur:
            cur.execute(
                f"SELECT r.decision, COUNT(*), AVG(r.confidence) FROM requests r{cond} "
                "GROUP BY r.decision",
                params,
            )
            weighted, n_conf = 0.0, 0
            for decision, count, mean in cur.fetchall():
                out.requests += int(count)
                out.by_decision[str(decision) if decision is not None else "none"] = int(count)
                if mean is not None:
                    weighted += float(mean) * int(count)
                    n_conf += int(count)
            out.confidence_mean = weighted / n_conf if n_conf else None
            cur.execute(
                "SELECT COUNT(DISTINCT r.request_id) FROM requests r JOIN audit_entries e "
                f"ON e.request_id = r.request_id AND e.kind = 'error'{cond}",
                params,
            )
            out.with_errors = int(cur.fetchone()[0])
            cur.execute("SELECT status, COUNT(*) FROM review_queue GROUP BY status")
            out.queue = {str(s): int(n) for s, n in cur.fetchall()}
            cur.execute("SELECT MIN(enqueued_at) FROM review_queue WHERE status = 'pending'")
            out.oldest_pending_at = cur.fetchone()[0]
            cur.execute(
                f"SELECT q.action, q.enqueued_at, q.decided_at FROM review_queue q WHERE {dcond}",
                dparams,
            )
            durations = []
            for action, enqueued_at, decided_at in cur.fetchall():
                out.review_actions[str(action)] = out.review_actions.get(str(action), 0) + 1
                try:
                    delta = datetime.fromisoformat(decided_at) - datetime.fromisoformat(enqueued_at)
                    durations.append(delta.total_seconds())
                except (TypeError, ValueError):
                    pass
            out.review_seconds_median = statistics.median(durations) if durations else None
            cur.execute("SELECT last_seq FROM chain_head WHERE id = 1")
            out.entries = int(cur.fetchone()[0])
        return out

    # -- iteration for exports ----------------------------------------------------------------
    def iter_entries(self, after_seq: int = 0, batch: int = 1000) -> Iterator[Entry]:
        """Every entry in seq order, starting after ``after_seq`` (for exports and backups)."""
        last = after_seq
        while True:
            with self._read() as cur:
                cur.execute(
                    f"SELECT {_ENTRY_COLUMNS} FROM audit_entries WHERE seq > ? "
                    "ORDER BY seq LIMIT ?",
                    (last, batch),
                )
                rows = cur.fetchall()
            if not rows:
                return
            for row in rows:
                yield _entry_from_row(row)
            last = rows[-1][0]

    def __enter__(self) -> SQLAuditStore:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def _priority(route: str) -> int:
    return REVIEW_ROUTES.index(route) if route in REVIEW_ROUTES else len(REVIEW_ROUTES)


def _require_actor(actor: str) -> None:
    if not isinstance(actor, str) or not actor.strip() or "\x00" in actor:
        raise InvalidRecord("every action needs a named actor")


def _action_payload(
    actor: str, payload: Mapping[str, Any] | None, reason: str | None
) -> dict[str, Any]:
    _require_actor(actor)
    body = _normalise(dict(payload or {}), "action payload")
    body["reason"] = reason
    return body


def _window(
    column: str, since: datetime | str | None, until: datetime | str | None
) -> tuple[list[str], list[Any]]:
    where: list[str] = []
    params: list[Any] = []
    if since is not None:
        where.append(f"{column} >= ?")
        params.append(to_iso(since))
    if until is not None:
        where.append(f"{column} < ?")
        params.append(to_iso(until))
    return where, params


def _stored_row(row: Sequence[Any]) -> StoredRow:
    return StoredRow(int(row[0]), *(str(v) for v in row[1:8]))


def _entry_from_row(row: Sequence[Any]) -> Entry:
    try:
        payload = json.loads(row[3])
        if not isinstance(payload, dict):
            payload = {"_value": payload}
    except (TypeError, ValueError):
        payload = {"_unparseable": row[3]}
    return Entry(
        seq=int(row[0]),
        request_id=row[1],
        kind=row[2],
        payload=payload,
        actor=row[4],
        created_at=row[5],
        prev_hash=row[6],
        hash=row[7],
    )


def _queue_item_from_row(row: Sequence[Any]) -> QueueItem:
    return QueueItem(*row[:14])


__all__ = [
    "ACTION_KINDS",
    "GENESIS_HASH",
    "KIND_EVALUATION",
    "RECORD_KINDS",
    "REVIEW_ACTIONS",
    "REVIEW_ROUTES",
    "AlreadyDecided",
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
    "SQLAuditStore",
    "SchemaTooNew",
    "StoreError",
    "StoreMetrics",
    "entries_from_record",
    "record_from_entries",
]
