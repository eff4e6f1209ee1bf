"""OpenInference attribute helpers for stage spans (content under the capture policy)."""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from typing import Any

from opentelemetry.trace import SpanKind

from tracerag import _semconv as semconv
from tracerag.telemetry._content_capture import capture, genai_content_on_spans

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


def describe_retrieval(
    span: Any,
    data_source: str | None,
    top_k: int | None,
    documents: Sequence[tuple[str, float | None, str]] = (),
) -> None:
    """The GenAI retrieval attributes of a retrieve span, and its name ``retrieval {source}``.

    ``documents``: (id, score, text) of each material retrieved, as
    ``gen_ai.retrieval.documents`` (a JSON array of ``{"id", "score", "content"}``), only when
    GenAI content capture is opted in (``genai_content_on_spans``); each text is under the
    content-capture policy (left out, redacted, cut to its cap).
    """
    if not span.is_recording():
        return
    span.set_attribute(semconv.GENAI_OPERATION_NAME, semconv.GENAI_OPERATION_RETRIEVAL)
    if data_source:
        span.set_attribute(semconv.GENAI_DATA_SOURCE_ID, data_source)
        span.update_name(semconv.retrieval_span_name(data_source))
    if top_k is not None:
        span.set_attribute(semconv.GENAI_REQUEST_TOP_K, float(top_k))
    if documents and genai_content_on_spans():
        listed: list[dict[str, Any]] = []
        for material_id, score, text in documents:
            entry: dict[str, Any] = {"id": material_id}
            if score is not None:
                entry["score"] = score
            content = capture(text)
            if content is not None:
                entry["content"] = content
            listed.append(entry)
        span.set_attribute(semconv.GENAI_RETRIEVAL_DOCUMENTS, _json(listed))


def data_source_of(retriever: Any) -> str | None:
    """A retriever's data source id: its given name, else its vector store's class, else its
    own class (``InMemoryVectorStore``, ``BM25Retriever``)."""
    name = getattr(retriever, "name", None)
    if isinstance(name, str) and name:
        return name
    store = getattr(retriever, "vectorstore", None)
    if store is not None:
        return type(store).__name__
    return type(retriever).__name__


def top_k_of(retriever: Any) -> int | None:
    """How many documents a retriever is asked for, where it says (``search_kwargs["k"]``,
    ``k``)."""
    kwargs = getattr(retriever, "search_kwargs", None)
    k = kwargs.get("k") if isinstance(kwargs, Mapping) else getattr(retriever, "k", None)
    return k if isinstance(k, int) and not isinstance(k, bool) else None
