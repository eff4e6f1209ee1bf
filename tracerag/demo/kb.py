"""The bundled demo knowledge base: Northwind Gadgets (北风数码), a fictional electronics retailer.

33 short policy documents (about a third in Chinese), three of them outdated editions that sit
next to the edition that replaced them. ``build_retriever`` puts them in a real LangChain
``InMemoryVectorStore`` with ``HashingEmbeddings``, a small deterministic embedding that needs no
model weights and no network.
"""

from __future__ import annotations

import hashlib
import json
import math
from collections import Counter
from collections.abc import Callable, Iterable, Sequence
from functools import lru_cache
from importlib import resources
from typing import Any

import numpy as np
from langchain_core.documents import Document
from langchain_core.embeddings import Embeddings
from langchain_core.vectorstores import InMemoryVectorStore, VectorStoreRetriever

try:  # the function InMemoryVectorStore scores with (private: searches fall back without it)
    from langchain_core.vectorstores.utils import _cosine_similarity
except ImportError:  # pragma: no cover - another langchain-core
    _cosine_similarity = None  # type: ignore[assignment]

from tracerag.text._words import content_terms

__all__ = [
    "DemoVectorStore",
    "HashingEmbeddings",
    "build_retriever",
    "build_vectorstore",
    "load_documents",
    "load_questions",
]

KB_FILE = "knowledge_base.jsonl"
QUESTIONS_FILE = "questions.json"


def _read_text(name: str) -> str:
    return resources.files("tracerag.demo").joinpath(name).read_text(encoding="utf-8")


@lru_cache(maxsize=1)
def _records() -> tuple[dict[str, Any], ...]:
    rows = []
    for line in _read_text(KB_FILE).splitlines():
        if line.strip():
            rows.append(json.loads(line))
    return tuple(rows)


def load_documents() -> list[Document]:
    """The demo knowledge base as LangChain Documents.

    ``page_content`` is the policy text; ``metadata`` holds ``id``, ``title``, ``source``,
    ``effective_from`` and, for outdated editions, ``superseded_by`` and ``valid_until``.
    Each Document's own ``id`` is the same as ``metadata["id"]``.
    """
    docs = []
    for row in _records():
        meta = {k: v for k, v in row.items() if k != "text"}
        docs.append(Document(id=row["id"], page_content=row["text"], metadata=meta))
    return docs


def load_questions() -> list[dict[str, Any]]:
    """The demo questions with their intended outcome (``expect``) and the reason (``why``)."""
    data = json.loads(_read_text(QUESTIONS_FILE))
    return list(data["questions"] if isinstance(data, dict) else data)


class HashingEmbeddings(Embeddings):
    """A deterministic hashing-trick embedding over ``tracerag.text.content_terms``.

    Each text becomes a bag of content terms (English words, Chinese character bigrams),
    weighted ``1 + log(tf)`` and, when ``idf`` is given, by that term's inverse document
    frequency; terms are hashed into ``dim`` buckets with a sign bit and the vector is
    L2-normalised. It is lexical matching in vector form, not a semantic model: synonyms and
    paraphrases do not match.
    """

    def __init__(self, dim: int = 1024, idf: dict[str, float] | None = None) -> None:
        self.dim = dim
        self.idf = dict(idf or {})
        self._default_idf = max(self.idf.values()) if self.idf else 1.0
        # the same texts (the documents, repeated questions) come back: their vectors are kept
        self._vector = lru_cache(maxsize=4096)(self._compute)

    @classmethod
    def fit(cls, texts: Iterable[str], dim: int = 1024) -> HashingEmbeddings:
        """An embedding whose term weights are the smoothed IDF over ``texts``."""
        texts = list(texts)
        df: Counter[str] = Counter()
        for text in texts:
            df.update(set(content_terms(text)))
        n = len(texts)
        idf = {t: math.log((1 + n) / (1 + c)) + 1.0 for t, c in df.items()}
        return cls(dim=dim, idf=idf)

    def _bucket(self, term: str) -> tuple[int, float]:
        digest = hashlib.blake2b(term.encode("utf-8"), digest_size=8).digest()
        value = int.from_bytes(digest, "big")
        return value % self.dim, (1.0 if (value >> 63) & 1 else -1.0)

    def embed_text(self, text: str) -> list[float]:
        """The normalised vector of one text (all zeros when it has no content terms)."""
        return list(self._vector(text))

    def _compute(self, text: str) -> tuple[float, ...]:
        vec = [0.0] * self.dim
        for term, tf in Counter(content_terms(text)).items():
            index, sign = self._bucket(term)
            weight = (1.0 + math.log(tf)) * self.idf.get(term, self._default_idf)
            vec[index] += sign * weight
        norm = math.sqrt(sum(v * v for v in vec))
        return tuple(v / norm for v in vec) if norm else tuple(vec)

    def embed_documents(self, texts: list[str]) -> list[list[float]]:
        """Vectors for documents."""
        return [self.embed_text(t) for t in texts]

    def embed_query(self, text: str) -> list[float]:
        """The vector for a query."""
        return self.embed_text(text)


class DemoVectorStore(InMemoryVectorStore):
    """``InMemoryVectorStore`` that also reports relevance scores.

    ``InMemoryVectorStore`` scores by cosine similarity but does not say how to turn that into
    a relevance score, so ``similarity_search_with_relevance_scores`` raises there. Here the
    relevance score is the cosine similarity clamped to ``[0, 1]``.
    """

    def __init__(self, embedding: Embeddings) -> None:
        super().__init__(embedding)
        # the stored vectors, and the matrix made of them
        self._matrix: tuple[list[list[float]], Any] = ([], None)

    def _select_relevance_score_fn(self) -> Callable[[float], float]:
        return _clamp01

    def _similarity_search_with_score_by_vector(
        self,
        embedding: list[float],
        k: int = 4,
        filter: Callable[[Document], bool] | None = None,
    ) -> list[tuple[Document, float, list[float]]]:
        """The ``k`` stored documents nearest ``embedding`` with their scores and vectors,
        found and scored as ``InMemoryVectorStore`` does."""
        if filter is not None or _cosine_similarity is None:
            return super()._similarity_search_with_score_by_vector(embedding, k, filter)
        docs = list(self.store.values())
        if not docs:
            return []
        # the stored vectors become one array when they change, not for every query (that
        # conversion was nine tenths of a search over the demo documents)
        rows = [doc["vector"] for doc in docs]
        made_of, matrix = self._matrix
        if len(rows) != len(made_of) or any(a is not b for a, b in zip(rows, made_of, strict=True)):
            matrix = np.array(rows)
            self._matrix = (rows, matrix)
        similarity = _cosine_similarity([embedding], matrix)[0]
        return [
            (
                Document(id=doc["id"], page_content=doc["text"], metadata=doc["metadata"]),
                float(similarity[i].item()),
                doc["vector"],
            )
            for i in similarity.argsort()[::-1][:k]
            if (doc := docs[i])
        ]


def _clamp01(score: float) -> float:
    return max(0.0, min(1.0, float(score)))


def build_vectorstore(documents: Sequence[Document] | None = None) -> DemoVectorStore:
    """A vector store over the demo documents (or the given ones), embedded offline."""
    if documents is None:
        docs = load_documents()
        embedding = _demo_embedding()
    else:
        docs = list(documents)
        embedding = HashingEmbeddings.fit(d.page_content for d in docs)
    store = DemoVectorStore(embedding=embedding)
    store.add_documents(docs, ids=[d.id or str(i) for i, d in enumerate(docs)])
    return store


@lru_cache(maxsize=1)
def _demo_embedding() -> HashingEmbeddings:
    """The embedding fitted to the demo documents (it keeps their vectors once computed)."""
    return HashingEmbeddings.fit(d.page_content for d in load_documents())


def build_retriever(
    k: int = 4, documents: Sequence[Document] | None = None
) -> VectorStoreRetriever:
    """A LangChain retriever returning the ``k`` most similar demo documents."""
    return build_vectorstore(documents).as_retriever(
        search_type="similarity", search_kwargs={"k": k}
    )
