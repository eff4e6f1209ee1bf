"""Wrap LangChain's RAG agent — ``create_agent`` with a retrieval tool — with tracerag, offline.

The agent is the one LangChain's RAG tutorial builds: a ``@tool(response_format=
"content_and_artifact")`` that calls ``vector_store.similarity_search(query, k=2)`` and returns the
serialized passages with the documents as the tool message's artifact, given to
``create_agent(model, tools, system_prompt=...)``. It runs over the bundled demo knowledge base
with ``ExtractiveChatModel`` (no API key, no model weights): it calls the tool, then answers with
sentences of what the tool returned, citing each passage's ``id``.

``tracerag.wrap(agent)`` needs nothing else: the question is read from the messages, the
materials from what the tool's search returned, the prompt version from what reached the model
(the system prompt and the tool's schema) and the model version from its calls. The agent runs
once per question; its answering step is forked four more times from the checkpoint before it, so
the knowledge base is searched once and five answers are checked. Needs ``pip install langchain``.

    python examples/wrap_agent.py
    python examples/wrap_agent.py "How long is a Northwind gift card valid?"
"""

from __future__ import annotations

import sys

from langchain.agents import create_agent
from langchain.tools import tool

import tracerag
from tracerag.demo.kb import build_vectorstore, load_questions
from tracerag.demo.models.extractive import ExtractiveChatModel

vector_store = build_vectorstore()


@tool(response_format="content_and_artifact")
def retrieve_context(query: str):
    """Retrieve information to help answer a query."""
    retrieved_docs = vector_store.similarity_search(query, k=2)
    serialized = "\n\n".join(
        (f"Source: {doc.metadata}\nContent: {doc.page_content}") for doc in retrieved_docs
    )
    return serialized, retrieved_docs


def build_agent():
    """The tutorial's agent over the demo knowledge base."""
    model = ExtractiveChatModel(temperature=0.7)
    prompt = (
        "You have access to a tool that retrieves context from Northwind Gadgets' policies. "
        "Use the tool to help answer user queries, and cite each source you use by its id."
    )
    return create_agent(model, [retrieve_context], system_prompt=prompt)


def show(response: tracerag.Response) -> None:
    print(f"decision:   {response.decision}  (confidence {response.confidence})")
    print(f"answer:     {response.answer}")
    for ev in response.evidence:
        print(f"  evidence: [{ev.material_id}] {ev.title}: {ev.quote!r} (score {ev.score})")
    if response.ticket_id:
        print(f"ticket:     {response.ticket_id}")
    print(f"versions:   prompt {response.versions.prompt}, model {response.versions.model}")
    print(f"request_id: {response.request_id}  trace_id: {response.trace_id}")


def main(argv: list[str]) -> int:
    wrapped = tracerag.wrap(build_agent(), n_samples=5)
    questions = argv or [q["question"] for q in load_questions()]
    for question in questions:
        print(f"\nQ: {question}")
        show(wrapped.invoke({"messages": [{"role": "user", "content": question}]}))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
