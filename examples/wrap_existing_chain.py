"""Wrap an existing LCEL RAG chain with tracerag, offline.

The chain is the usual LangChain shape,
``{"context": retriever | format_docs, "question": RunnablePassthrough()} | prompt | llm | parser``,
built over the bundled demo knowledge base with ``ExtractiveChatModel`` (no API key, no model
weights). ``tracerag.wrap`` retrieves once per question and draws five answers from the chain's
model step, checks every citation against the retrieved documents and routes the answer: pass,
review, or escalate.

    python examples/wrap_existing_chain.py
    python examples/wrap_existing_chain.py "How long is a Northwind gift card valid?"
"""

from __future__ import annotations

import sys

from langchain_core.documents import Document
from langchain_core.output_parsers import StrOutputParser
from langchain_core.prompts import ChatPromptTemplate
from langchain_core.runnables import RunnablePassthrough

import tracerag
from tracerag.demo.kb import build_retriever, load_questions
from tracerag.demo.models.extractive import ExtractiveChatModel

PROMPT = ChatPromptTemplate.from_template(
    "Answer the question based only on the following context. "
    "Cite the numbered passages you use, like [1].\n\n"
    "Context:\n{context}\n\n"
    "Question: {question}\n"
)


def format_docs(docs: list[Document]) -> str:
    """Retrieved documents as blank-line-separated paragraphs (cited as [1], [2], ...)."""
    return "\n\n".join(doc.page_content for doc in docs)


def build_chain():
    """A plain LCEL RAG chain over the demo knowledge base."""
    retriever = build_retriever(k=4)
    llm = ExtractiveChatModel(temperature=0.7)
    return (
        {"context": retriever | format_docs, "question": RunnablePassthrough()}
        | PROMPT
        | llm
        | StrOutputParser()
    )


def show(response: tracerag.Response) -> None:
    print(f"decision:   {response.decision}  (confidence {response.confidence})")
    print(f"status:     {response.status}")
    print(f"answer:     {response.answer}")
    for ev in response.evidence:
        print(f"  evidence: [{ev.material_id}] {ev.title}: {ev.quote!r} (score {ev.score})")
    if response.ticket_id:
        print(f"ticket:     {response.ticket_id}")
    print(f"request_id: {response.request_id}  trace_id: {response.trace_id}")


def main(argv: list[str]) -> int:
    chain = build_chain()
    wrapped = tracerag.wrap(chain, n_samples=5)
    questions = argv or [q["question"] for q in load_questions()]
    for question in questions:
        print(f"\nQ: {question}")
        show(wrapped.invoke(question))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
