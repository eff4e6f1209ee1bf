"""Closing the loop: outcomes of answers move the credibility of the materials they relied on.

* ``record_feedback(request_id, verdict, comment, correction, registry=..., operator=...)`` —
  a verdict on an answer: ``confirm`` / ``deny`` / ``clarify`` (with a correction);
* ``record_review_outcome(request_id, registry=...)`` — a reviewer's approve / edit / reject;
* ``record_usage(record, registry=...)`` — a finished request's read hits and usage counts.

A verdict counts once per principal and request (``DuplicateFeedback`` after) and only when the
principal is established by more than the caller's word (``tracerag.materials._principal``): a
verdict under a declared name is kept as an unverified note and moves nothing. Within the
``FeedbackLimits`` given (the server always gives them), a principal's verdicts beyond its rate
are refused (``FeedbackLimited``), and a principal moves each material at most once per window.
A material denied often enough is not quarantined by the verdicts themselves: the rule
*proposes* its quarantine (a ``propose_quarantine`` version), which a person confirms or
dismisses on the desk or with ``tracerag materials quarantine|dismiss``.

The verdict, what it did to each material (``outcome`` events with the material's columns
after them), the proposal it caused and the verdict's rows commit in one transaction with their
entries in the hash chain, so ``tracerag audit verify`` re-derives all of it.

The materials an answer relied on are, in order of preference: those with a share in the
record's ``signals.attribution`` (``{material_id: {"share": s}}`` or ``{material_id: s}``),
weighted by that share; else the retrieved materials its claims cited; else the plan's; else
every retrieved one — the last three weighted evenly. A denial of an answer that relied on both
sides of an open conflict lowers both sides' EMA but counts toward the quarantine of the less
trusted side only (when they are trusted alike, of the side whose write made the conflict).
"""

from __future__ import annotations

import uuid
from collections.abc import Mapping
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from typing import Any

from langchain_core.documents import Document

from tracerag._identity import REVIEW_DECISION, OperatorIdentity
from tracerag.errors import InputError
from tracerag.materials._chained_rows import read_row
from tracerag.materials._db import ChainCursor, Cursor, MaterialStoreError
from tracerag.materials._model import Provenance, content_hash, iso, parse_time, utcnow
from tracerag.materials._operator import Operator
from tracerag.materials._principal import (
    FeedbackLimits,
    capped,
    counts,
    principal_of,
)
from tracerag.materials._records import Use
from tracerag.materials._registry import MaterialRegistry
from tracerag.store._audit_record import AuditRecord
from tracerag.store._base import KIND_EXPLANATION_REQUESTED

VERDICTS = ("confirm", "deny", "clarify")
#: verdicts (and review actions) that complain about an answer
COMPLAINTS = ("deny", "clarify", "edit", "reject")


class DuplicateFeedback(MaterialStoreError):
    """This principal already gave a verdict on this request (one verdict each)."""


class FeedbackLimited(MaterialStoreError):
    """A principal gave more verdicts than its limit allows in the window (or a request has
    as many unverified notes as it may keep); ``retry_after``: seconds until one is allowed."""

    def __init__(self, message: str, retry_after: float) -> None:
        super().__init__(message)
        self.retry_after = retry_after


CORRECTION_RULE = "feedback-correction@1"
_COUNTERS = {
    "confirm": "confirmations",
    "deny": "denials",
    "approve": "approvals",
    "edit": "edits",
    "reject": "rejections",
}
NOTE_REASON = "an unverified note: no authenticated principal gave it"


@dataclass(frozen=True)
class MaterialUpdate:
    """How one material's credibility moved (``counted`` false: it did not, and ``why``)."""

    material_id: str
    version: int | None
    share: float
    ema_before: float
    ema_after: float
    status: str
    counted: bool = True
    why: str | None = None


@dataclass
class FeedbackResult:
    """What one verdict changed. ``to_dict`` is the operator's view (credibility figures
    included); ``caller_view`` is what the one who gave it may be told."""

    request_id: str
    verdict: str
    feedback_id: str | None = None
    principal: str | None = None  # None: an unverified note
    method: str | None = None
    counted: bool = False
    note: str | None = None  # why it moved nothing, when it did not
    updates: list[MaterialUpdate] = field(default_factory=list)
    proposed: list[str] = field(default_factory=list)  # quarantines proposed for a person
    correction_id: str | None = None
    audit_seq: int | None = None

    def to_dict(self) -> dict[str, Any]:
        """A JSON-able form, for operators."""
        return {
            "request_id": self.request_id,
            "verdict": self.verdict,
            "feedback_id": self.feedback_id,
            "principal": self.principal,
            "method": self.method,
            "counted": self.counted,
            "note": self.note,
            "updates": [u.__dict__ for u in self.updates],
            "proposed_quarantine": self.proposed,
            "correction_id": self.correction_id,
            "audit_seq": self.audit_seq,
        }

    def caller_view(self) -> dict[str, Any]:
        """What the verdict's giver may know: that it was kept, whether it counted (and if not,
        why in general terms), and whether a correction was held for review — no material,
        credibility figure or quarantine."""
        return {
            "request_id": self.request_id,
            "verdict": self.verdict,
            "feedback_id": self.feedback_id,
            "recorded_as": "verdict" if self.principal is not None else "note",
            "counted": self.counted,
            "note": self.note,
            "correction_held": self.correction_id is not None,
        }


def _materials(record: Mapping[str, Any]) -> dict[str, dict[str, Any]]:
    return {m.id: m.model_dump() for m in AuditRecord.parse(record).materials if m.id is not None}


def _cited(record: Mapping[str, Any]) -> list[str]:
    return AuditRecord.parse(record).cited_ids


def relied_on(record: Mapping[str, Any]) -> dict[str, float]:
    """The materials an answer relied on, each with its share of the answer.

    The shares come from the record's attribution (``signals.attribution.materials[].share``)
    where it has one; otherwise the cited, else the planned, else the retrieved materials share
    the answer evenly.
    """
    rec = AuditRecord.parse(record)
    retrieved = [m.id for m in rec.materials if m.id is not None]
    attribution = rec.signals.attribution or {}
    shares: dict[str, float] = {}
    for item in attribution.get("materials") or []:
        if not isinstance(item, Mapping):
            continue
        mid, share = str(item.get("id")), item.get("share")
        if (
            mid in retrieved
            and isinstance(share, (int, float))
            and not isinstance(share, bool)
            and share > 0
        ):
            shares[mid] = min(1.0, float(share))
    if shares:
        return shares
    for candidates in (
        rec.cited_ids,
        list(rec.plan.material_ids) if rec.plan is not None else [],
        retrieved,
    ):
        ids = [str(c) for c in candidates if str(c) in retrieved]
        if ids:
            return {i: 1.0 / len(ids) for i in dict.fromkeys(ids)}
    return {}


def _ensure_registered(registry: MaterialRegistry, record: Mapping[str, Any]) -> None:
    docs = []
    for mid, m in _materials(record).items():
        meta = dict(m.get("metadata") or {})
        meta.setdefault("id", mid)
        for key in ("title", "source"):
            if m.get(key) is not None:
                meta.setdefault(key, m[key])
        docs.append(Document(page_content=str(m.get("text") or ""), metadata=meta))
    known = registry.states([d.metadata["id"] for d in docs])
    registry.observe([d for d in docs if d.metadata["id"] not in known])


def _version(registry: MaterialRegistry, material: Mapping[str, Any]) -> int | None:
    meta = material.get("metadata") or {}
    version = meta.get("material_version")
    if isinstance(version, int) and not isinstance(version, bool):
        return version
    return registry.version_for(str(material["id"]), content_hash(str(material.get("text") or "")))


def record_usage(record: Mapping[str, Any], *, registry: MaterialRegistry) -> int:
    """Log a finished request's read hits; returns how many were logged (0 if logged before)."""
    _ensure_registered(registry, record)
    cited = set(_cited(record))
    uses = []
    for mid, m in _materials(record).items():
        meta = m.get("metadata") or {}
        uses.append(
            Use(
                mid,
                version=_version(registry, m),
                rank_before=meta.get("rank_before") or m.get("rank"),
                rank_after=meta.get("rank_after") or m.get("rank"),
                cited=mid in cited,
            )
        )
    return registry.record_use(str(record["request_id"]), uses, decision=record.get("decision"))


def _spared(registry: MaterialRegistry, shares: Mapping[str, float]) -> set[str]:
    """Materials a denial does not count against (the better side of an open conflict)."""
    states = registry.states(shares)
    spared: set[str] = set()
    for c in registry.conflicts():
        a, b = states.get(c.material_a), states.get(c.material_b)
        if a is None or b is None:
            continue
        # the less trusted side; when trusted alike, the side whose write made the conflict
        spared.add(c.material_a if b.ema < a.ema else c.material_b)
    return spared


@dataclass(frozen=True)
class GivenVerdict:
    """One verdict as given, fixed before its transaction: who gave it on which request, the
    materials it moves (each with its share, its version and whether a denial counts) and the
    limits it is held to."""

    request_id: str
    verdict: str
    who: OperatorIdentity
    limits: FeedbackLimits | None
    comment: str | None
    correction: str | None
    declared_user: str | None
    key: str
    shares: dict[str, float]
    versions: dict[str, int | None]
    spared: frozenset[str]
    now: datetime
    feedback_id: str = field(default_factory=lambda: "fb-" + uuid.uuid4().hex[:16])

    @property
    def counts(self) -> bool:
        """Whether the principal is established by more than the caller's word."""
        return counts(self.who)

    @property
    def principal(self) -> str | None:
        """The principal it counts for (None: an unverified note)."""
        return self.who.name if self.counts else None

    @property
    def created(self) -> str:
        return iso(self.now) or ""

    def since(self, seconds: float) -> str:
        """The time ``seconds`` before it was given."""
        return iso(self.now - timedelta(seconds=seconds)) or ""


def _given(
    registry: MaterialRegistry,
    record: Mapping[str, Any],
    request_id: str,
    verdict: str,
    who: OperatorIdentity,
    *,
    limits: FeedbackLimits | None,
    comment: str | None,
    correction: str | None,
    declared_user: str | None,
    key: str,
) -> GivenVerdict:
    """The verdict on ``record``'s answer, with the materials it relied on (registered first)."""
    _ensure_registered(registry, record)
    materials = _materials(record)
    shares = relied_on(record)
    return GivenVerdict(
        request_id,
        verdict,
        who,
        limits,
        comment,
        correction,
        declared_user,
        key,
        shares,
        {mid: _version(registry, materials[mid]) for mid in shares},
        frozenset(_spared(registry, shares)),
        utcnow(),
    )


def _check_allowed(cur: Cursor, v: GivenVerdict) -> None:
    """``DuplicateFeedback`` for a principal's second verdict on the request; within the
    limits, ``FeedbackLimited`` past a principal's rate or a request's unverified notes."""
    who, limits = v.who, v.limits
    if v.counts:
        cur.execute(
            "SELECT 1 FROM material_feedback WHERE request_id = ? AND (principal = ? OR "
            "(method = 'legacy' AND operator = ?))",
            (v.request_id, who.name, who.name),
        )
        if cur.fetchone() is not None:
            raise DuplicateFeedback(
                f"{who.name} already gave a verdict on request {v.request_id!r}"
            )
        if limits is None:
            return
        cur.execute(
            "SELECT COUNT(*), MIN(created_at) FROM material_feedback "
            "WHERE principal = ? AND created_at >= ?",
            (who.name, v.since(limits.principal_window)),
        )
        n, oldest = cur.fetchone()
        if int(n) >= limits.per_principal:
            first = parse_time(oldest) or v.now
            wait = (first - v.now).total_seconds() + limits.principal_window
            raise FeedbackLimited(
                f"{who.name} gave {n} verdicts in the last "
                f"{limits.principal_window:.0f} s (the limit is {limits.per_principal})",
                max(1.0, wait),
            )
    elif limits is not None:
        cur.execute(
            "SELECT COUNT(*) FROM material_feedback WHERE request_id = ? "
            "AND principal IS NULL AND method <> 'legacy'",
            (v.request_id,),
        )
        if int(cur.fetchone()[0]) >= limits.notes_per_request:
            raise FeedbackLimited(
                f"request {v.request_id!r} keeps at most {limits.notes_per_request} "
                "unverified notes",
                limits.principal_window,
            )


def _held_back(cur: Cursor, v: GivenVerdict, material_id: str) -> str | None:
    """Why the verdict does not move this material (a note; the principal moved it within
    the window; the material had its share of verdicts), or None."""
    if not v.counts:
        return NOTE_REASON
    limits = v.limits
    if limits is None:
        return None
    cur.execute(
        "SELECT 1 FROM material_feedback_effects WHERE principal = ? AND "
        "material_id = ? AND counted = 1 AND created_at >= ?",
        (v.who.name, material_id, v.since(limits.material_window)),
    )
    if cur.fetchone() is not None:
        return "this principal's verdicts moved this material within the window"
    if capped(v.who):
        cur.execute(
            "SELECT COUNT(*) FROM material_feedback_effects WHERE material_id = ? "
            "AND counted = 1 AND created_at >= ?",
            (material_id, v.since(limits.material_window)),
        )
        if int(cur.fetchone()[0]) >= limits.per_material:
            return "the material received as many counted verdicts as it may in the window"
    return None


def _move_materials(
    tx: Any, cur: Cursor, registry: MaterialRegistry, v: GivenVerdict, result: FeedbackResult
) -> dict[str, dict[str, Any]]:
    """Apply the verdict to each registered material it relied on (or say why not), into
    ``result``; returns what it did to each, as chained."""
    effects: dict[str, dict[str, Any]] = {}
    for mid, share in v.shares.items():
        row = read_row(cur, mid)
        if row is None:
            continue  # not registered (it could not be): nothing to move
        version = v.versions.get(mid)
        why = _held_back(cur, v, mid)
        if why is not None:
            effects[mid] = {"version": version, "share": share, "counted": False, "why": why}
            result.updates.append(
                MaterialUpdate(
                    mid, version, share, row["ema"], row["ema"], row["status"], False, why
                )
            )
            continue
        before, after, proposed = registry.outcomes.apply_in(
            tx,
            mid,
            v.verdict,
            weight=share,
            version=version,
            counter=_COUNTERS.get(v.verdict),
            count_denial=mid not in v.spared,
            identity=v.who,
            context={"feedback_id": v.feedback_id, "request_id": v.request_id},
        )
        effects[mid] = {"version": version, "share": share, "counted": True}
        status = "active" if proposed else after["status"]
        result.updates.append(
            MaterialUpdate(mid, version, share, before["ema"], after["ema"], status)
        )
        if proposed:
            result.proposed.append(mid)
    result.counted = any(e["counted"] for e in effects.values())
    if not result.counted:
        reasons = [e["why"] for e in effects.values() if e.get("why")]
        result.note = reasons[0] if reasons else "the answer relied on no registered material"
    return effects


def _chain_verdict(
    tx: Any, v: GivenVerdict, result: FeedbackResult, effects: dict[str, dict[str, Any]]
) -> Any:
    """Seal the verdict (under ``v.key``) in its request's trail."""
    return tx.action(
        v.request_id,
        "operator_action",
        v.who.name,
        {
            v.key: {
                "feedback_id": v.feedback_id,
                "verdict": v.verdict,
                "comment": v.comment,
                "correction": v.correction,
                "principal": v.principal,
                "method": v.who.method,
                "identity": v.who.to_dict(),
                "counted": result.counted,
                "declared_user": v.declared_user,
                "materials": effects,
                "proposed_quarantine": result.proposed,
            }
        },
        v.comment,
    )


def _store_verdict(
    cur: Cursor,
    v: GivenVerdict,
    result: FeedbackResult,
    effects: dict[str, dict[str, Any]],
    audit_seq: int,
) -> None:
    """The verdict's rows: the feedback, its effects, and a counted complaint."""
    cur.execute(
        "INSERT INTO material_feedback (feedback_id, request_id, verdict, comment, "
        "correction, operator, created_at, audit_seq, principal, method, counted, "
        "declared_user) VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?)",
        (
            v.feedback_id,
            v.request_id,
            v.verdict,
            v.comment,
            v.correction,
            v.who.name,
            v.created,
            audit_seq,
            v.principal,
            v.who.method,
            int(result.counted),
            v.declared_user,
        ),
    )
    for mid, effect in effects.items():
        cur.execute(
            "INSERT INTO material_feedback_effects (feedback_id, material_id, principal, "
            "counted, created_at) VALUES (?, ?, ?, ?, ?)",
            (v.feedback_id, mid, v.principal, int(effect["counted"]), v.created),
        )
    if result.counted and v.verdict in COMPLAINTS:
        cur.execute(
            "INSERT INTO material_complaints (request_id, verdict, created_at) "
            "VALUES (?, ?, ?) ON CONFLICT DO NOTHING",
            (v.request_id, v.verdict, v.created),
        )


def _apply(registry: MaterialRegistry, v: GivenVerdict) -> FeedbackResult:
    """Apply one verdict in one chained transaction (see the module's docstring)."""
    result = FeedbackResult(v.request_id, v.verdict, v.feedback_id, v.principal, v.who.method)

    def work(tx: Any) -> None:
        cur = ChainCursor(tx.cursor)
        _check_allowed(cur, v)
        effects = _move_materials(tx, cur, registry, v, result)
        entry = _chain_verdict(tx, v, result, effects)
        result.audit_seq = entry.seq
        _store_verdict(cur, v, result, effects, entry.seq)

    registry.store.chained(work)
    return result


def _verdict(
    registry: MaterialRegistry,
    record: Mapping[str, Any],
    request_id: str,
    verdict: str,
    who: OperatorIdentity,
    *,
    limits: FeedbackLimits | None,
    comment: str | None,
    correction: str | None,
    declared_user: str | None = None,
    key: str = "feedback",
) -> FeedbackResult:
    """Apply one verdict on ``record``'s answer in one chained transaction."""
    given = _given(
        registry,
        record,
        request_id,
        verdict,
        who,
        limits=limits,
        comment=comment,
        correction=correction,
        declared_user=declared_user,
        key=key,
    )
    return _apply(registry, given)


def record_feedback(
    request_id: str,
    verdict: str,
    comment: str | None = None,
    correction: str | None = None,
    *,
    registry: MaterialRegistry,
    operator: Operator = "user",
    declared_user: str | None = None,
    limits: FeedbackLimits | None = None,
) -> FeedbackResult:
    """Apply a verdict on an answer to the materials it relied on.

    ``operator``: the principal — an ``OperatorIdentity`` (a ``declared`` one is kept as an
    unverified note that moves nothing), or a bare name, which is the calling application's
    word for its user (``app-vouched``). ``declared_user``: a name the giver stated, kept
    beside the verdict, never trusted. ``limits``: the ``FeedbackLimits`` to enforce (None:
    none but one verdict per principal and request).

    A counted ``deny`` or ``clarify`` marks the request as complained about (its read hits are
    kept); a counted ``clarify`` correction is written as a new ``user_input`` material, held
    for review; a counted ``deny`` queues an explanation. The verdict is chained in the
    request's trail. Raises ``RequestNotFound``, ``DuplicateFeedback``, ``FeedbackLimited``.
    """
    if verdict not in VERDICTS:
        raise InputError(f"verdict must be one of {VERDICTS}, not {verdict!r}")
    if verdict == "clarify" and not (correction and correction.strip()):
        raise InputError("a clarify verdict needs the correction")
    who = principal_of(operator)
    if not who.name.strip():
        raise InputError("a verdict needs a named principal")
    record = registry.store.get(request_id).record
    result = _verdict(
        registry,
        record,
        request_id,
        verdict,
        who,
        limits=limits,
        comment=comment,
        correction=correction,
        declared_user=declared_user,
    )
    if result.counted and verdict == "clarify" and correction:
        n = sum(1 for _ in registry.by_rule(CORRECTION_RULE)) + 1
        correction_id = f"correction-{request_id}-{n}"
        registry.register(
            correction_id,
            correction,
            operator=who,
            written_by=CORRECTION_RULE,
            provenance=Provenance(
                source_type="user_input",
                parents=tuple(u.material_id for u in result.updates),
            ),
            reason=f"correction to request {request_id}" + (f": {comment}" if comment else ""),
            hold=True,
        )
        result.correction_id = correction_id
    if result.counted and verdict == "deny":
        request_explanation(registry, request_id, who.name, "a user denied the answer")
    return result


def request_explanation(registry: MaterialRegistry, request_id: str, actor: str, why: str) -> None:
    """Queue an offline explanation of a request (``tracerag explain --queued`` runs it)."""
    registry.store.append_action(request_id, KIND_EXPLANATION_REQUESTED, actor, {"why": why}, why)


def record_review_outcome(request_id: str, *, registry: MaterialRegistry) -> FeedbackResult | None:
    """Apply a reviewer's decision (approve / edit / reject) to the materials the answer used.

    None when the request has no review decision yet, or it was applied before.
    """
    decision = registry.store.get_decision(request_id)
    if decision is None:
        return None
    who = OperatorIdentity(f"review:{decision.reviewer}", REVIEW_DECISION)
    if any(
        f["principal"] == who.name or (f["method"] == "legacy" and f["operator"] == who.name)
        for f in registry.feedback_for(request_id)
    ):
        return None  # applied already
    record = registry.store.get(request_id).record
    try:
        result = _verdict(
            registry,
            record,
            request_id,
            decision.action,
            who,
            limits=None,
            comment=decision.reason,
            correction=decision.final_answer,
            key="review_outcome",
        )
    except DuplicateFeedback:
        return None  # applied meanwhile
    if decision.action == "reject":
        request_explanation(registry, request_id, who.name, "a reviewer rejected the answer")
    return result


__all__ = [
    "DuplicateFeedback",
    "FeedbackLimited",
    "FeedbackResult",
    "record_feedback",
    "record_review_outcome",
    "record_usage",
]
