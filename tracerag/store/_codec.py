"""The record codec: one request's audit record to log entries and back, and its read view.

``entries_from_record`` splits a record (a mapping; the pipeline's ``to_record()``) into
unsealed entries; ``record_from_entries`` reassembles it; ``RequestTrail`` is what a reader gets
for one request_id. Payloads are normalised through canonical JSON, so what is returned is
what the store keeps.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Generic, TypeVar, cast, overload

from tracerag.store._audit_record import AuditRecord
from tracerag.store._chain import jcs_parsed
from tracerag.store._types import (
    KIND_ERROR,
    KIND_MATERIAL_CHANGE,
    KIND_PLAN,
    KIND_REGISTER,
    KIND_RESPONSE,
    KIND_RETRIEVE,
    KIND_REVIEW_DECISION,
    KIND_SAMPLE,
    KIND_VERIFY,
    RECORD_KINDS,
    Entry,
    InvalidRecord,
    QueueItem,
)

# Which top-level record keys go into which entry (any other key travels in the response
# entry under "extra", so nothing in a record is lost).
REGISTER_KEYS = (
    "record_version",
    "trace_id",
    "question",
    "session_id",
    "user_id",
    "channel",
    "tier",
    "versions",
    "params",
    "started_at",
)
RETRIEVE_KEYS = ("materials", "retrieval")
PLAN_KEYS = ("plan",)
VERIFY_KEYS = ("signals",)
RESPONSE_KEYS = (
    "confidence",
    "decision",
    "response",
    "calibration",
    "skipped",
    "timings",
    "warnings",
)
RECORD_ORDER = (
    "request_id",
    *REGISTER_KEYS,
    *RETRIEVE_KEYS,
    *PLAN_KEYS,
    "samples",
    *VERIFY_KEYS,
    *RESPONSE_KEYS[:3],
    "errors",
    *RESPONSE_KEYS[3:],
)


def _encode(value: Any, what: str) -> tuple[str, Any]:
    """The canonical JSON text of a value and its parsed form; ``InvalidRecord`` if none."""
    try:
        return jcs_parsed(value)
    except (TypeError, ValueError, UnicodeError, RecursionError) as exc:
        raise InvalidRecord(f"{what} is not JSON-able: {exc}") from exc


def _normalise(value: Any, what: str) -> Any:
    """The value as it will read back from the store (a JSON round trip)."""
    return _encode(value, what)[1]


def entries_from_record(record: Mapping[str, Any]) -> list[Entry]:
    """Split one request record into unsealed log entries, in the order they are written.

    register (input, versions, trace_id) → retrieve (materials with scores and ranks) → plan →
    one sample entry per raw sample → verify (signals and per-claim verdicts) → response
    (confidence, decision, response, timings, ...) → one error entry per error or retry.
    Keys this function does not know travel in the response entry under ``extra``.
    """
    if not isinstance(record, Mapping):
        raise InvalidRecord(f"an audit record must be a mapping, not {type(record).__name__}")
    request_id = record.get("request_id")
    if not isinstance(request_id, str) or not request_id.strip() or "\x00" in request_id:
        raise InvalidRecord("an audit record needs a non-empty string request_id")
    if not _valid_text(request_id):
        raise InvalidRecord("the request_id is not valid Unicode text (a lone surrogate?)")
    record = dict(record)
    what = f"record {request_id!r}"

    def entry(kind: str, payload: dict[str, Any]) -> Entry:
        text, parsed = _encode(payload, what)
        return Entry(request_id=request_id, kind=kind, payload=parsed, payload_json=text)

    def part(keys: Sequence[str]) -> dict[str, Any]:
        return {k: record[k] for k in keys if k in record}

    entries = [
        entry(KIND_REGISTER, part(REGISTER_KEYS)),
        entry(KIND_RETRIEVE, part(RETRIEVE_KEYS)),
        entry(KIND_PLAN, part(PLAN_KEYS)),
    ]
    known = {"request_id", *REGISTER_KEYS, *RETRIEVE_KEYS, *PLAN_KEYS, *VERIFY_KEYS}
    known |= set(RESPONSE_KEYS)
    samples = record.get("samples")
    if isinstance(samples, (list, tuple)):
        known.add("samples")
        entries += [entry(KIND_SAMPLE, _wrap(s)) for s in samples]
    entries.append(entry(KIND_VERIFY, part(VERIFY_KEYS)))
    response = part(RESPONSE_KEYS)
    errors = record.get("errors")
    if isinstance(errors, (list, tuple)):
        known.add("errors")
    extra = {k: v for k, v in record.items() if k not in known}
    if extra:
        response["extra"] = extra
    entries.append(entry(KIND_RESPONSE, response))
    if isinstance(errors, (list, tuple)):
        entries += [entry(KIND_ERROR, _wrap(e)) for e in errors]
    return entries


def material_change_entry(
    material_id: str, actor: str, payload: Mapping[str, Any], reason: str | None = None
) -> Entry:
    """One unsealed ``material_change`` entry: the change's payload (RFC 8785 canonical JSON)
    with its ``reason``, under the material's id, by ``actor``."""
    if not isinstance(material_id, str) or not material_id.strip() or "\x00" in material_id:
        raise InvalidRecord("a material change needs a non-empty string material id")
    if not _valid_text(material_id):
        raise InvalidRecord("the material id is not valid Unicode text (a lone surrogate?)")
    if not isinstance(actor, str) or not actor.strip():
        raise InvalidRecord("a material change needs an actor")
    body = {**dict(payload), "reason": reason}
    text, parsed = _encode(body, f"the change of material {material_id!r}")
    return Entry(
        request_id=material_id,
        kind=KIND_MATERIAL_CHANGE,
        payload=parsed,
        payload_json=text,
        actor=actor,
    )


def _wrap(item: Any) -> dict[str, Any]:
    return item if isinstance(item, dict) else {"_value": item}


def _unwrap(payload: dict[str, Any]) -> Any:
    return payload["_value"] if set(payload) == {"_value"} else payload


def record_from_entries(entries: Sequence[Entry]) -> dict[str, Any]:
    """Reassemble the request record from its entries (the inverse of ``entries_from_record``).

    ``samples`` and ``errors`` are always present (possibly empty); action entries are ignored.
    """
    merged: dict[str, Any] = {}
    samples: list[Any] = []
    errors: list[Any] = []
    extra: dict[str, Any] = {}
    for entry in entries:
        if not merged.get("request_id"):
            merged["request_id"] = entry.request_id
        if entry.kind == KIND_SAMPLE:
            samples.append(_unwrap(entry.payload))
        elif entry.kind == KIND_ERROR:
            errors.append(_unwrap(entry.payload))
        elif entry.kind in (KIND_REGISTER, KIND_RETRIEVE, KIND_PLAN, KIND_VERIFY):
            merged.update(entry.payload)
        elif entry.kind == KIND_RESPONSE:
            payload = dict(entry.payload)
            extra.update(payload.pop("extra", None) or {})
            merged.update(payload)
    merged["samples"] = samples
    merged["errors"] = errors
    ordered = {k: merged[k] for k in RECORD_ORDER if k in merged}
    ordered.update({k: v for k, v in merged.items() if k not in ordered})
    ordered.update({k: v for k, v in extra.items() if k not in ordered})
    return ordered


_T = TypeVar("_T")


class _RecordKey(Generic[_T]):
    """A read-only trail attribute: one key of the trail's record (``empty()`` when it is unset
    or empty, if given)."""

    def __init__(self, key: str, empty: Callable[[], _T] | None = None) -> None:
        self.key = key
        self.empty = empty

    @overload
    def __get__(self, trail: None, owner: type) -> _RecordKey[_T]: ...

    @overload
    def __get__(self, trail: RequestTrail, owner: type) -> _T: ...

    def __get__(self, trail: RequestTrail | None, owner: type) -> _T | _RecordKey[_T]:
        if trail is None:
            return self
        value = cast(_T, trail.record.get(self.key))  # the record is JSON, typed by its schema
        return value if value or self.empty is None else self.empty()


@dataclass
class RequestTrail:
    """Everything stored under one request_id: its entries in seq order and review state."""

    request_id: str
    entries: list[Entry]
    review: QueueItem | None = None
    _record: dict[str, Any] | None = field(default=None, repr=False, compare=False)
    _audit: AuditRecord | None = field(default=None, repr=False, compare=False)

    @property
    def record(self) -> dict[str, Any]:
        """The request record, reassembled from the entries."""
        if self._record is None:
            self._record = record_from_entries(self.entries)
        return self._record

    @property
    def audit(self) -> AuditRecord:
        """The request record, typed (``tracerag.record.AuditRecord``)."""
        if self._audit is None:
            self._audit = AuditRecord.parse(self.record)
        return self._audit

    def of_kind(self, *kinds: str) -> list[Entry]:
        """The entries of the given kinds, in seq order."""
        return [e for e in self.entries if e.kind in kinds]

    def first(self, kind: str) -> Entry | None:
        """The first entry of a kind, or None."""
        found = self.of_kind(kind)
        return found[0] if found else None

    trace_id = _RecordKey[str | None]("trace_id")
    question = _RecordKey[str | None]("question")
    versions = _RecordKey[dict[str, Any]]("versions", dict)
    plan = _RecordKey[dict[str, Any] | None]("plan")
    samples = _RecordKey[list[Any]]("samples", list)
    confidence = _RecordKey[float | None]("confidence")
    decision = _RecordKey[str | None]("decision")
    response = _RecordKey[Any]("response")
    errors = _RecordKey[list[Any]]("errors", list)

    @property
    def materials(self) -> list[dict[str, Any]]:
        return [m for m in self.record.get("materials") or [] if isinstance(m, dict)]

    @property
    def signals(self) -> dict[str, Any]:
        signals = self.record.get("signals")
        return signals if isinstance(signals, dict) else {}

    @property
    def claims(self) -> list[dict[str, Any]]:
        return [c.model_dump(exclude_unset=True) for c in self.audit.claims]

    @property
    def actions(self) -> list[Entry]:
        """Reviewer and operator actions, in the order they happened."""
        return [e for e in self.entries if e.kind not in RECORD_KINDS]

    @property
    def retrieved_ids(self) -> list[str]:
        return [str(m.get("id")) for m in self.materials if m.get("id") is not None]

    @property
    def cited_ids(self) -> list[str]:
        """Every material id the answer cited, in first-cited order."""
        return self.audit.cited_ids

    @property
    def cited_not_retrieved(self) -> list[str]:
        """Cited ids that are not among the retrieved materials (fabricated citations)."""
        return self.audit.cited_not_retrieved

    @property
    def review_decision(self) -> Entry | None:
        """The review decision entry, if the request was decided by a reviewer."""
        found = self.of_kind(KIND_REVIEW_DECISION)
        return found[-1] if found else None

    def to_dict(self) -> dict[str, Any]:
        """A JSON-able form: the reassembled record, every entry and the review state."""
        return {
            "request_id": self.request_id,
            "record": self.record,
            "entries": [e.to_dict() for e in self.entries],
            "review": self.review.to_dict() if self.review else None,
        }


def _summary_fields(record: Mapping[str, Any]) -> dict[str, Any]:
    confidence = record.get("confidence")
    return {
        "trace_id": _str_or_none(record.get("trace_id")),
        "question": _str_or_none(record.get("question")),
        "decision": _str_or_none(record.get("decision")),
        "confidence": float(confidence)
        if isinstance(confidence, (int, float)) and not isinstance(confidence, bool)
        else None,
        "tier": _str_or_none(record.get("tier")),
        "channel": _str_or_none(record.get("channel")),
    }


def _str_or_none(value: Any) -> str | None:
    # PostgreSQL text cannot hold NUL characters
    return None if value is None else str(value).replace("\x00", "\ufffd")


def review_reason(record: Mapping[str, Any]) -> str:
    """Why a routed record needs a human, in one line, from its confidence and signals."""
    parts = [f"decision {record.get('decision')}"]
    confidence = record.get("confidence")
    if isinstance(confidence, (int, float)):
        parts.append(f"confidence {confidence:.2f}")
    typed = AuditRecord.parse(record)
    fabricated = typed.citations.fabricated
    if fabricated:
        parts.append("fabricated citations " + ", ".join(fabricated))
    failed = typed.rules_failed
    if failed:
        parts.append("rules failed " + ", ".join(failed))
    errors = record.get("errors") or []
    if errors:
        parts.append(f"{len(errors)} errors")
    return "; ".join(parts)


def _valid_text(text: str) -> bool:
    try:
        text.encode("utf-8")
    except UnicodeError:
        return False
    return True


def require_actor(actor: str) -> None:
    """Refuse an action without a named actor (``InvalidRecord``)."""
    if not isinstance(actor, str) or not actor.strip() or "\x00" in actor:
        raise InvalidRecord("every action needs a named actor")
    if not _valid_text(actor):
        raise InvalidRecord("the actor's name is not valid Unicode text")


def action_payload(
    actor: str, payload: Mapping[str, Any] | None, reason: str | None
) -> dict[str, Any]:
    """The payload of an actor's entry: normalised, with its ``reason``."""
    require_actor(actor)
    body: dict[str, Any] = _normalise(dict(payload or {}), "action payload")
    body["reason"] = reason
    return body
