"""Spans as the OpenTelemetry GenAI conventions name them, read through the real SDK.

A pipeline request and a wrapped agent's turn: the root is ``invoke_workflow tracerag`` /
``invoke_agent {name}`` with its decision, the retrieve stage ``retrieval {data source}``, each
sample's model call ``chat {model}``, the agent's tool runs ``execute_tool {tool}``; a turn on a
thread carries its conversation id; the verdict is a ``gen_ai.evaluation.result``; evaluations
are log records too once the application configured a LoggerProvider; and a request's root span
holds no time outside its children but the loop's own bookkeeping.
"""

from __future__ import annotations

import json
import time
from collections.abc import Iterator
from typing import Any

import pytest
from langgraph.checkpoint.memory import InMemorySaver
from opentelemetry import _logs
from opentelemetry.sdk._logs import LoggerProvider
from opentelemetry.sdk._logs.export import InMemoryLogRecordExporter, SimpleLogRecordProcessor
from opentelemetry.sdk.trace import ReadableSpan
from opentelemetry.trace import SpanKind, StatusCode
from opentelemetry.util._once import Once
from pipeline_fixtures import FABRICATED, FAST_RETRY, GOOD, QUESTION, scripted
from wrap_apps import AGENT_QUESTION, answering, rag_agent

from tracerag import MissingVersionError, wrap
from tracerag import _semconv as sc
from tracerag.contract import _schemas
from tracerag.events import StageEvent
from tracerag.telemetry import _content_capture, _evaluations
from tracerag.testing import SpanCapture, ToolCallingChatModel, tracerag_name


@pytest.fixture(autouse=True)
def _policy(monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    monkeypatch.delenv(sc.GENAI_CAPTURE_CONTENT_ENV, raising=False)
    monkeypatch.delenv(_content_capture.CAPTURE_ENV, raising=False)
    _content_capture.reset()
    yield
    _content_capture.reset()


@pytest.fixture
def logs(monkeypatch: pytest.MonkeyPatch) -> Iterator[InMemoryLogRecordExporter]:
    """An application's LoggerProvider, installed globally (undone after)."""
    from opentelemetry._logs import _internal

    monkeypatch.setattr(_internal, "_LOGGER_PROVIDER", None)
    monkeypatch.setattr(_internal, "_LOGGER_PROVIDER_SET_ONCE", Once())
    exporter = InMemoryLogRecordExporter()
    provider = LoggerProvider()
    provider.add_log_record_processor(SimpleLogRecordProcessor(exporter))
    _logs.set_logger_provider(provider)
    yield exporter
    provider.shutdown()


def evaluations(span: ReadableSpan) -> dict[str, dict[str, Any]]:
    return {
        str(e.attributes[sc.GENAI_EVALUATION_NAME]): dict(e.attributes)
        for e in span.events
        if e.name == sc.GENAI_EVALUATION_EVENT and e.attributes
    }


# -- a pipeline request --------------------------------------------------------------------------


def test_a_pipeline_request_is_named_by_the_conventions(make_pipeline, spans: SpanCapture):
    response = make_pipeline(scripted([GOOD] * 5)).invoke(
        {"question": QUESTION, "session_id": "chat-42"}
    )
    assert response.decision == "pass"
    rid = response.request_id
    assert spans.tree_problems(rid) == []
    root = spans.root(rid)
    assert root.name == "invoke_workflow tracerag [pass]"
    attrs = root.attributes or {}
    assert attrs[sc.GENAI_OPERATION_NAME] == "invoke_workflow"
    assert attrs[sc.GENAI_WORKFLOW_NAME] == "tracerag"
    assert attrs[sc.GENAI_CONVERSATION_ID] == "chat-42"
    assert attrs[sc.OI_SESSION_ID] == "chat-42"
    assert attrs[sc.DECISION] == "pass"  # tracerag's own names are kept beside
    assert root.status.status_code is StatusCode.UNSET

    (retrieve,) = spans.named(sc.SPAN_RETRIEVE, rid)
    assert retrieve.name == "retrieval DemoVectorStore"
    r = retrieve.attributes or {}
    assert r[sc.GENAI_OPERATION_NAME] == "retrieval"
    assert r[sc.GENAI_DATA_SOURCE_ID] == "DemoVectorStore"
    assert r[sc.GENAI_REQUEST_TOP_K] == 5.0
    assert sc.GENAI_RETRIEVAL_DOCUMENTS not in r  # opt-in: the switch is not set
    assert r[sc.oi_document(0, "id")]  # OpenInference's documents are kept

    chats = spans.named(sc.SPAN_SAMPLE_ONE, rid)
    assert len(chats) == 5
    for chat in chats:
        assert chat.name == "chat scripted-chat-model"
        assert chat.kind is SpanKind.CLIENT
        a = chat.attributes or {}
        assert a[sc.GENAI_OPERATION_NAME] == "chat"
        assert a[sc.GENAI_REQUEST_MODEL] == "scripted-chat-model"

    # the verdict beside the per-signal evaluations
    verdict = evaluations(root)[sc.EVALUATION_VERDICT]
    assert verdict[sc.GENAI_EVALUATION_SCORE_VALUE] == pytest.approx(response.confidence)
    assert verdict[sc.GENAI_EVALUATION_SCORE_LABEL] == "pass"
    (verify,) = spans.named(sc.SPAN_VERIFY, rid)
    assert {"citation_validity", "self_consistency"} <= set(evaluations(verify))


def test_an_escalated_request_says_so_in_its_name_not_as_an_error(make_pipeline, spans):
    response = make_pipeline(scripted([FABRICATED] * 5)).invoke(QUESTION)
    assert response.decision == "escalate"
    root = spans.root(response.request_id)
    assert root.name == "invoke_workflow tracerag [escalate]"
    # an escalation is the service working: the span status is left unset, not ERROR
    assert root.status.status_code is StatusCode.UNSET
    verdict = evaluations(root)[sc.EVALUATION_VERDICT]
    assert verdict[sc.GENAI_EVALUATION_SCORE_LABEL] == "escalate"
    assert verdict[sc.GENAI_EVALUATION_SCORE_VALUE] == pytest.approx(response.confidence)
    assert "ticket" in str(verdict[sc.GENAI_EVALUATION_EXPLANATION])


def test_a_refused_request_keeps_the_plain_name_and_is_an_error(make_pipeline, spans):
    with pytest.raises(MissingVersionError):
        make_pipeline(scripted([GOOD]), model_version=None).invoke(QUESTION)
    (root,) = spans.named(sc.SPAN_REQUEST)
    assert root.name == "invoke_workflow tracerag"  # no decision was reached
    assert root.status.status_code is StatusCode.ERROR  # a refusal is an error of the request
    assert sc.EVALUATION_VERDICT not in evaluations(root)
    # refused before the last stage: its record is delivered in a span of its own
    assert [tracerag_name(c) for c in spans.children(root)] == [
        sc.SPAN_REGISTER,
        sc.SPAN_DELIVER,
    ]


def test_retrieval_documents_are_opt_in_and_under_the_capture_policy(
    make_pipeline, spans, monkeypatch: pytest.MonkeyPatch
):
    monkeypatch.setenv(sc.GENAI_CAPTURE_CONTENT_ENV, "true")
    response = make_pipeline(scripted([GOOD] * 5)).invoke(QUESTION)
    (retrieve,) = spans.named(sc.SPAN_RETRIEVE, response.request_id)
    documents = json.loads(str((retrieve.attributes or {})[sc.GENAI_RETRIEVAL_DOCUMENTS]))
    assert len(documents) == 5
    returns = next(d for d in documents if d["id"] == "returns")
    assert "30 days" in returns["content"]
    assert isinstance(returns["score"], float)
    assert any(d["id"] == "warranty-zh" and "保修" in d["content"] for d in documents)

    spans.clear()
    _content_capture.set_capture_content(False)  # tracerag's own policy still governs the text
    response = make_pipeline(scripted([GOOD] * 5)).invoke(QUESTION)
    (retrieve,) = spans.named(sc.SPAN_RETRIEVE, response.request_id)
    documents = json.loads(str((retrieve.attributes or {})[sc.GENAI_RETRIEVAL_DOCUMENTS]))
    assert {d["id"] for d in documents} >= {"returns", "warranty-zh"}
    assert all("content" not in d for d in documents)

    spans.clear()
    monkeypatch.setenv(sc.GENAI_CAPTURE_CONTENT_ENV, "false")
    response = make_pipeline(scripted([GOOD] * 5)).invoke(QUESTION)
    (retrieve,) = spans.named(sc.SPAN_RETRIEVE, response.request_id)
    assert sc.GENAI_RETRIEVAL_DOCUMENTS not in (retrieve.attributes or {})


# -- a wrapped agent's turn ----------------------------------------------------------------------


def agent_model() -> ToolCallingChatModel:
    return ToolCallingChatModel(
        responder=answering("24-month"), model_name="tool-model-1", temperature=0.7
    )


def test_a_wrapped_agent_turn_on_a_thread(spans: SpanCapture):
    agent = rag_agent(agent_model(), checkpointer=InMemorySaver(), name="policy_agent")
    wrapped = wrap(agent, n_samples=3, retry=FAST_RETRY, tracer_provider=spans.provider)
    config = {"configurable": {"thread_id": "customer-7"}}
    response = wrapped.invoke({"messages": [("user", AGENT_QUESTION)]}, config)
    assert response.decision == "pass"
    rid = response.request_id
    assert spans.tree_problems(rid) == []
    root = spans.root(rid)
    assert root.name == "invoke_agent policy_agent [pass]"
    attrs = root.attributes or {}
    assert attrs[sc.GENAI_OPERATION_NAME] == "invoke_agent"
    assert attrs[sc.GENAI_AGENT_NAME] == "policy_agent"
    assert attrs[sc.GENAI_CONVERSATION_ID] == "customer-7"
    assert attrs[sc.OI_SESSION_ID] == "customer-7"
    verdict = evaluations(root)[sc.EVALUATION_VERDICT]
    assert verdict[sc.GENAI_EVALUATION_SCORE_LABEL] == "pass"

    (retrieve,) = spans.named(sc.SPAN_RETRIEVE, rid)
    assert (retrieve.attributes or {})[sc.GENAI_OPERATION_NAME] == "retrieval"
    chats = spans.named(sc.SPAN_SAMPLE_ONE, rid)
    assert [c.name for c in chats] == ["chat tool-model-1"] * 3
    # the app's tool runs, each under the sample whose run called it
    tools = spans.named(sc.SPAN_TOOL, rid)
    assert tools, "the agent's retrieval tool ran inside the request"
    chat_ids = {c.context.span_id for c in chats}
    for tool in tools:
        assert tool.name == "execute_tool retrieve_context"
        t = tool.attributes or {}
        assert t[sc.GENAI_OPERATION_NAME] == "execute_tool"
        assert t[sc.GENAI_TOOL_NAME] == "retrieve_context"
        assert t[sc.GENAI_TOOL_CALL_ID]
        assert tool.parent is not None and tool.parent.span_id in chat_ids
        assert tool.status.status_code is StatusCode.UNSET

    second = wrapped.invoke({"messages": [("user", AGENT_QUESTION)]}, config)
    assert (spans.root(second.request_id).attributes or {})[
        sc.GENAI_CONVERSATION_ID
    ] == "customer-7"


def test_a_turn_without_a_thread_has_no_conversation_id(spans: SpanCapture):
    wrapped = wrap(rag_agent(agent_model()), n_samples=2, tracer_provider=spans.provider)
    response = wrapped.invoke(AGENT_QUESTION)
    root = spans.root(response.request_id)
    assert root.name.startswith("invoke_agent ")
    assert sc.GENAI_CONVERSATION_ID not in (root.attributes or {})


def test_a_failing_tool_is_an_error_span(spans: SpanCapture):
    from langchain_core.tools import tool

    @tool
    def lookup(query: str) -> str:
        """Look the policy up."""
        raise RuntimeError("the policy service is down")

    from langchain.agents import create_agent

    model = ToolCallingChatModel(
        responder=lambda call: "I don't know.", model_name="tool-model-1", temperature=0.7
    )
    agent = create_agent(model, [lookup])
    wrapped = wrap(agent, n_samples=1, retry=FAST_RETRY, tracer_provider=spans.provider)
    response = wrapped.invoke(AGENT_QUESTION)  # the agent's ToolNode hands the error back
    assert response.decision == "escalate"
    failed = [s for s in spans.spans() if tracerag_name(s) == sc.SPAN_TOOL]
    assert failed, "the tool's run is a span"
    assert all(s.status.status_code is StatusCode.ERROR for s in failed)
    assert all((s.attributes or {})[sc.ERROR_TYPE] == "RuntimeError" for s in failed)


# -- evaluations as log records ------------------------------------------------------------------


def test_evaluations_are_log_records_when_the_app_configured_logs(
    make_pipeline, spans, logs: InMemoryLogRecordExporter
):
    assert _evaluations.logs_configured()
    response = make_pipeline(scripted([FABRICATED] * 5)).invoke(QUESTION)
    root = spans.root(response.request_id)
    (verify,) = spans.named(sc.SPAN_VERIFY, response.request_id)
    records = [r.log_record for r in logs.get_finished_logs()]
    assert records and all(r.event_name == sc.GENAI_EVALUATION_EVENT for r in records)
    by_name = {str((r.attributes or {})[sc.GENAI_EVALUATION_NAME]): r for r in records}
    verdict = by_name[sc.EVALUATION_VERDICT]
    # correlated with the span it evaluates
    assert verdict.trace_id == root.context.trace_id
    assert verdict.span_id == root.context.span_id
    assert (verdict.attributes or {})[sc.GENAI_EVALUATION_SCORE_LABEL] == "escalate"
    citation = by_name["citation_validity"]
    assert citation.span_id == verify.context.span_id
    # and the span events are still there (the default every backend shows)
    assert sc.EVALUATION_VERDICT in evaluations(root)


def test_no_log_records_without_a_configured_logger_provider(make_pipeline, spans):
    assert not _evaluations.logs_configured()  # the API's proxy: nothing configured
    response = make_pipeline(scripted([GOOD] * 5)).invoke(QUESTION)
    assert sc.EVALUATION_VERDICT in evaluations(spans.root(response.request_id))


# -- no unaccounted time -------------------------------------------------------------------------


def uncovered_ns(spans: SpanCapture, root: ReadableSpan) -> int:
    """The root span's time that lies in none of its children."""
    assert root.start_time is not None and root.end_time is not None
    covered = 0
    end = root.start_time
    for child in spans.children(root):
        assert child.start_time is not None and child.end_time is not None
        start = max(child.start_time, end)
        if child.end_time > start:
            covered += child.end_time - start
            end = child.end_time
    return (root.end_time - root.start_time) - covered


SINK_S = 0.2
LISTENER_S = 0.04


def test_every_slow_part_of_a_first_request_is_in_a_child_span(make_pipeline, spans):
    """A cold validator, a slow record sink and a slow stage listener: the root's time outside
    its children stays a small part of what they took (the loop's own bookkeeping)."""
    _schemas.cache_clear()  # as in a fresh process: the Response validator is not compiled

    def sink(record: dict[str, Any]) -> bool:
        time.sleep(SINK_S)
        return True

    async def listener(event: StageEvent) -> None:
        time.sleep(LISTENER_S)

    pipeline = make_pipeline(scripted([GOOD] * 5), audit=sink)
    response = pipeline.invoke(QUESTION, on_stage=listener)
    root = spans.root(response.request_id)
    children = [tracerag_name(c) for c in spans.children(root)]
    assert children == list(sc.STAGE_SPANS.values())  # the delivery is in assemble's span
    slow_ns = (SINK_S + 6 * LISTENER_S) * 1e9
    assert root.end_time - root.start_time > slow_ns  # type: ignore[operator]
    # structural: the slow parts (0.44 s) are inside children; what is left is bookkeeping,
    # a bound far above it (microseconds) and far below the slow parts
    assert uncovered_ns(spans, root) < 0.1 * slow_ns


def test_phoenix_gets_the_verdict_once_as_the_roots_confidence(make_pipeline, spans):
    from tracerag.telemetry._phoenix import PhoenixEvaluationExporter

    response = make_pipeline(scripted([FABRICATED] * 5)).invoke(QUESTION)
    root = spans.root(response.request_id)
    records = PhoenixEvaluationExporter.annotations(spans.for_request(response.request_id))
    on_root = [r for r in records if r["span_id"] == f"{root.context.span_id:016x}"]
    assert [r["name"] for r in on_root] == ["confidence"]
    assert on_root[0]["result"] == {"score": response.confidence, "label": "escalate"}
    assert {"citation_validity", "self_consistency"} <= {r["name"] for r in records}
