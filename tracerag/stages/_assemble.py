"""Stage 6, assemble: one confidence, the chosen answer, the route, and the Response's content.

The confidence comes from the settings' combiner (see ``tracerag.signals._confidence``). An
escalated answer is withheld (``answer=None``); an escalated or review-flagged request gets a
ticket. The stage returns a ``Decision`` carrying that ticket; the runner hands the audit record
to its sink, then the ticket (with the record's fate) to the escalation handler, then builds the
Response once.
"""

from __future__ import annotations

from types import MappingProxyType
from typing import Any

from langchain_core.runnables import RunnableConfig
from opentelemetry import trace
from opentelemetry.trace import Span

from tracerag import _semconv as semconv
from tracerag._choices import Route, Tier
from tracerag._declare import stamp
from tracerag._routing import ESCALATE, PASS, REVIEW, Ticket, decide, new_ticket_id
from tracerag._settings import Settings
from tracerag._state import Decision, ErrorLog, RequestState, SampleSet
from tracerag.contract import ClaimCheck, Evidence, MaterialUse, SignalDetail, Versions
from tracerag.errors import ConfigurationError
from tracerag.signals._attribution import (
    Attribution,
    apply_retrieval_shape,
    attribute,
    claim_links,
)
from tracerag.signals._citations import SUPPORTED, CitationReport
from tracerag.signals._confidence import Signals
from tracerag.signals._types import CONFLICTS_WITH, QUARANTINE_PROPOSED
from tracerag.stages._verify import resolver_for

STATUS: dict[Route, str] = {
    PASS: "answered",
    REVIEW: "flagged_for_review",
    ESCALATE: "pending_human_review",
}


def gather_signals(state: RequestState) -> Signals:
    """The combiner's view of the verify stage's signals."""
    verification = state.verification
    if verification is None:
        raise ConfigurationError("a verified tier needs the verify stage's signals")
    report = verification.citations
    consistency = verification.consistency
    samples = state.samples.samples if state.samples is not None else ()
    retrieval = state.retrieval
    return Signals(
        citation_score=report.score,
        fabricated=bool(report.fabricated),
        self_consistency=verification.selection.share,
        consistency_informative=consistency.informative,
        plan_ok=state.plan.ok if state.plan is not None else None,
        rules=tuple(verification.rules),
        retrieval_margin=retrieval.score_margin if retrieval is not None else None,
        retrieval_top_score=retrieval.top_score if retrieval is not None else None,
        samples_ok=sum(1 for s in samples if s.ok),
        n_samples=len(samples),
        semantic_entropy=consistency.entropy,
        citation_coverage=report.coverage,
        answers_question=(
            verification.relevance.addresses if verification.relevance is not None else None
        ),
    )


def evidence_of(state: RequestState, report: CitationReport) -> list[Evidence]:
    """One Evidence per distinct supporting sentence of the answer's supported claims."""
    seen: set[tuple[str, int | None]] = set()
    evidence: list[Evidence] = []
    for claim in report.claims:
        if claim.verdict != SUPPORTED or claim.material_id is None or not claim.sentence:
            continue
        key = (claim.material_id, claim.start)
        if key in seen:
            continue
        seen.add(key)
        material = state.material(claim.material_id)
        evidence.append(
            Evidence(
                material_id=claim.material_id,
                title=material.title if material else claim.material_id,
                quote=claim.sentence,
                score=max(0.0, min(1.0, claim.score)),
                start=claim.start,
                end=claim.end,
                source=material.source if material else None,
            )
        )
    return evidence


def claims_of(report: CitationReport) -> list[ClaimCheck]:
    """The per-claim verdicts as they appear in the Response."""
    return [
        ClaimCheck(
            text=c.text,
            cited_ids=c.cited_ids,
            verdict=c.verdict,  # type: ignore[arg-type]
            score=max(0.0, min(1.0, c.score)),
            material_id=c.material_id,
            quote=c.sentence,
            reason=c.reason,
        )
        for c in report.claims
    ]


async def assemble(
    state: RequestState, settings: Settings, span: Span, config: RunnableConfig | None = None
) -> Decision:
    """Decide the route and the Response's content (verified tiers), or pass the unverified one."""
    run_versions = state.versions
    versions = Versions(
        prompt=run_versions.prompt or "",
        model=run_versions.model or "",
        tracerag=run_versions.tracerag,
    )
    sampled = state.samples if state.samples is not None else SampleSet()
    ok = sampled.ok
    errors = ErrorLog()
    if settings.tier is Tier.LOW:
        ticket = None
        if not ok:  # nothing to return: hand it to humans rather than lose it
            ticket = _ticket(state, span, PASS, None, None, ["no successful sample"])
        decision = Decision(
            decision=PASS,
            status="unverified",
            tier=Tier.LOW,
            confidence=None,
            answer=ok[0].answer if ok else None,
            signal_detail=SignalDetail(
                samples_ok=len(ok), samples_failed=len(sampled.samples) - len(ok)
            ),
            evidence=(),
            claims=(),
            versions=versions,
            warnings=state.warnings + (() if ok else ("the model gave no answer",)),
            errors=errors.freeze(),
            ticket_id=ticket.ticket_id if ticket is not None else None,
            ticket=ticket,
        )
        stamp(span, decision)
        return decision

    signals = gather_signals(state)
    combined = settings.combiner(signals, cap=settings.thresholds.cap)
    calibration = getattr(settings.combiner, "name", type(settings.combiner).__name__)
    routed = decide(combined.value, settings.thresholds, tier=settings.tier)
    verification = state.verification
    assert verification is not None  # gather_signals checked it
    report = verification.citations
    consistency = verification.consistency
    selection = verification.selection
    rules = verification.rules
    attribution, attribution_record = attribution_of(state, settings, span)  # no model call
    shaped, shape_reason = apply_retrieval_shape(
        routed, attribution.retrieval.shape, settings.review_clustered_retrieval
    )
    routed = Route(shaped)
    conflict_reason = conflicting_citations(state, report)
    if conflict_reason and routed == PASS:
        routed, shape_reason = REVIEW, conflict_reason
    relevance = verification.relevance
    if relevance is not None and relevance.addresses is False and routed == PASS:
        routed, shape_reason = REVIEW, relevance.reason  # supported, but not an answer to it
    candidate = (
        sampled.samples[selection.sample_index].answer
        if selection.sample_index is not None
        else None
    )
    detail = SignalDetail(
        self_consistency=round(selection.share, 4),
        consistency_informative=consistency.informative,
        consistency_groups=consistency.n_groups,
        semantic_entropy=consistency.entropy,
        citation_valid=report.valid,
        citation_score=round(report.score, 4),
        citation_coverage=round(report.coverage, 4),
        citation_accuracy=round(report.accuracy, 4),
        fabricated_citations=report.fabricated,
        stale_citations=report.stale,
        rule_check=all(r.passed for r in rules) if rules else None,
        rules=[
            {"name": r.name, "passed": r.passed, "required": r.required, "detail": r.detail}
            for r in rules
        ],
        plan_ok=state.plan.ok if state.plan is not None else None,
        retrieval_margin=signals.retrieval_margin,
        samples_ok=signals.samples_ok,
        samples_failed=signals.n_samples - signals.samples_ok,
        confidence_caps=combined.caps,
        answers_question=relevance.addresses if relevance is not None else None,
        relevance=relevance.to_record() if relevance is not None else {},
    )
    ticket = None
    if routed in (ESCALATE, REVIEW):
        reasons = [shape_reason] if shape_reason else list(combined.caps) or [_why(signals)]
        ticket = _ticket(state, span, routed, combined.value, candidate, reasons)
    decision = Decision(
        decision=routed,
        status=STATUS[routed],
        tier=settings.tier,
        confidence=combined.value,
        answer=None if routed == ESCALATE else candidate,
        signal_detail=detail,
        evidence=tuple(evidence_of(state, report)),
        claims=tuple(claims_of(report)),
        materials=tuple(MaterialUse(**m) for m in attribution.summary()),
        attribution=attribution_record,
        versions=versions,
        ticket_id=ticket.ticket_id if ticket is not None else None,
        calibration=calibration,
        warnings=state.warnings,
        errors=errors.freeze(),
        ticket=ticket,
        route_reason=shape_reason or None,
        attributed=attribution,
    )
    stamp(span, decision)
    return decision


def conflicting_citations(state: RequestState, report: CitationReport) -> str | None:
    """Why the answer needs a person when a material it cites conflicts with another active
    one (``CONFLICTS_WITH`` metadata from a material registry) or waits for a person to confirm
    or dismiss its proposed quarantine (``QUARANTINE_PROPOSED``), else None."""
    cited = {c.material_id for c in report.claims if c.material_id}
    cited |= {i for c in report.claims for i in c.cited_ids}
    found, proposed = [], []
    for mid in sorted(cited):
        material = state.material(mid)
        meta = material.metadata if material is not None else {}
        others = meta.get(CONFLICTS_WITH)
        if others:
            found.append(f"{mid} conflicts with {', '.join(map(str, others))}")
        if meta.get(QUARANTINE_PROPOSED):
            proposed.append(str(mid))
    reasons = []
    if found:
        reasons.append("cited material in conflict: " + "; ".join(found))
    if proposed:
        reasons.append("cited material proposed for quarantine: " + ", ".join(proposed))
    return "; ".join(reasons) or None


def attribution_of(
    state: RequestState, settings: Settings, span: Span
) -> tuple[Attribution, MappingProxyType[str, Any]]:
    """Tier 1 and 2 attribution of the candidate answer, for the record and the span.

    The record names this span, so an offline explanation can link its trace to this one.
    """
    verification = state.verification
    assert verification is not None
    report = verification.citations
    selection = verification.selection
    samples = state.samples.samples if state.samples is not None else ()
    sample = samples[selection.sample_index] if selection.sample_index is not None else None
    positional = bool(state.samples.positional) if state.samples is not None else False
    materials = state.materials
    resolver = (
        resolver_for(materials, sample, positional=positional) if sample is not None else None
    )
    retrieved = state.retrieval
    explained = retrieved.explanation if retrieved is not None else None
    if (
        explained is None
        or (
            explained.thresholds is not settings.retrieval_shape
            and explained.thresholds != settings.retrieval_shape
        )
        or retrieved is None
        or materials is not retrieved.materials  # wrap(): the runs added materials
    ):
        explained = None  # explained again from the materials the answer may cite
    result = attribute(
        state.standalone_question,
        materials,
        claim_links(report.claims, resolver),
        prompt_order=(sample.material_order or None) if sample is not None else None,
        relevance_floor=settings.relevance_floor,
        retrieval=explained,
        thresholds=settings.retrieval_shape,
    )
    record = result.to_record()
    span_context = span.get_span_context()
    if span_context.is_valid:
        record["span"] = {
            "trace_id": trace.format_trace_id(span_context.trace_id),
            "span_id": trace.format_span_id(span_context.span_id),
        }
    return result, MappingProxyType(record)


def _why(signals: Signals) -> str:
    parts = [f"citation score {signals.citation_score:.2f}"]
    if signals.self_consistency is not None:
        parts.append(f"self-consistency {signals.self_consistency:.2f}")
    return "low confidence: " + ", ".join(parts)


def _ticket(
    state: RequestState,
    span: Span,
    decision: Route,
    confidence: float | None,
    candidate: str | None,
    reasons: list[str],
) -> Ticket:
    """The request's ticket for people; the runner hands it on after the record's fate."""
    ticket = Ticket(
        ticket_id=new_ticket_id(),
        request_id=state.request_id,
        decision=decision or ESCALATE,
        question=state.standalone_question,
        candidate_answer=candidate,
        confidence=confidence,
        reasons=reasons,
        trace_id=state.trace_id,
    )
    if ticket.decision == ESCALATE:  # a review flag is not an escalation
        span.add_event(
            semconv.EVENT_ESCALATED,
            {semconv.TICKET_ID: ticket.ticket_id, semconv.DECISION: str(ticket.decision)},
        )
    return ticket
