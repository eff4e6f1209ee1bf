"""Registry events on the hash chain, and the registry's columns re-derived from them.

Every change to a row of ``materials`` is chained in the transaction that makes it
(``SQLAuditStore.chained``), as a ``material_change`` entry under the material's id whose
payload holds the row after it (``row``) and what caused it:

* a version (``material_change``: the version's body and hash, ``in_service``; beside it
  ``pending`` (keep / set / clear the edit waiting for review), ``reset_denials`` and the
  conflicts the version opened, ``conflicts``);
* an outcome (``outcome``: the verdict, its outcome value, the rate and the weight, whether it
  counted as a denial, the feedback and the request it came from);
* a baseline (``baseline``): the columns of a material written before registry events were
  chained, as found when the registry was upgraded to chain them.

``derive`` replays the events in chain order: each version moves the row as its change says,
each outcome moves the EMA by ``ema_update`` and the counts by one, and a version that takes a
material out of service resolves its open conflicts. Verification compares the tables with the
result, so an edited column, a forged row or a removed conflict is a finding without any key;
only forging the events themselves needs the chain key (or an anchor) to be caught.

Verdicts are chained as ``operator_action`` entries of their request (``feedback`` or
``review_outcome``, with the feedback id, the principal, whether it counted and what it did
to each material); ``feedback_issues`` checks the feedback tables against them.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

from tracerag._identity import OperatorIdentity
from tracerag.materials._conflict_table import CONFLICT_COLUMNS
from tracerag.materials._credibility import OUTCOMES, ema_update
from tracerag.materials._db import Cursor
from tracerag.materials._model import now_iso
from tracerag.materials._records import CHANGE_KEY

ROW_KEY = "row"
OUTCOME_KEY = "outcome"
BASELINE_KEY = "baseline"
FEEDBACK_KEYS = ("feedback", "review_outcome")
#: the columns of ``materials`` that change what retrieval and feedback do, all chained
ROW_COLUMNS = (
    "current_version",
    "status",
    "content_hash",
    "ema",
    "outcomes",
    "denials",
    "pending_version",
)
EMA_TOLERANCE = 1e-12

Row = dict[str, Any]


def row_of(values: Iterable[Any]) -> Row:
    """A ``materials`` row (``ROW_COLUMNS`` in order) as a dict of plain values."""
    v = list(values)
    return {
        "current_version": int(v[0]),
        "status": str(v[1]),
        "content_hash": str(v[2]),
        "ema": float(v[3]),
        "outcomes": int(v[4]),
        "denials": int(v[5]),
        "pending_version": None if v[6] is None else int(v[6]),
    }


def read_row(cur: Cursor, material_id: str) -> Row | None:
    """The material's row now, or None."""
    cur.execute(
        f"SELECT {', '.join(ROW_COLUMNS)} FROM materials WHERE material_id = ?", (material_id,)
    )
    found = cur.fetchone()
    return None if found is None else row_of(found)


def write_row(cur: Cursor, material_id: str, row: Mapping[str, Any], *, new: bool) -> None:
    """Insert (``new``) or update the material's row to ``row``."""
    values = [row[c] for c in ROW_COLUMNS]
    if new:
        cur.execute(
            f"INSERT INTO materials (material_id, {', '.join(ROW_COLUMNS)}, updated_at) "
            "VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?)",
            (material_id, *values, now_iso()),
        )
        return
    sets = ", ".join(f"{c} = ?" for c in ROW_COLUMNS)
    cur.execute(
        f"UPDATE materials SET {sets}, updated_at = ? WHERE material_id = ?",
        (*values, now_iso(), material_id),
    )


def table_rows(cur: Cursor) -> dict[str, Row]:
    """Every row of ``materials``."""
    cur.execute(f"SELECT material_id, {', '.join(ROW_COLUMNS)} FROM materials")
    return {str(r[0]): row_of(r[1:]) for r in cur.fetchall()}


def event_material(entry: Any) -> str | None:
    """The material an event belongs to (legacy entries name it in their change)."""
    if entry.kind == "material_change":
        return str(entry.request_id)
    change = entry.payload.get(CHANGE_KEY)
    return str(change.get("material_id")) if isinstance(change, dict) else None


@dataclass
class Derived:
    """The registry's columns as the chain says they are."""

    rows: dict[str, Row] = field(default_factory=dict)
    conflicts: dict[str, dict[str, Any]] = field(default_factory=dict)
    issues: list[str] = field(default_factory=list)
    #: materials whose versions are chained but whose columns no event covers (upgrade pending)
    uncovered: set[str] = field(default_factory=set)
    events: int = 0


def _same(a: Mapping[str, Any] | None, b: Mapping[str, Any] | None) -> bool:
    if a is None or b is None:
        return a is b
    for c in ROW_COLUMNS:
        x, y = a.get(c), b.get(c)
        if c == "ema":
            if not (
                isinstance(x, (int, float))
                and isinstance(y, (int, float))
                and math.isclose(float(x), float(y), rel_tol=0.0, abs_tol=EMA_TOLERANCE)
            ):
                return False
        elif x != y:
            return False
    return True


def _clean_row(value: Any) -> Row | None:
    if not isinstance(value, Mapping):
        return None
    try:
        return row_of(value[c] for c in ROW_COLUMNS)
    except (KeyError, TypeError, ValueError):
        return None


def derive(events: Iterable[Any]) -> Derived:
    """Replay the chained registry events (in seq order) into the columns they imply."""
    out = Derived()
    seen_conflicts: set[str] = set()
    for entry in sorted(events, key=lambda e: e.seq):
        mid = event_material(entry)
        if mid is None:
            continue
        payload = entry.payload
        recorded = _clean_row(payload.get(ROW_KEY))
        prev = out.rows.get(mid)
        where = f"{mid}: audit entry {entry.seq}"
        if ROW_KEY not in payload:
            # a change chained before registry events carried their columns
            if prev is not None:
                out.issues.append(f"{where} changes it without the registry's columns")
            else:
                out.uncovered.add(mid)
            continue
        out.events += 1
        if recorded is None:
            out.issues.append(f"{where} records unreadable columns")
            continue
        if BASELINE_KEY in payload:
            if prev is not None:
                out.issues.append(f"{where} is a baseline of a material the chain already covers")
            out.rows[mid] = recorded
            out.uncovered.discard(mid)
            for c in payload.get("conflicts") or []:
                _open(out, seen_conflicts, c, where)
            continue
        if CHANGE_KEY in payload:
            expected = _after_version(prev, payload, recorded, out, where)
            if expected is None:
                continue
            change = payload[CHANGE_KEY]
            body = change.get("body") or {}
            if change.get("in_service") and body.get("status") != "active":
                for c in out.conflicts.values():
                    if c["status"] == "open" and mid in (c["material_a"], c["material_b"]):
                        c["status"] = "resolved"
            for c in payload.get("conflicts") or []:
                _open(out, seen_conflicts, c, where)
        elif OUTCOME_KEY in payload:
            expected = _after_outcome(prev, payload[OUTCOME_KEY], recorded, out, where)
            if expected is None:
                continue
        else:
            out.issues.append(f"{where} is a registry event of no known kind")
            continue
        if not _same(expected, recorded):
            out.issues.append(f"{where} records columns that do not follow from the event")
        out.rows[mid] = expected
        out.uncovered.discard(mid)
    return out


def _open(out: Derived, seen: set[str], c: Any, where: str) -> None:
    if not isinstance(c, Mapping) or any(k not in c for k in CONFLICT_COLUMNS):
        out.issues.append(f"{where} records an unreadable conflict")
        return
    cid = str(c["conflict_id"])
    if cid in seen:
        return  # found again: the stored row stays as it was
    seen.add(cid)
    out.conflicts[cid] = {**{k: c[k] for k in CONFLICT_COLUMNS}, "status": "open"}


def _after_version(
    prev: Row | None, payload: Mapping[str, Any], recorded: Row, out: Derived, where: str
) -> Row | None:
    change = payload.get(CHANGE_KEY)
    if not isinstance(change, Mapping) or not isinstance(change.get("body"), Mapping):
        out.issues.append(f"{where} records an unreadable change")
        return None
    body = change["body"]
    version = change.get("version")
    if prev is None:
        if version != 1 or body.get("change") != "create":
            # its earlier columns were never chained: start from what this event records
            out.issues.append(f"{where}: the columns before this change are not in the chain")
            return recorded
        expected: Row = {
            "current_version": 1,
            "status": str(body.get("status")),
            "content_hash": str(body.get("content_hash")),
            "ema": recorded["ema"],  # the policy's prior when it was written
            "outcomes": 0,
            "denials": 0,
            "pending_version": None,
        }
        if not 0.0 <= expected["ema"] <= 1.0:
            out.issues.append(f"{where} starts the EMA outside [0, 1]")
        return expected
    expected = dict(prev)
    if change.get("in_service"):
        expected.update(
            current_version=version,
            status=str(body.get("status")),
            content_hash=str(body.get("content_hash")),
        )
    if payload.get("reset_denials"):
        expected["denials"] = 0
    pending = payload.get("pending", "keep")
    if pending == "set":
        expected["pending_version"] = version
    elif pending == "clear":
        expected["pending_version"] = None
    return expected


def _after_outcome(
    prev: Row | None, outcome: Any, recorded: Row, out: Derived, where: str
) -> Row | None:
    if prev is None:
        out.issues.append(f"{where}: an outcome of a material whose columns are not in the chain")
        return recorded
    try:
        verdict = str(outcome["verdict"])
        rate, weight = float(outcome["rate"]), float(outcome["weight"])
        counted = bool(outcome["denial_counted"])
        ema = ema_update(prev["ema"], OUTCOMES[verdict], rate, weight)
    except (KeyError, TypeError, ValueError):
        out.issues.append(f"{where} records an unreadable outcome")
        return None
    if not 0.0 < rate <= 1.0 or (counted and not (verdict == "deny" and weight > 0)):
        out.issues.append(f"{where} records an outcome no verdict could have had")
    expected = dict(prev)
    expected.update(
        ema=ema, outcomes=prev["outcomes"] + 1, denials=prev["denials"] + (1 if counted else 0)
    )
    return expected


def row_issues(derived: Derived, table: Mapping[str, Row]) -> list[str]:
    """Differences between the ``materials`` table and the columns the chain implies."""
    issues = []
    for mid in sorted(set(table) | set(derived.rows) | derived.uncovered):
        got, want = table.get(mid), derived.rows.get(mid)
        if want is None:
            if mid in derived.uncovered:
                issues.append(
                    f"{mid}: its credibility and status columns are not covered by the chain yet "
                    "(written before registry events were chained; the next registry write "
                    "chains them)"
                )
            else:
                issues.append(f"materials row {mid!r} has no chained origin (inserted directly?)")
            continue
        if got is None:
            issues.append(f"{mid}: in the chain but missing from the materials table")
            continue
        for c in ROW_COLUMNS:
            if not _same({**want, c: got[c]}, want):
                issues.append(f"{mid}: materials.{c} is {got[c]!r}, the chain says {want[c]!r}")
    return issues


def conflict_issues(derived: Derived, rows: Iterable[Iterable[Any]]) -> list[str]:
    """Differences between ``material_conflicts`` and the conflicts the chain opened/resolved."""
    issues = []
    table: dict[str, dict[str, Any]] = {}
    for r in rows:
        values = list(r)
        table[str(values[0])] = {
            **dict(zip(CONFLICT_COLUMNS, values[:8], strict=True)),
            "status": values[8],
        }
    for cid in sorted(set(table) | set(derived.conflicts)):
        got, want = table.get(cid), derived.conflicts.get(cid)
        if want is None:
            issues.append(f"conflict {cid}: not opened by any chained change (inserted directly?)")
        elif got is None:
            if want["status"] == "open":
                issues.append(
                    f"conflict {cid} ({want['material_a']} / {want['material_b']}): "
                    "open in the chain, missing from the table"
                )
        else:
            for k in (*CONFLICT_COLUMNS, "status"):
                if str(got[k]) != str(want[k]):
                    issues.append(f"conflict {cid}: {k} is {got[k]!r}, the chain says {want[k]!r}")
    return issues


def feedback_payload(entry: Any) -> Mapping[str, Any] | None:
    """The chained verdict of an ``operator_action`` entry, or None."""
    if entry.kind != "operator_action":
        return None
    for key in FEEDBACK_KEYS:
        value = entry.payload.get(key)
        if isinstance(value, Mapping) and value.get("feedback_id"):
            return value
    return None


def feedback_issues(
    chained: Mapping[int, tuple[str, Mapping[str, Any]]],
    rows: Iterable[Iterable[Any]],
    effects: Iterable[Iterable[Any]],
) -> tuple[list[str], int]:
    """``material_feedback`` (rows: feedback_id, request_id, verdict, principal, method,
    counted, audit_seq) and ``material_feedback_effects`` (feedback_id, material_id,
    principal, counted) against the chained verdicts (``seq -> (request_id, verdict)``)."""
    issues: list[str] = []
    by_id = {str(v["feedback_id"]): (seq, rid, v) for seq, (rid, v) in chained.items()}
    seen: set[str] = set()
    checked = 0
    for fid, rid, verdict, principal, method, counted, seq in (tuple(r) for r in rows):
        if method == "legacy":
            continue  # kept before verdicts were chained with their principal
        checked += 1
        fid = str(fid)
        found = by_id.get(fid)
        if found is None:
            issues.append(f"verdict {fid} on {rid}: no chained entry (inserted directly?)")
            continue
        seen.add(fid)
        eseq, erid, v = found
        want = (erid, v.get("verdict"), v.get("principal"), v.get("method"), bool(v.get("counted")))
        got = (rid, verdict, principal, method, bool(counted))
        if got != want or seq is None or int(seq) != eseq:
            issues.append(f"verdict {fid} on {rid}: differs from audit entry {eseq}")
    for fid, (eseq, erid, _v) in by_id.items():
        if fid not in seen:
            issues.append(f"verdict {fid} on {erid} (audit entry {eseq}): missing from the table")
    have: dict[tuple[str, str], tuple[Any, bool]] = {}
    for fid, mid, principal, counted in (tuple(r) for r in effects):
        have[(str(fid), str(mid))] = (principal, bool(counted))
    want_effects: dict[tuple[str, str], tuple[Any, bool]] = {}
    for fid, (_s, _r, v) in by_id.items():
        for mid, what in (v.get("materials") or {}).items():
            if isinstance(what, Mapping):
                want_effects[(fid, str(mid))] = (v.get("principal"), bool(what.get("counted")))
    for key in sorted(set(have) | set(want_effects)):
        if have.get(key) != want_effects.get(key):
            issues.append(
                f"verdict {key[0]} on material {key[1]}: its effect differs from the chain"
            )
    return issues, checked


def outcome_issues(
    events: Iterable[Any], chained: Mapping[int, tuple[str, Mapping[str, Any]]]
) -> list[str]:
    """Outcome events against the verdicts that caused them: each outcome of a verdict names
    a chained verdict of the same kind that counted on that material, and each material a
    verdict counted on has exactly one outcome."""
    issues: list[str] = []
    verdicts = {str(v["feedback_id"]): (rid, v) for _seq, (rid, v) in chained.items()}
    seen: dict[tuple[str, str], int] = {}
    for entry in events:
        outcome = entry.payload.get(OUTCOME_KEY) if entry.kind == "material_change" else None
        if not isinstance(outcome, Mapping) or not outcome.get("feedback_id"):
            continue
        fid, mid = str(outcome["feedback_id"]), str(entry.request_id)
        seen[(fid, mid)] = seen.get((fid, mid), 0) + 1
        found = verdicts.get(fid)
        effect = (found[1].get("materials") or {}).get(mid) if found else None
        if (
            found is None
            or not isinstance(effect, Mapping)
            or not effect.get("counted")
            or found[1].get("verdict") != outcome.get("verdict")
            or found[0] != outcome.get("request_id")
        ):
            issues.append(f"{mid}: audit entry {entry.seq} is an outcome no chained verdict caused")
    for fid, (rid, v) in verdicts.items():
        for mid, effect in (v.get("materials") or {}).items():
            if isinstance(effect, Mapping) and effect.get("counted"):
                n = seen.get((fid, str(mid)), 0)
                if n != 1:
                    issues.append(
                        f"verdict {fid} on {rid} counted on {mid} but {n} outcome entries say so"
                    )
    return issues


def chained_changes(events: Mapping[int, Any]) -> dict[int, Any]:
    """The events (by seq) that write a version: those with a ``material_change`` body."""
    return {seq: e for seq, e in events.items() if isinstance(e.payload.get(CHANGE_KEY), dict)}


def identities_of(events: Mapping[int, Any]) -> dict[int, dict[str, Any]]:
    """Per version, who made the change and how that was established, with its seq (a change
    chained before identities were recorded is ``declared`` under its entry's actor)."""
    out: dict[int, dict[str, Any]] = {}
    for seq, entry in chained_changes(events).items():
        change = entry.payload[CHANGE_KEY]
        identity = entry.payload.get("identity")
        if not isinstance(identity, dict):
            identity = OperatorIdentity(entry.actor).to_dict()
        out[int(change.get("version") or 0)] = {**identity, "audit_seq": seq}
    return out


__all__ = [
    "BASELINE_KEY",
    "OUTCOME_KEY",
    "ROW_COLUMNS",
    "ROW_KEY",
    "Derived",
    "chained_changes",
    "conflict_issues",
    "derive",
    "feedback_issues",
    "feedback_payload",
    "identities_of",
    "outcome_issues",
    "read_row",
    "row_issues",
    "row_of",
    "table_rows",
    "write_row",
]
