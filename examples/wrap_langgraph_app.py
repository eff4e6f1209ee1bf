"""Wrap LangChain's RAG tutorial app — a LangGraph graph — with tracerag, offline.

The graph is the tutorial's: a ``retrieve`` node and a ``generate`` node over a
``{"question", "context", "answer"}`` state, with the prompt and the model called inside the
node functions. It runs over the bundled demo knowledge base with ``ExtractiveChatModel`` (no
API key, no model weights). ``tracerag.wrap`` runs the graph once per question and forks its
answering step four more times, learns the prompt and model versions from the run, checks every
citation against the documents it retrieved and routes the answer: pass, review, or escalate.
Needs ``pip install langgraph``.

    python examples/wrap_langgraph_app.py
    python examples/wrap_langgraph_app.py "How long is a Northwind gift card valid?"
"""

from __future__ import annotations

import sys
from typing import TypedDict

from langchain_core.documents import Document
from langchain_core.prompts import ChatPromptTemplate
from langgraph.graph import START, StateGraph

import tracerag
from tracerag.demo.kb import build_vectorstore, load_questions
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


def show(response: tracerag.Response) -> None:
    print(f"decision:   {response.decision}  (confidence {response.confidence})")
    print(f"status:     {response.status}")
    print(f"answer:     {response.answer}")
    for ev in response.evidence:
        print(f"  evidence: [{ev.material_id}] {ev.title}: {ev.quote!r} (score {ev.score})")
    if response.ticket_id:
        print(f"ticket:     {response.ticket_id}")
    print(f"versions:   prompt {response.versions.prompt}, model {response.versions.model}")
    print(f"request_id: {response.request_id}  trace_id: {response.trace_id}")


def main(argv: list[str]) -> int:
    wrapped = tracerag.wrap(build_graph(), n_samples=5)
    questions = argv or [q["question"] for q in load_questions()]
    for question in questions:
        print(f"\nQ: {question}")
        show(wrapped.invoke({"question": question}))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
