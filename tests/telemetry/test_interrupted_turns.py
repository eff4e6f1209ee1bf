"""A turn paused for a person is what it is: interrupted, not failed, and counted.

Through the real SDK (spans and metrics in memory) on apps written as LangChain's docs write
them: a wrapped ``create_agent`` with ``HumanInTheLoopMiddleware`` and a checkpointer (the app
interrupts the turn; wrap() passes the interrupt through), and ``create_agent`` with
``TraceragMiddleware`` on a checkpointed thread (an escalation interrupts the turn for an
answer review, resumed with approve, edit or reject).
"""

from __future__ import annotations

from typing import Any

import pytest
from langchain.agents.middleware import HumanInTheLoopMiddleware
from langgraph.checkpoint.memory import InMemorySaver
from langgraph.types import Command
from opentelemetry.sdk.metrics import MeterProvider
from opentelemetry.sdk.metrics.export import InMemoryMetricReader
from opentelemetry.trace import StatusCode
from pipeline_fixtures import FAST_RETRY
from wrap_apps import AGENT_QUESTION, answering, rag_agent

from tracerag import (
    InMemoryEscalationHandler,
    InputError,
    TraceragMiddleware,
    validate_response,
    wrap,
)
from tracerag import _semconv as sc
from tracerag.store import open_store
from tracerag.telemetry._instruments import resume_action
from tracerag.testing import ToolCallingChatModel

SENTENCE = "Under Clause 6.1, laptops and tablets are covered by an extended 24-month warranty."
WRONG_NUMBER = SENTENCE.replace("24-month", "36-month")
APPROVE_TOOL = Command(resume={"decisions": [{"type": "approve"}]})


class Meters:
    """A real SDK MeterProvider read in memory: the points of one instrument by their labels."""

    def __init__(self) -> None:
        self.reader = InMemoryMetricReader()
        self.provider = MeterProvider(metric_readers=[self.reader])

    def counts(self, name: str) -> dict[tuple[tuple[str, Any], ...], int]:
        data = self.reader.get_metrics_data()
        if data is None:
            return {}
        return {
            tuple(sorted(p.attributes.items())): p.value
            for rm in data.resource_metrics
            for sm in rm.scope_metrics
            for m in sm.metrics
            if m.name == name
            for p in m.data.data_points
        }


@pytest.fixture
def meters() -> Meters:
    return Meters()


def tool_model(claim: str | None = None) -> ToolCallingChatModel:
    return ToolCallingChatModel(
        responder=answering("24-month", claim=claim), model_name="tool-model-1", temperature=0.7
    )


def gated(spans, meters, records: list[dict]) -> Any:
    """A wrapped agent whose app asks a person before its retrieval tool runs."""
    agent = rag_agent(
        tool_model(),
        checkpointer=InMemorySaver(),
        middleware=[HumanInTheLoopMiddleware(interrupt_on={"retrieve_context": True})],
    )
    return wrap(
        agent,
        n_samples=3,
        retry=FAST_RETRY,
        audit=records.append,
        tracer_provider=spans.provider,
        meter_provider=meters.provider,
    )


def root_of(spans, request_id: str):
    (root,) = spans.named(sc.SPAN_REQUEST, request_id)
    return root


# -- wrap(): the app's own interrupt ---------------------------------------------------------


def test_an_interrupt_the_app_raises_is_an_interrupted_turn_not_a_failed_request(spans, meters):
    records: list[dict] = []
    wrapped = gated(spans, meters, records)
    paused = wrapped.invoke(AGENT_QUESTION, {"configurable": {"thread_id": "hitl-m1"}})
    (interrupt,) = paused.interrupts
    assert paused.status == "pending_human_review"

    # the record: interrupted, with the interrupt's id; no request error; the Response it got
    record = records[-1]
    assert record["interrupted"] == {
        "kind": "app",
        "interrupts": [{"id": interrupt.id, "type": None}],
    }
    assert record["errors"] == []  # not AppInterrupted, nor the samples that were never drawn
    assert not any("could not be read" in w for w in record["warnings"])
    assert record["response"]["interrupts"] == [interrupt.model_dump(mode="json")]
    assert record["response"]["status"] == "pending_human_review"
    assert len(record["samples"]) == 1  # the app's own run; the others were not drawn
    validate_response(record["response"])

    # the trace: the root says interrupted, and nothing is an error
    root = root_of(spans, paused.request_id)
    assert root.name == "invoke_agent LangGraph [interrupted]"
    assert root.status.status_code is StatusCode.UNSET
    assert root.attributes[sc.DECISION] == "interrupted"
    assert root.attributes[sc.INTERRUPT_KIND] == "app"
    assert root.attributes[sc.INTERRUPT_IDS] == (interrupt.id,)
    assert root.attributes[sc.ERROR_COUNT] == 0
    assert not any(e.name == "exception" for e in root.events)
    assert not any(s.status.status_code is StatusCode.ERROR for s in spans.spans())
    (sample,) = spans.named(sc.SPAN_SAMPLE, paused.request_id)
    assert sample.attributes[sc.SAMPLES_FAILED] == 0
    assert sample.attributes[sc.SAMPLES_DRAWN] == 1
    assert sample.attributes[sc.SAMPLES_STOP] == "interrupted"
    adaptive = record["params"]["adaptive"]
    assert (adaptive["drawn"], adaptive["stop_reason"], adaptive["stop_risk"]) == (
        1,
        "interrupted",
        None,
    )
    assert not any(
        (e.attributes or {}).get(sc.GENAI_EVALUATION_NAME) == sc.EVALUATION_VERDICT
        for e in root.events
    )  # nothing was verified: no verdict

    # the metrics: its own outcome, and one turn interrupted by the app
    requests = meters.counts(sc.METRIC_REQUESTS)
    assert requests == {(("decision", "interrupted"), ("tier", "high")): 1}
    assert meters.counts(sc.METRIC_TURNS_INTERRUPTED) == {(("kind", "app"),): 1}
    assert meters.counts(sc.METRIC_TURNS_RESUMED) == {}
    calls = meters.counts(sc.METRIC_USAGE_CALLS)  # the app's one model call, paused
    assert calls and {dict(k)["decision"] for k in calls} == {"interrupted"}
    assert meters.counts(sc.METRIC_MODEL_ERRORS) == {}  # the samples not drawn did not fail


def test_a_resumed_app_turn_is_counted_with_its_action_once_it_finishes(spans, meters):
    records: list[dict] = []
    wrapped = gated(spans, meters, records)
    config = {"configurable": {"thread_id": "hitl-m2"}}
    wrapped.invoke(AGENT_QUESTION, config)
    done = wrapped.invoke(APPROVE_TOOL, config)
    assert done.decision == "pass"
    assert "interrupted" not in records[-1]  # the resumed turn is routed as any other
    root = root_of(spans, done.request_id)
    assert root.name == "invoke_agent LangGraph [pass]"
    assert meters.counts(sc.METRIC_TURNS_RESUMED) == {(("action", "approve"), ("kind", "app")): 1}
    assert meters.counts(sc.METRIC_REQUESTS) == {
        (("decision", "interrupted"), ("tier", "high")): 1,
        (("decision", "pass"), ("tier", "high")): 1,
    }
    # a resume refused (the thread no longer waits) resumes nothing
    with pytest.raises(InputError, match="no interrupted turn"):
        wrapped.invoke(APPROVE_TOOL, config)
    assert meters.counts(sc.METRIC_TURNS_RESUMED) == {(("action", "approve"), ("kind", "app")): 1}


def test_a_paused_turn_is_stored_as_interrupted_and_not_queued_for_the_desk(
    spans, meters, tmp_path
):
    store = open_store(str(tmp_path / "audit.sqlite"))
    agent = rag_agent(
        tool_model(),
        checkpointer=InMemorySaver(),
        middleware=[HumanInTheLoopMiddleware(interrupt_on={"retrieve_context": True})],
    )
    wrapped = wrap(
        agent,
        n_samples=2,
        retry=FAST_RETRY,
        audit=store,
        tracer_provider=spans.provider,
        meter_provider=meters.provider,
    )
    paused = wrapped.invoke(AGENT_QUESTION, {"configurable": {"thread_id": "stored"}})
    assert paused.audit_persisted is True  # the store took the record: the Response says so
    assert wrapped.settings.record_sink.writer.flush(timeout=10)
    record = store.get(paused.request_id).record
    (interrupt,) = paused.interrupts
    assert record["interrupted"] == {
        "kind": "app",
        "interrupts": [{"id": interrupt.id, "type": None}],
    }
    assert record["response"]["interrupts"][0]["id"] == interrupt.id
    assert record["errors"] == []
    assert store.list_queue() == []  # the app's own person answers it: no ticket for the desk
    assert store.verify_chain().ok
    store.close()


def test_a_paused_turn_whose_record_is_lost_says_so(spans, meters):
    def down(record: dict) -> bool:
        raise OSError("audit store unavailable")

    agent = rag_agent(
        tool_model(),
        checkpointer=InMemorySaver(),
        middleware=[HumanInTheLoopMiddleware(interrupt_on={"retrieve_context": True})],
    )
    wrapped = wrap(
        agent,
        n_samples=2,
        retry=FAST_RETRY,
        audit=down,
        tracer_provider=spans.provider,
        meter_provider=meters.provider,
    )
    paused = wrapped.invoke(AGENT_QUESTION, {"configurable": {"thread_id": "lost"}})
    assert paused.interrupts and paused.audit_persisted is False
    assert root_of(spans, paused.request_id).attributes[sc.AUDIT_PERSISTED] is False
    assert meters.counts(sc.METRIC_AUDIT_FAILURES) == {(("reason", "OSError"),): 1}
    assert meters.counts(sc.METRIC_TURNS_INTERRUPTED) == {(("kind", "app"),): 1}


@pytest.mark.parametrize(
    ("actions", "label"),
    [
        (["approve"], "approve"),
        (["edit", "edit"], "edit"),
        (["approve", "reject"], "mixed"),
        (["respond"], "respond"),
        ([], "other"),
        (["reject; DROP TABLE"], "other"),  # a bounded label, whatever the app sends
    ],
)
def test_a_resume_is_counted_under_a_bounded_action(actions, label):
    assert resume_action(actions) == label


# -- TraceragMiddleware: the answer review -----------------------------------------------------


def reviewed(spans, meters) -> Any:
    return rag_agent(
        tool_model(WRONG_NUMBER),
        middleware=[
            TraceragMiddleware(
                n_samples=3,
                retry=FAST_RETRY,
                audit=None,
                escalation=InMemoryEscalationHandler(),
                tracer_provider=spans.provider,
                meter_provider=meters.provider,
            )
        ],
        checkpointer=InMemorySaver(),
    )


@pytest.mark.parametrize(
    "resume",
    [
        {"type": "approve"},
        {"type": "edit", "answer": "Laptops have a 24-month warranty. [warranty]"},
        {"type": "reject"},
    ],
)
def test_an_answer_review_is_counted_interrupted_then_resumed_by_action(spans, meters, resume):
    agent = reviewed(spans, meters)
    config = {"configurable": {"thread_id": f"review-{resume['type']}"}}
    first = agent.invoke({"messages": [{"role": "user", "content": AGENT_QUESTION}]}, config)
    assert first["__interrupt__"][0].value["type"] == "answer_review"
    assert first["tracerag"]["decision"] == "escalate"  # the request itself was routed
    assert meters.counts(sc.METRIC_TURNS_INTERRUPTED) == {(("kind", "answer_review"),): 1}
    assert meters.counts(sc.METRIC_TURNS_RESUMED) == {}

    agent.invoke(Command(resume=resume), config)
    assert not agent.get_state(config).next
    assert meters.counts(sc.METRIC_TURNS_INTERRUPTED) == {(("kind", "answer_review"),): 1}
    assert meters.counts(sc.METRIC_TURNS_RESUMED) == {
        (("action", resume["type"]), ("kind", "answer_review")): 1
    }


def test_a_refused_resume_value_leaves_the_review_waiting_and_uncounted(spans, meters):
    agent = reviewed(spans, meters)
    config = {"configurable": {"thread_id": "review-bad"}}
    agent.invoke({"messages": [{"role": "user", "content": AGENT_QUESTION}]}, config)
    with pytest.raises(InputError):
        agent.invoke(Command(resume={"type": "accept"}), config)
    assert agent.get_state(config).next  # still waiting
    assert meters.counts(sc.METRIC_TURNS_RESUMED) == {}
    assert meters.counts(sc.METRIC_TURNS_INTERRUPTED) == {(("kind", "answer_review"),): 1}
    agent.invoke(Command(resume={"type": "reject"}), config)
    assert meters.counts(sc.METRIC_TURNS_RESUMED) == {
        (("action", "reject"), ("kind", "answer_review")): 1
    }


def test_a_resume_that_pauses_again_is_resumed_and_interrupted_again(spans, meters):
    """A graph that asks a person twice before answering: each pause is an interrupted turn
    (its payload's ``type`` recorded), each resume that moves the thread on is counted."""
    from langgraph.graph import START, MessagesState, StateGraph
    from langgraph.types import interrupt
    from wrap_apps import KB_DOCUMENTS

    from tracerag.demo.kb import build_vectorstore

    model = tool_model()

    def confirm(state: MessagesState):
        interrupt({"type": "confirm_identity", "question": "Is this the account holder?"})
        return {}

    def consent(state: MessagesState):
        interrupt({"type": "consent"})
        return {}

    def answer(state: MessagesState):
        context = "\n".join(f"[{d.metadata['id']}] {d.page_content}" for d in KB_DOCUMENTS)
        prompt = [{"role": "system", "content": context}, *state["messages"]]
        return {"messages": [model.invoke(prompt)]}

    builder = StateGraph(MessagesState)
    for node in (confirm, consent, answer):
        builder.add_node(node)
    builder.add_edge(START, "confirm")
    builder.add_edge("confirm", "consent")
    builder.add_edge("consent", "answer")
    records: list[dict] = []
    wrapped = wrap(
        builder.compile(checkpointer=InMemorySaver()),
        retriever=build_vectorstore(KB_DOCUMENTS).as_retriever(),
        n_samples=2,
        retry=FAST_RETRY,
        audit=records.append,
        tracer_provider=spans.provider,
        meter_provider=meters.provider,
    )
    config = {"configurable": {"thread_id": "twice"}}
    first = wrapped.invoke(AGENT_QUESTION, config)
    assert [i.value["type"] for i in first.interrupts] == ["confirm_identity"]
    assert records[-1]["interrupted"]["interrupts"][0]["type"] == "confirm_identity"
    root = root_of(spans, first.request_id)
    assert root.attributes[sc.INTERRUPT_TYPES] == ("confirm_identity",)

    second = wrapped.invoke(Command(resume={"type": "approve"}), config)
    assert [i.value["type"] for i in second.interrupts] == ["consent"]
    assert meters.counts(sc.METRIC_TURNS_INTERRUPTED) == {(("kind", "app"),): 2}
    assert meters.counts(sc.METRIC_TURNS_RESUMED) == {(("action", "approve"), ("kind", "app")): 1}

    done = wrapped.invoke(Command(resume="yes"), config)  # a bare value: action "other"
    assert not done.interrupts and done.decision == "pass", done.signal_detail
    assert meters.counts(sc.METRIC_TURNS_INTERRUPTED) == {(("kind", "app"),): 2}
    assert meters.counts(sc.METRIC_TURNS_RESUMED) == {
        (("action", "approve"), ("kind", "app")): 1,
        (("action", "other"), ("kind", "app")): 1,
    }
