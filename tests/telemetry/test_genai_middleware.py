"""A ``TraceragMiddleware`` turn in the GenAI conventions, read through the real SDK.

The middleware runs the same loop as the other front doors, so its turn is named the same way:
``invoke_agent {agent name} [decision]`` with the thread as its conversation id, the verdict as
a ``gen_ai.evaluation.result``, each sampled answering call a ``chat {model}`` span, and no time
outside the root's children but bookkeeping.
"""

from __future__ import annotations

import importlib
from pathlib import Path
from typing import Any

import pytest
from langgraph.checkpoint.memory import InMemorySaver
from pipeline_fixtures import FAST_RETRY
from wrap_apps import AGENT_QUESTION, answering, rag_agent

import tracerag
from tracerag import _semconv as sc
from tracerag.testing import SpanCapture, ToolCallingChatModel, tracerag_name


def _middleware_in_this_tree() -> Any:
    """``tracerag.middleware`` when it is part of the tracerag imported here, else None."""
    try:
        module = importlib.import_module("tracerag.middleware")
    except ImportError:
        return None
    here = Path(tracerag.__file__).resolve().parent
    return module if Path(module.__file__ or "").resolve().parent.parent == here else None


middleware = _middleware_in_this_tree()
pytestmark = pytest.mark.skipif(
    middleware is None, reason="the TraceragMiddleware front door is not in this tree"
)


def test_a_middleware_turn_on_a_thread(spans: SpanCapture) -> None:
    model = ToolCallingChatModel(
        responder=answering("24-month"), model_name="tool-model-1", temperature=0.7
    )
    guard = middleware.TraceragMiddleware(
        n_samples=3, retry=FAST_RETRY, audit=None, tracer_provider=spans.provider
    )
    agent = rag_agent(model, middleware=[guard], checkpointer=InMemorySaver(), name="policy_agent")
    result = agent.invoke(
        {"messages": [{"role": "user", "content": AGENT_QUESTION}]},
        {"configurable": {"thread_id": "customer-9"}},
    )
    response = result["tracerag"]
    assert response["decision"] == "pass"
    rid = response["request_id"]
    root = spans.root(rid)
    assert root.name == "invoke_agent policy_agent [pass]"
    attrs = root.attributes or {}
    assert attrs[sc.GENAI_OPERATION_NAME] == "invoke_agent"
    assert attrs[sc.GENAI_AGENT_NAME] == "policy_agent"
    assert attrs[sc.GENAI_CONVERSATION_ID] == "customer-9"
    verdicts = [
        e.attributes
        for e in root.events
        if e.name == sc.GENAI_EVALUATION_EVENT
        and (e.attributes or {}).get(sc.GENAI_EVALUATION_NAME) == sc.EVALUATION_VERDICT
    ]
    assert len(verdicts) == 1
    assert verdicts[0][sc.GENAI_EVALUATION_SCORE_LABEL] == "pass"
    assert verdicts[0][sc.GENAI_EVALUATION_SCORE_VALUE] == pytest.approx(response["confidence"])
    chats = spans.named(sc.SPAN_SAMPLE_ONE, rid)
    assert [c.name for c in chats] == ["chat tool-model-1"] * 3
    (retrieve,) = spans.named(sc.SPAN_RETRIEVE, rid)
    assert (retrieve.attributes or {})[sc.GENAI_OPERATION_NAME] == "retrieval"
    assert [tracerag_name(c) for c in spans.children(root)][-1] == sc.SPAN_ASSEMBLE
