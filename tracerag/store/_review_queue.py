"""The review queue: requests routed to a person, claimed, released and decided.

``SQLReviewQueue`` is the SQL implementation, an object of ``SQLAuditStore`` that owns the
``review_queue`` table and writes through the store's ``ChainLog``: every change of an item is
an entry sealed onto the hash chain in the same transaction as the row it updates, so the
table is derived from the chain and ``verify_chain`` checks it against the chain.
``ReviewQueue`` (``tracerag.store._base``) is the protocol the server and tools use.
"""

from __future__ import annotations

import json
import math
import re
from collections.abc import Callable, Mapping, Sequence
from datetime import datetime, timezone
from typing import Any

from tracerag.errors import InputError
from tracerag.store._chain_log import (
    ENTRY_COLUMNS,
    ChainLog,
    Cursor,
    Head,
    entry_from_row,
    request_exists,
)
from tracerag.store._codec import _str_or_none, action_payload, require_actor
from tracerag.store._types import (
    KIND_REVIEW_ASSIGNED,
    KIND_REVIEW_CLAIMED,
    KIND_REVIEW_COMMENT,
    KIND_REVIEW_DECISION,
    KIND_REVIEW_ENQUEUED,
    KIND_REVIEW_RELEASED,
    KIND_REVIEW_VOTE,
    QUEUE_STATUSES,
    REVIEW_ACTIONS,
    REVIEW_ROUTES,
    SYSTEM_ACTOR,
    AlreadyDecided,
    AlreadyReviewed,
    ClaimedByOther,
    Entry,
    InvalidRecord,
    NotQueued,
    QueueItem,
    RequestNotFound,
    ReviewDecision,
    ReviewOutcome,
    now_iso,
)
from tracerag.telemetry._instruments import record_review_decision
from tracerag.telemetry._review import watch_review_queue

_QUEUE_COLUMNS = (
    "q.request_id, q.route, q.reason, q.status, q.enqueued_at, q.claimed_by, q.claimed_at, "
    "q.decided_by, q.decided_at, q.action, q.final_answer, q.decision_reason, "
    "r.question, r.confidence"
)
_QUEUE_FROM = "review_queue q JOIN requests r ON r.request_id = q.request_id"
_QUEUE_ORDER = "q.priority, q.enqueued_seq"
_SCORE_NAME = re.compile(r"^[A-Za-z][A-Za-z0-9_]{0,39}$")


class SQLReviewQueue:
    """The review queue of one SQL store, written through its chain log.

    ``row_lock_clause`` is appended to single-item reads inside write transactions and
    ``claim_lock_clause`` to the claim query (PostgreSQL: ``FOR UPDATE [SKIP LOCKED]``).
    """

    def __init__(
        self,
        log: ChainLog,
        *,
        row_lock_clause: str = "",
        claim_lock_clause: str = "",
        location: Callable[[], str] = lambda: "<audit store>",
    ) -> None:
        self._log = log
        self.row_lock_clause = row_lock_clause
        self.claim_lock_clause = claim_lock_clause
        self._location = location

    @property
    def location(self) -> str:
        """Where the queue's database is (its store's location): one database watched by
        several stores of a process reports its backlog once."""
        return self._location()

    def _seal(
        self,
        cur: Cursor,
        head: Head,
        request_id: str,
        kind: str,
        actor: str,
        body: Mapping[str, Any],
        reason: str | None,
    ) -> Entry:
        """Seal an actor's entry on a request: ``body`` and ``reason`` as its payload."""
        payload = action_payload(actor, body, reason)
        return self._log.seal_one(
            cur, head, Entry(request_id=request_id, kind=kind, actor=actor, payload=payload)
        )

    def item_in(self, cur: Cursor, request_id: str, lock: bool = False) -> QueueItem | None:
        """The queue item of a request, read in the caller's transaction (None: not queued)."""
        clause = f" {self.row_lock_clause}" if lock and self.row_lock_clause else ""
        if clause:
            # FOR UPDATE cannot lock the nullable side of a join; lock the queue row first.
            cur.execute(
                f"SELECT request_id FROM review_queue WHERE request_id = %s{clause}",
                (request_id,),
            )
        cur.execute(
            f"SELECT {_QUEUE_COLUMNS} FROM {_QUEUE_FROM} WHERE q.request_id = %s", (request_id,)
        )
        row = cur.fetchone()
        return _queue_item_from_row(row) if row else None

    def enqueue_in(
        self, cur: Cursor, head: Head, request_id: str, reason: str, route: str, actor: str
    ) -> QueueItem:
        """Queue a request in the caller's write transaction (the existing item if queued)."""
        existing = self.item_in(cur, request_id)
        if existing is not None:
            return existing
        entry = self._seal(
            cur,
            head,
            request_id,
            KIND_REVIEW_ENQUEUED,
            actor,
            {
                "route": route,
                "before": None,
                "after": {"status": "pending", "route": route},
            },
            reason,
        )
        cur.execute(
            "INSERT INTO review_queue (request_id, route, priority, reason, status, "
            "enqueued_seq, enqueued_at) VALUES (%s, %s, %s, %s, 'pending', %s, %s)",
            (
                request_id,
                route,
                _priority(route),
                _str_or_none(reason),
                entry.seq,
                entry.created_at,
            ),
        )
        item = self.item_in(cur, request_id)
        assert item is not None
        watch_review_queue(self)
        return item

    def enqueue_review(
        self, request_id: str, reason: str, decision: str, actor: str = SYSTEM_ACTOR
    ) -> QueueItem:
        if decision not in REVIEW_ROUTES:
            raise InvalidRecord(f"only {REVIEW_ROUTES} requests are queued, not {decision!r}")
        with self._log.write() as (cur, head):
            if not request_exists(cur, request_id):
                raise RequestNotFound(request_id)
            return self.enqueue_in(cur, head, request_id, reason, decision, actor)

    def claim_next(self, reviewer: str) -> QueueItem | None:
        require_actor(reviewer)
        with self._log.write() as (cur, head):
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
                "UPDATE review_queue SET status = 'claimed', claimed_by = %s, claimed_at = %s "
                "WHERE request_id = %s AND status = 'pending'",
                (reviewer, claimed_at, request_id),
            )
            self._seal(
                cur,
                head,
                request_id,
                KIND_REVIEW_CLAIMED,
                reviewer,
                {
                    "before": {"status": "pending"},
                    "after": {"status": "claimed", "claimed_by": reviewer},
                },
                None,
            )
            return self.item_in(cur, request_id)

    def release(self, request_id: str, actor: str, reason: str | None = None) -> QueueItem:
        require_actor(actor)
        with self._log.write() as (cur, head):
            item = self._locked_item(cur, request_id)
            if item.status == "decided":
                raise AlreadyDecided(request_id, item.decided_by, item.action)
            if item.status != "claimed":
                return item
            cur.execute(
                "UPDATE review_queue SET status = 'pending', claimed_by = NULL, claimed_at = NULL "
                "WHERE request_id = %s",
                (request_id,),
            )
            self._seal(
                cur,
                head,
                request_id,
                KIND_REVIEW_RELEASED,
                actor,
                {
                    "before": {"status": "claimed", "claimed_by": item.claimed_by},
                    "after": {"status": "pending"},
                },
                reason,
            )
            released = self.item_in(cur, request_id)
            assert released is not None
            return released

    def _locked_item(self, cur: Cursor, request_id: str) -> QueueItem:
        item = self.item_in(cur, request_id, lock=True)
        if item is None:
            if not request_exists(cur, request_id):
                raise RequestNotFound(request_id)
            raise NotQueued(request_id)
        return item

    def review_backlog(self) -> tuple[dict[tuple[str, str], int], dict[str, float]]:
        """What waits in the queue: ``{(status, route): count}`` of undecided items and
        ``{route: seconds}`` the longest-waiting of each route has waited (its gauges,
        ``tracerag.telemetry._review``)."""
        sql = (
            "SELECT status, route, COUNT(*), MIN(enqueued_at) FROM review_queue "
            "WHERE status <> 'decided' GROUP BY status, route"
        )
        counts: dict[tuple[str, str], int] = {}
        oldest: dict[str, float] = {}
        now = datetime.now(timezone.utc)
        with self._log.read() as cur:
            cur.execute(sql, [])
            rows = cur.fetchall()
        for status, route, count, first in rows:
            counts[(str(status), str(route))] = int(count)
            waited = _seconds_between(first, now)
            if waited is not None:
                oldest[str(route)] = max(oldest.get(str(route), 0.0), waited)
        return counts, oldest

    def list_queue(self, status: str | None = None, limit: int = 100) -> list[QueueItem]:
        if status is not None and status not in (*QUEUE_STATUSES, "open"):
            raise InputError(f"status must be one of {QUEUE_STATUSES} or open, not {status!r}")
        sql = f"SELECT {_QUEUE_COLUMNS} FROM {_QUEUE_FROM}"
        params: list[Any] = []
        if status == "open":
            sql += " WHERE q.status <> 'decided'"
        elif status is not None:
            sql += " WHERE q.status = %s"
            params.append(status)
        sql += f" ORDER BY {_QUEUE_ORDER} LIMIT %s"
        params.append(int(limit))
        watch_review_queue(self)  # a desk that only reads the queue reports its backlog too
        with self._log.read() as cur:
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
        require_actor(reviewer)
        _check_judgement(action, final_answer, reason)
        with self._log.write() as (cur, head):
            item = self._open_item(cur, request_id, reviewer)
            return self._settle(cur, head, item, reviewer, action, final_answer, reason, {})

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
        """One reviewer's judgement on an item that needs ``required`` reviewers.

        Until ``required`` reviewers have judged it, each judgement is a ``review_vote`` entry
        and a reviewer judges an item once (``AlreadyReviewed``). The last one settles the
        item when every judgement chose the same action; otherwise the item is disputed and
        the next judgement — by anyone, those who voted included — settles it. Settling is the
        decision (``review_decision``), with the votes and ``agreement`` in its payload. Votes,
        the count and the decision are read and written in one transaction.
        """
        require_actor(reviewer)
        _check_judgement(action, final_answer, reason)
        if not isinstance(required, int) or required < 1:
            raise InvalidRecord("an item needs at least one reviewer")
        marks = _scores(scores)
        with self._log.write() as (cur, head):
            item = self._open_item(cur, request_id, reviewer)
            votes = self._votes(cur, request_id)
            disputed = len(votes) >= required
            if not disputed and any(v.actor == reviewer for v in votes):
                raise AlreadyReviewed(request_id, reviewer)
            n = len(votes) + 1
            agreed = all(v.payload.get("action") == action for v in votes)
            if n < required or (n == required and not agreed):
                self._seal(
                    cur,
                    head,
                    request_id,
                    KIND_REVIEW_VOTE,
                    reviewer,
                    {
                        "action": action,
                        "final_answer": final_answer,
                        "scores": marks,
                        "vote": n,
                        "required": required,
                    },
                    reason,
                )
                return ReviewOutcome(
                    request_id, reviewer, action, n, required, disputed=n == required
                )
            how = (
                "single"
                if required == 1 and not votes
                else ("adjudicated" if disputed else "unanimous")
            )
            extra: dict[str, Any] = {"scores": marks, "agreement": how, "required": required}
            if votes:
                extra["votes"] = [
                    {
                        "seq": v.seq,
                        "reviewer": v.actor,
                        "action": v.payload.get("action"),
                        "scores": v.payload.get("scores") or {},
                    }
                    for v in votes
                ]
            decision = self._settle(cur, head, item, reviewer, action, final_answer, reason, extra)
            return ReviewOutcome(request_id, reviewer, action, n, required, decision, disputed, how)

    def comment(self, request_id: str, author: str, text: str) -> Entry:
        """A reviewer's comment on a queued item (decided ones too), chained."""
        require_actor(author)
        if not isinstance(text, str) or not text.strip():
            raise InvalidRecord("a comment needs text")
        with self._log.write() as (cur, head):
            self._locked_item(cur, request_id)
            return self._seal(
                cur, head, request_id, KIND_REVIEW_COMMENT, author, {"text": text.strip()}, None
            )

    def assign(self, request_id: str, assignee: str | None, actor: str) -> Entry | None:
        """Assign an undecided item to a reviewer (None: unassign); None when it changes
        nothing. Raises ``AlreadyDecided`` on a decided item."""
        require_actor(actor)
        if assignee is not None:
            require_actor(assignee)
        with self._log.write() as (cur, head):
            item = self._locked_item(cur, request_id)
            if item.status == "decided":
                raise AlreadyDecided(request_id, item.decided_by, item.action)
            cur.execute(
                "SELECT payload FROM audit_entries WHERE kind = %s AND request_id = %s "
                "ORDER BY seq DESC LIMIT 1",
                (KIND_REVIEW_ASSIGNED, request_id),
            )
            row = cur.fetchone()
            before = _payload(row[0]).get("assignee") if row else None
            if before == assignee:
                return None
            body = {"assignee": assignee, "before": before}
            return self._seal(cur, head, request_id, KIND_REVIEW_ASSIGNED, actor, body, None)

    def review_entries(
        self,
        kinds: Sequence[str],
        request_ids: Sequence[str] | None = None,
        *,
        open_only: bool = False,
    ) -> list[Entry]:
        """The entries of ``kinds`` (votes, comments, assignments...), in seq order: of the
        given requests, or of every queued item (``open_only``: undecided ones only)."""
        if not kinds:
            return []
        columns = ", ".join(f"e.{c}" for c in ENTRY_COLUMNS.split(", "))
        marks = ", ".join(["%s"] * len(kinds))
        sql = (
            f"SELECT {columns} FROM audit_entries e JOIN review_queue q "
            f"ON q.request_id = e.request_id WHERE e.kind IN ({marks})"
        )
        params: list[Any] = list(kinds)
        if open_only:
            sql += " AND q.status <> 'decided'"
        out = []
        with self._log.read() as cur:
            if request_ids is None:
                cur.execute(sql + " ORDER BY e.seq", params)
                out = [entry_from_row(r) for r in cur.fetchall()]
            else:
                ids = list(dict.fromkeys(request_ids))
                for start in range(0, len(ids), 200):
                    chunk = ids[start : start + 200]
                    where = f" AND e.request_id IN ({', '.join(['%s'] * len(chunk))})"
                    cur.execute(sql + where, params + chunk)
                    out += [entry_from_row(r) for r in cur.fetchall()]
                out.sort(key=lambda e: e.seq)
        return out

    def _votes(self, cur: Cursor, request_id: str) -> list[Entry]:
        return self._log.entries(
            cur, "kind = %s AND request_id = %s", (KIND_REVIEW_VOTE, request_id)
        )

    def _open_item(self, cur: Cursor, request_id: str, reviewer: str) -> QueueItem:
        """The locked, undecided queue item that ``reviewer`` may judge."""
        item = self._locked_item(cur, request_id)
        if item.status == "decided":
            raise AlreadyDecided(request_id, item.decided_by, item.action)
        if item.status == "claimed" and item.claimed_by != reviewer:
            raise ClaimedByOther(request_id, item.claimed_by)
        return item

    def _settle(
        self,
        cur: Cursor,
        head: Head,
        item: QueueItem,
        reviewer: str,
        action: str,
        final_answer: str | None,
        reason: str | None,
        extra: Mapping[str, Any],
    ) -> ReviewDecision:
        request_id = item.request_id
        decided_at = now_iso()
        cur.execute(
            "UPDATE review_queue SET status = 'decided', decided_by = %s, decided_at = %s, "
            "action = %s, final_answer = %s, decision_reason = %s "
            "WHERE request_id = %s AND status <> 'decided'",
            (reviewer, decided_at, action, final_answer, reason, request_id),
        )
        self._seal(
            cur,
            head,
            request_id,
            KIND_REVIEW_DECISION,
            reviewer,
            {
                "action": action,
                "final_answer": final_answer,
                "before": {"status": item.status, "claimed_by": item.claimed_by},
                "after": {"status": "decided", "action": action},
                **extra,
            },
            reason,
        )
        waited = _seconds_between(item.enqueued_at, decided_at)
        if waited is not None:
            record_review_decision(item.route, action, waited)
        return ReviewDecision(request_id, reviewer, action, final_answer, reason, decided_at)

    def get_decision(self, request_id: str) -> ReviewDecision | None:
        with self._log.read() as cur:
            item = self.item_in(cur, request_id)
            if item is None and not request_exists(cur, request_id):
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


#: the most a rubric score may be (and the least, negated)
MAX_SCORE = 1000


def _seconds_between(start: Any, end: Any) -> float | None:
    """Seconds from ``start`` to ``end`` (ISO texts as the store writes them, or datetimes);
    None when either cannot be read."""
    try:
        first = start if isinstance(start, datetime) else datetime.fromisoformat(str(start))
        last = end if isinstance(end, datetime) else datetime.fromisoformat(str(end))
        if first.tzinfo is None:
            first = first.replace(tzinfo=timezone.utc)
        if last.tzinfo is None:
            last = last.replace(tzinfo=timezone.utc)
        return max(0.0, (last - first).total_seconds())
    except (TypeError, ValueError):
        return None


def _check_judgement(action: str, final_answer: str | None, reason: str | None) -> None:
    if action not in REVIEW_ACTIONS:
        raise InvalidRecord(f"action must be one of {REVIEW_ACTIONS}, not {action!r}")
    if action == "edit" and not (final_answer and final_answer.strip()):
        raise InvalidRecord("an edit needs the final answer")
    if action in ("edit", "reject") and not (reason and reason.strip()):
        raise InvalidRecord(f"a {action} needs a reason")


def _scores(scores: Mapping[str, float] | None) -> dict[str, float]:
    """Rubric scores as ``{dimension: number}``: names are short words, values finite."""
    out: dict[str, float] = {}
    for name, value in (scores or {}).items():
        if not isinstance(name, str) or not _SCORE_NAME.match(name):
            raise InvalidRecord(f"a rubric dimension is a short name, not {name!r}")
        if isinstance(value, bool) or not isinstance(value, (int, float)):
            raise InvalidRecord(f"the score of {name} must be a number, not {value!r}")
        if not math.isfinite(value) or abs(value) > MAX_SCORE:
            raise InvalidRecord(f"the score of {name} is out of range: {value!r}")
        out[name] = int(value) if float(value).is_integer() else float(value)
    return out


def _payload(text: Any) -> dict[str, Any]:
    try:
        value = json.loads(text)
    except (TypeError, ValueError):
        return {}
    return value if isinstance(value, dict) else {}


def _priority(route: str) -> int:
    return REVIEW_ROUTES.index(route) if route in REVIEW_ROUTES else len(REVIEW_ROUTES)


def _queue_item_from_row(row: Sequence[Any]) -> QueueItem:
    return QueueItem(
        row[0],
        row[1],
        row[2],
        row[3],
        row[4],
        row[5],
        row[6],
        row[7],
        row[8],
        row[9],
        row[10],
        row[11],
        row[12],
        row[13],
    )
