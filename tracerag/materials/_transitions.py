"""Status changes a person makes: approve, reject, quarantine, restore, delete, dismiss, and
the rollback of a batch.

``MOVES`` is the one table of what each action starts from, where it leads and whether it
starts the denial count again; each change is a new version committed by the ``VersionWriter``.
"""

from __future__ import annotations

from typing import Any, NamedTuple

from tracerag._choices import StrChoice
from tracerag._identity import OperatorIdentity
from tracerag.errors import InputError
from tracerag.materials._batches import Batches
from tracerag.materials._commit import VersionWriter
from tracerag.materials._db import MaterialStoreError
from tracerag.materials._model import MaterialState, MaterialVersion, now_iso
from tracerag.materials._reads import Reads
from tracerag.materials._records import (
    ROLLBACK_RULE,
    InvalidTransition,
    RollbackResult,
)


class Action(StrChoice):
    """A status change a person makes."""

    APPROVE = "approve"
    REJECT = "reject"
    QUARANTINE = "quarantine"
    RESTORE = "restore"
    DELETE = "delete"
    DISMISS = "dismiss"  # a proposed quarantine (MaterialState.proposed_quarantine)


class Move(NamedTuple):
    """Where an action may start, where it leads, and whether the denial count starts again."""

    starts: frozenset[str]
    target: str
    resets_denials: bool = False


MOVES: dict[Action, Move] = {
    Action.APPROVE: Move(frozenset({"pending_review"}), "active"),
    Action.REJECT: Move(frozenset({"pending_review"}), "deleted"),
    Action.QUARANTINE: Move(frozenset({"active", "pending_review"}), "quarantined"),
    Action.RESTORE: Move(frozenset({"quarantined"}), "active", resets_denials=True),
    Action.DELETE: Move(frozenset({"active", "pending_review", "quarantined"}), "deleted"),
    Action.DISMISS: Move(frozenset({"active"}), "active", resets_denials=True),
}


def action_of(action: str) -> Action:
    """The action named ``action``; ``InputError`` for any other name."""
    try:
        return Action(action)
    except ValueError:
        names = sorted(a.value for a in Action)
        raise InputError(f"action must be one of {names}, not {action!r}") from None


class Transitions:
    """Status changes and batch rollbacks of the registry's materials."""

    def __init__(self, reads: Reads, writer: VersionWriter, batches: Batches) -> None:
        self._reads = reads
        self._writer = writer
        self._batches = batches

    def apply(
        self,
        material_id: str,
        action: str,
        *,
        who: OperatorIdentity,
        reason: str,
        written_by: str = "manual",
        batch_id: str | None = None,
    ) -> MaterialVersion:
        """A new version with the status ``action`` leads to (``MaterialRegistry.transition``)."""
        act = action_of(action)
        if not reason or not reason.strip():
            raise InputError(f"a {act.value} needs a reason")
        move = MOVES[act]
        state = self._reads.get(material_id)
        changes: dict[str, Any] = {"status": move.target, "batch_id": batch_id}
        if act is Action.APPROVE:
            changes["last_confirmed"] = now_iso()
        if act in (Action.APPROVE, Action.REJECT) and state.pending is not None:
            return self._decide_edit(state, state.pending, act, who, reason, written_by, changes)
        if state.status not in move.starts:
            raise InvalidTransition(f"cannot {act.value} {material_id!r}: it is {state.status}")
        if act is Action.DISMISS and state.proposed_quarantine is None:
            raise InvalidTransition(f"cannot dismiss {material_id!r}: no quarantine is proposed")
        return self._writer.commit(
            state.current.next_change(
                operator=who.name,
                written_by=written_by,
                reason=reason,
                change=act.value,
                **changes,
            ),
            expect_current=state.current.version,
            pending="clear" if act is Action.DELETE else "keep",
            reset_denials=move.resets_denials,
            identity=who,
        )

    def _decide_edit(
        self,
        state: MaterialState,
        pending: int,
        act: Action,
        who: OperatorIdentity,
        reason: str,
        written_by: str,
        changes: dict[str, Any],
    ) -> MaterialVersion:
        """Approve (into service) or reject the proposed edit waiting beside the version in
        service."""
        proposed = self._reads.version(state.material_id, pending).version
        return self._writer.commit(
            proposed.next_change(
                operator=who.name,
                written_by=written_by,
                reason=reason,
                change=act.value,
                **changes,
            ),
            expect_current=state.current.version,
            make_current=act is Action.APPROVE,
            pending="clear",
            identity=who,
        )

    def rollback_batch(
        self, batch_id: str, *, who: OperatorIdentity, reason: str, force: bool = False
    ) -> RollbackResult:
        """Restore every material a batch changed to its state before the batch (see
        ``MaterialRegistry.rollback_batch``)."""
        versions = self._reads.by_batch(batch_id)
        if not versions:
            raise MaterialStoreError(f"no versions were written in batch {batch_id!r}")
        first: dict[str, MaterialVersion] = {}
        last: dict[str, MaterialVersion] = {}
        for sv in versions:
            first.setdefault(sv.version.material_id, sv.version)
            last[sv.version.material_id] = sv.version
        with self._batches.scope() as rollback_id:
            result = RollbackResult(batch_id, rollback_id)
            for material_id, v0 in first.items():
                latest = self._reads.history(material_id)[-1].version.version
                if latest != last[material_id].version and not force:
                    result.skipped[material_id] = f"changed after the batch (now version {latest})"
                    continue
                why = self._undo(
                    material_id, v0, who, f"rollback of {batch_id}", reason, rollback_id
                )
                if why is not None:
                    result.skipped[material_id] = why
                elif v0.based_on is None:
                    result.deleted.append(material_id)
                else:
                    result.restored.append(material_id)
        return result

    def _undo(
        self,
        material_id: str,
        v0: MaterialVersion,
        who: OperatorIdentity,
        what: str,
        reason: str,
        rollback_id: str,
    ) -> str | None:
        """Put a material back as it was before ``v0`` (deleted when ``v0`` created it): None,
        or why it was skipped."""
        state = self._reads.get(material_id)
        if v0.based_on is None:
            if state.status == "deleted":
                return "already deleted"
            restored = state.current.next_change(
                status="deleted",
                operator=who.name,
                written_by=ROLLBACK_RULE,
                reason=f"{what}: {reason}",
                change="rollback",
                batch_id=rollback_id,
            )
        else:
            prior = self._reads.version(material_id, v0.based_on).version
            restored = prior.next_change(
                based_on=state.current.version,
                operator=who.name,
                written_by=ROLLBACK_RULE,
                reason=f"{what} to version {prior.version}: {reason}",
                change="rollback",
                batch_id=rollback_id,
            )
        self._writer.commit(
            restored, expect_current=state.current.version, pending="clear", identity=who
        )
        return None


__all__ = ["MOVES", "Action", "Move", "Transitions", "action_of"]
