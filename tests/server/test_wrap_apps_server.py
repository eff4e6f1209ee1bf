"""A wrapped LangGraph app behind ``tracerag serve``'s API: the server runs its stages itself."""

from __future__ import annotations

import pytest

pytest.importorskip("fastapi")
from fastapi.testclient import TestClient
from langchain_core.documents import Document
from pipeline_fixtures import FAST_RETRY, POLICIES
from server_fixtures import make_app, make_store
from wrap_apps import QUESTION, cite_returns, retrieval_chain, tutorial_graph

from tracerag import validate_response, wrap
from tracerag.demo.kb import build_vectorstore
from tracerag.testing import ScriptedChatModel


def test_served_graph_answers_from_the_question_field(tmp_path):
    docs = [Document(page_content=d.page_content, metadata=dict(d.metadata)) for d in POLICIES]
    llm = ScriptedChatModel(responder=cite_returns, model_name="scripted-x")
    wrapped = wrap(tutorial_graph(build_vectorstore(docs), llm), n_samples=2, retry=FAST_RETRY)
    store = make_store(tmp_path)
    with TestClient(make_app(store, wrapped)) as client:
        reply = client.post("/v1/answer", json={"question": QUESTION})
    assert reply.status_code == 200
    body = reply.json()
    validate_response(body)
    assert body["decision"] == "pass", body["signal_detail"]
    assert body["evidence"][0]["material_id"] == "returns"  # ``[n]`` resolved in the run's order
    record = store.get(body["request_id"]).record
    assert record["retrieval"]["source"] == "runs"
    assert record["retrieval"]["count"] == 4
    assert record["versions"]["model"] == "scripted-x"


def test_served_retrieval_chain_gets_the_question_as_its_input(tmp_path):
    """The server's request is tracerag's own: the question goes in the field the app takes."""
    docs = [Document(page_content=d.page_content, metadata=dict(d.metadata)) for d in POLICIES]
    llm = ScriptedChatModel(responder=cite_returns, model_name="scripted-x")
    wrapped = wrap(retrieval_chain(build_vectorstore(docs), llm), n_samples=2, retry=FAST_RETRY)
    store = make_store(tmp_path)
    with TestClient(make_app(store, wrapped)) as client:
        reply = client.post("/v1/answer", json={"question": QUESTION, "session_id": "s-1"})
    assert reply.status_code == 200
    body = reply.json()
    assert body["decision"] == "pass", body["signal_detail"]
    assert [c.prompt.count(QUESTION) for c in llm.calls] == [1, 1]
    record = store.get(body["request_id"]).record
    assert record["session_id"] == "s-1"
    assert record["retrieval"]["source"] == "retriever"
