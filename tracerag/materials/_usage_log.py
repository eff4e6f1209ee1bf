"""Usage of material versions: read hits, counters, complaints, the feedback log, retention.

``UsageLog`` records how materials are used and judged, in the registry's tables; it sees a
material as it is through the registry's ``Reads``.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from datetime import datetime, timedelta
from typing import Any

from tracerag._routing import Route
from tracerag.errors import InputError
from tracerag.materials._db import Cursor
from tracerag.materials._model import (
    USAGE_COUNTERS,
    MaterialVersion,
    Usage,
    iso,
    now_iso,
    utcnow,
)
from tracerag.materials._reads import Reads, read_usage
from tracerag.materials._records import (
    MaterialNotFound,
    ReadHit,
    Use,
)


class UsageLog:
    """Read hits, usage counters, complaints and the feedback log of a registry's materials."""

    def __init__(self, reads: Reads, *, read_retention_days: int) -> None:
        self._materials = reads
        self.db = reads.db
        self.read_retention_days = read_retention_days

    def _usage_of(self, material_id: str, version: int) -> Usage:
        with self.db.read() as cur:
            cur.execute(
                "SELECT body FROM material_versions WHERE material_id = ? AND version = ?",
                (material_id, int(version)),
            )
            row = cur.fetchone()
            if row is None:
                raise MaterialNotFound(f"{material_id}@{version}")
            return read_usage(cur, MaterialVersion.from_body(json.loads(row[0])))

    def usage(self, material_id: str, version: int | None = None) -> Usage:
        """The usage counters of one version (the current one by default)."""
        return self._usage_of(
            material_id, version or self._materials.get(material_id).current.version
        )

    def record_use(
        self,
        request_id: str,
        uses: Sequence[Use],
        *,
        decision: str | None = None,
        at: str | None = None,
    ) -> int:
        """Log a request's read hits and count retrievals, citations and passed answers.

        Idempotent per request: a request already logged is not counted twice. Returns the
        number of read hits logged.
        """
        created = at or now_iso()
        logged = 0
        resolved = []
        for use in uses:
            version = use.version or self._materials.version_for(use.material_id, use.content_hash)
            if version is not None:
                resolved.append((use, version))
        with self.db.write() as cur:
            for use, version in resolved:
                cur.execute(
                    "INSERT INTO material_reads (request_id, material_id, version, rank_before, "
                    "rank_after, cited, decision, created_at) VALUES (?, ?, ?, ?, ?, ?, ?, ?) "
                    "ON CONFLICT DO NOTHING",
                    (
                        request_id,
                        use.material_id,
                        version,
                        use.rank_before,
                        use.rank_after,
                        int(use.cited),
                        decision,
                        created,
                    ),
                )
                cur.execute(
                    "SELECT created_at FROM material_reads WHERE request_id = ? "
                    "AND material_id = ?",
                    (request_id, use.material_id),
                )
                if cur.fetchone()[0] != created:
                    continue  # logged before
                logged += 1
                bump_usage(
                    cur,
                    use.material_id,
                    version,
                    retrievals=1,
                    citations=int(use.cited),
                    passed=int(use.cited and decision == Route.PASS),
                )
        return logged

    def mark_complaint(self, request_id: str, verdict: str) -> None:
        """Keep a request's read hits past the retention period (it received a complaint)."""
        with self.db.write() as cur:
            cur.execute(
                "INSERT INTO material_complaints (request_id, verdict, created_at) "
                "VALUES (?, ?, ?) ON CONFLICT DO NOTHING",
                (request_id, verdict, now_iso()),
            )

    def feedback_for(self, request_id: str) -> list[dict[str, Any]]:
        """The feedback verdicts given on a request, oldest first."""
        with self.db.read() as cur:
            cur.execute(
                "SELECT feedback_id, verdict, comment, correction, operator, created_at, "
                "audit_seq, principal, method, counted, declared_user FROM material_feedback "
                "WHERE request_id = ? ORDER BY created_at, feedback_id",
                (request_id,),
            )
            names = (
                "feedback_id",
                "verdict",
                "comment",
                "correction",
                "operator",
                "created_at",
                "audit_seq",
                "principal",
                "method",
                "counted",
                "declared_user",
            )
            out = [dict(zip(names, row, strict=True)) for row in cur.fetchall()]
        for f in out:
            f["counted"] = bool(f["counted"])
        return out

    def reads(
        self, material_id: str, version: int | None = None, limit: int = 1000
    ) -> list[ReadHit]:
        """The read hits of a material (one version, or all), newest first."""
        sql = (
            "SELECT r.request_id, r.material_id, r.version, r.rank_before, r.rank_after, "
            "r.cited, r.decision, r.created_at, c.request_id FROM material_reads r "
            "LEFT JOIN material_complaints c ON c.request_id = r.request_id "
            "WHERE r.material_id = ?"
        )
        params: list[Any] = [material_id]
        if version is not None:
            sql += " AND r.version = ?"
            params.append(int(version))
        sql += " ORDER BY r.created_at DESC, r.request_id LIMIT ?"
        params.append(int(limit))
        with self.db.read() as cur:
            cur.execute(sql, params)
            rows = cur.fetchall()
        return [_read_hit(r) for r in rows]

    def reads_of_request(self, request_id: str) -> list[ReadHit]:
        """The read hits one request logged."""
        with self.db.read() as cur:
            cur.execute(
                "SELECT r.request_id, r.material_id, r.version, r.rank_before, r.rank_after, "
                "r.cited, r.decision, r.created_at, c.request_id FROM material_reads r "
                "LEFT JOIN material_complaints c ON c.request_id = r.request_id "
                "WHERE r.request_id = ? ORDER BY r.rank_after, r.material_id",
                (request_id,),
            )
            rows = cur.fetchall()
        return [_read_hit(r) for r in rows]

    def purge_reads(self, *, now: datetime | None = None, days: int | None = None) -> int:
        """Delete read hits older than the retention period, except complained-about requests."""
        days = self.read_retention_days if days is None else days
        cutoff = iso((now or utcnow()) - timedelta(days=days))
        with self.db.write() as cur:
            cur.execute(
                "SELECT COUNT(*) FROM material_reads WHERE created_at < ? AND request_id NOT IN "
                "(SELECT request_id FROM material_complaints)",
                (cutoff,),
            )
            n = int(cur.fetchone()[0])
            cur.execute(
                "DELETE FROM material_reads WHERE created_at < ? AND request_id NOT IN "
                "(SELECT request_id FROM material_complaints)",
                (cutoff,),
            )
        return n


def bump_usage(cur: Cursor, material_id: str, version: int, **counts: int) -> None:
    for name in counts:
        if name not in USAGE_COUNTERS:
            raise InputError(f"unknown usage counter {name!r}")
    cur.execute(
        "INSERT INTO material_usage (material_id, version) VALUES (?, ?) ON CONFLICT DO NOTHING",
        (material_id, version),
    )
    sets = ", ".join(f"{k} = {k} + ?" for k in counts)
    cur.execute(
        f"UPDATE material_usage SET {sets} WHERE material_id = ? AND version = ?",
        (*counts.values(), material_id, version),
    )


def _read_hit(r: Any) -> ReadHit:
    """A read hit from a ``material_reads`` row joined with its complaint's request id."""
    return ReadHit(
        str(r[0]), str(r[1]), int(r[2]), r[3], r[4], bool(r[5]), r[6], str(r[7]), r[8] is not None
    )


__all__ = ["UsageLog", "bump_usage"]
