"""Why this answer, tier 3: offline experiments on a stored request (``tracerag explain``).

A stored request is re-run through the six stages with its recorded materials, parameters and
versions (refused on a version mismatch unless forced, as ``tracerag replay`` is), first as it
was (the baseline), then once per experiment:

- occlusion: each used material in turn is replaced by a placeholder of the same shape (same
  id, title and position in the prompt, neutral text). Recorded: whether the answer's
  conclusion changed, the confidence and route before and after, and which supported claims
  of the baseline answer lost their support;
- counterfactual: a value the answer took from a material (an amount, a date, a duration) is
  changed in that material (500元 → 800元). An answer that follows the new value uses its
  materials; one that keeps the old value answers from the model's prior, and is flagged;
- paraphrase (optional, needs a live retriever): the question lightly reworded is answered
  from a fresh retrieval. A different conclusion or different key materials mark the
  retrieval as unstable.

The number of model calls is known before any is made (runs × calls per run); it is printed,
and a plan above the cap is refused. The report is appended to the request's audit trail (an
``explanation`` entry, covered by the hash chain), and its spans form one trace whose root
links to the span that recorded the request's attribution.

Attribution by experiment is approximate: a masked material can be substituted by another
that says the same, and a model may change its answer for reasons unrelated to the material.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import re
import sys
from collections.abc import Callable, Mapping, Sequence
from dataclasses import asdict, dataclass, field
from datetime import datetime
from typing import Any

from langchain_core.language_models import BaseChatModel
from langchain_core.retrievers import BaseRetriever
from opentelemetry import trace
from opentelemetry.trace import Link, SpanContext, TraceFlags, TracerProvider

from tracerag import _semconv as semconv
from tracerag._settings import PlanMode, Tier
from tracerag.errors import TraceragError
from tracerag.signals._attribution import ClaimLink, attribute
from tracerag.signals._consistency import ConclusionEquivalence
from tracerag.store._audit_record import AuditRecord
from tracerag.store._base import (
    KIND_EXPLANATION,
    KIND_EXPLANATION_REQUESTED,
    AuditStore,
    Entry,
)
from tracerag.store._codec import RequestTrail
from tracerag.telemetry._providers import get_tracer
from tracerag.text._quantities import Quantity, extract_quantities, quantities_match
from tracerag.tools._replay import (
    ReplayRefused,
    candidate_answer,
    check_versions,
    recorded_options,
    replay_retriever,
)

__all__ = ["CostTooHigh", "Explanation", "ReplayRefused", "explain"]

DEFAULT_MAX_CALLS = 200
PLACEHOLDER = "[This material is withheld for an attribution experiment.]"
FOLLOWS = "follows"
IGNORES = "ignores"
UNCLEAR = "unclear"
FLAG_PRIOR = "answering_from_prior"
FLAG_UNSTABLE = "unstable_retrieval"
FLAG_NO_DECISIVE = "no_decisive_material"


class CostTooHigh(TraceragError):
    """The experiments would make more model calls than the cap allows."""


# -- the plan -----------------------------------------------------------------------------------


@dataclass(frozen=True)
class Target:
    """A value to change in a material: the quantity, and the text that replaces it."""

    material_id: str
    quantity: Quantity
    replacement: str


@dataclass(frozen=True)
class ExperimentPlan:
    """Which experiments run on a request, and the model calls they cost."""

    occlude: tuple[str, ...]
    counterfactuals: tuple[Target, ...]
    paraphrases: tuple[str, ...]
    calls_per_run: int
    notes: tuple[str, ...] = ()

    @property
    def runs(self) -> int:
        """Re-runs: the baseline and one per experiment."""
        return 1 + len(self.occlude) + len(self.counterfactuals) + len(self.paraphrases)

    @property
    def model_calls(self) -> int:
        return self.runs * self.calls_per_run


def calls_per_run(record: Mapping[str, Any]) -> int:
    """Model calls one re-run makes without retries: the samples, and a separate plan call."""
    options = recorded_options(record)
    tier, n = options["tier"], int(options["n_samples"])
    if tier == Tier.LOW:
        n = 1
    elif tier == Tier.MEDIUM:
        n = min(n, 3)
    plan_call = tier == Tier.HIGH and options["plan"] == PlanMode.SEPARATE
    return n + (1 if plan_call else 0)


@dataclass(frozen=True)
class _StoredMaterial:
    id: str
    text: str
    score: float | None
    metadata: Mapping[str, Any]


def _stored_materials(record: Mapping[str, Any]) -> list[_StoredMaterial]:
    out = []
    for m in record.get("materials") or []:
        if isinstance(m, Mapping):
            score = m.get("score")
            out.append(
                _StoredMaterial(
                    str(m.get("id")),
                    str(m.get("text") or ""),
                    float(score) if isinstance(score, (int, float)) else None,
                    dict(m.get("metadata") or {}),
                )
            )
    return out


def recorded_attribution(record: Mapping[str, Any]) -> dict[str, Any]:
    """The record's tier 1–2 attribution, computed from its claims when it predates them."""
    audit = AuditRecord.parse(record)
    stored = audit.signals.attribution
    if stored is not None and stored.get("materials") is not None:
        return dict(stored)
    materials = _stored_materials(record)
    ids = {m.id for m in materials}
    claims = []
    for c in audit.citations.claims:
        cited = tuple(i for i in dict.fromkeys(c.cited_ids) if i in ids)
        claims.append(ClaimLink(str(c.verdict), cited, c.material_id))
    return attribute(audit.question or "", materials, claims).to_record()


_DIGITS_RE = re.compile(r"\d+(?:,\d{3})+(?:\.\d+)?|\d+(?:\.\d+)?")
_CN_NUMBER_RE = re.compile(r"[零〇一二两三四五六七八九十百千万亿]+")
_EN_NUMBER_RE = re.compile(
    r"\b(?:one|two|three|four|five|six|seven|eight|nine|ten|eleven|twelve|fifteen|twenty|"
    r"thirty|forty|fifty|sixty|ninety|hundred)\b",
    re.I,
)
_YEAR_RE = re.compile(r"(?<!\d)[12]\d{3}(?!\d)")


def _changed_number(value: float) -> float:
    new = value * 1.6
    if float(value).is_integer():
        new = float(round(new))
        if new == value:
            new = value + 1
    return round(new, 2)


def _number_text(value: float, like: str) -> str:
    text = str(int(value)) if float(value).is_integer() else f"{value:g}"
    if "," in like and float(value).is_integer():
        text = f"{int(value):,}"
    return text


def counterfactual_text(q: Quantity) -> str | None:
    """The quantity's text with a clearly different value (500元 → 800元, a year later), or None.

    Numbers become 1.6 times as large (rounded); a date moves one year on. The result must read
    back as a quantity of the same kind with another value, else None.
    """
    raw = q.raw
    if q.kind == "date":
        m = _YEAR_RE.search(raw)
        if m is None:
            return None
        new = f"{raw[: m.start()]}{int(m.group()) + 1}{raw[m.end() :]}"
    else:
        m = _DIGITS_RE.search(raw)
        if m is not None:
            number = float(m.group().replace(",", ""))
            span = (m.start(), m.end())
            like = m.group()
        else:
            m = _CN_NUMBER_RE.search(raw) or _EN_NUMBER_RE.search(raw)
            if m is None or q.number is None:
                return None
            number, span, like = float(q.number), (m.start(), m.end()), ""
        replacement = _number_text(_changed_number(number), like)
        new = f"{raw[: span[0]]}{replacement}{raw[span[1] :]}"
    again = [x for x in extract_quantities(new) if x.kind == q.kind]
    if len(again) != 1 or again[0].key == q.key:
        return None
    return new


#: kinds of stated value a counterfactual changes, first choice first
TARGET_KINDS = ("money", "duration", "date", "percent", "number")


def _worth_changing(q: Quantity) -> bool:
    # a bare decimal is most often a clause or version number ("Clause 6.1"), not a fact
    return q.kind in TARGET_KINDS and not (q.kind == "number" and not float(q.value).is_integer())


def _targets(
    record: Mapping[str, Any], used: Sequence[str], limit: int
) -> tuple[list[Target], list[str]]:
    answer = candidate_answer(record) or ""
    stated = extract_quantities(answer)
    by_id = {m.id: m for m in _stored_materials(record)}
    targets: list[Target] = []
    notes: list[str] = []
    if not stated:
        notes.append("counterfactual skipped: the answer states no amount, date or duration")
        return targets, notes
    for mid in used:
        material = by_id.get(mid)
        if material is None or len(targets) >= limit:
            continue
        taken = [q for q in extract_quantities(material.text) if _worth_changing(q)]
        taken.sort(key=lambda q: TARGET_KINDS.index(q.kind))
        for q in taken:
            if not any(quantities_match(a, [q]) for a in stated):
                continue
            replacement = counterfactual_text(q)
            if replacement is not None:
                targets.append(Target(mid, q, replacement))
                break
    if not targets:
        notes.append("counterfactual skipped: no value the answer states could be changed")
    return targets, notes


_POLITE_ZH = ("请问", "您好，", "你好，")
_POLITE_EN = re.compile(r"^(?:please|could you tell me|can you tell me)[,:]?\s+", re.I)


def light_paraphrases(question: str) -> list[str]:
    """One light rewording of the question: a polite opening added or removed.

    Content words stay; pass real paraphrases to ``explain`` to test more than wording.
    """
    q = question.strip()
    if re.search(r"[\u4e00-\u9fff]", q):
        for prefix in _POLITE_ZH:
            if q.startswith(prefix):
                return [q[len(prefix) :].lstrip("，, ")]
        return [f"请问{q}"]
    m = _POLITE_EN.match(q)
    if m:
        rest = q[m.end() :]
        return [rest[:1].upper() + rest[1:]]
    return [f"Could you tell me: {q[:1].lower()}{q[1:]}"]


def plan_experiments(
    record: Mapping[str, Any],
    *,
    counterfactuals: int = 2,
    paraphrases: Sequence[str] | None = None,
) -> ExperimentPlan:
    """The experiments for a stored request: occlusion of every used material, counterfactuals
    on up to ``counterfactuals`` values the answer states, and the given ``paraphrases``."""
    attribution = recorded_attribution(record)
    used = [str(m["id"]) for m in attribution.get("materials") or [] if m.get("used")]
    notes: list[str] = []
    if not used:
        notes.append("no material supports the answer: nothing to occlude")
    targets, more = _targets(record, used, counterfactuals) if counterfactuals else ([], [])
    notes += more
    return ExperimentPlan(
        occlude=tuple(used),
        counterfactuals=tuple(targets),
        paraphrases=tuple(paraphrases or ()),
        calls_per_run=calls_per_run(record),
        notes=tuple(notes),
    )


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
        from tracerag._pipeline import RAGPipeline

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
        reason=_headline(report.to_dict()),
    )
    return report


def _top(retriever: BaseRetriever, question: str) -> str | None:
    """The id of the top material a live retrieval returns (no model call)."""
    from tracerag._sync import run_sync
    from tracerag.stages._retrieve import fetch, to_materials

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


# -- rendering (also used by ``tracerag show``) ---------------------------------------------------

INDENT = "  "


def _f(value: Any) -> str:
    if value is None:
        return "-"
    if isinstance(value, float):
        return f"{value:.2f}"
    return str(value)


def _headline(report: Mapping[str, Any]) -> str:
    flags = report.get("flags") or []
    decisive = report.get("decisive") or []
    return f"decisive: {', '.join(decisive) or 'none'}; flags: {', '.join(flags) or 'none'}"


def render_report(report: Mapping[str, Any]) -> list[str]:
    """The lines of one stored explanation report."""
    calls = report.get("model_calls") or {}
    linked = report.get("linked") or {}
    base = report.get("baseline") or {}
    rec = report.get("recorded") or {}
    lines = [
        f"explanation of {report.get('request_id')}"
        + ("  (FORCED despite other versions)" if report.get("forced") else ""),
        f"{INDENT}trace {_f(report.get('trace_id'))}, linked to span "
        f"{_f(linked.get('span_id'))} of trace {_f(linked.get('trace_id'))}",
        f"{INDENT}model calls: {_f(calls.get('made'))} made of {_f(calls.get('planned'))} "
        f"planned (cap {_f(calls.get('cap'))}, {_f(calls.get('per_run'))} per run)",
        f"{INDENT}recorded: {str(rec.get('decision') or '-').upper()} "
        f"{_f(rec.get('confidence'))}    baseline re-run: "
        f"{str(base.get('decision') or '-').upper()} {_f(base.get('confidence'))}",
    ]
    if base.get("answer"):
        lines.append(f"{INDENT}baseline answer: {base['answer']}")
    occlusion = report.get("occlusion") or []
    if occlusion:
        lines.append(f"{INDENT}occlusion (each used material masked in turn):")
        for o in occlusion:
            changed = "answer CHANGED" if o.get("answer_changed") else "answer unchanged"
            lines.append(
                f"{INDENT * 2}{o.get('material_id'):<24} {changed:<17} confidence "
                f"{_f(o.get('confidence_before'))} -> {_f(o.get('confidence_after'))}, "
                f"{_f(o.get('decision_before'))} -> {_f(o.get('decision_after'))}"
            )
            for claim in o.get("lost_claims") or []:
                lines.append(f"{INDENT * 3}lost support: {claim}")
            if o.get("answer_changed") and o.get("answer_after"):
                lines.append(f"{INDENT * 3}answer now: {o['answer_after']}")
        decisive = ", ".join(report.get("decisive") or []) or "none"
        lines.append(f"{INDENT * 2}=> decisive: {decisive}")
    for c in report.get("counterfactuals") or []:
        lines.append(
            f"{INDENT}counterfactual: {c.get('material_id')} {c.get('original')} -> "
            f"{c.get('altered')}: answer {str(c.get('outcome')).upper()}"
        )
        if c.get("answer_after"):
            lines.append(f"{INDENT * 3}answer: {c['answer_after']}")
    for p in report.get("paraphrases") or []:
        lines.append(
            f"{INDENT}paraphrase: {p.get('question')!r}: top {_f(p.get('top_before'))} -> "
            f"{_f(p.get('top_after'))}, key {list(p.get('key_before') or [])} -> "
            f"{list(p.get('key_after') or [])}, conclusion "
            f"{'FLIPPED' if p.get('conclusion_flipped') else 'held'}"
            f" => {'UNSTABLE' if p.get('unstable') else 'stable'}"
        )
    lines.append(f"{INDENT}flags: {', '.join(report.get('flags') or []) or 'none'}")
    for note in report.get("notes") or []:
        lines.append(f"{INDENT}note: {note}")
    return lines


def render_attribution(record: AuditRecord | Mapping[str, Any]) -> list[str]:
    """The tier 1–2 attribution section of ``tracerag show``."""
    attribution = AuditRecord.parse(record).signals.attribution
    out = ["", "ATTRIBUTION", ""]
    if not isinstance(attribution, Mapping):
        return [*out, f"{INDENT}(not recorded)"]
    retrieval = attribution.get("retrieval") or {}
    out.append(
        f"{INDENT}retrieval shape {str(retrieval.get('shape')).upper()}: top "
        f"{_f(retrieval.get('top_score'))}, margin {_f(retrieval.get('margin'))} "
        f"({_f(retrieval.get('relative_margin'))} of top), near the top: "
        f"{', '.join(retrieval.get('near_top') or []) or '-'}"
    )
    for m in attribution.get("materials") or []:
        terms = ", ".join(m.get("shared_terms") or []) or "none"
        out.append(
            f"{INDENT}{m.get('role')!s:<10} {m.get('id')!s:<24} share "
            f"{_f(m.get('share'))}  prompt #{_f(m.get('prompt_position'))}  "
            f"{'USED' if m.get('used') else 'not used'}: {m.get('reason')} ({m.get('detail')})"
        )
        out.append(f"{INDENT * 6}shares with the question: {terms}")
    out.append(
        f"{INDENT}claims: {_f(attribution.get('n_claims'))}, unattributed share "
        f"{_f(attribution.get('unattributed'))}"
        + (
            f", relevance floor {_f(attribution.get('relevance_floor'))}"
            if attribution.get("relevance_floor") is not None
            else ""
        )
    )
    return out


def render_explanations(entries: Sequence[Entry]) -> list[str]:
    """The stored tier 3 reports of a request, newest last (``tracerag show``)."""
    found = [e for e in entries if e.kind == KIND_EXPLANATION]
    out = ["", f"EXPLANATIONS ({len(found)})", ""]
    if not found:
        return [*out, f"{INDENT}(none; run tracerag explain REQUEST_ID)"]
    for e in found:
        out.append(f"{INDENT}{e.created_at} by {e.actor}")
        out += [f"{INDENT}{line}" for line in render_report(e.payload)]
    return out


# -- the command ----------------------------------------------------------------------------------


def _announce(plan: ExperimentPlan, cap: int) -> None:
    print(
        f"model calls: {plan.model_calls} planned ({plan.runs} runs × {plan.calls_per_run}: "
        f"baseline, {len(plan.occlude)} occlusion, {len(plan.counterfactuals)} counterfactual, "
        f"{len(plan.paraphrases)} paraphrase); cap {cap}",
        flush=True,
    )


def run(args: argparse.Namespace) -> int:
    """Explain one stored request, or a sample of a window of them."""
    from tracerag.store import RequestNotFound
    from tracerag.telemetry._providers import force_flush
    from tracerag.tools._replay import configured_model
    from tracerag.tools._store_args import open_cli_store

    chosen = [args.request_id is not None, args.sample is not None, bool(args.queued)]
    if sum(chosen) != 1:
        print(
            "tracerag explain: give a REQUEST_ID, --sample RATE --since TIME, or --queued",
            file=sys.stderr,
        )
        return 2
    if args.sample is not None and (args.since is None or not 0 < args.sample <= 1):
        print("tracerag explain: --sample needs a RATE in (0, 1] and --since", file=sys.stderr)
        return 2
    if args.request_id is None and (args.paraphrase or args.paraphrase_auto):
        print("tracerag explain: paraphrases are for one REQUEST_ID, not --sample", file=sys.stderr)
        return 2
    if args.traces:
        from pathlib import Path

        from tracerag.demo._run import configure_traces

        configure_traces(Path(args.traces))
    llm, prompt_version, model_version = configured_model(args.model, args.seed)
    retriever = None
    paraphrases: list[str] = []
    if args.paraphrase or args.paraphrase_auto:
        from tracerag.demo.kb import build_retriever

        retriever = build_retriever(k=args.k)
        paraphrases = list(args.paraphrase or [])
    store = open_cli_store(args.store, auto_enqueue=False)
    options: dict[str, Any] = {
        "prompt_version": prompt_version,
        "model_version": model_version,
        "force": args.force,
        "counterfactuals": args.counterfactuals,
        "retriever": retriever,
        "actor": args.actor,
    }
    try:
        if args.queued:
            reports, skipped = explain_queued(
                store,
                llm,
                since=args.since,
                max_calls=args.max_calls,
                announce=lambda ids, total: print(
                    f"{len(ids)} request(s) queued; model calls: {total} planned; "
                    f"cap {args.max_calls}",
                    flush=True,
                ),
                **options,
            )
            for line in skipped:
                print(f"skipped {line}", file=sys.stderr)
        elif args.sample is not None:
            reports, skipped = explain_window(
                store,
                llm,
                rate=args.sample,
                since=args.since,
                until=args.until,
                max_calls=args.max_calls,
                announce=lambda ids, total: print(
                    f"{len(ids)} request(s) sampled; model calls: {total} planned; "
                    f"cap {args.max_calls}",
                    flush=True,
                ),
                **options,
            )
            for line in skipped:
                print(f"skipped {line}", file=sys.stderr)
        else:
            record = store.get(args.request_id).record
            if args.paraphrase_auto:
                paraphrases += light_paraphrases(str(record.get("question") or ""))
            reports = [
                explain(
                    store,
                    args.request_id,
                    llm,
                    paraphrases=paraphrases,
                    max_calls=args.max_calls,
                    announce=lambda plan: _announce(plan, args.max_calls),
                    **options,
                )
            ]
    except RequestNotFound as exc:
        print(f"tracerag explain: {exc}", file=sys.stderr)
        return 1
    except ReplayRefused as exc:
        print(f"tracerag explain: refused: {exc}", file=sys.stderr)
        return 3
    except CostTooHigh as exc:
        print(f"tracerag explain: refused: {exc}; raise --max-calls", file=sys.stderr)
        return 4
    finally:
        store.close()
        force_flush()
    if args.json:
        print(json.dumps([r.to_dict() for r in reports], ensure_ascii=False, indent=2))
    else:
        for r in reports:
            print(r.render(), end="")
    return 0


def add_parser(subparsers: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    """Register ``tracerag explain``."""
    from tracerag.tools._replay import add_rerun_arguments
    from tracerag.tools._store_args import add_store_argument

    p = subparsers.add_parser(
        "explain",
        help="why this answer: occlusion and counterfactual experiments on a stored request",
        description="Re-run a stored request with its recorded materials and versions, masking "
        "each used material in turn (occlusion) and changing a value the answer states "
        "(counterfactual); optionally reword the question and retrieve again. The report is "
        "stored in the request's audit trail and shown by tracerag show.",
    )
    p.add_argument("request_id", metavar="REQUEST_ID", nargs="?")
    add_store_argument(p)
    p.add_argument("--sample", type=float, metavar="RATE", help="explain this share of a window")
    p.add_argument(
        "--queued",
        action="store_true",
        help="explain the requests a reviewer rejected or a user complained about since "
        "their last explanation",
    )
    p.add_argument("--since", metavar="TIME", help="window start (ISO 8601), with --sample")
    p.add_argument("--until", metavar="TIME", help="window end (ISO 8601, exclusive)")
    p.add_argument(
        "--max-calls",
        type=int,
        default=DEFAULT_MAX_CALLS,
        help=f"refuse plans needing more model calls (default {DEFAULT_MAX_CALLS})",
    )
    p.add_argument(
        "--counterfactuals", type=int, default=2, help="values to change, at most (default 2)"
    )
    p.add_argument(
        "--paraphrase",
        action="append",
        metavar="QUESTION",
        help="also answer this rewording from a fresh retrieval of the demo knowledge base",
    )
    p.add_argument(
        "--paraphrase-auto",
        action="store_true",
        help="also answer a light rewording of the question (polite opening added or removed)",
    )
    p.add_argument("--k", type=int, default=4, help="materials a fresh retrieval returns")
    add_rerun_arguments(p, "explain")
    p.add_argument("--traces", metavar="FILE", help="also write the spans to this JSON-lines file")
    p.add_argument("--json", action="store_true", help="print the reports as JSON")
    p.set_defaults(func=run)
