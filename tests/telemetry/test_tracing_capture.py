"""Content capture policy, the default redactor and trace links."""

from __future__ import annotations

import json
from collections.abc import Iterator
from urllib.parse import parse_qs, urlsplit

import pytest

from tracerag.telemetry import _content_capture, _links, _phoenix, _providers, _spans


@pytest.fixture(autouse=True)
def clean(monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    monkeypatch.delenv(_content_capture.CAPTURE_ENV, raising=False)
    _providers.reset_for_tests()
    yield
    _providers.reset_for_tests()


def test_default_captures_text() -> None:
    assert _content_capture.capture_content_mode() == "true"
    assert _content_capture.capture("call me at 13800138000") == "call me at 13800138000"
    assert _content_capture.capture(None) is None


@pytest.mark.parametrize("value", ["false", "False", "0", "off", "omit"])
def test_env_false_omits(monkeypatch: pytest.MonkeyPatch, value: str) -> None:
    monkeypatch.setenv(_content_capture.CAPTURE_ENV, value)
    assert _content_capture.capture("secret") is None
    assert not _content_capture.capture_enabled()


def test_env_redact_uses_default_redactor(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(_content_capture.CAPTURE_ENV, "redact")
    assert _content_capture.capture("mail bob@example.com") == "mail [EMAIL]"


def test_unknown_env_value_fails_closed(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(_content_capture.CAPTURE_ENV, "maybe")
    assert _content_capture.capture("secret") is None


def test_code_setting_overrides_env(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(_content_capture.CAPTURE_ENV, "false")
    _content_capture.set_capture_content(True)
    assert _content_capture.capture("x") == "x"
    _content_capture.set_capture_content("redact")
    assert _content_capture.capture("bob@example.com") == "[EMAIL]"
    _content_capture.set_capture_content(None)
    assert _content_capture.capture("x") is None
    with pytest.raises(ValueError):
        _content_capture.set_capture_content("sometimes")


def test_user_redactor_applies_in_true_and_redact_modes() -> None:
    _content_capture.set_redactor(lambda text: text.replace("Alice", "<name>"))
    assert _content_capture.capture("Alice paid") == "<name> paid"
    _content_capture.set_capture_content("redact")
    assert _content_capture.capture("Alice bob@example.com") == "<name> bob@example.com"
    _content_capture.set_capture_content(False)
    assert _content_capture.capture("Alice") is None


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("write to jane.doe+rag@mail.example.co.uk today", "write to [EMAIL] today"),
        ("手机 13812345678 联系", "手机 [PHONE] 联系"),
        ("call +86 138 1234 5678.", "call [PHONE]."),
        ("call +86-13812345678", "call [PHONE]"),
        ("tel (415) 555-2671", "tel [PHONE]"),
        ("tel +44 20 7946 0958", "tel [PHONE]"),
        ("座机 010-6552 1234", "座机 [PHONE]"),
        ("card 4111 1111 1111 1111 exp", "card [CARD_NUMBER] exp"),
        ("card 4111-1111-1111-1111", "card [CARD_NUMBER]"),
        ("卡号6222021234567890123", "卡号[CARD_NUMBER]"),
        ("身份证 11010519491231002X 已核验", "身份证 [ID_NUMBER] 已核验"),
        ("id 110105194912310021", "id [ID_NUMBER]"),
    ],
)
def test_default_redactor_masks_personal_data(text: str, expected: str) -> None:
    assert _content_capture.default_redactor(text) == expected


@pytest.mark.parametrize(
    "text",
    [
        "Clause 6.1: laptops are covered for 24 months.",
        "Orders placed on 2024-03-15 ship within 3 days.",
        "退货须在签收后7天内申请，运费12.50元。",
        "Version 1.2.3 of doc kb-042, order 123456, price $1,299.00",
        "积分有效期为365天，满1000积分可兑换。",
    ],
)
def test_default_redactor_keeps_ordinary_text(text: str) -> None:
    assert _content_capture.default_redactor(text) == text


TID = "4bf92f3577b34da6a3ce929d0e0e4736"


def test_jaeger_link() -> None:
    assert _links.trace_link(TID) == f"http://localhost:16686/trace/{TID}"
    assert (
        _links.trace_link(int(TID, 16), "jaeger", "https://jaeger.example/")
        == f"https://jaeger.example/trace/{TID}"
    )


def test_tempo_link_is_grafana_explore_with_traceql_trace_id() -> None:
    url = _links.trace_link(TID, "tempo", "http://grafana:3000", datasource_uid="tempo-prod")
    parts = urlsplit(url)
    assert parts.path == "/explore"
    query = parse_qs(parts.query)
    assert query["orgId"] == ["1"]
    panes = json.loads(query["panes"][0])
    (pane,) = panes.values()
    assert pane["datasource"] == "tempo-prod"
    assert pane["queries"][0]["query"] == TID
    assert pane["queries"][0]["datasource"] == {"type": "tempo", "uid": "tempo-prod"}


def test_phoenix_link() -> None:
    assert _links.trace_link(TID, "phoenix") == f"http://localhost:6006/redirects/traces/{TID}"
    assert (
        _links.trace_link(TID, "phoenix", "http://p:6006", project="UHJvamVjdDox")
        == f"http://p:6006/projects/UHJvamVjdDox/traces/{TID}"
    )


def test_trace_link_rejects_bad_input() -> None:
    with pytest.raises(ValueError):
        _links.trace_link("not-a-trace", "jaeger")
    with pytest.raises(ValueError):
        _links.trace_link(TID, "zipkin")
    assert _links.format_trace_id("0xABC") == "abc".rjust(32, "0")


def _span() -> tuple[object, object]:
    from opentelemetry.sdk.trace import TracerProvider
    from opentelemetry.sdk.trace.export import SimpleSpanProcessor
    from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

    exporter = InMemorySpanExporter()
    provider = TracerProvider()
    provider.add_span_processor(SimpleSpanProcessor(exporter))
    return provider.get_tracer("t").start_span("s"), exporter


def test_openinference_helpers_follow_the_capture_policy() -> None:
    from tracerag import _semconv as semconv

    span, exporter = _span()
    _spans.set_span_io(span, input="mail bob@example.com", output={"decision": "pass"})  # type: ignore[arg-type]
    _spans.set_span_metadata(span, {"tier": "high", "prompt_version": "p1"})
    _spans.set_prompt_template(span, "p1", "Answer {question}", {"question": "q?"})
    span.end()  # type: ignore[attr-defined]
    (finished,) = exporter.get_finished_spans()  # type: ignore[attr-defined]
    attrs = dict(finished.attributes)
    assert attrs[semconv.OI_INPUT_VALUE] == "mail bob@example.com"
    assert attrs[semconv.OI_INPUT_MIME] == "text/plain"
    assert json.loads(attrs[semconv.OI_OUTPUT_VALUE]) == {"decision": "pass"}
    assert attrs[semconv.OI_OUTPUT_MIME] == "application/json"
    assert json.loads(attrs[semconv.OI_METADATA]) == {"prompt_version": "p1", "tier": "high"}
    assert attrs[semconv.OI_PROMPT_TEMPLATE_VERSION] == "p1"
    assert attrs[semconv.OI_PROMPT_TEMPLATE] == "Answer {question}"

    _content_capture.set_capture_content("redact")
    span, exporter = _span()
    _spans.set_span_io(span, input="mail bob@example.com")  # type: ignore[arg-type]
    span.end()  # type: ignore[attr-defined]
    (finished,) = exporter.get_finished_spans()  # type: ignore[attr-defined]
    assert finished.attributes[semconv.OI_INPUT_VALUE] == "mail [EMAIL]"

    _content_capture.set_capture_content(False)
    span, exporter = _span()
    _spans.set_span_io(span, input="secret", output="answer")  # type: ignore[arg-type]
    _spans.set_prompt_template(span, "p2", "Answer {question}", {"question": "q"})
    span.end()  # type: ignore[attr-defined]
    (finished,) = exporter.get_finished_spans()  # type: ignore[attr-defined]
    assert dict(finished.attributes) == {semconv.OI_PROMPT_TEMPLATE_VERSION: "p2"}


def test_phoenix_annotations_from_spans() -> None:
    from opentelemetry.sdk.trace import TracerProvider
    from opentelemetry.sdk.trace.export import SimpleSpanProcessor
    from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

    from tracerag import _semconv as semconv

    exporter = InMemorySpanExporter()
    provider = TracerProvider()
    provider.add_span_processor(SimpleSpanProcessor(exporter))
    tracer = provider.get_tracer("t")
    with tracer.start_as_current_span(semconv.SPAN_REQUEST) as root:
        root.set_attribute(semconv.REQUEST_ID, "r1")
        root.set_attribute(semconv.CONFIDENCE, 0.7)
        root.set_attribute(semconv.DECISION, "review")
        with tracer.start_as_current_span(semconv.SPAN_VERIFY) as verify:
            verify.add_event(
                semconv.GENAI_EVALUATION_EVENT,
                {
                    semconv.GENAI_EVALUATION_NAME: "citation_validity",
                    semconv.GENAI_EVALUATION_SCORE_VALUE: 0.5,
                    semconv.GENAI_EVALUATION_SCORE_LABEL: "invalid",
                    semconv.GENAI_EVALUATION_EXPLANATION: "1/2 claims supported",
                },
            )
    records = _phoenix.PhoenixEvaluationExporter.annotations(exporter.get_finished_spans())
    by_name = {r["name"]: r for r in records}
    assert by_name["citation_validity"]["result"] == {
        "score": 0.5,
        "label": "invalid",
        "explanation": "1/2 claims supported",
    }
    assert by_name["confidence"]["result"] == {"score": 0.7, "label": "review"}
    assert by_name["confidence"]["metadata"] == {"request_id": "r1"}
    assert all(r["annotator_kind"] == "CODE" and len(r["span_id"]) == 16 for r in records)
