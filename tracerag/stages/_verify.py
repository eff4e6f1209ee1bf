"""Stage 5, verify: citations, self-consistency, rules and relevance, each recorded on the span.

(a) Every successful sample's citations are checked against the retrieved materials (fabricated
ids, stale materials, support of each claim by its cited material). (b) Samples are grouped by
the conclusion they reach. (c) The candidate answer — a representative of the largest
consistent group whose citations verify — is checked by the user's rules and (d) judged on
whether it addresses the question (``tracerag.signals._relevance``).
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Sequence
from typing import Any

from langchain_core.runnables import RunnableConfig
from opentelemetry.trace import Span

from tracerag._declare import stamp
from tracerag._settings import Settings
from tracerag._state import ErrorLog, RequestState, Sample, SampleSet, Selection, Verification
from tracerag.signals._citations import SUPPORTED, CitationReport, averify_citations
from tracerag.signals._consistency import ConsistencyReport, score_consistency
from tracerag.signals._relevance import AnswerPart, RelevanceReport
from tracerag.signals._rules import run_rules
from tracerag.signals._support import get_backend, usage_scope
from tracerag.signals._types import Material
from tracerag.telemetry._evaluations import evaluation


def resolver_for(
    materials: Sequence[Material], sample: Sample, *, positional: bool = False
) -> Callable[[str], str | None]:
    """Maps a cited marker to a material id: an id as is, or a 1-based position (``[2]``)."""
    ids = {m.id for m in materials}
    folded: dict[str, list[str]] | None = None  # casefolded id -> ids, made when first needed
    order = sample.material_order or tuple(m.id for m in materials)

    def resolve(marker: str) -> str | None:
        nonlocal folded
        if marker in ids:
            return marker
        if folded is None:
            by_case: dict[str, list[str]] = {}
            for material_id in ids:
                by_case.setdefault(material_id.casefold(), []).append(material_id)
            folded = by_case
        same = folded.get(marker.casefold(), [])
        if len(same) == 1:  # ``[Warranty]`` for ``warranty``: the same id, differently cased
            return same[0]
        if positional and marker.isdigit() and 1 <= int(marker) <= len(order):
            return order[int(marker) - 1]
        return None

    return resolve


async def _verified(
    question: str,
    materials: Sequence[Material],
    sample: Sample,
    positional: bool,
    settings: Settings,
    span: Span,
    errors: ErrorLog,
) -> CitationReport:
    """The sample's citation report; a failing support backend verifies nothing (and is kept)."""
    try:
        return await averify_citations(
            sample.answer or "",
            materials,
            backend=settings.support_backend,
            resolve=resolver_for(materials, sample, positional=positional),
            question=question,
        )
    except Exception as exc:  # an answer that cannot be verified must not pass: route it
        errors.record_error("verify", exc, sample=sample.index)
        span.record_exception(exc)
        return CitationReport(backend=f"failed: {type(exc).__name__}: {exc}")


def select(
    samples: Sequence[Sample],
    reports: dict[int, CitationReport],
    consistency: ConsistencyReport,
    kept: int | None = None,
) -> Selection:
    """The largest group with a verified member, and its best-verified member.

    ``kept``: the sample whose answer the app itself keeps (wrap mode): that answer is the one
    checked and returned, with the share of samples that agree with it; none when it failed.
    """
    n = max(1, len(samples))
    if kept is not None:
        for group in consistency.groups:
            if kept in group:
                return Selection(kept, group, len(group) / n, "the answer the app kept")
        return Selection(None, [], 0.0, "the app's own run gave no answer")

    def rank(i: int) -> tuple[Any, ...]:
        r = reports[i]
        return (r.valid, not r.fabricated, r.score, r.coverage, -i)

    for group in consistency.groups:
        verified = [i for i in group if reports[i].valid]
        if verified:
            best = max(verified, key=rank)
            return Selection(best, group, len(group) / n, "largest group with verified citations")
    if consistency.groups:
        group = consistency.groups[0]
        best = max(group, key=rank)
        return Selection(best, group, len(group) / n, "no group verified; largest group")
    return Selection(None, [], 0.0, "no successful sample")


async def verify(
    state: RequestState, settings: Settings, span: Span, config: RunnableConfig | None = None
) -> Verification:
    """Check citations of every sample, score consistency, choose the candidate, run rules."""
    sampled = state.samples if state.samples is not None else SampleSet()
    samples = sampled.samples
    materials = state.materials
    errors = ErrorLog()
    reports: dict[int, CitationReport] = {}
    seen: dict[tuple[str, tuple[str, ...]], CitationReport] = {}
    # the stopping rule's reports, made against these same materials (the pipeline's samples)
    already = sampled.verified if not sampled.extra_materials else {}
    with usage_scope() as usage:
        for s in samples:
            if s.ok and s.index in already:
                reports[s.index] = already[s.index]
            elif s.ok:
                # samples often repeat an answer word for word: verify each distinct one once
                key = (s.answer or "", tuple(s.material_order))
                if key not in seen:
                    seen[key] = await _verified(
                        state.standalone_question,
                        materials,
                        s,
                        sampled.positional,
                        settings,
                        span,
                        errors,
                    )
                reports[s.index] = seen[key]
    if usage.calls or usage.cached:
        span.set_attributes(usage.attributes())
    zero = sampled.temperature_zero
    consistency = score_consistency(
        [s.answer if s.ok else None for s in samples],
        equivalence=settings.equivalence,
        informative=not zero,
        note="temperature 0: samples cannot disagree" if zero else "",
    )
    chosen = select(samples, reports, consistency, sampled.kept)
    report = reports.get(chosen.sample_index) if chosen.sample_index is not None else None
    answer = samples[chosen.sample_index].answer if chosen.sample_index is not None else None
    rules = (
        run_rules(settings.rules, state.standalone_question, answer, materials) if answer else []
    )
    relevance = (
        await judge_relevance(state.standalone_question, report, materials, settings, span, errors)
        if answer and report is not None
        else None
    )
    verification = Verification(
        citations=report or CitationReport(),
        by_sample=reports,
        consistency=consistency,
        selection=chosen,
        rules=tuple(rules),
        errors=errors.freeze(),
        relevance=relevance,
    )
    record_signals(verification, span)
    return verification


def answer_parts(report: CitationReport, materials: Sequence[Material]) -> list[AnswerPart]:
    """The answer's cited claims with the sentence and material each one rests on."""
    by_id = {m.id: m for m in materials}
    parts = []
    for claim in report.claims:
        if not claim.cited_ids:
            continue  # a claim with no citation rests on nothing (a refusal, a preamble)
        material = by_id.get(claim.material_id) if claim.material_id else None
        parts.append(
            AnswerPart(
                text=claim.text,
                sentence=claim.sentence,
                material="\n".join(filter(None, [material.title, material.text]))
                if material is not None
                else "",
                supported=claim.verdict == SUPPORTED,
            )
        )
    return parts


async def judge_relevance(
    question: str,
    report: CitationReport,
    materials: Sequence[Material],
    settings: Settings,
    span: Span,
    errors: ErrorLog,
) -> RelevanceReport | None:
    """Whether the chosen answer addresses the question (None: the check is off). Embeddings
    run in a worker thread; when they fail, the lexical check decides and the error is kept."""
    check = settings.answer_relevance
    if check is None:
        return None
    parts = answer_parts(report, materials)
    try:
        backend = get_backend(settings.support_backend)
    except Exception:  # the verify calls above reported it; judge lexically
        backend = None
    if not check.uses_embeddings(backend):
        return check.check(question, parts)
    try:
        return await asyncio.to_thread(check.check, question, parts, backend=backend)
    except Exception as exc:  # a failing model must not hide the lexical verdict
        errors.record_error("verify", exc, signal="answer_relevance")
        span.record_exception(exc)
        return check.lexical(question, parts)


def record_signals(verification: Verification, span: Span) -> None:
    """The verify signals as span attributes (``Verification.SIGNALS``) and GenAI evaluation
    events."""
    if not span.is_recording():
        return
    stamp(span, verification)
    report = verification.citations
    consistency = verification.consistency
    selection = verification.selection
    rules = verification.rules
    relevance = verification.relevance
    evaluation(
        span,
        "citation_validity",
        report.score,
        "valid" if report.valid else ("fabricated" if report.fabricated else "invalid"),
        f"{sum(c.verdict == 'supported' for c in report.claims)}/{len(report.claims)} "
        f"claims supported; fabricated: {report.fabricated or 'none'}",
    )
    evaluation(
        span,
        "self_consistency",
        selection.share,
        "informative" if consistency.informative else "uninformative",
        f"{consistency.n_groups} conclusion groups over {consistency.n_samples} samples; "
        f"entropy {consistency.entropy}",
    )
    if relevance is not None and relevance.addresses is not None:
        evaluation(
            span,
            "answer_relevance",
            1.0 if relevance.addresses else 0.0,
            "relevant" if relevance.addresses else "off_topic",
            relevance.reason,
        )
    for r in rules:
        evaluation(
            span,
            f"rule:{r.name}",
            1.0 if r.passed else 0.0,
            "pass" if r.passed else "fail",
            r.detail,
        )
