"""Closing the loop: outcomes of answers move the credibility of the materials they relied on.

* ``record_feedback(request_id, verdict, comment, correction, registry=...)`` — a user's
  ``confirm`` / ``deny`` / ``clarify`` (with a correction) on an answer;
* ``record_review_outcome(request_id, registry=...)`` — a reviewer's approve / edit / reject;
* ``record_usage(record, registry=...)`` — a finished request's read hits and usage counts.

The materials an answer relied on are, in order of preference: those with a share in the
record's ``signals.attribution`` (``{material_id: {"share": s}}`` or ``{material_id: s}``),
weighted by that share; else the retrieved materials its claims cited; else the plan's; else
every retrieved one — the last three weighted evenly. A denial of an answer that relied on both
sides of an open conflict lowers both sides' EMA but counts toward the quarantine of the less
trusted side only (when they are trusted alike, of the side whose write made the conflict).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from langchain_core.documents import Document

from tracerag.materials.db import MaterialStoreError
from tracerag.materials.model import Provenance, content_hash
from tracerag.materials.records import Use
from tracerag.materials.registry import MaterialRegistry
from tracerag.record import AuditRecord
from tracerag.store.base import KIND_EXPLANATION_REQUESTED

VERDICTS = ("confirm", "deny", "clarify")


class DuplicateFeedback(MaterialStoreError):
    """This person already gave feedback on this request (one verdict each)."""


CORRECTION_RULE = "feedback-correction@1"
_COUNTERS = {
    "confirm": "confirmations",
    "deny": "denials",
    "approve": "approvals",
    "edit": "edits",
    "reject": "rejections",
}


@dataclass(frozen=True)
class MaterialUpdate:
    """How one material's credibility moved."""

    material_id: str
    version: int | None
    share: float
    ema_before: float
    ema_after: float
    status: str


@dataclass
class FeedbackResult:
    """What one feedback verdict changed."""

    request_id: str
    verdict: str
    feedback_id: str | None = None
    updates: list[MaterialUpdate] = field(default_factory=list)
    quarantined: list[str] = field(default_factory=list)
    correction_id: str | None = None
    audit_seq: int | None = None

    def to_dict(self) -> dict[str, Any]:
        """A JSON-able form."""
        return {
            "request_id": self.request_id,
            "verdict": self.verdict,
            "feedback_id": self.feedback_id,
            "updates": [u.__dict__ for u in self.updates],
            "quarantined": self.quarantined,
            "correction_id": self.correction_id,
            "audit_seq": self.audit_seq,
        }


def _materials(record: Mapping[str, Any]) -> dict[str, dict[str, Any]]:
    return {
        m.id: m.model_dump() for m in AuditRecord.parse(record).materials if m.id is not None
    }


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


def _apply(
    registry: MaterialRegistry, record: Mapping[str, Any], verdict: str, result: FeedbackResult
) -> dict[str, dict[str, Any]]:
    _ensure_registered(registry, record)
    materials = _materials(record)
    shares = relied_on(record)
    # both sides of an open conflict relied on: the denial counts toward quarantine only for
    # the less trusted side; both EMAs move
    states = registry.states(shares)
    spared: set[str] = set()
    for c in registry.conflicts():
        a, b = states.get(c.material_a), states.get(c.material_b)
        if a is None or b is None:
            continue
        # the less trusted side; when trusted alike, the side whose write made the conflict
        spared.add(c.material_a if b.ema < a.ema else c.material_b)
    applied: dict[str, dict[str, Any]] = {}
    for mid, share in shares.items():
        before = registry.find(mid)
        if before is None:
            continue
        version = _version(registry, materials[mid])
        after = registry.apply_outcome(
            mid,
            verdict,
            weight=share,
            version=version,
            counter=_COUNTERS.get(verdict),
            count_denial=mid not in spared,
        )
        result.updates.append(
            MaterialUpdate(mid, version, share, before.ema, after.ema, after.status)
        )
        if after.status == "quarantined" and before.status != "quarantined":
            result.quarantined.append(mid)
        applied[mid] = {"version": version, "share": share}
    return applied


def record_feedback(
    request_id: str,
    verdict: str,
    comment: str | None = None,
    correction: str | None = None,
    *,
    registry: MaterialRegistry,
    operator: str = "user",
) -> FeedbackResult:
    """Apply a user's verdict on an answer to the materials it relied on.

    ``deny`` and ``clarify`` mark the request as complained about (its read hits are kept);
    a ``clarify`` correction is written as a new ``user_input`` material, held for review.
    The verdict is appended to the request's audit trail. Raises ``RequestNotFound``.
    """
    if verdict not in VERDICTS:
        raise ValueError(f"verdict must be one of {VERDICTS}, not {verdict!r}")
    if verdict == "clarify" and not (correction and correction.strip()):
        raise ValueError("a clarify verdict needs the correction")
    trail = registry.store.get(request_id)
    if any(f["operator"] == operator for f in registry.feedback_for(request_id)):
        raise DuplicateFeedback(f"{operator} already gave feedback on request {request_id!r}")
    record = trail.record
    result = FeedbackResult(request_id, verdict)
    applied = _apply(registry, record, verdict, result)
    if verdict in ("deny", "clarify"):
        registry.mark_complaint(request_id, verdict)
    if verdict == "clarify" and correction:
        n = sum(1 for s in registry.by_rule(CORRECTION_RULE)) + 1
        correction_id = f"correction-{request_id}-{n}"
        registry.register(
            correction_id,
            correction,
            operator=operator,
            written_by=CORRECTION_RULE,
            provenance=Provenance(source_type="user_input", parents=tuple(applied)),
            reason=f"correction to request {request_id}" + (f": {comment}" if comment else ""),
            hold=True,
        )
        result.correction_id = correction_id
    entry = registry.store.append_action(
        request_id,
        "operator_action",
        operator,
        {
            "feedback": {
                "verdict": verdict,
                "comment": comment,
                "correction": correction,
                "correction_id": result.correction_id,
                "materials": applied,
                "quarantined": result.quarantined,
            }
        },
        comment,
    )
    result.audit_seq = entry.seq
    result.feedback_id = registry.log_feedback(
        request_id, verdict, comment, correction, operator, entry.seq
    )
    if verdict == "deny":
        request_explanation(registry, request_id, operator, "a user denied the answer")
    return result


def request_explanation(
    registry: MaterialRegistry, request_id: str, actor: str, why: str
) -> None:
    """Queue an offline explanation of a request (``tracerag explain --queued`` runs it)."""
    registry.store.append_action(
        request_id, KIND_EXPLANATION_REQUESTED, actor, {"why": why}, why
    )


def record_review_outcome(request_id: str, *, registry: MaterialRegistry) -> FeedbackResult | None:
    """Apply a reviewer's decision (approve / edit / reject) to the materials the answer used.

    None when the request has no review decision yet, or it was applied before.
    """
    decision = registry.store.get_decision(request_id)
    if decision is None:
        return None
    reviewer = f"review:{decision.reviewer}"
    if any(f["operator"] == reviewer for f in registry.feedback_for(request_id)):
        return None  # applied already
    record = registry.store.get(request_id).record
    result = FeedbackResult(request_id, decision.action)
    _apply(registry, record, decision.action, result)
    if decision.action in ("edit", "reject"):
        registry.mark_complaint(request_id, decision.action)
    if decision.action == "reject":
        request_explanation(registry, request_id, reviewer, "a reviewer rejected the answer")
    result.feedback_id = registry.log_feedback(
        request_id, decision.action, decision.reason, decision.final_answer, reviewer, None
    )
    return result


__all__ = [
    "VERDICTS",
    "DuplicateFeedback",
    "FeedbackResult",
    "MaterialUpdate",
    "record_feedback",
    "record_review_outcome",
    "record_usage",
    "relied_on",
    "request_explanation",
]
