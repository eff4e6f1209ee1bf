"""Retrieval inside an app, seen and shared within a request, and untouched outside one."""

from __future__ import annotations

import asyncio
import threading
from typing import ClassVar

import pytest
from langchain_core.documents import Document
from langchain_core.runnables import RunnableLambda
from langchain_core.vectorstores import InMemoryVectorStore

from tracerag.demo.kb import HashingEmbeddings
from tracerag.wrapping._capture import RunCapture
from tracerag.wrapping._hooks import Shared, instrument, is_instrumented, scope
from tracerag.wrapping._inspect import retrieval_parts

DOCS = [
    Document(page_content="Returns are accepted within 30 days.", metadata={"id": "returns"}),
    Document(page_content="Shipping is free over $50.", metadata={"id": "shipping"}),
    Document(page_content="Laptops carry a 24-month warranty.", metadata={"id": "warranty"}),
]


class Store(InMemoryVectorStore):
    """A real in-memory store that counts the searches reaching it (a class of its own per
    test module, so instrumenting it changes nothing another test relies on)."""

    searches: ClassVar[list[str]] = []

    def similarity_search(self, query, k=4, **kwargs):
        Store.searches.append(query)
        return super().similarity_search(query, k=k, **kwargs)

    async def asimilarity_search(self, query, k=4, **kwargs):
        Store.searches.append(query)
        return await super().asimilarity_search(query, k=k, **kwargs)


@pytest.fixture
def store():
    Store.searches = []
    made = Store(embedding=HashingEmbeddings.fit(d.page_content for d in DOCS))
    made.add_documents(DOCS)
    instrument([made.as_retriever(search_kwargs={"k": 1})], [made])
    return made


def test_outside_a_request_the_store_behaves_as_before(store):
    assert is_instrumented(Store, "similarity_search")
    assert is_instrumented(Store, "asimilarity_search")
    first = store.similarity_search("warranty", k=1)
    second = store.similarity_search("warranty", k=1)
    assert first == second and first[0].metadata["id"] == "warranty"
    assert Store.searches == ["warranty", "warranty"]  # nothing shared outside a request
    scored = store.similarity_search_with_score("returns", k=1)
    assert scored[0][0].metadata["id"] == "returns"
    assert store.similarity_search.__name__ == "similarity_search"  # the method keeps its name


def test_a_run_sees_what_its_searches_returned(store):
    capture = RunCapture()
    with scope(Shared(share=False), capture):
        store.similarity_search("warranty", k=1)
        store.similarity_search_with_score("returns", k=1)
    assert [d.metadata["id"] for d in capture.documents] == ["warranty", "returns"]
    # the score the search gave is kept for the document it came with
    assert capture.scores[id(capture.documents[1])] == pytest.approx(
        store.similarity_search_with_score("returns", k=1)[0][1]
    )


def test_within_a_request_a_repeated_search_is_answered_once(store):
    shared = Shared(share=True)
    captures = [RunCapture() for _ in range(3)]

    async def run(capture):
        with scope(shared, capture):
            return await store.asimilarity_search("warranty", k=1)

    async def go():
        first = await run(captures[0])
        rest = await asyncio.gather(*(run(c) for c in captures[1:]))
        return [first, *rest]

    results = asyncio.run(go())
    assert Store.searches == ["warranty"]  # one search reached the store
    assert all(r == results[0] for r in results)
    assert results[1][0] is not results[0][0]  # each run gets its own copy
    assert all(c.documents for c in captures)  # and each run still sees what it was given
    assert shared.hits == 2


def test_different_arguments_are_searched_again(store):
    shared = Shared(share=True)
    with scope(shared):
        store.similarity_search("warranty", k=1)
        store.similarity_search("warranty", k=2)
        store.similarity_search("returns", k=1)
    assert Store.searches == ["warranty", "warranty", "returns"]


def test_the_retrieve_stage_seeds_what_a_retriever_returns(store):
    retriever = store.as_retriever(search_kwargs={"k": 1})
    shared = Shared(share=True)
    shared.seed(retriever, "warranty", [DOCS[2]])
    with scope(shared):
        got = retriever.invoke("warranty")
        again = asyncio.run(retriever.ainvoke("warranty"))
    assert [d.metadata["id"] for d in got] == ["warranty"] == [d.metadata["id"] for d in again]
    assert Store.searches == []  # the seeded documents were returned, the store not searched


def test_a_search_nested_in_a_retriever_is_not_counted_twice(store):
    retriever = store.as_retriever(search_kwargs={"k": 1})
    capture = RunCapture()
    with scope(Shared(share=False), capture):
        retriever.invoke("warranty", config={"callbacks": [capture]})
    # the retriever's callback reports the documents; the store search inside it is its own
    assert [d.metadata["id"] for d in capture.documents] == ["warranty"]


def test_threads_started_inside_a_run_report_to_it(store):
    capture = RunCapture()

    def search_in_thread():
        store.similarity_search("returns", k=1)

    with scope(Shared(share=False), capture):
        RunnableLambda(lambda _: search_in_thread()).batch([1, 2])  # LangChain's executor
    assert [d.metadata["id"] for d in capture.documents] == ["returns", "returns"]
    outside = threading.Thread(target=search_in_thread)
    outside.start()
    outside.join()
    assert len(capture.documents) == 2  # a thread started outside the run is not its


def test_retrieval_parts_finds_stores_behind_globals_closures_and_partials(store):
    import functools

    def helper(query):
        return store.similarity_search(query)

    def node(state):
        return {"docs": helper(state["question"])}

    retriever = store.as_retriever()
    app = RunnableLambda(node) | RunnableLambda(functools.partial(lambda q, r: r, r=retriever))
    retrievers, stores = retrieval_parts(app)
    assert stores == [store]
    assert retrievers == [retriever]
