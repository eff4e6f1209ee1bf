"""A ``create_agent`` app with ``TraceragMiddleware``, served as ``tracerag serve --app`` serves it.

Two server apps stand for two replicas: each has its own agent object (its own middleware and
in-memory ticket handler), and they share what replicas share — the audit store and the agent's
checkpointer. A question asked through one is escalated and its thread interrupted; the
decision taken at the other's review desk resumes that thread, with the candidate the desk read
from the audit record.
"""

from __future__ import annotations

import json
import sys
import textwrap

import pytest
from langgraph.checkpoint.memory import InMemorySaver
from pipeline_fixtures import FAST_RETRY
from server_fixtures import TOKEN, make_app, make_store
from wrap_apps import AGENT_QUESTION, answering, rag_agent

from tracerag import InMemoryEscalationHandler, TraceragMiddleware
from tracerag.middleware._served import ServedAgent
from tracerag.server._target import load_app
from tracerag.testing import ToolCallingChatModel

pytest.importorskip("fastapi")
from fastapi.testclient import TestClient

SENTENCE = "Under Clause 6.1, laptops and tablets are covered by an extended 24-month warranty."
WRONG_NUMBER = SENTENCE.replace("24-month", "36-month")
BEARER = {"Authorization": f"Bearer {TOKEN}"}


def replica(checkpointer, claim=WRONG_NUMBER):
    model = ToolCallingChatModel(
        responder=answering("24-month", claim=claim), model_name="tool-model-1", temperature=0.7
    )
    verified = TraceragMiddleware(
        n_samples=3, retry=FAST_RETRY, audit=None, escalation=InMemoryEscalationHandler()
    )
    return rag_agent(model, middleware=[verified], checkpointer=checkpointer), model


def thread_of(session: str) -> dict:
    return {"configurable": {"thread_id": session}}


@pytest.fixture
def replicas(tmp_path):
    saver = InMemorySaver()  # the checkpointer every replica shares (PostgresSaver in production)
    agent_a, model_a = replica(saver)
    agent_b, model_b = replica(saver)
    store = make_store(tmp_path)
    app_a, app_b = make_app(store, agent_a), make_app(store, agent_b)
    with TestClient(app_a) as a, TestClient(app_b) as b:
        yield a, b, agent_a, agent_b, model_a, model_b, store


def ask(client, session: str) -> dict:
    reply = client.post("/v1/answer", json={"question": AGENT_QUESTION, "session_id": session})
    assert reply.status_code == 200, reply.text
    return reply.json()


def decide(client, request_id: str, **body) -> None:
    reply = client.post(
        f"/review/api/items/{request_id}/decision",
        json={"reviewer": "bob", **body},
        headers=BEARER,
    )
    assert reply.status_code == 200, reply.text


def test_the_server_runs_the_agent_and_keeps_its_record(replicas):
    a, _b, agent_a, _agent_b, _model_a, _model_b, store = replicas
    body = ask(a, "customer-1")
    assert body["decision"] == "escalate" and body["answer"] is None
    assert body["audit_persisted"] is True
    trail = store.get(body["request_id"])
    assert trail.record["session_id"] == "customer-1"
    assert "36-month" in trail.audit.candidate_answer  # the record keeps the candidate
    state = agent_a.get_state(thread_of("customer-1"))
    assert state.interrupts and state.interrupts[0].value["request_id"] == body["request_id"]
    assert "36-month" not in json.dumps(state.values, default=repr)


def test_an_approval_on_another_replica_resumes_the_thread(replicas):
    a, b, _agent_a, agent_b, model_a, model_b, store = replicas
    body = ask(a, "customer-2")
    calls = model_a.call_count + model_b.call_count
    decide(b, body["request_id"], action="approve")
    state = agent_b.get_state(thread_of("customer-2"))
    assert not state.interrupts and not state.next
    final = state.values["messages"][-1]
    assert final.content == store.get(body["request_id"]).audit.candidate_answer
    assert state.values["tracerag_review"]["type"] == "approve"
    assert model_a.call_count + model_b.call_count == calls  # nothing was asked again


def test_an_edit_at_the_desk_is_the_thread_s_answer(replicas):
    a, b, agent_a, _agent_b, _model_a, _model_b, _store = replicas
    body = ask(a, "customer-3")
    edited = "Laptops have a 24-month warranty under Clause 6.1. [warranty]"
    decide(b, body["request_id"], action="edit", final_answer=edited, reason="wrong number")
    state = agent_a.get_state(thread_of("customer-3"))
    assert state.values["messages"][-1].content == edited
    assert "36-month" not in json.dumps(state.values, default=repr)


def test_a_passed_answer_is_served_as_it_is(tmp_path):
    agent, _ = replica(InMemorySaver(), claim=None)
    with TestClient(make_app(make_store(tmp_path), agent)) as client:
        body = ask(client, "customer-4")
    assert body["decision"] == "pass"
    assert body["answer"].startswith(SENTENCE)


def test_tracerag_serve_app_loads_a_create_agent_app(tmp_path, monkeypatch):
    monkeypatch.setattr(sys, "path", list(sys.path))  # load_app puts the app's directory first
    monkeypatch.delitem(sys.modules, "support_agent", raising=False)
    (tmp_path / "support_agent.py").write_text(
        textwrap.dedent(
            """
            from langgraph.checkpoint.memory import InMemorySaver
            from wrap_apps import answering, rag_agent

            from tracerag import TraceragMiddleware
            from tracerag.testing import ToolCallingChatModel

            model = ToolCallingChatModel(responder=answering("24-month"), model_name="m")
            agent = rag_agent(
                model,
                middleware=[TraceragMiddleware(n_samples=2, audit=None)],
                checkpointer=InMemorySaver(),
            )
            bare = rag_agent(model)
            """
        ),
        "utf-8",
    )
    served = load_app("support_agent:agent", app_dir=str(tmp_path))
    assert isinstance(served, ServedAgent)
    from tracerag.server._target import AppTargetError

    with pytest.raises(AppTargetError, match="TraceragMiddleware"):
        load_app("support_agent:bare", app_dir=str(tmp_path))
    sys.modules.pop("support_agent", None)


async def test_the_served_agent_is_a_runnable_on_every_surface():
    from tracerag import Response
    from tracerag.middleware._served import served_agent

    agent, model = replica(InMemorySaver(), claim=None)
    served = served_agent(agent)
    assert served is not None
    response = served.invoke({"question": AGENT_QUESTION, "session_id": "s-1"})
    assert isinstance(response, Response) and response.decision == "pass"
    (chunk,) = [c async for c in served.astream({"question": AGENT_QUESTION, "session_id": "s-2"})]
    assert chunk.decision == "pass"
    # each question is one turn on its session's thread: two turns on s-1
    served.invoke({"question": AGENT_QUESTION, "session_id": "s-1"})
    humans = [m for m in agent.get_state(thread_of("s-1")).values["messages"] if m.type == "human"]
    assert len(humans) == 2
    assert served_agent(rag_agent(model)) is None  # no TraceragMiddleware: not served this way


def test_the_answer_stream_tells_each_stage_and_no_withheld_text(replicas):
    a, *_ = replicas
    text = a.post(
        "/v1/answer/stream", json={"question": AGENT_QUESTION, "session_id": "customer-5"}
    ).text
    names = [
        line.removeprefix("event: ") for line in text.splitlines() if line.startswith("event: ")
    ]
    assert names[:6] == ["stage"] * 6 and names[-1] == "response", names
    assert "36-month" not in text
    assert '"decision": "escalate"' in text or '"decision":"escalate"' in text
