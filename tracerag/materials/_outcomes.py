"""Credibility outcomes: a verdict moves a material's EMA, chained; enough denials propose its
quarantine for a person to confirm or dismiss.

``Outcomes.apply_in`` works inside a caller's chained transaction (feedback chains its verdict
beside the outcomes it causes); ``apply`` is one outcome in a transaction of its own.
"""

from __future__ import annotations

import json
from typing import Any

from tracerag._identity import OperatorIdentity
from tracerag.errors import InputError
from tracerag.materials._chained_rows import OUTCOME_KEY, ROW_KEY, Row, read_row, write_row
from tracerag.materials._commit import VersionWriter
from tracerag.materials._credibility import (
    OUTCOMES,
    CredibilityPolicy,
    ema_update,
    should_quarantine,
)
from tracerag.materials._db import ChainCursor, Cursor
from tracerag.materials._model import PROPOSE_QUARANTINE, MaterialVersion
from tracerag.materials._operator import SYSTEM_IDENTITY
from tracerag.materials._records import QUARANTINE_RULE, SYSTEM, MaterialNotFound
from tracerag.materials._usage_log import bump_usage


def moved(row: Row, verdict: str, *, rate: float, weight: float, count_denial: bool) -> Row:
    """The material's columns after one outcome: the EMA moved toward the verdict's value,
    one outcome more, and one denial more when a weighted ``deny`` counts toward quarantine."""
    counted = verdict == "deny" and weight > 0 and count_denial
    return {
        **row,
        "ema": ema_update(row["ema"], OUTCOMES[verdict], rate, weight),
        "outcomes": row["outcomes"] + 1,
        "denials": row["denials"] + (1 if counted else 0),
    }


def _current(cur: Cursor, material_id: str, version: int) -> MaterialVersion:
    cur.execute(
        "SELECT body FROM material_versions WHERE material_id = ? AND version = ?",
        (material_id, version),
    )
    return MaterialVersion.from_body(json.loads(cur.fetchone()[0]))


class Outcomes:
    """Verdicts on the materials of ``store``'s registry, scored by ``policy``."""

    def __init__(self, store: Any, writer: VersionWriter, policy: CredibilityPolicy) -> None:
        self.store = store
        self._writer = writer
        self._policy = policy

    def apply(
        self,
        material_id: str,
        verdict: str,
        *,
        weight: float,
        version: int | None,
        counter: str | None,
        count_denial: bool,
        identity: OperatorIdentity,
    ) -> None:
        """One outcome, in a chained transaction of its own (see ``apply_in``)."""
        self.store.chained(
            lambda tx: self.apply_in(
                tx,
                material_id,
                verdict,
                weight=weight,
                version=version,
                counter=counter,
                count_denial=count_denial,
                identity=identity,
            )
        )

    def apply_in(
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
    ) -> tuple[Row, Row, bool]:
        """One outcome inside a chained transaction: ``(row before, row after, proposed)``.

        ``verdict`` is a key of ``OUTCOMES``; ``counter`` the usage counter to bump;
        ``context`` is chained beside the outcome (the feedback and request it came from).
        """
        if verdict not in OUTCOMES:
            raise InputError(f"verdict must be one of {sorted(OUTCOMES)}, not {verdict!r}")
        cur = ChainCursor(tx.cursor)
        row = read_row(cur, material_id)
        if row is None:
            raise MaterialNotFound(material_id)
        rate = self._policy.rate
        after = moved(row, verdict, rate=rate, weight=weight, count_denial=count_denial)
        at = version or row["current_version"]
        outcome = {
            "verdict": verdict,
            "value": OUTCOMES[verdict],
            "rate": rate,
            "weight": weight,
            "denial_counted": after["denials"] > row["denials"],
            "version": at,
            **(context or {}),
        }
        tx.material_change(
            material_id,
            identity.name,
            {OUTCOME_KEY: outcome, "identity": identity.to_dict(), ROW_KEY: after},
            None,
        )
        write_row(cur, material_id, after, new=False)
        if counter:
            bump_usage(cur, material_id, at, **{counter: 1})
        return row, after, self._propose_quarantine(tx, cur, material_id, after)

    def _propose_quarantine(self, tx: Any, cur: Cursor, material_id: str, after: Row) -> bool:
        """Propose the quarantine of an active material denied often enough (a
        ``propose_quarantine`` version, once): whether this outcome proposed it."""
        if after["status"] != "active" or not should_quarantine(
            after["denials"], after["ema"], self._policy
        ):
            return False
        current = _current(cur, material_id, after["current_version"])
        if current.change == PROPOSE_QUARANTINE:
            return False
        self._writer.commit_in(
            tx,
            current.next_change(
                operator=SYSTEM,
                written_by=QUARANTINE_RULE,
                reason=f"quarantine proposed: denied {after['denials']} times "
                f"(the rule proposes it after {self._policy.quarantine_after}); "
                "a person confirms or dismisses it",
                change=PROPOSE_QUARANTINE,
            ),
            expect_current=after["current_version"],
            identity=SYSTEM_IDENTITY,
        )
        return True


__all__ = ["Outcomes", "moved"]
