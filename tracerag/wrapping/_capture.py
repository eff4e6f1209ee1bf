"""What one run of a wrapped app did, as LangChain callbacks (and ``_hooks``) report it.

``RunCapture`` is attached to one run (a chain, or a LangGraph graph with its nodes, tools and
nested chains) and records the documents it retrieved — from retrievers, from tools (documents a
``content_and_artifact`` tool returns as its ``ToolMessage.artifact``, or returns outright), and
from vector store searches called inside tools and nodes (``_hooks``) — the text of tool outputs
that carried no documents, each chat model call (name, invocation parameters, input messages,
output text, token usage) and the prompt templates it formatted. ``_versions`` learns the
prompt and model versions from these; ``_materials`` the materials and the order in which the
answering call was shown them.
"""

from __future__ import annotations

import dataclasses
import json
import threading
import warnings
from collections.abc import Sequence
from dataclasses import dataclass, field
from functools import lru_cache
from typing import Any
from uuid import UUID

from langchain_core.callbacks import AsyncCallbackHandler
from langchain_core.documents import Document
from langchain_core.messages import BaseMessage
from langchain_core.prompts import BasePromptTemplate
from opentelemetry import context as otel_context
from opentelemetry.context import Context
from opentelemetry.trace import Span, SpanKind, Status, StatusCode, Tracer

from tracerag import _semconv as semconv
from tracerag import _usage as usage_meter
from tracerag._llm import text_of
from tracerag.prompts import fingerprint
from tracerag.telemetry._content_capture import capture


def prompt_text(prompt: BasePromptTemplate[Any]) -> str:
    """The template text of a prompt (all messages of a chat prompt), for fingerprinting."""
    parts: list[str] = []
    for message in getattr(prompt, "messages", None) or [prompt]:
        inner = getattr(message, "prompt", message)
        template = getattr(inner, "template", None)
        role = type(message).__name__
        if isinstance(template, str):
            parts.append(f"{role}:{template}")
        elif isinstance(inner, list):
            parts.extend(f"{role}:{getattr(p, 'template', repr(p))}" for p in inner)
        else:
            parts.append(f"{role}:{inner!r}")
    return "\n".join(parts)


@lru_cache(maxsize=256)
def _serialized_prompt_text(serialized_json: str) -> str | None:
    from langchain_core.load import load

    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")  # ``load`` warns that it is in beta
            prompt = load(json.loads(serialized_json), allowed_objects="core")
    except Exception:
        return None
    return prompt_text(prompt) if isinstance(prompt, BasePromptTemplate) else None


def serialized_prompt_text(serialized: dict[str, Any] | None) -> str | None:
    """The template text of a prompt from its LangChain serialization (as callbacks get it)."""
    if not serialized or serialized.get("type") != "constructor":
        return None
    if "prompts" not in (serialized.get("id") or []):
        return None
    try:
        key = json.dumps(serialized, sort_keys=True, default=str)
    except (TypeError, ValueError):
        return None
    return _serialized_prompt_text(key)


@dataclass
class ModelCall:
    """One chat model (or LLM) call inside a run."""

    run_id: UUID
    name: str | None = None
    provider: str | None = None
    temperature: float | None = None
    params: dict[str, Any] = field(default_factory=dict)
    messages: list[BaseMessage] = field(default_factory=list)
    prompts: list[str] = field(default_factory=list)
    output: str | None = None
    input_tokens: int | None = None
    output_tokens: int | None = None


def _model_call(run_id: UUID, kwargs: dict[str, Any]) -> ModelCall:
    params = dict(kwargs.get("invocation_params") or {})
    metadata = kwargs.get("metadata") or {}
    ls = {k: v for k, v in metadata.items() if k.startswith("ls_")}
    name = params.get("model_name") or params.get("model") or ls.get("ls_model_name")
    temperature = params.get("temperature", ls.get("ls_temperature"))
    provider = ls.get("ls_provider") or params.get("_type")
    return ModelCall(
        run_id=run_id,
        name=str(name) if name else None,
        provider=str(provider) if provider else None,
        temperature=float(temperature)
        if isinstance(temperature, (int, float)) and not isinstance(temperature, bool)
        else None,
        params={**ls, **params},
    )


class RunCapture(AsyncCallbackHandler):
    """Records, for one run, retrieved documents, tool outputs, model calls and prompts.

    Given a ``tracer``, each tool the run calls is also a span, ``execute_tool {name}`` (the
    GenAI conventions' ``execute_tool`` operation, tracerag name ``tracerag.tool``), child of
    the span current when the tool started (the sample's), stamped with ``request_id``.
    """

    def __init__(self, tracer: Tracer | None = None, request_id: str | None = None) -> None:
        self._lock = threading.Lock()
        self._tracer = tracer
        self._request_id = request_id
        self._tool_spans: dict[UUID, Span] = {}
        #: the context tool spans start in: the sample's (``within_current_span``)
        self._parent: Context | None = None
        self.reset()

    def within_current_span(self) -> None:
        """Tool spans from now on are children of the span current here (the sample's), even
        when a tool's callbacks run in another thread."""
        self._parent = otel_context.get_current()

    def reset(self) -> None:
        """Forget everything (before a retried attempt); tool spans still open are ended."""
        for span in getattr(self, "_tool_spans", {}).values():
            span.set_status(Status(StatusCode.ERROR, "the attempt was abandoned"))
            span.end()
        self._tool_spans = {}
        self.documents: list[Document] = []
        #: relevance scores the searches gave, by ``id()`` of the document in ``documents``
        self.scores: dict[int, float] = {}
        #: (tool name, output text) of tool calls whose output carried no documents
        self.tool_texts: list[tuple[str, str]] = []
        self.tool_calls = 0
        self._tool_names: dict[UUID, str] = {}
        self.model_calls: list[ModelCall] = []
        self.calls: list[usage_meter.CallUsage] = []  # what each call spent (tracerag.usage)
        self.prompt_texts: list[str] = []
        self.last_prompt_text: str | None = None
        self._retriever_runs: set[UUID] = set()
        self._nested_retriever_runs: set[UUID] = set()
        self._calls: dict[UUID, ModelCall] = {}

    # -- retrievers --------------------------------------------------------------------------
    async def on_retriever_start(
        self,
        serialized: dict[str, Any],
        query: str,
        *,
        run_id: UUID,
        parent_run_id: UUID | None = None,
        **kwargs: Any,
    ) -> None:
        self._retriever_runs.add(run_id)
        if parent_run_id in self._retriever_runs:
            self._nested_retriever_runs.add(run_id)

    async def on_retriever_end(
        self, documents: Sequence[Document], *, run_id: UUID, **kwargs: Any
    ) -> None:
        if run_id in self._nested_retriever_runs:
            return  # a retriever inside a retriever: the outer one reports what it returns
        self.documents.extend(d for d in documents if isinstance(d, Document))

    # -- vector store searches (reported by ``_hooks``, from any thread) ----------------------
    def saw_documents(self, found: Sequence[tuple[Document, float | None]]) -> None:
        """Documents a vector store search inside this run returned."""
        with self._lock:
            for doc, score in found:
                self.documents.append(doc)
                if score is not None:
                    self.scores[id(doc)] = score

    # -- tools -------------------------------------------------------------------------------
    async def on_tool_start(
        self, serialized: dict[str, Any] | None, input_str: str, *, run_id: UUID, **kwargs: Any
    ) -> None:
        self.tool_calls += 1
        name = str((serialized or {}).get("name") or kwargs.get("name") or "")
        self._tool_names[run_id] = name
        if self._tracer is not None:
            self._start_tool_span(run_id, name, serialized, kwargs)

    def _start_tool_span(
        self, run_id: UUID, name: str, serialized: dict[str, Any] | None, kwargs: dict[str, Any]
    ) -> None:
        assert self._tracer is not None
        span = self._tracer.start_span(
            semconv.tool_span_name(name or None), context=self._parent, kind=SpanKind.INTERNAL
        )
        if span.is_recording():
            attrs: dict[str, Any] = {
                semconv.SPAN_NAME: semconv.SPAN_TOOL,
                semconv.GENAI_OPERATION_NAME: semconv.GENAI_OPERATION_EXECUTE_TOOL,
                semconv.GENAI_TOOL_TYPE: "function",
                semconv.OI_SPAN_KIND: semconv.OI_KIND_TOOL,
            }
            if name:
                attrs[semconv.GENAI_TOOL_NAME] = name
                attrs[semconv.OI_TOOL_NAME] = name
            call_id = kwargs.get("tool_call_id")
            if isinstance(call_id, str) and call_id:
                attrs[semconv.GENAI_TOOL_CALL_ID] = call_id
            if self._request_id:
                attrs[semconv.REQUEST_ID] = self._request_id
            span.set_attributes(attrs)
        self._tool_spans[run_id] = span

    def _end_tool_span(self, run_id: UUID, error: BaseException | None = None) -> None:
        span = self._tool_spans.pop(run_id, None)
        if span is None:
            return
        if error is not None:
            span.record_exception(error)
            span.set_status(Status(StatusCode.ERROR, f"{type(error).__name__}: {error}"))
            span.set_attribute(semconv.ERROR_TYPE, type(error).__qualname__)
        span.end()

    async def on_tool_error(self, error: BaseException, *, run_id: UUID, **kwargs: Any) -> None:
        self._tool_names.pop(run_id, None)
        self._end_tool_span(run_id, error)

    async def on_tool_end(self, output: Any, *, run_id: UUID, **kwargs: Any) -> None:
        self._end_tool_span(run_id)
        name = self._tool_names.pop(run_id, "") or getattr(output, "name", None) or "tool"
        documents = tool_documents(output)
        if documents:
            self.documents.extend(documents)
            return
        text = tool_text(output)
        if text and text.strip():
            self.tool_texts.append((name, text))

    # -- prompts -----------------------------------------------------------------------------
    async def on_chain_start(
        self, serialized: dict[str, Any] | None, inputs: Any, **kwargs: Any
    ) -> None:
        ids = (serialized or {}).get("id") or []
        if kwargs.get("run_type") != "prompt" and "prompts" not in ids:
            return
        text = serialized_prompt_text(serialized)
        if text is None:
            return
        self.last_prompt_text = text
        if text not in self.prompt_texts:
            self.prompt_texts.append(text)

    # -- models ------------------------------------------------------------------------------
    async def on_chat_model_start(
        self,
        serialized: dict[str, Any],
        messages: list[list[BaseMessage]],
        *,
        run_id: UUID,
        **kwargs: Any,
    ) -> None:
        call = _model_call(run_id, kwargs)
        call.messages = list(messages[0]) if messages else []
        self._start(call)

    async def on_llm_start(
        self, serialized: dict[str, Any], prompts: list[str], *, run_id: UUID, **kwargs: Any
    ) -> None:
        call = _model_call(run_id, kwargs)
        call.prompts = list(prompts)
        self._start(call)

    def _start(self, call: ModelCall) -> None:
        self._calls[call.run_id] = call
        self.model_calls.append(call)

    async def on_llm_end(self, response: Any, *, run_id: UUID, **kwargs: Any) -> None:
        call = self._calls.get(run_id)
        if call is None:
            return
        generations = getattr(response, "generations", None) or []
        first = generations[0][0] if generations and generations[0] else None
        if first is None:
            return
        message = getattr(first, "message", None)
        call.output = text_of(message) if isinstance(message, BaseMessage) else first.text
        usage = getattr(message, "usage_metadata", None) or {}
        if usage.get("input_tokens") is not None:
            call.input_tokens = int(usage["input_tokens"])
        if usage.get("output_tokens") is not None:
            call.output_tokens = int(usage["output_tokens"])
        spent = usage_meter.usage_of(
            message if message is not None else first.text,
            stage=usage_meter.STAGE_SAMPLE,
            model=call.name,
            prompt=call.messages or "\n".join(call.prompts),
            llm_output=getattr(response, "llm_output", None),
        )
        if len(generations[0]) > 1:  # one prompt answered several times (``n``): billed once
            spent = dataclasses.replace(spent, generations=len(generations[0]))
        self.calls.append(usage_meter.note(spent))

    # -- summaries ---------------------------------------------------------------------------
    @property
    def last_call(self) -> ModelCall | None:
        """The run's last model call: the one that wrote the answer in a RAG app."""
        return self.model_calls[-1] if self.model_calls else None

    @property
    def model_names(self) -> list[str]:
        return list(dict.fromkeys(c.name for c in self.model_calls if c.name))

    @property
    def model_name(self) -> str | None:
        call = self.last_call
        return call.name if call is not None else None

    @property
    def prompt_version(self) -> str | None:
        """The fingerprint of the prompt templates this run formatted, if any."""
        return fingerprint(*self.prompt_texts) if self.prompt_texts else None

    @property
    def temperature(self) -> float | None:
        call = self.last_call
        return call.temperature if call is not None else None

    @property
    def invocation_params(self) -> dict[str, Any]:
        call = self.last_call
        return dict(call.params) if call is not None else {}

    @property
    def token_usage(self) -> dict[str, int]:
        usage: dict[str, int] = {}
        for call in self.model_calls:
            for key in ("input_tokens", "output_tokens"):
                value = getattr(call, key)
                if value is not None:
                    usage[key] = usage.get(key, 0) + value
        return usage


def tool_documents(output: Any) -> list[Document]:
    """The documents a tool returned: its ``ToolMessage.artifact``, or its output itself."""
    for value in (getattr(output, "artifact", None), output):
        if isinstance(value, Document):
            return [value]
        if isinstance(value, (list, tuple)):
            docs = [d for d in value if isinstance(d, Document)]
            if docs:
                return docs
    return []


def tool_text(output: Any) -> str | None:
    """The text a tool's output showed the model (a ``ToolMessage``'s content, or a string)."""
    if isinstance(output, BaseMessage):
        return text_of(output, sep="\n")
    if isinstance(output, str):
        return output
    return None


def model_call_attributes(
    call: ModelCall | None, template_version: str | None, template: str | None = None
) -> dict[str, Any]:
    """Model span attributes of a run's answering call: messages in and out, prompt template.

    Message contents and the template text follow the content-capture policy; roles and the
    template version are always set.
    """
    attrs: dict[str, Any] = {}
    if template_version:
        attrs[semconv.OI_PROMPT_TEMPLATE_VERSION] = template_version
    template_text = capture(template)
    if template_text is not None:
        attrs[semconv.OI_PROMPT_TEMPLATE] = template_text
    if call is None:
        return attrs
    if call.messages:
        for i, message in enumerate(call.messages):
            attrs[semconv.oi_input_message(i, "role")] = message.type
            content = capture(text_of(message, sep="\n"))
            if content is not None:
                attrs[semconv.oi_input_message(i, "content")] = content
    else:
        for i, prompt in enumerate(call.prompts):
            attrs[semconv.oi_input_message(i, "role")] = "user"
            content = capture(prompt)
            if content is not None:
                attrs[semconv.oi_input_message(i, "content")] = content
    if call.output is not None:
        attrs[semconv.oi_output_message(0, "role")] = "assistant"
        content = capture(call.output)
        if content is not None:
            attrs[semconv.oi_output_message(0, "content")] = content
    return attrs


__all__ = [
    "ModelCall",
    "RunCapture",
    "model_call_attributes",
    "prompt_text",
    "serialized_prompt_text",
    "tool_documents",
    "tool_text",
]
