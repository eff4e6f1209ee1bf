"""The SQL audit store that SQLite and PostgreSQL share: log, request index, verification.

Statements use the DB-API ``format`` paramstyle (``%s``, and ``%%`` for a literal ``%``), which
is psycopg's own; the SQLite backend's cursor translates it to ``qmark`` token by token (see
``tracerag.store.sqlite``). Backends supply connections, the transaction that serialises
appends, and how migrations are locked (``tracerag.store.migrations`` holds the one schema).
"""

from __future__ import annotations

import json
import logging
import statistics
from collections.abc import Callable, Iterator, Mapping, Sequence
from contextlib import AbstractContextManager, contextmanager
from datetime import datetime
from typing import Any, TypeVar

from tracerag.store._chain import (
    ChainReport,
    jcs_json,
    key_bytes,
)
from tracerag.store._chain_check import check_chain
from tracerag.store._chain_log import (
    ChainLog,
    Head,
    entries_after,
    entry_from_row,
    read_head,
    read_meta,
    request_exists,
)
from tracerag.store._chain_log import Cursor as Cursor
from tracerag.store._codec import (
    RequestTrail,
    _summary_fields,
    action_payload,
    entries_from_record,
    review_reason,
)
from tracerag.store._group_commit import MAX_GROUP as MAX_GROUP
from tracerag.store._group_commit import GroupCommit
from tracerag.store._kept import Kept
from tracerag.store._review_queue import SQLReviewQueue
from tracerag.store._types import (
    ACTION_KINDS,
    KIND_MATERIAL_CHANGE,
    KIND_QUARANTINED,
    KIND_RESPONSE,
    REVIEW_KINDS,
    REVIEW_ROUTES,
    SYSTEM_ACTOR,
    DuplicateRequest,
    Entry,
    InvalidRecord,
    QueueItem,
    RequestNotFound,
    RequestSummary,
    ReviewDecision,
    ReviewOutcome,
    StoreError,
    StoreMetrics,
    now_iso,
    to_iso,
)

logger = logging.getLogger("tracerag.audit")
T = TypeVar("T")


_UNSET: Any = object()
#: the chain head a backend's write transaction yields (the name the backends import)
_Head = Head


class SQLAuditStore:
    """The audit store over any SQL database; backends provide connections and locking.

    It composes its ``ChainLog`` (entries sealed onto the chain in the backend's write
    transactions) and its ``SQLReviewQueue`` (which writes through that log).
    """

    #: appended to the claim query (PostgreSQL: ``FOR UPDATE SKIP LOCKED``)
    claim_lock_clause = ""
    #: appended to single-item queue reads inside write transactions
    row_lock_clause = ""

    def __init__(self, auto_enqueue: bool = True, chain_key: str | bytes | None = None) -> None:
        self.auto_enqueue = auto_enqueue
        self._key = key_bytes(chain_key)
        self._log = ChainLog(self._write, self._read, self._key)
        self._queue = SQLReviewQueue(
            self._log,
            row_lock_clause=self.row_lock_clause,
            claim_lock_clause=self.claim_lock_clause,
            location=lambda: self.location,
        )
        # group commit of concurrent append_record calls (see append_record)
        self._commits = GroupCommit(
            self._write, self._insert_record, self.interrupt, lambda: self.location
        )

    #: True for a store reached over the network (it can be down while the app runs)
    networked = False
    #: transactions that committed records of append_record (fewer than calls: grouped)
    group_commits = Kept[int]("_commits", "commits")
    #: seconds an append_record transaction may take before it is interrupted (a hung
    #: server or disk; the backends' own timeouts normally fire first); 0: no bound
    commit_timeout = Kept[float]("_commits")
    #: after the store failed a group, for this many seconds (and while another attempt is
    #: under way) append_record fails at once instead of waiting for the store again
    fail_fast_seconds = Kept[float]("_commits")

    @property
    def location(self) -> str:
        """Where the store is (a path, or a database URL without credentials)."""
        return "<audit store>"

    @property
    def chain_key(self) -> bytes | None:
        """The key this store seals entries with (None: unkeyed), for the journal feeding it."""
        return self._key

    def check(self) -> None:
        """Raise ``StoreVanished`` when the store disappeared under this object (if knowable)."""

    def interrupt(self) -> None:
        """Make operations in progress fail now (a hung store); a no-op where not possible."""

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

    #: the chain head row, read in a backend's write transaction
    _read_head = staticmethod(read_head)

    # -- identity -----------------------------------------------------------------------------
    def identity(self) -> dict[str, Any]:
        """Who this store is: ``store_id``, ``genesis`` (the chain's first link), ``location``."""
        with self._read() as cur:
            meta = read_meta(cur)
        return {
            "store_id": meta.get("store_id"),
            "genesis": meta.get("genesis"),
            "created_at": meta.get("created_at"),
            "location": self.location,
        }

    def head(self) -> dict[str, Any]:
        """The chain head now, with the store's identity: what to keep outside as an anchor."""
        with self._read() as cur:
            meta = read_meta(cur)
            head = read_head(cur)
        return {
            "store_id": meta.get("store_id"),
            "seq": head.seq,
            "hash": head.hash,
            "at": now_iso(),
            "location": self.location,
        }

    def hash_at(self, seq: int) -> str | None:
        """The stored hash of the entry at ``seq`` (None: no such entry)."""
        with self._read() as cur:
            cur.execute("SELECT hash FROM audit_entries WHERE seq = %s", (seq,))
            row = cur.fetchone()
        return str(row[0]) if row else None

    def ping(self) -> None:
        """Raise unless a write transaction can be started now (it writes nothing).

        A store that answers reads but is locked for writing (another process holds the lock)
        fails this, so the writer does not mistake a locked store for a poisoned record.
        """
        with self._write():
            pass
        self._commits.failed = None  # writable again: append_record need not refuse

    # -- records and actions ------------------------------------------------------------------
    def append_record(self, record: Mapping[str, Any]) -> None:
        """Store one record; return once it is committed.

        Calls from several threads at once share one transaction (see
        ``GroupCommit.append_record``): each caller gets its own outcome (``DuplicateRequest``,
        ``InvalidRecord``, or the store's failure), a transaction hanging past
        ``commit_timeout`` is interrupted, and a failing store makes new calls fail at once
        (``StoreFailing``) for ``fail_fast_seconds``.
        """
        self._commits.append_record(record)

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
                    if request_id in seen or request_exists(cur, request_id):
                        outcomes[i] = DuplicateRequest(request_id)
                        continue
                    seen.add(request_id)
                    self._insert_record(cur, head, record, entries)
            self._commits.failed = None  # the store works: append_record need not refuse
        return outcomes

    def _insert_record(
        self, cur: Cursor, head: Head, record: Mapping[str, Any], entries: list[Entry]
    ) -> None:
        request_id = entries[0].request_id
        # the index holds exactly what the chain says (verify_chain rebuilds it from there)
        summary = _summary_fields(
            {
                **entries[0].payload,
                **next(e.payload for e in entries if e.kind == KIND_RESPONSE),
            }
        )
        cur.execute(
            "INSERT INTO requests (request_id, trace_id, created_at, question, first_seq, "
            "n_entries, decision, confidence, tier, channel) "
            "VALUES (%s, %s, %s, %s, %s, 0, %s, %s, %s, %s)",
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
        self._log.seal(cur, head, entries)
        decision = summary["decision"]
        if self.auto_enqueue and decision in REVIEW_ROUTES:
            self._queue.enqueue_in(
                cur, head, request_id, review_reason(record), decision, SYSTEM_ACTOR
            )

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
        body = action_payload(actor, payload, reason)
        with self._write() as (cur, head):
            if not request_exists(cur, request_id):
                raise RequestNotFound(request_id)
            return self._log.seal_one(
                cur, head, Entry(request_id=request_id, kind=kind, payload=body, actor=actor)
            )

    def append_quarantined(
        self, request_id: str, reason: str, raw: str, raw_truncated: bool = False
    ) -> Entry:
        """Store a record that could not be stored as given, as one ``quarantined`` entry.

        ``raw`` is the record as ASCII-escaped JSON text (lossless for lone surrogates and the
        like); ``reason`` says why. Raises ``DuplicateRequest`` when the request_id is stored.
        """
        payload = {"reason": str(reason), "raw": str(raw), "raw_truncated": bool(raw_truncated)}
        text = jcs_json(payload)
        entry = Entry(
            request_id=request_id,
            kind=KIND_QUARANTINED,
            payload=json.loads(text),
            payload_json=text,
        )
        with self._write() as (cur, head):
            if request_exists(cur, request_id):
                raise DuplicateRequest(request_id)
            cur.execute(
                "INSERT INTO requests (request_id, trace_id, created_at, question, first_seq, "
                "n_entries, decision, confidence, tier, channel) "
                "VALUES (%s, NULL, %s, NULL, %s, 0, NULL, NULL, NULL, NULL)",
                (request_id, now_iso(), head.seq + 1),
            )
            return self._log.seal_one(cur, head, entry)

    def append_material_change(
        self,
        material_id: str,
        actor: str,
        payload: Mapping[str, Any],
        reason: str | None = None,
    ) -> Entry:
        """Chain one material change: a ``material_change`` entry under the material's id.

        The same door as ``ChainedWrite.material_change``, in a transaction of its own.
        """
        return self.chained(lambda tx: tx.material_change(material_id, actor, payload, reason))

    def chained(self, work: Callable[[ChainedWrite], T]) -> T:
        """Run ``work`` in one write transaction that holds the chain head.

        ``work`` gets a ``ChainedWrite``: its ``cursor`` writes the caller's own tables of this
        database (``%s`` parameters), and its ``material_change`` / ``action`` seal entries onto
        the chain in the same transaction, so the tables and the chain change together or not
        at all (the material registry keeps its columns this way). Returns what ``work``
        returns; an exception from ``work`` rolls everything back.
        """
        with self._write() as (cur, head):
            return work(ChainedWrite(self._log, cur, head))

    def material_changes(self, material_id: str | None = None) -> list[Entry]:
        """The ``material_change`` entries, of one material or of all, in seq order."""
        where = "kind = %s"
        params: list[Any] = [KIND_MATERIAL_CHANGE]
        if material_id is not None:
            where += " AND request_id = %s"
            params.append(material_id)
        with self._read() as cur:
            return self._log.entries(cur, where, params)

    def get(self, request_id: str) -> RequestTrail:
        with self._read() as cur:
            entries = self._log.entries(
                cur, "request_id = %s AND kind <> %s", (request_id, KIND_MATERIAL_CHANGE)
            )
            if not entries:
                raise RequestNotFound(request_id)
            review = self._queue.item_in(cur, request_id)
        return RequestTrail(request_id, entries, review)

    def list_requests(
        self,
        since: datetime | str | None = None,
        until: datetime | str | None = None,
        decision: str | None = None,
        limit: int = 100,
    ) -> list[RequestSummary]:
        where, params = _window("r.created_at", since, until)
        if decision is not None:
            where.append("r.decision = %s")
            params.append(decision)
        sql = (
            "SELECT r.request_id, r.trace_id, r.created_at, r.question, r.decision, r.confidence, "
            "r.tier, r.channel, r.n_entries, q.status FROM requests r "
            "LEFT JOIN review_queue q ON q.request_id = r.request_id"
        )
        if where:
            sql += " WHERE " + " AND ".join(where)
        sql += " ORDER BY r.first_seq DESC LIMIT %s"
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

    # -- the review queue (``SQLReviewQueue``, written through the chain log) -----------------
    def enqueue_review(
        self, request_id: str, reason: str, decision: str, actor: str = SYSTEM_ACTOR
    ) -> QueueItem:
        return self._queue.enqueue_review(request_id, reason, decision, actor)

    def claim_next(self, reviewer: str) -> QueueItem | None:
        return self._queue.claim_next(reviewer)

    def release(self, request_id: str, actor: str, reason: str | None = None) -> QueueItem:
        return self._queue.release(request_id, actor, reason)

    def list_queue(self, status: str | None = None, limit: int = 100) -> list[QueueItem]:
        return self._queue.list_queue(status, limit)

    def review_backlog(self) -> tuple[dict[tuple[str, str], int], dict[str, float]]:
        return self._queue.review_backlog()

    def decide(
        self,
        request_id: str,
        reviewer: str,
        action: str,
        final_answer: str | None = None,
        reason: str | None = None,
    ) -> ReviewDecision:
        return self._queue.decide(request_id, reviewer, action, final_answer, reason)

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
        """One reviewer's judgement on an item that needs ``required`` reviewers (see
        ``SQLReviewQueue.review``)."""
        return self._queue.review(
            request_id, reviewer, action, final_answer, reason, scores=scores, required=required
        )

    def comment(self, request_id: str, author: str, text: str) -> Entry:
        """A reviewer's comment on a queued item (decided ones too), chained."""
        return self._queue.comment(request_id, author, text)

    def assign(self, request_id: str, assignee: str | None, actor: str) -> Entry | None:
        """Assign an undecided item to a reviewer (None: unassign); None when it changes
        nothing. Raises ``AlreadyDecided`` on a decided item."""
        return self._queue.assign(request_id, assignee, actor)

    def review_entries(
        self,
        kinds: Sequence[str],
        request_ids: Sequence[str] | None = None,
        *,
        open_only: bool = False,
    ) -> list[Entry]:
        """The entries of ``kinds`` (votes, comments, assignments...), in seq order: of the
        given requests, or of every queued item (``open_only``: undecided ones only)."""
        return self._queue.review_entries(kinds, request_ids, open_only=open_only)

    def get_decision(self, request_id: str) -> ReviewDecision | None:
        return self._queue.get_decision(request_id)

    # -- verification -------------------------------------------------------------------------
    def verify_chain(
        self,
        batch: int = 2000,
        max_issues: int = 1000,
        *,
        key: str | bytes | None = _UNSET,
        expect_head: Mapping[str, Any] | Sequence[Mapping[str, Any]] | None = None,
    ) -> ChainReport:
        """Re-check every entry, the head, the store's identity and the derived tables.

        ``key``: the chain key (default: the store's, i.e. ``TRACERAG_CHAIN_KEY``); with it,
        keyed entries and the head's MAC are checked. ``expect_head``: an anchor kept outside
        the database (``{"seq": …, "hash": …, "store_id": …}``, e.g. an exported ``head.json``),
        or several; the chain must still contain each anchored entry unchanged, in the same
        store. ``report.complete`` says whether anything was left unchecked (no anchor, or
        keyed entries without the key).
        """
        chain_key = self._key if key is _UNSET else key_bytes(key)
        anchors: list[Mapping[str, Any]] = (
            []
            if expect_head is None
            else [expect_head]
            if isinstance(expect_head, Mapping)
            else list(expect_head)
        )
        with self._snapshot() as cur:
            return check_chain(cur, chain_key, anchors, batch, max_issues)

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
                rows = entries_after(cur, last, batch)
            if not rows:
                return
            for row in rows:
                yield entry_from_row(row)
            last = rows[-1][0]

    def __enter__(self) -> SQLAuditStore:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


class ChainedWrite:
    """One write transaction of ``SQLAuditStore.chained``: the cursor, and the chain."""

    def __init__(self, log: ChainLog, cursor: Cursor, head: Head) -> None:
        self._log = log
        self._head = head
        self.cursor = cursor

    def material_change(
        self,
        material_id: str,
        actor: str,
        payload: Mapping[str, Any],
        reason: str | None = None,
    ) -> Entry:
        """Seal a ``material_change`` entry under the material's id."""
        return self._log.material_change(
            self.cursor, self._head, material_id, actor, payload, reason
        )

    def action(
        self,
        request_id: str,
        kind: str,
        actor: str,
        payload: Mapping[str, Any] | None = None,
        reason: str | None = None,
    ) -> Entry:
        """Seal an action on a stored request (as ``append_action``; ``RequestNotFound``)."""
        if kind not in ACTION_KINDS or kind in REVIEW_KINDS:
            raise InvalidRecord(f"{kind!r} is not an action that can be chained here")
        if not request_exists(self.cursor, request_id):
            raise RequestNotFound(request_id)
        body = action_payload(actor, payload, reason)
        entry = Entry(request_id=request_id, kind=kind, payload=body, actor=actor)
        return self._log.seal_one(self.cursor, self._head, entry)


def _window(
    column: str, since: datetime | str | None, until: datetime | str | None
) -> tuple[list[str], list[Any]]:
    where: list[str] = []
    params: list[Any] = []
    if since is not None:
        where.append(f"{column} >= %s")
        params.append(to_iso(since))
    if until is not None:
        where.append(f"{column} < %s")
        params.append(to_iso(until))
    return where, params


@contextmanager
def opening(
    close: Callable[[], object], db_error: type[BaseException], failure: str
) -> Iterator[None]:
    """Opening a store: on any failure ``close`` what was opened; a ``db_error`` is raised as
    a ``StoreError`` starting with ``failure``."""
    try:
        yield
    except db_error as exc:
        close()
        raise StoreError(f"{failure}: {exc}") from exc
    except BaseException:
        close()
        raise
