"""The registry's records, errors and names: what its queries return and raise."""

from __future__ import annotations

import hashlib
import json
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from tracerag.materials._db import MaterialStoreError
from tracerag.materials._model import MaterialVersion

#: the audit-store request id that material changes are chained under
MATERIALS_LOG = "tracerag.materials"
CHANGE_KEY = "material_change"
FIRST_SIGHT_RULE = "rule:first-sight@1"
QUARANTINE_RULE = "rule:quarantine-after-denials@1"
ROLLBACK_RULE = "rule:rollback-batch@1"
SYSTEM = "tracerag"
DEFAULT_READ_RETENTION_DAYS = 30


class MaterialNotFound(MaterialStoreError, KeyError):
    """No material with this id is registered."""

    def __init__(self, material_id: str) -> None:
        super().__init__(material_id)
        self.material_id = material_id

    def __str__(self) -> str:
        return f"no material {self.material_id!r} in the registry"


class ConcurrentChange(MaterialStoreError):
    """The material changed since the version this write was based on."""


class InvalidTransition(MaterialStoreError, ValueError):
    """The status change is not allowed from the material's current status."""


def body_json(body: Mapping[str, Any]) -> str:
    """Deterministic JSON text of a version body."""
    return json.dumps(body, sort_keys=True, separators=(",", ":"), ensure_ascii=False)


def body_digest(body: Mapping[str, Any]) -> str:
    """The SHA-256 (hex) of a version body's deterministic JSON."""
    return hashlib.sha256(body_json(body).encode("utf-8")).hexdigest()


@dataclass(frozen=True)
class StoredVersion:
    """A version as stored, with its place in the audit chain."""

    version: MaterialVersion
    body_hash: str
    audit_seq: int | None
    audit_hash: str | None

    @property
    def sealed(self) -> bool:
        return self.audit_seq is not None


@dataclass(frozen=True)
class ReadHit:
    """One request that retrieved a material version."""

    request_id: str
    material_id: str
    version: int
    rank_before: int | None
    rank_after: int | None
    cited: bool
    decision: str | None
    created_at: str
    complained: bool = False


@dataclass(frozen=True)
class Use:
    """How one request used one material (for ``record_use``)."""

    material_id: str
    version: int | None = None
    content_hash: str | None = None
    rank_before: int | None = None
    rank_after: int | None = None
    cited: bool = False


@dataclass(frozen=True)
class ConflictRecord:
    """A stored conflict between two material versions."""

    conflict_id: str
    material_a: str
    version_a: int
    material_b: str
    version_b: int
    slot_key: str
    value_a: str
    value_b: str
    status: str
    created_at: str
    resolved_at: str | None = None
    resolution: str | None = None

    def to_dict(self) -> dict[str, Any]:
        """A JSON-able form."""
        return dict(self.__dict__)


@dataclass
class RollbackResult:
    """What ``rollback_batch`` did."""

    batch_id: str
    rollback_batch_id: str
    restored: list[str] = field(default_factory=list)
    deleted: list[str] = field(default_factory=list)
    skipped: dict[str, str] = field(default_factory=dict)  # material -> why not rolled back


@dataclass
class VerifyReport:
    """Registry tables checked against the hash chain."""

    checked: int = 0  # versions
    issues: list[str] = field(default_factory=list)
    materials: int = 0  # rows of ``materials`` re-derived from the chain
    events: int = 0  # chained registry events replayed
    verdicts: int = 0  # feedback verdicts checked against their entries
    #: why the tables could not be checked (writes kept landing between the reads), or None
    unsettled: str | None = None

    @property
    def ok(self) -> bool:
        return not self.issues

    @property
    def complete(self) -> bool:
        """Everything was checked (nothing found wrong is ``ok``; ``ok`` and not ``complete``:
        not checked)."""
        return self.unsettled is None

    def summary(self) -> str:
        """One line, or one line per issue."""
        if self.ok and self.unsettled:
            return f"materials NOT CHECKED: {self.unsettled}"
        if self.ok:
            return (
                f"materials OK: {self.checked} versions match their chained entries; "
                f"{self.materials} materials' columns re-derived from {self.events} chained "
                f"events; {self.verdicts} verdicts match theirs"
            )
        return "\n".join(
            [f"materials: {len(self.issues)} issue(s) in {self.checked} versions", *self.issues]
        )


def stored_version(row: Sequence[Any]) -> StoredVersion:
    return StoredVersion(
        MaterialVersion.from_body(json.loads(row[0])),
        str(row[1]),
        None if row[2] is None else int(row[2]),
        row[3],
    )


__all__ = [
    "CHANGE_KEY",
    "DEFAULT_READ_RETENTION_DAYS",
    "FIRST_SIGHT_RULE",
    "MATERIALS_LOG",
    "QUARANTINE_RULE",
    "ROLLBACK_RULE",
    "SYSTEM",
    "ConcurrentChange",
    "ConflictRecord",
    "InvalidTransition",
    "MaterialNotFound",
    "ReadHit",
    "RollbackResult",
    "StoredVersion",
    "Use",
    "VerifyReport",
    "body_digest",
    "body_json",
]
