"""New versions through the write gate: ``register`` a material, ``edit`` it, ``observe``
documents retrieval returned.

Changed content passes the write gate (``gate.WriteGate``); a held write waits for review. Each
version is committed by the ``VersionWriter``.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import replace
from typing import TYPE_CHECKING, Any

from tracerag._choices import check_options
from tracerag.errors import InputError
from tracerag.materials._commit import VersionWriter
from tracerag.materials._conflict_table import active_texts
from tracerag.materials._db import MaterialStoreError
from tracerag.materials._gate import GateVerdict, WriteGate
from tracerag.materials._model import (
    MaterialFields,
    MaterialVersion,
    content_hash,
    provenance_from_metadata,
)
from tracerag.materials._operator import Operator, require_operator
from tracerag.materials._reads import Reads
from tracerag.materials._records import FIRST_SIGHT_RULE, SYSTEM, ConcurrentChange

if TYPE_CHECKING:
    from typing_extensions import Unpack


class Versions:
    """The registry's write door: new materials, edits and first sights, gated by ``gate``."""

    def __init__(self, reads: Reads, writer: VersionWriter, gate: WriteGate) -> None:
        self._reads = reads
        self._writer = writer
        self._gate = gate

    def register(
        self,
        material_id: str,
        content: str,
        *,
        operator: Operator,
        written_by: str,
        reason: str | None = None,
        source_snippet: str = "",
        batch_id: str | None = None,
        gate: bool = True,
        hold: bool = False,
        **fields: Unpack[MaterialFields],
    ) -> MaterialVersion:
        """Write a new material through the write gate (``hold`` sends it to review anyway);
        ``fields``: its provenance, title and validity (``MaterialFields``)."""
        check_options("register", fields, MaterialFields.__optional_keys__)
        who = require_operator(operator)
        existing = self._reads.find(material_id)
        if existing is not None:
            raise MaterialStoreError(
                f"material {material_id!r} exists (version {existing.current.version}); use edit"
            )
        if fields.get("provenance") is None:  # an explicit None means "not given", as before
            fields.pop("provenance", None)
        v = MaterialVersion(
            material_id=material_id,
            version=1,
            content=content,
            written_by=written_by,
            source_snippet=source_snippet,
            operator=who.name,
            change="create",
            reason=reason,
            batch_id=batch_id,
            **fields,
        )
        status, verdict = self.judge(v) if gate else ("active", None)
        if hold:
            status = "pending_review"
        return self._writer.commit(
            replace(v, status=status, gate=verdict.to_dict() if verdict else None),
            expect_current=None,
            identity=who,
        )

    def judge(self, v: MaterialVersion) -> tuple[str, GateVerdict]:
        """The write gate's verdict on a version's content, among the materials in service."""
        active = [(mid, text) for mid, text, _ver in active_texts(self._reads.db, v.material_id)]
        verdict = self._gate.check(v.content, material_id=v.material_id, active=active)
        return verdict.status, verdict

    def edit(
        self,
        material_id: str,
        *,
        operator: Operator,
        written_by: str,
        reason: str,
        content: str | None = None,
        source_snippet: str = "",
        gate: bool = True,
        batch_id: str | None = None,
        **fields: Unpack[MaterialFields],
    ) -> MaterialVersion:
        """A new version with changed content (gated) or fields; a held edit of an active
        material waits for review beside the version in service (``MaterialRegistry.edit``)."""
        check_options("edit", fields, MaterialFields.__optional_keys__)
        who = require_operator(operator)
        if not reason or not reason.strip():
            raise InputError("an edit needs a reason")
        state = self._reads.get(material_id)
        if state.pending is not None:
            raise ConcurrentChange(
                f"an edit of {material_id!r} (version {state.pending}) is waiting for review"
            )
        changes: dict[str, Any] = dict(fields)
        if content is not None and content != state.current.content:
            changes["content"] = content
            changes["source_snippet"] = source_snippet or content
        v = state.current.next_change(
            operator=who.name,
            written_by=written_by,
            reason=reason,
            change="edit",
            batch_id=batch_id,
            **changes,
        )
        status, verdict = self.judge(v) if gate and "content" in changes else (state.status, None)
        gate_body = verdict.to_dict() if verdict else None
        if status == "pending_review" and state.status == "active":
            return self._writer.commit(
                replace(v, status="pending_review", gate=gate_body),
                expect_current=state.current.version,
                make_current=False,
                pending="set",
                identity=who,
            )
        if status == "active":
            status = state.status
        return self._writer.commit(
            replace(v, status=status, gate=gate_body),
            expect_current=state.current.version,
            identity=who,
        )

    def observe(self, documents: Iterable[Any], *, operator: Operator = SYSTEM) -> list[str]:
        """Register documents not seen before, re-version those whose text changed at the
        source; the ids written (``MaterialRegistry.observe``)."""
        who = require_operator(operator)
        items = [_sighting(doc) for doc in documents]
        seen = self._reads.seen_hashes([mid for mid, _t, _f in items])
        written = []
        for material_id, text, fields in items:
            if seen.get(material_id) == content_hash(text):
                continue  # the common case: known, unchanged at the source
            state = self._reads.find(material_id)
            provenance = fields.pop("provenance")
            try:
                if state is None:
                    self.register(
                        material_id,
                        text,
                        operator=who,
                        written_by=FIRST_SIGHT_RULE,
                        provenance=provenance,
                        reason="first seen in retrieval",
                        gate=False,
                        **fields,
                    )
                else:
                    v = state.current.next_change(
                        content=text,
                        operator=who.name,
                        written_by=FIRST_SIGHT_RULE,
                        reason="text changed at the source",
                        change="source_changed",
                        provenance=provenance,
                        **fields,
                    )
                    self._writer.commit(v, expect_current=state.current.version, identity=who)
            except (ConcurrentChange, MaterialStoreError):
                continue  # another process registered or changed it first
            written.append(material_id)
        return written


def _sighting(doc: Any) -> tuple[str, str, dict[str, Any]]:
    """A retrieved document as ``(material_id, text, fields)``: its id from its metadata, its
    ``id``, else its text's hash; ``fields``: the provenance its metadata gives."""
    text = str(getattr(doc, "page_content", "") or "")
    fields = provenance_from_metadata(dict(getattr(doc, "metadata", None) or {}))
    material_id = fields.pop("material_id") or getattr(doc, "id", None)
    if not material_id:
        material_id = "doc-" + content_hash(text)[:10]
    return str(material_id), text, fields


__all__ = ["Versions"]
