"""Investigation: from a request to its materials and the writes behind them, and back.

``trace_back`` answers "which write caused this answer?" in one call: for each material the
request used, the version it used, the write that produced that version (operator, rule or
model version, batch, reason, source snippet, audit entry) and the material's whole change
history; materials are ordered most-suspect first (largest share of the answer, then lowest
credibility). ``impact`` goes the other way: every request that used a material version.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from tracerag.materials._model import content_hash
from tracerag.materials._records import ReadHit, StoredVersion
from tracerag.materials._registry import MaterialRegistry
from tracerag.materials.feedback import relied_on


@dataclass
class MaterialTrace:
    """One material a request used: the version, the write that made it, its history."""

    material_id: str
    used_version: int | None
    share: float
    cited: bool
    rank_before: int | None
    rank_after: int | None
    write: StoredVersion | None  # the version the request used
    history: list[StoredVersion] = field(default_factory=list)
    origin: StoredVersion | None = None  # the first version with the used text: who wrote it
    current_status: str | None = None
    credibility: float | None = None
    denials: int = 0

    def to_dict(self) -> dict[str, Any]:
        """A JSON-able form."""

        def sv(s: StoredVersion | None) -> dict[str, Any] | None:
            if s is None:
                return None
            return {**s.version.body(), "audit_seq": s.audit_seq, "body_hash": s.body_hash}

        return {
            "material_id": self.material_id,
            "used_version": self.used_version,
            "share": self.share,
            "cited": self.cited,
            "rank_before": self.rank_before,
            "rank_after": self.rank_after,
            "write": sv(self.write),
            "origin": sv(self.origin),
            "history": [sv(s) for s in self.history],
            "current_status": self.current_status,
            "credibility": self.credibility,
            "denials": self.denials,
        }


@dataclass
class TraceBack:
    """A request, the materials it used, and the writes behind them."""

    request_id: str
    question: str | None
    decision: str | None
    confidence: float | None
    review_action: str | None
    feedback: list[dict[str, Any]]
    materials: list[MaterialTrace]

    @property
    def suspect(self) -> MaterialTrace | None:
        """The most likely cause: the first relied-on material with a known write."""
        return next((m for m in self.materials if m.share > 0 and m.write), None)

    def to_dict(self) -> dict[str, Any]:
        """A JSON-able form."""
        return {
            "request_id": self.request_id,
            "question": self.question,
            "decision": self.decision,
            "confidence": self.confidence,
            "review_action": self.review_action,
            "feedback": self.feedback,
            "suspect": self.suspect.material_id if self.suspect else None,
            "materials": [m.to_dict() for m in self.materials],
        }


def trace_back(registry: MaterialRegistry, request_id: str) -> TraceBack:
    """Request → materials used → the writes that produced them → their change history."""
    trail = registry.store.get(request_id)
    record = trail.record
    shares = relied_on(record)
    cited = {c for claim in trail.claims for c in (claim.get("cited_ids") or [])}
    logged = {h.material_id: h for h in registry.reads_of_request(request_id)}
    traces = []
    for m in trail.materials:
        mid = str(m.get("id"))
        meta = m.get("metadata") or {}
        hit = logged.get(mid)
        version = hit.version if hit else None
        if version is None and isinstance(meta.get("material_version"), int):
            version = meta["material_version"]
        state = registry.find(mid)
        if version is None and state is not None:
            version = registry.version_for(mid, content_hash(str(m.get("text") or "")))
        try:
            history = registry.history(mid)
        except KeyError:
            history = []
        write = next((s for s in history if s.version.version == version), None)
        origin = None
        if write is not None:
            origin = next(
                s for s in history if s.version.content_hash == write.version.content_hash
            )
        traces.append(
            MaterialTrace(
                material_id=mid,
                used_version=version,
                share=shares.get(mid, 0.0),
                cited=mid in cited,
                rank_before=meta.get("rank_before") or m.get("rank"),
                rank_after=meta.get("rank_after") or m.get("rank"),
                write=write,
                history=history,
                origin=origin,
                current_status=state.status if state else None,
                credibility=round(registry.credibility(state), 6) if state else None,
                denials=state.denials if state else 0,
            )
        )
    traces.sort(key=lambda t: (-t.share, t.credibility if t.credibility is not None else 1.0))
    review = trail.review_decision
    return TraceBack(
        request_id=request_id,
        question=trail.question,
        decision=trail.decision,
        confidence=trail.confidence,
        review_action=review.payload.get("action") if review else None,
        feedback=registry.feedback_for(request_id),
        materials=traces,
    )


@dataclass(frozen=True)
class Impact:
    """One request that used a material version, with its decisions."""

    hit: ReadHit
    review_action: str | None
    feedback: tuple[str, ...]


def impact(
    registry: MaterialRegistry, material_id: str, version: int | None = None
) -> list[Impact]:
    """Every logged request that used the material (one version, or any), newest first."""
    out = []
    for hit in registry.reads(material_id, version, limit=100_000):
        try:
            decision = registry.store.get_decision(hit.request_id)
        except KeyError:
            decision = None
        verdicts = tuple(f["verdict"] for f in registry.feedback_for(hit.request_id))
        out.append(Impact(hit, decision.action if decision else None, verdicts))
    return out


__all__ = ["Impact", "MaterialTrace", "TraceBack", "impact", "trace_back"]
