"""Verifying the material registry: its tables checked against the hash chain at one moment."""

from __future__ import annotations

import json
import time
from collections.abc import Callable
from typing import Any

from tracerag.materials._chained_rows import (
    chained_changes,
    conflict_issues,
    derive,
    feedback_issues,
    feedback_payload,
    outcome_issues,
    row_issues,
    table_rows,
)
from tracerag.materials._conflict_table import CONFLICT_COLUMNS
from tracerag.materials._db import RegistryDB
from tracerag.materials._records import CHANGE_KEY, MATERIALS_LOG, VerifyReport, body_digest
from tracerag.store._base import KIND_MATERIAL_CHANGE

#: how often verify() reads the tables and the chain again when a write landed in between
VERIFY_READS = 20

#: columns of ``material_versions`` that repeat a field of the version's body
BODY_COLUMNS = (
    "status",
    "written_by",
    "operator",
    "batch_id",
    "change",
    "content_hash",
    "created_at",
)

#: reads the chain's registry events by seq (``chained_events`` of the registry's store)
EventReader = Callable[[], dict[int, Any]]


def chained_events(store: Any, material_id: str | None = None) -> dict[int, Any]:
    """The chain's registry events by seq: ``material_change`` entries (versions,
    outcomes, baselines), and the ``operator_action`` entries of ``MATERIALS_LOG`` that
    stores written before that kind existed hold."""
    chained = {e.seq: e for e in store.material_changes(material_id)}
    try:
        legacy = store.get(MATERIALS_LOG).entries
    except KeyError:
        legacy = []
    for e in legacy:
        change = e.payload.get(CHANGE_KEY)
        if isinstance(change, dict) and material_id in (None, change.get("material_id")):
            chained[e.seq] = e
    return dict(sorted(chained.items()))


def registry_mark(db: RegistryDB) -> tuple[int, int]:
    """The newest seq and the count of the chain's registry entries (material changes and
    operator actions): unchanged across two reads, nothing the registry writes landed
    between them (each write commits its rows and its chained entry together)."""
    with db.read() as cur:
        cur.execute(
            "SELECT COALESCE(MAX(seq), -1), COUNT(*) FROM audit_entries WHERE kind IN (?, ?)",
            (KIND_MATERIAL_CHANGE, "operator_action"),
        )
        row = cur.fetchone()
    return (int(row[0]), int(row[1]))


def verify_registry(
    db: RegistryDB, store: Any, events_of: EventReader | None = None
) -> VerifyReport:
    """Check the registry's tables (in ``db``) against the hash chain (of ``store``).

    Every stored version against its chained entry (body, hash and every column that
    repeats a body field); every chained change against a stored version; the columns of
    ``materials`` and the open conflicts re-derived by replaying the chained registry
    events (``tracerag.materials._chained_rows``); the verdicts and their effects against their
    chained entries. ``events_of`` reads the chain's registry events (default:
    ``chained_events(store)``).
    """
    read_events: EventReader = events_of or (lambda: chained_events(store))
    report = VerifyReport()
    # The tables and the chain are read apart; every registry write commits its row and its
    # chained entry together, so a read of both is consistent when no entry was appended
    # in between (the head did not move). A write landing between the two reads would look
    # like a row without its entry, or an entry without its row: read again.
    for _attempt in range(VERIFY_READS):
        before = registry_mark(db)
        with db.read() as cur:
            cur.execute(
                "SELECT material_id, version, body, body_hash, audit_seq, audit_hash, "
                f"{', '.join(BODY_COLUMNS)} "
                "FROM material_versions ORDER BY audit_seq, material_id, version"
            )
            rows = cur.fetchall()
            table = table_rows(cur)
            cur.execute(f"SELECT {', '.join(CONFLICT_COLUMNS)}, status FROM material_conflicts")
            conflicts = cur.fetchall()
            cur.execute(
                "SELECT feedback_id, request_id, verdict, principal, method, counted, "
                "audit_seq FROM material_feedback"
            )
            verdicts = cur.fetchall()
            cur.execute(
                "SELECT feedback_id, material_id, principal, counted FROM material_feedback_effects"
            )
            effects = cur.fetchall()
        events = read_events()
        given = {}
        for entry in store.iter_entries():
            verdict = feedback_payload(entry)
            if verdict is not None:
                given[entry.seq] = (entry.request_id, verdict)
        if registry_mark(db) == before:
            break
        time.sleep(0.05)
    else:
        report.unsettled = (
            f"the registry was written to during each of {VERIFY_READS} reads, so its tables "
            "and the chain were never read at one moment: verify again when writes pause"
        )
        return report
    report.checked = len(rows)
    report.issues += _version_issues(rows, events)
    derived = derive(events.values())
    report.issues += derived.issues
    report.issues += row_issues(derived, table)
    report.issues += conflict_issues(derived, conflicts)
    found, report.verdicts = feedback_issues(given, verdicts, effects)
    report.issues += found
    report.issues += outcome_issues(events.values(), given)
    report.materials = len(table)
    report.events = derived.events
    return report


def _version_issues(rows: list[Any], events: dict[int, Any]) -> list[str]:
    """Every stored version against its chained entry, every chained version against a row."""
    issues: list[str] = []
    chained = chained_changes(events)
    seen: set[int] = set()
    for mid, version, body, body_hash, seq, ahash, *columns in rows:
        name = f"{mid}@{version}"
        if seq is None:
            issues.append(f"{name}: not sealed in the audit chain")
            continue
        parsed = json.loads(body)
        if body_digest(parsed) != body_hash:
            issues.append(f"{name}: stored body does not match its hash")
        for column, value in zip(BODY_COLUMNS, columns, strict=True):
            if value != parsed.get(column):
                issues.append(
                    f"{name}: material_versions.{column} is {value!r}, its chained body "
                    f"says {parsed.get(column)!r}"
                )
        entry = chained.get(int(seq))
        if entry is None:
            issues.append(f"{name}: audit entry {seq} is missing")
            continue
        seen.add(int(seq))
        change = entry.payload[CHANGE_KEY]
        if (
            (entry.kind == KIND_MATERIAL_CHANGE and entry.request_id != mid)
            or entry.actor != (change.get("body") or {}).get("operator")
            or change.get("material_id") != mid
            or change.get("version") != int(version)
            or change.get("body_hash") != body_hash
            or body_digest(change.get("body") or {}) != body_hash
            or entry.hash != ahash
        ):
            issues.append(f"{name}: differs from audit entry {seq}")
    for seq, entry in chained.items():
        if seq not in seen:
            change = entry.payload[CHANGE_KEY]
            issues.append(
                f"audit entry {seq} ({change.get('material_id')}@{change.get('version')}): "
                "no stored version"
            )
    return issues
