"""Real Jaeger (v2 all-in-one, default limits): what a user sees, read through Jaeger's query API.

- the demo, configured by the standard OTEL_* variables only, gives one complete trace per
  request, and the trace link it prints opens that trace's page;
- a chain written as LangChain's RAG tutorial writes it, under ``tracerag.wrap()``, the same;
- issue 9's load (k=20 materials of 4 KB, N=10, 100 requests) loses no span over HTTP or gRPC;
- metrics sent to Jaeger (which takes traces only) are reported once and stopped;
- the search list tells an escalated request from a passed one by its root's name, counts
  neither as an error, and the tag ``tracerag.decision=escalate`` finds the escalated ones.
"""

from __future__ import annotations

import json
import logging
import os
import re
import subprocess
import sys
import time
import urllib.parse
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from jaeger_backend import Jaeger, check_request_trace, get, start_jaeger
from langchain_core.documents import Document
from langchain_core.output_parsers import StrOutputParser
from langchain_core.prompts import ChatPromptTemplate
from langchain_core.runnables import RunnablePassthrough
from pipeline_fixtures import FABRICATED, FAST_RETRY, GOOD, PLAN, POLICIES, QUESTION, REPO

from tracerag import RAGPipeline
from tracerag import _semconv as semconv
from tracerag.telemetry import _content_capture, _export, _instruments, _meters, _providers
from tracerag.testing import ScriptedChatModel

pytestmark = pytest.mark.integration

ROOT = REPO
OTEL_VARS = (
    "OTEL_EXPORTER_OTLP_ENDPOINT",
    "OTEL_EXPORTER_OTLP_TRACES_ENDPOINT",
    "OTEL_EXPORTER_OTLP_METRICS_ENDPOINT",
    "OTEL_EXPORTER_OTLP_PROTOCOL",
    "OTEL_TRACES_EXPORTER",
    "OTEL_METRICS_EXPORTER",
    "OTEL_SERVICE_NAME",
    "OTEL_RESOURCE_ATTRIBUTES",
    "TRACERAG_PROMETHEUS_PORT",
    "TRACERAG_TRACE_UI",
)


@pytest.fixture(scope="module")
def jaeger(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Jaeger]:
    yield from start_jaeger(tmp_path_factory.mktemp("jaeger"))


@pytest.fixture(autouse=True)
def clean(monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    for name in (*OTEL_VARS, _content_capture.CAPTURE_ENV):
        monkeypatch.delenv(name, raising=False)
    _providers.reset_for_tests()
    _meters.reset()
    yield
    _providers.reset_for_tests()
    _meters.reset()


DEMO_LINE = re.compile(r"request_id: (?P<request>[0-9a-f]+)\s+trace_id: (?P<trace>[0-9a-f]{32})")
LINK_LINE = re.compile(r"^\s+trace: (?P<link>\S+)$", re.M)


def test_demo_requests_are_complete_traces_and_their_links_open_them(
    jaeger: Jaeger, tmp_path: Path
) -> None:
    service = f"tracerag-demo-{uuid.uuid4().hex[:8]}"
    env = {
        **{k: v for k, v in os.environ.items() if not k.startswith("OTEL_")},
        "OTEL_EXPORTER_OTLP_ENDPOINT": jaeger.otlp_http,
        "OTEL_METRICS_EXPORTER": "none",
        "OTEL_SERVICE_NAME": service,
        "TRACERAG_TRACE_UI": f"jaeger={jaeger.url}",
        "PYTHONPATH": str(ROOT),
    }
    done = subprocess.run(
        [
            sys.executable,
            "-m",
            "tracerag.cli",
            "demo",
            "--store",
            str(tmp_path / "audit.sqlite"),
            "--traces",
            str(tmp_path / "traces.jsonl"),
        ],
        cwd=tmp_path,
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    requests = [m.groupdict() for m in DEMO_LINE.finditer(done.stdout)]
    links = LINK_LINE.findall(done.stdout)
    assert len(requests) == 8
    assert len(links) == len(requests)
    for request, link in zip(requests, links, strict=True):
        spans = jaeger.wait_for_request(request["trace"], 5)
        check_request_trace(spans, request["request"], 5)
        assert spans[0].resource["service.name"] == service
        # the printed link is the Jaeger UI's trace route for this trace, served by Jaeger
        assert link == f"{jaeger.url}/trace/{request['trace']}"
        status, body, content_type = get(link)
        assert status == 200
        assert content_type.startswith("text/html")
        assert b"JAEGER_CONFIG" in body or b"jaeger" in body.lower()
    assert service in jaeger.services()


PROMPT = ChatPromptTemplate.from_template(
    "You are an assistant for question-answering tasks. Use the following pieces of retrieved "
    "context to answer the question. Cite the passages you use like [1]. If you don't know "
    "the answer, just say that you don't know.\n"
    "Question: {question}\nContext: {context}\nAnswer:"
)


def format_docs(docs: list[Document]) -> str:
    return "\n\n".join(doc.page_content for doc in docs)


def tutorial_chain():
    """The LCEL chain of LangChain's RAG tutorial, over the demo knowledge base."""
    from tracerag.demo.kb import build_retriever
    from tracerag.demo.models.extractive import ExtractiveChatModel

    retriever = build_retriever(k=4)  # an InMemoryVectorStore's as_retriever()
    llm = ExtractiveChatModel(temperature=0.7)
    return (
        {"context": retriever | format_docs, "question": RunnablePassthrough()}
        | PROMPT
        | llm
        | StrOutputParser()
    )


def test_wrapped_tutorial_chain_requests_are_complete_traces(
    jaeger: Jaeger, monkeypatch: pytest.MonkeyPatch
) -> None:
    import tracerag
    from tracerag.demo.kb import load_questions

    monkeypatch.setenv("OTEL_EXPORTER_OTLP_ENDPOINT", jaeger.otlp_grpc)
    monkeypatch.setenv("OTEL_EXPORTER_OTLP_PROTOCOL", "grpc")
    monkeypatch.setenv("OTEL_METRICS_EXPORTER", "none")
    monkeypatch.setenv("OTEL_SERVICE_NAME", "tracerag-wrap-test")
    wrapped = tracerag.wrap(tutorial_chain(), n_samples=4, audit=None)
    responses = [wrapped.invoke(q["question"]) for q in load_questions()[:3]]
    assert _providers.force_flush(10_000)
    assert len(responses) == 3
    for response in responses:
        spans = jaeger.wait_for_request(response.trace_id, 4)
        tree = check_request_trace(spans, response.request_id, 4)
        (root,) = tree.roots()
        assert root.attributes[semconv.MODE] == "wrap"
        assert root.attributes[semconv.CONFIDENCE] == response.confidence


def load_documents(k: int, size: int) -> list[Document]:
    docs = []
    for i in range(k):
        text = (
            f"Policy {i}. Customers may return unused items within 30 days of delivery. "
            f"Clause {i}.{i} covers refunds, exchanges and store credit for order type {i}. "
        )
        docs.append(
            Document(
                page_content=(text * (size // len(text) + 1))[:size],
                metadata={"id": f"policy-{i}", "title": f"Policy {i}"},
            )
        )
    return docs


@pytest.mark.parametrize("protocol", ["grpc", "http/protobuf"])
def test_acceptance_load_loses_no_span(
    jaeger: Jaeger, monkeypatch: pytest.MonkeyPatch, protocol: str
) -> None:
    """Issue 9 item 1: k=20 materials of 4 KB, N=10, 100 requests, Jaeger's default limits."""
    from tracerag.demo.kb import build_vectorstore

    endpoint = jaeger.otlp_grpc if protocol == "grpc" else jaeger.otlp_http
    monkeypatch.setenv("OTEL_EXPORTER_OTLP_ENDPOINT", endpoint)
    monkeypatch.setenv("OTEL_EXPORTER_OTLP_PROTOCOL", protocol)
    monkeypatch.setenv("OTEL_METRICS_EXPORTER", "none")
    monkeypatch.setenv("OTEL_SERVICE_NAME", f"tracerag-load-{protocol.split('/')[0]}")
    k, n, requests = 20, 10, 100
    retriever = build_vectorstore(load_documents(k, 4096)).as_retriever(search_kwargs={"k": k})
    answer = "Customers may return unused items within 30 days of delivery. [policy-0]"
    rag = RAGPipeline(
        retriever,
        ScriptedChatModel(
            responses=[answer],
            plan_responses=['{"material_ids": ["policy-0"], "key_facts": ["30 days"]}'],
        ),
        prompt_version="load-1",
        model_version="scripted",
        n_samples=n,
        min_samples=n,  # the load is N=10 samples per request: all drawn, none stopped early
        audit=None,
    )
    dropped_before = _export.dropped_spans()
    responses = [
        rag.invoke(f"Within how many days can I return item {i}?") for i in range(requests)
    ]
    assert _providers.force_flush(60_000)
    per_trace = 1 + 6 + n
    received = 0
    payload = 0
    for response in responses:
        spans = jaeger.wait_for_trace(response.trace_id, per_trace)
        assert len(spans) == per_trace, response.trace_id
        received += len(spans)
        payload += sum(len(str(v)) for s in spans for v in s.attributes.values())
    assert received == requests * per_trace
    assert _export.dropped_spans() == dropped_before
    # what went through is more than one 4 MiB message: batches had to fit
    assert payload > 4 * 1024 * 1024, payload


@pytest.mark.parametrize("protocol", ["grpc", "http/protobuf"])
def test_metrics_to_a_traces_only_backend_are_reported_once_and_stopped(
    jaeger: Jaeger, caplog: pytest.LogCaptureFixture, protocol: str
) -> None:
    import time

    endpoint = jaeger.otlp_grpc if protocol == "grpc" else jaeger.otlp_http
    with caplog.at_level(logging.INFO):
        provider = _meters.configure_metrics(
            otlp=True, endpoint=endpoint, protocol=protocol, export_interval_millis=100
        )
        for _ in range(5):
            _instruments.record_retry("sample", TimeoutError("slow"))
            time.sleep(0.1)  # sleep is the behaviour: one record per export interval
        provider.force_flush(5_000)  # type: ignore[attr-defined]
        _meters.reset()
    notices = [r for r in caplog.records if "does not accept OTLP metrics" in r.getMessage()]
    assert len(notices) == 1
    assert "OTEL_METRICS_EXPORTER=none" in notices[0].getMessage()
    assert notices[0].levelno == logging.WARNING
    errors = [r for r in caplog.records if r.levelno >= logging.ERROR]
    assert errors == [], [r.getMessage() for r in errors]


# -- a verdict you can find ----------------------------------------------------------------------
# Jaeger's search page lists each trace as ``{service}: {root span name}`` with its duration,
# span count and error count (spans whose status is ERROR), none of the root's tags. The root's
# name carries the decision, so the list tells an escalated request from a passed one, and
# neither counts an error: an escalation is the service working. The tag
# ``tracerag.decision=escalate`` finds the escalated requests and only them.


def search(jaeger: Jaeger, service: str, tags: dict[str, str] | None = None) -> list[Any]:
    """The traces of Jaeger's search page (``/api/traces``, what its UI lists)."""
    query = {"service": service, "limit": "100", "lookback": "1h"}
    if tags:
        query["tags"] = json.dumps(tags)
    status, body, _ = get(f"{jaeger.url}/api/traces?{urllib.parse.urlencode(query)}")
    assert status == 200, body[:300]
    return list(json.loads(body)["data"] or [])


def listed(trace: dict[str, Any]) -> tuple[str, int]:
    """What the search list shows of a trace: the root span's name and the error count."""
    spans = trace["spans"]
    (root,) = [s for s in spans if not s.get("references")]
    errors = sum(
        any(t["key"] == "error" and t["value"] in (True, "true") for t in s.get("tags", []))
        for s in spans
    )
    return root["operationName"], errors


def tag(span: dict[str, Any], key: str) -> Any:
    return next((t["value"] for t in span.get("tags", []) if t["key"] == key), None)


def verdict_pipeline(answer: str) -> RAGPipeline:
    from tracerag.demo.kb import build_vectorstore

    docs = [Document(page_content=d.page_content, metadata=dict(d.metadata)) for d in POLICIES]
    return RAGPipeline(
        build_vectorstore(docs).as_retriever(search_kwargs={"k": 5}),
        ScriptedChatModel(responses=[answer], plan_responses=[PLAN]),
        prompt_version="verdict-1",
        model_version="scripted",
        n_samples=3,
        retry=FAST_RETRY,
        audit=None,
    )


def wait_for(jaeger: Jaeger, service: str, count: int) -> list[Any]:
    deadline = time.monotonic() + 30
    found = search(jaeger, service)
    while len(found) < count and time.monotonic() < deadline:
        time.sleep(0.3)
        found = search(jaeger, service)
    return found


def test_the_search_list_tells_escalated_from_passed_and_the_tag_finds_them(
    jaeger: Jaeger, monkeypatch: pytest.MonkeyPatch
) -> None:
    service = f"tracerag-verdict-{uuid.uuid4().hex[:8]}"
    monkeypatch.setenv("OTEL_EXPORTER_OTLP_ENDPOINT", jaeger.otlp_http)
    monkeypatch.setenv("OTEL_METRICS_EXPORTER", "none")
    monkeypatch.setenv("OTEL_SERVICE_NAME", service)
    passing, escalating = verdict_pipeline(GOOD), verdict_pipeline(FABRICATED)
    passed = [passing.invoke(QUESTION) for _ in range(3)]
    escalated = [escalating.invoke(QUESTION) for _ in range(2)]
    assert {r.decision for r in passed} == {"pass"}
    assert {r.decision for r in escalated} == {"escalate"}
    assert _providers.force_flush(10_000)

    everything = wait_for(jaeger, service, 5)
    assert len(everything) == 5
    shown = {t["traceID"]: listed(t) for t in everything}
    for response in passed:
        assert shown[response.trace_id] == ("invoke_workflow tracerag [pass]", 0)
    for response in escalated:
        # told apart by the name the list shows; not counted as an error of the service
        assert shown[response.trace_id] == ("invoke_workflow tracerag [escalate]", 0)

    found = search(jaeger, service, {semconv.DECISION: "escalate"})
    assert {t["traceID"] for t in found} == {r.trace_id for r in escalated}
    for trace in found:
        (root,) = [s for s in trace["spans"] if not s.get("references")]
        assert tag(root, semconv.DECISION) == "escalate"
        assert tag(root, semconv.GENAI_OPERATION_NAME) == "invoke_workflow"
        assert tag(root, semconv.SPAN_NAME) == semconv.SPAN_REQUEST
    found = search(jaeger, service, {semconv.DECISION: "pass"})
    assert {t["traceID"] for t in found} == {r.trace_id for r in passed}
    # Jaeger lists the operations by name: the decisions are low-cardinality names
    status, body, _ = get(f"{jaeger.url}/api/services/{service}/operations")
    assert status == 200
    operations = set(json.loads(body)["data"])
    assert {"invoke_workflow tracerag [pass]", "invoke_workflow tracerag [escalate]"} <= operations


def test_a_failed_request_is_the_one_the_list_counts_as_an_error(
    jaeger: Jaeger, monkeypatch: pytest.MonkeyPatch
) -> None:
    from tracerag import MissingVersionError

    service = f"tracerag-refused-{uuid.uuid4().hex[:8]}"
    monkeypatch.setenv("OTEL_EXPORTER_OTLP_ENDPOINT", jaeger.otlp_http)
    monkeypatch.setenv("OTEL_METRICS_EXPORTER", "none")
    monkeypatch.setenv("OTEL_SERVICE_NAME", service)
    rag = verdict_pipeline(GOOD)
    refusing = RAGPipeline(
        rag.settings.retriever,
        ScriptedChatModel(responses=[GOOD]),
        prompt_version="verdict-1",
        model_version=None,
        audit=None,
    )
    with pytest.raises(MissingVersionError):
        refusing.invoke(QUESTION)
    assert _providers.force_flush(10_000)
    (trace,) = wait_for(jaeger, service, 1)
    name, errors = listed(trace)
    assert name == "invoke_workflow tracerag"  # no decision was reached
    assert errors >= 1
