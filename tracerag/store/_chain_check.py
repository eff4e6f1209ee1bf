"""Checking a SQL store's chain: every entry, the head, the identity and the derived tables.

``check_chain`` reads the chain through one cursor (a snapshot the store opens) and feeds a
``ChainVerifier`` (``tracerag.store._chain``); beside it, it rebuilds what the ``requests``
and ``review_queue`` tables must hold from the entries, and checks outside anchors.
"""

from __future__ import annotations

import hmac
import json
import math
from collections.abc import Iterator, Mapping, Sequence
from typing import Any

from tracerag.store._chain import (
    GENESIS_HASH,
    ChainIssue,
    ChainReport,
    ChainVerifier,
    StoredRow,
    head_mac,
    keyed_since_mac,
)
from tracerag.store._chain_log import ENTRY_COLUMNS, Cursor, entries_after, read_meta, stored_row
from tracerag.store._codec import _str_or_none, _summary_fields
from tracerag.store._types import (
    KIND_MATERIAL_CHANGE,
    KIND_REGISTER,
    KIND_RESPONSE,
    KIND_REVIEW_CLAIMED,
    KIND_REVIEW_DECISION,
    KIND_REVIEW_ENQUEUED,
    KIND_REVIEW_RELEASED,
    REVIEW_KINDS,
    StoreError,
)


def check_chain(
    cur: Cursor,
    key: bytes | None,
    anchors: Sequence[Mapping[str, Any]] = (),
    batch: int = 2000,
    max_issues: int = 1000,
) -> ChainReport:
    """Re-check every entry read through ``cur``, the head, the store's identity and the
    tables derived from the chain, against ``key`` (None: keyed entries are left unchecked)
    and the outside ``anchors``."""
    chain_key = key
    meta = read_meta(cur)
    issues: list[ChainIssue] = []
    store_id = meta.get("store_id")
    genesis = meta.get("genesis") or GENESIS_HASH
    if not store_id:
        issues.append(ChainIssue("removed", None, None, "the store has no identity (store_meta)"))
    keyed_since: int | None = None
    since = meta.get("keyed_since")
    if since is not None:
        seq_text, _, mac = since.partition(":")
        try:
            keyed_since = int(seq_text)
        except ValueError:
            keyed_since = None
        if chain_key is not None and (
            keyed_since is None
            or not hmac.compare_digest(mac, keyed_since_mac(chain_key, store_id or "", keyed_since))
        ):
            issues.append(
                ChainIssue(
                    "changed",
                    None,
                    None,
                    "the keyed-chain marker does not match the chain key (changed, or another key)",
                )
            )
    elif chain_key is not None:
        issues.append(
            ChainIssue(
                "removed",
                None,
                None,
                "the chain key is given but the store has no keyed entries: its keyed "
                "chain was removed or re-sealed without the key (or it was never keyed)",
            )
        )

    def find(h: str) -> StoredRow | None:
        cur.execute(f"SELECT {ENTRY_COLUMNS} FROM audit_entries WHERE hash = %s", (h,))
        row = cur.fetchone()
        return stored_row(row) if row else None

    verifier = ChainVerifier(
        find,
        max_issues=max_issues,
        genesis=genesis,
        key=chain_key,
        keyed_since=keyed_since,
    )
    derived = _DerivedState()
    anchor_seqs = {int(a["seq"]) for a in anchors}
    anchor_rows: dict[int, StoredRow] = {}
    last = 0
    while rows := entries_after(cur, last, batch):
        for raw in rows:
            row = stored_row(raw)
            verifier.feed(row)
            derived.feed(row)
            if row.seq in anchor_seqs:
                anchor_rows[row.seq] = row
        last = rows[-1][0]
    cur.execute("SELECT last_seq, last_hash, mac FROM chain_head WHERE id = 1")
    head_row = cur.fetchone()
    if head_row is None:
        raise StoreError("the audit store has no chain head row")
    head_seq, head_hash, mac = int(head_row[0]), str(head_row[1]), head_row[2]
    cur.execute(
        "SELECT r.request_id, r.n_entries, COUNT(e.seq) FROM requests r "
        "LEFT JOIN audit_entries e ON e.request_id = r.request_id AND e.kind <> %s "
        "GROUP BY r.request_id, r.n_entries HAVING COUNT(e.seq) <> r.n_entries "
        "ORDER BY r.request_id",
        (KIND_MATERIAL_CHANGE,),
    )
    counts = [(str(r[0]), int(r[1]), int(r[2])) for r in cur.fetchall()]
    cur.execute(
        "SELECT request_id, trace_id, question, decision, confidence, tier, channel, "
        "first_seq FROM requests"
    )
    request_rows = cur.fetchall()
    cur.execute(
        "SELECT request_id, route, reason, status, claimed_by, decided_by, action, "
        "final_answer, decision_reason FROM review_queue"
    )
    queue_rows = cur.fetchall()
    report = verifier.finish(head_seq, head_hash, counts)
    report.store_id = store_id
    report.store_keyed = since is not None
    if chain_key is not None:
        report.keyed = True
        if keyed_since is not None and head_seq >= keyed_since:
            expected = head_mac(chain_key, store_id or "", head_seq, head_hash)
            if not (isinstance(mac, str) and hmac.compare_digest(mac, expected)):
                issues.append(
                    ChainIssue(
                        "changed",
                        head_seq,
                        None,
                        "the chain head was moved by someone without the chain key (its "
                        "MAC does not match): entries after it were removed, or forged",
                    )
                )
        elif keyed_since is not None and head_seq < keyed_since:
            issues.append(
                ChainIssue(
                    "removed",
                    head_seq + 1,
                    None,
                    f"the chain is keyed from seq {keyed_since} but the head is at seq "
                    f"{head_seq}: entries were removed",
                )
            )
    if anchors:
        report.anchored = True
        report.anchor_seq = max(anchor_seqs)
        for anchor in anchors:
            seq = int(anchor["seq"])
            issues += _anchor_issues(anchor, store_id, head_seq, anchor_rows.get(seq))
    issues += derived.compare(request_rows, queue_rows)
    for issue in issues:
        verifier._issue(issue)
    return report


def _anchor_issues(
    expect: Mapping[str, Any], store_id: str | None, head_seq: int, row: StoredRow | None
) -> list[ChainIssue]:
    """What an outside anchor says about the chain."""
    issues = []
    seq, hash_ = int(expect["seq"]), str(expect.get("hash") or "")
    want_id = expect.get("store_id")
    if want_id and want_id != store_id:
        issues.append(
            ChainIssue(
                "removed",
                None,
                None,
                f"this is not the anchored store: store_id {store_id}, anchor {want_id} "
                "(the store was replaced or recreated)",
            )
        )
    if head_seq < seq:
        issues.append(
            ChainIssue(
                "removed",
                head_seq + 1,
                None,
                f"the chain ends at seq {head_seq} but the anchor saw seq {seq}: "
                "entries were removed",
                seq,
            )
        )
    elif seq > 0 and row is None:
        issues.append(ChainIssue("removed", seq, None, "the anchored entry is missing"))
    elif row is not None and hash_ and row.hash != hash_:
        issues.append(
            ChainIssue(
                "changed",
                seq,
                row.request_id,
                "the anchored entry's hash differs from the anchor: the chain up to it was "
                "rewritten",
            )
        )
    return issues


class _DerivedState:
    """What the ``requests`` and ``review_queue`` tables must hold, rebuilt from the entries."""

    def __init__(self) -> None:
        self.requests: dict[str, dict[str, Any]] = {}
        self.queue: dict[str, dict[str, Any]] = {}

    def feed(self, row: StoredRow) -> None:
        try:
            payload = json.loads(row.payload_json)
        except ValueError:
            return  # reported by the hash check
        if not isinstance(payload, dict) or row.kind == KIND_MATERIAL_CHANGE:
            return  # a material change belongs to no request
        req = self.requests.setdefault(row.request_id, {"first_seq": row.seq, "fields": {}})
        if row.kind == KIND_REGISTER or row.kind == KIND_RESPONSE:
            req["fields"].update(payload)
        elif row.kind in REVIEW_KINDS:
            self._review(row, payload)

    def _review(self, row: StoredRow, payload: dict[str, Any]) -> None:
        item = self.queue.get(row.request_id)
        if row.kind == KIND_REVIEW_ENQUEUED:
            if item is None:
                self.queue[row.request_id] = {
                    "route": payload.get("route"),
                    "reason": _str_or_none(payload.get("reason")),
                    "status": "pending",
                    "claimed_by": None,
                    "decided_by": None,
                    "action": None,
                    "final_answer": None,
                    "decision_reason": None,
                }
            return
        if item is None:
            return
        if row.kind == KIND_REVIEW_CLAIMED:
            item.update(status="claimed", claimed_by=row.actor)
        elif row.kind == KIND_REVIEW_RELEASED:
            item.update(status="pending", claimed_by=None)
        elif row.kind == KIND_REVIEW_DECISION:
            item.update(
                status="decided",
                decided_by=row.actor,
                action=payload.get("action"),
                final_answer=payload.get("final_answer"),
                decision_reason=payload.get("reason"),
            )

    def compare(self, request_rows: list[Any], queue_rows: list[Any]) -> list[ChainIssue]:
        issues: list[ChainIssue] = []
        inserted = "a request row with no entries in the chain"
        for rid, r, want in _matched_rows(request_rows, self.requests, inserted, issues):
            fields = _summary_fields(want["fields"])
            have = {
                "trace_id": r[1],
                "question": r[2],
                "decision": r[3],
                "confidence": r[4],
                "tier": r[5],
                "channel": r[6],
            }
            for name, expected in fields.items():
                got = have[name]
                if name == "confidence" and expected is not None and got is not None:
                    same = math.isclose(float(got), expected, rel_tol=1e-9, abs_tol=1e-12)
                else:
                    same = got == expected
                if not same:
                    issues.append(_changed(rid, f"requests.{name}", got, expected))
            if int(r[7]) != want["first_seq"]:
                issues.append(
                    ChainIssue(
                        "changed",
                        None,
                        rid,
                        f"requests.first_seq is {r[7]} but its first entry is seq "
                        f"{want['first_seq']}",
                    )
                )
        issues += [
            ChainIssue("removed", None, rid, "the request's row in requests was deleted")
            for rid in _missing_rows(request_rows, self.requests)
        ]
        columns = (
            "route",
            "reason",
            "status",
            "claimed_by",
            "decided_by",
            "action",
            "final_answer",
            "decision_reason",
        )
        inserted = "a review item that the chain never enqueued"
        for rid, q, want_item in _matched_rows(queue_rows, self.queue, inserted, issues):
            for name, got in zip(columns, q[1:], strict=True):
                if got != want_item[name]:
                    issues.append(_changed(rid, f"review_queue.{name}", got, want_item[name]))
        issues += [
            ChainIssue(
                "removed",
                None,
                rid,
                f"the review item ({self.queue[rid]['status']}) was deleted from review_queue",
            )
            for rid in _missing_rows(queue_rows, self.queue)
        ]
        return issues


def _matched_rows(
    rows: list[Any], expected: Mapping[str, Any], inserted: str, issues: list[ChainIssue]
) -> Iterator[tuple[str, Any, Any]]:
    """Each table row (keyed by its first column) with what the chain says it holds; a row
    the chain does not know is an ``inserted`` issue."""
    for row in rows:
        rid = str(row[0])
        want = expected.get(rid)
        if want is None:
            issues.append(ChainIssue("inserted", None, rid, inserted))
        else:
            yield rid, row, want


def _missing_rows(rows: list[Any], expected: Mapping[str, Any]) -> list[str]:
    """The keys the chain knows that no table row has, in the chain's order."""
    present = {str(row[0]) for row in rows}
    return [rid for rid in expected if rid not in present]


def _changed(rid: str, column: str, got: Any, expected: Any) -> ChainIssue:
    return ChainIssue("changed", None, rid, f"{column} is {got!r} but the chain says {expected!r}")
