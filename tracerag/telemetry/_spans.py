"""OpenInference attribute helpers for stage spans (content under the capture policy)."""

from __future__ import annotations

import json
from collections.abc import Mapping
from typing import Any

from opentelemetry.trace import SpanKind

from tracerag import _semconv as semconv
from tracerag.telemetry._content_capture import capture

# model calls are outgoing calls to a provider: CLIENT spans, per the GenAI conventions
MODEL_SPAN_KIND = SpanKind.CLIENT


def _json(value: Any) -> str:
    return json.dumps(value, ensure_ascii=False, default=str, sort_keys=True)


def set_span_io(
    span: Any,
    input: str | Mapping[str, Any] | None = None,
    output: str | Mapping[str, Any] | None = None,
) -> None:
    """Set OpenInference ``input.value`` / ``output.value`` (with mime types) on a span, as the
    capture policy allows; mappings are sent as JSON."""
    if not span.is_recording():
        return
    for value, key, mime_key in (
        (input, semconv.OI_INPUT_VALUE, semconv.OI_INPUT_MIME),
        (output, semconv.OI_OUTPUT_VALUE, semconv.OI_OUTPUT_MIME),
    ):
        if value is None:
            continue
        is_json = not isinstance(value, str)
        text = capture(_json(value) if is_json else value)  # type: ignore[arg-type]
        if text is None:
            continue
        span.set_attribute(key, text)
        span.set_attribute(mime_key, "application/json" if is_json else "text/plain")


def set_span_metadata(span: Any, metadata: Mapping[str, Any]) -> None:
    """Set OpenInference ``metadata`` (JSON): ids, versions, tier; never prompt or answer text."""
    if not span.is_recording():
        return
    span.set_attribute(semconv.OI_METADATA, _json(dict(metadata)))


def set_prompt_template(
    span: Any,
    version: str | None,
    template: str | None = None,
    variables: Mapping[str, Any] | None = None,
) -> None:
    """Set OpenInference ``llm.prompt_template.*``; template and variables under capture."""
    if version:
        span.set_attribute(semconv.OI_PROMPT_TEMPLATE_VERSION, version)
    if template is not None:
        text = capture(template)
        if text is not None:
            span.set_attribute(semconv.OI_PROMPT_TEMPLATE, text)
    if variables is not None:
        text = capture(_json(dict(variables)))
        if text is not None:
            span.set_attribute(semconv.OI_PROMPT_TEMPLATE_VARIABLES, text)
