"""The demo pipeline's traces as they arrive over OTLP: the six-stage tree on the wire, and
the content-capture policy applied to what leaves the process."""

from __future__ import annotations

from collections.abc import Callable, Iterator

import pytest
from opentelemetry.sdk.trace import TracerProvider as SDKTracerProvider
from otlp_receiver import OtlpGrpcReceiver, OtlpHttpReceiver, SpanTree, WireSpan

from tracerag import RAGPipeline
from tracerag import _semconv as semconv
from tracerag.demo.kb import build_retriever, load_questions
from tracerag.demo.models.extractive import ExtractiveChatModel
from tracerag.telemetry import _content_capture, _export, _instruments, _providers

pytestmark = pytest.mark.integration


@pytest.fixture(autouse=True)
def clean(monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    monkeypatch.delenv(_content_capture.CAPTURE_ENV, raising=False)
    _providers.reset_for_tests()
    yield
    _providers.reset_for_tests()


def exporting_provider(endpoint: str, protocol: str = "http/protobuf") -> SDKTracerProvider:
    provider = SDKTracerProvider(resource=_providers.make_resource("tracerag-wire-test"))
    provider.add_span_processor(
        _export.batch_processor(
            _export.otlp_span_exporter(endpoint, protocol=protocol),
            schedule_delay_millis=50,
            on_drop=_instruments.record_spans_dropped,
        )
    )
    return provider


def pipeline(provider: SDKTracerProvider) -> RAGPipeline:
    return RAGPipeline(
        build_retriever(),
        ExtractiveChatModel(),
        prompt_version="demo-prompt-1",
        model_version="extractive-1",
        n_samples=N_SAMPLES,
        temperature=0.7,
        tracer_provider=provider,
        audit=None,
    )


N_SAMPLES = 5


def arrived(trace_ids: set[str]) -> Callable[[list[WireSpan]], bool]:
    """True once every trace's root has arrived: a root ends after its children, and the batch
    processor sends spans in the order they ended, one export after another."""
    return lambda spans: trace_ids <= {s.trace_id for s in spans if s.parent_span_id is None}


def check_tree(spans: list[WireSpan], trace_id: str, request_id: str) -> None:
    """The six-stage tree of one request, with one generation span per sample drawn (adaptive
    sampling stops once the route is settled: at least 2, at most ``N_SAMPLES``)."""
    tree = SpanTree([s for s in spans if s.trace_id == trace_id])
    (root,) = tree.roots()
    assert root.attributes[semconv.SPAN_NAME] == semconv.SPAN_REQUEST
    assert root.resource["service.name"] == "tracerag-wire-test"
    stages = sorted(tree.children(root), key=lambda s: s.start_unix_nano)
    names = [s.attributes[semconv.SPAN_NAME] for s in stages]
    assert sorted(names) == sorted(semconv.STAGE_SPANS.values())
    assert names[:2] == [semconv.SPAN_REGISTER, semconv.SPAN_RETRIEVE]
    assert names[-2:] == [semconv.SPAN_VERIFY, semconv.SPAN_ASSEMBLE]
    for stage, name in zip(stages, names, strict=True):
        assert stage.attributes[semconv.STAGE] == name.split(".", 1)[1]
        assert root.start_unix_nano <= stage.start_unix_nano <= stage.end_unix_nano
        assert stage.end_unix_nano <= root.end_unix_nano
    (sample,) = tree.named(semconv.SPAN_SAMPLE)
    assert sample.attributes[semconv.SAMPLES_MAX] == N_SAMPLES
    n_samples = sample.attributes[semconv.SAMPLES_DRAWN]
    assert isinstance(n_samples, int) and 2 <= n_samples <= N_SAMPLES, n_samples
    generations = tree.named(semconv.SPAN_SAMPLE_ONE)
    assert len(generations) == n_samples
    assert all(tree.parent(g) is sample for g in generations)
    assert len(tree.spans) == 1 + 6 + n_samples
    for span in tree.spans:
        assert span.attributes[semconv.REQUEST_ID] == request_id, span.name
    (verify,) = tree.named(semconv.SPAN_VERIFY)
    evaluations = {
        e.attributes[semconv.GENAI_EVALUATION_NAME]
        for e in verify.events
        if e.name == semconv.GENAI_EVALUATION_EVENT
    }
    assert evaluations  # citation and consistency verdicts travel with the verify span
    assert root.attributes[semconv.DECISION] in {"pass", "review", "escalate"}


def test_demo_tree_over_otlp_http() -> None:
    questions = [q["question"] for q in load_questions()[:3]]
    with OtlpHttpReceiver() as receiver:
        provider = exporting_provider(receiver.endpoint)
        rag = pipeline(provider)
        responses = [rag.invoke(q) for q in questions]
        assert provider.force_flush(10_000)
        traces = {r.trace_id for r in responses}
        assert receiver.wait_for(arrived(traces)), len(receiver.spans)
        provider.shutdown()
    for response in responses:
        check_tree(receiver.spans, response.trace_id, response.request_id)
    assert len({r.trace_id for r in responses}) == len(responses)


def test_demo_tree_over_otlp_grpc() -> None:
    with OtlpGrpcReceiver() as receiver:
        provider = exporting_provider(receiver.endpoint, protocol="grpc")
        response = pipeline(provider).invoke(load_questions()[0]["question"])
        assert provider.force_flush(10_000)
        assert receiver.wait_for(arrived({response.trace_id})), len(receiver.spans)
        provider.shutdown()
    check_tree(receiver.spans, response.trace_id, response.request_id)


def all_strings(spans: list[WireSpan]) -> str:
    parts: list[str] = []
    for span in spans:
        for value in list(span.attributes.values()) + [
            v for e in span.events for v in e.attributes.values()
        ]:
            parts.append(str(value))
    return "\n".join(parts)


def run_one(question: str) -> tuple[list[WireSpan], object]:
    with OtlpHttpReceiver() as receiver:
        provider = exporting_provider(receiver.endpoint)
        response = pipeline(provider).invoke(question)
        assert provider.force_flush(10_000)
        assert receiver.wait_for(arrived({response.trace_id})), len(receiver.spans)
        provider.shutdown()
    return [s for s in receiver.spans if s.trace_id == response.trace_id], response


def test_capture_false_sends_ids_and_scores_but_no_text() -> None:
    _content_capture.set_capture_content(False)
    question = "How long is the warranty on a laptop?"
    spans, response = run_one(question)
    text = all_strings(spans)
    assert question not in text
    assert response.answer and response.answer not in text  # type: ignore[attr-defined]
    assert spans
    for span in spans:
        for key in span.attributes:
            assert not key.endswith(".document.content"), key
            assert not key.endswith(".message.content"), key
            assert key not in {semconv.OI_INPUT_VALUE, semconv.OI_OUTPUT_VALUE}, (span.name, key)
    (retrieve,) = [s for s in spans if s.attributes.get(semconv.SPAN_NAME) == semconv.SPAN_RETRIEVE]
    assert retrieve.attributes[semconv.oi_document(0, "id")]
    assert isinstance(retrieve.attributes[semconv.oi_document(0, "score")], float)
    (root,) = [s for s in spans if s.parent_span_id is None]
    assert root.attributes[semconv.CONFIDENCE] == response.confidence  # type: ignore[attr-defined]
    assert root.attributes[semconv.DECISION] == response.decision  # type: ignore[attr-defined]
    (verify,) = [s for s in spans if s.attributes.get(semconv.SPAN_NAME) == semconv.SPAN_VERIFY]
    assert semconv.SIGNAL_CITATION_SCORE in verify.attributes


def test_capture_redact_masks_personal_data_on_the_wire() -> None:
    _content_capture.set_capture_content("redact")
    question = "I am jane.doe@example.com, 13812345678: how long is the warranty on a laptop?"
    spans, _ = run_one(question)
    text = all_strings(spans)
    assert "jane.doe@example.com" not in text
    assert "13812345678" not in text
    (root,) = [s for s in spans if s.parent_span_id is None]
    assert root.attributes[semconv.OI_INPUT_VALUE] == (
        "I am [EMAIL], [PHONE]: how long is the warranty on a laptop?"
    )
