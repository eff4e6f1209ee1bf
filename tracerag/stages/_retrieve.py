"""Stage 2, retrieve: call the retriever once and record every material.

These materials are the only ones later stages may cite. A material's id comes from its
document metadata ``id``, else LangChain's ``Document.id`` (set by most vector stores), else a
stable content hash; its title comes from metadata only; its score is the retriever's relevance
score where it gives one (vector-store retrievers), else recorded as absent.
"""

from __future__ import annotations

import hashlib
from typing import Any

from langchain_core.documents import Document
from langchain_core.retrievers import BaseRetriever
from langchain_core.runnables import RunnableConfig
from langchain_core.vectorstores import VectorStoreRetriever
from opentelemetry.trace import Span

from tracerag._declare import stamp
from tracerag._llm import record_retry, retry_call
from tracerag._settings import Settings
from tracerag._state import ErrorLog, RequestState, Retrieval
from tracerag.errors import ConfigurationError
from tracerag.signals._types import Material
from tracerag.telemetry._spans import data_source_of, describe_retrieval, set_span_io, top_k_of
from tracerag.text._unicode import fix_surrogates

SCORE_KEYS = ("relevance_score", "score", "_score", "similarity", "similarity_score")


def content_id(text: str) -> str:
    """A stable id for a document without one: a short hash of its text."""
    return "doc-" + hashlib.sha256(text.encode("utf-8")).hexdigest()[:10]


def to_materials(
    pairs: list[tuple[Document, float | None]], *, first_rank: int = 1
) -> tuple[Material, ...]:
    """Materials from documents in retrieved order; duplicate ids are made unique.

    Lone UTF-16 surrogates in a document's text and metadata become U+FFFD.
    """
    materials: list[Material] = []
    seen: dict[str, str] = {}
    for doc, score in pairs:
        meta = {_clean(k): _clean(v) for k, v in (doc.metadata or {}).items()}
        text = fix_surrogates(doc.page_content)
        material_id = fix_surrogates(str(meta.get("id") or doc.id or content_id(text)).strip())
        if material_id in seen:
            if seen[material_id] == text:
                continue  # the same document retrieved twice
            material_id = f"{material_id}#{sum(1 for k in seen if k.startswith(material_id)) + 1}"
        seen[material_id] = text
        if score is None:
            score = next((float(meta[k]) for k in SCORE_KEYS if _is_number(meta.get(k))), None)
        materials.append(
            Material(
                id=material_id,
                text=text,
                title=fix_surrogates(str(meta.get("title") or meta.get("name") or "")),
                source=None if meta.get("source") is None else fix_surrogates(str(meta["source"])),
                score=score,
                rank=first_rank + len(materials),
                metadata=meta,
            )
        )
    return tuple(materials)


def _clean(value: Any) -> Any:
    """A metadata value with lone surrogates in its strings replaced by U+FFFD."""
    if isinstance(value, str):
        return fix_surrogates(value)
    if isinstance(value, dict):
        return {_clean(k): _clean(v) for k, v in value.items()}
    if type(value) in (list, tuple):
        return type(value)(_clean(v) for v in value)
    return value


def _is_number(value: Any) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool)


async def fetch(
    retriever: BaseRetriever, query: str, config: RunnableConfig | None = None
) -> list[tuple[Document, float | None]]:
    """Documents with relevance scores where the retriever can give them."""
    if isinstance(retriever, VectorStoreRetriever) and retriever.search_type in {
        "similarity",
        "similarity_score_threshold",
    }:
        kwargs = dict(retriever.search_kwargs)
        store = retriever.vectorstore
        try:
            pairs = await store.asimilarity_search_with_relevance_scores(query, **kwargs)
            return [(doc, float(score)) for doc, score in pairs]
        except NotImplementedError:
            # a store without a relevance function: fall back to plain retrieval, unscored
            pass
    docs = await retriever.ainvoke(query, config=config)
    return [(doc, None) for doc in docs]


async def retrieve(
    state: RequestState, settings: Settings, span: Span, config: RunnableConfig | None = None
) -> Retrieval:
    """Retrieve materials for the question and record them with their scores and margin."""
    if settings.retriever is None:
        raise ConfigurationError("the retrieve stage needs a retriever")
    errors = ErrorLog()
    on_retry = record_retry(errors, span, "retrieve", settings.meter_provider)

    pairs: list[tuple[Document, float | None]] = []
    try:
        retriever = settings.retriever
        pairs = await retry_call(
            lambda: fetch(retriever, state.standalone_question, config),
            settings.retry,
            on_retry=on_retry,
            calls="retriever",
        )
    except Exception as exc:  # no materials: the answer cannot verify and will be escalated
        errors.record_error("retrieve", exc, final=True)
        span.record_exception(exc)
        pairs = []
    if settings.k:
        pairs = pairs[: settings.k]
    retrieval = Retrieval.of(
        to_materials(pairs), errors=errors.freeze(), shape=settings.retrieval_shape
    )
    record_materials(retrieval, span)
    set_span_io(span, input=state.standalone_question)
    describe_retrieval(
        span,
        data_source_of(settings.retriever),
        settings.k or top_k_of(settings.retriever),
        [(m.id, m.score, m.text) for m in retrieval.materials],
    )
    return retrieval


def record_materials(retrieval: Retrieval, span: Span) -> None:
    """Put the materials and retrieval signals on the span (``Retrieval.SIGNALS``)."""
    stamp(span, retrieval)
