"""The audit record of one request, as a typed, versioned model every reader goes through.

``RequestState.to_record()`` writes the record as JSON-able data; stores keep it as entries.
``AuditRecord.parse(data)`` reads it back, whatever pipeline version wrote it:

- ``record_version`` 2 is written by this version; records without the field are version 1
  (the same layout, before the field existed) and parse the same way;
- a value of the wrong type is left out (its field takes its default) instead of failing the
  whole record, so a damaged or hand-written record still reads; keys this model does not know
  are kept as extra fields (``model_extra``).

Readers (``tracerag show``, ``replay``, the review desk, calibration, the quality report, the
adversarial self-test) use these fields and helpers instead of digging in dicts.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator, model_validator

from tracerag.signals._types import Material

__all__ = [
    "AuditRecord",
    "RecordCitations",
    "RecordClaim",
    "RecordConsistency",
    "RecordError",
    "RecordMaterial",
    "RecordPlan",
    "RecordResponse",
    "RecordRule",
    "RecordSample",
    "RecordSelection",
    "RecordSignals",
    "RecordVersions",
]

STALE_STATUSES = frozenset({"superseded", "stale", "withdrawn", "expired"})


class _Part(BaseModel):
    """A part of a record: unknown keys kept, a badly typed value left out, never a failure."""

    model_config = ConfigDict(extra="allow", frozen=True)

    @model_validator(mode="wrap")
    @classmethod
    def _lenient(cls, data: Any, handler: Any) -> Any:
        if isinstance(data, cls):
            return data
        data = dict(data) if isinstance(data, Mapping) else cls._from_other(data)
        for _ in range(len(data) + 1):
            try:
                return handler(data)
            except ValidationError as exc:
                bad = {e["loc"][0] for e in exc.errors() if e["loc"]}
                if not bad & set(data):
                    raise
                data = {k: v for k, v in data.items() if k not in bad}
        return handler({})

    @classmethod
    def _from_other(cls, value: Any) -> dict[str, Any]:
        """The fields a non-mapping value stands for (by default none)."""
        return {}


def _mappings(value: Any) -> Any:
    """Only the mapping items of a list (other items cannot be read as parts)."""
    if isinstance(value, list):
        return [v for v in value if isinstance(v, Mapping)]
    return value


def _mapping_or_none(value: Any) -> Any:
    return value if isinstance(value, Mapping) else None


class RecordVersions(_Part):
    """Which prompt, model and tracerag produced the answer."""

    prompt: str | None = None
    model: str | None = None
    tracerag: str | None = None


class RecordMaterial(_Part):
    """A retrieved material as recorded."""

    id: str | None = None
    text: str = ""
    title: str | None = None
    source: str | None = None
    score: float | None = None
    rank: int | None = None
    metadata: dict[str, Any] = Field(default_factory=dict)

    @field_validator("id", mode="before")
    @classmethod
    def _id_text(cls, value: Any) -> Any:
        return str(value) if isinstance(value, (int, float)) else value

    def to_material(self) -> Material:
        """The material as signals check answers against it."""
        return Material(
            id=str(self.id),
            text=self.text,
            title=self.title or "",
            source=self.source,
            score=self.score,
            rank=self.rank or 0,
            metadata=dict(self.metadata),
        )

    @property
    def stale(self) -> bool:
        """Marked superseded, stale, withdrawn or expired."""
        meta = self.metadata
        return bool(meta.get("superseded_by") or meta.get("status") in STALE_STATUSES)


class RecordPlan(_Part):
    """The plan as recorded."""

    material_ids: list[str] = Field(default_factory=list)
    key_facts: list[str] = Field(default_factory=list)
    ok: bool = True
    error: str | None = None
    raw: str | None = None
    attempts: int | None = None
    mode: str | None = None
    agreement: float | None = None


class RecordSample(_Part):
    """One sample as recorded."""

    index: int | None = None
    raw: str | None = None
    answer: str | None = None
    plan: RecordPlan | None = None
    error: str | None = None
    attempts: int | None = None
    latency_s: float | None = None
    input_tokens: int | None = None
    output_tokens: int | None = None
    material_order: list[str] = Field(default_factory=list)

    @classmethod
    def _from_other(cls, value: Any) -> dict[str, Any]:
        return {"raw": value} if isinstance(value, str) else {}

    @field_validator("plan", mode="before")
    @classmethod
    def _plan(cls, value: Any) -> Any:
        return _mapping_or_none(value)


class RecordClaim(_Part):
    """One claim of an answer with its verdict."""

    text: str = ""
    cited_ids: list[str] = Field(default_factory=list)
    verdict: str | None = None
    score: float | None = None
    material_id: str | None = None
    sentence: str | None = None
    quote: str | None = None
    start: int | None = None
    end: int | None = None
    reason: str = ""

    @field_validator("cited_ids", mode="before")
    @classmethod
    def _ids(cls, value: Any) -> Any:
        if value is None:
            return []
        return [str(v) for v in value] if isinstance(value, list) else value

    @property
    def support(self) -> str | None:
        """The supporting sentence (``sentence`` in signals, ``quote`` in a Response)."""
        return self.sentence or self.quote


class RecordCitations(_Part):
    """The chosen answer's citation report."""

    claims: list[RecordClaim] = Field(default_factory=list)
    coverage: float | None = None
    accuracy: float | None = None
    score: float | None = None
    fabricated: list[str] = Field(default_factory=list)
    stale: list[str] = Field(default_factory=list)
    backend: str | None = None

    _claims = field_validator("claims", mode="before")(classmethod(lambda cls, v: _mappings(v)))

    @property
    def valid(self) -> bool:
        """Every claim supported, at least one claim, no fabricated citation."""
        return bool(self.claims) and not self.fabricated and self.score == 1.0


class RecordConsistency(_Part):
    """How far the samples agree."""

    agreement: float | None = None
    n_groups: int | None = None
    entropy: float | None = None
    #: sample indices per conclusion group, largest first (some writers kept only the count)
    groups: list[list[int]] | int = Field(default_factory=list)
    n_samples: int | None = None
    n_failed: int | None = None
    informative: bool | None = None
    note: str = ""

    @property
    def group_count(self) -> int | None:
        """How many conclusion groups (``n_groups``, else the recorded groups)."""
        if self.n_groups is not None:
            return self.n_groups
        if "groups" not in self.model_fields_set:
            return None
        return self.groups if isinstance(self.groups, int) else len(self.groups)


class RecordSelection(_Part):
    """Which sample answers, and how many samples agree with it."""

    sample_index: int | None = None
    group: list[int] = Field(default_factory=list)
    share: float | None = None
    reason: str = ""


class RecordRule(_Part):
    """One rule's outcome."""

    name: str | None = None
    passed: bool | None = None
    required: bool = False
    detail: str = ""

    @classmethod
    def _from_other(cls, value: Any) -> dict[str, Any]:
        return {"name": str(value)} if value is not None else {}


class RecordSignals(_Part):
    """The verify stage's signals (empty when the tier does not verify)."""

    citations: RecordCitations | None = None
    citations_by_sample: dict[str, Any] = Field(default_factory=dict)
    consistency: RecordConsistency | None = None
    selection: RecordSelection | None = None
    rules: list[RecordRule] = Field(default_factory=list)
    #: tiers 1 and 2 of attribution (``tracerag.signals.attribution.Attribution.to_record``)
    attribution: dict[str, Any] | None = None
    #: whether the answer addresses the question (``RelevanceReport.to_record``)
    relevance: dict[str, Any] | None = None

    @field_validator(
        "citations", "consistency", "selection", "attribution", "relevance", mode="before"
    )
    @classmethod
    def _parts(cls, value: Any) -> Any:
        return _mapping_or_none(value)


class RecordError(_Part):
    """One error or retry, with its stage; extra keys (attempt, sample, …) kept."""

    stage: str | None = None
    type: str | None = None
    message: str | None = None
    at: str | None = None

    @classmethod
    def _from_other(cls, value: Any) -> dict[str, Any]:
        return {"message": str(value)} if value is not None else {}

    @property
    def details(self) -> dict[str, Any]:
        """The keys beyond stage, type, message and time."""
        return dict(self.model_extra or {})


class RecordResponse(_Part):
    """The Response as recorded (before its record was persisted)."""

    answer: str | None = None
    status: str | None = None
    decision: str | None = None
    confidence: float | None = None
    ticket_id: str | None = None
    signal_detail: dict[str, Any] = Field(default_factory=dict)
    claims: list[RecordClaim] = Field(default_factory=list)
    evidence: list[dict[str, Any]] = Field(default_factory=list)

    _claims = field_validator("claims", mode="before")(classmethod(lambda cls, v: _mappings(v)))

    @property
    def confidence_caps(self) -> list[str]:
        caps = self.signal_detail.get("confidence_caps")
        return [str(c) for c in caps] if isinstance(caps, list) else []


class AuditRecord(_Part):
    """One request's audit record (see the module docstring for versions and leniency)."""

    record_version: int = 1
    request_id: str = ""
    trace_id: str | None = None
    question: str | None = None
    #: a conversation's turn: the standalone question verified (``question`` is the raw turn)
    standalone_question: str | None = None
    #: where the earlier turns came from, how the turn was resolved, the earlier questions
    conversation: dict[str, Any] | None = None
    session_id: str | None = None
    user_id: str | None = None
    channel: str | None = None
    tier: str | None = None
    versions: RecordVersions = Field(default_factory=RecordVersions)
    params: dict[str, Any] = Field(default_factory=dict)
    started_at: str | None = None
    materials: list[RecordMaterial] = Field(default_factory=list)
    retrieval: dict[str, Any] = Field(default_factory=dict)
    plan: RecordPlan | None = None
    samples: list[RecordSample] = Field(default_factory=list)
    signals: RecordSignals = Field(default_factory=RecordSignals)
    confidence: float | None = None
    decision: str | None = None
    response: RecordResponse | None = None
    errors: list[RecordError] = Field(default_factory=list)
    skipped: list[str] = Field(default_factory=list)
    calibration: str | None = None
    timings: dict[str, Any] = Field(default_factory=dict)
    warnings: list[str] = Field(default_factory=list)
    #: tokens, calls and cost per stage (``tracerag.usage.usage_section``)
    usage: dict[str, Any] | None = None
    #: set on the requests of a ``tracerag eval`` run: run id, arm and configuration
    evaluation_run: dict[str, Any] | None = None

    @field_validator("plan", "response", mode="before")
    @classmethod
    def _optional_parts(cls, value: Any) -> Any:
        return _mapping_or_none(value)

    _materials = field_validator("materials", mode="before")(
        classmethod(lambda cls, v: _mappings(v))
    )

    @classmethod
    def parse(cls, data: Mapping[str, Any] | AuditRecord) -> AuditRecord:
        """The typed record of stored (or freshly built) record data."""
        return cls.model_validate(data)

    # -- what readers ask of a record ----------------------------------------------------------

    @property
    def citations(self) -> RecordCitations:
        """The chosen answer's citation report (empty when not verified)."""
        return self.signals.citations or RecordCitations()

    @property
    def claims(self) -> list[RecordClaim]:
        """The answer's claims: from the verify signals, else from the Response."""
        if self.citations.claims:
            return self.citations.claims
        return self.response.claims if self.response is not None else []

    @property
    def retrieved_ids(self) -> list[str]:
        return [m.id for m in self.materials if m.id is not None]

    @property
    def cited_ids(self) -> list[str]:
        """Every material id the answer cited, in first-cited order."""
        seen: list[str] = []
        for claim in self.claims:
            for cid in claim.cited_ids:
                if cid not in seen:
                    seen.append(cid)
        for cid in self.citations.fabricated:
            if cid not in seen:
                seen.append(cid)
        return seen

    @property
    def cited_not_retrieved(self) -> list[str]:
        """Cited ids that are not among the retrieved materials (fabricated citations)."""
        retrieved = set(self.retrieved_ids)
        return [cid for cid in self.cited_ids if cid not in retrieved]

    def material_order(self) -> list[str]:
        """The retrieved order the chosen answer saw (what ``[1]``-style markers count in)."""
        sample = self.chosen_sample
        if sample is not None and sample.material_order:
            return list(sample.material_order)
        ranked = sorted(self.materials, key=lambda m: (m.rank is None, m.rank or 0))
        return [m.id for m in ranked if m.id is not None]

    def resolved_citations(self) -> tuple[set[str], list[str]]:
        """The retrieved ids the answer cited, and the cited markers that named nothing retrieved.

        A marker is a material id, or in wrap mode (``params.positional``) a 1-based position in
        the retrieved order its sample saw, as the verifier read it. Where the verifier recorded
        which markers it found unretrieved (``fabricated_ids``), that is what is reported.
        """
        retrieved = set(self.retrieved_ids)
        positional = bool(self.params.get("positional"))
        order = self.material_order() if positional else []

        def resolve(marker: str) -> str | None:
            if marker in retrieved:
                return marker
            if positional and marker.isdigit() and 1 <= int(marker) <= len(order):
                return order[int(marker) - 1]
            return None

        cited: set[str] = set()
        missing: list[str] = []
        for claim in self.claims:
            fabricated = (claim.model_extra or {}).get("fabricated_ids")
            for marker in claim.cited_ids:
                material_id = resolve(marker)
                if material_id is not None:
                    cited.add(material_id)
                unretrieved = (
                    marker in [str(f) for f in fabricated]
                    if isinstance(fabricated, list)
                    else material_id is None
                )
                if unretrieved and marker not in missing:
                    missing.append(marker)
        if not self.claims:
            missing = self.cited_not_retrieved
        return cited, missing

    def material(self, material_id: str) -> RecordMaterial | None:
        """The recorded material with this id, or None."""
        return next((m for m in self.materials if m.id == material_id), None)

    @property
    def chosen_sample(self) -> RecordSample | None:
        """The sample the verify stage chose, if it chose one."""
        index = self.signals.selection.sample_index if self.signals.selection else None
        if index is not None and 0 <= index < len(self.samples):
            return self.samples[index]
        return None

    @property
    def candidate_answer(self) -> str | None:
        """The answer the pipeline chose, even when the Response withheld it."""
        chosen = self.chosen_sample
        if chosen is not None and chosen.answer:
            return chosen.answer
        answer = self.response.answer if self.response is not None else None
        return answer or None

    @property
    def replay_of(self) -> str | None:
        """The request this one replayed (``tracerag replay``), if it is a replay."""
        value = (self.model_extra or {}).get("replay_of")
        return str(value) if value else None

    @property
    def self_consistency(self) -> float | None:
        """The share of samples agreeing with the chosen answer."""
        if self.signals.selection is not None and self.signals.selection.share is not None:
            return self.signals.selection.share
        return self.signals.consistency.agreement if self.signals.consistency else None

    @property
    def confidence_caps(self) -> list[str]:
        return self.response.confidence_caps if self.response is not None else []

    @property
    def off_topic_reason(self) -> str | None:
        """Why the answer does not address the question, when the relevance check said so."""
        relevance = self.signals.relevance or {}
        if relevance.get("addresses") is False:
            return str(relevance.get("reason") or "the answer does not address the question")
        return None

    @property
    def rules_failed(self) -> list[str]:
        return [str(r.name) for r in self.signals.rules if r.passed is False]
