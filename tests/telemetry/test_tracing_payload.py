"""How much a request puts on its spans: the prompt once, each sample's text once, content
capped and marked, export requests that fit the backend; model calls as CLIENT spans."""

from __future__ import annotations

from collections.abc import Iterator, Sequence

import pytest
from langchain_core.documents import Document
from langchain_core.language_models.fake_chat_models import FakeListChatModel
from opentelemetry.exporter.otlp.proto.common.trace_encoder import encode_spans
from opentelemetry.sdk.trace import ReadableSpan, TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor, SpanExporter, SpanExportResult
from opentelemetry.trace import SpanKind
from pipeline_fixtures import FAST_RETRY, GOOD, OFF_TOPIC, QUESTION, scripted

from tracerag import RAGPipeline
from tracerag import _semconv as semconv
from tracerag.telemetry import _content_capture, _providers
from tracerag.telemetry._export import TraceragSpanExporter, span_bytes
from tracerag.testing import SpanCapture


@pytest.fixture(autouse=True)
def clean(monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    for name in (
        _content_capture.CAPTURE_ENV,
        _content_capture.MAX_CHARS_ENV,
        "OTEL_ATTRIBUTE_VALUE_LENGTH_LIMIT",
    ):
        monkeypatch.delenv(name, raising=False)
    _providers.reset_for_tests()
    yield
    _providers.reset_for_tests()


def big_documents(k: int, size: int) -> list[Document]:
    return [
        Document(
            page_content=(f"Policy {i}: customers may return items within 30 days. " * 200)[:size],
            metadata={"id": f"policy-{i}", "title": f"Policy {i}"},
        )
        for i in range(k)
    ]


def run(make_pipeline, llm, **overrides):
    rag = make_pipeline(llm, audit=None, **overrides)
    response = rag.invoke(QUESTION)
    return response


def strings(span: ReadableSpan) -> list[str]:
    return [v for v in (span.attributes or {}).values() if isinstance(v, str)]


def test_prompt_is_on_the_sample_stage_span_once(make_pipeline, spans: SpanCapture) -> None:
    run(make_pipeline, scripted([GOOD]))
    (stage,) = spans.named(semconv.SPAN_SAMPLE)
    generations = spans.named(semconv.SPAN_SAMPLE_ONE)
    assert len(generations) == 5
    prompt_keys = [k for k in stage.attributes or {} if k.startswith("llm.input_messages.")]
    assert prompt_keys
    prompt = " ".join(str(stage.attributes[k]) for k in prompt_keys)
    assert QUESTION in prompt
    for generation in generations:
        assert not [k for k in generation.attributes or {} if "input_messages" in k]
        assert not any(QUESTION in value for value in strings(generation))


def test_each_sample_text_is_on_its_span_once(make_pipeline, spans: SpanCapture) -> None:
    run(make_pipeline, scripted([GOOD]))
    generations = spans.named(semconv.SPAN_SAMPLE_ONE)
    assert generations
    for generation in generations:
        assert sum(GOOD in value for value in strings(generation)) == 1
        assert generation.attributes[semconv.oi_output_message(0, "content")] == GOOD


def test_material_text_is_capped_and_marked(retriever, spans: SpanCapture) -> None:
    from tracerag.demo.kb import build_vectorstore

    docs = big_documents(2, 20_000)
    rag = RAGPipeline(
        build_vectorstore(docs).as_retriever(search_kwargs={"k": 2}),
        scripted([GOOD]),
        prompt_version="p",
        model_version="m",
        n_samples=1,
        retry=FAST_RETRY,
        tracer_provider=spans.provider,
        audit=None,
    )
    rag.invoke(QUESTION)
    (retrieve,) = spans.named(semconv.SPAN_RETRIEVE)
    content = retrieve.attributes[semconv.oi_document(0, "content")]
    assert len(content) == _content_capture.DEFAULT_MAX_CHARS
    assert content.endswith(" chars]")
    assert "…[truncated " in content[-30:]
    assert retrieve.attributes[semconv.oi_document(0, "id")] in {"policy-0", "policy-1"}
    for span in spans.spans():
        for value in strings(span):
            assert len(value) <= _content_capture.DEFAULT_MAX_CHARS, span.name


def test_otel_attribute_limit_lowers_the_cap(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("OTEL_ATTRIBUTE_VALUE_LENGTH_LIMIT", "500")
    text = _content_capture.capture("x" * 2_000)
    assert text is not None
    assert len(text) == 500
    kept, _, mark = text.partition("…[truncated ")
    assert set(kept) == {"x"}
    assert mark.endswith(" chars]")
    assert len(kept) + int(mark.removesuffix(" chars]")) == 2_000
    assert _content_capture.capture("short") == "short"


def test_own_cap_can_be_set_or_removed(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(_content_capture.MAX_CHARS_ENV, "100")
    assert len(_content_capture.capture("y" * 1_000) or "") == 100
    _content_capture.set_capture_max_chars(None)
    assert _content_capture.capture("y" * 1_000) == "y" * 1_000


class Recording(SpanExporter):
    def __init__(self) -> None:
        self.batches: list[list[ReadableSpan]] = []

    def export(self, spans: Sequence[ReadableSpan]) -> SpanExportResult:
        self.batches.append(list(spans))
        return SpanExportResult.SUCCESS

    def shutdown(self) -> None:
        pass


def make_spans(count: int, attribute_chars: int) -> list[ReadableSpan]:
    exporter = Recording()
    provider = TracerProvider()
    provider.add_span_processor(SimpleSpanProcessor(exporter))
    tracer = provider.get_tracer("t")
    for i in range(count):
        with tracer.start_as_current_span(f"s{i}") as span:
            span.set_attribute("a", "é" * (attribute_chars // 2) + "a" * (attribute_chars // 2))
            span.set_attribute("b", [f"id-{j}" for j in range(20)])
            span.add_event("e", {"k": "v" * 100})
    return [s for batch in exporter.batches for s in batch]


def test_export_requests_fit_the_limit() -> None:
    spans = make_spans(200, 60_000)  # about 14 MB of span data in one batch
    limit = 1024 * 1024
    inner = Recording()
    assert TraceragSpanExporter(inner, max_batch_bytes=limit).export(spans) is (
        SpanExportResult.SUCCESS
    )
    assert len(inner.batches) > 1
    assert [s.name for batch in inner.batches for s in batch] == [s.name for s in spans]
    for batch in inner.batches:
        assert encode_spans(batch).ByteSize() <= limit
    for span in spans[:5]:  # with the per-request allowance, an upper bound of the encoding
        assert span_bytes(span) + 512 >= encode_spans([span]).ByteSize()


def test_small_batches_are_not_split() -> None:
    spans = make_spans(50, 100)
    inner = Recording()
    TraceragSpanExporter(inner).export(spans)
    assert [len(b) for b in inner.batches] == [50]


def test_model_spans_are_client_spans(make_pipeline, spans: SpanCapture) -> None:
    run(make_pipeline, scripted([GOOD]))
    generations = spans.named(semconv.SPAN_SAMPLE_ONE)
    assert generations
    assert {g.kind for g in generations} == {SpanKind.CLIENT}
    (root,) = spans.named(semconv.SPAN_REQUEST)
    assert root.kind == SpanKind.INTERNAL


def escalated_events(spans: SpanCapture) -> list[object]:
    (assemble,) = spans.named(semconv.SPAN_ASSEMBLE)
    return [e for e in assemble.events if e.name == semconv.EVENT_ESCALATED]


def test_escalated_event_only_for_escalation(make_pipeline, spans: SpanCapture) -> None:
    mixed = [GOOD, OFF_TOPIC]  # samples disagree: confidence well below 1
    review = run(make_pipeline, scripted(mixed), thresholds=(0.999, 0.0))
    assert review.decision == "review"
    assert review.ticket_id
    assert escalated_events(spans) == []
    spans.clear()
    escalate = run(make_pipeline, scripted(mixed), thresholds=(0.999, 0.998))
    assert escalate.decision == "escalate"
    (event,) = escalated_events(spans)
    assert event.attributes[semconv.TICKET_ID] == escalate.ticket_id


def test_no_temperature_reported_for_a_model_without_one(retriever, spans: SpanCapture) -> None:
    llm = FakeListChatModel(responses=[GOOD])
    assert "temperature" not in type(llm).model_fields
    RAGPipeline(
        retriever,
        llm,
        prompt_version="p",
        model_version="fake",
        tier="medium",
        retry=FAST_RETRY,
        tracer_provider=spans.provider,
        audit=None,
    ).invoke(QUESTION)
    generations = spans.named(semconv.SPAN_SAMPLE_ONE)
    assert generations
    for generation in generations:
        assert semconv.GENAI_REQUEST_TEMPERATURE not in (generation.attributes or {})
        assert "temperature" not in str(generation.attributes[semconv.OI_LLM_INVOCATION_PARAMETERS])


def test_refused_request_root_carries_the_request_id(make_pipeline, spans: SpanCapture) -> None:
    from tracerag.errors import MissingVersionError

    rag = make_pipeline(scripted([GOOD]), prompt_version=None, audit=None)
    with pytest.raises(MissingVersionError):
        rag.invoke(QUESTION)
    (root,) = spans.named(semconv.SPAN_REQUEST)
    (register,) = spans.named(semconv.SPAN_REGISTER)
    assert register.attributes[semconv.REQUEST_ID]
    assert root.attributes[semconv.REQUEST_ID] == register.attributes[semconv.REQUEST_ID]
