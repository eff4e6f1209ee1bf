"""The state of one request: its input and the typed, immutable output of each stage.

Each stage reads the ``RequestState`` built so far and returns its own output (``Registration``,
``Retrieval``, ``Plan``, ``SampleSet``, ``Verification``, ``Decision``); the runner puts that
output into a new state. No stage changes what an earlier stage produced. ``to_record()`` turns
a state into the JSON-able audit record (see ``tracerag.record`` for its typed reader).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from dataclasses import dataclass, field
from datetime import date, datetime
from types import MappingProxyType
from typing import TYPE_CHECKING, Any

from tracerag.errors import InputError
from tracerag.signals.attribution import (
    RetrievalExplanation,
    ShapeThresholds,
    explain_retrieval,
)
from tracerag.signals.types import Material, Plan, utcnow
from tracerag.text.unicode import first_lone_surrogate, fix_surrogates, is_invisible

if TYPE_CHECKING:
    from tracerag.contract import ClaimCheck, Evidence, MaterialUse, Response, SignalDetail
    from tracerag.contract import Versions as ResponseVersions
    from tracerag.routing import Ticket
    from tracerag.signals.citations import CitationReport
    from tracerag.signals.consistency import ConsistencyReport
    from tracerag.signals.relevance import RelevanceReport
    from tracerag.signals.rules import RuleResult

__all__ = [
    "INPUT_KEYS",
    "RECORD_VERSION",
    "Decision",
    "ErrorLog",
    "PlanResult",
    "Registration",
    "RequestInput",
    "RequestState",
    "Retrieval",
    "RunVersions",
    "Sample",
    "SampleSet",
    "Selection",
    "StageError",
    "StageRefusal",
    "Verification",
]

#: The layout version of the audit record ``RequestState.to_record()`` writes.
RECORD_VERSION = 2

INPUT_KEYS = frozenset({"question", "session_id", "user_id", "channel", "request_id"})



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
            "stage": self.stage,
            "type": self.type,
            "message": self.message,
            **_jsonable(dict(self.extra)),
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
class RequestInput:
    """What the caller asked, checked: a non-empty question and optional ids.

    ``app_input`` (``wrap()`` only) is the caller's input as the wrapped app takes it, passed
    to the app unchanged; None when the app's input is made from the question.
    """

    question: str
    session_id: str | None = None
    user_id: str | None = None
    channel: str | None = None
    request_id: str | None = None
    started_at: datetime = field(default_factory=utcnow)
    app_input: Any = field(default=None, compare=False, repr=False)

    @classmethod
    def parse(cls, value: Any, *, max_chars: int = 8000) -> RequestInput:
        """A RequestInput from a question string or a dict; InputError on anything else.

        Refused: a question that is empty or shows nothing (only whitespace, zero-width or other
        invisible characters), longer than ``max_chars``, or any field that is not valid Unicode
        (a lone UTF-16 surrogate such as ``"\\ud800"``). Surrogate pairs are joined into the
        character they encode.
        """
        if isinstance(value, RequestInput):
            data: dict[str, Any] = {
                k: getattr(value, k) for k in ("question", *sorted(INPUT_KEYS - {"question"}))
            }
        elif isinstance(value, str):
            data = {"question": value}
        elif isinstance(value, dict):
            unknown = set(value) - INPUT_KEYS
            if unknown:
                raise InputError(
                    f"unknown input field(s) {sorted(unknown)}; accepted: {sorted(INPUT_KEYS)}"
                )
            data = dict(value)
        else:
            raise InputError(
                "input must be a question string or a dict with 'question', "
                f"got {type(value).__name__}"
            )
        question = data.get("question")
        if not isinstance(question, str) or not question.strip():
            raise InputError("the question must be a non-empty string")
        if len(question) > max_chars:
            raise InputError(
                f"the question is {len(question)} characters; the limit is {max_chars}"
            )
        for key in ("question", "session_id", "user_id", "channel", "request_id"):
            field_value = data.get(key)
            if field_value is None:
                continue
            if not isinstance(field_value, str):
                raise InputError(f"{key} must be a string")
            lone = first_lone_surrogate(field_value)
            if lone is not None:
                raise InputError(
                    f"{key} is not valid Unicode: a lone UTF-16 surrogate at character {lone}"
                )
            data[key] = fix_surrogates(field_value)
        question = data["question"]
        if is_invisible(question):
            raise InputError("the question shows no visible character")
        return cls(
            question=question.strip(),
            session_id=data.get("session_id"),
            user_id=data.get("user_id"),
            channel=data.get("channel"),
            request_id=data.get("request_id") or None,
        )


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


@dataclass(frozen=True)
class Registration:
    """Stage 1: the request's id, tier, versions and sampling parameters.

    ``versions_from_runs`` names the versions (``prompt``, ``model``) neither given nor found
    in a wrapped app: the sample stage learns them from the app's runs, or refuses the request.
    """

    request_id: str
    tier: str
    versions: RunVersions
    n_samples: int
    temperature: float
    plan_mode: str
    k: int | None = None
    versions_from_runs: tuple[str, ...] = ()

    @property
    def params(self) -> dict[str, Any]:
        """The sampling parameters as the audit record keeps them."""
        params: dict[str, Any] = {
            "n_samples": self.n_samples,
            "temperature": self.temperature,
            "plan_mode": self.plan_mode,
            "k": self.k,
        }
        if self.versions_from_runs:
            params["versions_from_runs"] = list(self.versions_from_runs)
        return params


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
    #: the score shape (``tracerag.signals.attribution``): clear, moderate, clustered, single…
    shape: str | None = None
    relative_margin: float | None = None
    near_top: tuple[str, ...] = ()
    source: str | None = None
    #: the full score-shape explanation the fields above come from (for attribution)
    explanation: RetrievalExplanation | None = field(default=None, compare=False, repr=False)

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
    """Stage 3: the plan (asked of the model, or agreed among the samples' own)."""

    plan: Plan
    errors: tuple[StageError, ...] = ()


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


@dataclass(frozen=True)
class SampleSet:
    """Stage 4: the samples, the temperature they were drawn at, and what sampling learned.

    ``extra_materials`` are documents the samples' own runs retrieved that the retrieve stage
    did not (wrap mode): they may be cited, so they join the materials after retrieval's.
    ``positional`` allows ``[2]``-style citations by position in a sample's retrieved order.
    ``versions`` are the versions the runs showed, for those the registration lacked
    (``Registration.versions_from_runs``). ``kept`` is the sample whose answer the app itself
    keeps (a wrapped graph's own run, whose answer is in the caller's thread): when set, it is
    the answer verified and returned, the other samples tell how far they agree with it.
    ``sampling`` and ``runs`` (wrap mode) say how the samples were drawn: ``answer`` or ``app``,
    and per sample ``app`` (the app's own run), ``fork`` or ``private``.
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

    @property
    def ok(self) -> tuple[Sample, ...]:
        """The samples that gave an answer."""
        return tuple(s for s in self.samples if s.ok)


@dataclass(frozen=True)
class Selection:
    """Which sample answers, and how many samples agree with it."""

    sample_index: int | None
    group: list[int]
    share: float
    reason: str


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

    def to_record(self) -> dict[str, Any]:
        """The signals as the audit record keeps them."""
        relevance = {"relevance": self.relevance.to_record()} if self.relevance else {}
        return {
            "citations": _jsonable(self.citations),
            "citations_by_sample": {
                str(i): {
                    "valid": r.valid,
                    "score": r.score,
                    "coverage": r.coverage,
                    "accuracy": r.accuracy,
                    "fabricated": list(r.fabricated),
                }
                for i, r in self.by_sample.items()
            },
            "consistency": _jsonable(self.consistency),
            "selection": _jsonable(self.selection),
            "rules": _jsonable(list(self.rules)),
            **relevance,
        }


@dataclass(frozen=True)
class Decision:
    """Stage 6: the confidence, the route and everything the Response will say."""

    decision: str
    status: str
    tier: str
    confidence: float | None
    answer: str | None
    signal_detail: SignalDetail
    evidence: tuple[Evidence, ...]
    claims: tuple[ClaimCheck, ...]
    versions: ResponseVersions
    ticket_id: str | None = None
    calibration: str | None = None
    warnings: tuple[str, ...] = ()
    errors: tuple[StageError, ...] = ()
    #: the compact per-material summary the Response carries (no material text)
    materials: tuple[MaterialUse, ...] = ()
    #: tiers 1 and 2 of attribution, as the audit record keeps them (``signals.attribution``)
    attribution: Mapping[str, Any] | None = None
    #: the ticket for people (escalate, review), handed on once the record's fate is known
    ticket: Ticket | None = None

    def _fields(self, request_id: str, trace_id: str | None) -> dict[str, Any]:
        return {
            "request_id": request_id,
            "trace_id": trace_id,
            "answer": self.answer,
            "confidence": self.confidence,
            "decision": self.decision,
            "status": self.status,
            "tier": self.tier,
            "signal_detail": self.signal_detail,
            "evidence": list(self.evidence),
            "claims": list(self.claims),
            "versions": self.versions,
            "ticket_id": self.ticket_id,
            "calibration": self.calibration,
            "warnings": list(self.warnings),
            "materials": list(self.materials),
        }

    def response(
        self, request_id: str, trace_id: str | None, audit_persisted: bool | None
    ) -> Response:
        """The Response, validated (its one construction)."""
        from tracerag.contract import Response

        return Response(
            **self._fields(request_id, trace_id), audit_persisted=audit_persisted
        )

    def response_record(self, request_id: str, trace_id: str | None) -> dict[str, Any]:
        """The Response as the audit record keeps it, before the record is persisted."""
        from tracerag.contract import Response

        draft = Response.model_construct(**self._fields(request_id, trace_id))
        return draft.model_dump(mode="json")


_SLOTS = {
    "register": "registration",
    "retrieve": "retrieval",
    "plan": "planning",
    "sample": "samples",
    "verify": "verification",
    "assemble": "decision",
}


@dataclass(frozen=True)
class RequestState:
    """Everything known about one request so far, in the order the stages learn it."""

    input: RequestInput
    trace_id: str | None = None
    registration: Registration | None = None
    retrieval: Retrieval | None = None
    planning: PlanResult | None = None
    samples: SampleSet | None = None
    verification: Verification | None = None
    decision: Decision | None = None
    errors: tuple[StageError, ...] = ()
    skipped: tuple[str, ...] = ()
    timings: Mapping[str, float] = field(default_factory=dict)

    @staticmethod
    def slot(stage: str) -> str:
        """The field a stage's output fills."""
        return _SLOTS[stage]

    def _evolve(self, **changes: Any) -> RequestState:
        # a copy with some fields changed: what dataclasses.replace does, without re-running
        # __init__ (the runner makes one per stage, on every request)
        new = object.__new__(RequestState)
        new.__dict__.update(self.__dict__)
        new.__dict__.update(changes)
        return new

    def with_output(
        self, stage: str, output: Any, seconds: float | None = None
    ) -> RequestState:
        """A new state holding a stage's output, the errors it collected and its time."""
        errors = getattr(output, "errors", ()) if output is not None else ()
        changes: dict[str, Any] = {_SLOTS[stage]: output}
        if errors:
            changes["errors"] = self.errors + tuple(errors)
        if seconds is not None:
            changes["timings"] = MappingProxyType({**self.timings, stage: round(seconds, 6)})
        return self._evolve(**changes)

    def with_error(self, stage: str, error: BaseException, **extra: Any) -> RequestState:
        """A new state with one more error kept."""
        log = ErrorLog()
        log.record_error(stage, error, **extra)
        return self._evolve(errors=self.errors + log.freeze())

    def with_timing(self, name: str, seconds: float) -> RequestState:
        """A new state with the time spent in a stage (or ``request``)."""
        return self._evolve(timings=MappingProxyType({**self.timings, name: round(seconds, 6)}))

    def with_skipped(self, stage: str) -> RequestState:
        """A new state that records a stage its tier skips."""
        return self._evolve(skipped=(*self.skipped, stage))

    @property
    def request_id(self) -> str:
        if self.registration is not None:
            return self.registration.request_id
        return self.input.request_id or ""

    @property
    def plan(self) -> Plan | None:
        return self.planning.plan if self.planning is not None else None

    @property
    def question(self) -> str:
        return self.input.question

    @property
    def versions(self) -> RunVersions:
        """The registered versions, with those the samples' runs showed where it had none."""
        registered = self.registration.versions if self.registration is not None else RunVersions()
        learned = self.samples.versions if self.samples is not None else None
        if learned is None:
            return registered
        return RunVersions(
            prompt=registered.prompt or learned.prompt,
            model=registered.model or learned.model,
            tracerag=registered.tracerag,
            prompt_source=registered.prompt_source if registered.prompt else learned.prompt_source,
            model_source=registered.model_source if registered.model else learned.model_source,
        )

    @property
    def retrieval_source(self) -> str | None:
        """Where the materials come from (wrap mode): ``retriever``, ``runs``, or
        ``retriever+runs`` when the runs retrieved documents the retriever did not."""
        source = self.retrieval.source if self.retrieval is not None else None
        added = self.samples is not None and bool(self.samples.extra_materials)
        if source == "retriever" and added:
            return "retriever+runs"
        return source

    @property
    def materials(self) -> tuple[Material, ...]:
        """Every material the answer may cite: retrieval's, then any the samples' runs added."""
        retrieved = self.retrieval.materials if self.retrieval is not None else ()
        if self.samples is not None and self.samples.extra_materials:
            return retrieved + self.samples.extra_materials
        return retrieved

    def material(self, material_id: str) -> Material | None:
        """The material with this id, or None if it was not retrieved."""
        return next((m for m in self.materials if m.id == material_id), None)

    @property
    def warnings(self) -> tuple[str, ...]:
        return self.samples.warnings if self.samples is not None else ()

    def to_record(self, response: Mapping[str, Any] | None = None) -> dict[str, Any]:
        """The JSON-able audit record of this request (layout ``RECORD_VERSION``).

        ``response`` is the Response as recorded; by default the one the decision describes.
        """
        reg = self.registration
        params: dict[str, Any] = reg.params if reg is not None else {}
        samples = self.samples
        if samples is not None:
            if samples.positional:
                params["positional"] = True
            if samples.temperature is not None:
                params["temperature"] = samples.temperature
            if samples.temperature_zero:
                params["temperature_zero"] = True
            if samples.sampling is not None:
                params["sampling"] = samples.sampling
                params["runs"] = list(samples.runs)
            if samples.kept is not None:
                params["kept_sample"] = samples.kept
        retrieval: dict[str, Any] = {}
        if self.retrieval is not None:
            r = self.retrieval
            # the retrieve stage's own count; an app that retrieves only inside its runs
            # (source "runs") has its runs' materials counted as its retrieval
            counted = self.materials if r.source == "runs" else r.materials
            retrieval = {
                "count": len(counted),
                "scored": r.scored,
                "top_score": r.top_score,
                "score_margin": r.score_margin,
                "note": r.note,
                "shape": r.shape,
                "relative_margin": r.relative_margin,
                "near_top": list(r.near_top),
            }
            if r.source is not None:
                retrieval["source"] = self.retrieval_source
            if samples is not None and samples.extra_materials:
                retrieval["added_from_runs"] = [m.id for m in samples.extra_materials]
        decision = self.decision
        if response is None and decision is not None:
            response = decision.response_record(self.request_id, self.trace_id)
        versions = self.versions
        return {
            "record_version": RECORD_VERSION,
            "request_id": self.request_id,
            "trace_id": self.trace_id,
            "question": self.input.question,
            "session_id": self.input.session_id,
            "user_id": self.input.user_id,
            "channel": self.input.channel,
            "tier": reg.tier if reg is not None else None,
            "versions": _jsonable(versions),
            "params": _jsonable(params),
            "started_at": self.input.started_at.isoformat(),
            "materials": _jsonable(list(self.materials)),
            "retrieval": retrieval,
            "plan": _jsonable(self.plan),
            "samples": _jsonable(list(samples.samples) if samples is not None else []),
            "signals": self._signals_record(),
            "confidence": decision.confidence if decision is not None else None,
            "decision": decision.decision if decision is not None else None,
            "response": dict(response) if response is not None else None,
            "errors": [e.to_dict() for e in self.errors],
            "skipped": list(self.skipped),
            "calibration": decision.calibration if decision is not None else None,
            "timings": dict(self.timings),
            "warnings": list(self.warnings),
        }

    def _signals_record(self) -> dict[str, Any]:
        signals = self.verification.to_record() if self.verification is not None else {}
        if self.decision is not None and self.decision.attribution is not None:
            signals["attribution"] = _jsonable(self.decision.attribution)
        return signals


def _jsonable(value: Any) -> Any:
    """Convert dataclasses, pydantic models, datetimes and containers to JSON-able values."""
    cls = type(value)
    kind = _KINDS.get(cls)
    if kind is None:
        kind = _KINDS[cls] = _kind_of(cls)
    if kind == _PLAIN:
        return value
    # most members are strings and numbers: those are kept without a call per member
    if kind == _DATACLASS:
        out: dict[str, Any] = {}
        for name in _FIELD_NAMES[cls]:
            member = getattr(value, name)
            out[name] = member if type(member) in _LEAVES else _jsonable(member)
        return out
    if kind == _SEQUENCE:
        return [v if type(v) in _LEAVES else _jsonable(v) for v in value]
    if kind == _MAPPING:
        return {str(k): v if type(v) in _LEAVES else _jsonable(v) for k, v in value.items()}
    if kind == _TIME:
        return value.isoformat()
    if kind == _MODEL:
        return value.model_dump(mode="json")
    return str(value)


_PLAIN, _TIME, _DATACLASS, _MODEL, _MAPPING, _SEQUENCE, _OTHER = range(7)
_LEAVES = frozenset({str, int, float, bool, type(None)})  # kept as they are (``_PLAIN``)
_KINDS: dict[type, int] = {}
_FIELD_NAMES: dict[type, tuple[str, ...]] = {}


def _kind_of(cls: type) -> int:
    """How ``_jsonable`` converts values of this type (decided once per type)."""
    if cls is type(None) or issubclass(cls, (str, int, float, bool)):
        return _PLAIN
    if issubclass(cls, (datetime, date)):
        return _TIME
    if dataclasses.is_dataclass(cls):
        _FIELD_NAMES[cls] = tuple(f.name for f in dataclasses.fields(cls))
        return _DATACLASS
    if hasattr(cls, "model_dump"):
        return _MODEL
    if issubclass(cls, Mapping):
        return _MAPPING
    if issubclass(cls, (list, tuple, set, frozenset)):
        return _SEQUENCE
    return _OTHER
