"""RequestContext: the one record a request carries through the six stages.

Each stage reads what earlier stages wrote and adds its own part; nothing flows backwards.
``to_record()`` turns it into the JSON-able audit record kept under the request_id.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from datetime import date, datetime, timezone
from typing import Any


def utcnow() -> datetime:
    """The current time in UTC (timezone-aware)."""
    return datetime.now(timezone.utc)


@dataclass
class Material:
    """One retrieved document: the only kind of thing an answer may cite."""

    id: str
    text: str
    title: str = ""
    source: str | None = None
    score: float | None = None
    rank: int = 0
    metadata: dict[str, Any] = field(default_factory=dict)

    def stale_reason(self, today: date | None = None) -> str | None:
        """Why this material may not serve as support (superseded or expired), or None."""
        meta = self.metadata
        if meta.get("superseded_by"):
            return f"superseded by {meta['superseded_by']}"
        if meta.get("status") in {"superseded", "stale", "withdrawn", "expired"}:
            return f"marked {meta['status']}"
        until = meta.get("valid_until")
        if until:
            today = today or utcnow().date()
            try:
                until_date = (
                    until if isinstance(until, date) else date.fromisoformat(str(until)[:10])
                )
            except ValueError:
                return None
            if until_date < today:
                return f"valid until {until_date.isoformat()}, now past"
        return None


@dataclass
class Plan:
    """What the model says it will rely on: material ids and key facts."""

    material_ids: list[str] = field(default_factory=list)
    key_facts: list[str] = field(default_factory=list)
    ok: bool = True
    error: str | None = None
    raw: str | None = None
    attempts: int = 1
    mode: str = "separate"
    agreement: float | None = None  # inline mode: how far the samples' plans agree


@dataclass
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
    material_order: list[str] = field(default_factory=list)

    @property
    def ok(self) -> bool:
        return self.error is None and bool(self.answer and self.answer.strip())


@dataclass
class Versions:
    """Which prompt, model and tracerag produced an answer."""

    prompt: str | None = None
    model: str | None = None
    tracerag: str = ""


@dataclass
class RequestContext:
    """Everything known about one request, in the order the stages learn it."""

    question: str
    request_id: str = ""
    session_id: str | None = None
    user_id: str | None = None
    channel: str | None = None
    tier: str = "high"
    versions: Versions = field(default_factory=Versions)
    params: dict[str, Any] = field(default_factory=dict)
    started_at: datetime = field(default_factory=utcnow)
    trace_id: str | None = None
    # retrieve
    materials: list[Material] = field(default_factory=list)
    retrieval: dict[str, Any] = field(default_factory=dict)
    # plan
    plan: Plan | None = None
    # sample
    samples: list[Sample] = field(default_factory=list)
    # verify: name -> signal report (dataclasses or dicts)
    signals: dict[str, Any] = field(default_factory=dict)
    # assemble
    confidence: float | None = None
    decision: str | None = None
    response: Any = None
    # everything that went wrong, with its stage; never dropped
    errors: list[dict[str, Any]] = field(default_factory=list)
    skipped: list[str] = field(default_factory=list)
    calibration: str | None = None
    # stage name -> seconds spent in it; "request" -> whole request
    timings: dict[str, float] = field(default_factory=dict)
    warnings: list[str] = field(default_factory=list)

    def material(self, material_id: str) -> Material | None:
        """The retrieved material with this id, or None if it was not retrieved."""
        for m in self.materials:
            if m.id == material_id:
                return m
        return None

    def record_error(self, stage: str, error: BaseException | str, **extra: Any) -> None:
        """Keep an error with its stage; errors are data, not lost exceptions."""
        if isinstance(error, BaseException):
            entry = {"stage": stage, "type": type(error).__name__, "message": str(error)}
        else:
            entry = {"stage": stage, "type": "error", "message": error}
        entry.update(extra)
        entry["at"] = utcnow().isoformat()
        self.errors.append(entry)

    def to_record(self) -> dict[str, Any]:
        """The JSON-able audit record of this request."""
        return _jsonable(
            {
                "request_id": self.request_id,
                "trace_id": self.trace_id,
                "question": self.question,
                "session_id": self.session_id,
                "user_id": self.user_id,
                "channel": self.channel,
                "tier": self.tier,
                "versions": self.versions,
                "params": self.params,
                "started_at": self.started_at,
                "materials": self.materials,
                "retrieval": self.retrieval,
                "plan": self.plan,
                "samples": self.samples,
                "signals": self.signals,
                "confidence": self.confidence,
                "decision": self.decision,
                "response": self.response,
                "errors": self.errors,
                "skipped": self.skipped,
                "calibration": self.calibration,
                "timings": self.timings,
                "warnings": self.warnings,
            }
        )


def _jsonable(value: Any) -> Any:
    """Convert dataclasses, pydantic models, datetimes and containers to JSON-able values."""
    if value is None or isinstance(value, (str, int, float, bool)):
        return value
    if isinstance(value, (datetime, date)):
        return value.isoformat()
    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        return {f.name: _jsonable(getattr(value, f.name)) for f in dataclasses.fields(value)}
    if hasattr(value, "model_dump"):
        return value.model_dump(mode="json")
    if isinstance(value, dict):
        return {str(k): _jsonable(v) for k, v in value.items()}
    if isinstance(value, (list, tuple, set, frozenset)):
        return [_jsonable(v) for v in value]
    return str(value)
