"""The reranking retriever: withheld materials are never retrieved again (caches included),
and candidates are ordered by similarity × credibility × recency."""

from __future__ import annotations

from typing import Any

import pytest
from langchain_core.callbacks import CallbackManagerForRetrieverRun
from langchain_core.documents import Document
from langchain_core.retrievers import BaseRetriever

from tracerag.materials import MaterialRegistry
from tracerag.materials._rerank import (
    SPAN_CREDIBILITY,
    SPAN_RANK_AFTER,
    SPAN_RANK_BEFORE,
    SPAN_WITHHELD,
    CredibilityRetriever,
    RerankWeights,
    combined_score,
)
from tracerag.testing import SpanCapture, iter_attrs

QUESTION = "How many days do I have to return an item?"


class CachingRetriever(BaseRetriever):
    """Answers each query once from the wrapped retriever, then from its cache."""

    inner: BaseRetriever
    cache: dict[str, list[Document]]
    calls: int = 0

    def _get_relevant_documents(
        self, query: str, *, run_manager: CallbackManagerForRetrieverRun
    ) -> list[Document]:
        self.calls += 1
        if query not in self.cache:
            self.cache[query] = self.inner.invoke(query)
        return self.cache[query]


def ids(docs: list[Document]) -> list[str]:
    return [d.metadata["id"] for d in docs]


@pytest.mark.parametrize("action", ["delete", "quarantine"])
def test_withheld_material_is_never_retrieved_again(
    registry: MaterialRegistry,
    retriever: Any,
    action: str,
) -> None:
    wrapped = CredibilityRetriever(retriever=retriever, registry=registry)
    cached = CredibilityRetriever(
        retriever=CachingRetriever(inner=retriever, cache={}), registry=registry
    )
    first = wrapped.invoke(QUESTION)
    assert "returns" in ids(first) and "returns" in ids(cached.invoke(QUESTION))
    getattr(registry, action)("returns", operator="lead", reason="wrong return window")
    for _ in range(3):
        assert "returns" not in ids(wrapped.invoke(QUESTION))
        assert "returns" not in ids(cached.invoke(QUESTION))  # the cache still holds it
    assert cached.retriever.cache[QUESTION] and "returns" in ids(cached.retriever.cache[QUESTION])
    # a second registry on the same database (another process) sees the change at once
    other = MaterialRegistry(registry.store)
    try:
        again = CredibilityRetriever(retriever=retriever, registry=other)
        assert "returns" not in ids(again.invoke(QUESTION))
    finally:
        other.db.close()


async def test_pending_writes_are_not_retrieved_async(
    registry: MaterialRegistry,
    retriever: Any,
) -> None:
    wrapped = CredibilityRetriever(retriever=retriever, registry=registry)
    await wrapped.ainvoke(QUESTION)  # registers what it sees
    registry.edit(
        "returns",
        content="Maybe returns are accepted within 60 days?",
        operator="agent",
        written_by="memory@1",
        reason="chat memory",
    )
    # the hedged edit waits for review; the version in service stays in service
    state = registry.get("returns")
    assert state.status == "active" and state.pending == 2 and state.current.version == 1
    docs = await wrapped.ainvoke(QUESTION)
    served = next(d for d in docs if d.metadata["id"] == "returns")
    assert "60 days" not in served.page_content and served.metadata["material_version"] == 1
    registry.quarantine("returns", operator="lead", reason="hold")
    assert "returns" not in ids(await wrapped.ainvoke(QUESTION))


def test_approved_edit_is_served_in_place_of_the_source_text(
    registry: MaterialRegistry,
    retriever: Any,
) -> None:
    wrapped = CredibilityRetriever(retriever=retriever, registry=registry)
    wrapped.invoke(QUESTION)
    fixed = "Customers may return unused items within 45 days of delivery for a full refund."
    registry.edit(
        "returns",
        content=fixed,
        operator="lead",
        written_by="manual",
        reason="policy change",
        gate=False,
    )
    for _ in range(2):  # and the unchanged source text does not undo the edit
        served = next(d for d in wrapped.invoke(QUESTION) if d.metadata["id"] == "returns")
        assert served.page_content == fixed and served.metadata["material_version"] == 2
    assert len(registry.history("returns")) == 2


def test_credibility_reorders_and_ranks_are_recorded(
    registry: MaterialRegistry,
    retriever: Any,
) -> None:
    spans = SpanCapture()
    tracer = spans.provider.get_tracer("test")
    # a question two active materials match (the expired 2019 edition is withheld)
    question = "return refund days warranty membership"
    plain = CredibilityRetriever(retriever=retriever, registry=registry, rerank=False)
    before = ids(plain.invoke(question))
    top = before[0]
    for _ in range(2):
        registry.apply_outcome(top, "deny", weight=1.0)
    for other in before[1:]:
        registry.apply_outcome(other, "confirm", weight=1.0)
    wrapped = CredibilityRetriever(
        retriever=retriever, registry=registry, weights=RerankWeights(credibility=3, recency=0)
    )
    with tracer.start_as_current_span("retrieve"):
        docs = wrapped.invoke(question)
    after = ids(docs)
    assert sorted(after) == sorted(before) and after[0] != top
    assert [d.metadata["rank_after"] for d in docs] == list(range(1, len(docs) + 1))
    moved = next(d for d in docs if d.metadata["id"] == top)
    assert moved.metadata["rank_before"] == 1 and moved.metadata["rank_after"] > 1
    for d in docs:
        m = d.metadata
        assert m["rerank_score"] == pytest.approx(
            combined_score(m["relevance_score"], m["credibility"], 1.0, wrapped.weights),
            abs=1e-5,
        )
    ranked_before = next(iter_attrs(spans.spans(), SPAN_RANK_BEFORE))
    withheld = next(iter_attrs(spans.spans(), SPAN_WITHHELD))
    assert withheld == ("returns-2019",)  # expired: withheld, listed on the span
    assert tuple(i for i in ranked_before if i not in withheld) == tuple(before)
    assert next(iter_attrs(spans.spans(), SPAN_RANK_AFTER)) == tuple(after)
    assert next(iter_attrs(spans.spans(), SPAN_CREDIBILITY)) == tuple(
        d.metadata["credibility"] for d in docs
    )


def test_expired_materials_are_withheld_and_superseded_ones_marked_for_the_verifier(
    registry: MaterialRegistry,
    retriever: Any,
) -> None:
    first = CredibilityRetriever(retriever=retriever, registry=registry).invoke(QUESTION)
    assert "returns-2019" not in ids(first)  # its metadata says valid until 2020-12-31
    registry.edit(
        "returns",
        operator="lead",
        written_by="manual",
        reason="policy ends",
        valid_until="2021-01-01",
    )
    docs = CredibilityRetriever(retriever=retriever, registry=registry).invoke(QUESTION)
    assert "returns" not in ids(docs)  # expired in the registry: withheld
    # a document the registry does not know is judged by its own metadata
    unregistered = CredibilityRetriever(
        retriever=retriever, registry=registry, register_unseen=False
    )
    registry.edit(
        "returns",
        operator="lead",
        written_by="manual",
        reason="still in force, replaced later",
        valid_until="2999-01-01",
        superseded_by="returns-2030",
    )
    docs = unregistered.invoke(QUESTION)
    assert "returns-2019" not in ids(docs)
    returns = next(d for d in docs if d.metadata["id"] == "returns")
    assert returns.metadata["superseded_by"] == "returns-2030"
    from tracerag.signals._types import Material

    assert Material("returns", "", metadata=returns.metadata).stale_reason() is not None


def test_combined_score_weights() -> None:
    w = RerankWeights(similarity=1, credibility=2, recency=0)
    assert combined_score(0.8, 0.5, 0.1, w) == pytest.approx(0.8 * 0.25)
    assert combined_score(1.2, -1, 0.5, RerankWeights()) == 0.0
    with pytest.raises(ValueError):
        RerankWeights(credibility=-1)


def test_an_unreadable_registry_keeps_what_it_knew_withheld_and_says_so(
    registry: MaterialRegistry, retriever: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The registry's database goes away: retrieval goes on with the state last read — the
    quarantined material stays out — and every document says how old that state is."""
    import sqlite3

    from tracerag.materials._rerank import REGISTRY_AS_OF, SPAN_UNAVAILABLE

    wrapped = CredibilityRetriever(retriever=retriever, registry=registry)
    registry.observe(retriever.invoke(QUESTION))
    registry.quarantine("returns", operator="lead", reason="wrong")
    first = wrapped.invoke(QUESTION)
    assert "returns" not in ids(first) and all(REGISTRY_AS_OF not in d.metadata for d in first)

    def down(*_a: Any, **_k: Any) -> Any:
        raise sqlite3.OperationalError("unable to open database file")

    monkeypatch.setattr(registry, "states", down)
    monkeypatch.setattr(registry, "observe", down)
    spans = SpanCapture()
    with spans.provider.get_tracer("test").start_as_current_span("retrieve"):
        docs = wrapped.invoke(QUESTION)
    assert "returns" not in ids(docs) and docs
    assert all(d.metadata[REGISTRY_AS_OF] for d in docs)
    assert next(iter_attrs(spans.spans(), SPAN_UNAVAILABLE)) is True
    # a retriever that never read the registry says so too
    fresh = CredibilityRetriever(retriever=retriever, registry=registry).invoke(QUESTION)
    assert {d.metadata[REGISTRY_AS_OF] for d in fresh} == {"never"}
