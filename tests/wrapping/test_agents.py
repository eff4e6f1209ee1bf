"""wrap() around agents, each written as LangChain's current docs write it and left unchanged.

The apps (``wrap_apps``): ``create_agent`` with a ``content_and_artifact`` retrieval tool that
calls ``vector_store.similarity_search``; the same agent from ``create_react_agent``; LangGraph's
agentic RAG graph (``MessagesState``, ``create_retriever_tool``, ``ToolNode``,
``tools_condition``); ``create_agent`` retrieving in a ``dynamic_prompt`` middleware. Each is
wrapped with no ``prompt_version=``, ``model_version=`` or ``input_key=``, and called as the
tutorials call it. A correct citation passes, a fabricated one escalates, a wrong number
escalates; the app retrieves once and its answering step is what is sampled.
"""

from __future__ import annotations

import pytest
from langchain_core.callbacks import BaseCallbackHandler
from langchain_core.messages import HumanMessage
from langgraph.checkpoint.memory import InMemorySaver
from pipeline_fixtures import FAST_RETRY
from wrap_apps import (
    AGENT_QUESTION,
    AGENT_SYSTEM_PROMPT,
    CountingStore,
    agentic_rag_graph,
    answering,
    rag_agent,
    rag_chain_agent,
    react_agent,
)

from tracerag import _semconv as sc
from tracerag import validate_response, wrap
from tracerag.testing import ToolCallingChatModel

SENTENCE = "Under Clause 6.1, laptops and tablets are covered by an extended 24-month warranty."
WRONG_NUMBER = SENTENCE.replace("24-month", "36-month")
N = 3
RELEVANT = {"binary_score": "yes"}

# (app builder, how its answers cite, the model's extra settings)
AGENTS = {
    "create_agent": (rag_agent, "id", {}),
    "create_react_agent": (react_agent, "id", {}),
    "agentic_rag": (agentic_rag_graph, "position", {"structured": {"GradeDocuments": RELEVANT}}),
    "dynamic_prompt": (rag_chain_agent, "position", {}),
}
INPUTS = [
    {"messages": [{"role": "user", "content": AGENT_QUESTION}]},
    {"messages": [("user", AGENT_QUESTION)]},
    {"messages": [HumanMessage(AGENT_QUESTION)]},
    AGENT_QUESTION,
]


def model_for(name: str, responder, **extra) -> ToolCallingChatModel:
    settings = AGENTS[name][2]
    return ToolCallingChatModel(
        responder=responder, model_name="tool-model-1", temperature=0.7, **settings, **extra
    )


@pytest.fixture(autouse=True)
def count_searches():
    CountingStore.searches.clear()
    yield CountingStore.searches


@pytest.mark.parametrize("name", list(AGENTS))
def test_a_correct_citation_passes(name, spans, count_searches):
    build, cite, _ = AGENTS[name]
    model = model_for(name, answering("24-month", cite=cite))
    records: list[dict] = []
    wrapped = wrap(
        build(model),
        n_samples=N,
        min_samples=N,
        retry=FAST_RETRY,
        audit=records.append,
        tracer_provider=spans.provider,
    )
    response = wrapped.invoke({"messages": [{"role": "user", "content": AGENT_QUESTION}]})
    validate_response(response.model_dump(mode="json"))
    assert response.decision == "pass", (response.signal_detail, response.claims)
    assert response.answer.startswith(SENTENCE)
    assert response.evidence[0].material_id == "warranty"
    assert response.evidence[0].title == "Standard warranty"
    assert response.signal_detail.samples_ok == N
    assert response.versions.model == "tool-model-1"
    assert response.versions.prompt.startswith("sha256:")
    (record,) = records
    assert record["versions"]["model_source"] == "run"
    assert record["versions"]["prompt_source"] in ("model-input", "run-template")
    # retrieval ran once; the answering step is what was sampled
    assert count_searches == [AGENT_QUESTION]
    assert record["params"]["sampling"] == "answer"
    assert record["params"]["runs"] == ["app", "fork", "fork"]
    assert record["retrieval"]["source"] == "runs"
    assert "warranty" in [m["id"] for m in record["materials"]]


@pytest.mark.parametrize("name", list(AGENTS))
def test_a_fabricated_citation_escalates(name, spans):
    build, cite, _ = AGENTS[name]
    model = model_for(name, answering("24-month", cite=cite, marker="warranty-2019"))
    records: list[dict] = []
    wrapped = wrap(
        build(model),
        n_samples=N,
        min_samples=N,
        retry=FAST_RETRY,
        tracer_provider=spans.provider,
        audit=records.append,
    )
    response = wrapped.invoke({"messages": [("user", AGENT_QUESTION)]})
    assert response.decision == "escalate"
    assert response.answer is None
    assert "fabricated citation" in response.signal_detail.confidence_caps
    assert response.signal_detail.fabricated_citations == []  # the withheld answer's own text
    kept = records[0]["response"]["signal_detail"]
    assert kept["fabricated_citations"] == ["warranty-2019"]


@pytest.mark.parametrize("name", list(AGENTS))
def test_a_wrong_number_escalates(name, spans):
    build, cite, _ = AGENTS[name]
    model = model_for(name, answering("24-month", cite=cite, claim=WRONG_NUMBER))
    wrapped = wrap(
        build(model), n_samples=N, min_samples=N, retry=FAST_RETRY, tracer_provider=spans.provider
    )
    response = wrapped.invoke({"messages": [HumanMessage(AGENT_QUESTION)]})
    assert response.decision == "escalate", response.signal_detail
    assert response.answer is None
    assert response.signal_detail.fabricated_citations == []
    assert [c.verdict for c in response.claims] != ["supported"]


@pytest.mark.parametrize("value", INPUTS, ids=["role-dict", "tuple", "message", "string"])
def test_every_input_form_the_tutorials_use(value, spans):
    model = model_for("create_agent", answering("24-month"))
    wrapped = wrap(rag_agent(model), n_samples=2, retry=FAST_RETRY, tracer_provider=spans.provider)
    response = wrapped.invoke(value)
    assert response.decision == "pass", response.signal_detail
    root = spans.root(response.request_id).attributes
    assert root[sc.OI_INPUT_VALUE] == AGENT_QUESTION


def test_the_trace_shows_the_app_run_and_its_forks(spans):
    model = model_for("create_agent", answering("24-month"))
    wrapped = wrap(
        rag_agent(model),
        n_samples=N,
        min_samples=N,
        retry=FAST_RETRY,
        tracer_provider=spans.provider,
    )
    response = wrapped.invoke(AGENT_QUESTION)
    rid = response.request_id
    assert spans.tree_problems(rid) == []
    sample = spans.named(sc.SPAN_SAMPLE, rid)[0].attributes
    assert sample[sc.SAMPLING] == "answer"
    assert sample[sc.RETRIEVAL_SOURCE] == "runs"
    assert "warranty" in sample[sc.RETRIEVAL_MATERIAL_IDS]
    assert sample[sc.VERSION_PROMPT_SOURCE] == "model-input"
    generations = sorted(
        spans.named(sc.SPAN_SAMPLE_ONE, rid), key=lambda s: s.attributes[sc.SAMPLE_INDEX]
    )
    assert [g.attributes[sc.SAMPLE_RUN] for g in generations] == ["app", "fork", "fork"]
    for g in generations:  # every answering call was shown the tool's output
        attrs = g.attributes
        assert attrs[sc.OI_LLM_MODEL_NAME] == "tool-model-1"
        last = max(int(k.split(".")[2]) for k in attrs if k.startswith("llm.input_messages."))
        shown = [attrs.get(sc.oi_input_message(i, "content"), "") for i in range(last + 1)]
        assert any("24-month" in str(text) for text in shown)
    # one tool call and N answers: the model ran N + 1 times, the search once
    assert model.call_count == N + 1


def test_the_callers_callbacks_see_one_run_not_the_samples(spans):
    """The caller's handler hears tracerag's own run of the request (docs/streaming.md):
    none of the agent's model, tool or retriever runs, none of its forks."""

    class Seen(BaseCallbackHandler):
        def __init__(self) -> None:
            self.roots = 0
            self.inner = 0

        def on_chain_start(self, serialized, inputs, *, parent_run_id=None, **kwargs):
            if parent_run_id is None:
                self.roots += 1
            else:
                self.inner += 1

        def on_chat_model_start(self, serialized, messages, **kwargs):
            self.inner += 1

        def on_tool_start(self, serialized, input_str, **kwargs):
            self.inner += 1

    seen = Seen()
    model = model_for("create_agent", answering("24-month"))
    wrapped = wrap(
        rag_agent(model),
        n_samples=4,
        min_samples=4,
        retry=FAST_RETRY,
        tracer_provider=spans.provider,
    )
    response = wrapped.invoke(AGENT_QUESTION, config={"callbacks": [seen]})
    assert response.decision == "pass"
    assert (seen.roots, seen.inner) == (1, 0)
    assert model.call_count == 5  # one tool call and four answers were drawn all the same


def test_versions_follow_the_system_prompt_and_the_tools_not_the_question(spans):
    records: list[dict] = []

    def version(agent, question=AGENT_QUESTION) -> str:
        wrapped = wrap(agent, n_samples=1, audit=records.append, tracer_provider=spans.provider)
        return wrapped.invoke(question).versions.prompt

    model = model_for("create_agent", answering("24-month"))
    base = version(rag_agent(model))
    assert version(rag_agent(model), "How long is a Northwind gift card valid?") == base
    assert records[-1]["versions"]["prompt_source"] == "model-input"
    assert version(rag_agent(model, system_prompt=AGENT_SYSTEM_PROMPT + " Be brief.")) != base
    assert version(react_agent(model)) == base  # the same system prompt and tool
    assert version(rag_chain_agent(model)) != base


def test_a_wrapped_agent_with_a_checkpointer_keeps_the_conversation(spans, count_searches):
    saver = InMemorySaver()
    model = model_for("create_agent", answering("24-month"))
    agent = rag_agent(model, checkpointer=saver)
    wrapped = wrap(
        agent, n_samples=N, min_samples=N, retry=FAST_RETRY, tracer_provider=spans.provider
    )
    config = {"configurable": {"thread_id": "customer-7"}}
    first = wrapped.invoke({"messages": [("user", AGENT_QUESTION)]}, config)
    assert first.decision == "pass"
    messages = agent.get_state(config).values["messages"]
    # the thread holds this turn once, ending with the answer tracerag checked and returned
    assert [m.type for m in messages] == ["human", "ai", "tool", "ai"]
    assert messages[-1].content == first.answer
    second = wrapped.invoke({"messages": [("user", AGENT_QUESTION)]}, config)
    assert second.decision == "pass"
    assert len(agent.get_state(config).values["messages"]) == 8
    assert len(count_searches) == 2  # once per turn
    # the forks' threads are gone; the caller's thread is the only one left
    assert {c.config["configurable"]["thread_id"] for c in saver.list(None)} == {"customer-7"}


def test_the_kept_answer_is_the_one_checked_even_when_others_disagree(spans):
    """A checkpointed app keeps its own run's answer: that one is verified and returned."""
    answers = iter(
        [
            "Laptops are covered for 36 months. [warranty]",  # the app's own run: wrong
            SENTENCE + " [warranty]",
            SENTENCE + " [warranty]",
        ]
    )
    model = ToolCallingChatModel(
        responder=lambda call: next(answers), model_name="tool-model-1", temperature=0.7
    )
    agent = rag_agent(model, checkpointer=InMemorySaver())
    wrapped = wrap(
        agent, n_samples=N, min_samples=N, retry=FAST_RETRY, tracer_provider=spans.provider
    )
    config = {"configurable": {"thread_id": "t-1"}}
    response = wrapped.invoke(AGENT_QUESTION, config)
    # the better answers of the forks are not passed off as the one the app gave
    assert response.decision == "escalate"
    assert response.answer is None
    # the thread keeps neither the withheld answer nor a fork's: the withheld message
    kept = agent.get_state(config).values["messages"][-1].content
    assert response.ticket_id in kept
    assert "36 months" not in kept


def test_app_sampling_runs_the_whole_agent_each_time(spans, count_searches):
    model = model_for("create_agent", answering("24-month"))
    wrapped = wrap(
        rag_agent(model),
        n_samples=N,
        min_samples=N,
        sampling="app",
        retry=FAST_RETRY,
        tracer_provider=spans.provider,
    )
    response = wrapped.invoke(AGENT_QUESTION)
    assert response.decision == "pass"
    assert len(count_searches) == N
    assert model.call_count == 2 * N


def test_a_tool_that_returns_only_text_is_read_through_its_store(spans):
    """The tool hands the model text; the documents come from the store search inside it."""
    from langchain.agents import create_agent
    from langchain.tools import tool
    from wrap_apps import vector_store

    @tool
    def search_policies(query: str) -> str:
        """Search the store's policies."""
        docs = vector_store.similarity_search(query, k=2)
        return "\n\n".join(f"[{d.metadata['id']}] {d.page_content}" for d in docs)

    model = model_for("create_agent", answering("24-month"))
    agent = create_agent(model, [search_policies], system_prompt=AGENT_SYSTEM_PROMPT)
    response = wrap(agent, n_samples=2, tracer_provider=spans.provider).invoke(AGENT_QUESTION)
    assert response.decision == "pass", response.signal_detail
    assert response.evidence[0].material_id == "warranty"


def test_text_a_tool_showed_the_model_is_a_material(spans):
    """A tool with no documents anywhere: its output text is what the answer may cite."""
    from langchain.agents import create_agent
    from langchain.tools import tool

    @tool
    def lookup_hours(query: str) -> str:
        """Look up the support desk's opening hours."""
        return "The support desk is open from 9:00 to 18:00 on weekdays."

    def respond(call):
        if "9:00 to 18:00" in call.prompt:
            return "The support desk is open from 9:00 to 18:00 on weekdays. [1]"
        return "I don't know."

    model = ToolCallingChatModel(responder=respond, model_name="tool-model-1", temperature=0.7)
    agent = create_agent(model, [lookup_hours], system_prompt="Answer with the tool.")
    records: list[dict] = []
    response = wrap(agent, n_samples=2, audit=records.append).invoke("When is support open?")
    assert response.decision == "pass", response.signal_detail
    (material,) = records[0]["materials"]
    assert material["title"] == "lookup_hours"
    assert "9:00 to 18:00" in material["text"]


def test_the_agent_example_runs(capsys, monkeypatch):
    import importlib.util
    import sys

    from pipeline_fixtures import REPO

    path = REPO / "examples" / "wrap_agent.py"
    spec = importlib.util.spec_from_file_location("wrap_agent_example", path)
    example = importlib.util.module_from_spec(spec)
    monkeypatch.setitem(sys.modules, spec.name, example)
    spec.loader.exec_module(example)
    assert example.main([AGENT_QUESTION, "你们招聘兼职店员吗？"]) == 0
    printed = capsys.readouterr().out
    answers = [line for line in printed.splitlines() if line.startswith("decision:")]
    assert answers[0].startswith("decision:   pass")
    assert "24-month warranty. [warranty]" in printed
    assert answers[1].startswith("decision:   escalate")  # nothing in the knowledge base says
    assert printed.count("model tracerag-extractive-1") == 2


async def test_concurrent_requests_keep_their_own_materials(spans):
    """Two questions at once on one wrapped agent: each answer is checked against what its
    own request retrieved (the shared searches and forks are per request)."""
    import asyncio

    model = ToolCallingChatModel(
        responder=lambda call: (
            answering("24-month")(call)
            if "24-month" in call.prompt
            else answering("valid for 3 years")(call)
        ),
        model_name="tool-model-1",
        temperature=0.7,
    )
    records: list[dict] = []
    wrapped = wrap(rag_agent(model), n_samples=N, min_samples=N, audit=records.append)
    warranty, gift = await asyncio.gather(
        wrapped.ainvoke(AGENT_QUESTION),
        wrapped.ainvoke("How long is a Northwind gift card valid?"),
    )
    assert warranty.decision == gift.decision == "pass"
    assert warranty.evidence[0].material_id == "warranty"
    assert gift.evidence[0].material_id == "gift-cards"
    by_request = {r["request_id"]: {m["id"] for m in r["materials"]} for r in records}
    assert "gift-cards" not in by_request[warranty.request_id]
    assert "warranty" not in by_request[gift.request_id]


def test_forks_that_fail_are_kept_as_failed_samples_and_their_threads_deleted(spans):
    saver = InMemorySaver()
    answered: list[str] = []

    def respond(call):
        if answered:  # every answer after the app's own fails, the same way each time
            raise LookupError("no such answer")
        answered.append(call.prompt)
        return answering("24-month")(call)

    model = ToolCallingChatModel(responder=respond, model_name="tool-model-1", temperature=0.7)
    agent = rag_agent(model, checkpointer=saver)
    wrapped = wrap(
        agent, n_samples=N, min_samples=N, retry=FAST_RETRY, tracer_provider=spans.provider
    )
    config = {"configurable": {"thread_id": "t-9"}}
    response = wrapped.invoke(AGENT_QUESTION, config)
    assert response.signal_detail.samples_ok == 1
    assert response.signal_detail.samples_failed == N - 1
    generations = spans.named(sc.SPAN_SAMPLE_ONE, response.request_id)
    failed = [g for g in generations if not g.attributes[sc.SAMPLE_OK]]
    assert len(failed) == N - 1
    assert all("LookupError" in g.attributes[sc.SAMPLE_ERROR] for g in failed)
    assert all(g.attributes[sc.SAMPLE_ATTEMPTS] == 1 for g in failed)  # not retried
    assert {c.config["configurable"]["thread_id"] for c in saver.list(None)} == {"t-9"}


# -- the same cases through the streaming surfaces (what a frontend streams) ---------------------

CASES = {
    "correct": ({}, "pass"),
    "fabricated": ({"marker": "warranty-2019"}, "escalate"),
    "wrong number": ({"claim": WRONG_NUMBER}, "escalate"),
}
#: pieces of a withheld answer: the claim's text, the fabricated marker, the wrong number
WITHHELD = ["laptops and tablets are covered", "[warranty-2019]", "36-month", "24-month"]


@pytest.mark.parametrize("surface", ["astream_events_v2", "astream"])
@pytest.mark.parametrize("case", list(CASES))
@pytest.mark.parametrize("name", list(AGENTS))
def test_streams_carry_no_withheld_text(name, case, surface, caplog):
    import asyncio
    import logging

    from test_surfaces import Recorder, callback_errors, responses_in, serialize, through

    from tracerag.events import ANSWER_EVENT, STAGE_EVENT

    build, cite, _ = AGENTS[name]
    extra, decision = CASES[case]
    model = model_for(name, answering("24-month", cite=cite, **extra))
    app = wrap(build(model), n_samples=N, min_samples=N, retry=FAST_RETRY, audit=None)
    handler = Recorder()
    caplog.set_level(logging.WARNING)
    request = {"messages": [("user", AGENT_QUESTION)]}
    received = asyncio.run(through(surface, app, request, {"callbacks": [handler]}))
    (response,) = responses_in(surface, received)
    assert response.decision == decision, response.signal_detail
    everything = serialize(received) + serialize(handler.calls)
    if decision == "escalate":
        assert response.answer is None
        for piece in WITHHELD:
            assert piece not in everything, (name, case, surface, piece)
    else:  # a verified answer is streamed, after it is verified
        assert response.answer.startswith(SENTENCE)
        if surface == "astream_events_v2":
            answers = [e for e in received if e.get("name") == ANSWER_EVENT]
            assert [a["data"]["text"] for a in answers] == [response.answer]
            assert received.index(answers[0]) > max(
                i for i, e in enumerate(received) if e.get("name") == STAGE_EVENT
            )
    assert set(handler.names()) <= {"on_chain_start", "on_custom_event", "on_chain_end"}
    assert callback_errors(caplog) == []
