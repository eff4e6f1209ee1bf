"""``MaterialRegistry``: every material's versions, usage, credibility and conflicts.

The registry lives in the audit store's database (SQLite or PostgreSQL), in tables of its own,
and every change to a material is also appended to the audit store's hash chain as a
``material_change`` entry under the material's id (the change with the full version body and
its hash, before and after, and the operator's identity with how it was established), so the
chain covers material changes and ``verify()`` checks the tables against it. Stores written
before that entry kind existed hold their changes as ``operator_action`` entries of the request
``MATERIALS_LOG``; those are verified where they are.

Every change is a new version recording who, when, before (``based_on``), after, why, the write
rule or model version (``written_by``) and the batch id; ``rollback_batch`` restores what a
batch changed. New and edited materials pass the write gate (``gate.WriteGate``). ``operator``
is an ``OperatorIdentity`` (``tracerag._identity``) or a bare name, recorded as ``declared``.

The registry is composed of its parts, each in its own module: ``Reads`` (queries and
figures), ``Versions`` (register / edit / observe) over the ``VersionWriter`` (commit with
conflict detection), ``Transitions`` (approve ... dismiss, rollback), ``Outcomes``
(credibility), ``UsageLog`` (read hits and feedback), the conflicts table and verification.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator, Sequence
from contextlib import contextmanager
from datetime import datetime
from typing import TYPE_CHECKING, Any

from tracerag.materials._baseline import chain_baseline
from tracerag.materials._batches import Batches
from tracerag.materials._chained_rows import identities_of
from tracerag.materials._commit import VersionWriter
from tracerag.materials._conflict_table import list_conflicts
from tracerag.materials._credibility import CredibilityPolicy
from tracerag.materials._db import RegistryDB, connect_like
from tracerag.materials._gate import WriteGate
from tracerag.materials._gauges import unwatch_registry, watch_registry
from tracerag.materials._model import MaterialFields, MaterialState, MaterialVersion, Usage
from tracerag.materials._operator import Operator, require_operator
from tracerag.materials._outcomes import Outcomes
from tracerag.materials._reads import Reads
from tracerag.materials._reconcile import chained_events, verify_registry
from tracerag.materials._records import (
    DEFAULT_READ_RETENTION_DAYS,
    SYSTEM,
    ConflictRecord,
    ReadHit,
    RollbackResult,
    StoredVersion,
    Use,
    VerifyReport,
)
from tracerag.materials._transitions import Transitions
from tracerag.materials._usage_log import UsageLog
from tracerag.materials._versions import Versions
from tracerag.store import open_store

if TYPE_CHECKING:
    from typing_extensions import Unpack

    from tracerag.materials._rerank import CredibilityRetriever


class MaterialRegistry:
    """Materials with a memory, in the audit store's database."""

    def __init__(
        self,
        store: Any,
        *,
        policy: CredibilityPolicy | None = None,
        gate: WriteGate | None = None,
        read_retention_days: int = DEFAULT_READ_RETENTION_DAYS,
        db: RegistryDB | None = None,
        owns_store: bool = False,
        metrics: bool = True,
        baseline: bool = True,
    ) -> None:
        self._store = store
        self._policy = policy or CredibilityPolicy()
        self._gate = gate or WriteGate()
        self._db = db or connect_like(store)
        self._owns_store = owns_store
        self._batches = Batches()
        self._reads = Reads(self._db, self._policy, metrics=metrics)
        self._usage = UsageLog(self._reads, read_retention_days=read_retention_days)
        self._writer = VersionWriter(
            store, self._reads, self._batches, policy=self._policy, gate=self._gate, metrics=metrics
        )
        self._versions = Versions(self._reads, self._writer, self._gate)
        self._transitions = Transitions(self._reads, self._writer, self._batches)
        #: credibility outcomes, for a caller that applies them inside its own chained
        #: transaction (``Outcomes.apply_in``; ``tracerag.materials.feedback`` does)
        self.outcomes = Outcomes(store, self._writer, self._policy)
        if baseline:
            chain_baseline(self._db, store)
        if metrics:  # its figures go to tracerag's meter (tracerag.materials._gauges)
            watch_registry(self)

    @classmethod
    def open(cls, url: str | None = None, **options: Any) -> MaterialRegistry:
        """Open the audit store at ``url`` (see ``open_store``) and the registry beside it."""
        return cls(open_store(url), owns_store=True, **options)

    def close(self) -> None:
        """Close the registry's connection (and the store, when the registry opened it)."""
        unwatch_registry(self)
        self.db.close()
        if self._owns_store:
            self.store.close()

    def __enter__(self) -> MaterialRegistry:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    # the parts share these, so they are read-only: a registry with another store, database,
    # policy or gate is another registry
    @property
    def store(self) -> Any:
        """The audit store whose chain covers the registry's changes."""
        return self._store

    @property
    def db(self) -> RegistryDB:
        """The registry's connection to its tables (in the store's database)."""
        return self._db

    @property
    def policy(self) -> CredibilityPolicy:
        """How credibility is scored and when a quarantine is proposed."""
        return self._policy

    @property
    def gate(self) -> WriteGate:
        """The write gate new and edited content passes."""
        return self._gate

    @property
    def read_retention_days(self) -> int:
        """How long read hits are kept (``purge_reads``), in days."""
        return self._usage.read_retention_days

    @contextmanager
    def batch(self, batch_id: str | None = None) -> Iterator[str]:
        """Writes inside carry one batch id (a new one unless given), so they roll back together."""
        with self._batches.scope(batch_id) as current:
            yield current

    # -- reading (Reads) ----------------------------------------------------------------------
    def get(self, material_id: str) -> MaterialState:
        """The material now; raises ``MaterialNotFound``."""
        return self._reads.get(material_id)

    def find(self, material_id: str) -> MaterialState | None:
        """The material now, or None."""
        return self._reads.find(material_id)

    def states(self, material_ids: Iterable[str]) -> dict[str, MaterialState]:
        """The current state of each registered id among ``material_ids``."""
        return self._reads.states(material_ids)

    def materials(self, status: str | None = None) -> list[MaterialState]:
        """Every material now, optionally of one status, by id."""
        return self._reads.materials(status)

    def pending(self) -> list[MaterialState]:
        """Writes waiting for review: pending new materials and proposed edits."""
        return self._reads.pending()

    def proposals(self) -> list[MaterialState]:
        """Materials whose quarantine the denial rule proposed, waiting for a person."""
        return self._reads.proposals()

    def history(self, material_id: str) -> list[StoredVersion]:
        """Every version of a material, oldest first."""
        return self._reads.history(material_id)

    def version(self, material_id: str, version: int) -> StoredVersion:
        """One version of a material."""
        return self._reads.version(material_id, version)

    def by_rule(self, rule: str) -> list[StoredVersion]:
        """Every version a write rule or model version wrote, oldest first."""
        return self._reads.by_rule(rule)

    def by_batch(self, batch_id: str) -> list[StoredVersion]:
        """Every version written in a batch, oldest first."""
        return self._reads.by_batch(batch_id)

    def version_for(self, material_id: str, text_hash: str | None = None) -> int | None:
        """The version whose content has this hash (latest such), else the current version."""
        return self._reads.version_for(material_id, text_hash)

    def credibility(self, state: MaterialState, now: datetime | None = None) -> float:
        """The material's credibility now: EMA × temporal confidence (0 when expired)."""
        return self._reads.credibility(state, now)

    def stats(self, now: datetime | None = None) -> dict[str, Any]:
        """Figures for metrics: materials by status, pending writes, open conflicts,
        quarantines (and proposed ones) and the credibility distribution (tenths) of active
        materials."""
        return self._reads.stats(now)

    # -- writing (Versions) -------------------------------------------------------------------
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
        return self._versions.register(
            material_id,
            content,
            operator=operator,
            written_by=written_by,
            reason=reason,
            source_snippet=source_snippet,
            batch_id=batch_id,
            gate=gate,
            hold=hold,
            **fields,
        )

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
        """Write a new version of a material with changed content or fields
        (``MaterialFields``).

        Changed content passes the write gate. A held edit of an active material waits for
        review beside the version in service (``MaterialState.pending``), which stays in
        service until the edit is approved.
        """
        return self._versions.edit(
            material_id,
            operator=operator,
            written_by=written_by,
            reason=reason,
            content=content,
            source_snippet=source_snippet,
            gate=gate,
            batch_id=batch_id,
            **fields,
        )

    def observe(self, documents: Iterable[Any], *, operator: Operator = SYSTEM) -> list[str]:
        """Register documents not seen before from their metadata (``METADATA_KEYS``).

        Returns the ids registered or re-versioned. A known id whose text changed at the source
        (since it was last seen there) gets a new version (``change="source_changed"``) with
        the material's status. First-sight writes are not gated (the knowledge base is the
        authority for its own documents) but their conflicts are recorded.
        """
        return self._versions.observe(documents, operator=operator)

    # -- transitions (Transitions) ------------------------------------------------------------
    def transition(
        self,
        material_id: str,
        action: str,
        *,
        operator: Operator,
        reason: str,
        written_by: str = "manual",
        batch_id: str | None = None,
    ) -> MaterialVersion:
        """approve / reject / quarantine / restore / delete / dismiss: a new version with the
        new status.

        ``approve`` and ``reject`` act on a proposed edit when one waits for review, else on a
        pending new material. ``quarantine`` of a material with a proposed quarantine confirms
        it; ``dismiss`` refuses the proposal (the material stays in service and its denial
        count starts again).
        """
        return self._transitions.apply(
            material_id,
            action,
            who=require_operator(operator),
            reason=reason,
            written_by=written_by,
            batch_id=batch_id,
        )

    def approve(self, material_id: str, *, operator: Operator, reason: str) -> MaterialVersion:
        """Make a pending write active (the explicit confirmation)."""
        return self.transition(material_id, "approve", operator=operator, reason=reason)

    def reject(self, material_id: str, *, operator: Operator, reason: str) -> MaterialVersion:
        """Refuse a pending write (it becomes deleted)."""
        return self.transition(material_id, "reject", operator=operator, reason=reason)

    def quarantine(self, material_id: str, *, operator: Operator, reason: str) -> MaterialVersion:
        """Take a material out of retrieval until a person restores it."""
        return self.transition(material_id, "quarantine", operator=operator, reason=reason)

    def restore(self, material_id: str, *, operator: Operator, reason: str) -> MaterialVersion:
        """Bring a quarantined material back (its denial count starts again)."""
        return self.transition(material_id, "restore", operator=operator, reason=reason)

    def delete(self, material_id: str, *, operator: Operator, reason: str) -> MaterialVersion:
        """Withdraw a material everywhere at once (its history is kept)."""
        return self.transition(material_id, "delete", operator=operator, reason=reason)

    def dismiss(self, material_id: str, *, operator: Operator, reason: str) -> MaterialVersion:
        """Refuse a proposed quarantine: the material stays in service, its denials restart."""
        return self.transition(material_id, "dismiss", operator=operator, reason=reason)

    def rollback_batch(
        self, batch_id: str, *, operator: Operator, reason: str, force: bool = False
    ) -> RollbackResult:
        """Restore every material a batch changed to its state before the batch.

        A material created in the batch is deleted. A material changed again after the batch is
        skipped (and reported) unless ``force``.
        """
        return self._transitions.rollback_batch(
            batch_id, who=require_operator(operator), reason=reason, force=force
        )

    # -- outcomes (Outcomes) ------------------------------------------------------------------
    def apply_outcome(
        self,
        material_id: str,
        verdict: str,
        *,
        weight: float = 1.0,
        version: int | None = None,
        counter: str | None = None,
        count_denial: bool = True,
        operator: Operator = SYSTEM,
    ) -> MaterialState:
        """Move a material's EMA toward a verdict's outcome, chained; propose its quarantine
        after N denials (``propose_quarantine``: a person confirms or dismisses it).

        ``count_denial=False`` moves the EMA without counting the denial toward quarantine.
        ``verdict`` is a key of ``credibility.OUTCOMES``; ``counter`` the usage counter to bump
        (``confirmations``, ``denials``, ``approvals``, ``edits``, ``rejections``).
        """
        self.outcomes.apply(
            material_id,
            verdict,
            weight=weight,
            version=version,
            counter=counter,
            count_denial=count_denial,
            identity=require_operator(operator),
        )
        return self.get(material_id)

    # -- usage (UsageLog) ---------------------------------------------------------------------
    def usage(self, material_id: str, version: int | None = None) -> Usage:
        """The usage counters of one version (the current one by default)."""
        return self._usage.usage(material_id, version)

    def record_use(
        self,
        request_id: str,
        uses: Sequence[Use],
        *,
        decision: str | None = None,
        at: str | None = None,
    ) -> int:
        """Log a request's read hits and count retrievals, citations and passed answers.

        Idempotent per request: a request already logged is not counted twice. Returns the
        number of read hits logged.
        """
        return self._usage.record_use(request_id, uses, decision=decision, at=at)

    def mark_complaint(self, request_id: str, verdict: str) -> None:
        """Keep a request's read hits past the retention period (it received a complaint)."""
        self._usage.mark_complaint(request_id, verdict)

    def feedback_for(self, request_id: str) -> list[dict[str, Any]]:
        """The feedback verdicts given on a request, oldest first."""
        return self._usage.feedback_for(request_id)

    def reads(
        self, material_id: str, version: int | None = None, limit: int = 1000
    ) -> list[ReadHit]:
        """The read hits of a material (one version, or all), newest first."""
        return self._usage.reads(material_id, version, limit)

    def reads_of_request(self, request_id: str) -> list[ReadHit]:
        """The read hits one request logged."""
        return self._usage.reads_of_request(request_id)

    def purge_reads(self, *, now: datetime | None = None, days: int | None = None) -> int:
        """Delete read hits older than the retention period, except complained-about requests."""
        return self._usage.purge_reads(now=now, days=days)

    # -- conflicts, verification, identities --------------------------------------------------
    def conflicts(
        self,
        status: str | None = "open",
        *,
        material_id: str | None = None,
        limit: int | None = None,
    ) -> list[ConflictRecord]:
        """Stored conflicts (open ones by default; of one material, or all), oldest first."""
        return list_conflicts(self.db, status, material_id=material_id, limit=limit)

    def verify(self) -> VerifyReport:
        """Check the registry's tables against the hash chain (see ``verify_registry``)."""
        return verify_registry(self.db, self.store)

    def identities(self, material_id: str) -> dict[int, dict[str, Any]]:
        """Per version of a material, who made the change and how that was established (from
        the chain; a change chained before identities were recorded is ``declared``)."""
        return identities_of(chained_events(self.store, material_id))

    # -- retrieval ----------------------------------------------------------------------------
    def govern(self, retriever: Any, **options: Any) -> CredibilityRetriever:
        """``retriever`` behind this registry (a ``CredibilityRetriever``): materials that are
        quarantined, deleted, pending review or expired are withheld on every call, the rest
        reranked by credibility, materials seen for the first time registered with their
        provenance. ``options``: ``CredibilityRetriever``'s (``k``, ``weights``, ``rerank``,
        ``register_unseen``)."""
        # imported here: the retriever brings LangChain's retriever and vector-store modules
        # (about half a second), which a registry opened by the CLI or the desk never needs
        from tracerag.materials._rerank import CredibilityRetriever

        return CredibilityRetriever(retriever=retriever, registry=self, **options)


__all__ = ["MaterialRegistry", "Operator"]
