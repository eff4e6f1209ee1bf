"""TraceragMiddleware inside ``create_agent`` apps written as LangChain's docs write them.

The agent is LangChain's RAG agent (``wrap_apps.rag_agent``: a ``content_and_artifact`` retrieval
tool over a real ``InMemoryVectorStore`` of the demo knowledge base) with an offline
tool-calling chat model. A correct cited answer passes; a wrong number is withheld: replaced in
the agent's state by a message naming the ticket, and, on a checkpointed thread, the turn is
interrupted for a person and resumed with ``Command(resume=...)``. Nothing a sample drew, and no
withheld text, reaches the thread, its history, the payload or any stream.
"""

from __future__ import annotations

import json

import pytest
from langchain.agents.middleware import ModelRequest, dynamic_prompt, wrap_model_call
from langchain_core.messages import AIMessage
from langgraph.checkpoint.memory import InMemorySaver
from langgraph.types import Command
from pipeline_fixtures import FAST_RETRY
from pydantic import BaseModel
from wrap_apps import AGENT_QUESTION, CountingStore, answering, rag_agent

from tracerag import (
    ConfigurationError,
    InMemoryEscalationHandler,
    InputError,
    TraceragMiddleware,
    validate_response,
)
from tracerag import _semconv as sc
from tracerag.testing import ToolCallingChatModel

SENTENCE = "Under Clause 6.1, laptops and tablets are covered by an extended 24-month warranty."
WRONG_NUMBER = SENTENCE.replace("24-month", "36-month")
WITHHELD = "36-month"
N = 3


def model(claim: str | None = None, **extra) -> ToolCallingChatModel:
    return ToolCallingChatModel(
        responder=answering("24-month", claim=claim),
        model_name="tool-model-1",
        temperature=0.7,
        **extra,
    )


def middleware(spans=None, **options) -> TraceragMiddleware:
    options.setdefault("n_samples", N)
    options.setdefault("retry", FAST_RETRY)
    options.setdefault("audit", None)
    if spans is not None:
        options.setdefault("tracer_provider", spans.provider)
    return TraceragMiddleware(**options)


def ask(question: str = AGENT_QUESTION) -> dict:
    return {"messages": [{"role": "user", "content": question}]}


def thread(name: str) -> dict:
    return {"configurable": {"thread_id": name}}


def dumped(value) -> str:
    """Everything a value shows, messages and payloads included, as one text."""
    return json.dumps(value, default=repr, ensure_ascii=False)


@pytest.fixture(autouse=True)
def count_searches():
    CountingStore.searches.clear()
    yield CountingStore.searches


# -- without a checkpointer ------------------------------------------------------------------


def test_a_correct_answer_passes_and_is_the_final_message(spans, count_searches):
    records: list[dict] = []
    llm = model()
    # every sample drawn (fixed N): the counts below are the point
    agent = rag_agent(llm, middleware=[middleware(spans, audit=records.append, min_samples=N)])
    result = agent.invoke(ask())
    final = result["messages"][-1]
    assert isinstance(final, AIMessage) and not final.tool_calls
    assert final.content.startswith(SENTENCE)
    response = result["tracerag"]
    validate_response(response)
    assert response["decision"] == "pass", response["signal_detail"]
    assert response["answer"] == final.content
    assert response["evidence"][0]["material_id"] == "warranty"
    assert response["versions"]["model"] == "tool-model-1"
    assert response["versions"]["prompt"].startswith("sha256:")
    # the tool ran once; the answering call was drawn N times (one tool round before it)
    assert count_searches == [AGENT_QUESTION]
    assert llm.call_count == 1 + N
    # one human, one tool-calling AI, one tool result, one answer: no sample in the state
    assert [m.type for m in result["messages"]] == ["human", "ai", "tool", "ai"]
    (record,) = records
    assert record["request_id"] == response["request_id"]
    assert record["retrieval"]["source"] == "tools"
    assert record["params"]["runs"] == ["model-call"] * N
    assert record["usage"]["calls"] == N  # the N answering calls, each counted once
    assert record["usage"]["by_stage"]["sample"]["calls"] == N
    assert "warranty" in [m["id"] for m in record["materials"]]
    root = spans.root(response["request_id"])
    assert root.attributes[sc.MODE] == "middleware"
    stages = [
        s.attributes[sc.STAGE]
        for s in spans.for_request(response["request_id"])
        if sc.STAGE in (s.attributes or {})
    ]
    assert sorted(set(stages)) == sorted(
        ["register", "retrieve", "plan", "sample", "verify", "assemble"]
    )
    assert len(spans.named(sc.SPAN_SAMPLE_ONE, response["request_id"])) == N


def test_without_speculation_the_answers_are_drawn_after_the_first(spans, count_searches):
    records: list[dict] = []
    llm = model()
    verified = middleware(spans, audit=records.append, speculative=False, min_samples=N)
    result = rag_agent(llm, middleware=[verified]).invoke(ask())
    assert result["tracerag"]["decision"] == "pass"
    assert llm.call_count == 1 + N
    assert count_searches == [AGENT_QUESTION]
    (record,) = records
    assert record["usage"]["calls"] == N


def test_a_wrong_number_is_replaced_and_lives_only_in_ticket_and_record(spans):
    records: list[dict] = []
    tickets = InMemoryEscalationHandler()
    agent = rag_agent(
        model(WRONG_NUMBER),
        middleware=[middleware(spans, audit=records.append, escalation=tickets)],
    )
    result = agent.invoke(ask())
    response = result["tracerag"]
    assert response["decision"] == "escalate"
    assert response["answer"] is None
    final = result["messages"][-1]
    assert response["ticket_id"] in final.content
    assert "person" in final.content
    assert "__interrupt__" not in result  # no checkpointer: the run ends with the replacement
    assert WITHHELD not in dumped(result)
    (ticket,) = tickets.tickets
    assert ticket.ticket_id == response["ticket_id"]
    assert WITHHELD in ticket.candidate_answer
    (record,) = records
    assert WITHHELD in dumped(record)  # the operator's record keeps the candidate


def test_the_replacement_text_is_configurable_and_chinese_for_a_chinese_question(spans):
    custom = rag_agent(
        model(WRONG_NUMBER),
        middleware=[middleware(spans, withheld_message="Held for review: {ticket_id}.")],
    )
    result = custom.invoke(ask())
    assert result["messages"][-1].content == f"Held for review: {result['tracerag']['ticket_id']}."
    chinese = rag_agent(model(WRONG_NUMBER), middleware=[middleware(spans)])
    result = chinese.invoke(ask("笔记本电脑的保修期是多长？"))
    assert result["tracerag"]["decision"] == "escalate"
    assert "人工" in result["messages"][-1].content
    assert result["tracerag"]["ticket_id"] in result["messages"][-1].content
    with pytest.raises(ConfigurationError):
        TraceragMiddleware(withheld_message="  ")


def test_review_releases_the_answer_and_files_a_ticket(spans):
    tickets = InMemoryEscalationHandler()
    # half the samples say they do not know: the answer agreed on by fewer goes to review
    calls = {"n": 0}

    def alternating(call):
        calls["n"] += 1
        return answering("24-month")(call) if calls["n"] % 2 else "I don't know. [warranty]"

    agent = rag_agent(
        ToolCallingChatModel(responder=alternating, model_name="tool-model-1", temperature=0.7),
        middleware=[middleware(spans, escalation=tickets, thresholds=(1.0, 0.3))],
    )
    result = agent.invoke(ask())
    response = result["tracerag"]
    assert response["decision"] == "review", response["confidence"]
    assert response["answer"] == result["messages"][-1].content
    assert SENTENCE in response["answer"]
    (ticket,) = tickets.tickets
    assert ticket.ticket_id == response["ticket_id"]


def test_the_response_is_an_output_of_the_agent_never_an_input(spans):
    agent = rag_agent(model(), middleware=[middleware(spans)])
    assert "tracerag" not in agent.get_input_jsonschema()["properties"]
    assert {"tracerag", "tracerag_review"} <= set(agent.get_output_jsonschema()["properties"])


def test_unknown_options_and_structured_output_are_refused(spans):
    with pytest.raises(ConfigurationError, match="n_sample"):
        TraceragMiddleware(n_sample=3)

    class Answer(BaseModel):
        text: str

    agent = rag_agent(model(), middleware=[middleware(spans)], response_format=Answer)
    with pytest.raises(ConfigurationError, match="wrap"):
        agent.invoke(ask())


async def test_ainvoke_verifies_as_invoke_does(spans, count_searches):
    llm = model()
    agent = rag_agent(llm, middleware=[middleware(spans, min_samples=N)])
    result = await agent.ainvoke(ask())
    assert result["tracerag"]["decision"] == "pass"
    assert result["messages"][-1].content.startswith(SENTENCE)
    assert llm.call_count == 1 + N
    assert count_searches == [AGENT_QUESTION]
    bad = rag_agent(model(WRONG_NUMBER), middleware=[middleware(spans)])
    result = await bad.ainvoke(ask())
    assert result["tracerag"]["decision"] == "escalate"
    assert WITHHELD not in dumped(result)


# -- composed with other middleware, in the order given ---------------------------------------


def test_composed_in_order_inner_middleware_sees_every_sample_outer_only_the_verdict(spans):
    seen_outside: list[str] = []
    prompts_inside: list[str] = []

    @wrap_model_call
    def outer(request: ModelRequest, handler):
        response = handler(request)
        seen_outside.append(response.result[-1].content if hasattr(response, "result") else "")
        return response

    @dynamic_prompt
    def inner(request: ModelRequest) -> str:
        prompts_inside.append(request.messages[-1].type)
        return "You answer from the store's policies; cite each source you use by its id."

    llm = model(WRONG_NUMBER)
    agent = rag_agent(llm, middleware=[outer, middleware(spans), inner])
    result = agent.invoke(ask())
    assert result["tracerag"]["decision"] == "escalate"
    # the inner middleware shaped the tool round and each answering call drawn
    assert llm.call_count > 2
    assert prompts_inside == ["human"] + ["tool"] * (llm.call_count - 1)
    assert all("store's policies" in c.prompt for c in llm.calls)
    # the outer middleware saw the tool round and the replacement, never a sample
    assert len(seen_outside) == 2
    assert WITHHELD not in dumped(seen_outside)
    assert result["tracerag"]["ticket_id"] in seen_outside[-1]


# -- a checkpointed thread: escalation interrupts the turn ------------------------------------


def checkpointed(spans, claim=WRONG_NUMBER, **options):
    tickets = InMemoryEscalationHandler()
    llm = model(claim)
    agent = rag_agent(
        llm,
        middleware=[middleware(spans, escalation=tickets, **options)],
        checkpointer=InMemorySaver(),
    )
    return agent, llm, tickets


def history_text(agent, config) -> str:
    state = agent.get_state(config)
    history = list(agent.get_state_history(config))
    return dumped([state.values, state.tasks, [h.values for h in history]])


def test_an_escalation_interrupts_with_ids_and_reasons_only(spans):
    agent, _llm, tickets = checkpointed(spans)
    config = thread("t-interrupt")
    result = agent.invoke(ask(), config)
    (pending,) = result["__interrupt__"]
    payload = pending.value
    assert payload["type"] == "answer_review"
    assert payload["ticket_id"] == result["tracerag"]["ticket_id"]
    assert payload["request_id"] == result["tracerag"]["request_id"]
    assert payload["reasons"] and all(isinstance(r, str) for r in payload["reasons"])
    assert payload["response_schema"]["properties"]["type"]["enum"] == ["approve", "edit", "reject"]
    assert WITHHELD not in dumped(result)
    assert WITHHELD not in history_text(agent, config)
    assert agent.get_state(config).next  # the turn waits for the reviewer
    assert WITHHELD in tickets.get(payload["ticket_id"]).candidate_answer


def test_approve_releases_the_candidate_from_the_ticket_without_calling_the_model_again(spans):
    agent, llm, tickets = checkpointed(spans)
    config = thread("t-approve")
    first = agent.invoke(ask(), config)
    calls = llm.call_count
    searches = list(CountingStore.searches)
    ticket_id = first["tracerag"]["ticket_id"]
    resumed = agent.invoke(Command(resume={"type": "approve"}), config)
    assert llm.call_count == calls  # the model node is not run again
    assert CountingStore.searches == searches
    final = resumed["messages"][-1]
    assert final.content == tickets.get(ticket_id).candidate_answer
    assert resumed["tracerag_review"] == {
        "ticket_id": ticket_id,
        "request_id": first["tracerag"]["request_id"],
        "type": "approve",
    }
    assert "__interrupt__" not in resumed
    assert not agent.get_state(config).next
    # the replacement message was replaced in place: one answer in the thread
    assert [m.type for m in resumed["messages"]] == ["human", "ai", "tool", "ai"]


def test_edit_releases_the_edited_text(spans):
    agent, _llm, _ = checkpointed(spans)
    config = thread("t-edit")
    agent.invoke(ask(), config)
    edited = "Laptops have a 24-month warranty under Clause 6.1. [warranty]"
    resumed = agent.invoke(Command(resume={"type": "edit", "answer": edited}), config)
    assert resumed["messages"][-1].content == edited
    assert resumed["tracerag_review"]["type"] == "edit"
    assert WITHHELD not in history_text(agent, config)


def test_reject_keeps_the_replacement_and_the_thread_never_holds_the_candidate(spans):
    agent, _llm, _ = checkpointed(spans)
    config = thread("t-reject")
    first = agent.invoke(ask(), config)
    replacement = first["messages"][-1].content
    resumed = agent.invoke(Command(resume={"type": "reject"}), config)
    assert resumed["messages"][-1].content == replacement
    assert resumed["tracerag_review"]["type"] == "reject"
    assert not agent.get_state(config).next
    assert WITHHELD not in history_text(agent, config)


@pytest.mark.parametrize(
    ("value", "message"),
    [
        ("approve", "dict"),
        ({"type": "accept"}, "one of"),
        ({"type": "edit"}, "non-empty"),
        ({"type": "edit", "answer": "   "}, "non-empty"),
        ({"type": "approve", "answer": "x"}, "takes no answer"),
        ({"type": "approve", "note": "x"}, "unknown field"),
    ],
)
def test_a_bad_resume_value_is_refused_and_the_review_still_waits(spans, value, message):
    agent, _llm, _ = checkpointed(spans)
    config = thread(f"t-bad-{message}")
    agent.invoke(ask(), config)
    with pytest.raises(InputError, match=message):
        agent.invoke(Command(resume=value), config)
    assert agent.get_state(config).next  # still interrupted
    resumed = agent.invoke(Command(resume={"type": "reject"}), config)
    assert resumed["tracerag_review"]["type"] == "reject"


def test_approve_without_a_ticket_store_names_the_ways_that_work(spans):
    class Forgets:
        def handle(self, ticket):
            pass

    llm = model(WRONG_NUMBER)
    agent = rag_agent(
        llm, middleware=[middleware(spans, escalation=Forgets())], checkpointer=InMemorySaver()
    )
    config = thread("t-forgets")
    agent.invoke(ask(), config)
    with pytest.raises(InputError, match="edit"):
        agent.invoke(Command(resume={"type": "approve"}), config)


def test_a_passed_answer_does_not_interrupt(spans):
    agent, _llm, _ = checkpointed(spans, claim=None)
    result = agent.invoke(ask(), thread("t-pass"))
    assert "__interrupt__" not in result
    assert result["tracerag"]["decision"] == "pass"
    assert result["messages"][-1].content.startswith(SENTENCE)


def test_interrupts_can_be_turned_off(spans):
    agent, _llm, _ = checkpointed(spans, interrupt_on_escalate=False)
    result = agent.invoke(ask(), thread("t-off"))
    assert "__interrupt__" not in result
    assert result["tracerag"]["decision"] == "escalate"


def test_three_turns_the_next_turn_never_sees_the_withheld_answer(spans):
    answers = iter([SENTENCE, WRONG_NUMBER, SENTENCE])
    current = {"claim": None}

    def responder(call):
        return answering("24-month", claim=current["claim"])(call)

    llm = ToolCallingChatModel(responder=responder, model_name="tool-model-1", temperature=0.7)
    agent = rag_agent(
        llm,
        middleware=[middleware(spans, interrupt_on_escalate=False, min_samples=N)],
        checkpointer=InMemorySaver(),
    )
    config = thread("t-three")
    decisions = []
    for _ in range(3):
        claim = next(answers)
        current["claim"] = None if claim == SENTENCE else claim
        decisions.append(agent.invoke(ask(), config)["tracerag"]["decision"])
    assert decisions == ["pass", "escalate", "pass"]
    third_turn_prompts = [c.prompt for c in llm.calls[-(1 + N) :]]
    assert all(WITHHELD not in p for p in third_turn_prompts)
    assert WITHHELD not in history_text(agent, config)


# -- streams ------------------------------------------------------------------------------


MODES = ["values", "updates", "messages", "custom", "debug", "checkpoints", "tasks"]


@pytest.mark.parametrize("claim", [None, WRONG_NUMBER], ids=["pass", "escalate"])
def test_every_stream_mode_shows_no_unverified_text(spans, claim):
    agent, _llm, _ = checkpointed(spans, claim=claim)
    chunks = list(agent.stream(ask(), thread(f"t-stream-{claim is None}"), stream_mode=MODES))
    text = dumped(chunks)
    modes = {mode for mode, _ in chunks}
    assert {"values", "updates", "messages", "custom"} <= modes
    custom = [data for mode, data in chunks if mode == "custom"]
    (response,) = [c["tracerag"] for c in custom if "tracerag" in c]
    if claim is None:
        assert response["decision"] == "pass"
        streamed = [data[0] for mode, data in chunks if mode == "messages"]
        assert any(SENTENCE in str(m.content) for m in streamed)  # the verified answer streams
    else:
        assert response["decision"] == "escalate"
        assert WITHHELD not in text


@pytest.mark.parametrize("claim", [None, WRONG_NUMBER], ids=["pass", "escalate"])
async def test_astream_messages_show_no_sample_tokens(spans, claim):
    llm = model(claim)
    agent = rag_agent(llm, middleware=[middleware(spans)])
    chunks = [c async for c in agent.astream(ask(), stream_mode=["messages", "updates"])]
    messages = [m for mode, data in chunks if mode == "messages" for m in [data[0]]]
    answers = [
        m for m in messages if getattr(m, "type", "") in ("ai", "AIMessageChunk") and m.content
    ]
    # the answer appears once (the verified one, or the replacement), never N times
    assert len(answers) == 1, [m.content for m in answers]
    if claim is not None:
        assert WITHHELD not in dumped(chunks)


async def test_astream_events_show_no_withheld_text(spans):
    agent = rag_agent(model(WRONG_NUMBER), middleware=[middleware(spans)])
    events = [e async for e in agent.astream_events(ask(), version="v2")]
    assert events
    assert WITHHELD not in dumped(events)


def test_the_bare_agent_would_have_shown_the_wrong_number():
    """The leak the middleware closes is real: without it the stream carries the sentence."""
    agent = rag_agent(model(WRONG_NUMBER))
    chunks = list(agent.stream(ask(), stream_mode=["messages", "updates"]))
    assert WITHHELD in dumped(chunks)


V3_BETA = "ignore::langchain_core._api.beta_decorator.LangChainBetaWarning"


@pytest.mark.filterwarnings(V3_BETA)
@pytest.mark.parametrize("claim", [None, WRONG_NUMBER], ids=["pass", "escalate"])
def test_v3_stream_events_show_no_withheld_text(spans, claim):
    agent, _llm, _ = checkpointed(spans, claim=claim)
    with agent.stream_events(ask(), thread(f"t-v3-{claim is None}"), version="v3") as run:
        events = list(run)
        output = run.output
        interrupted = run.interrupted
    assert events
    assert WITHHELD not in dumped(events)
    assert output["tracerag"]["decision"] == ("pass" if claim is None else "escalate")
    assert interrupted is (claim is not None)
    if claim is None:
        assert output["messages"][-1].content.startswith(SENTENCE)


@pytest.mark.filterwarnings(V3_BETA)
async def test_v3_astream_events_show_no_withheld_text(spans):
    agent = rag_agent(model(WRONG_NUMBER), middleware=[middleware(spans)])
    run = await agent.astream_events(ask(), version="v3")
    events = [event async for event in run]
    assert events
    assert WITHHELD not in dumped(events)


def test_a_subgraph_stream_shows_no_withheld_text(spans):
    from langgraph.graph import START, MessagesState, StateGraph

    agent = rag_agent(model(WRONG_NUMBER), middleware=[middleware(spans)])
    parent = StateGraph(MessagesState)
    parent.add_node("support", agent)
    parent.add_edge(START, "support")
    graph = parent.compile()
    chunks = list(
        graph.stream(ask(), stream_mode=["updates", "messages", "values"], subgraphs=True)
    )
    namespaces = {chunk[0] for chunk in chunks}
    assert any(ns for ns in namespaces)  # the agent's own steps streamed as a subgraph
    assert WITHHELD not in dumped(chunks)
    final = graph.invoke(ask())
    assert "person" in final["messages"][-1].content


def test_human_in_the_loop_on_tools_composes_with_the_answer_review(spans):
    from langchain.agents.middleware import HumanInTheLoopMiddleware

    gate = HumanInTheLoopMiddleware(interrupt_on={"retrieve_context": True})
    llm = model()
    verified = middleware(spans, min_samples=N)
    agent = rag_agent(llm, middleware=[gate, verified], checkpointer=InMemorySaver())
    config = thread("t-hitl")
    first = agent.invoke(ask(), config)
    (pending,) = first["__interrupt__"]
    assert pending.value["action_requests"][0]["name"] == "retrieve_context"
    assert "tracerag" not in first  # no answer yet: nothing was verified
    done = agent.invoke(Command(resume={"decisions": [{"type": "approve"}]}), config)
    assert "__interrupt__" not in done
    assert done["tracerag"]["decision"] == "pass"
    assert done["messages"][-1].content.startswith(SENTENCE)
    assert llm.call_count == 1 + N


def test_a_text_only_tool_s_store_search_gives_the_materials(spans):
    """A tool that shows the model only text: its vector store search is seen all the same, so
    the answer cites the documents by id, and the record holds them, not the tool's text."""
    from langchain.agents import create_agent
    from langchain.tools import tool
    from wrap_apps import AGENT_SYSTEM_PROMPT, vector_store

    @tool
    def search_policies(query: str) -> str:
        """Search the store's policies."""
        docs = vector_store.similarity_search(query, k=2)
        return "\n\n".join(f"Source: {d.metadata}\nContent: {d.page_content}" for d in docs)

    records: list[dict] = []
    agent = create_agent(
        model(),
        [search_policies],
        system_prompt=AGENT_SYSTEM_PROMPT,
        middleware=[middleware(spans, audit=records.append)],
    )
    result = agent.invoke(ask())
    assert result["tracerag"]["decision"] == "pass", result["tracerag"]["signal_detail"]
    (record,) = records
    ids = [m["id"] for m in record["materials"]]
    assert "warranty" in ids
    assert all(m["title"] != "search_policies" for m in record["materials"])
