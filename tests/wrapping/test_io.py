"""Finding the question, the answer and the documents in the shapes apps take and return."""

from __future__ import annotations

import re

import pytest
from langchain_core.documents import Document
from langchain_core.messages import AIMessage, HumanMessage, SystemMessage

from tracerag.errors import InputError
from tracerag.wrapping._io import ChainIO, independent_copy, input_fields, question_field

DOCS = [Document(page_content="a", id="1"), Document(page_content="b", id="2")]


@pytest.mark.parametrize(
    ("value", "question"),
    [
        ("How long?", "How long?"),
        ({"question": "How long?", "context": []}, "How long?"),
        ({"input": "How long?", "chat_history": [HumanMessage("hi")]}, "How long?"),
        ({"query": "How long?"}, "How long?"),
        ({"messages": [SystemMessage("be brief"), HumanMessage("How long?")]}, "How long?"),
        ({"question": HumanMessage("How long?")}, "How long?"),
    ],
)
def test_question_is_found_by_default_keys(value, question):
    assert ChainIO().request(value).question == question


@pytest.mark.parametrize(
    "messages",
    [
        [("user", "How long?")],
        [("human", "How long?")],
        [{"role": "user", "content": "How long?"}],
        [{"role": "user", "content": [{"type": "text", "text": "How long?"}]}],
        [HumanMessage("How long?")],
        ["How long?"],
        "How long?",
        {"role": "user", "content": "How long?"},
        [("system", "be brief"), ("user", "earlier"), ("ai", "ok"), ("user", "How long?")],
    ],
)
def test_every_message_form_langchain_accepts_gives_the_question(messages):
    value = {"messages": messages}
    request = ChainIO().request(value)
    assert request.question == "How long?"
    assert request.chain_input is value  # passed to the app as the caller gave it
    # naming the field works for the same forms (the advice the error gives)
    assert ChainIO(input_key="messages").request(value).question == "How long?"


def test_a_bare_question_for_a_chat_app_becomes_one_user_message():
    for io in (ChainIO(string_key="messages"), ChainIO(input_key="messages")):
        chain_input = io.request("How long?").chain_input
        assert [(m.type, m.content) for m in chain_input["messages"]] == [("human", "How long?")]


@pytest.mark.parametrize(
    ("messages", "says"),
    [
        ([("system", "be brief")], "holds no user message"),
        ([("assistant", "hello")], "roles: ['ai']"),
        ([("user", "   ")], "holds no user message"),
        ([("wizard", "How long?")], "not a list of chat messages LangChain can read"),
        ([42], "not a list of chat messages LangChain can read"),
    ],
)
def test_messages_without_a_question_are_refused_with_the_reason(messages, says):
    for io in (ChainIO(), ChainIO(input_key="messages")):
        with pytest.raises(InputError, match=re.escape(says)):
            io.request({"messages": messages})


def test_input_key_naming_a_field_that_is_not_text_says_what_it_holds():
    with pytest.raises(InputError, match=r"holds int, not the question"):
        ChainIO(input_key="q").request({"q": 42})


def test_dict_input_is_passed_through_unchanged_history_and_all():
    value = {"input": "How long?", "chat_history": [HumanMessage("hi"), AIMessage("hello")]}
    request = ChainIO().request(value)
    assert request.chain_input is value
    assert request.fields == {}


def test_request_fields_are_read_and_kept_in_the_input():
    value = {"question": "q", "session_id": "s1", "user_id": "u1", "extra": 3}
    request = ChainIO().request(value)
    assert request.fields == {"session_id": "s1", "user_id": "u1"}
    assert request.chain_input == value
    with pytest.raises(InputError, match="session_id must be a string"):
        ChainIO().request({"question": "q", "session_id": 7})


def test_a_dict_of_request_fields_is_tracerags_own_request_for_an_app_without_question():
    value = {"question": "How long?", "session_id": "s1"}
    # an app that takes a string gets the question string, as for a bare question
    request = ChainIO().request(value)
    assert request.chain_input == "How long?"
    assert request.fields == {"session_id": "s1"}
    # an app taking {"input"} or a chat history gets the question in its own field
    assert ChainIO(string_key="input").request(value).chain_input == {"input": "How long?"}
    chat = ChainIO(string_key="messages").request(value).chain_input
    assert [m.content for m in chat["messages"]] == ["How long?"]
    # an app with a question field takes the dict as it is
    assert ChainIO(string_key="question").request(value).chain_input is value


def test_input_key_names_the_field_and_wraps_a_string():
    io = ChainIO(input_key="ask")
    assert io.request({"ask": "q", "question": "not this"}).question == "q"
    assert io.request("q").chain_input == {"ask": "q"}
    assert ChainIO().request("q").chain_input == "q"
    with pytest.raises(InputError, match=r"input_key='ask'"):
        io.request({"question": "q"})


def test_missing_question_says_which_argument_to_pass():
    with pytest.raises(InputError, match="pass input_key= to wrap"):
        ChainIO().request({"topic": "returns"})
    with pytest.raises(InputError, match="question string or a dict"):
        ChainIO().request(42)


@pytest.mark.parametrize(
    ("output", "answer"),
    [
        ("30 days. [1]", "30 days. [1]"),
        (AIMessage("30 days. [1]"), "30 days. [1]"),
        (AIMessage(content=[{"type": "text", "text": "30 days."}]), "30 days."),
        ({"answer": "30 days.", "context": DOCS}, "30 days."),
        ({"output": "30 days."}, "30 days."),
        ({"result": "30 days.", "source_documents": DOCS}, "30 days."),
        ({"question": "q", "answer": AIMessage("30 days.")}, "30 days."),
        ({"messages": [HumanMessage("q"), AIMessage("30 days.")]}, "30 days."),
    ],
)
def test_answer_is_found_by_default_keys(output, answer):
    assert ChainIO().answer(output) == answer


def test_output_key_names_the_field():
    io = ChainIO(output_key="reply")
    assert io.answer({"reply": "yes", "answer": "no"}) == "yes"
    with pytest.raises(TypeError, match=r"output_key='reply'"):
        io.answer({"answer": "no"})
    with pytest.raises(TypeError, match="pass output_key= to wrap"):
        ChainIO().answer({"response": "x"})
    with pytest.raises(TypeError, match="int"):
        ChainIO().answer(3)


def test_documents_from_the_output_state():
    assert ChainIO().documents({"answer": "a", "context": DOCS}) == DOCS
    assert ChainIO().documents({"result": "a", "source_documents": DOCS}) == DOCS
    assert ChainIO().documents({"answer": "a", "context": "a string, not documents"}) == []
    assert ChainIO().documents("a string output") == []
    assert ChainIO(documents_key="docs").documents({"docs": DOCS, "context": DOCS[:1]}) == DOCS
    assert ChainIO(documents_key="docs").documents({"context": DOCS}) == []


def test_independent_copy_separates_mutable_state():
    value = {"question": "q", "scratch": []}
    copied = independent_copy(value)
    copied["scratch"].append(1)
    assert value["scratch"] == []

    class Uncopyable:
        def __deepcopy__(self, memo):
            raise TypeError("no")

    thing = Uncopyable()
    assert independent_copy(thing) is thing


def test_question_field_of_graphs_and_chains():
    from typing import TypedDict

    import pydantic
    from langchain_core.runnables import RunnableLambda, RunnablePassthrough
    from langgraph.graph import START, MessagesState, StateGraph

    def compiled(schema):
        builder = StateGraph(schema)
        builder.add_node("a", lambda state: {})
        builder.add_edge(START, "a")
        return builder.compile()

    class Tutorial(TypedDict):
        question: str
        answer: str

    class Chat(MessagesState):
        summary: str

    class Model(pydantic.BaseModel):
        query: str = ""
        answer: str = ""

    assert question_field(compiled(Tutorial)) == "question"
    assert question_field(compiled(Chat)) == "messages"
    assert question_field(compiled(Model)) == "query"
    assert input_fields(compiled(Chat)) == ("messages", "summary")
    # LangChain reads the keys a chain's first step takes (here from the lambda)
    assert question_field(RunnablePassthrough.assign(x=lambda d: d["input"])) == "input"
    assert question_field(RunnableLambda(lambda d: d["topic"])) is None
    assert question_field(RunnableLambda(lambda text: text.upper())) is None


def test_string_input_goes_in_the_field():
    assert ChainIO(string_key="question").request("q").chain_input == {"question": "q"}
    messages = ChainIO(string_key="messages").request("q").chain_input["messages"]
    assert [(m.type, m.content) for m in messages] == [("human", "q")]
    assert ChainIO(input_key="ask", string_key="question").string_input("q") == {"ask": "q"}
    assert ChainIO().string_input("q") == "q"


def test_the_app_input_is_read_only_when_a_string_question_needs_a_field(monkeypatch):
    from langchain_core.runnables import RunnablePassthrough

    chain = RunnablePassthrough.assign(x=lambda d: d["input"])
    reads = []
    real = type(chain).get_input_schema

    def counted(self, config=None):
        reads.append(self)
        return real(self, config)

    monkeypatch.setattr(type(chain), "get_input_schema", counted)
    io = ChainIO(app=chain)
    history = {"input": "How long?", "chat_history": [HumanMessage("hi")]}
    assert io.request(history).chain_input is history
    assert reads == []
    assert io.request("q").chain_input == {"input": "q"}
    assert io.request({"question": "q"}).chain_input == {"input": "q"}
    assert len(reads) == 1
