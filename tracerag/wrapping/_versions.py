"""The prompt and model versions of a wrapped app's answers, and how each was obtained.

In order of preference, the prompt version is:

- ``argument``: ``wrap(..., prompt_version=...)``;
- ``template``: the fingerprint of the prompt templates inspecting the app finds;
- ``run-template``: the fingerprint of the prompt templates the app's runs formatted (prompts
  built inside graph nodes);
- ``model-input``: the fingerprint of what actually reached the model when it answered and no
  template is visible — its system messages (a ``create_agent(system_prompt="...")`` string), the
  schemas of the tools bound to it, and the static part of the user message carrying the
  question (a prompt built with ``str.format``): the question, the documents, the tool outputs
  and the documents' metadata are masked out, so the fingerprint changes when the prompt does and
  not from one question to the next.

The model version is ``argument``, ``app`` (the chat models in the app's chain) or ``run`` (the
names its runs' model calls report). Only when the runs show no model call at all is there
nothing to fingerprint: the request is refused with ``MissingVersionError``.
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Sequence
from typing import Literal

from langchain_core.messages import BaseMessage, HumanMessage, ToolMessage
from opentelemetry.trace import Span

from tracerag import _semconv as semconv
from tracerag._llm import text_of
from tracerag._state import RunVersions
from tracerag.errors import MissingVersionError
from tracerag.prompts import fingerprint
from tracerag.signals._types import Material
from tracerag.wrapping._capture import ModelCall, RunCapture

PromptSource = Literal["argument", "template", "run-template", "model-input"]
ModelSource = Literal["argument", "app", "run"]

#: What the masked parts of a model input become.
QUESTION = "{question}"
DOCUMENT = "{document}"
METADATA = "{metadata}"
TOOL_OUTPUT = "{tool_output}"
_TOOL_KEYS = ("tools", "functions")


def _masked(text: str, dynamic: Sequence[tuple[str, str]]) -> str:
    for value, placeholder in dynamic:
        if value in text:
            text = text.replace(value, placeholder)
    return text


def model_input_text(
    call: ModelCall, question: str, materials: Sequence[Material] = ()
) -> str | None:
    """The static part of what one model call was given, or None when it was given nothing.

    System (and developer) messages, the last user message and the bound tools' schemas, with
    the request's dynamic parts masked: tool outputs, materials (their text and metadata) and
    the question.
    """
    tool_outputs = [text_of(m, sep="\n") for m in call.messages if isinstance(m, ToolMessage)]
    pairs = [(t, TOOL_OUTPUT) for t in tool_outputs]
    for m in materials:
        pairs.append((m.text, DOCUMENT))
        if m.metadata:
            pairs.append((str(m.metadata), METADATA))
    pairs.append((question, QUESTION))
    # longer values first, so a document inside a tool output is masked with the output
    dynamic = sorted(((v, p) for v, p in pairs if v.strip()), key=lambda vp: -len(vp[0]))
    parts: list[str] = []
    messages: list[BaseMessage] = list(call.messages)
    last_human = max(
        (i for i, m in enumerate(messages) if isinstance(m, HumanMessage)), default=None
    )
    for i, message in enumerate(messages):
        if message.type in ("system", "developer") or i == last_human:
            parts.append(f"{message.type}:{_masked(text_of(message, sep=chr(10)), dynamic)}")
    parts.extend(f"prompt:{_masked(p, dynamic)}" for p in call.prompts)
    for key in _TOOL_KEYS:
        schemas = call.params.get(key)
        if schemas:
            parts.append(f"{key}:{json.dumps(schemas, sort_keys=True, default=str)}")
    return "\n".join(parts) if parts else None


def learn_prompt(
    captures: Iterable[RunCapture], question: str, materials: Sequence[Material]
) -> tuple[str | None, PromptSource | None]:
    """The prompt version the runs show, and how: templates they formatted, else model input."""
    captured = list(captures)
    texts: list[str] = []
    for c in captured:
        texts.extend(t for t in c.prompt_texts if t not in texts)
    if texts:
        return fingerprint(*texts), "run-template"
    for c in captured:
        call = c.last_call
        if call is None:
            continue
        static = model_input_text(call, question, materials)
        if static is not None:
            return fingerprint(static), "model-input"
    return None, None


def missing_version_error(request_id: str, missing: Sequence[str]) -> MissingVersionError:
    """The refusal for versions that neither the arguments, the app nor its runs could give."""
    reasons = {
        "prompt": (
            "the app's runs made no model call tracerag could see, so there is neither a prompt "
            "template nor a model input to fingerprint: pass prompt_version= to wrap()"
        ),
        "model": "no model call reported a model name, so pass model_version= to wrap()",
    }
    detail = "; ".join(f"no {name} version: {reasons[name]}" for name in missing)
    return MissingVersionError(
        f"request {request_id} refused: {detail}. Every answer must be traceable to the prompt "
        "and model that made it."
    )


def learn_model(captures: Iterable[RunCapture]) -> str | None:
    """The model version the runs show: the names their model calls report, joined."""
    names: list[str] = []
    for c in captures:
        names.extend(n for n in c.model_names if n not in names)
    return "+".join(names) or None


def learn_versions(
    pending: Sequence[str],
    captures: Sequence[RunCapture],
    question: str,
    materials: Sequence[Material],
    span: Span,
) -> RunVersions | None:
    """The pending versions as the runs' answering calls show them, with how each was
    obtained, set on the sample stage's span (wrap() and the middleware learn them alike)."""
    if not pending:
        return None
    prompt, prompt_source = (None, None)
    if "prompt" in pending:
        prompt, prompt_source = learn_prompt(captures, question, materials)
    model = learn_model(captures) if "model" in pending else None
    learned = RunVersions(
        prompt=prompt,
        model=model,
        prompt_source=prompt_source,
        model_source="run" if model else None,
    )
    if learned.prompt:
        span.set_attribute(semconv.VERSION_PROMPT, learned.prompt)
        span.set_attribute(semconv.VERSION_PROMPT_SOURCE, prompt_source or "")
    if learned.model:
        span.set_attribute(semconv.VERSION_MODEL, learned.model)
        span.set_attribute(semconv.VERSION_MODEL_SOURCE, "run")
    return learned


__all__ = [
    "DOCUMENT",
    "METADATA",
    "QUESTION",
    "TOOL_OUTPUT",
    "ModelSource",
    "PromptSource",
    "learn_model",
    "learn_prompt",
    "learn_versions",
    "missing_version_error",
    "model_input_text",
]
