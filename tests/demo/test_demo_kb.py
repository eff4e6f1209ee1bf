"""The demo knowledge base, its offline retriever, and the demo questions' intended behaviour."""

from __future__ import annotations

import math
import re
from collections import Counter
from datetime import date

import pytest
from langchain_core.vectorstores import VectorStoreRetriever

from tracerag.demo.kb import (
    HashingEmbeddings,
    build_retriever,
    build_vectorstore,
    load_documents,
    load_questions,
)
from tracerag.demo.models.extractive import CANNOT_ANSWER_EN, CANNOT_ANSWER_ZH, ExtractiveChatModel
from tracerag.prompts import PROMPT, TASK_ANSWER, prompt_values
from tracerag.signals._types import Material
from tracerag.text._sentences import split_sentences

CJK = re.compile(r"[\u4e00-\u9fff]")
CITATION_RE = re.compile(r"\[([^\]]+)\]")
QUESTIONS = load_questions()


def _material(doc, rank: int = 0) -> Material:
    meta = doc.metadata
    return Material(
        id=meta["id"],
        text=doc.page_content,
        title=meta["title"],
        source=meta["source"],
        rank=rank,
        metadata=meta,
    )


@pytest.fixture(scope="module")
def vectorstore():
    return build_vectorstore()


def test_documents_shape():
    docs = load_documents()
    assert 30 <= len(docs) <= 36
    ids = [d.metadata["id"] for d in docs]
    assert len(set(ids)) == len(ids)
    chinese = sum(bool(CJK.search(d.page_content)) for d in docs)
    assert len(docs) / 4 <= chinese <= len(docs) / 2
    for d in docs:
        assert d.id == d.metadata["id"]
        for key in ("title", "source", "effective_from"):
            assert d.metadata[key], (d.id, key)
        assert d.metadata["source"].startswith("kb://")
        date.fromisoformat(d.metadata["effective_from"])
        assert 2 <= len(split_sentences(d.page_content)) <= 6, d.id


def test_superseded_documents_are_stale_and_sit_next_to_current_ones():
    docs = {d.metadata["id"]: d for d in load_documents()}
    stale = {i for i, d in docs.items() if _material(d).stale_reason()}
    assert 2 <= len(stale) <= 3
    for i in stale:
        successor = docs[i].metadata["superseded_by"]
        assert successor in docs
        assert _material(docs[successor]).stale_reason() is None
        assert date.fromisoformat(docs[i].metadata["valid_until"]) < date.today()


def test_hashing_embeddings_are_deterministic_and_normalised():
    emb = HashingEmbeddings(dim=256)
    text = "价格保护 price protection"
    a, b = emb.embed_query(text), emb.embed_query(text)
    assert a == b
    assert math.isclose(math.sqrt(sum(x * x for x in a)), 1.0)
    assert not any(emb.embed_query("the of and"))


def test_build_retriever_is_a_real_vectorstore_retriever():
    retriever = build_retriever(k=3)
    assert isinstance(retriever, VectorStoreRetriever)
    docs = retriever.invoke("How long is a Northwind gift card valid?")
    assert len(docs) == 3
    assert docs[0].metadata["id"] == "gift-cards"


@pytest.mark.parametrize("q", [q for q in QUESTIONS if q["relevant"]], ids=lambda q: q["id"])
def test_retriever_finds_the_relevant_documents(vectorstore, q):
    hits = vectorstore.similarity_search_with_relevance_scores(q["question"], k=4)
    ids = [d.metadata["id"] for d, _ in hits]
    assert set(q["relevant"]) <= set(ids[: max(2, len(q["relevant"]))]), ids
    assert all(0.0 <= s <= 1.0 for _, s in hits)
    assert hits[0][1] > 0.2


def test_out_of_scope_question_gets_no_relevant_documents(vectorstore):
    q = next(q for q in QUESTIONS if not q["relevant"])
    hits = vectorstore.similarity_search_with_relevance_scores(q["question"], k=4)
    assert max(s for _, s in hits) < 0.1


def test_questions_cover_every_route():
    assert 6 <= len(QUESTIONS) <= 8
    assert {q["expect"] for q in QUESTIONS} == {"pass", "review", "escalate"}
    assert {q["lang"] for q in QUESTIONS} == {"en", "zh"}
    ids = {d.metadata["id"] for d in load_documents()}
    for q in QUESTIONS:
        assert q["why"] and q["question"]
        assert set(q["relevant"]) <= ids


def _samples(q: dict, n: int = 5) -> tuple[list[str], dict[str, Material]]:
    retriever = build_retriever(k=4)
    materials = [_material(d, r) for r, d in enumerate(retriever.invoke(q["question"]))]
    msgs = PROMPT.format_messages(**prompt_values(TASK_ANSWER, q["question"], materials))
    model = ExtractiveChatModel(temperature=0.7, seed=2024)
    return [model.invoke(msgs).content for _ in range(n)], {m.id: m for m in materials}


@pytest.mark.parametrize("q", QUESTIONS, ids=lambda q: q["id"])
def test_demo_questions_behave_as_annotated(q):
    answers, by_id = _samples(q)
    cited = [set(CITATION_RE.findall(a)) for a in answers]
    stale = {i for i, m in by_id.items() if m.stale_reason()}
    if not q["relevant"]:  # outside the knowledge base
        assert set(answers) <= {CANNOT_ANSWER_EN, CANNOT_ANSWER_ZH}
    elif set(q["relevant"]) & stale:  # about a superseded policy: samples lean on the stale clause
        assert all(c & stale for c in cited), answers
        assert Counter(answers).most_common(1)[0][1] == len(answers)
    elif q["expect"] == "pass":
        assert len(set(answers)) == 1, answers
        assert cited[0] <= set(q["relevant"])
    else:  # ambiguous: the samples disagree
        assert q["expect"] == "review"
        assert len(set(answers)) > 1, answers
        assert set().union(*cited) == set(q["relevant"])
