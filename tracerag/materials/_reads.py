"""Reading the registry's tables: materials now, their versions, and the registry's figures.

``Reads`` answers every query that changes nothing (``get``, ``states``, ``history``, ``stats``,
...); the write path, the transitions and the usage log use it to see a material as it is.
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Sequence
from dataclasses import replace
from datetime import datetime
from typing import Any

from tracerag.materials._credibility import CredibilityPolicy, credibility
from tracerag.materials._db import Cursor, RegistryDB
from tracerag.materials._gauges import ensure_instruments
from tracerag.materials._model import (
    PROPOSE_QUARANTINE,
    USAGE_COUNTERS,
    MaterialState,
    MaterialVersion,
    Usage,
    parse_time,
    utcnow,
)
from tracerag.materials._records import (
    FIRST_SIGHT_RULE,
    MaterialNotFound,
    StoredVersion,
    stored_version,
)

VERSION_COLUMNS = "body, body_hash, audit_seq, audit_hash"
#: ids per ``IN (...)`` query
CHUNK = 200
_STATE_SQL = (
    "SELECT m.material_id, m.ema, m.outcomes, m.denials, v.body, m.pending_version "
    "FROM materials m JOIN material_versions v ON v.material_id = m.material_id "
    "AND v.version = m.current_version WHERE m.material_id "
)


def read_usage(cur: Cursor, v: MaterialVersion) -> Usage:
    """The usage counters of one version (zero when it has none yet)."""
    cur.execute(
        f"SELECT {', '.join(USAGE_COUNTERS)} FROM material_usage "
        "WHERE material_id = ? AND version = ?",
        (v.material_id, v.version),
    )
    row = cur.fetchone()
    return Usage(*(int(x) for x in row)) if row else Usage()


def _state(row: Sequence[Any]) -> MaterialState:
    """A material now from a ``_STATE_SQL`` row (its usage not read)."""
    _mid, ema, outcomes, denials, body, pending = row
    return MaterialState(
        MaterialVersion.from_body(json.loads(body)),
        float(ema),
        int(outcomes),
        int(denials),
        pending=None if pending is None else int(pending),
    )


def _chunks(ids: Sequence[str]) -> Iterable[tuple[list[str], str]]:
    """``ids`` in chunks of ``CHUNK``, each with its ``?, ?, ...`` placeholders."""
    for start in range(0, len(ids), CHUNK):
        chunk = list(ids[start : start + CHUNK])
        yield chunk, ", ".join("?" for _ in chunk)


class Reads:
    """Queries of the registry's tables in ``db``; ``policy`` scores credibility."""

    def __init__(self, db: RegistryDB, policy: CredibilityPolicy, *, metrics: bool) -> None:
        self.db = db
        self.policy = policy
        self._metrics = metrics

    def find(self, material_id: str) -> MaterialState | None:
        """The material now (with its current version's usage), or None."""
        with self.db.read() as cur:
            cur.execute(_STATE_SQL + "= ?", (material_id,))
            row = cur.fetchone()
            if row is None:
                return None
            state = _state(row)
            return replace(state, usage=read_usage(cur, state.current))

    def get(self, material_id: str) -> MaterialState:
        """The material now; raises ``MaterialNotFound``."""
        state = self.find(material_id)
        if state is None:
            raise MaterialNotFound(material_id)
        return state

    def states(self, material_ids: Iterable[str]) -> dict[str, MaterialState]:
        """The current state of each registered id among ``material_ids`` (usage not read)."""
        if self._metrics:
            ensure_instruments()  # the application may have installed its provider since
        ids = list(dict.fromkeys(str(i) for i in material_ids))
        out: dict[str, MaterialState] = {}
        if not ids:
            return out
        with self.db.read() as cur:
            for chunk, marks in _chunks(ids):
                cur.execute(_STATE_SQL + f"IN ({marks})", chunk)
                out.update({str(row[0]): _state(row) for row in cur.fetchall()})
        return out

    def _states_of(self, sql: str, params: Sequence[Any] = ()) -> list[MaterialState]:
        """The states of the ids ``sql`` selects, in its order."""
        with self.db.read() as cur:
            cur.execute(sql, params)
            ids = [str(r[0]) for r in cur.fetchall()]
        states = self.states(ids)
        return [states[i] for i in ids if i in states]

    def materials(self, status: str | None = None) -> list[MaterialState]:
        """Every material now, optionally of one status, by id."""
        if status:
            return self._states_of(
                "SELECT material_id FROM materials WHERE status = ? ORDER BY material_id",
                [status],
            )
        return self._states_of("SELECT material_id FROM materials ORDER BY material_id")

    def pending(self) -> list[MaterialState]:
        """Writes waiting for review: pending new materials and proposed edits."""
        return self._states_of(
            "SELECT material_id FROM materials WHERE status = 'pending_review' "
            "OR pending_version IS NOT NULL ORDER BY updated_at, material_id"
        )

    def proposals(self) -> list[MaterialState]:
        """Materials whose quarantine the denial rule proposed, waiting for a person."""
        return self._states_of(
            "SELECT m.material_id FROM materials m JOIN material_versions v "
            "ON v.material_id = m.material_id AND v.version = m.current_version "
            "WHERE m.status = 'active' AND v.change = ? ORDER BY m.updated_at, m.material_id",
            (PROPOSE_QUARANTINE,),
        )

    def history(self, material_id: str) -> list[StoredVersion]:
        """Every version of a material, oldest first."""
        with self.db.read() as cur:
            cur.execute(
                f"SELECT {VERSION_COLUMNS} FROM material_versions WHERE material_id = ? "
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
                f"SELECT {VERSION_COLUMNS} FROM material_versions "
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
                f"SELECT {VERSION_COLUMNS} FROM material_versions WHERE {where} "
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

    def seen_hashes(self, material_ids: Sequence[str]) -> dict[str, str]:
        """Per registered id, the content hash last seen at the source (else in service)."""
        out: dict[str, str] = {}
        with self.db.read() as cur:
            for chunk, marks in _chunks(list(dict.fromkeys(material_ids))):
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


__all__ = ["VERSION_COLUMNS", "Reads", "read_usage"]
