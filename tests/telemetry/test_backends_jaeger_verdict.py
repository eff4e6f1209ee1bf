"""Real Jaeger (v2 all-in-one): a verdict you can find, read through the API Jaeger's UI uses.

Jaeger's search page lists each trace as ``{service}: {root span name}`` with its duration, its
span count and its error count (spans whose status is ERROR), nothing of the root's tags. The
root span's name carries the request's decision (``invoke_workflow tracerag [escalate]``), so the
list tells an escalated request from a passed one at a glance, and neither counts an error: an
escalation is the service working. Searching by the tag ``tracerag.decision=escalate`` finds the
escalated requests and only them.
"""

from __future__ import annotations

import json
import os
import time
import urllib.parse
import uuid
from collections.abc import Iterator
from typing import Any

import pytest
from jaeger_backend import Jaeger, get, start_jaeger
from langchain_core.documents import Document
from pipeline_fixtures import FABRICATED, FAST_RETRY, GOOD, PLAN, POLICIES, QUESTION

from tracerag import RAGPipeline
from tracerag import _semconv as semconv
from tracerag.telemetry import _content_capture, _meters, _providers
from tracerag.testing import ScriptedChatModel

pytestmark = pytest.mark.integration


@pytest.fixture(scope="module")
def jaeger(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Jaeger]:
    yield from start_jaeger(tmp_path_factory.mktemp("jaeger"))


@pytest.fixture(autouse=True)
def clean(monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    for name in list(os.environ):
        if name.startswith("OTEL_"):
            monkeypatch.delenv(name, raising=False)
    monkeypatch.delenv(_content_capture.CAPTURE_ENV, raising=False)
    _providers.reset_for_tests()
    _meters.reset()
    yield
    _providers.reset_for_tests()
    _meters.reset()


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


def pipeline(answer: str) -> RAGPipeline:
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
    passing, escalating = pipeline(GOOD), pipeline(FABRICATED)
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
    rag = pipeline(GOOD)
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
