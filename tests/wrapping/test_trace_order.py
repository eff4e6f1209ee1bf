"""The trace pictures in docs/traces.md are the order the stages really run in.

The pipeline's default plans before it samples; a wrapped app's plan is read from its answers,
so its plan span follows the sample span. Both pictures are checked against real traces.
"""

from __future__ import annotations

import re

from pipeline_fixtures import FAST_RETRY, GOOD, PLAN, QUESTION, REPO
from wrap_apps import AGENT_QUESTION, answering, rag_agent

from tracerag import RAGPipeline, wrap
from tracerag.testing import ScriptCall, ScriptedChatModel, ToolCallingChatModel, tracerag_name

PAGE = (REPO / "docs" / "traces.md").read_text("utf-8")


def pictured_orders() -> list[list[str]]:
    """The stage spans of each span tree drawn on the page, in the order drawn."""
    trees = re.findall(r"```\n(invoke_\w+ .*?)```", PAGE, re.S)
    assert len(trees) == 2, "the page draws the pipeline's trace and a wrapped app's"
    # each child line names its span, then its tracerag name (the first ``tracerag.*`` on it)
    return [re.findall(r"^[├└]─ [^\n]*?(tracerag\.\w+)", tree, re.M) for tree in trees]


def stage_order(spans, request_id: str) -> list[str]:
    root = spans.root(request_id)
    return [tracerag_name(child) for child in spans.children(root)]


def test_the_pipeline_picture_is_its_trace(retriever, spans):
    def respond(call: ScriptCall) -> str:
        return PLAN if call.task == "plan" else GOOD

    pipeline = RAGPipeline(
        retriever,
        ScriptedChatModel(responder=respond),
        prompt_version="p1",
        model_version="m1",
        n_samples=2,
        retry=FAST_RETRY,
        tracer_provider=spans.provider,
    )
    response = pipeline.invoke(QUESTION)
    assert stage_order(spans, response.request_id) == pictured_orders()[0]


def test_the_wrap_picture_is_a_wrapped_agents_trace(spans):
    model = ToolCallingChatModel(responder=answering("24-month"), model_name="m", temperature=0.7)
    response = wrap(rag_agent(model), n_samples=2, tracer_provider=spans.provider).invoke(
        AGENT_QUESTION
    )
    order = stage_order(spans, response.request_id)
    assert order == pictured_orders()[1]
    assert order.index("tracerag.plan") > order.index("tracerag.sample")
