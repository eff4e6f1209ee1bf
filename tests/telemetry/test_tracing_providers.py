"""The providers in force when a request runs get its spans and metrics, whenever the
application installed them, and tracerag's own fallback never sticks."""

from __future__ import annotations

import logging
from collections.abc import Iterator

import pytest
from opentelemetry import metrics as otel_metrics
from opentelemetry import trace
from opentelemetry.sdk.metrics import MeterProvider
from opentelemetry.sdk.metrics.export import InMemoryMetricReader
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from opentelemetry.util._once import Once
from otlp_receiver import metric_points
from pipeline_fixtures import FAST_RETRY, GOOD, PLAN, QUESTION

from tracerag import RAGPipeline
from tracerag import _semconv as semconv
from tracerag.telemetry import _content_capture, _meters, _providers
from tracerag.testing import ScriptedChatModel

OTEL_VARS = (
    "OTEL_EXPORTER_OTLP_ENDPOINT",
    "OTEL_EXPORTER_OTLP_TRACES_ENDPOINT",
    "OTEL_TRACES_EXPORTER",
    "OTEL_METRICS_EXPORTER",
    "TRACERAG_PROMETHEUS_PORT",
)


@pytest.fixture(autouse=True)
def no_global_providers(monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    """A process state in which the application has installed no provider yet; the real
    ``set_tracer_provider`` / ``set_meter_provider`` can then install one (undone after)."""
    import opentelemetry.metrics._internal as metrics_internal

    for name in OTEL_VARS:
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setattr(trace, "_TRACER_PROVIDER", None)
    monkeypatch.setattr(trace, "_TRACER_PROVIDER_SET_ONCE", Once())
    monkeypatch.setattr(metrics_internal, "_METER_PROVIDER", None)
    monkeypatch.setattr(metrics_internal, "_METER_PROVIDER_SET_ONCE", Once())
    _providers.reset_for_tests()
    _meters.reset()
    yield
    _providers.reset_for_tests()
    _meters.reset()


def pipeline(retriever) -> RAGPipeline:
    return RAGPipeline(
        retriever,
        ScriptedChatModel(responses=[GOOD], plan_responses=[PLAN]),
        prompt_version="p",
        model_version="m",
        n_samples=3,
        min_samples=3,  # every sample drawn: the span count below is fixed
        retry=FAST_RETRY,
        audit=None,
    )


def memory_tracer_provider() -> tuple[TracerProvider, InMemorySpanExporter]:
    exporter = InMemorySpanExporter()
    provider = TracerProvider()
    provider.add_span_processor(SimpleSpanProcessor(exporter))
    return provider, exporter


def test_provider_installed_after_the_pipeline_was_built_gets_every_span(retriever) -> None:
    rag = pipeline(retriever)  # built first, as an app factory often does
    provider, exporter = memory_tracer_provider()
    trace.set_tracer_provider(provider)
    response = rag.invoke(QUESTION)
    spans = exporter.get_finished_spans()
    assert len(spans) == 1 + 6 + 3
    assert {f"{s.context.trace_id:032x}" for s in spans} == {response.trace_id}
    (root,) = [s for s in spans if s.parent is None]
    assert root.attributes[semconv.SPAN_NAME] == semconv.SPAN_REQUEST
    assert root.name == f"invoke_workflow tracerag [{response.decision}]"


def test_meter_provider_installed_after_the_pipeline_was_built_gets_the_metrics(
    retriever,
) -> None:
    rag = pipeline(retriever)
    rag.invoke(QUESTION)  # recorded while no MeterProvider is installed
    reader = InMemoryMetricReader()
    otel_metrics.set_meter_provider(MeterProvider(metric_readers=[reader]))
    rag.invoke(QUESTION)
    rag.invoke(QUESTION)
    points = metric_points(reader, semconv.METRIC_REQUESTS)
    assert points
    assert sum(p.value for p in points) >= 2


def test_own_fallback_is_used_only_until_the_app_installs_a_provider(
    retriever, caplog: pytest.LogCaptureFixture
) -> None:
    rag = pipeline(retriever)
    with caplog.at_level(logging.WARNING, logger="tracerag.tracing"):
        first = rag.invoke(QUESTION)
        rag.invoke(QUESTION)
    assert first.trace_id  # tracerag's own provider: real trace ids, nothing exported
    fallback = _providers.default_provider()
    assert isinstance(fallback, TracerProvider)
    notices = [r for r in caplog.records if "not exported" in r.getMessage()]
    assert len(notices) == 1
    provider, exporter = memory_tracer_provider()
    trace.set_tracer_provider(provider)
    third = rag.invoke(QUESTION)
    assert {f"{s.context.trace_id:032x}" for s in exporter.get_finished_spans()} == {third.trace_id}


def test_explicit_provider_wins_over_a_later_global_one(retriever) -> None:
    mine, mine_spans = memory_tracer_provider()
    rag = RAGPipeline(
        retriever,
        ScriptedChatModel(responses=[GOOD], plan_responses=[PLAN]),
        prompt_version="p",
        model_version="m",
        n_samples=2,
        retry=FAST_RETRY,
        audit=None,
        tracer_provider=mine,
    )
    other, other_spans = memory_tracer_provider()
    trace.set_tracer_provider(other)
    rag.invoke(QUESTION)
    assert len(mine_spans.get_finished_spans()) == 1 + 6 + 2
    assert other_spans.get_finished_spans() == ()


def test_get_tracer_is_the_same_object_per_provider() -> None:
    provider, _ = memory_tracer_provider()
    assert _providers.get_tracer(provider) is _providers.get_tracer(provider)


def test_capture_policy_is_read_once(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(_content_capture.CAPTURE_ENV, "false")
    assert _content_capture.capture("secret") is None
    monkeypatch.setenv(_content_capture.CAPTURE_ENV, "true")  # not read again per attribute
    assert _content_capture.capture("secret") is None
    _content_capture.set_capture_content(None)  # "use the environment": read it again, once
    assert _content_capture.capture("secret") == "secret"
