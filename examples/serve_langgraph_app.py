"""Serve a wrapped LangGraph app over HTTP with ``tracerag serve --app``, offline.

The app is LangChain's RAG tutorial graph (``retrieve`` → ``generate`` over a
``{"question", "context", "answer"}`` state) on the bundled demo knowledge base, with
``ExtractiveChatModel`` (no API key, no model weights). ``app`` is what the server runs: the
graph wrapped by ``tracerag.wrap``, the way ``uvicorn module:app`` finds an ASGI app.

    tracerag serve --app examples.serve_langgraph_app:app --no-review-desk
    curl -s localhost:8000/v1/answer -H 'Content-Type: application/json' \\
         -d '{"question": "How long is a Northwind gift card valid?"}'

``build_app`` builds the same app on each call, for ``--factory``:

    tracerag serve --app examples.serve_langgraph_app:build_app --factory --no-review-desk

Needs ``pip install langgraph`` and the demo extra (``pip install -e ".[demo,server]"``).
"""

from __future__ import annotations

from typing import TypedDict

from langchain_core.documents import Document
from langchain_core.prompts import ChatPromptTemplate
from langgraph.graph import START, StateGraph

import tracerag
from tracerag.demo.kb import build_vectorstore
from tracerag.demo.models.extractive import ExtractiveChatModel

PROMPT = ChatPromptTemplate.from_template(
    "Answer the question based only on the following context. "
    "Cite the numbered passages you use, like [1].\n\n"
    "Context:\n{context}\n\n"
    "Question: {question}\n"
)


class State(TypedDict):
    question: str
    context: list[Document]
    answer: str


def build_graph():
    """The tutorial's retrieve → generate graph over the demo knowledge base."""
    vector_store = build_vectorstore()
    llm = ExtractiveChatModel(temperature=0.7)

    def retrieve(state: State):
        return {"context": vector_store.similarity_search(state["question"], k=4)}

    def generate(state: State):
        docs_content = "\n\n".join(doc.page_content for doc in state["context"])
        messages = PROMPT.invoke({"question": state["question"], "context": docs_content})
        return {"answer": llm.invoke(messages).content}

    builder = StateGraph(State).add_sequence([retrieve, generate])
    builder.add_edge(START, "retrieve")
    return builder.compile()


def build_app() -> tracerag.WrappedChain:
    """The wrapped graph: five samples per question, every citation checked, then routed."""
    return tracerag.wrap(build_graph(), n_samples=5)


app = build_app()
