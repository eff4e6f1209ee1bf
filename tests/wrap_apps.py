"""The RAG apps the wrap() tests wrap, each written as its own documentation writes it.

- LangChain's RAG tutorial graph: a LangGraph ``StateGraph`` with a ``retrieve`` and a
  ``generate`` node over ``{"question", "context", "answer"}``; prompt and model are called
  inside the node functions;
- ``create_retrieval_chain`` + ``create_stuff_documents_chain``: ``{"input"}`` in,
  ``{"answer", "context"}`` out;
- a conversational chain (``create_history_aware_retriever``): ``{"input", "chat_history"}``;
- the plain LCEL chain.
"""

from __future__ import annotations

from typing import TypedDict

from langchain_classic.chains import create_history_aware_retriever, create_retrieval_chain
from langchain_classic.chains.combine_documents import create_stuff_documents_chain
from langchain_core.documents import Document
from langchain_core.messages import AIMessage, HumanMessage
from langchain_core.output_parsers import StrOutputParser
from langchain_core.prompts import ChatPromptTemplate, MessagesPlaceholder, PromptTemplate
from langchain_core.runnables import RunnablePassthrough
from langgraph.graph import START, StateGraph

from tracerag.testing import ScriptCall

K = 4
QUESTION = "How many days do I have to return an item?"
FOLLOW_UP = "And how many days do I have to return it?"
ANSWER_SYSTEM = "Answer from the context; cite each passage you use by its [id].\n\n{context}"
STANDALONE = "Rewrite the latest user question as a standalone question."

# LangChain's RAG tutorial prompt (rlm/rag-prompt), with the passages numbered so they can be cited
RAG_PROMPT = ChatPromptTemplate.from_messages(
    [
        (
            "human",
            "You are an assistant for question-answering tasks. Use the following pieces of "
            "retrieved context to answer the question. If you don't know the answer, just say "
            "that you don't know. Cite passages by their number, like [1]. Use three sentences "
            "maximum and keep the answer concise.\nQuestion: {question} \nContext: {context} "
            "\nAnswer:",
        )
    ]
)


def numbered(docs: list[Document]) -> str:
    return "\n\n".join(f"[{i}] {d.page_content}" for i, d in enumerate(docs, 1))


def cite_returns(call: ScriptCall) -> str:
    """A model that answers from the passage on returns, citing it by its number or its id."""
    if STANDALONE in call.prompt:
        return QUESTION
    for line in call.prompt.splitlines():
        if line.startswith("[") and "30 days" in line:
            marker = line[1 : line.index("]")]
            return f"Customers may return unused items within 30 days of delivery. [{marker}]"
    return "I don't know. [9]"


def fabricate(call: ScriptCall) -> str:
    if STANDALONE in call.prompt:
        return QUESTION
    return "Customers may return unused items within 30 days of delivery. [policy-99]"



# -- the four apps, written as their own documentation writes them ------------------------------


class State(TypedDict):
    question: str
    context: list[Document]
    answer: str


def tutorial_graph(store, llm, *, checkpointer=None, extra_nodes=()):
    """LangChain's RAG tutorial: retrieve → generate over a typed state."""

    def retrieve(state: State):
        retrieved_docs = store.similarity_search(state["question"], k=K)
        return {"context": retrieved_docs}

    def generate(state: State):
        docs_content = numbered(state["context"])
        messages = RAG_PROMPT.invoke({"question": state["question"], "context": docs_content})
        response = llm.invoke(messages)
        return {"answer": response.content}

    builder = StateGraph(State).add_sequence([retrieve, generate, *extra_nodes])
    builder.add_edge(START, "retrieve")
    return builder.compile(checkpointer=checkpointer)


def retrieval_chain(store, llm):
    """``create_retrieval_chain`` over ``create_stuff_documents_chain``: {"answer", "context"}."""
    prompt = ChatPromptTemplate.from_messages(
        [
            ("system", ANSWER_SYSTEM),
            ("human", "{input}"),
        ]
    )
    document_prompt = PromptTemplate.from_template("[{id}] {page_content}")
    combine = create_stuff_documents_chain(llm, prompt, document_prompt=document_prompt)
    return create_retrieval_chain(store.as_retriever(search_kwargs={"k": K}), combine)


def conversational_chain(store, llm):
    """A history-aware retrieval chain: {"input", "chat_history"} in."""
    contextualize = ChatPromptTemplate.from_messages(
        [("system", STANDALONE), MessagesPlaceholder("chat_history"), ("human", "{input}")]
    )
    history_aware = create_history_aware_retriever(
        llm, store.as_retriever(search_kwargs={"k": K}), contextualize
    )
    qa_prompt = ChatPromptTemplate.from_messages(
        [
            ("system", ANSWER_SYSTEM),
            MessagesPlaceholder("chat_history"),
            ("human", "{input}"),
        ]
    )
    combine = create_stuff_documents_chain(
        llm, qa_prompt, document_prompt=PromptTemplate.from_template("[{id}] {page_content}")
    )
    return create_retrieval_chain(history_aware, combine)


def lcel_chain(store, llm):
    retriever = store.as_retriever(search_kwargs={"k": K})
    return (
        {"context": retriever | numbered, "question": RunnablePassthrough()}
        | RAG_PROMPT
        | llm
        | StrOutputParser()
    )


HISTORY = [
    HumanMessage("I bought headphones last week."),
    AIMessage("Thanks, how can I help with them?"),
]

APPS = {
    "tutorial_graph": (tutorial_graph, {"question": QUESTION}),
    "retrieval_chain": (retrieval_chain, {"input": QUESTION}),
    "conversational": (conversational_chain, {"input": FOLLOW_UP, "chat_history": HISTORY}),
    "lcel": (lcel_chain, QUESTION),
}


def expected_ids(store) -> list[str]:
    """The ids of the K documents the app's runs retrieve."""
    return [d.metadata["id"] for d in store.similarity_search(QUESTION, k=K)]
