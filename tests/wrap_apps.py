"""The RAG apps the wrap() tests wrap, each written as its own documentation writes it.

- LangChain's RAG tutorial graph: a LangGraph ``StateGraph`` with a ``retrieve`` and a
  ``generate`` node over ``{"question", "context", "answer"}``; prompt and model are called
  inside the node functions;
- ``create_retrieval_chain`` + ``create_stuff_documents_chain``: ``{"input"}`` in,
  ``{"answer", "context"}`` out;
- a conversational chain (``create_history_aware_retriever``): ``{"input", "chat_history"}``;
- the plain LCEL chain;
- agents: ``create_agent`` with a ``content_and_artifact`` retrieval tool calling
  ``vector_store.similarity_search`` (LangChain's RAG agent tutorial), the same agent from
  ``create_react_agent``, LangGraph's agentic RAG graph (``MessagesState``,
  ``create_retriever_tool``, ``ToolNode``, ``tools_condition``), and ``create_agent`` retrieving
  in a ``dynamic_prompt`` middleware.
"""

from __future__ import annotations

import warnings
from typing import ClassVar, Literal, TypedDict

from langchain.agents import create_agent
from langchain.agents.middleware import ModelRequest, dynamic_prompt
from langchain.tools import tool
from langchain_classic.chains import create_history_aware_retriever, create_retrieval_chain
from langchain_classic.chains.combine_documents import create_stuff_documents_chain
from langchain_core.documents import Document
from langchain_core.messages import AIMessage, HumanMessage
from langchain_core.output_parsers import StrOutputParser
from langchain_core.prompts import ChatPromptTemplate, MessagesPlaceholder, PromptTemplate
from langchain_core.runnables import RunnablePassthrough
from langchain_core.tools import create_retriever_tool
from langchain_core.vectorstores import InMemoryVectorStore
from langgraph.graph import END, START, MessagesState, StateGraph
from langgraph.prebuilt import ToolNode, create_react_agent, tools_condition
from pydantic import BaseModel, Field

from tracerag.demo.kb import HashingEmbeddings, load_documents
from tracerag.testing import ScriptCall
from tracerag.text._sentences import split_sentences

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


# -- agents, written as LangChain's RAG agent and LangGraph's agentic RAG tutorials write them ---
# (the demo knowledge base in a real InMemoryVectorStore; module globals, as in the tutorials)

KB_DOCUMENTS = load_documents()
AGENT_QUESTION = "How long is the warranty on a laptop?"
AGENT_SYSTEM_PROMPT = (
    "You have access to a tool that retrieves context from the store's policies. "
    "Use the tool to help answer user queries, and cite each source you use by its id."
)


class CountingStore(InMemoryVectorStore):
    """An InMemoryVectorStore that counts the searches that reach it."""

    searches: ClassVar[list[str]] = []

    def similarity_search(self, query: str, k: int = 4, **kwargs):
        CountingStore.searches.append(query)
        return super().similarity_search(query, k=k, **kwargs)

    async def asimilarity_search(self, query: str, k: int = 4, **kwargs):
        CountingStore.searches.append(query)
        return await super().asimilarity_search(query, k=k, **kwargs)


vector_store = CountingStore.from_documents(
    KB_DOCUMENTS, embedding=HashingEmbeddings.fit(d.page_content for d in KB_DOCUMENTS)
)


@tool(response_format="content_and_artifact")
def retrieve_context(query: str):
    """Retrieve information to help answer a query."""
    retrieved_docs = vector_store.similarity_search(query, k=2)
    serialized = "\n\n".join(
        (f"Source: {doc.metadata}\nContent: {doc.page_content}") for doc in retrieved_docs
    )
    return serialized, retrieved_docs


def rag_agent(model, *, system_prompt: str = AGENT_SYSTEM_PROMPT, **kwargs):
    """LangChain's RAG agent: ``create_agent`` with a ``content_and_artifact`` retrieval tool."""
    return create_agent(model, [retrieve_context], system_prompt=system_prompt, **kwargs)


def react_agent(model):
    """The same agent built with LangGraph's prebuilt ``create_react_agent``."""
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # deprecated in LangGraph 1.0 in favour of create_agent
        return create_react_agent(model, [retrieve_context], prompt=AGENT_SYSTEM_PROMPT)


retriever = vector_store.as_retriever(search_kwargs={"k": 2})
retriever_tool = create_retriever_tool(
    retriever,
    "retrieve_policies",
    "Search and return information about the store's policies.",
)

GRADE_PROMPT = (
    "You are a grader assessing relevance of a retrieved document to a user question. \n "
    "Here is the retrieved document: \n\n {context} \n\n"
    "Here is the user question: {question} \n"
    "If the document contains keyword(s) or semantic meaning related to the user question, "
    "grade it as relevant. \n"
    "Give a binary score 'yes' or 'no' score to indicate whether the document is relevant to the "
    "question."
)
REWRITE_PROMPT = (
    "Look at the input and try to reason about the underlying semantic intent / meaning.\n"
    "Here is the initial question:"
    "\n ------- \n"
    "{question}"
    "\n ------- \n"
    "Formulate an improved question:"
)
GENERATE_PROMPT = (
    "You are an assistant for question-answering tasks. "
    "Use the following pieces of retrieved context to answer the question. "
    "If you don't know the answer, just say that you don't know. "
    "Cite the pieces you use by their number, like [1]. "
    "Use three sentences maximum and keep the answer concise.\n"
    "Question: {question} \n"
    "Context: {context}"
)


class GradeDocuments(BaseModel):
    """Grade documents using a binary score for relevance check."""

    binary_score: str = Field(
        description="Relevance score: 'yes' if relevant, or 'no' if not relevant"
    )


def agentic_rag_graph(response_model, grader_model=None):
    """LangGraph's agentic RAG tutorial: MessagesState, a retriever tool in a ToolNode,
    tools_condition, a document grader, question rewriting and a formatted answer prompt."""
    grader_model = grader_model or response_model

    def generate_query_or_respond(state: MessagesState):
        response = response_model.bind_tools([retriever_tool]).invoke(state["messages"])
        return {"messages": [response]}

    def grade_documents(state: MessagesState) -> Literal["generate_answer", "rewrite_question"]:
        question = state["messages"][0].content
        context = state["messages"][-1].content
        prompt = GRADE_PROMPT.format(question=question, context=context)
        response = grader_model.with_structured_output(GradeDocuments).invoke(
            [{"role": "user", "content": prompt}]
        )
        return "generate_answer" if response.binary_score == "yes" else "rewrite_question"

    def rewrite_question(state: MessagesState):
        question = state["messages"][0].content
        prompt = REWRITE_PROMPT.format(question=question)
        response = response_model.invoke([{"role": "user", "content": prompt}])
        return {"messages": [{"role": "user", "content": response.content}]}

    def generate_answer(state: MessagesState):
        question = state["messages"][0].content
        context = state["messages"][-1].content
        prompt = GENERATE_PROMPT.format(question=question, context=context)
        response = response_model.invoke([{"role": "user", "content": prompt}])
        return {"messages": [response]}

    workflow = StateGraph(MessagesState)
    workflow.add_node(generate_query_or_respond)
    workflow.add_node("retrieve", ToolNode([retriever_tool]))
    workflow.add_node(rewrite_question)
    workflow.add_node(generate_answer)
    workflow.add_edge(START, "generate_query_or_respond")
    workflow.add_conditional_edges(
        "generate_query_or_respond", tools_condition, {"tools": "retrieve", END: END}
    )
    workflow.add_conditional_edges("retrieve", grade_documents)
    workflow.add_edge("generate_answer", END)
    workflow.add_edge("rewrite_question", "generate_query_or_respond")
    return workflow.compile()


@dynamic_prompt
def prompt_with_context(request: ModelRequest) -> str:
    """Inject context into state messages (the two-step RAG chain of the RAG agent tutorial)."""
    last_query = request.state["messages"][-1].text
    retrieved_docs = vector_store.similarity_search(last_query, k=2)
    docs_content = "\n\n".join(doc.page_content for doc in retrieved_docs)
    return (
        "You are a helpful assistant. Use the following context in your response, citing "
        f"each passage you use by its number, like [1]:\n\n{docs_content}"
    )


def rag_chain_agent(model):
    """``create_agent`` without tools, retrieving in a ``dynamic_prompt`` middleware."""
    return create_agent(model, tools=[], middleware=[prompt_with_context])


def shown_passages(prompt: str) -> list[Document]:
    """The knowledge base's passages a prompt shows, in the order it shows them."""
    shown = [d for d in KB_DOCUMENTS if d.page_content in prompt]
    return sorted(shown, key=lambda d: prompt.index(d.page_content))


def answering(phrase: str, *, cite: str = "id", claim: str | None = None, marker: str = ""):
    """A responder that answers with the sentence containing ``phrase`` of a passage it was
    shown, cited by the passage's id (``cite="id"``) or its position (``cite="position"``).
    ``claim`` replaces the sentence (a wrong number); ``marker`` the citation (a fabricated id).
    """

    def respond(call: ScriptCall) -> str:
        for position, passage in enumerate(shown_passages(call.prompt), 1):
            for sentence in split_sentences(passage.page_content):
                if phrase in sentence.text:
                    cited = marker or (passage.metadata["id"] if cite == "id" else str(position))
                    return f"{claim or sentence.text.strip()} [{cited}]"
        return "I don't know."

    return respond
