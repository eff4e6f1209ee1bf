"""What the registry keeps about a material: its versions, provenance, usage and credibility.

A material version is immutable: every change to a material (new text, new status, new
validity) is a new ``MaterialVersion`` with the next version number. ``MaterialVersion.body()``
is the JSON form that is stored, hash-chained and compared on verification.

LangChain ``Document.metadata`` keys map to provenance as listed in ``METADATA_KEYS``.
"""

from __future__ import annotations

import hashlib
from collections.abc import Mapping
from dataclasses import asdict, dataclass, field, replace
from datetime import date, datetime, timezone
from typing import Any, Literal, TypedDict

from tracerag.errors import InputError

SourceType = Literal["document", "user_input", "inference", "third_party"]
Status = Literal["active", "pending_review", "quarantined", "deleted"]

SOURCE_TYPES: tuple[str, ...] = ("document", "user_input", "inference", "third_party")
STATUSES: tuple[str, ...] = ("active", "pending_review", "quarantined", "deleted")
#: statuses that keep a material out of retrieval
WITHHELD: frozenset[str] = frozenset({"pending_review", "quarantined", "deleted"})
#: the change of a version that proposes a quarantine (status unchanged) for a person to
#: confirm (``quarantine``) or dismiss (``dismiss``)
PROPOSE_QUARANTINE = "propose_quarantine"

#: which LangChain ``Document.metadata`` keys fill which provenance field, first match wins
METADATA_KEYS: dict[str, tuple[str, ...]] = {
    "material_id": ("id", "doc_id", "document_id", "uuid"),
    "document_id": ("document_id", "doc_id", "source", "file_path", "path", "filename"),
    "title": ("title", "name", "heading"),
    "section": ("section", "header", "heading", "chapter", "clause"),
    "page": ("page", "page_number", "page_label"),
    "origin_url": ("url", "source_url", "link", "href"),
    "source_type": ("source_type",),
    "valid_from": ("valid_from", "effective_from", "effective_date"),
    "valid_until": ("valid_until", "expires", "expiry_date", "valid_to"),
    "last_confirmed": ("last_confirmed", "last_reviewed", "reviewed_at"),
    "supersedes": ("supersedes", "replaces"),
    "superseded_by": ("superseded_by", "replaced_by"),
}


def content_hash(text: str) -> str:
    """The SHA-256 of a material's text (UTF-8), as hex."""
    return hashlib.sha256(text.encode("utf-8")).hexdigest()


def utcnow() -> datetime:
    """The current time in UTC."""
    return datetime.now(timezone.utc)


def now_iso() -> str:
    """The current UTC time in ISO-8601 text."""
    return utcnow().isoformat(timespec="microseconds")


def iso(value: datetime | date | str | None) -> str | None:
    """A time in ISO-8601 text (UTC for datetimes; naive ones are taken as UTC)."""
    if value is None or value == "":
        return None
    if isinstance(value, str):
        return value
    if isinstance(value, datetime):
        if value.tzinfo is None:
            value = value.replace(tzinfo=timezone.utc)
        return value.astimezone(timezone.utc).isoformat(timespec="microseconds")
    return value.isoformat()


def parse_time(value: str | datetime | date | None) -> datetime | None:
    """An ISO date or datetime as an aware UTC datetime; None when absent or unreadable."""
    if value is None or value == "":
        return None
    if isinstance(value, datetime):
        return value if value.tzinfo else value.replace(tzinfo=timezone.utc)
    if isinstance(value, date):
        return datetime(value.year, value.month, value.day, tzinfo=timezone.utc)
    text = str(value).strip().replace("Z", "+00:00")
    try:
        parsed = datetime.fromisoformat(text)
    except ValueError:
        try:
            parsed = datetime.fromisoformat(text[:10])
        except ValueError:
            return None
    return parsed if parsed.tzinfo else parsed.replace(tzinfo=timezone.utc)


def expired(valid_until: str | None, now: datetime | None = None) -> bool:
    """True when a ``valid_until`` (an ISO date: valid through that day; or a time) has passed."""
    until = parse_time(valid_until)
    if until is None:
        return False
    if valid_until and len(valid_until) <= 10:
        return (now or utcnow()).date() > until.date()
    return (now or utcnow()) > until


@dataclass(frozen=True)
class Provenance:
    """Where a material came from.

    ``parents`` and ``reasoning`` are set for an inferred material: the materials it was
    inferred from and the reasoning that produced it.
    """

    source_type: str = "document"
    document_id: str | None = None
    section: str | None = None
    page: str | None = None
    origin_url: str | None = None
    parents: tuple[str, ...] = ()
    reasoning: str | None = None

    def __post_init__(self) -> None:
        if self.source_type not in SOURCE_TYPES:
            raise InputError(f"source_type must be one of {SOURCE_TYPES}, not {self.source_type!r}")
        if self.source_type == "inference" and not self.parents:
            raise InputError("an inferred material needs its parent materials")
        object.__setattr__(self, "parents", tuple(str(p) for p in self.parents))

    def to_dict(self) -> dict[str, Any]:
        """A JSON-able form."""
        out = asdict(self)
        out["parents"] = list(self.parents)
        return out

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> Provenance:
        """The inverse of ``to_dict``."""
        return cls(
            source_type=str(data.get("source_type") or "document"),
            document_id=data.get("document_id"),
            section=data.get("section"),
            page=None if data.get("page") is None else str(data.get("page")),
            origin_url=data.get("origin_url"),
            parents=tuple(data.get("parents") or ()),
            reasoning=data.get("reasoning"),
        )


class MaterialFields(TypedDict, total=False):
    """What a change may set besides a material's text: the ``MaterialVersion`` fields of the
    same names (``provenance`` defaults to ``Provenance()``, the others to None)."""

    provenance: Provenance
    title: str | None
    valid_from: str | None
    valid_until: str | None
    last_confirmed: str | None
    supersedes: str | None
    superseded_by: str | None


@dataclass(frozen=True)
class MaterialVersion:
    """One immutable version of a material, with why and by whom it was written."""

    material_id: str
    version: int
    content: str
    provenance: Provenance = field(default_factory=Provenance)
    status: str = "active"
    title: str | None = None
    valid_from: str | None = None
    valid_until: str | None = None
    last_confirmed: str | None = None
    supersedes: str | None = None
    superseded_by: str | None = None
    written_by: str = "manual"  # the write rule or model version that wrote this version
    source_snippet: str = ""  # the original source text, in full
    operator: str = "tracerag"
    created_at: str = ""
    change: str = "create"  # create | edit | status | rollback | first_sight | ...
    reason: str | None = None
    batch_id: str | None = None
    based_on: int | None = None  # the version this one changed (None for the first)
    gate: dict[str, Any] | None = None  # the write gate's verdict, when the gate ran
    content_hash: str = ""

    def __post_init__(self) -> None:
        if not self.material_id or not str(self.material_id).strip():
            raise InputError("a material needs an id")
        if self.status not in STATUSES:
            raise InputError(f"status must be one of {STATUSES}, not {self.status!r}")
        if self.version < 1:
            raise InputError("versions start at 1")
        if not self.content_hash:
            object.__setattr__(self, "content_hash", content_hash(self.content))
        if not self.source_snippet:
            object.__setattr__(self, "source_snippet", self.content)

    def body(self) -> dict[str, Any]:
        """The stored (and chained) JSON form."""
        out = asdict(self)
        out["provenance"] = self.provenance.to_dict()
        return out

    @classmethod
    def from_body(cls, body: Mapping[str, Any]) -> MaterialVersion:
        """The inverse of ``body``."""
        data = dict(body)
        data["provenance"] = Provenance.from_dict(data.get("provenance") or {})
        known = {f for f in cls.__dataclass_fields__}
        return cls(**{k: v for k, v in data.items() if k in known})

    def evolve(self, **changes: Any) -> MaterialVersion:
        """The next version with some fields changed (content hash recomputed)."""
        changes.setdefault("version", self.version + 1)
        changes.setdefault("based_on", self.version)
        if "content" in changes:
            changes.setdefault("content_hash", "")
            changes.setdefault("source_snippet", "")
        return replace(self, **changes)

    def next_change(
        self, *, operator: str, written_by: str, reason: str, change: str, **changes: Any
    ) -> MaterialVersion:
        """The next version, written by a change of ``operator``'s (with ``evolve``'s
        ``changes``); its time and write-gate verdict are its own, set when it is committed."""
        return self.evolve(
            operator=operator,
            written_by=written_by,
            reason=reason,
            change=change,
            created_at="",
            gate=None,
            **changes,
        )

    def expired(self, now: datetime | None = None) -> bool:
        """True when ``valid_until`` has passed (an expired material is stale)."""
        return expired(self.valid_until, now)

    def stale_reason(self, now: datetime | None = None) -> str | None:
        """Why this version may not serve as support (superseded or expired), or None."""
        if self.superseded_by:
            return f"superseded by {self.superseded_by}"
        if self.expired(now):
            return f"valid until {self.valid_until}, now past"
        return None


USAGE_COUNTERS: tuple[str, ...] = (
    "retrievals",
    "citations",
    "passed",
    "approvals",
    "edits",
    "rejections",
    "confirmations",
    "denials",
)


@dataclass(frozen=True)
class Usage:
    """How one material version has been used and judged."""

    retrievals: int = 0
    citations: int = 0
    passed: int = 0  # appearances in answers that passed
    approvals: int = 0  # reviewer approvals of answers that used it
    edits: int = 0
    rejections: int = 0
    confirmations: int = 0  # user confirmations
    denials: int = 0

    def to_dict(self) -> dict[str, int]:
        """A JSON-able form."""
        return asdict(self)


@dataclass(frozen=True)
class MaterialState:
    """A material now: its current version, its credibility, and usage of that version."""

    current: MaterialVersion
    ema: float
    outcomes: int
    denials: int  # denials since the last restore (quarantine counts these)
    usage: Usage = field(default_factory=Usage)
    pending: int | None = None  # a proposed edit waiting for review beside the current version

    @property
    def material_id(self) -> str:
        return self.current.material_id

    @property
    def status(self) -> str:
        return self.current.status

    @property
    def proposed_quarantine(self) -> str | None:
        """Why a quarantine was proposed (by the denial rule) and waits for a person to confirm
        or dismiss it, or None. The material stays in retrieval meanwhile; answers citing it go
        to review."""
        v = self.current
        if v.change == PROPOSE_QUARANTINE and v.status == "active":
            return v.reason or "quarantine proposed"
        return None


def provenance_from_metadata(metadata: Mapping[str, Any]) -> dict[str, Any]:
    """Registry fields read from LangChain document metadata through ``METADATA_KEYS``."""

    def first(name: str) -> Any:
        for key in METADATA_KEYS[name]:
            value = metadata.get(key)
            if value is not None and value != "":
                return value
        return None

    source_type = first("source_type")
    if source_type not in SOURCE_TYPES:
        source_type = "document"
    origin = first("origin_url")
    source = metadata.get("source")
    if origin is None and isinstance(source, str) and source.startswith(("http://", "https://")):
        origin = source
    page = first("page")
    return {
        "material_id": None if first("material_id") is None else str(first("material_id")),
        "title": None if first("title") is None else str(first("title")),
        "valid_from": iso(first("valid_from")),
        "valid_until": iso(first("valid_until")),
        "last_confirmed": iso(first("last_confirmed")),
        "supersedes": None if first("supersedes") is None else str(first("supersedes")),
        "superseded_by": None if first("superseded_by") is None else str(first("superseded_by")),
        "provenance": Provenance(
            source_type="document" if source_type == "inference" else source_type,
            document_id=None if first("document_id") is None else str(first("document_id")),
            section=None if first("section") is None else str(first("section")),
            page=None if page is None else str(page),
            origin_url=None if origin is None else str(origin),
        ),
    }


__all__ = [
    "METADATA_KEYS",
    "PROPOSE_QUARANTINE",
    "SOURCE_TYPES",
    "STATUSES",
    "USAGE_COUNTERS",
    "WITHHELD",
    "MaterialFields",
    "MaterialState",
    "MaterialVersion",
    "Provenance",
    "SourceType",
    "Status",
    "Usage",
    "content_hash",
    "expired",
    "iso",
    "now_iso",
    "parse_time",
    "provenance_from_metadata",
]
