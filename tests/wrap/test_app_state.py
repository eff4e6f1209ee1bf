"""wrap() keeps the app's own state true: what a thread or a history keeps of a turn is what the
caller may see, never a withheld answer.

The apps are written as LangChain's docs write them: ``create_agent`` with an
``InMemorySaver`` checkpointer, called turn after turn on one ``thread_id``; LangChain's
conversational RAG chain in a ``RunnableWithMessageHistory``. Each test searches every
checkpoint of the thread (its values and the pending writes ``get_state_history`` shows as
task results), the history and the next turn's prompt for the withheld sentence.
"""

from __future__ import annotations

import asyncio
import itertools

import pytest
from langchain_core.chat_history import InMemoryChatMessageHistory
from langchain_core.documents import Document
from langchain_core.runnables.history import RunnableWithMessageHistory
from langgraph.checkpoint.memory import InMemorySaver
from pipeline_fixtures import FAST_RETRY, POLICIES
from wrap_apps import (
    AGENT_QUESTION,
    QUESTION,
    STANDALONE,
    answering,
    conversational_chain,
    rag_agent,
)

from tracerag import ConfigurationError, validate_response, wrap
from tracerag.demo.kb import build_vectorstore
from tracerag.testing import ScriptCall, ScriptedChatModel, ToolCallingChatModel

SENTENCE = "Under Clause 6.1, laptops and tablets are covered by an extended 24-month warranty."
WRONG_NUMBER = SENTENCE.replace("24-month", "36-month")
N = 5


class Script:
    """A responder answering correctly, or with the wrong number while ``wrong`` is set."""

    def __init__(self) -> None:
        self.wrong = False

    def __call__(self, call: ScriptCall) -> str:
        return answering("24-month", claim=WRONG_NUMBER if self.wrong else None)(call)


def everything_in(saver: InMemorySaver) -> str:
    """Every checkpoint and pending write the saver holds, of every thread, as text."""
    return "\n".join(repr((t.checkpoint, t.pending_writes)) for t in saver.list(None))


def three_turns(spans, **options):
    script = Script()
    model = ToolCallingChatModel(responder=script, model_name="tool-model-1", temperature=0.7)
    saver = InMemorySaver()
    agent = rag_agent(model, checkpointer=saver)
    wrapped = wrap(
        agent, n_samples=N, retry=FAST_RETRY, audit=None, tracer_provider=spans.provider, **options
    )
    config = {"configurable": {"thread_id": "customer-7"}}
    responses = []
    for wrong in (False, True, False):
        script.wrong = wrong
        before = model.call_count
        responses.append(wrapped.invoke({"messages": [("user", AGENT_QUESTION)]}, config))
        if wrong:  # what the thread holds once the escalated turn is over
            after_escalation = everything_in(saver)
        third_prompts = [c.prompt for c in model.calls[before:]]
    return agent, saver, config, responses, after_escalation, third_prompts


def test_an_escalated_middle_turn_leaves_no_withheld_text_in_the_thread(spans):
    agent, saver, config, responses, after_escalation, third_prompts = three_turns(spans)
    first, middle, third = responses
    assert [r.decision for r in responses] == ["pass", "escalate", "pass"]
    assert middle.answer is None and middle.ticket_id
    # no checkpoint of any thread held the withheld sentence once the turn was routed
    assert "36-month" not in after_escalation
    assert "36-month" not in everything_in(saver)
    history = list(agent.get_state_history(config))
    assert "36-month" not in repr([(s.values, s.tasks) for s in history])
    # the third turn's model was given the withheld message, not the withheld answer
    assert third_prompts and not any("36-month" in p for p in third_prompts)
    assert any(middle.ticket_id in p for p in third_prompts)
    # the thread: each turn once, the middle one ending with the withheld message
    messages = agent.get_state(config).values["messages"]
    assert [m.type for m in messages] == ["human", "ai", "tool", "ai"] * 3
    assert messages[3].content == first.answer
    assert messages[7].content == (
        f"A member of our team will answer this question shortly (ticket {middle.ticket_id})."
    )
    assert messages[11].content == third.answer
    # the history is one chain of checkpoints, oldest the first turn's input
    assert history[-1].metadata["source"] == "input"
    assert all(
        s.parent_config["configurable"]["checkpoint_id"]
        == p.config["configurable"]["checkpoint_id"]
        for s, p in itertools.pairwise(history)
    )
    # the forks' threads and the private run's thread are gone
    assert {t.config["configurable"]["thread_id"] for t in saver.list(None)} == {"customer-7"}


def test_the_withheld_message_is_configurable(spans):
    agent, _saver, config, responses, _, _ = three_turns(
        spans, withheld_message="客服人员会尽快回复您（工单 {ticket_id}）。"
    )
    middle = responses[1]
    messages = agent.get_state(config).values["messages"]
    assert messages[7].content == f"客服人员会尽快回复您（工单 {middle.ticket_id}）。"


@pytest.mark.parametrize("bad", ["", "ticket {ticket}", "{0}"])
def test_a_withheld_message_that_cannot_be_filled_is_refused(bad):
    model = ToolCallingChatModel(responder=Script(), model_name="tool-model-1")
    with pytest.raises(ConfigurationError, match="withheld_message"):
        wrap(rag_agent(model, checkpointer=InMemorySaver()), withheld_message=bad)


def test_a_passed_turn_is_committed_as_the_app_ran_it(spans):
    """Every step of the turn, in order, as the app would have kept it without tracerag."""
    script = Script()
    model = ToolCallingChatModel(responder=script, model_name="tool-model-1", temperature=0.7)
    saver = InMemorySaver()
    agent = rag_agent(model, checkpointer=saver)
    wrapped = wrap(agent, n_samples=N, retry=FAST_RETRY, audit=None, tracer_provider=spans.provider)
    config = {"configurable": {"thread_id": "t-1"}}
    response = wrapped.invoke(AGENT_QUESTION, config)
    assert response.decision == "pass"
    assert response.warnings == []
    steps = [s.metadata["step"] for s in agent.get_state_history(config)]
    assert steps == [3, 2, 1, 0, -1]
    state = agent.get_state(config)
    assert state.next == ()
    assert state.values["messages"][-1].content == response.answer


def test_a_failed_request_commits_nothing(spans):
    def respond(call: ScriptCall) -> str:
        raise LookupError("the model is down")

    model = ToolCallingChatModel(responder=respond, model_name="tool-model-1", temperature=0.7)
    saver = InMemorySaver()
    agent = rag_agent(model, checkpointer=saver)
    wrapped = wrap(agent, n_samples=3, retry=FAST_RETRY, audit=None, tracer_provider=spans.provider)
    config = {"configurable": {"thread_id": "t-2"}}
    response = wrapped.invoke(AGENT_QUESTION, config)
    assert response.decision == "escalate"
    assert any("left as it was" in w for w in response.warnings)
    assert agent.get_state(config).values == {}
    assert list(saver.list(None)) == []


def test_concurrent_threads_each_keep_their_own_turn(spans):
    script = Script()
    model = ToolCallingChatModel(responder=script, model_name="tool-model-1", temperature=0.7)
    saver = InMemorySaver()
    agent = rag_agent(model, checkpointer=saver)
    wrapped = wrap(agent, n_samples=3, retry=FAST_RETRY, audit=None, tracer_provider=spans.provider)
    configs = [{"configurable": {"thread_id": f"c-{i}"}} for i in range(3)]

    async def main():
        return await asyncio.gather(*(wrapped.ainvoke(AGENT_QUESTION, c) for c in configs))

    responses = asyncio.run(main())
    assert [r.decision for r in responses] == ["pass"] * 3
    for config in configs:
        assert [m.type for m in agent.get_state(config).values["messages"]] == [
            "human",
            "ai",
            "tool",
            "ai",
        ]
    assert {t.config["configurable"]["thread_id"] for t in saver.list(None)} == {
        "c-0",
        "c-1",
        "c-2",
    }


# -- RunnableWithMessageHistory ------------------------------------------------------------------


@pytest.fixture
def store():
    docs = [Document(page_content=d.page_content, metadata=dict(d.metadata)) for d in POLICIES]
    return build_vectorstore(docs)


class Returns:
    """Answers the returns question, citing the passage (or a fabricated id while ``bad``)."""

    def __init__(self) -> None:
        self.bad = False
        self.prompts: list[str] = []

    def __call__(self, call: ScriptCall) -> str:
        self.prompts.append(call.prompt)
        if STANDALONE in call.prompt:
            return QUESTION
        for line in call.prompt.splitlines():
            if line.startswith("[") and "30 days" in line:
                marker = "policy-99" if self.bad else line[1 : line.index("]")]
                days = "45 days" if self.bad else "30 days"
                return f"Customers may return unused items within {days} of delivery. [{marker}]"
        return "I don't know."


def with_history(store, llm):
    """LangChain's conversational RAG chain with its chat history kept per session."""
    histories: dict[str, InMemoryChatMessageHistory] = {}

    def get_session_history(session_id: str) -> InMemoryChatMessageHistory:
        if session_id not in histories:
            histories[session_id] = InMemoryChatMessageHistory()
        return histories[session_id]

    app = RunnableWithMessageHistory(  # deprecated in favour of LangGraph's persistence
        conversational_chain(store, llm),
        get_session_history,
        input_messages_key="input",
        history_messages_key="chat_history",
        output_messages_key="answer",
    )
    return app, histories


LANGCHAIN_DEPRECATION = "ignore::langchain_core._api.deprecation.LangChainDeprecationWarning"


@pytest.mark.filterwarnings(LANGCHAIN_DEPRECATION)
def test_a_history_gets_one_human_and_one_ai_message_per_turn(store, spans):
    script = Returns()
    llm = ScriptedChatModel(responder=script, model_name="scripted-x", temperature=0.7)
    app, histories = with_history(store, llm)
    wrapped = wrap(app, n_samples=N, retry=FAST_RETRY, audit=None, tracer_provider=spans.provider)
    config = {"configurable": {"session_id": "s-1"}}
    first = wrapped.invoke({"input": QUESTION}, config)
    assert first.decision == "pass", (first.signal_detail, first.warnings)
    messages = histories["s-1"].messages
    assert [(m.type, m.content) for m in messages] == [("human", QUESTION), ("ai", first.answer)]
    script.bad = True
    second = wrapped.invoke({"input": QUESTION}, config)
    assert second.decision == "escalate"
    messages = histories["s-1"].messages
    assert [m.type for m in messages] == ["human", "ai", "human", "ai"]
    assert messages[3].content == (
        f"A member of our team will answer this question shortly (ticket {second.ticket_id})."
    )
    assert not any("45 days" in str(m.content) or "policy-99" in str(m.content) for m in messages)
    script.bad = False
    script.prompts.clear()
    third = wrapped.invoke({"input": QUESTION}, config)
    validate_response(third.model_dump(mode="json"))
    assert len(histories["s-1"].messages) == 6
    # the third turn's prompts held the history: the withheld message, not the withheld answer
    assert any(second.ticket_id in p for p in script.prompts)
    assert not any("45 days" in p for p in script.prompts)
    assert set(histories) == {"s-1"}  # the runs' read-only copies are not sessions


@pytest.mark.filterwarnings(LANGCHAIN_DEPRECATION)
def test_a_history_app_without_its_session_key_is_refused_as_langchain_refuses_it(store, spans):
    llm = ScriptedChatModel(responder=Returns(), model_name="scripted-x", temperature=0.7)
    app, histories = with_history(store, llm)
    wrapped = wrap(app, n_samples=2, retry=FAST_RETRY, audit=None, tracer_provider=spans.provider)
    with pytest.raises(ValueError, match="session_id"):
        wrapped.invoke({"input": QUESTION})
    assert histories == {}
