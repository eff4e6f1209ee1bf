"""Running ``tracerag explain``'s experiments: re-runs of a stored request and their verdicts.

The baseline and every occlusion, counterfactual and paraphrase re-run, each summarised; the
explanation they add up to, kept in the request's audit trail under one trace; many requests
at a time (a sample of a window, or the queue of rejected and complained-about ones).
"""

from __future__ import annotations

import hashlib
from collections.abc import Callable, Mapping, Sequence
from dataclasses import asdict, dataclass, field
from datetime import datetime
from typing import Any

from langchain_core.language_models import BaseChatModel
from langchain_core.retrievers import BaseRetriever
from opentelemetry import trace
from opentelemetry.trace import Link, SpanContext, TraceFlags, TracerProvider

from tracerag import _semconv as semconv
from tracerag._pipeline import RAGPipeline
from tracerag._settings import PlanMode
from tracerag._sync import run_sync
from tracerag.signals._consistency import ConclusionEquivalence
from tracerag.stages._retrieve import fetch, to_materials
from tracerag.store._audit_record import AuditRecord
from tracerag.store._base import (
    KIND_EXPLANATION,
    KIND_EXPLANATION_REQUESTED,
    AuditStore,
)
from tracerag.store._codec import RequestTrail
from tracerag.telemetry._providers import get_tracer
from tracerag.text._quantities import extract_quantities, quantities_match
from tracerag.tools._explain_plan import (
    DEFAULT_MAX_CALLS,
    FLAG_NO_DECISIVE,
    FLAG_PRIOR,
    FLAG_UNSTABLE,
    FOLLOWS,
    IGNORES,
    PLACEHOLDER,
    UNCLEAR,
    CostTooHigh,
    ExperimentPlan,
    Target,
    plan_experiments,
)
from tracerag.tools._explain_render import headline, render_report
from tracerag.tools._replay import (
    ReplayRefused,
    candidate_answer,
    check_versions,
    recorded_options,
    replay_retriever,
)

__all__ = [
    "Counterfactual",
    "Explanation",
    "Occlusion",
    "ParaphraseCheck",
    "RunSummary",
    "explain",
    "explain_queued",
    "explain_window",
    "queued",
    "sampled",
]

# -- re-runs --------------------------------------------------------------------------------------


@dataclass(frozen=True)
class RunSummary:
    """What one run concluded: the chosen answer, confidence, route and supported claims."""

    answer: str | None
    confidence: float | None
    decision: str | None
    supported_claims: tuple[str, ...] = ()
    key: tuple[str, ...] = ()
    retrieved: tuple[str, ...] = ()
    model_calls: int = 0
    request_id: str | None = None

    @classmethod
    def of(cls, record: Mapping[str, Any]) -> RunSummary:
        """The summary of a request record (stored, or captured from a re-run)."""
        audit = AuditRecord.parse(record)
        attribution = audit.signals.attribution or {}
        confidence = record.get("confidence")
        return cls(
            answer=candidate_answer(record),
            confidence=None if confidence is None else round(float(confidence), 4),
            decision=record.get("decision"),
            supported_claims=tuple(
                c.text for c in audit.citations.claims if c.verdict == "supported"
            ),
            key=tuple(attribution.get("key") or ()),
            retrieved=tuple(
                str(m.get("id")) for m in record.get("materials") or [] if isinstance(m, Mapping)
            ),
            model_calls=_calls_made(record),
            request_id=record.get("request_id"),
        )


def _calls_made(record: Mapping[str, Any]) -> int:
    samples = [s for s in record.get("samples") or [] if isinstance(s, Mapping)]
    calls = sum(int(s.get("attempts") or 0) for s in samples)
    plan = record.get("plan")
    if (
        isinstance(plan, Mapping)
        and plan.get("mode") == PlanMode.SEPARATE
        and "plan" not in (record.get("skipped") or [])
    ):
        calls += int(plan.get("attempts") or 0)
    return calls


def _same_conclusion(a: str | None, b: str | None) -> bool:
    if a is None or b is None:
        return a is b
    return ConclusionEquivalence()(a, b)


def _lost(before: RunSummary, after: RunSummary) -> tuple[str, ...]:
    equal = ConclusionEquivalence()
    return tuple(
        c for c in before.supported_claims if not any(equal(c, d) for d in after.supported_claims)
    )


@dataclass(frozen=True)
class Occlusion:
    """One used material masked: did the answer change, and what lost support."""

    material_id: str
    answer_changed: bool
    confidence_before: float | None
    confidence_after: float | None
    decision_before: str | None
    decision_after: str | None
    lost_claims: tuple[str, ...]
    answer_after: str | None


@dataclass(frozen=True)
class Counterfactual:
    """A stated value changed in a material: did the answer follow it?"""

    material_id: str
    kind: str
    original: str
    altered: str
    outcome: str  # follows | ignores | unclear
    answer_after: str | None
    confidence_after: float | None


@dataclass(frozen=True)
class ParaphraseCheck:
    """The question reworded, answered from a fresh retrieval: did the conclusion hold?"""

    question: str
    top_before: str | None
    top_after: str | None
    key_before: tuple[str, ...]
    key_after: tuple[str, ...]
    conclusion_flipped: bool
    answer_after: str | None

    @property
    def unstable(self) -> bool:
        return self.conclusion_flipped or set(self.key_before) != set(self.key_after)


@dataclass
class Explanation:
    """The tier 3 report on one request."""

    request_id: str
    versions: dict[str, Any]
    forced: bool
    plan: ExperimentPlan
    max_calls: int
    recorded: RunSummary
    baseline: RunSummary | None = None
    occlusion: list[Occlusion] = field(default_factory=list)
    counterfactuals: list[Counterfactual] = field(default_factory=list)
    paraphrases: list[ParaphraseCheck] = field(default_factory=list)
    model_calls: int = 0
    trace_id: str | None = None
    linked_trace_id: str | None = None
    linked_span_id: str | None = None
    notes: list[str] = field(default_factory=list)

    @property
    def decisive(self) -> list[str]:
        """The materials whose masking changed the answer's conclusion."""
        return [o.material_id for o in self.occlusion if o.answer_changed]

    @property
    def flags(self) -> list[str]:
        flags = []
        if any(c.outcome == IGNORES for c in self.counterfactuals):
            flags.append(FLAG_PRIOR)
        if any(p.unstable for p in self.paraphrases):
            flags.append(FLAG_UNSTABLE)
        if self.occlusion and not self.decisive:
            flags.append(FLAG_NO_DECISIVE)
        return flags

    def to_dict(self) -> dict[str, Any]:
        """The JSON-able report stored in the audit trail."""
        return {
            "request_id": self.request_id,
            "versions": self.versions,
            "forced": self.forced,
            "trace_id": self.trace_id,
            "linked": {"trace_id": self.linked_trace_id, "span_id": self.linked_span_id},
            "model_calls": {
                "planned": self.plan.model_calls,
                "made": self.model_calls,
                "cap": self.max_calls,
                "per_run": self.plan.calls_per_run,
            },
            "recorded": asdict(self.recorded),
            "baseline": asdict(self.baseline) if self.baseline else None,
            "occlusion": [asdict(o) for o in self.occlusion],
            "decisive": self.decisive,
            "counterfactuals": [asdict(c) for c in self.counterfactuals],
            "paraphrases": [{**asdict(p), "unstable": p.unstable} for p in self.paraphrases],
            "flags": self.flags,
            "notes": self.notes,
        }

    def render(self) -> str:
        """A plain-text account of the experiments."""
        return "\n".join(render_report(self.to_dict())) + "\n"


def _link(record: Mapping[str, Any]) -> tuple[list[Link], str | None, str | None]:
    span = (AuditRecord.parse(record).signals.attribution or {}).get("span") or {}
    trace_hex, span_hex = span.get("trace_id"), span.get("span_id")
    try:
        context = SpanContext(
            trace_id=int(str(trace_hex), 16),
            span_id=int(str(span_hex), 16),
            is_remote=True,
            trace_flags=TraceFlags(TraceFlags.SAMPLED),
        )
    except (TypeError, ValueError):
        return [], None, None
    if not context.is_valid:
        return [], None, None
    return [Link(context, {semconv.REQUEST_ID: str(record.get("request_id"))})], trace_hex, span_hex


class _Runner:
    """Re-runs one stored request with given materials (or a live retriever and question)."""

    def __init__(
        self,
        record: Mapping[str, Any],
        llm: BaseChatModel,
        *,
        prompt_version: str,
        model_version: str,
        tracer_provider: TracerProvider | None,
        pipeline_options: Mapping[str, Any],
    ) -> None:
        self.record = record
        self.llm = llm
        self.options = {
            "prompt_version": prompt_version,
            "model_version": model_version,
            **recorded_options(record),
            # every sample drawn: runs that differ only in what they were shown compare
            # alike, and the calls announced are the calls made
            "min_samples": recorded_options(record)["n_samples"],
            "tracer_provider": tracer_provider,
            **pipeline_options,
        }
        self.calls = 0

    def run(
        self,
        materials: Sequence[Mapping[str, Any]] | None = None,
        *,
        question: str | None = None,
        retriever: BaseRetriever | None = None,
    ) -> tuple[RunSummary, dict[str, Any]]:
        captured: list[dict[str, Any]] = []

        def sink(rec: dict[str, Any]) -> bool:
            captured.append(rec)
            return True

        if retriever is None:
            retriever = replay_retriever(materials or [])
        pipeline = RAGPipeline(retriever, self.llm, **{**self.options, "audit": sink})
        pipeline.invoke(question or str(self.record.get("question") or ""))
        rec = captured[-1] if captured else {}
        summary = RunSummary.of(rec)
        self.calls += summary.model_calls
        return summary, rec


def _masked(materials: Sequence[Mapping[str, Any]], material_id: str) -> list[dict[str, Any]]:
    return [
        {**m, "text": PLACEHOLDER} if str(m.get("id")) == material_id else dict(m)
        for m in materials
    ]


def _altered(materials: Sequence[Mapping[str, Any]], target: Target) -> list[dict[str, Any]]:
    out = []
    for m in materials:
        m = dict(m)
        if str(m.get("id")) == target.material_id:
            text = str(m.get("text") or "")
            q = target.quantity
            m["text"] = f"{text[: q.start]}{target.replacement}{text[q.end :]}"
        out.append(m)
    return out


def _outcome(answer: str | None, target: Target) -> str:
    if not answer:
        return UNCLEAR
    stated = extract_quantities(answer)
    new = [q for q in extract_quantities(target.replacement) if q.kind == target.quantity.kind]
    says_new = any(quantities_match(a, new) for a in stated)
    says_old = any(quantities_match(a, [target.quantity]) for a in stated)
    if says_new and not says_old:
        return FOLLOWS
    if says_old and not says_new:
        return IGNORES
    return UNCLEAR


def explain(
    store: AuditStore,
    request_id: str,
    llm: BaseChatModel,
    *,
    prompt_version: str,
    model_version: str,
    force: bool = False,
    counterfactuals: int = 2,
    paraphrases: Sequence[str] | None = None,
    retriever: BaseRetriever | None = None,
    max_calls: int = DEFAULT_MAX_CALLS,
    actor: str = "operator",
    tracer_provider: TracerProvider | None = None,
    announce: Callable[[ExperimentPlan], None] | None = None,
    **pipeline_options: Any,
) -> Explanation:
    """Run the tier 3 experiments on a stored request and append the report to its trail.

    Raises ``RequestNotFound``, ``ReplayRefused`` (other versions, not forced) and
    ``CostTooHigh`` (the plan needs more than ``max_calls`` model calls; nothing is run).
    ``paraphrases`` need a ``retriever`` (a fresh retrieval); without one they are skipped.
    ``announce(plan)`` is called before the first model call.
    """
    trail: RequestTrail = store.get(request_id)
    record = trail.record
    current = {"prompt": prompt_version, "model": model_version}
    mismatches = check_versions(record, current, force=force)
    notes: list[str] = []
    if paraphrases and retriever is None:
        notes.append("paraphrase check skipped: no live retriever to retrieve again with")
        paraphrases = ()
    plan = plan_experiments(record, counterfactuals=counterfactuals, paraphrases=paraphrases)
    if plan.model_calls > max_calls:
        raise CostTooHigh(
            f"explaining request {request_id} needs {plan.model_calls} model calls "
            f"({plan.runs} runs × {plan.calls_per_run}); the cap is {max_calls}"
        )
    if announce is not None:
        announce(plan)
    report = Explanation(
        request_id=request_id,
        versions=current,
        forced=bool(mismatches),
        plan=plan,
        max_calls=max_calls,
        recorded=RunSummary.of(record),
        notes=[*notes, *plan.notes],
    )
    links, report.linked_trace_id, report.linked_span_id = _link(record)
    if not links:
        report.notes.append("the record names no span to link to (recorded before attribution)")
    runner = _Runner(
        record,
        llm,
        prompt_version=prompt_version,
        model_version=model_version,
        tracer_provider=tracer_provider,
        pipeline_options=pipeline_options,
    )
    materials = [m for m in trail.materials if isinstance(m, Mapping)]
    tracer = get_tracer(tracer_provider)
    with tracer.start_as_current_span(semconv.SPAN_EXPLAIN, links=links) as root:
        root.set_attribute(semconv.REQUEST_ID, request_id)
        context = root.get_span_context()
        report.trace_id = trace.format_trace_id(context.trace_id) if context.is_valid else None

        def within_cap() -> bool:
            if runner.calls + plan.calls_per_run > max_calls:
                report.notes.append(f"stopped at the cap of {max_calls} model calls")
                return False
            return True

        with tracer.start_as_current_span(semconv.SPAN_EXPLAIN_EXPERIMENT) as span:
            span.set_attribute(semconv.EXPLAIN_EXPERIMENT, "baseline")
            baseline, _ = runner.run(materials)
        report.baseline = baseline
        for mid in plan.occlude:
            if not within_cap():
                break
            with tracer.start_as_current_span(semconv.SPAN_EXPLAIN_EXPERIMENT) as span:
                span.set_attribute(semconv.EXPLAIN_EXPERIMENT, "occlusion")
                span.set_attribute(semconv.EXPLAIN_MATERIAL_ID, mid)
                after, _ = runner.run(_masked(materials, mid))
                changed = not _same_conclusion(baseline.answer, after.answer)
                span.set_attribute(semconv.EXPLAIN_ANSWER_CHANGED, changed)
            report.occlusion.append(
                Occlusion(
                    material_id=mid,
                    answer_changed=changed,
                    confidence_before=baseline.confidence,
                    confidence_after=after.confidence,
                    decision_before=baseline.decision,
                    decision_after=after.decision,
                    lost_claims=_lost(baseline, after),
                    answer_after=after.answer,
                )
            )
        for target in plan.counterfactuals:
            if not within_cap():
                break
            with tracer.start_as_current_span(semconv.SPAN_EXPLAIN_EXPERIMENT) as span:
                span.set_attribute(semconv.EXPLAIN_EXPERIMENT, "counterfactual")
                span.set_attribute(semconv.EXPLAIN_MATERIAL_ID, target.material_id)
                after, _ = runner.run(_altered(materials, target))
                outcome = _outcome(after.answer, target)
                span.set_attribute(semconv.EXPLAIN_ANSWER_CHANGED, outcome == FOLLOWS)
            report.counterfactuals.append(
                Counterfactual(
                    material_id=target.material_id,
                    kind=target.quantity.kind,
                    original=target.quantity.raw,
                    altered=target.replacement,
                    outcome=outcome,
                    answer_after=after.answer,
                    confidence_after=after.confidence,
                )
            )
        if plan.paraphrases:
            assert retriever is not None  # paraphrases without a retriever were refused above
            top_before = _top(retriever, str(record.get("question") or ""))
        for question in plan.paraphrases:
            if not within_cap():
                break
            with tracer.start_as_current_span(semconv.SPAN_EXPLAIN_EXPERIMENT) as span:
                span.set_attribute(semconv.EXPLAIN_EXPERIMENT, "paraphrase")
                after, _ = runner.run(question=question, retriever=retriever)
            report.paraphrases.append(
                ParaphraseCheck(
                    question=question,
                    top_before=top_before,
                    top_after=after.retrieved[0] if after.retrieved else None,
                    key_before=baseline.key,
                    key_after=after.key,
                    conclusion_flipped=not _same_conclusion(baseline.answer, after.answer),
                    answer_after=after.answer,
                )
            )
        report.model_calls = runner.calls
        root.set_attribute(semconv.EXPLAIN_MODEL_CALLS, runner.calls)
        root.set_attribute(semconv.EXPLAIN_FLAGS, report.flags)
    store.append_action(
        request_id,
        KIND_EXPLANATION,
        actor,
        report.to_dict(),
        reason=headline(report.to_dict()),
    )
    return report


def _top(retriever: BaseRetriever, question: str) -> str | None:
    """The id of the top material a live retrieval returns (no model call)."""
    materials = to_materials(run_sync(lambda: fetch(retriever, question)))
    return materials[0].id if materials else None


# -- many requests ------------------------------------------------------------------------------


def sampled(request_id: str, rate: float) -> bool:
    """Whether a request falls in a ``rate`` sample: a stable hash, the same on every run."""
    digest = hashlib.sha256(request_id.encode("utf-8")).digest()
    return int.from_bytes(digest[:8], "big") / 2**64 < rate


def explain_window(
    store: AuditStore,
    llm: BaseChatModel,
    *,
    rate: float,
    since: datetime | str,
    until: datetime | str | None = None,
    limit: int = 1000,
    max_calls: int = DEFAULT_MAX_CALLS,
    announce: Callable[[list[str], int], None] | None = None,
    **options: Any,
) -> tuple[list[Explanation], list[str]]:
    """Explain a stable ``rate`` sample of the requests stored in ``[since, until)``.

    The plans of all sampled requests are made first; their model calls together must stay
    within ``max_calls`` (``CostTooHigh`` otherwise). Occlusion and counterfactuals only (no
    paraphrase). Returns the reports and, per request that could not be explained, why.
    """
    ids = [
        s.request_id
        for s in store.list_requests(since=since, until=until, limit=limit)
        if sampled(s.request_id, rate)
    ]
    return _explain_all(store, llm, ids, max_calls=max_calls, announce=announce, **options)


def queued(
    store: AuditStore, *, since: datetime | str | None = None, limit: int = 1000
) -> list[str]:
    """The requests whose explanation was asked for (a reviewer's reject, a user's complaint)
    and that have no explanation made since, oldest first."""
    out = []
    for s in store.list_requests(since=since, limit=limit):
        entries = store.get(s.request_id).entries
        asked = [e.seq for e in entries if e.kind == KIND_EXPLANATION_REQUESTED]
        made = [e.seq for e in entries if e.kind == KIND_EXPLANATION]
        if asked and (not made or max(made) < max(asked)):
            out.append(s.request_id)
    return out


def explain_queued(
    store: AuditStore,
    llm: BaseChatModel,
    *,
    since: datetime | str | None = None,
    limit: int = 1000,
    max_calls: int = DEFAULT_MAX_CALLS,
    announce: Callable[[list[str], int], None] | None = None,
    **options: Any,
) -> tuple[list[Explanation], list[str]]:
    """Explain every queued request (see ``queued``), within one model-call budget."""
    ids = queued(store, since=since, limit=limit)
    return _explain_all(store, llm, ids, max_calls=max_calls, announce=announce, **options)


def _explain_all(
    store: AuditStore,
    llm: BaseChatModel,
    ids: list[str],
    *,
    max_calls: int,
    announce: Callable[[list[str], int], None] | None,
    **options: Any,
) -> tuple[list[Explanation], list[str]]:
    plans = {}
    for rid in ids:
        record = store.get(rid).record
        plans[rid] = plan_experiments(
            record, counterfactuals=int(options.get("counterfactuals", 2))
        )
    total = sum(p.model_calls for p in plans.values())
    if total > max_calls:
        raise CostTooHigh(
            f"explaining {len(ids)} sampled request(s) needs {total} model calls; "
            f"the cap is {max_calls}"
        )
    if announce is not None:
        announce(ids, total)
    reports: list[Explanation] = []
    skipped: list[str] = []
    budget = max_calls  # what the window has left: retries may spend more than planned
    for rid in ids:
        try:
            report = explain(store, rid, llm, max_calls=budget, **options)
        except (ReplayRefused, CostTooHigh) as exc:
            skipped.append(f"{rid}: {exc}")
            continue
        reports.append(report)
        budget -= report.model_calls
    return reports, skipped
