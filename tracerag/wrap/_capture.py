"""What one run of a wrapped app did, as LangChain callbacks report it.

``RunCapture`` is attached to one run (a chain, or a LangGraph graph with its nodes and nested
chains) and records the documents its retrievers returned, each chat model call (name,
invocation parameters, input messages, output text, token usage) and the prompt templates it
formatted. From these, ``learned_versions`` gives the prompt version (the same ``sha256:``
fingerprint ``wrap()`` takes from a chain's own prompt templates) and the model version of runs
whose prompt and model live inside node functions, where inspecting the app finds nothing.
"""

from __future__ import annotations

import json
import warnings
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from functools import lru_cache
from typing import Any
from uuid import UUID

from langchain_core.callbacks import AsyncCallbackHandler
from langchain_core.documents import Document
from langchain_core.messages import BaseMessage
from langchain_core.prompts import BasePromptTemplate

from tracerag import semconv
from tracerag import usage as usage_meter
from tracerag.errors import MissingVersionError
from tracerag.llm import text_of
from tracerag.prompts import fingerprint
from tracerag.tracing import capture


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
    """Records, for one run, retrieved documents, model calls and prompt templates."""

    def __init__(self) -> None:
        self.reset()

    def reset(self) -> None:
        """Forget everything (before a retried attempt)."""
        self.documents: list[Document] = []
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
        self.calls.append(
            usage_meter.note(
                usage_meter.usage_of(
                    message if message is not None else first.text,
                    stage=usage_meter.STAGE_SAMPLE,
                    model=call.name,
                    prompt=call.messages or "\n".join(call.prompts),
                    llm_output=getattr(response, "llm_output", None),
                )
            )
        )

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


def learned_versions(captures: Iterable[RunCapture]) -> tuple[str | None, str | None]:
    """The prompt and model versions the runs show: templates fingerprinted, models named."""
    texts: list[str] = []
    names: list[str] = []
    for c in captures:
        texts.extend(t for t in c.prompt_texts if t not in texts)
        names.extend(n for n in c.model_names if n not in names)
    prompt = fingerprint(*texts) if texts else None
    model = "+".join(names) or None
    return prompt, model


def missing_version_error(request_id: str, missing: Sequence[str]) -> MissingVersionError:
    """The refusal for versions that neither the arguments nor the runs could give."""
    reasons = {
        "prompt": (
            "the app formatted no LangChain prompt template that tracerag could read, "
            "so pass prompt_version= to wrap()"
        ),
        "model": ("no chat model call reported a model name, so pass model_version= to wrap()"),
    }
    detail = "; ".join(f"no {name} version: {reasons[name]}" for name in missing)
    return MissingVersionError(
        f"request {request_id} refused: {detail}. Every answer must be traceable to the prompt "
        "and model that made it."
    )


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
    "learned_versions",
    "missing_version_error",
    "model_call_attributes",
    "prompt_text",
    "serialized_prompt_text",
]
