"""One new version of a material, stored and chained in one transaction of the audit store.

``VersionWriter.commit`` refuses a write based on a version that is no longer current
(``ConcurrentChange``) and stores the version row, its ``material_change`` entry (with the
material's columns after it and the conflicts it opens) and the columns themselves together.
"""

from __future__ import annotations

from dataclasses import replace
from typing import Any, Literal

from tracerag._identity import OperatorIdentity
from tracerag.materials._batches import Batches
from tracerag.materials._chained_rows import ROW_KEY, Row, read_row, write_row
from tracerag.materials._conflict_table import (
    conflict_candidates,
    insert_conflicts,
    opened_conflicts,
    resolve_conflicts,
)
from tracerag.materials._credibility import CredibilityPolicy
from tracerag.materials._db import ChainCursor, Cursor, RegistryDB
from tracerag.materials._gate import WriteGate
from tracerag.materials._gauges import ensure_instruments
from tracerag.materials._model import MaterialVersion, now_iso, parse_time, utcnow
from tracerag.materials._operator import require_operator
from tracerag.materials._reads import Reads
from tracerag.materials._records import CHANGE_KEY, ConcurrentChange, body_digest, body_json

#: an unsealed version younger than this is a write in flight; older, an abandoned one
IN_FLIGHT_SECONDS = 60.0
#: what a commit does to the proposed version waiting for review: keep it, set it, clear it
Pending = Literal["keep", "set", "clear"]


def base_row(cur: Cursor, new: MaterialVersion, expect_current: int | None) -> Row | None:
    """The material's columns, when its current version is ``expect_current`` (None: a new
    material); else ``ConcurrentChange``."""
    row = read_row(cur, new.material_id)
    current = row["current_version"] if row else None
    if current != expect_current:
        raise ConcurrentChange(
            f"material {new.material_id!r} is at version {current}, "
            f"not {expect_current}; reload and retry"
        )
    return row


def clear_abandoned(cur: Cursor, material_id: str) -> None:
    """Delete the unsealed versions an older writer abandoned; ``ConcurrentChange`` while one
    is still in flight (younger than ``IN_FLIGHT_SECONDS``)."""
    cur.execute(
        "SELECT version, created_at FROM material_versions "
        "WHERE material_id = ? AND audit_seq IS NULL",
        (material_id,),
    )
    for version, started in cur.fetchall():
        began = parse_time(started)
        if began is not None and (utcnow() - began).total_seconds() < IN_FLIGHT_SECONDS:
            raise ConcurrentChange(
                f"version {version} of {material_id!r} is being written elsewhere"
            )
        # abandoned by a writer (of an older tracerag) that stopped before sealing it
        cur.execute(
            "DELETE FROM material_versions WHERE material_id = ? AND version = ? "
            "AND audit_seq IS NULL",
            (material_id, version),
        )


def numbered(
    cur: Cursor, new: MaterialVersion, *, created_at: str, batch_id: str | None
) -> MaterialVersion:
    """``new`` as the material's next free version, with its time and batch."""
    cur.execute(
        "SELECT MAX(version) FROM material_versions WHERE material_id = ?", (new.material_id,)
    )
    version = int(cur.fetchone()[0] or 0) + 1
    return replace(new, version=version, created_at=created_at, batch_id=batch_id)


def based_on(cur: Cursor, new: MaterialVersion) -> dict[str, Any] | None:
    """The version ``new`` was based on (its number, status and content hash), or None."""
    if new.based_on is None:
        return None
    cur.execute(
        "SELECT status, content_hash FROM material_versions WHERE material_id = ? AND version = ?",
        (new.material_id, new.based_on),
    )
    b = cur.fetchone()
    return {"version": new.based_on, "status": b[0], "content_hash": b[1]}


def row_after(
    row: Row | None,
    new: MaterialVersion,
    *,
    prior: float,
    make_current: bool,
    pending: Pending,
    reset_denials: bool,
) -> Row:
    """The material's columns once ``new`` is committed (``prior``: a new material's EMA)."""
    if row is None:
        return {
            "current_version": new.version,
            "status": new.status,
            "content_hash": new.content_hash,
            "ema": prior,
            "outcomes": 0,
            "denials": 0,
            "pending_version": None,
        }
    after = dict(row)
    if make_current:
        after.update(current_version=new.version, status=new.status, content_hash=new.content_hash)
    if reset_denials:
        after["denials"] = 0
    if pending != "keep":
        after["pending_version"] = new.version if pending == "set" else None
    return after


def change_payload(
    new: MaterialVersion,
    body: dict[str, Any],
    digest: str,
    *,
    who: OperatorIdentity,
    before: dict[str, Any] | None,
    serves: bool,
    pending: Pending,
    reset_denials: bool,
    opened: list[dict[str, Any]],
    after: Row,
) -> dict[str, Any]:
    """The ``material_change`` entry's payload of a version (``_chained_rows`` replays it)."""
    return {
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
        "after": {"version": new.version, "status": new.status, "content_hash": new.content_hash},
        "identity": who.to_dict(),
        "pending": pending,
        "reset_denials": reset_denials,
        "conflicts": opened,
        ROW_KEY: after,
    }


def insert_version(
    cur: Cursor, new: MaterialVersion, body: dict[str, Any], digest: str, entry: Any
) -> None:
    """Store the version row, sealed by its chained ``entry``."""
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


class VersionWriter:
    """Commits versions to the registry's tables in ``db`` and to ``store``'s chain."""

    def __init__(
        self,
        store: Any,
        reads: Reads,
        batches: Batches,
        *,
        policy: CredibilityPolicy,
        gate: WriteGate,
        metrics: bool,
    ) -> None:
        self.store = store
        self.db: RegistryDB = reads.db
        self._reads = reads
        self._batches = batches
        self._policy = policy
        self._gate = gate
        self._metrics = metrics

    def commit(
        self,
        new: MaterialVersion,
        *,
        expect_current: int | None,
        make_current: bool = True,
        pending: Pending = "keep",
        reset_denials: bool = False,
        identity: OperatorIdentity | None = None,
    ) -> MaterialVersion:
        """Store a new version and chain it, in one transaction of the audit store."""
        if self._metrics:
            ensure_instruments()
        # found before the store's write lock is taken: the scan of the active materials
        # does not hold up the audit trail's writers
        candidates = (
            conflict_candidates(self.db, new, self._reads.find, self._gate.min_overlap)
            if make_current
            else []
        )
        stored: MaterialVersion = self.store.chained(
            lambda tx: self.commit_in(
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

    def commit_in(
        self,
        tx: Any,
        new: MaterialVersion,
        *,
        expect_current: int | None,
        make_current: bool = True,
        pending: Pending = "keep",
        reset_denials: bool = False,
        identity: OperatorIdentity | None = None,
        candidates: list[tuple[Any, int]] | None = None,
    ) -> MaterialVersion:
        """Store a new version inside a chained transaction ``tx``: the version row, its
        ``material_change`` entry and the material's columns commit together.

        The version number is the next free one. ``make_current`` makes it the version in
        service; ``pending`` (``keep`` / ``set`` / ``clear``) records or clears a proposed
        version waiting for review beside the one in service.
        """
        who = identity or require_operator(new.operator)
        cur = ChainCursor(tx.cursor)
        created_at = new.created_at or now_iso()
        row = base_row(cur, new, expect_current)
        clear_abandoned(cur, new.material_id)
        if pending == "set" and row is not None and row["pending_version"] is not None:
            raise ConcurrentChange(
                f"an edit of {new.material_id!r} (version {row['pending_version']}) is waiting "
                "for review"
            )
        new = numbered(
            cur, new, created_at=created_at, batch_id=self._batches.current(new.batch_id)
        )
        before = based_on(cur, new)
        after = row_after(
            row,
            new,
            prior=self._policy.prior,
            make_current=make_current,
            pending=pending,
            reset_denials=reset_denials,
        )
        serves = row is None or make_current
        opened = opened_conflicts(
            cur,
            self.db,
            new,
            row,
            serves=serves,
            candidates=candidates,
            min_overlap=self._gate.min_overlap,
        )
        body = new.body()
        digest = body_digest(body)
        payload = change_payload(
            new,
            body,
            digest,
            who=who,
            before=before,
            serves=serves,
            pending=pending,
            reset_denials=reset_denials,
            opened=opened,
            after=after,
        )
        entry = tx.material_change(new.material_id, who.name, payload, new.reason)
        insert_version(cur, new, body, digest, entry)
        write_row(cur, new.material_id, after, new=row is None)
        if serves and new.status != "active":
            resolve_conflicts(cur, new.material_id, f"{new.material_id} is {new.status}")
        insert_conflicts(cur, opened)
        cur.execute("UPDATE material_head SET generation = generation + 1 WHERE id = 1")
        return new


__all__ = ["IN_FLIGHT_SECONDS", "Pending", "VersionWriter"]
