"""What the review desk shows: a stored trail turned into plain values for the templates.

Every string here is untrusted text (questions, answers, retrieved documents); the templates
render it with autoescaping, so markup in a document is shown, never run. Highlights are
returned as (before, marked, after) pieces for the template to wrap in ``<mark>``.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass, field
from datetime import datetime, timezone
from typing import TYPE_CHECKING, Any

from tracerag.store._audit_record import RecordMaterial
from tracerag.store._base import KIND_EXPLANATION
from tracerag.store._codec import RequestTrail
from tracerag.telemetry._links import trace_link
from tracerag.tools.explain import render_report

if TYPE_CHECKING:
    from tracerag.materials import MaterialRegistry
    from tracerag.materials._model import MaterialVersion


@dataclass(frozen=True)
class Highlight:
    """A material's text cut around its supporting sentence."""

    before: str
    marked: str
    after: str

    @property
    def found(self) -> bool:
        return bool(self.marked)


def highlight(text: str, start: int | None, end: int | None, sentence: str | None) -> Highlight:
    """The text with the sentence at ``[start, end)`` marked.

    The stored offsets are trusted only if they cut out the stored sentence (or, without a
    sentence, are in range); otherwise the sentence is searched for; failing that nothing is
    marked.
    """
    ok = (
        isinstance(start, int)
        and isinstance(end, int)
        and not isinstance(start, bool)
        and 0 <= start < end <= len(text)
    )
    if ok and (not sentence or text[start:end] == sentence):
        return Highlight(text[:start], text[start:end], text[end:])
    if sentence:
        at = text.find(sentence)
        if at >= 0:
            return Highlight(text[:at], sentence, text[at + len(sentence) :])
    return Highlight(text, "", "")


@dataclass
class CitedMaterial:
    """One material a claim cites, as the reviewer sees it."""

    id: str
    retrieved: bool
    title: str = ""
    source: str | None = None
    score: float | None = None
    stale: str | None = None
    text: Highlight | None = None
    supports: bool = False
    credibility: float | None = None  # the registry's, when it was retrieved (reranking)


def _credibility(material: RecordMaterial) -> float | None:
    value = material.metadata.get("credibility")
    return float(value) if isinstance(value, (int, float)) and not isinstance(value, bool) else None


@dataclass
class ClaimView:
    """One claim of the candidate answer with its verdict and cited materials."""

    text: str
    verdict: str
    score: float | None
    reason: str
    materials: list[CitedMaterial] = field(default_factory=list)


@dataclass
class SampleView:
    """One sampled answer."""

    index: int
    answer: str | None
    error: str | None
    chosen: bool
    in_group: bool


def _stale(material: RecordMaterial) -> str | None:
    meta = material.metadata
    if meta.get("superseded_by"):
        return f"superseded by {meta['superseded_by']}"
    if meta.get("status") in {"superseded", "stale", "withdrawn", "expired"}:
        return f"marked {meta['status']}"
    if meta.get("valid_until"):
        return f"valid until {meta['valid_until']}"
    return None


def claim_views(trail: RequestTrail) -> list[ClaimView]:
    """Each claim with every cited material, the supporting sentence marked in its text."""
    rec = trail.audit
    out: list[ClaimView] = []
    for claim in rec.claims:
        view = ClaimView(
            text=claim.text,
            verdict=claim.verdict or "?",
            score=claim.score,
            reason=claim.reason,
        )
        sentence = claim.support
        for cid in claim.cited_ids:
            m = rec.material(cid)
            if m is None:
                view.materials.append(CitedMaterial(id=cid, retrieved=False))
                continue
            supports = claim.material_id is not None and claim.material_id == cid and bool(sentence)
            view.materials.append(
                CitedMaterial(
                    id=cid,
                    retrieved=True,
                    title=m.title or cid,
                    source=m.source,
                    score=m.score,
                    stale=_stale(m),
                    text=highlight(m.text, claim.start, claim.end, sentence)
                    if supports
                    else Highlight(m.text, "", ""),
                    supports=supports,
                    credibility=_credibility(m),
                )
            )
        out.append(view)
    return out


def sample_views(trail: RequestTrail) -> list[SampleView]:
    """The sampled answers, the chosen one and its agreeing group marked."""
    selection = trail.audit.signals.selection
    chosen = selection.sample_index if selection is not None else None
    group = set(selection.group if selection is not None else [])
    out = []
    for i, s in enumerate(trail.audit.samples):
        index = s.index if s.index is not None else i
        out.append(
            SampleView(
                index=index,
                answer=s.answer if s.answer is not None else s.raw,
                error=s.error,
                chosen=index == chosen,
                in_group=index in group,
            )
        )
    return out


@dataclass(frozen=True)
class Why:
    """One signal that sent a request to a person, and the signals-table row it belongs to."""

    text: str
    row: str


CONSISTENCY_FLOOR = 0.6  # a self-consistency below this is named as a reason


def why(trail: RequestTrail) -> list[Why]:
    """The signals that sent a request to review, most telling first."""
    rec = trail.audit
    citations = rec.citations
    out: list[Why] = []
    for mid in citations.fabricated:
        out.append(Why(f"fabricated citation: {mid} was never retrieved", "fabricated citations"))
    for mid in citations.stale:
        out.append(Why(f"stale citation to {mid}", "outdated materials cited"))
    verdicts = [str(c.verdict) for c in rec.claims]
    if verdicts.count("uncited"):
        out.append(Why(f"{verdicts.count('uncited')} uncited claim(s)", "citation coverage"))
    if verdicts.count("unsupported"):
        out.append(
            Why(f"{verdicts.count('unsupported')} claim(s) not supported", "citation accuracy")
        )
    for rule in rec.signals.rules:
        if rule.passed is False:
            detail = f" ({rule.detail})" if rule.detail else ""
            out.append(Why(f"rule {rule.name} failed{detail}", f"rule {rule.name}"))
    share = rec.self_consistency
    if share is not None and share < CONSISTENCY_FLOOR:
        out.append(Why(f"self-consistency {share:.2f}", "self-consistency"))
    if rec.plan is not None and rec.plan.ok is False:
        out.append(Why("the plan failed", "plan"))
    off_topic = rec.off_topic_reason
    if off_topic:
        out.append(Why(off_topic, "answers the question"))
    if rec.errors:
        out.append(Why(f"{len(rec.errors)} error(s) during the request", "errors"))
    if rec.confidence_caps:
        out.append(
            Why("confidence capped by " + ", ".join(rec.confidence_caps), "confidence capped by")
        )
    if not out:
        confidence = rec.confidence
        text = f"confidence {confidence:.2f}" if confidence is not None else "low confidence"
        out.append(Why(text, "confidence"))
    return out


@dataclass(frozen=True)
class SignalRow:
    """One row of the signals table; ``flagged`` when it is why the request was routed."""

    name: str
    value: str
    flagged: bool = False


def signal_rows(trail: RequestTrail, flagged: set[str] | None = None) -> list[SignalRow]:
    """The signals behind the confidence, the ones that routed the request flagged."""
    flagged = flagged if flagged is not None else {w.row for w in why(trail)}
    rec = trail.audit
    citations = rec.citations
    consistency = rec.signals.consistency
    retrieval = rec.retrieval
    plan = rec.plan

    def fmt(value: Any) -> str:
        if value is None:
            return "-"
        if isinstance(value, bool):
            return "yes" if value else "no"
        if isinstance(value, float):
            return f"{value:.2f}"
        if isinstance(value, list):
            return ", ".join(map(str, value)) or "none"
        return str(value)

    rows = [
        ("confidence", fmt(rec.confidence)),
        ("decision", fmt(rec.decision)),
        ("citation score", fmt(citations.score)),
        ("citation coverage", fmt(citations.coverage)),
        ("citation accuracy", fmt(citations.accuracy)),
        ("fabricated citations", fmt(citations.fabricated)),
        ("outdated materials cited", fmt(citations.stale)),
        ("self-consistency", fmt(rec.self_consistency)),
        ("conclusion groups", fmt(consistency.n_groups if consistency is not None else None)),
        ("semantic entropy", fmt(consistency.entropy if consistency is not None else None)),
        ("plan", "-" if plan is None else ("ok" if plan.ok else "FAILED")),
        ("answers the question", fmt((rec.signals.relevance or {}).get("addresses"))),
        ("retrieval top score", fmt(retrieval.get("top_score"))),
        ("retrieval margin", fmt(retrieval.get("score_margin"))),
        ("errors", str(len(rec.errors))),
    ]
    for rule in rec.signals.rules:
        state = "pass" if rule.passed else "FAIL"
        detail = f" — {rule.detail}" if rule.detail else ""
        rows.append((f"rule {rule.name}", f"{state}{detail}"))
    if rec.confidence_caps:
        rows.append(("confidence capped by", fmt(rec.confidence_caps)))
    return [SignalRow(name, value, name in flagged) for name, value in rows]


REASON_TEXT = {
    "cited_supported": "cited, and it supports the claim",
    "cited_unsupported": "cited, but it does not support the claim",
    "not_cited": "retrieved, never cited",
    "stale_or_superseded": "stale or superseded",
    "outside_validity_window": "outside its validity window",
    "below_relevance_floor": "below the relevance floor",
}


@dataclass(frozen=True)
class MaterialPart:
    """One material's part in the answer (attribution tiers 1 and 2), as the desk shows it."""

    id: str
    role: str  # key | supporting | irrelevant
    share: float | None
    reason: str
    position: int | None
    shared_terms: tuple[str, ...]


def attribution_rows(trail: RequestTrail) -> tuple[str | None, list[MaterialPart]]:
    """The retrieval's score shape and each material's part in the answer, most used first."""
    attribution = trail.audit.signals.attribution or {}
    retrieval = attribution.get("retrieval")
    shape = retrieval.get("shape") if isinstance(retrieval, Mapping) else None
    rows = []
    for m in attribution.get("materials") or []:
        if not isinstance(m, Mapping):
            continue
        share = m.get("share")
        position = m.get("prompt_position")
        rows.append(
            MaterialPart(
                id=str(m.get("id")),
                role=str(m.get("role") or "irrelevant"),
                share=float(share) if isinstance(share, (int, float)) else None,
                reason=REASON_TEXT.get(str(m.get("reason")), str(m.get("reason") or "")),
                position=position if isinstance(position, int) else None,
                shared_terms=tuple(str(s) for s in m.get("shared_terms") or ()),
            )
        )
    rows.sort(key=lambda r: (-(r.share or 0.0), r.id))
    return (str(shape) if shape else None), rows


def explanation_views(trail: RequestTrail) -> list[tuple[str, str, str]]:
    """The offline explanations stored for a request (``tracerag explain``), newest last:
    (when, by whom, the report as text)."""
    out = []
    for entry in trail.of_kind(KIND_EXPLANATION):
        try:
            text = "\n".join(render_report(entry.payload))
        except (KeyError, TypeError, ValueError):  # another version's report: show it raw
            import json

            text = json.dumps(entry.payload, ensure_ascii=False, indent=2)
        out.append((when(entry.created_at), entry.actor, text))
    return out


def uncited_materials(trail: RequestTrail) -> list[CitedMaterial]:
    """Materials that were retrieved but cited by no claim (e.g. the current policy when the
    answer cited a superseded one)."""
    rec = trail.audit
    cited, _ = rec.resolved_citations()
    out = []
    for m in rec.materials:
        mid = str(m.id)
        if mid in cited:
            continue
        out.append(
            CitedMaterial(
                id=mid,
                retrieved=True,
                title=m.title or mid,
                source=m.source,
                score=m.score,
                stale=_stale(m),
                text=Highlight(m.text, "", ""),
            )
        )
    return out


_CJK = re.compile(r"[\u3040-\u30ff\u3400-\u4dbf\u4e00-\u9fff\uf900-\ufaff\uac00-\ud7af]")


def lang_of(text: str | None) -> str:
    """A BCP 47 tag for a user text: ``zh`` when it has CJK characters, else ``en``."""
    return "zh" if text and _CJK.search(text) else "en"


def when(value: object) -> str:
    """An ISO timestamp for people: ``2026-11-30 15:08 UTC`` (unchanged when unparseable)."""
    if not value:
        return "-"
    try:
        moment = datetime.fromisoformat(str(value).replace("Z", "+00:00"))
    except ValueError:
        return str(value)
    if moment.tzinfo is not None:
        moment = moment.astimezone(timezone.utc)
    return moment.strftime("%Y-%m-%d %H:%M UTC")


def item_context(
    trail: RequestTrail, trace_ui: tuple[str, str | None] | None = None
) -> dict[str, Any]:
    """Everything the item page shows about one queued request."""
    rec = trail.audit
    decision = trail.review_decision
    reasons = why(trail)
    shape, parts = attribution_rows(trail)
    explanations = explanation_views(trail)
    trace_id = rec.trace_id
    trace_url = None
    if trace_ui is not None and trace_id:
        try:
            trace_url = trace_link(str(trace_id), trace_ui[0], trace_ui[1])
        except ValueError:
            trace_url = None
    return {
        "why": reasons,
        "uncited": uncited_materials(trail),
        "retrieval_shape": shape,
        "attribution": parts,
        "explanations": explanations,
        "trace_url": trace_url,
        "trace_backend": trace_ui[0] if trace_ui else None,
        "request_id": trail.request_id,
        "question": rec.question or "",
        # a conversation's turn: the standalone question verified, and the turns before it
        "standalone_question": rec.standalone_question,
        "earlier_questions": [
            str(q) for q in ((rec.conversation or {}).get("earlier_questions") or [])
        ][-3:],
        "trace_id": rec.trace_id,
        "ticket_id": rec.response.ticket_id if rec.response is not None else None,
        "started_at": rec.started_at,
        "route": rec.decision,
        "confidence": rec.confidence,
        "candidate": rec.candidate_answer,
        "samples": sample_views(trail),
        "sampling": (rec.params or {}).get("adaptive"),  # how many were drawn, why it stopped
        "signals": signal_rows(trail, {w.row for w in reasons}),
        "claims": claim_views(trail),
        "review": trail.review,
        "decision": decision.payload if decision is not None else None,
        "decided_by": decision.actor if decision is not None else None,
        "decided_at": decision.created_at if decision is not None else None,
        "versions": rec.versions.model_dump(exclude_unset=True),
    }


# -- materials ------------------------------------------------------------------------------

MATERIAL_ACTIONS = ("approve", "reject", "restore", "quarantine", "dismiss")
READ_HITS_SHOWN = 50
#: rows each list of the materials page shows (the figures above them count them all)
LISTED = 200


@dataclass(frozen=True)
class PendingWrite:
    """A write waiting for review: the proposed version, beside the one in service if any."""

    material_id: str
    proposed: MaterialVersion
    in_service: MaterialVersion | None  # of an active material whose edit waits
    gate_reasons: list[dict[str, str]]  # a conflict with an active material is one of them


def materials_overview(registry: MaterialRegistry) -> dict[str, Any]:
    """The materials page: pending writes with the gate's reasons, open conflicts, quarantined
    materials, and the registry's figures (blocking: run in a thread)."""
    conflicts = registry.conflicts(limit=LISTED)
    pending = []
    for state in registry.pending()[:LISTED]:
        number = state.pending or state.current.version
        proposed = registry.version(state.material_id, number).version
        pending.append(
            PendingWrite(
                state.material_id,
                proposed,
                state.current if state.pending is not None else None,
                list((proposed.gate or {}).get("reasons") or []),
            )
        )
    quarantined = [
        (state, registry.credibility(state)) for state in registry.materials("quarantined")[:LISTED]
    ]
    proposals = [(state, registry.credibility(state)) for state in registry.proposals()[:LISTED]]
    return {
        "pending": pending,
        "conflicts": conflicts,
        "quarantined": quarantined,
        "proposals": proposals,
        "stats": registry.stats(),
    }


def material_history(registry: MaterialRegistry, material_id: str) -> dict[str, Any]:
    """One material: now, every version with its full source snippet and who made it (and how
    that was established), its read hits and open conflicts (blocking: run in a thread).
    Raises ``MaterialNotFound``."""
    state = registry.get(material_id)
    identities = registry.identities(material_id)
    history = [
        (stored, identities.get(stored.version.version))
        for stored in reversed(registry.history(material_id))
    ]
    reads = registry.reads(material_id, limit=READ_HITS_SHOWN)
    conflicts = registry.conflicts(material_id=material_id, limit=LISTED)
    actions = []
    if state.pending is not None or state.status == "pending_review":
        actions += ["approve", "reject"]
    if state.status == "quarantined":
        actions.append("restore")
    if state.proposed_quarantine:
        actions += ["quarantine", "dismiss"]
    return {
        "state": state,
        "material_id": material_id,
        "credibility": registry.credibility(state),
        "stale": state.current.stale_reason(),
        "history": history,
        "reads": reads,
        "conflicts": conflicts,
        "actions": actions,
    }
