"""Stage 6, assemble: one confidence, the chosen answer, the Response, and the route.

The confidence comes from the settings' combiner (see ``tracerag.signals.confidence``). The
Response is validated against the shipped JSON Schema before it is returned. An escalated
answer is withheld (``answer=None``) and handed to the escalation handler with a ticket.
"""

from __future__ import annotations

from langchain_core.runnables import RunnableConfig
from opentelemetry.trace import Span

from tracerag import __version__, semconv
from tracerag.context import RequestContext
from tracerag.contract import ClaimCheck, Evidence, Response, SignalDetail, Versions
from tracerag.contract import validate_response as validate
from tracerag.routing import ESCALATE, PASS, REVIEW, Ticket, decide, new_ticket_id
from tracerag.settings import Settings
from tracerag.signals.citations import SUPPORTED, CitationReport
from tracerag.signals.confidence import Signals
from tracerag.signals.consistency import ConsistencyReport
from tracerag.stages.verify import Selection
from tracerag.tracing import capture

STATUS = {PASS: "answered", REVIEW: "flagged_for_review", ESCALATE: "pending_human_review"}


def gather_signals(ctx: RequestContext) -> Signals:
    """The combiner's view of the verify stage's signals."""
    report: CitationReport = ctx.signals["citations"]
    consistency: ConsistencyReport = ctx.signals["consistency"]
    selection: Selection = ctx.signals["selection"]
    return Signals(
        citation_score=report.score,
        fabricated=bool(report.fabricated),
        self_consistency=selection.share,
        consistency_informative=consistency.informative,
        plan_ok=ctx.plan.ok if ctx.plan is not None else None,
        rules=tuple(ctx.signals["rules"]),
        retrieval_margin=ctx.retrieval.get("score_margin"),
        retrieval_top_score=ctx.retrieval.get("top_score"),
        samples_ok=sum(1 for s in ctx.samples if s.ok),
        n_samples=len(ctx.samples),
        semantic_entropy=consistency.entropy,
        citation_coverage=report.coverage,
    )


def evidence_of(ctx: RequestContext, report: CitationReport) -> list[Evidence]:
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
        material = ctx.material(claim.material_id)
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
    ctx: RequestContext, settings: Settings, span: Span, config: RunnableConfig | None = None
) -> RequestContext:
    """Build and route the Response (verified tiers) or record the unverified answer (low)."""
    versions = Versions(
        prompt=ctx.versions.prompt or "", model=ctx.versions.model or "", tracerag=__version__
    )
    ok = [s for s in ctx.samples if s.ok]
    if settings.tier == "low":
        ctx.decision, ctx.confidence = PASS, None
        ctx.response = Response(
            request_id=ctx.request_id,
            trace_id=ctx.trace_id,
            answer=ok[0].answer if ok else None,
            confidence=None,
            decision=PASS,
            status="unverified",
            tier="low",
            signal_detail=SignalDetail(
                samples_ok=len(ok), samples_failed=len(ctx.samples) - len(ok)
            ),
            evidence=[],
            versions=versions,
            warnings=ctx.warnings + ([] if ok else ["the model gave no answer"]),
        )
        if not ok:  # nothing to return: hand it to humans rather than lose it
            _escalate(ctx, settings, span, None, ["no successful sample"])
        return _finish(ctx, span)

    signals = gather_signals(ctx)
    combined = settings.combiner(signals, cap=settings.thresholds.cap)
    ctx.confidence = combined.value
    ctx.calibration = getattr(settings.combiner, "name", type(settings.combiner).__name__)
    ctx.decision = decide(combined.value, settings.thresholds, tier=settings.tier)
    report: CitationReport = ctx.signals["citations"]
    consistency: ConsistencyReport = ctx.signals["consistency"]
    selection: Selection = ctx.signals["selection"]
    rules = ctx.signals["rules"]
    candidate = (
        ctx.samples[selection.sample_index].answer if selection.sample_index is not None else None
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
        plan_ok=ctx.plan.ok if ctx.plan is not None else None,
        retrieval_margin=ctx.retrieval.get("score_margin"),
        samples_ok=signals.samples_ok,
        samples_failed=signals.n_samples - signals.samples_ok,
        confidence_caps=combined.caps,
    )
    ticket_id = None
    if ctx.decision in (ESCALATE, REVIEW):
        reasons = list(combined.caps) or [_why(signals)]
        ticket_id = _escalate(ctx, settings, span, candidate, reasons)
    ctx.response = Response(
        request_id=ctx.request_id,
        trace_id=ctx.trace_id,
        answer=None if ctx.decision == ESCALATE else candidate,
        confidence=combined.value,
        decision=ctx.decision,  # type: ignore[arg-type]
        status=STATUS[ctx.decision],  # type: ignore[arg-type]
        tier=settings.tier,  # type: ignore[arg-type]
        signal_detail=detail,
        evidence=evidence_of(ctx, report),
        claims=claims_of(report),
        versions=versions,
        ticket_id=ticket_id,
        calibration=ctx.calibration,
        warnings=list(ctx.warnings),
    )
    return _finish(ctx, span)


def _why(signals: Signals) -> str:
    parts = [f"citation score {signals.citation_score:.2f}"]
    if signals.self_consistency is not None:
        parts.append(f"self-consistency {signals.self_consistency:.2f}")
    return "low confidence: " + ", ".join(parts)


def _escalate(
    ctx: RequestContext, settings: Settings, span: Span, candidate: str | None, reasons: list[str]
) -> str:
    ticket = Ticket(
        ticket_id=new_ticket_id(),
        request_id=ctx.request_id,
        decision=ctx.decision or ESCALATE,
        question=ctx.question,
        candidate_answer=candidate,
        confidence=ctx.confidence,
        reasons=reasons,
        trace_id=ctx.trace_id,
    )
    try:
        settings.escalation.handle(ticket)
    except Exception as exc:  # the answer stays withheld; the failure is recorded, not raised
        ctx.record_error("assemble", exc, handler=type(settings.escalation).__name__)
        span.record_exception(exc)
    if ticket.decision == ESCALATE:  # a review flag is not an escalation
        span.add_event(
            semconv.EVENT_ESCALATED,
            {semconv.TICKET_ID: ticket.ticket_id, semconv.DECISION: ticket.decision},
        )
    return ticket.ticket_id


def _finish(ctx: RequestContext, span: Span) -> RequestContext:
    response: Response = ctx.response
    validate(response)
    span.set_attribute(semconv.DECISION, response.decision)
    span.set_attribute(semconv.STATUS, response.status)
    if response.confidence is not None:
        span.set_attribute(semconv.CONFIDENCE, response.confidence)
    if response.ticket_id:
        span.set_attribute(semconv.TICKET_ID, response.ticket_id)
    if ctx.calibration:
        span.set_attribute(semconv.CALIBRATION, ctx.calibration)
    output = capture(response.answer)
    if output is not None:
        span.set_attribute(semconv.OI_OUTPUT_VALUE, output)
    return ctx
