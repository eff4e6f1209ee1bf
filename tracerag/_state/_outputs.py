"""What each stage produces: the frozen outputs ``Registration``, ``Retrieval``, ``PlanResult``,
``SampleSet`` and ``Verification``, and the errors a stage leaves (``ErrorLog``).

Each declares in its ``SIGNALS`` table (``tracerag._declare``) where each of its values goes:
its stage span, the stage event, the audit record, the metrics, the root span.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import dataclass, field
from types import MappingProxyType
from typing import TYPE_CHECKING, Any, ClassVar

from tracerag import _semconv as semconv
from tracerag._choices import PlanMode, Tier
from tracerag._declare import (
    EACH,
    OMIT,
    Signal,
    jsonable,
)
from tracerag.signals._attribution import (
    RetrievalExplanation,
    ShapeThresholds,
    explain_retrieval,
)
from tracerag.signals._types import Material, Plan, utcnow
from tracerag.telemetry._content_capture import capture

if TYPE_CHECKING:
    from tracerag._state._record import RequestState
    from tracerag.signals._citations import CitationReport
    from tracerag.signals._consistency import ConsistencyReport
    from tracerag.signals._relevance import RelevanceReport
    from tracerag.signals._rules import RuleResult
from tracerag._state._fill import record_of

__all__ = [
    "ErrorLog",
    "PlanResult",
    "Registration",
    "Retrieval",
    "RunVersions",
    "Sample",
    "SampleSet",
    "Selection",
    "StageError",
    "StageRefusal",
    "Verification",
]


@dataclass(frozen=True)
class StageError:
    """Something that went wrong in a stage: kept as data, never lost."""

    stage: str
    type: str
    message: str
    at: str
    extra: Mapping[str, Any] = field(default_factory=dict)

    def to_dict(self) -> dict[str, Any]:
        """The error as it appears in the audit record."""
        return {
            "stage": str(self.stage),
            "type": self.type,
            "message": self.message,
            **jsonable(dict(self.extra)),
            "at": self.at,
        }


class ErrorLog:
    """The errors one stage run collects (retries included), in the order they happened."""

    def __init__(self) -> None:
        self._errors: list[StageError] = []

    def record_error(self, stage: str, error: BaseException | str, **extra: Any) -> None:
        """Keep an error with its stage."""
        if isinstance(error, BaseException):
            kind, message = type(error).__name__, str(error)
        else:
            kind, message = "error", error
        self._errors.append(
            StageError(stage, kind, message, utcnow().isoformat(), MappingProxyType(extra))
        )

    def freeze(self) -> tuple[StageError, ...]:
        """The errors collected so far."""
        return tuple(self._errors)


class StageRefusal(Exception):
    """A stage that finished its output and refuses the request all the same.

    The runner keeps ``output`` in the request's state (so the audit record shows what the
    stage did), then fails the request with ``error``.
    """

    def __init__(self, error: BaseException, output: Any) -> None:
        super().__init__(str(error))
        self.error = error
        self.output = output


@dataclass(frozen=True)
class RunVersions:
    """Which prompt, model and tracerag produced an answer, and how each version was obtained.

    ``prompt_source``: ``argument``, ``template`` (the app's prompt templates), ``run-template``
    (templates its runs formatted) or ``model-input`` (a fingerprint of what reached the model);
    ``model_source``: ``argument``, ``app`` or ``run`` (see ``tracerag.wrap``).
    """

    prompt: str | None = None
    model: str | None = None
    tracerag: str = ""
    prompt_source: str | None = None
    model_source: str | None = None


def _sampling(r: Registration) -> str:
    """The sampling parameters as OpenInference's invocation parameters (JSON)."""
    params = {"n_samples": r.n_samples, "temperature": r.temperature, "plan_mode": r.plan_mode}
    return json.dumps({**params, "k": r.k}, default=str)


@dataclass(frozen=True)
class Registration:
    """Stage 1: the request's id, tier, versions and sampling parameters.

    ``versions_from_runs`` names the versions (``prompt``, ``model``) neither given nor found
    in a wrapped app: the sample stage learns them from the app's runs, or refuses the request.
    """

    request_id: str
    tier: Tier
    versions: RunVersions
    n_samples: int
    temperature: float
    plan_mode: PlanMode
    k: int | None = None
    versions_from_runs: tuple[str, ...] = ()

    SIGNALS: ClassVar[tuple[Signal, ...]] = (
        Signal(lambda r: r.request_id, span=semconv.REQUEST_ID),
        Signal(
            lambda r: r.tier,
            span=semconv.TIER,
            stream="tier",
            record="tier",
            metric="tier",
            root=semconv.TIER,
            meta="tier",
        ),
        Signal(
            lambda r: r.n_samples,
            span=semconv.N_SAMPLES,
            stream="n_samples",
            record="params.n_samples",
        ),
        # the registered versions (the root span and the record show those the runs taught too)
        Signal(
            lambda r: r.versions.prompt,
            span=semconv.VERSION_PROMPT,
            when=bool,
            stream="prompt_version",
            metric="prompt_version",
        ),
        Signal(
            lambda r: r.versions.model,
            span=semconv.VERSION_MODEL,
            when=bool,
            stream="model_version",
            metric="model_version",
        ),
        # how each registered version was obtained
        Signal(
            lambda r: (r.versions.prompt_source or "argument") if r.versions.prompt else None,
            span=semconv.VERSION_PROMPT_SOURCE,
        ),
        Signal(
            lambda r: (r.versions.model_source or "argument") if r.versions.model else None,
            span=semconv.VERSION_MODEL_SOURCE,
        ),
        Signal(lambda r: r.versions.tracerag, span=semconv.VERSION_TRACERAG),
        Signal(
            lambda r: r.temperature,
            span=semconv.TEMPERATURE,
            span_as=float,
            record="params.temperature",
        ),
        Signal(lambda r: r.plan_mode, span=semconv.PLAN_MODE, record="params.plan_mode"),
        Signal(lambda r: r.k, record="params.k"),
        Signal(
            lambda r: list(r.versions_from_runs) or OMIT,
            span=semconv.VERSION_FROM_RUNS,
            record="params.versions_from_runs",
        ),
        Signal(_sampling, span=semconv.OI_LLM_INVOCATION_PARAMETERS),
    )

    @property
    def params(self) -> dict[str, Any]:
        """The sampling parameters as the audit record keeps them."""
        params: dict[str, Any] = record_of(self).get("params", {})
        return params


def _documents(r: Retrieval) -> dict[str, Any]:
    """The materials as OpenInference retrieval documents (their text under the capture policy)."""
    attrs: dict[str, Any] = {}
    for i, m in enumerate(r.materials):
        attrs[semconv.oi_document(i, "id")] = m.id
        content = capture(m.text)
        if content is not None:
            attrs[semconv.oi_document(i, "content")] = content
        if m.score is not None:
            attrs[semconv.oi_document(i, "score")] = float(m.score)
        attrs[semconv.oi_document(i, "metadata")] = json.dumps(
            {"title": m.title, "source": m.source, "rank": m.rank},
            ensure_ascii=False,
            default=str,
        )
    return attrs


def _retrieved_count(s: RequestState) -> int:
    # an app that retrieves only inside its runs (source "runs") has its runs' materials
    # counted as its retrieval
    r = s.retrieval
    assert r is not None
    return len(s.materials if r.source == "runs" else r.materials)


def _added_from_runs(s: RequestState) -> Any:
    added = s.samples.extra_materials if s.samples is not None else ()
    return [m.id for m in added] if added else OMIT


@dataclass(frozen=True)
class Retrieval:
    """Stage 2: the retrieved materials in rank order, and what their scores say.

    ``source`` (``wrap()`` only) says where the materials come from: ``retriever`` (called in
    this stage) or ``runs`` (the app retrieves only inside its runs; the sample stage adds them).
    """

    materials: tuple[Material, ...] = ()
    scored: bool = False
    top_score: float | None = None
    score_margin: float | None = None
    note: str | None = None
    errors: tuple[StageError, ...] = ()
    #: the score shape (``tracerag.signals._attribution``): clear, moderate, clustered, single…
    shape: str | None = None
    relative_margin: float | None = None
    near_top: tuple[str, ...] = ()
    source: str | None = None
    #: the full score-shape explanation the fields above come from (for attribution)
    explanation: RetrievalExplanation | None = field(default=None, compare=False, repr=False)

    SIGNALS: ClassVar[tuple[Signal, ...]] = (
        Signal(lambda r: len(r.materials), span=semconv.RETRIEVAL_COUNT, stream="count"),
        Signal(_retrieved_count, across=True, record="retrieval.count"),
        Signal(
            lambda r: [m.id for m in r.materials],
            span=semconv.RETRIEVAL_MATERIAL_IDS,
            stream="material_ids",
        ),
        Signal(lambda r: r.scored, span=semconv.RETRIEVAL_SCORED, record="retrieval.scored"),
        Signal(
            lambda r: r.top_score,
            span=semconv.RETRIEVAL_TOP_SCORE,
            span_as=float,
            stream="top_score",
            record="retrieval.top_score",
        ),
        Signal(
            lambda r: r.score_margin,
            span=semconv.RETRIEVAL_SCORE_MARGIN,
            span_as=float,
            stream="score_margin",
            record="retrieval.score_margin",
        ),
        Signal(lambda r: r.note, record="retrieval.note"),
        Signal(lambda r: r.shape, span=semconv.RETRIEVAL_SHAPE, record="retrieval.shape"),
        Signal(
            lambda r: r.relative_margin,
            span=semconv.RETRIEVAL_RELATIVE_MARGIN,
            record="retrieval.relative_margin",
        ),
        Signal(lambda r: r.near_top, record="retrieval.near_top"),
        Signal(
            lambda r: list(r.near_top) if r.shape is not None else None,
            span=semconv.RETRIEVAL_NEAR_TOP,
        ),
        Signal(lambda r: r.source, span=semconv.RETRIEVAL_SOURCE),
        Signal(
            lambda s: s.retrieval_source if s.retrieval.source is not None else OMIT,
            across=True,
            record="retrieval.source",
        ),
        Signal(_added_from_runs, across=True, record="retrieval.added_from_runs"),
        Signal(_documents, span=EACH),
    )

    @classmethod
    def of(
        cls,
        materials: tuple[Material, ...],
        *,
        note: str | None = None,
        errors: tuple[StageError, ...] = (),
        shape: ShapeThresholds | None = None,
        source: str | None = None,
    ) -> Retrieval:
        """A Retrieval with its score signals and score shape computed from the materials."""
        explained = explain_retrieval(
            [(m.id, m.score) for m in materials], shape or ShapeThresholds()
        )
        scores = [m.score for m in materials if m.score is not None]
        scored = bool(materials) and len(scores) == len(materials)
        ordered = sorted(scores, reverse=True)
        margin = round(ordered[0] - ordered[1], 6) if scored and len(ordered) > 1 else None
        if note is None and not scored:
            note = "retriever gives no relevance scores"
        return cls(
            materials=materials,
            scored=scored,
            top_score=ordered[0] if scored else None,
            score_margin=margin,
            note=note,
            errors=tuple(errors),
            shape=explained.shape,
            relative_margin=explained.relative_margin,
            near_top=tuple(explained.near_top),
            source=source,
            explanation=explained,
        )


@dataclass(frozen=True)
class PlanResult:
    """Stage 3: the plan (asked of the model, or agreed among the samples' own).

    ``source``: ``model`` (one plan call), else the mode of the samples' plans (``inline``,
    ``wrap``).
    """

    plan: Plan
    errors: tuple[StageError, ...] = ()
    source: str = "model"

    SIGNALS: ClassVar[tuple[Signal, ...]] = (
        Signal(
            lambda r: list(r.plan.material_ids),
            span=semconv.PLAN_MATERIAL_IDS,
            stream="material_ids",
        ),
        Signal(lambda r: r.plan.ok, span=semconv.PLAN_OK, stream="ok"),
        Signal(lambda r: r.plan.attempts, span=semconv.PLAN_ATTEMPTS, stream="attempts"),
        Signal(lambda r: r.plan.mode, stream="mode"),
        Signal(lambda r: r.source, span=semconv.PLAN_SOURCE),
        Signal(lambda r: list(r.plan.key_facts), span=semconv.PLAN_KEY_FACTS),
        Signal(lambda r: r.plan.agreement, span=semconv.PLAN_AGREEMENT),
        Signal(lambda r: r.plan.error, span=semconv.PLAN_ERROR, when=bool),
        Signal(lambda r: r.plan, record="plan"),
    )


@dataclass(frozen=True)
class Sample:
    """One sampled answer; ``answer`` is the text after any inline plan has been split off."""

    index: int
    raw: str | None = None
    answer: str | None = None
    plan: Plan | None = None
    error: str | None = None
    attempts: int = 0
    latency_s: float = 0.0
    input_tokens: int | None = None
    output_tokens: int | None = None
    # the retrieved order this sample saw, for ``[1]``-style positional citations (wrap mode)
    material_order: tuple[str, ...] = ()

    @property
    def ok(self) -> bool:
        return self.error is None and bool(self.answer and self.answer.strip())


def _sampled_at(s: SampleSet) -> float | None:
    t = s.temperature
    return t if t is not None and t >= 0 else None


@dataclass(frozen=True)
class SampleSet:
    """Stage 4: the samples, the temperature they were drawn at, and what sampling learned.

    ``temperature`` is the one the samples were drawn at as far as tracerag knows (None: the
    model has none tracerag can set or see). ``temperature_zero``: the request asked for
    temperature 0 (its samples cannot disagree). ``extra_materials`` are documents the samples'
    own runs retrieved that the retrieve stage did not (wrap mode): they may be cited, so they
    join the materials after retrieval's. ``positional`` allows ``[2]``-style citations by
    position in a sample's retrieved order. ``versions`` are the versions the runs showed, for
    those the registration lacked (``Registration.versions_from_runs``). ``kept`` is the sample
    whose answer the app itself keeps (a wrapped graph's own run, whose answer is in the
    caller's thread): when set, it is the answer verified and returned, the other samples tell
    how far they agree with it. ``sampling`` and ``runs`` (wrap mode) say how the samples were
    drawn: ``answer`` or ``app``, and per sample ``app`` (the app's own run), ``fork`` or
    ``private``.
    """

    samples: tuple[Sample, ...] = ()
    temperature: float | None = None
    temperature_zero: bool = False
    positional: bool = False
    extra_materials: tuple[Material, ...] = ()
    versions: RunVersions | None = None
    warnings: tuple[str, ...] = ()
    errors: tuple[StageError, ...] = ()
    kept: int | None = None
    sampling: str | None = None
    runs: tuple[str, ...] = ()
    #: adaptive sampling (``tracerag._adaptive``): the most that could be drawn (0: not
    #: recorded), the rounds drawn, why sampling stopped, the posterior probability that the
    #: samples not drawn would have changed the route, and the model calls the samples took
    max_samples: int = 0
    rounds: int = 0
    stop_reason: str | None = None
    stop_risk: float | None = None
    calls: int | None = None
    min_samples: int = 0
    risk_bound: float | None = None
    #: the citation reports the stopping rule already made, by sample index (the verify stage
    #: reuses them when the materials are the ones they were made against)
    verified: Mapping[int, Any] = field(default_factory=dict, compare=False, repr=False)

    SIGNALS: ClassVar[tuple[Signal, ...]] = (
        Signal(lambda s: s.n_ok, span=semconv.SAMPLES_OK, stream="samples_ok"),
        Signal(lambda s: len(s.samples) if s.max_samples else None, span=semconv.SAMPLES_DRAWN),
        Signal(lambda s: s.max_samples or None, span=semconv.SAMPLES_MAX),
        Signal(lambda s: s.rounds or None, span=semconv.SAMPLES_ROUNDS),
        Signal(lambda s: s.stop_reason, span=semconv.SAMPLES_STOP, stream="sampling_stop"),
        Signal(lambda s: s.stop_risk, span=semconv.SAMPLES_STOP_RISK),
        Signal(lambda s: s.calls, span=semconv.SAMPLES_CALLS),
        Signal(
            lambda s: (
                {
                    "min_samples": s.min_samples,
                    "max": s.max_samples,
                    "risk_bound": s.risk_bound,
                    "drawn": len(s.samples),
                    "rounds": s.rounds,
                    "stop_reason": s.stop_reason,
                    "stop_risk": s.stop_risk,
                    "calls": s.calls,
                }
                if s.max_samples
                else OMIT
            ),
            record="params.adaptive",
        ),
        Signal(lambda s: s.stop_reason, metric="stop_reason"),
        Signal(
            lambda s: len(s.samples) - s.n_ok,
            span=semconv.SAMPLES_FAILED,
            stream="samples_failed",
        ),
        Signal(lambda s: s.drawn_at_zero, span=semconv.TEMPERATURE_ZERO),
        Signal(_sampled_at, span=semconv.TEMPERATURE, span_as=float),
        Signal(lambda s: True if s.positional else OMIT, record="params.positional"),
        Signal(
            lambda s: s.temperature if s.temperature is not None else OMIT,
            record="params.temperature",
        ),
        Signal(lambda s: True if s.temperature_zero else OMIT, record="params.temperature_zero"),
        Signal(lambda s: s.sampling if s.sampling is not None else OMIT, record="params.sampling"),
        Signal(lambda s: list(s.runs) if s.sampling is not None else OMIT, record="params.runs"),
        Signal(lambda s: s.kept if s.kept is not None else OMIT, record="params.kept_sample"),
        Signal(lambda s: s.samples, record="samples"),
        Signal(lambda s: s.warnings, record="warnings"),
        Signal(lambda s: len(s.samples), metric="n_samples", absent=0),
    )

    @property
    def ok(self) -> tuple[Sample, ...]:
        """The samples that gave an answer."""
        return tuple([s for s in self.samples if s.ok])

    @property
    def n_ok(self) -> int:
        """How many samples gave an answer."""
        return len([s for s in self.samples if s.ok])

    @property
    def drawn_at_zero(self) -> bool:
        """Several samples drawn at temperature 0: they cannot disagree (a warning)."""
        return self.temperature == 0.0 and len(self.samples) > 1


@dataclass(frozen=True)
class Selection:
    """Which sample answers, and how many samples agree with it."""

    sample_index: int | None
    group: list[int]
    share: float
    reason: str


def _by_sample(v: Verification) -> dict[str, Any]:
    return {
        str(i): {
            "valid": r.valid,
            "score": r.score,
            "coverage": r.coverage,
            "accuracy": r.accuracy,
            "fabricated": list(r.fabricated),
        }
        for i, r in v.by_sample.items()
    }


def _claims(v: Verification) -> list[dict[str, Any]]:
    return [
        {
            "verdict": c.verdict,
            "cited_ids": c.cited_ids,
            "material_id": c.material_id,
            "score": c.score,
        }
        for c in v.citations.claims
    ]


def _answers_question(v: Verification) -> Any:
    """Whether the answer addresses the question (None: not judged); left out where the
    check is off."""
    return v.relevance.addresses if v.relevance is not None else OMIT


def _relevance(v: Verification) -> Any:
    return v.relevance.to_record() if v.relevance is not None else OMIT


@dataclass(frozen=True)
class Verification:
    """Stage 5: the chosen answer's citation report, consistency, selection and rules."""

    citations: CitationReport
    by_sample: Mapping[int, CitationReport]
    consistency: ConsistencyReport
    selection: Selection
    rules: tuple[RuleResult, ...] = ()
    errors: tuple[StageError, ...] = ()
    #: whether the chosen answer addresses the question (None: the check is off)
    relevance: RelevanceReport | None = None

    SIGNALS: ClassVar[tuple[Signal, ...]] = (
        Signal(
            lambda v: v.citations.valid,
            span=semconv.SIGNAL_CITATION_VALID,
            stream="citation_valid",
            io="citation_valid",
        ),
        Signal(
            lambda v: v.citations.score,
            span=semconv.SIGNAL_CITATION_SCORE,
            stream="citation_score",
            io="citation_score",
        ),
        Signal(
            lambda v: v.citations.coverage,
            span=semconv.SIGNAL_CITATION_COVERAGE,
            stream="citation_coverage",
            metric="citation_coverage",
        ),
        Signal(
            lambda v: v.citations.accuracy,
            span=semconv.SIGNAL_CITATION_ACCURACY,
            stream="citation_accuracy",
            metric="citation_accuracy",
        ),
        Signal(
            lambda v: v.citations.fabricated,
            span=semconv.SIGNAL_FABRICATED,
            stream="fabricated_citations",
            metric="fabricated",
            io="fabricated",
        ),
        Signal(
            lambda v: v.citations.stale,
            span=semconv.SIGNAL_STALE,
            stream="stale_citations",
            io="stale",
        ),
        Signal(_claims, io="claims"),
        Signal(
            lambda v: v.selection.share,
            span=semconv.SIGNAL_CONSISTENCY,
            stream="self_consistency",
            io="self_consistency",
        ),
        Signal(
            lambda v: v.consistency.n_groups,
            span=semconv.SIGNAL_CONSISTENCY_GROUPS,
            stream="consistency_groups",
        ),
        Signal(lambda v: v.consistency.groups, io="groups"),
        Signal(lambda v: v.consistency.entropy, span=semconv.SIGNAL_SEMANTIC_ENTROPY),
        Signal(lambda v: v.consistency.informative, span=semconv.SIGNAL_CONSISTENCY_INFORMATIVE),
        Signal(lambda v: all(r.passed for r in v.rules), span=semconv.SIGNAL_RULE_CHECK),
        Signal(
            lambda v: [r.name for r in v.rules if not r.passed], span=semconv.SIGNAL_RULES_FAILED
        ),
        Signal(lambda v: [{"name": r.name, "passed": r.passed} for r in v.rules], io="rules"),
        Signal(lambda v: v.selection.sample_index, span=semconv.CHOSEN_SAMPLE),
        Signal(lambda v: v.citations, record="signals.citations"),
        Signal(_by_sample, record="signals.citations_by_sample", is_json=True),
        Signal(lambda v: v.consistency, record="signals.consistency"),
        Signal(lambda v: v.selection, record="signals.selection"),
        Signal(lambda v: v.rules, record="signals.rules"),
        Signal(
            _answers_question,
            span=semconv.SIGNAL_ANSWER_RELEVANT,
            stream="answers_question",
            io="answer_relevance",
        ),
        Signal(_relevance, record="signals.relevance", is_json=True),
    )

    def to_record(self) -> dict[str, Any]:
        """The signals as the audit record keeps them."""
        signals: dict[str, Any] = record_of(self)["signals"]
        return signals
