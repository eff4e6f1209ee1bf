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
import json

import pytest
from langchain.agents.middleware import HumanInTheLoopMiddleware
from langchain.agents.structured_output import ProviderStrategy, ToolStrategy
from langchain_core.chat_history import InMemoryChatMessageHistory
from langchain_core.documents import Document
from langchain_core.messages import AIMessage, ToolCall
from langchain_core.outputs import ChatGeneration, ChatResult
from langchain_core.runnables import RunnableLambda
from langchain_core.runnables.history import RunnableWithMessageHistory
from langgraph.checkpoint.memory import InMemorySaver
from langgraph.graph import START, MessagesState, StateGraph
from langgraph.types import Command, interrupt
from pipeline_fixtures import FAST_RETRY, POLICIES
from pydantic import BaseModel, Field
from wrap_apps import (
    AGENT_QUESTION,
    KB_DOCUMENTS,
    QUESTION,
    RAG_PROMPT,
    STANDALONE,
    K,
    State,
    answering,
    conversational_chain,
    numbered,
    rag_agent,
)

from tracerag import ConfigurationError, InputError, validate_response, wrap
from tracerag._withheld import DEFAULT_WITHHELD
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
    assert messages[7].content == (DEFAULT_WITHHELD.format(ticket_id=middle.ticket_id))
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
    assert messages[3].content == (DEFAULT_WITHHELD.format(ticket_id=second.ticket_id))
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


# -- interrupts the app raises (HumanInTheLoopMiddleware) ----------------------------------------


def gated_agent(script, saver):
    model = ToolCallingChatModel(responder=script, model_name="tool-model-1", temperature=0.7)
    agent = rag_agent(
        model,
        checkpointer=saver,
        middleware=[HumanInTheLoopMiddleware(interrupt_on={"retrieve_context": True})],
    )
    return agent, model


def test_an_interrupt_the_app_raises_is_the_response_and_the_resumed_turn_is_verified(spans):
    saver = InMemorySaver()
    script = Script()
    agent, model = gated_agent(script, saver)
    records: list[dict] = []
    wrapped = wrap(
        agent, n_samples=3, retry=FAST_RETRY, audit=records.append, tracer_provider=spans.provider
    )
    config = {"configurable": {"thread_id": "hitl-1"}}
    paused = wrapped.invoke({"messages": [("user", AGENT_QUESTION)]}, config)
    validate_response(paused.model_dump(mode="json"))
    assert paused.status == "pending_human_review"
    assert paused.answer is None and paused.ticket_id is None  # no ticket: the app's person
    assert "empty answer" not in " ".join(paused.warnings)
    assert any("Command(resume=...)" in w for w in paused.warnings)
    (interrupt,) = paused.interrupts
    (action,) = interrupt.value["action_requests"]
    assert action["name"] == "retrieve_context"
    assert action["args"] == {"query": AGENT_QUESTION}
    assert model.call_count == 1  # the turn is paused, not sampled N times
    state = agent.get_state(config)  # the caller's thread waits at the interrupt
    assert state.next == ("HumanInTheLoopMiddleware.after_model",)
    assert [i.id for i in state.interrupts] == [interrupt.id]
    assert records[-1]["request_id"] == paused.request_id  # the paused turn is in the trail

    done = wrapped.invoke(Command(resume={"decisions": [{"type": "approve"}]}), config)
    assert done.decision == "pass", done.signal_detail
    assert done.answer.startswith(SENTENCE)
    assert done.interrupts == []
    assert done.signal_detail.samples_ok == 3
    assert records[-1]["question"] == AGENT_QUESTION  # the resumed turn's question
    messages = agent.get_state(config).values["messages"]
    assert [m.type for m in messages] == ["human", "ai", "tool", "ai"]
    assert messages[-1].content == done.answer
    assert agent.get_state(config).next == ()
    assert {t.config["configurable"]["thread_id"] for t in saver.list(None)} == {"hitl-1"}


def test_a_resumed_turn_that_escalates_leaves_no_withheld_text_in_the_thread(spans):
    saver = InMemorySaver()
    script = Script()
    agent, _ = gated_agent(script, saver)
    wrapped = wrap(agent, n_samples=3, retry=FAST_RETRY, audit=None, tracer_provider=spans.provider)
    config = {"configurable": {"thread_id": "hitl-2"}}
    wrapped.invoke(AGENT_QUESTION, config)
    script.wrong = True
    done = wrapped.invoke(Command(resume={"decisions": [{"type": "approve"}]}), config)
    assert done.decision == "escalate" and done.answer is None
    assert "36-month" not in everything_in(saver)
    assert done.ticket_id in agent.get_state(config).values["messages"][-1].content


def test_a_resume_without_an_interrupted_turn_is_refused(spans):
    saver = InMemorySaver()
    agent, _ = gated_agent(Script(), saver)
    wrapped = wrap(agent, n_samples=2, retry=FAST_RETRY, audit=None, tracer_provider=spans.provider)
    resume = Command(resume={"decisions": [{"type": "approve"}]})
    with pytest.raises(InputError, match="no interrupted turn"):
        wrapped.invoke(resume, {"configurable": {"thread_id": "never-asked"}})
    with pytest.raises(InputError, match="thread_id"):
        wrapped.invoke(resume)
    model = ToolCallingChatModel(responder=Script(), model_name="tool-model-1")
    plain = wrap(rag_agent(model), n_samples=2, audit=None)
    with pytest.raises(InputError, match="no checkpointer"):
        plain.invoke(resume, {"configurable": {"thread_id": "t"}})


# -- structured output (response_format) ---------------------------------------------------------


class CitedAnswer(BaseModel):
    """An answer from the store's policies, with the ids of the sources it is drawn from."""

    answer: str = Field(description="The answer, in one sentence.")
    sources: list[str] = Field(description="The ids of the sources the answer is drawn from.")


class StructuredAnswerer(ToolCallingChatModel):
    """Retrieves with its tool first, then answers with the responder's reply read as JSON:
    through the response format's tool when it is bound (``ToolStrategy``), else as the
    message text (``ProviderStrategy``: the provider's JSON mode)."""

    def _tool_call(self, messages, **kwargs):
        schemas = list(kwargs.get("tools") or [])
        names = [s["function"]["name"] for s in schemas]
        free = {**kwargs, "tools": [s for s in schemas if s["function"]["name"] != "CitedAnswer"]}
        free.pop("tool_choice", None)
        called = super()._tool_call(messages, **free)
        if called is not None or "CitedAnswer" not in names:
            return called
        call, text = self._next(messages)
        tool_call = ToolCall(
            name="CitedAnswer", args=json.loads(text), id=f"call_s_{call.index}", type="tool_call"
        )
        message = AIMessage(content="", tool_calls=[tool_call])
        return ChatResult(generations=[ChatGeneration(message=message)])


def structured(phrase="24-month", **kwargs):
    """``answering``'s reply as a CitedAnswer's JSON: the sentence, and the id it cites."""
    respond = answering(phrase, **kwargs)

    def reply(call: ScriptCall) -> str:
        text = respond(call)
        sentence, _, cited = text.rpartition(" [")
        return json.dumps({"answer": sentence, "sources": [cited.rstrip("]")]})

    return reply


STRATEGIES = {"tool": ToolStrategy, "provider": ProviderStrategy}


@pytest.mark.parametrize("strategy", list(STRATEGIES))
def test_a_correct_structured_answer_passes_and_is_returned(strategy, spans):
    model = StructuredAnswerer(responder=structured(), model_name="tool-model-1", temperature=0.7)
    agent = rag_agent(model, response_format=STRATEGIES[strategy](CitedAnswer))
    wrapped = wrap(agent, n_samples=3, retry=FAST_RETRY, audit=None, tracer_provider=spans.provider)
    response = wrapped.invoke({"messages": [("user", AGENT_QUESTION)]})
    validate_response(response.model_dump(mode="json"))
    assert response.decision == "pass", (response.signal_detail, response.warnings)
    assert response.structured == {"answer": SENTENCE, "sources": ["warranty"]}
    assert response.answer == f"{SENTENCE} [warranty]"  # the text fields, as verified
    assert response.evidence[0].material_id == "warranty"
    assert response.signal_detail.samples_ok == 3
    assert model.call_count == 1 + 3  # the retrieval once, the answer sampled from a fork


@pytest.mark.parametrize("strategy", list(STRATEGIES))
@pytest.mark.parametrize(
    "wrong", [{"marker": "warranty-2019"}, {"claim": WRONG_NUMBER}], ids=["fabricated", "number"]
)
def test_a_wrong_structured_answer_escalates_and_appears_nowhere(strategy, wrong, spans):
    model = StructuredAnswerer(
        responder=structured(**wrong), model_name="tool-model-1", temperature=0.7
    )
    saver = InMemorySaver()
    agent = rag_agent(model, response_format=STRATEGIES[strategy](CitedAnswer), checkpointer=saver)
    records: list[dict] = []
    wrapped = wrap(
        agent, n_samples=3, retry=FAST_RETRY, audit=records.append, tracer_provider=spans.provider
    )
    config = {"configurable": {"thread_id": f"s-{strategy}"}}
    response = wrapped.invoke({"messages": [("user", AGENT_QUESTION)]}, config)
    assert response.decision == "escalate"
    assert response.answer is None and response.structured is None
    if "marker" in wrong:  # the caller is not told what the withheld answer cited; the record is
        assert response.signal_detail.fabricated_citations == []
        assert records[-1]["signals"]["citations"]["fabricated"] == ["warranty-2019"]
    assert response.warnings == []  # withheld, not unread
    state = agent.get_state(config).values
    assert state["messages"][-1].content.endswith(f"(ticket {response.ticket_id}).")
    assert state.get("structured_response") is None
    for piece in ("36-month", "warranty-2019", "Returning structured response"):
        assert piece not in everything_in(saver), piece
    # the turn is kept whole: the retrieval's call and result, then the withheld message
    assert [m.type for m in state["messages"]] == ["human", "ai", "tool", "ai"]


def test_a_structured_answer_that_cannot_be_read_is_named(spans):
    class Bare(BaseModel):
        """A format with no text to verify."""

        months: int

    model = StructuredAnswerer(
        responder=lambda call: '{"months": 24}', model_name="tool-model-1", temperature=0.7
    )
    agent = rag_agent(model, response_format=ProviderStrategy(Bare))
    wrapped = wrap(agent, n_samples=2, retry=FAST_RETRY, audit=None, tracer_provider=spans.provider)
    response = wrapped.invoke(AGENT_QUESTION)
    assert response.decision == "escalate"
    assert response.signal_detail.samples_failed == 2
    (warning,) = [w for w in response.warnings if "could not be read" in w]
    assert "2 of 2" in warning and "structured_response" in warning


# -- what cannot be made true is refused ---------------------------------------------------------


@pytest.mark.filterwarnings(LANGCHAIN_DEPRECATION)
def test_a_history_inside_a_larger_chain_is_refused(store):
    llm = ScriptedChatModel(responder=Returns(), model_name="scripted-x", temperature=0.7)
    app, _ = with_history(store, llm)
    chain = app | RunnableLambda(lambda output: output["answer"])
    with pytest.raises(ConfigurationError, match="Wrap the RunnableWithMessageHistory itself"):
        wrap(chain)


def test_a_pause_after_an_unverified_answer_is_refused_and_not_kept(spans):
    """A graph that shows its answer to a person (interrupt) before tracerag verified it."""
    script = Script()
    model = ToolCallingChatModel(responder=script, model_name="tool-model-1", temperature=0.7)

    def answer(state: MessagesState):
        context = "\n".join(d.page_content for d in KB_DOCUMENTS)
        prompt = [{"role": "system", "content": context}, *state["messages"]]
        return {"messages": [model.invoke(prompt)]}

    def approve(state: MessagesState):
        interrupt({"answer": state["messages"][-1].content})
        return {}

    builder = StateGraph(MessagesState)
    builder.add_node(answer)
    builder.add_node(approve)
    builder.add_edge(START, "answer")
    builder.add_edge("answer", "approve")
    saver = InMemorySaver()
    graph = builder.compile(checkpointer=saver)
    wrapped = wrap(graph, n_samples=3, retry=FAST_RETRY, audit=None, tracer_provider=spans.provider)
    config = {"configurable": {"thread_id": "p-1"}}
    with pytest.raises(ConfigurationError, match="after writing its answer"):
        wrapped.invoke(AGENT_QUESTION, config)
    assert graph.get_state(config).values == {}  # nothing of the turn was kept
    assert list(saver.list(None)) == []


# -- run-once nodes after the answer act on what is kept -----------------------------------------


@pytest.mark.parametrize("checkpointed", [False, True], ids=["no checkpointer", "checkpointer"])
@pytest.mark.parametrize("bad", [False, True], ids=["passed", "escalated"])
def test_a_run_once_node_after_the_answer_acts_only_on_what_is_kept(
    store, spans, bad, checkpointed
):
    """A node that sends the answer out runs once, after the verdict: the verified answer, or
    the withheld message; never the withheld answer."""
    script = Returns()
    script.bad = bad
    llm = ScriptedChatModel(responder=script, model_name="scripted-x", temperature=0.7)
    sent: list[str] = []
    logged: list[str] = []

    def log_question(state):  # before the answer: runs once, before it is written
        logged.append(state["question"])
        return {}

    def notify_customer(state):
        sent.append(state["answer"])
        return {}

    def retrieve(state):
        return {"context": store.similarity_search(state["question"], k=K)}

    def generate(state):
        messages = RAG_PROMPT.invoke(
            {"question": state["question"], "context": numbered(state["context"])}
        )
        return {"answer": llm.invoke(messages).content}

    builder = StateGraph(State).add_sequence([log_question, retrieve, generate, notify_customer])
    builder.add_edge(START, "log_question")
    saver = InMemorySaver() if checkpointed else None
    graph = builder.compile(checkpointer=saver)
    wrapped = wrap(
        graph,
        run_once=["log_question", "notify_customer"],
        n_samples=3,
        min_samples=3,  # fixed N: the count below is the samples' calls
        retry=FAST_RETRY,
        audit=None,
        tracer_provider=spans.provider,
    )
    config = {"configurable": {"thread_id": "n-1"}} if checkpointed else None
    response = wrapped.invoke({"question": QUESTION}, config)
    assert logged == [QUESTION]
    assert llm.call_count == 3
    if bad:
        assert response.decision == "escalate"
        assert sent == [DEFAULT_WITHHELD.format(ticket_id=response.ticket_id)]
    else:
        assert response.decision == "pass"
        assert sent == [response.answer]
    if checkpointed:
        state = graph.get_state(config)
        assert state.next == ()  # the kept turn ran to its end
        assert state.values["answer"] == sent[0]
        assert {t.config["configurable"]["thread_id"] for t in saver.list(None)} == {"n-1"}
        assert "policy-99" not in everything_in(saver)
    else:
        assert graph.checkpointer is None


def test_a_rejected_tool_call_resumes_into_a_verified_turn(spans):
    """The app's person rejects the retrieval: the model answers without materials, and that
    finished turn is verified (and withheld) like any other."""
    saver = InMemorySaver()
    agent, _ = gated_agent(Script(), saver)
    wrapped = wrap(agent, n_samples=3, retry=FAST_RETRY, audit=None, tracer_provider=spans.provider)
    config = {"configurable": {"thread_id": "hitl-3"}}
    assert wrapped.invoke(AGENT_QUESTION, config).interrupts
    reject = {"decisions": [{"type": "reject", "message": "not for this customer"}]}
    done = wrapped.invoke(Command(resume=reject), config)
    assert done.interrupts == []
    assert done.decision == "escalate" and done.answer is None  # "I don't know", uncited
    messages = agent.get_state(config).values["messages"]
    assert [m.type for m in messages] == ["human", "ai", "tool", "ai"]
    assert "not for this customer" in messages[2].content
    assert done.ticket_id in messages[-1].content
    assert "I don't know" not in everything_in(saver)


def test_the_streaming_surface_keeps_the_thread_as_invoke_does(spans):
    script = Script()
    script.wrong = True
    model = ToolCallingChatModel(responder=script, model_name="tool-model-1", temperature=0.7)
    saver = InMemorySaver()
    agent = rag_agent(model, checkpointer=saver)
    wrapped = wrap(agent, n_samples=3, retry=FAST_RETRY, audit=None, tracer_provider=spans.provider)
    config = {"configurable": {"thread_id": "stream-1"}}

    async def stream():
        return [chunk async for chunk in wrapped.astream(AGENT_QUESTION, config)]

    (response,) = asyncio.run(stream())
    assert response.decision == "escalate"
    assert "36-month" not in everything_in(saver)
    assert response.ticket_id in agent.get_state(config).values["messages"][-1].content


def test_the_structured_answer_named_by_output_key_is_verified(spans):
    model = StructuredAnswerer(responder=structured(), model_name="tool-model-1", temperature=0.7)
    agent = rag_agent(model, response_format=ToolStrategy(CitedAnswer))
    wrapped = wrap(
        agent,
        output_key="structured_response",
        n_samples=2,
        retry=FAST_RETRY,
        audit=None,
        tracer_provider=spans.provider,
    )
    response = wrapped.invoke(AGENT_QUESTION)
    assert response.decision == "pass", (response.signal_detail, response.warnings)
    assert response.structured == {"answer": SENTENCE, "sources": ["warranty"]}


def test_an_earlier_released_answer_stays_when_the_same_text_is_withheld_later(spans):
    """The same answer released in turn 1 and withheld in turn 2: turn 1 keeps its answer."""
    model = ToolCallingChatModel(
        responder=lambda call: f"{WRONG_NUMBER} [warranty]",
        model_name="tool-model-1",
        temperature=0.7,
    )
    saver = InMemorySaver()
    agent = rag_agent(model, checkpointer=saver)
    config = {"configurable": {"thread_id": "same-1"}}
    # turn 1 is kept as the app's own (unwrapped) run kept it: the app answered by itself
    agent.invoke({"messages": [("user", AGENT_QUESTION)]}, config)
    first = agent.get_state(config).values["messages"][-1]
    wrapped = wrap(agent, n_samples=3, retry=FAST_RETRY, audit=None, tracer_provider=spans.provider)
    response = wrapped.invoke({"messages": [("user", AGENT_QUESTION)]}, config)
    assert response.decision == "escalate"
    assert response.warnings == []
    messages = agent.get_state(config).values["messages"]
    assert messages[3].id == first.id and messages[3].content == first.content  # kept
    assert response.ticket_id in messages[-1].content


def test_a_pause_inside_a_subgraph_is_refused_and_not_kept(spans):
    saver = InMemorySaver()
    inner, _ = gated_agent(Script(), None)
    builder = StateGraph(MessagesState)
    builder.add_node("support", inner)
    builder.add_edge(START, "support")
    graph = builder.compile(checkpointer=saver)
    wrapped = wrap(graph, n_samples=3, retry=FAST_RETRY, audit=None, tracer_provider=spans.provider)
    config = {"configurable": {"thread_id": "sub-1"}}
    with pytest.raises(ConfigurationError, match=r"inside a subgraph \(node 'support'\)"):
        wrapped.invoke(AGENT_QUESTION, config)
    assert graph.get_state(config).values == {}
    assert list(saver.list(None)) == []
