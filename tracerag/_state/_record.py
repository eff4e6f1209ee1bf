"""The whole request's state (``RequestState``) and its audit record: the layout
(``RECORD_LAYOUT``, ``RECORD_VERSION``), ``to_record()`` and the compiled projection tables.

``to_record()``, ``root_attributes()``, ``root_metadata()`` and ``outcome_fields()`` are derived
from each part's ``SIGNALS`` table; the record's top-level keys come in the layout's order.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from types import MappingProxyType
from typing import TYPE_CHECKING, Any, ClassVar

from tracerag import _semconv as semconv
from tracerag._choices import Stage
from tracerag._declare import (
    LEAVES,
    OMIT,
    Compiled,
    Declared,
    Signal,
    attributes,
    compiled,
    jsonable,
)
from tracerag.signals._types import Material, Plan

if TYPE_CHECKING:
    pass
from tracerag._state._fill import fill_record
from tracerag._state._input import RequestInput
from tracerag._state._outputs import (
    ErrorLog,
    PlanResult,
    Registration,
    Retrieval,
    RunVersions,
    SampleSet,
    StageError,
    Verification,
)
from tracerag._state._response import Decision, _meta_versions

__all__ = [
    "META_LAYOUT",
    "RECORD_LAYOUT",
    "RECORD_VERSION",
    "RequestState",
]

#: The layout version of the audit record ``RequestState.to_record()`` writes.
RECORD_VERSION = 2


#: The stage output each stage fills, in run order.
_SLOTS: dict[str, str] = {
    Stage.REGISTER: "registration",
    Stage.RETRIEVE: "retrieval",
    Stage.PLAN: "planning",
    Stage.SAMPLE: "samples",
    Stage.VERIFY: "verification",
    Stage.ASSEMBLE: "decision",
}


#: The audit record of ``RECORD_VERSION``: its top-level keys in order, each with its value
#: when no part sets it (a request that failed before a stage). The values come from the parts'
#: ``SIGNALS``; a key a part declares that is not listed here follows these.
RECORD_LAYOUT: Mapping[str, Any] = MappingProxyType(
    {
        "record_version": RECORD_VERSION,
        "request_id": None,
        "trace_id": None,
        "question": None,
        "standalone_question": None,
        "conversation": None,
        "session_id": None,
        "user_id": None,
        "channel": None,
        "tier": None,
        "versions": None,
        "params": {},
        "started_at": None,
        "materials": [],
        "retrieval": {},
        "plan": None,
        "samples": [],
        "signals": {},
        "confidence": None,
        "decision": None,
        "response": None,
        "errors": [],
        "skipped": [],
        "calibration": None,
        "timings": {},
        "warnings": [],
    }
)


_FRESH = tuple(
    (key, type(seed)) for key, seed in RECORD_LAYOUT.items() if type(seed) in (dict, list)
)


#: The root span's OpenInference metadata: its keys in order (None when no part sets one).
META_LAYOUT = ("request_id", "tier", "versions", "decision", "confidence", "calibration")


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

    #: what the request as a whole says: values that combine its parts
    SIGNALS: ClassVar[tuple[Signal, ...]] = (
        Signal(lambda s: s.request_id, record="request_id", meta="request_id"),
        Signal(lambda s: s.trace_id, record="trace_id"),
        # the registered versions, with those the samples' runs taught where it had none
        Signal(lambda s: s.versions, record="versions"),
        Signal(_meta_versions, meta="versions"),
        Signal(lambda s: s.versions.prompt, root=semconv.VERSION_PROMPT, when=bool),
        Signal(lambda s: s.versions.model, root=semconv.VERSION_MODEL, when=bool),
        Signal(lambda s: s.versions.tracerag, root=semconv.VERSION_TRACERAG, when=bool),
        Signal(lambda s: s.materials, record="materials"),
        Signal(lambda s: [e.to_dict() for e in s.errors], record="errors", is_json=True),
        Signal(lambda s: len(s.errors), root=semconv.ERROR_COUNT),
        Signal(lambda s: s.skipped, record="skipped"),
        Signal(lambda s: s.timings, record="timings", metric="timings"),
    )

    @staticmethod
    def slot(stage: str) -> str:
        """The field a stage's output fills."""
        return _SLOTS[stage]

    def output(self, stage: str) -> Any:
        """A stage's output (None until the stage has run, or when its tier skips it)."""
        return getattr(self, _SLOTS[stage])

    def _evolve(self, **changes: Any) -> RequestState:
        # a copy with some fields changed: what dataclasses.replace does, without re-running
        # __init__ (the runner makes one per stage, on every request)
        new = object.__new__(RequestState)
        new.__dict__.update(self.__dict__)
        new.__dict__.update(changes)
        return new

    def with_output(self, stage: str, output: Any, seconds: float | None = None) -> RequestState:
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
        """The turn as the user wrote it."""
        return self.input.question

    @property
    def standalone_question(self) -> str:
        """The question the request asks, read with its conversation: what is verified and
        checked for relevance (the turn itself for a request on its own)."""
        return self.input.standalone_question

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

    # -- the projections of the parts' declarations -------------------------------------------

    def parts(self) -> tuple[tuple[type[Declared], Any], ...]:
        """Each part's type and value (None when missing), the state itself last."""
        return (
            (RequestInput, self.input),
            (Registration, self.registration),
            (Retrieval, self.retrieval),
            (PlanResult, self.planning),
            (SampleSet, self.samples),
            (Verification, self.verification),
            (Decision, self.decision),
            (RequestState, self),
        )

    def to_record(self, response: Mapping[str, Any] | None = None) -> dict[str, Any]:
        """The JSON-able audit record of this request (layout ``RECORD_LAYOUT``).

        ``response`` is the Response as recorded; by default the one the decision describes.
        """
        record = dict(RECORD_LAYOUT)
        for key, empty in _FRESH:  # a section or list of its own in every record
            record[key] = empty()
        for (_, part), table in zip(self.parts(), _compiled_tables(), strict=True):
            fill_record(record, table.record, part, self)
        if response is not None:
            record["response"] = dict(response)
        return record

    def root_attributes(self, *, routed: bool) -> dict[str, Any]:
        """The root span's attributes the parts declare; the route's once ``routed`` (the
        Response is made)."""
        attrs: dict[str, Any] = {}
        for (kind, part), table in zip(self.parts(), _compiled_tables(), strict=True):
            if part is None or not table.root or (kind is Decision and not routed):
                continue
            attrs.update(attributes(table.root, part, self))
        return attrs

    def root_metadata(self) -> dict[str, Any]:
        """The root span's OpenInference metadata (ids, tier, versions, route; no text)."""
        meta: dict[str, Any] = dict.fromkeys(META_LAYOUT)
        for (_, part), table in zip(self.parts(), _compiled_tables(), strict=True):
            for entry in table.meta:
                value = entry.absent if part is None else entry.get(self if entry.across else part)
                if value is not OMIT:
                    json_ready = entry.is_json or type(value) in LEAVES
                    meta[entry.key] = value if json_ready else jsonable(value)
        return meta

    def outcome_fields(self) -> dict[str, Any]:
        """What the metrics record of this request: ``metrics.RequestOutcome``'s fields."""
        fields: dict[str, Any] = {}
        for (_, part), table in zip(self.parts(), _compiled_tables(), strict=True):
            for entry in table.metric:
                value = entry.absent if part is None else entry.get(self if entry.across else part)
                if value is not OMIT:
                    fields[entry.key] = value
        return fields


_PARTS: tuple[type[Declared], ...] = (
    RequestInput,
    Registration,
    Retrieval,
    PlanResult,
    SampleSet,
    Verification,
    Decision,
    RequestState,
)


_COMPILED_TABLES: list[Any] = [(), ()]  # the tables last compiled, and their compiled forms


def _compiled_tables() -> tuple[Compiled, ...]:
    """Every part's compiled table, in ``RequestState.parts()`` order (compiled anew when a
    table was replaced)."""
    tables = tuple(kind.SIGNALS for kind in _PARTS)
    if tables != _COMPILED_TABLES[0]:
        _COMPILED_TABLES[:] = [tables, tuple(compiled(table) for table in tables)]
    result: tuple[Compiled, ...] = _COMPILED_TABLES[1]
    return result
