"""The registry's conflicts table: the conflicts a version opens, stored, resolved and listed.

``CONFLICT_COLUMNS`` are the columns a conflict is stored, chained and verified by; the write
path asks ``conflict_candidates`` before its transaction and ``opened_conflicts`` inside it.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Callable
from typing import Any

from tracerag.materials._conflicts import find_conflicts
from tracerag.materials._db import Cursor, RegistryDB
from tracerag.materials._model import MaterialState, MaterialVersion, now_iso
from tracerag.materials._records import ConflictRecord

#: a conflict as stored, chained (a version's ``conflicts``) and re-derived from the chain
CONFLICT_COLUMNS = (
    "conflict_id",
    "material_a",
    "version_a",
    "material_b",
    "version_b",
    "slot_key",
    "value_a",
    "value_b",
)


def active_texts(
    db: RegistryDB, exclude: str, cur: Cursor | None = None
) -> list[tuple[str, str, int]]:
    """``(material_id, text, version)`` of every material in service but ``exclude`` (read
    through ``cur`` when given, else a read of ``db``); stale versions are left out."""
    sql = (
        "SELECT m.material_id, v.body, m.current_version FROM materials m "
        "JOIN material_versions v ON v.material_id = m.material_id "
        "AND v.version = m.current_version WHERE m.status = 'active' "
        "AND m.material_id <> ?"
    )
    if cur is None:
        with db.read() as c:
            c.execute(sql, (exclude,))
            rows = c.fetchall()
    else:
        cur.execute(sql, (exclude,))
        rows = cur.fetchall()
    out = []
    for mid, body, version in rows:
        v = MaterialVersion.from_body(json.loads(body))
        if v.stale_reason() is None:
            out.append((str(mid), v.content, int(version)))
    return out


def candidates_among(
    v: MaterialVersion, active: list[tuple[str, str, int]], min_overlap: float
) -> list[tuple[Any, int]]:
    """The conflicts ``v`` has with the ``active`` texts, each with the other's version."""
    versions = {mid: ver for mid, _t, ver in active}
    found = find_conflicts(v.material_id, v.content, [(m, t) for m, t, _ in active], min_overlap)
    return [(c, versions.get(c.material_b, 0)) for c in found]


def conflict_candidates(
    db: RegistryDB,
    new: MaterialVersion,
    find: Callable[[str], MaterialState | None],
    min_overlap: float,
) -> list[tuple[Any, int]]:
    """The conflicts a version going into service would open (with the other material's
    version), or [] when it opens none (not active, stale, or the same text in service);
    ``find``: the material now, if registered."""
    if new.status != "active" or new.stale_reason() is not None:
        return []
    in_service = find(new.material_id)
    if in_service is not None and (in_service.status, in_service.current.content_hash) == (
        "active",
        new.content_hash,
    ):
        return []
    return candidates_among(new, active_texts(db, new.material_id), min_overlap)


def opened_conflicts(
    cur: Cursor,
    db: RegistryDB,
    new: MaterialVersion,
    row: dict[str, Any] | None,
    *,
    serves: bool,
    candidates: list[tuple[Any, int]] | None,
    min_overlap: float,
) -> list[dict[str, Any]]:
    """The conflicts a version opens as it is committed (``row``: the material's columns
    before it): none unless it goes into service active, fresh and with changed text.
    ``candidates`` found before the transaction are used; else they are looked for here."""
    changed = row is None or (row["status"], row["content_hash"]) != ("active", new.content_hash)
    if not (serves and changed and new.status == "active" and new.stale_reason() is None):
        return []
    if candidates is None:  # not looked for before the transaction
        candidates = candidates_among(new, active_texts(db, new.material_id, cur), min_overlap)
    return [conflict_row(new, c, version_b) for c, version_b in candidates]


def conflict_row(v: MaterialVersion, c: Any, version_b: int) -> dict[str, Any]:
    """A conflict a version opens, as stored and chained (its id names the version)."""
    conflict_id = hashlib.sha256(
        f"{v.material_id}@{v.version}|{c.material_b}|{c.key}".encode()
    ).hexdigest()[:16]
    return {
        "conflict_id": conflict_id,
        "material_a": v.material_id,
        "version_a": v.version,
        "material_b": c.material_b,
        "version_b": version_b,
        "slot_key": c.key,
        "value_a": c.value_a,
        "value_b": c.value_b,
    }


def insert_conflicts(cur: Cursor, opened: list[dict[str, Any]]) -> None:
    """Store the conflicts a version opened (open; one already stored is kept)."""
    for c in opened:
        cur.execute(
            "INSERT INTO material_conflicts (conflict_id, material_a, version_a, "
            "material_b, version_b, slot_key, value_a, value_b, status, created_at) "
            "VALUES (?, ?, ?, ?, ?, ?, ?, ?, 'open', ?) ON CONFLICT DO NOTHING",
            (*(c[k] for k in CONFLICT_COLUMNS), now_iso()),
        )


def resolve_conflicts(cur: Cursor, material_id: str, resolution: str) -> None:
    """Resolve every open conflict of a material (taken out of service) with ``resolution``."""
    cur.execute(
        "UPDATE material_conflicts SET status = 'resolved', resolved_at = ?, resolution = ? "
        "WHERE status = 'open' AND (material_a = ? OR material_b = ?)",
        (now_iso(), resolution, material_id, material_id),
    )


def open_conflicts_of(cur: Cursor, material_id: str) -> list[dict[str, Any]]:
    """The open conflicts a material opened (as ``material_a``), as stored and chained."""
    cur.execute(
        f"SELECT {', '.join(CONFLICT_COLUMNS)} FROM material_conflicts "
        "WHERE status = 'open' AND material_a = ?",
        (material_id,),
    )
    return [dict(zip(CONFLICT_COLUMNS, r, strict=True)) for r in cur.fetchall()]


def list_conflicts(
    db: RegistryDB,
    status: str | None = "open",
    *,
    material_id: str | None = None,
    limit: int | None = None,
) -> list[ConflictRecord]:
    """Stored conflicts (open ones by default; of one material, or all), oldest first."""
    sql = (
        "SELECT conflict_id, material_a, version_a, material_b, version_b, slot_key, value_a, "
        "value_b, status, created_at, resolved_at, resolution FROM material_conflicts"
    )
    where: list[str] = []
    params: list[Any] = []
    if status:
        where.append("status = ?")
        params.append(status)
    if material_id is not None:
        where.append("(material_a = ? OR material_b = ?)")
        params += [material_id, material_id]
    if where:
        sql += " WHERE " + " AND ".join(where)
    sql += " ORDER BY created_at, conflict_id"
    if limit is not None:
        sql += " LIMIT ?"
        params.append(int(limit))
    with db.read() as cur:
        cur.execute(sql, params)
        return [ConflictRecord(*r) for r in cur.fetchall()]


__all__ = [
    "CONFLICT_COLUMNS",
    "active_texts",
    "candidates_among",
    "conflict_candidates",
    "conflict_row",
    "insert_conflicts",
    "list_conflicts",
    "open_conflicts_of",
    "opened_conflicts",
    "resolve_conflicts",
]
