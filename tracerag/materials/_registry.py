"""``MaterialRegistry``: every material's versions, usage, credibility and conflicts.

The registry lives in the audit store's database (SQLite or PostgreSQL), in tables of its own,
and every change to a material is also appended to the audit store's hash chain as a
``material_change`` entry under the material's id (the change with the full version body and
its hash, before and after, and the operator's identity with how it was established), so the
chain covers material changes and ``verify()`` checks the tables against it. Stores written
before that entry kind existed hold their changes as ``operator_action`` entries of the request
``MATERIALS_LOG``; those are verified where they are.

Every change is a new version recording who, when, before (``based_on``), after, why, the write
rule or model version (``written_by``) and the batch id; ``rollback_batch`` restores what a
batch changed. New and edited materials pass the write gate (``gate.WriteGate``). ``operator``
is an ``OperatorIdentity`` (``tracerag._identity``) or a bare name, recorded as ``declared``.
"""

from __future__ import annotations

import json
import logging
import threading
import uuid
from collections.abc import Iterable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import replace
from datetime import datetime
from typing import TYPE_CHECKING, Any, Union

from tracerag._choices import check_options
from tracerag._identity import SYSTEM_METHOD, OperatorIdentity
from tracerag.errors import InputError
from tracerag.materials._conflict_table import (
    active_texts,
    candidates_among,
    conflict_row,
    insert_conflicts,
    list_conflicts,
    open_conflicts_of,
    resolve_conflicts,
)
from tracerag.materials._credibility import (
    OUTCOMES,
    CredibilityPolicy,
    credibility,
    ema_update,
    should_quarantine,
)
from tracerag.materials._db import (
    ChainCursor,
    Cursor,
    MaterialStoreError,
    RegistryDB,
    connect_like,
)
from tracerag.materials._events import (
    BASELINE_KEY,
    OUTCOME_KEY,
    ROW_KEY,
    read_row,
    table_rows,
    write_row,
)
from tracerag.materials._gate import GateVerdict, WriteGate
from tracerag.materials._gauges import ensure_instruments, unwatch_registry, watch_registry
from tracerag.materials._model import (
    PROPOSE_QUARANTINE,
    MaterialFields,
    MaterialState,
    MaterialVersion,
    content_hash,
    now_iso,
    parse_time,
    provenance_from_metadata,
    utcnow,
)
from tracerag.materials._records import (
    CHANGE_KEY,
    DEFAULT_READ_RETENTION_DAYS,
    FIRST_SIGHT_RULE,
    QUARANTINE_RULE,
    ROLLBACK_RULE,
    SYSTEM,
    ConcurrentChange,
    ConflictRecord,
    InvalidTransition,
    MaterialNotFound,
    RollbackResult,
    StoredVersion,
    VerifyReport,
    body_digest,
    body_json,
    stored_version,
)
from tracerag.materials._usage_log import UsageLog, bump_usage
from tracerag.materials._verify import chained_events, verify_registry
from tracerag.store._base import KIND_MATERIAL_CHANGE, StoreError

if TYPE_CHECKING:
    from typing_extensions import Unpack

logger = logging.getLogger("tracerag.materials")

#: who makes a change: an identity, or a bare name (recorded as declared, not authenticated)
Operator = Union[str, OperatorIdentity]  # noqa: UP007
_VERSION_COLUMNS = "body, body_hash, audit_seq, audit_hash"
#: an unsealed version younger than this is a write in flight; older, an abandoned one
IN_FLIGHT_SECONDS = 60.0
_ALLOWED: dict[str, set[str]] = {
    # change name -> statuses it may start from
    "approve": {"pending_review"},
    "reject": {"pending_review"},
    "quarantine": {"active", "pending_review"},
    "restore": {"quarantined"},
    "delete": {"active", "pending_review", "quarantined"},
    "dismiss": {"active"},  # a proposed quarantine (MaterialState.proposed_quarantine)
}
_TARGET = {
    "approve": "active",
    "reject": "deleted",
    "quarantine": "quarantined",
    "restore": "active",
    "delete": "deleted",
    "dismiss": "active",
}
#: transitions that start the denial count again
_RESETS_DENIALS = ("restore", "dismiss")


class MaterialRegistry(UsageLog):
    """Materials with a memory, in the audit store's database."""

    def __init__(
        self,
        store: Any,
        *,
        policy: CredibilityPolicy | None = None,
        gate: WriteGate | None = None,
        read_retention_days: int = DEFAULT_READ_RETENTION_DAYS,
        db: RegistryDB | None = None,
        owns_store: bool = False,
        metrics: bool = True,
        baseline: bool = True,
    ) -> None:
        self.store = store
        self.policy = policy or CredibilityPolicy()
        self.gate = gate or WriteGate()
        self.read_retention_days = read_retention_days
        self.db = db or connect_like(store)
        self._owns_store = owns_store
        self._local = threading.local()
        self._metrics = metrics
        if baseline:
            self._baseline()
        if metrics:  # its figures go to tracerag's meter (tracerag.materials._gauges)
            watch_registry(self)

    @classmethod
    def open(cls, url: str | None = None, **options: Any) -> MaterialRegistry:
        """Open the audit store at ``url`` (see ``open_store``) and the registry beside it."""
        from tracerag.store import open_store

        return cls(open_store(url), owns_store=True, **options)

    def close(self) -> None:
        """Close the registry's connection (and the store, when the registry opened it)."""
        unwatch_registry(self)
        self.db.close()
        if self._owns_store:
            self.store.close()

    def __enter__(self) -> MaterialRegistry:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    # -- batches ------------------------------------------------------------------------------
    @contextmanager
    def batch(self, batch_id: str | None = None) -> Iterator[str]:
        """Writes inside carry one batch id (a new one unless given), so they roll back together."""
        previous = getattr(self._local, "batch", None)
        self._local.batch = batch_id or "batch-" + uuid.uuid4().hex[:12]
        try:
            yield self._local.batch
        finally:
            self._local.batch = previous

    def _batch(self, batch_id: str | None) -> str | None:
        return batch_id or getattr(self._local, "batch", None)

    # -- reading ------------------------------------------------------------------------------
    def _row_state(self, cur: Cursor, material_id: str) -> MaterialState | None:
        cur.execute(
            "SELECT m.ema, m.outcomes, m.denials, v.body, m.pending_version FROM materials m "
            "JOIN material_versions v "
            "ON v.material_id = m.material_id AND v.version = m.current_version "
            "WHERE m.material_id = ?",
            (material_id,),
        )
        row = cur.fetchone()
        if row is None:
            return None
        current = MaterialVersion.from_body(json.loads(row[3]))
        return MaterialState(
            current,
            float(row[0]),
            int(row[1]),
            int(row[2]),
            self._usage(cur, current),
            None if row[4] is None else int(row[4]),
        )

    def get(self, material_id: str) -> MaterialState:
        """The material now; raises ``MaterialNotFound``."""
        with self.db.read() as cur:
            state = self._row_state(cur, material_id)
        if state is None:
            raise MaterialNotFound(material_id)
        return state

    def find(self, material_id: str) -> MaterialState | None:
        """The material now, or None."""
        with self.db.read() as cur:
            return self._row_state(cur, material_id)

    def states(self, material_ids: Iterable[str]) -> dict[str, MaterialState]:
        """The current state of each registered id among ``material_ids``."""
        if self._metrics:
            ensure_instruments()  # the application may have installed its provider since
        ids = list(dict.fromkeys(str(i) for i in material_ids))
        out: dict[str, MaterialState] = {}
        if not ids:
            return out
        with self.db.read() as cur:
            for start in range(0, len(ids), 200):
                chunk = ids[start : start + 200]
                marks = ", ".join("?" for _ in chunk)
                cur.execute(
                    "SELECT m.material_id, m.ema, m.outcomes, m.denials, v.body, m.pending_version "
                    "FROM materials m "
                    "JOIN material_versions v ON v.material_id = m.material_id "
                    f"AND v.version = m.current_version WHERE m.material_id IN ({marks})",
                    chunk,
                )
                for mid, ema, outcomes, denials, body, pending in cur.fetchall():
                    out[str(mid)] = MaterialState(
                        MaterialVersion.from_body(json.loads(body)),
                        float(ema),
                        int(outcomes),
                        int(denials),
                        pending=None if pending is None else int(pending),
                    )
        return out

    def materials(self, status: str | None = None) -> list[MaterialState]:
        """Every material now, optionally of one status, by id."""
        sql = "SELECT material_id FROM materials"
        params: list[Any] = []
        if status:
            sql += " WHERE status = ?"
            params.append(status)
        with self.db.read() as cur:
            cur.execute(sql + " ORDER BY material_id", params)
            ids = [str(r[0]) for r in cur.fetchall()]
        states = self.states(ids)
        return [states[i] for i in ids if i in states]

    def pending(self) -> list[MaterialState]:
        """Writes waiting for review: pending new materials and proposed edits."""
        with self.db.read() as cur:
            cur.execute(
                "SELECT material_id FROM materials WHERE status = 'pending_review' "
                "OR pending_version IS NOT NULL ORDER BY updated_at, material_id"
            )
            ids = [str(r[0]) for r in cur.fetchall()]
        states = self.states(ids)
        return [states[i] for i in ids if i in states]

    def history(self, material_id: str) -> list[StoredVersion]:
        """Every version of a material, oldest first."""
        with self.db.read() as cur:
            cur.execute(
                f"SELECT {_VERSION_COLUMNS} FROM material_versions WHERE material_id = ? "
                "ORDER BY version",
                (material_id,),
            )
            rows = cur.fetchall()
        if not rows:
            raise MaterialNotFound(material_id)
        return [stored_version(r) for r in rows]

    def version(self, material_id: str, version: int) -> StoredVersion:
        """One version of a material."""
        with self.db.read() as cur:
            cur.execute(
                f"SELECT {_VERSION_COLUMNS} FROM material_versions "
                "WHERE material_id = ? AND version = ?",
                (material_id, int(version)),
            )
            row = cur.fetchone()
        if row is None:
            raise MaterialNotFound(f"{material_id}@{version}")
        return stored_version(row)

    def by_rule(self, rule: str) -> list[StoredVersion]:
        """Every version a write rule or model version wrote, oldest first."""
        return self._versions_where("written_by = ?", (rule,))

    def by_batch(self, batch_id: str) -> list[StoredVersion]:
        """Every version written in a batch, oldest first."""
        return self._versions_where("batch_id = ?", (batch_id,))

    def _versions_where(self, where: str, params: Sequence[Any]) -> list[StoredVersion]:
        with self.db.read() as cur:
            cur.execute(
                f"SELECT {_VERSION_COLUMNS} FROM material_versions WHERE {where} "
                "ORDER BY created_at, material_id, version",
                params,
            )
            return [stored_version(r) for r in cur.fetchall()]

    def version_for(self, material_id: str, text_hash: str | None = None) -> int | None:
        """The version whose content has this hash (latest such), else the current version."""
        with self.db.read() as cur:
            if text_hash:
                cur.execute(
                    "SELECT MAX(version) FROM material_versions "
                    "WHERE material_id = ? AND content_hash = ?",
                    (material_id, text_hash),
                )
                row = cur.fetchone()
                if row and row[0] is not None:
                    return int(row[0])
            cur.execute(
                "SELECT current_version FROM materials WHERE material_id = ?", (material_id,)
            )
            row = cur.fetchone()
        return int(row[0]) if row else None

    def credibility(self, state: MaterialState, now: datetime | None = None) -> float:
        """The material's credibility now: EMA × temporal confidence (0 when expired)."""
        now = now or utcnow()
        v = state.current
        # trust ages from the last explicit confirmation, else from when this version was
        # written (not from valid_from: an old policy still in force is not less credible)
        confirmed = parse_time(v.last_confirmed) or parse_time(v.created_at)
        return credibility(
            state.ema,
            confirmed_at=confirmed,
            now=now,
            policy=self.policy,
            expired=v.expired(now),
        )

    # -- writing ------------------------------------------------------------------------------
    def _commit(
        self,
        new: MaterialVersion,
        *,
        expect_current: int | None,
        make_current: bool = True,
        pending: str = "keep",
        reset_denials: bool = False,
        identity: OperatorIdentity | None = None,
    ) -> MaterialVersion:
        """Store a new version and chain it, in one transaction of the audit store."""
        if self._metrics:
            ensure_instruments()
        # found before the store's write lock is taken: the scan of the active materials
        # does not hold up the audit trail's writers
        candidates = self._conflict_candidates(new) if make_current else []
        stored: MaterialVersion = self.store.chained(
            lambda tx: self._commit_in(
                tx,
                new,
                expect_current=expect_current,
                make_current=make_current,
                pending=pending,
                reset_denials=reset_denials,
                identity=identity,
                candidates=candidates,
            )
        )
        return stored

    def _conflict_candidates(self, new: MaterialVersion) -> list[tuple[Any, int]]:
        """The conflicts a version going into service would open (with the other material's
        version), or [] when it opens none (not active, stale, or the same text in service)."""
        if new.status != "active" or new.stale_reason() is not None:
            return []
        state = self.find(new.material_id)
        if state is not None and (state.status, state.current.content_hash) == (
            "active",
            new.content_hash,
        ):
            return []
        active = active_texts(self.db, new.material_id)
        return candidates_among(new, active, self.gate.min_overlap)

    def _commit_in(
        self,
        tx: Any,
        new: MaterialVersion,
        *,
        expect_current: int | None,
        make_current: bool = True,
        pending: str = "keep",
        reset_denials: bool = False,
        identity: OperatorIdentity | None = None,
        candidates: list[tuple[Any, int]] | None = None,
    ) -> MaterialVersion:
        """Store a new version inside a chained transaction ``tx``: the version row, its
        ``material_change`` entry (with the material's columns after it and the conflicts it
        opens) and the columns themselves commit together.

        The version number is the next free one. ``make_current`` makes it the version in
        service; ``pending`` (``keep`` / ``set`` / ``clear``) records or clears a proposed
        version waiting for review beside the one in service.
        """
        who = identity or _require_operator(new.operator)
        batch_id = self._batch(new.batch_id)
        created_at = new.created_at or now_iso()
        cur = ChainCursor(tx.cursor)
        row = read_row(cur, new.material_id)
        current = row["current_version"] if row else None
        if current != expect_current:
            raise ConcurrentChange(
                f"material {new.material_id!r} is at version {current}, "
                f"not {expect_current}; reload and retry"
            )
        cur.execute(
            "SELECT version, created_at FROM material_versions "
            "WHERE material_id = ? AND audit_seq IS NULL",
            (new.material_id,),
        )
        for version, started in cur.fetchall():
            began = parse_time(started)
            if began is not None and (utcnow() - began).total_seconds() < IN_FLIGHT_SECONDS:
                raise ConcurrentChange(
                    f"version {version} of {new.material_id!r} is being written elsewhere"
                )
            # abandoned by a writer (of an older tracerag) that stopped before sealing it
            cur.execute(
                "DELETE FROM material_versions WHERE material_id = ? AND version = ? "
                "AND audit_seq IS NULL",
                (new.material_id, version),
            )
        if pending == "set" and row is not None and row["pending_version"] is not None:
            raise ConcurrentChange(
                f"an edit of {new.material_id!r} (version {row['pending_version']}) is waiting "
                "for review"
            )
        cur.execute(
            "SELECT MAX(version) FROM material_versions WHERE material_id = ?",
            (new.material_id,),
        )
        new = replace(
            new,
            version=int(cur.fetchone()[0] or 0) + 1,
            created_at=created_at,
            batch_id=batch_id,
        )
        before = None
        if new.based_on is not None:
            cur.execute(
                "SELECT status, content_hash FROM material_versions "
                "WHERE material_id = ? AND version = ?",
                (new.material_id, new.based_on),
            )
            b = cur.fetchone()
            before = {"version": new.based_on, "status": b[0], "content_hash": b[1]}
        after_row: dict[str, Any]
        if row is None:
            after_row = {
                "current_version": new.version,
                "status": new.status,
                "content_hash": new.content_hash,
                "ema": self.policy.prior,
                "outcomes": 0,
                "denials": 0,
                "pending_version": None,
            }
        else:
            after_row = dict(row)
            if make_current:
                after_row.update(
                    current_version=new.version, status=new.status, content_hash=new.content_hash
                )
            if reset_denials:
                after_row["denials"] = 0
            if pending != "keep":
                after_row["pending_version"] = new.version if pending == "set" else None
        opened = []
        serves = row is None or make_current
        changed = row is None or (row["status"], row["content_hash"]) != (
            "active",
            new.content_hash,
        )
        if serves and changed and new.status == "active" and new.stale_reason() is None:
            if candidates is None:  # not looked for before the transaction
                candidates = candidates_among(
                    new, active_texts(self.db, new.material_id, cur), self.gate.min_overlap
                )
            opened = [conflict_row(new, c, version_b) for c, version_b in candidates]
        body = new.body()
        digest = body_digest(body)
        entry = tx.material_change(
            new.material_id,
            who.name,
            {
                CHANGE_KEY: {
                    "material_id": new.material_id,
                    "version": new.version,
                    "change": new.change,
                    "written_by": new.written_by,
                    "batch_id": new.batch_id,
                    "in_service": serves,
                    "body_hash": digest,
                    "body": body,
                },
                "before": before,
                "after": {
                    "version": new.version,
                    "status": new.status,
                    "content_hash": new.content_hash,
                },
                "identity": who.to_dict(),
                "pending": pending,
                "reset_denials": reset_denials,
                "conflicts": opened,
                ROW_KEY: after_row,
            },
            new.reason,
        )
        cur.execute(
            "INSERT INTO material_versions (material_id, version, status, written_by, "
            "operator, batch_id, change, content_hash, created_at, body, body_hash, "
            "audit_seq, audit_hash) VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?)",
            (
                new.material_id,
                new.version,
                new.status,
                new.written_by,
                new.operator,
                new.batch_id,
                new.change,
                new.content_hash,
                new.created_at,
                body_json(body),
                digest,
                entry.seq,
                entry.hash,
            ),
        )
        write_row(cur, new.material_id, after_row, new=row is None)
        if serves and new.status != "active":
            resolve_conflicts(cur, new.material_id, f"{new.material_id} is {new.status}")
        insert_conflicts(cur, opened)
        cur.execute("UPDATE material_head SET generation = generation + 1 WHERE id = 1")
        return new

    def register(
        self,
        material_id: str,
        content: str,
        *,
        operator: Operator,
        written_by: str,
        reason: str | None = None,
        source_snippet: str = "",
        batch_id: str | None = None,
        gate: bool = True,
        hold: bool = False,
        **fields: Unpack[MaterialFields],
    ) -> MaterialVersion:
        """Write a new material through the write gate (``hold`` sends it to review anyway);
        ``fields``: its provenance, title and validity (``MaterialFields``)."""
        check_options("register", fields, MaterialFields.__optional_keys__)
        who = _require_operator(operator)
        existing = self.find(material_id)
        if existing is not None:
            raise MaterialStoreError(
                f"material {material_id!r} exists (version {existing.current.version}); use edit"
            )
        if fields.get("provenance") is None:  # an explicit None means "not given", as before
            fields.pop("provenance", None)
        v = MaterialVersion(
            material_id=material_id,
            version=1,
            content=content,
            written_by=written_by,
            source_snippet=source_snippet,
            operator=who.name,
            change="create",
            reason=reason,
            batch_id=batch_id,
            **fields,
        )
        status, verdict = self._judge(v) if gate else ("active", None)
        if hold:
            status = "pending_review"
        stored = self._commit(
            replace(v, status=status, gate=verdict.to_dict() if verdict else None),
            expect_current=None,
            identity=who,
        )
        return stored

    def _judge(self, v: MaterialVersion) -> tuple[str, GateVerdict]:
        active = [(mid, text) for mid, text, _ver in active_texts(self.db, v.material_id)]
        verdict = self.gate.check(v.content, material_id=v.material_id, active=active)
        return verdict.status, verdict

    def edit(
        self,
        material_id: str,
        *,
        operator: Operator,
        written_by: str,
        reason: str,
        content: str | None = None,
        source_snippet: str = "",
        gate: bool = True,
        batch_id: str | None = None,
        **fields: Unpack[MaterialFields],
    ) -> MaterialVersion:
        """Write a new version of a material with changed content or fields
        (``MaterialFields``).

        Changed content passes the write gate. A held edit of an active material waits for
        review beside the version in service (``MaterialState.pending``), which stays in
        service until the edit is approved.
        """
        check_options("edit", fields, MaterialFields.__optional_keys__)
        who = _require_operator(operator)
        if not reason or not reason.strip():
            raise InputError("an edit needs a reason")
        state = self.get(material_id)
        if state.pending is not None:
            raise ConcurrentChange(
                f"an edit of {material_id!r} (version {state.pending}) is waiting for review"
            )
        changes: dict[str, Any] = dict(fields)
        if content is not None and content != state.current.content:
            changes["content"] = content
            changes["source_snippet"] = source_snippet or content
        v = state.current.next_change(
            operator=who.name,
            written_by=written_by,
            reason=reason,
            change="edit",
            batch_id=batch_id,
            **changes,
        )
        status, verdict = self._judge(v) if gate and "content" in changes else (state.status, None)
        gate_body = verdict.to_dict() if verdict else None
        if status == "pending_review" and state.status == "active":
            return self._commit(
                replace(v, status="pending_review", gate=gate_body),
                expect_current=state.current.version,
                make_current=False,
                pending="set",
                identity=who,
            )
        if status == "active":
            status = state.status
        stored = self._commit(
            replace(v, status=status, gate=gate_body),
            expect_current=state.current.version,
            identity=who,
        )
        return stored

    def observe(self, documents: Iterable[Any], *, operator: Operator = SYSTEM) -> list[str]:
        """Register documents not seen before from their metadata (``METADATA_KEYS``).

        Returns the ids registered or re-versioned. A known id whose text changed at the source
        (since it was last seen there) gets a new version (``change="source_changed"``) with
        the material's status. First-sight writes are not gated (the knowledge base is the
        authority for its own documents) but their conflicts are recorded.
        """
        who = _require_operator(operator)
        items = []
        for doc in documents:
            text = str(getattr(doc, "page_content", "") or "")
            fields = provenance_from_metadata(dict(getattr(doc, "metadata", None) or {}))
            material_id = fields.pop("material_id") or getattr(doc, "id", None)
            if not material_id:
                material_id = "doc-" + content_hash(text)[:10]
            items.append((str(material_id), text, fields))
        seen = self._seen_hashes([mid for mid, _t, _f in items])
        written = []
        for material_id, text, fields in items:
            if seen.get(material_id) == content_hash(text):
                continue  # the common case: known, unchanged at the source
            state = self.find(material_id)
            provenance = fields.pop("provenance")
            try:
                if state is None:
                    self.register(
                        material_id,
                        text,
                        operator=who,
                        written_by=FIRST_SIGHT_RULE,
                        provenance=provenance,
                        reason="first seen in retrieval",
                        gate=False,
                        **fields,
                    )
                else:
                    v = state.current.next_change(
                        content=text,
                        operator=who.name,
                        written_by=FIRST_SIGHT_RULE,
                        reason="text changed at the source",
                        change="source_changed",
                        provenance=provenance,
                        **fields,
                    )
                    self._commit(v, expect_current=state.current.version, identity=who)
            except (ConcurrentChange, MaterialStoreError):
                continue  # another process registered or changed it first
            written.append(material_id)
        return written

    def _seen_hashes(self, material_ids: Sequence[str]) -> dict[str, str]:
        """Per registered id, the content hash last seen at the source (else in service)."""
        out: dict[str, str] = {}
        ids = list(dict.fromkeys(material_ids))
        with self.db.read() as cur:
            for start in range(0, len(ids), 200):
                chunk = ids[start : start + 200]
                marks = ", ".join("?" for _ in chunk)
                cur.execute(
                    "SELECT material_id, content_hash FROM materials "
                    f"WHERE material_id IN ({marks})",
                    chunk,
                )
                out.update({str(m): str(h) for m, h in cur.fetchall()})
                cur.execute(
                    "SELECT v.material_id, v.content_hash FROM material_versions v WHERE "
                    f"v.written_by = ? AND v.material_id IN ({marks}) AND v.version = "
                    "(SELECT MAX(w.version) FROM material_versions w WHERE "
                    "w.material_id = v.material_id AND w.written_by = v.written_by)",
                    [FIRST_SIGHT_RULE, *chunk],
                )
                out.update({str(m): str(h) for m, h in cur.fetchall()})
        return out

    def transition(
        self,
        material_id: str,
        action: str,
        *,
        operator: Operator,
        reason: str,
        written_by: str = "manual",
        batch_id: str | None = None,
    ) -> MaterialVersion:
        """approve / reject / quarantine / restore / delete / dismiss: a new version with the
        new status.

        ``approve`` and ``reject`` act on a proposed edit when one waits for review, else on a
        pending new material. ``quarantine`` of a material with a proposed quarantine confirms
        it; ``dismiss`` refuses the proposal (the material stays in service and its denial
        count starts again).
        """
        who = _require_operator(operator)
        if action not in _ALLOWED:
            raise InputError(f"action must be one of {sorted(_ALLOWED)}, not {action!r}")
        if not reason or not reason.strip():
            raise InputError(f"a {action} needs a reason")
        state = self.get(material_id)
        changes: dict[str, Any] = {"status": _TARGET[action], "batch_id": batch_id}
        if action == "approve":
            changes["last_confirmed"] = now_iso()
        if action in ("approve", "reject") and state.pending is not None:
            proposed = self.version(material_id, state.pending).version
            stored = self._commit(
                proposed.next_change(
                    operator=who.name,
                    written_by=written_by,
                    reason=reason,
                    change=action,
                    **changes,
                ),
                expect_current=state.current.version,
                make_current=action == "approve",
                pending="clear",
                identity=who,
            )
            return stored
        if state.status not in _ALLOWED[action]:
            raise InvalidTransition(f"cannot {action} {material_id!r}: it is {state.status}")
        if action == "dismiss" and state.proposed_quarantine is None:
            raise InvalidTransition(f"cannot dismiss {material_id!r}: no quarantine is proposed")
        stored = self._commit(
            state.current.next_change(
                operator=who.name, written_by=written_by, reason=reason, change=action, **changes
            ),
            expect_current=state.current.version,
            pending="clear" if action == "delete" else "keep",
            reset_denials=action in _RESETS_DENIALS,
            identity=who,
        )
        return stored

    def approve(self, material_id: str, *, operator: Operator, reason: str) -> MaterialVersion:
        """Make a pending write active (the explicit confirmation)."""
        return self.transition(material_id, "approve", operator=operator, reason=reason)

    def reject(self, material_id: str, *, operator: Operator, reason: str) -> MaterialVersion:
        """Refuse a pending write (it becomes deleted)."""
        return self.transition(material_id, "reject", operator=operator, reason=reason)

    def quarantine(self, material_id: str, *, operator: Operator, reason: str) -> MaterialVersion:
        """Take a material out of retrieval until a person restores it."""
        return self.transition(material_id, "quarantine", operator=operator, reason=reason)

    def restore(self, material_id: str, *, operator: Operator, reason: str) -> MaterialVersion:
        """Bring a quarantined material back (its denial count starts again)."""
        return self.transition(material_id, "restore", operator=operator, reason=reason)

    def delete(self, material_id: str, *, operator: Operator, reason: str) -> MaterialVersion:
        """Withdraw a material everywhere at once (its history is kept)."""
        return self.transition(material_id, "delete", operator=operator, reason=reason)

    def dismiss(self, material_id: str, *, operator: Operator, reason: str) -> MaterialVersion:
        """Refuse a proposed quarantine: the material stays in service, its denials restart."""
        return self.transition(material_id, "dismiss", operator=operator, reason=reason)

    def proposals(self) -> list[MaterialState]:
        """Materials whose quarantine the denial rule proposed, waiting for a person."""
        with self.db.read() as cur:
            cur.execute(
                "SELECT m.material_id FROM materials m JOIN material_versions v "
                "ON v.material_id = m.material_id AND v.version = m.current_version "
                "WHERE m.status = 'active' AND v.change = ? ORDER BY m.updated_at, m.material_id",
                (PROPOSE_QUARANTINE,),
            )
            ids = [str(r[0]) for r in cur.fetchall()]
        states = self.states(ids)
        return [states[i] for i in ids if i in states]

    # -- outcomes -----------------------------------------------------------------------------
    def apply_outcome(
        self,
        material_id: str,
        verdict: str,
        *,
        weight: float = 1.0,
        version: int | None = None,
        counter: str | None = None,
        count_denial: bool = True,
        operator: Operator = SYSTEM,
    ) -> MaterialState:
        """Move a material's EMA toward a verdict's outcome, chained; propose its quarantine
        after N denials (``propose_quarantine``: a person confirms or dismisses it).

        ``count_denial=False`` moves the EMA without counting the denial toward quarantine.
        ``verdict`` is a key of ``credibility.OUTCOMES``; ``counter`` the usage counter to bump
        (``confirmations``, ``denials``, ``approvals``, ``edits``, ``rejections``).
        """
        who = _require_operator(operator)
        self.store.chained(
            lambda tx: self._outcome_in(
                tx,
                material_id,
                verdict,
                weight=weight,
                version=version,
                counter=counter,
                count_denial=count_denial,
                identity=who,
            )
        )
        return self.get(material_id)

    def _outcome_in(
        self,
        tx: Any,
        material_id: str,
        verdict: str,
        *,
        weight: float,
        version: int | None,
        counter: str | None,
        count_denial: bool,
        identity: OperatorIdentity,
        context: dict[str, Any] | None = None,
    ) -> tuple[dict[str, Any], dict[str, Any], bool]:
        """One outcome inside a chained transaction: ``(row before, row after, proposed)``."""
        if verdict not in OUTCOMES:
            raise InputError(f"verdict must be one of {sorted(OUTCOMES)}, not {verdict!r}")
        cur = ChainCursor(tx.cursor)
        row = read_row(cur, material_id)
        if row is None:
            raise MaterialNotFound(material_id)
        rate = self.policy.rate
        ema = ema_update(row["ema"], OUTCOMES[verdict], rate, weight)
        counted = verdict == "deny" and weight > 0 and count_denial
        after = {
            **row,
            "ema": ema,
            "outcomes": row["outcomes"] + 1,
            "denials": row["denials"] + (1 if counted else 0),
        }
        tx.material_change(
            material_id,
            identity.name,
            {
                OUTCOME_KEY: {
                    "verdict": verdict,
                    "value": OUTCOMES[verdict],
                    "rate": rate,
                    "weight": weight,
                    "denial_counted": counted,
                    "version": version or row["current_version"],
                    **(context or {}),
                },
                "identity": identity.to_dict(),
                ROW_KEY: after,
            },
            None,
        )
        write_row(cur, material_id, after, new=False)
        if counter:
            bump_usage(cur, material_id, version or row["current_version"], **{counter: 1})
        proposed = False
        if after["status"] == "active" and should_quarantine(
            after["denials"], after["ema"], self.policy
        ):
            cur.execute(
                "SELECT body FROM material_versions WHERE material_id = ? AND version = ?",
                (material_id, after["current_version"]),
            )
            current = MaterialVersion.from_body(json.loads(cur.fetchone()[0]))
            if current.change != PROPOSE_QUARANTINE:
                self._commit_in(
                    tx,
                    current.next_change(
                        operator=SYSTEM,
                        written_by=QUARANTINE_RULE,
                        reason=f"quarantine proposed: denied {after['denials']} times "
                        f"(the rule proposes it after {self.policy.quarantine_after}); "
                        "a person confirms or dismisses it",
                        change=PROPOSE_QUARANTINE,
                    ),
                    expect_current=after["current_version"],
                    identity=OperatorIdentity(SYSTEM, SYSTEM_METHOD),
                )
                proposed = True
        return row, after, proposed

    def rollback_batch(
        self, batch_id: str, *, operator: Operator, reason: str, force: bool = False
    ) -> RollbackResult:
        """Restore every material a batch changed to its state before the batch.

        A material created in the batch is deleted. A material changed again after the batch is
        skipped (and reported) unless ``force``.
        """
        who = _require_operator(operator)
        versions = self.by_batch(batch_id)
        if not versions:
            raise MaterialStoreError(f"no versions were written in batch {batch_id!r}")
        first: dict[str, MaterialVersion] = {}
        last: dict[str, MaterialVersion] = {}
        for sv in versions:
            first.setdefault(sv.version.material_id, sv.version)
            last[sv.version.material_id] = sv.version
        with self.batch() as rollback_id:
            result = RollbackResult(batch_id, rollback_id)
            for material_id, v0 in first.items():
                state = self.get(material_id)
                latest = self.history(material_id)[-1].version.version
                if latest != last[material_id].version and not force:
                    result.skipped[material_id] = f"changed after the batch (now version {latest})"
                    continue
                if v0.based_on is None:
                    if state.status == "deleted":
                        result.skipped[material_id] = "already deleted"
                        continue
                    self._commit(
                        state.current.next_change(
                            status="deleted",
                            operator=who.name,
                            written_by=ROLLBACK_RULE,
                            reason=f"rollback of {batch_id}: {reason}",
                            change="rollback",
                            batch_id=rollback_id,
                        ),
                        expect_current=state.current.version,
                        pending="clear",
                        identity=who,
                    )
                    result.deleted.append(material_id)
                    continue
                prior = self.version(material_id, v0.based_on).version
                restored = prior.next_change(
                    based_on=state.current.version,
                    operator=who.name,
                    written_by=ROLLBACK_RULE,
                    reason=f"rollback of {batch_id} to version {prior.version}: {reason}",
                    change="rollback",
                    batch_id=rollback_id,
                )
                self._commit(
                    restored, expect_current=state.current.version, pending="clear", identity=who
                )
                result.restored.append(material_id)
        return result

    # -- conflicts ----------------------------------------------------------------------------
    def conflicts(
        self,
        status: str | None = "open",
        *,
        material_id: str | None = None,
        limit: int | None = None,
    ) -> list[ConflictRecord]:
        """Stored conflicts (open ones by default; of one material, or all), oldest first."""
        return list_conflicts(self.db, status, material_id=material_id, limit=limit)

    # -- verification and figures -------------------------------------------------------------
    def verify(self) -> VerifyReport:
        """Check the registry's tables against the hash chain (see ``verify_registry``)."""
        return verify_registry(self.db, self.store, self._chained_events)

    def _chained_events(self, material_id: str | None = None) -> dict[int, Any]:
        """The chain's registry events by seq (see ``chained_events``)."""
        return chained_events(self.store, material_id)

    def _chained_changes(self, material_id: str | None = None) -> dict[int, Any]:
        """The chain's material versions by seq (registry events that write a version)."""
        return {
            seq: e
            for seq, e in self._chained_events(material_id).items()
            if isinstance(e.payload.get(CHANGE_KEY), dict)
        }

    def _baseline(self) -> None:
        """Once, after the upgrade to chained registry events: chain the columns of every
        material whose changes were chained without them, as found (a material with no chained
        version at all is not taken in: verification reports it)."""
        with self.db.read() as cur:
            cur.execute("SELECT done FROM material_baseline WHERE id = 1")
            row = cur.fetchone()
        if row is None or int(row[0]):
            return
        covered: set[str] = set()
        versioned: set[str] = set()
        for e in self._chained_events().values():
            mid = str(e.request_id) if e.kind == KIND_MATERIAL_CHANGE else None
            if mid is None:
                mid = str((e.payload.get(CHANGE_KEY) or {}).get("material_id"))
            versioned.add(mid)
            if ROW_KEY in e.payload:
                covered.add(mid)

        def work(tx: Any) -> None:
            cur = ChainCursor(tx.cursor)
            cur.execute("SELECT done FROM material_baseline WHERE id = 1")
            if int(cur.fetchone()[0]):
                return  # another process did it meanwhile
            for mid, row in sorted(table_rows(cur).items()):
                if mid in covered or mid not in versioned:
                    continue
                opened = open_conflicts_of(cur, mid)
                tx.material_change(
                    mid,
                    SYSTEM,
                    {
                        BASELINE_KEY: {
                            "why": "the registry's columns as found when the registry began "
                            "chaining them (registry schema 2)"
                        },
                        "conflicts": opened,
                        ROW_KEY: row,
                    },
                    "registry upgrade",
                )
            cur.execute("UPDATE material_baseline SET done = 1 WHERE id = 1")

        try:
            self.store.chained(work)
        except StoreError as exc:  # e.g. a keyed chain opened without its key: next time
            logger.warning("the registry's columns are not chained yet: %s", exc)

    # -- retrieval ----------------------------------------------------------------------------
    def govern(self, retriever: Any, **options: Any) -> Any:
        """``retriever`` behind this registry (a ``CredibilityRetriever``): materials that are
        quarantined, deleted, pending review or expired are withheld on every call, the rest
        reranked by credibility, materials seen for the first time registered with their
        provenance. ``options``: ``CredibilityRetriever``'s (``k``, ``weights``, ``rerank``,
        ``register_unseen``)."""
        from tracerag.materials._rerank import CredibilityRetriever

        return CredibilityRetriever(retriever=retriever, registry=self, **options)

    def identities(self, material_id: str) -> dict[int, dict[str, Any]]:
        """Per version of a material, who made the change and how that was established (from
        the chain; a change chained before identities were recorded is ``declared``)."""
        out: dict[int, dict[str, Any]] = {}
        for seq, entry in self._chained_changes(material_id).items():
            change = entry.payload[CHANGE_KEY]
            identity = entry.payload.get("identity")
            if not isinstance(identity, dict):
                identity = OperatorIdentity(entry.actor).to_dict()
            out[int(change.get("version") or 0)] = {**identity, "audit_seq": seq}
        return out

    def stats(self, now: datetime | None = None) -> dict[str, Any]:
        """Figures for metrics: materials by status, pending writes, open conflicts,
        quarantines (and proposed ones) and the credibility distribution (tenths) of active
        materials."""
        with self.db.read() as cur:
            cur.execute("SELECT status, COUNT(*) FROM materials GROUP BY status")
            by_status = {str(s): int(n) for s, n in cur.fetchall()}
            cur.execute("SELECT COUNT(*) FROM material_conflicts WHERE status = 'open'")
            open_conflicts = int(cur.fetchone()[0])
            cur.execute(
                "SELECT COUNT(*) FROM materials "
                "WHERE status = 'pending_review' OR pending_version IS NOT NULL"
            )
            pending = int(cur.fetchone()[0])
            cur.execute(
                "SELECT COUNT(*) FROM materials m JOIN material_versions v "
                "ON v.material_id = m.material_id AND v.version = m.current_version "
                "WHERE m.status = 'active' AND v.change = ?",
                (PROPOSE_QUARANTINE,),
            )
            proposed = int(cur.fetchone()[0])
        buckets = [0] * 10
        for state in self.materials("active"):
            c = self.credibility(state, now)
            buckets[min(9, int(round(c, 6) * 10))] += 1
        return {
            "by_status": by_status,
            "pending_writes": pending,
            "quarantined": by_status.get("quarantined", 0),
            "quarantine_proposed": proposed,
            "open_conflicts": open_conflicts,
            "credibility_histogram": {
                f"{i / 10:.1f}-{(i + 1) / 10:.1f}": n for i, n in enumerate(buckets)
            },
        }


def _require_operator(operator: Operator) -> OperatorIdentity:
    """The identity of a change's author (a bare name is declared; tracerag's own is system)."""
    if not isinstance(operator, (str, OperatorIdentity)):
        raise InputError("every material change needs a named operator")
    who = OperatorIdentity.of(operator)
    if not who.name.strip():
        raise InputError("every material change needs a named operator")
    if who.name == SYSTEM and not isinstance(operator, OperatorIdentity):
        who = OperatorIdentity(SYSTEM, SYSTEM_METHOD)
    return who


__all__ = ["MaterialRegistry"]
