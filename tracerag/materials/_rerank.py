"""Value-aware retrieval: withhold what must not be used, rank the rest by what it is worth.

``CredibilityRetriever`` wraps any LangChain retriever. On every call it

1. registers documents it has not seen (``MaterialRegistry.observe``);
2. drops every candidate whose material is ``pending_review``, ``quarantined`` or ``deleted``,
   or expired (its ``valid_until`` has passed, in the registry or, for a document the
   registry does not know, in its metadata) — the registry is read on every call, so a status
   change applies at once, whatever the wrapped retriever or any cache in front of it
   returns; a material whose quarantine is proposed stays, marked ``quarantine_proposed``
   (answers citing it go to review until a person confirms or dismisses the proposal);
3. orders the rest by ``similarity^ws × credibility^wc × recency^wr`` (``RerankWeights``;
   a weight of 0 leaves that factor out);
4. annotates copies of the documents (``metadata``: ``relevance_score`` (the similarity),
   ``rerank_score``, ``credibility``, ``recency``, ``rank_before``, ``rank_after``,
   ``material_version`` and the registry's ``valid_until`` / ``superseded_by``, so an expired
   material is stale to the verifier; a registered material's text is its version in
   service, so an edit made through the registry applies at once), and puts the ranks
   before and after on the current span (the retrieve stage's):
   ``tracerag.rerank.rank_before``, ``tracerag.rerank.rank_after``, ``tracerag.rerank.withheld``
   and ``tracerag.rerank.credibility`` (in ``rank_after`` order).

Similarity is the vector store's relevance score when the wrapped retriever is a
``VectorStoreRetriever``, else a score found in the metadata, else ``1 / rank``.

When the registry cannot be read (its database is down or unreachable), retrieval goes on with
the registry's state as last read by this retriever — a material it knew to be withheld stays
withheld — and says so: each document's ``registry_as_of`` metadata gives the time of that
state, the span gets ``tracerag.rerank.registry_unavailable``, and a warning is logged once per
outage. A first-sight registration that fails is logged and retried the next time the document
is seen.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from typing import Any

from langchain_core.callbacks import (
    AsyncCallbackManagerForRetrieverRun,
    CallbackManagerForRetrieverRun,
)
from langchain_core.documents import Document
from langchain_core.retrievers import BaseRetriever
from langchain_core.vectorstores import VectorStoreRetriever
from opentelemetry import trace
from pydantic import ConfigDict, PrivateAttr

from tracerag.errors import ConfigurationError
from tracerag.materials._credibility import CredibilityPolicy, age_days, temporal_confidence
from tracerag.materials._model import (
    WITHHELD,
    content_hash,
    expired,
    parse_time,
    provenance_from_metadata,
    utcnow,
)
from tracerag.signals._types import CONFLICTS_WITH, QUARANTINE_PROPOSED

SCORE_KEYS = ("relevance_score", "score", "_score", "similarity", "similarity_score")
SPAN_RANK_BEFORE = "tracerag.rerank.rank_before"
SPAN_RANK_AFTER = "tracerag.rerank.rank_after"
SPAN_WITHHELD = "tracerag.rerank.withheld"
SPAN_CREDIBILITY = "tracerag.rerank.credibility"
SPAN_UNAVAILABLE = "tracerag.rerank.registry_unavailable"
#: document metadata: when the registry state used for it was read (only when it is not now)
REGISTRY_AS_OF = "registry_as_of"

logger = logging.getLogger("tracerag.materials")


@dataclass(frozen=True)
class RerankWeights:
    """Exponents of the three factors, and how fast recency decays."""

    similarity: float = 1.0
    credibility: float = 1.0
    recency: float = 0.5
    recency_half_life_days: float = 365.0

    def __post_init__(self) -> None:
        if min(self.similarity, self.credibility, self.recency) < 0:
            raise ConfigurationError("weights must not be negative")


@dataclass(frozen=True)
class Ranked:
    """One candidate's factors and ranks."""

    material_id: str
    similarity: float
    credibility: float
    recency: float
    score: float
    rank_before: int
    rank_after: int = 0


def combined_score(similarity: float, cred: float, recency: float, w: RerankWeights) -> float:
    """``similarity^ws × credibility^wc × recency^wr`` (factors clipped to [0, 1])."""

    def f(x: float, weight: float) -> float:
        return 1.0 if weight == 0 else max(0.0, min(1.0, x)) ** weight

    return f(similarity, w.similarity) * f(cred, w.credibility) * f(recency, w.recency)


def _material_id(doc: Document) -> str:
    meta = doc.metadata or {}
    for key in ("id", "doc_id", "document_id", "uuid"):
        if meta.get(key):
            return str(meta[key])
    if getattr(doc, "id", None):
        return str(doc.id)
    return "doc-" + content_hash(doc.page_content)[:10]


class CredibilityRetriever(BaseRetriever):
    """A retriever wrapper that withholds unusable materials and reranks by value."""

    model_config = ConfigDict(arbitrary_types_allowed=True)

    retriever: BaseRetriever
    registry: Any  # MaterialRegistry
    weights: RerankWeights = RerankWeights()
    register_unseen: bool = True
    k: int | None = None
    rerank: bool = True  # False: withhold only, keep the wrapped retriever's order
    # the registry's state as last read: material id -> state, the open conflicts, and when
    _known: dict[str, Any] = PrivateAttr(default_factory=dict)
    _conflicts: list[Any] = PrivateAttr(default_factory=list)
    _read_at: str | None = PrivateAttr(default=None)
    _failing: bool = PrivateAttr(default=False)

    def _registry_view(
        self, docs: list[Document], ids: list[str]
    ) -> tuple[dict[str, Any], list[Any], str | None]:
        """``(states, open conflicts, as_of)``: read now (as_of None), else as last read."""
        if self.register_unseen:
            try:
                self.registry.observe(docs)
            except Exception as exc:  # registered the next time it is seen
                logger.info("first sight of retrieved materials not registered: %s", exc)
        try:
            states = self.registry.states(ids)
            conflicts = list(self.registry.conflicts())
        except Exception as exc:
            if not self._failing:
                logger.warning(
                    "the material registry cannot be read (%s: %s); retrieval withholds what it "
                    "knew to be withheld as of %s",
                    type(exc).__name__,
                    exc,
                    self._read_at or "never",
                )
            self._failing = True
            known = {i: self._known[i] for i in ids if i in self._known}
            return known, list(self._conflicts), self._read_at or "never"
        if self._failing:
            logger.warning("the material registry can be read again")
        self._failing = False
        self._known.update(states)
        for gone in [i for i in ids if i not in states]:
            self._known.pop(gone, None)
        self._conflicts = conflicts
        self._read_at = utcnow().isoformat(timespec="seconds")
        return states, conflicts, None

    def _pairs(self, query: str, run_manager: Any) -> list[tuple[Document, float | None]]:
        inner = self.retriever
        if isinstance(inner, VectorStoreRetriever) and inner.search_type == "similarity":
            try:
                pairs = inner.vectorstore.similarity_search_with_relevance_scores(
                    query, **inner.search_kwargs
                )
                return [(d, float(s)) for d, s in pairs]
            except NotImplementedError:
                pass
        docs = inner.invoke(query, config={"callbacks": run_manager.get_child()})
        return [(d, None) for d in docs]

    async def _apairs(self, query: str, run_manager: Any) -> list[tuple[Document, float | None]]:
        inner = self.retriever
        if isinstance(inner, VectorStoreRetriever) and inner.search_type == "similarity":
            try:
                pairs = await inner.vectorstore.asimilarity_search_with_relevance_scores(
                    query, **inner.search_kwargs
                )
                return [(d, float(s)) for d, s in pairs]
            except NotImplementedError:
                pass
        docs = await inner.ainvoke(query, config={"callbacks": run_manager.get_child()})
        return [(d, None) for d in docs]

    def _get_relevant_documents(
        self, query: str, *, run_manager: CallbackManagerForRetrieverRun
    ) -> list[Document]:
        return self.rank(self._pairs(query, run_manager))

    async def _aget_relevant_documents(
        self, query: str, *, run_manager: AsyncCallbackManagerForRetrieverRun
    ) -> list[Document]:
        return self.rank(await self._apairs(query, run_manager))

    def rank(self, pairs: list[tuple[Document, float | None]]) -> list[Document]:
        """Withhold, score and order candidates; annotated copies, best first."""
        ids = [_material_id(d) for d, _ in pairs]
        states, open_conflicts, as_of = self._registry_view([d for d, _ in pairs], ids)
        conflicts: dict[str, list[str]] = {}
        for c in open_conflicts:  # open ones: answers citing either side go to review
            conflicts.setdefault(c.material_a, []).append(f"{c.material_b} ({c.slot_key})")
            conflicts.setdefault(c.material_b, []).append(f"{c.material_a} ({c.slot_key})")
        now = utcnow()
        policy: CredibilityPolicy = self.registry.policy
        ranked: list[tuple[Ranked, Document]] = []
        withheld: list[str] = []
        for i, ((doc, score), mid) in enumerate(zip(pairs, ids, strict=True), 1):
            state = states.get(mid)
            if state is not None and (state.status in WITHHELD or state.current.expired(now)):
                withheld.append(mid)
                continue
            if state is None and expired(
                provenance_from_metadata(dict(doc.metadata or {}))["valid_until"], now
            ):
                withheld.append(mid)
                continue
            if score is None:
                score = next(
                    (
                        float(doc.metadata[k])
                        for k in SCORE_KEYS
                        if isinstance((doc.metadata or {}).get(k), (int, float))
                    ),
                    None,
                )
            similarity = score if score is not None else 1.0 / i
            if state is None:
                cred, recency = policy.prior, 1.0
            else:
                cred = self.registry.credibility(state, now)
                v = state.current
                born = parse_time(v.valid_from) or parse_time(v.created_at)
                recency = temporal_confidence(
                    age_days(born, now),
                    CredibilityPolicy(half_life_days=self.weights.recency_half_life_days),
                )
            r = Ranked(
                mid,
                similarity,
                cred,
                recency,
                combined_score(similarity, cred, recency, self.weights),
                i,
            )
            meta = dict(doc.metadata or {})
            meta.setdefault("id", mid)  # the retrieve stage names materials by metadata id
            if score is not None:
                meta.setdefault("relevance_score", score)
            if conflicts.get(mid):
                meta[CONFLICTS_WITH] = sorted(conflicts[mid])
            if as_of is not None:
                meta[REGISTRY_AS_OF] = as_of
            if state is not None and state.proposed_quarantine:
                meta[QUARANTINE_PROPOSED] = state.proposed_quarantine
            if state is not None:
                meta["material_version"] = state.current.version
                for key in ("valid_until", "superseded_by"):
                    value = getattr(state.current, key)
                    if value and not meta.get(key):
                        meta[key] = value
            text = doc.page_content
            if state is not None and state.current.content != text:
                text = state.current.content  # an edit made through the registry
            ranked.append((r, Document(page_content=text, metadata=meta, id=doc.id)))
        if self.rerank:
            ranked.sort(key=lambda pair: (-pair[0].score, pair[0].rank_before))
        if self.k:
            ranked = ranked[: self.k]
        out = []
        for n, (r, doc) in enumerate(ranked, 1):
            doc.metadata.update(
                {
                    "rerank_score": round(r.score, 6),
                    "credibility": round(r.credibility, 6),
                    "recency": round(r.recency, 6),
                    "rank_before": r.rank_before,
                    "rank_after": n,
                }
            )
            out.append(doc)
        span = trace.get_current_span()
        if span.is_recording():
            span.set_attribute(SPAN_RANK_BEFORE, ids)
            span.set_attribute(SPAN_RANK_AFTER, [_material_id(d) for d in out])
            span.set_attribute(SPAN_WITHHELD, withheld)
            span.set_attribute(SPAN_CREDIBILITY, [d.metadata["credibility"] for d in out])
            if as_of is not None:
                span.set_attribute(SPAN_UNAVAILABLE, True)
        return out


__all__ = [
    "REGISTRY_AS_OF",
    "CredibilityRetriever",
    "Ranked",
    "RerankWeights",
    "combined_score",
]
