"""The middleware's source: materials from the turn's tool results, samples from its model call.

The same stage table as every front door (``tracerag.stages._table``) runs with this source:

- retrieve: the materials are what the tools the agent called in this turn returned (``_turn``):
  documents (artifacts and store searches), else the tools' text; nothing is retrieved again;
- sample: the N answers are the agent's answering model call, drawn N times from the same
  request (``Draw`` callables the middleware gives), each recorded by its own ``RunCapture``
  (model name, parameters, what it was shown, token usage), so a ``[n]`` citation is the n-th
  material that call was shown and the versions are learned as ``wrap()`` learns them.
"""

from __future__ import annotations

import dataclasses
import json
import logging
from collections.abc import Awaitable, Callable, Collection, Sequence
from typing import TYPE_CHECKING, Any

from langchain_core.messages import AIMessage
from langchain_core.runnables import RunnableConfig
from opentelemetry.trace import Span

from tracerag import _semconv as semconv
from tracerag import _usage as usage_meter
from tracerag._llm import OnRetry, Tries, clean_text, text_of
from tracerag._state import ErrorLog, RequestState, Retrieval, RunVersions, SampleSet, StageRefusal
from tracerag.middleware._turn import Turn
from tracerag.stages._plan import implied_plan
from tracerag.stages._retrieve import record_materials
from tracerag.stages._sample import (
    TEMPERATURE_ZERO_WARNING,
    Draw,
    draw_samples,
    record_samples,
    samples_wanted,
)
from tracerag.wrapping._capture import RunCapture, model_call_attributes
from tracerag.wrapping._documents import run_materials, shown_order
from tracerag.wrapping._versions import learn_model, learn_prompt, missing_version_error

if TYPE_CHECKING:
    from tracerag._settings import Settings
    from tracerag.signals._types import Material

__all__ = ["TOOLS_NOTE", "DrawAnswer", "TurnSource"]

logger = logging.getLogger("tracerag.middleware")

TOOLS_NOTE = "materials are what the agent's tools returned in this turn"
#: One answer of the answering model call: ``(index, on_retry, tries) -> AIMessage``.
DrawAnswer = Callable[[int, OnRetry, Tries], Awaitable[AIMessage]]


class TurnSource:
    """The middleware's source for one turn (made per turn: it holds the turn's draws)."""

    mode = "middleware"
    learns_versions = True

    def __init__(
        self,
        turn: Turn,
        draw: DrawAnswer,
        captures: Sequence[RunCapture],
        unmetered: Collection[int] = (),
    ) -> None:
        self.turn = turn
        self._draw = draw
        self.captures = list(captures)
        #: samples whose calls were made before the request's run (the agent's own answering
        #: call, the answers drawn at once with it): their usage is noted by the sample stage
        self._unmetered = unmetered
        self._tool_run = turn.capture()

    async def retrieve(
        self, state: RequestState, settings: Settings, span: Span, config: RunnableConfig | None
    ) -> Retrieval:
        """The turn's tool results as materials; the agent already retrieved them."""
        materials = run_materials((), [self._tool_run], [[]])
        retrieval = Retrieval.of(
            materials, note=TOOLS_NOTE, source="tools", shape=settings.retrieval_shape
        )
        record_materials(retrieval, span)
        span.set_attribute(semconv.RETRIEVAL_SOURCE, "tools")
        return retrieval

    async def sample(
        self, state: RequestState, settings: Settings, span: Span, config: RunnableConfig | None
    ) -> SampleSet:
        """The answering call's N answers, each with the order it was shown the materials."""
        n = samples_wanted(state, settings)
        captures = self.captures[:n]
        registered = state.registration.versions if state.registration is not None else None

        async def generate(index: int, on_retry: OnRetry, tries: Tries) -> Draw:
            message = await self._draw(index, on_retry, tries)
            usage = captures[index].token_usage
            reported = message.usage_metadata
            return Draw(
                clean_text(text_of(message), settings.retry.max_output_chars),
                input_tokens=usage.get(
                    "input_tokens", reported["input_tokens"] if reported else None
                ),
                output_tokens=usage.get(
                    "output_tokens", reported["output_tokens"] if reported else None
                ),
            )

        def describe(index: int, draw: Draw | None) -> dict[str, Any]:
            run = captures[index]
            attrs = _model_attrs(run)
            version = (registered.prompt if registered is not None else None) or (
                run.prompt_version
            )
            attrs.update(model_call_attributes(run.last_call, version, run.last_prompt_text))
            attrs.update(usage_meter.span_attributes(run.calls))
            attrs[semconv.SAMPLE_RUN] = "model-call"
            return attrs

        errors = ErrorLog()
        drawn = await draw_samples(state, settings, n, generate, describe, errors)
        for index in sorted(i for i in self._unmetered if i < n):
            for spent in captures[index].calls:
                usage_meter.note(spent)
        materials = state.materials
        samples = tuple(
            implied_plan(
                dataclasses.replace(s, material_order=shown_order(materials, captures[i], [])),
                materials,
            )
            for i, s in enumerate(drawn)
        )
        temperatures = {c.temperature for c in captures if c.temperature is not None}
        temperature = temperatures.pop() if len(temperatures) == 1 else None
        zero = temperature == 0.0 and n > 1
        if zero:
            logger.warning("tracerag middleware: %s", TEMPERATURE_ZERO_WARNING)
        warnings = record_samples(samples, span, temperature)
        pending = state.registration.versions_from_runs if state.registration is not None else ()
        learned = _learn_versions(pending, captures, state.question, materials, span)
        sampled = SampleSet(
            samples=samples,
            temperature=temperature,
            temperature_zero=zero,
            positional=True,
            versions=learned,
            warnings=warnings,
            errors=errors.freeze(),
            sampling="answer",
            runs=tuple("model-call" for _ in samples),
        )
        missing = [name for name in pending if learned is None or not getattr(learned, name)]
        if missing:
            raise StageRefusal(missing_version_error(state.request_id, missing), sampled)
        return sampled


def _learn_versions(
    pending: Sequence[str],
    captures: Sequence[RunCapture],
    question: str,
    materials: Sequence[Material],
    span: Span,
) -> RunVersions | None:
    """The versions not given, as the answering calls show them (as ``wrap()`` learns them)."""
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


def _model_attrs(run: RunCapture) -> dict[str, Any]:
    """A sample span's model attributes, from what its call's callbacks saw."""
    attrs: dict[str, Any] = {
        semconv.OI_SPAN_KIND: semconv.OI_KIND_LLM,
        semconv.GENAI_OPERATION_NAME: semconv.GENAI_OPERATION_CHAT,
    }
    name = run.model_name
    if name:
        attrs[semconv.OI_LLM_MODEL_NAME] = name
        attrs[semconv.GENAI_REQUEST_MODEL] = name
    params = run.invocation_params
    provider = params.get("ls_provider") or params.get("_type")
    if provider:
        attrs[semconv.GENAI_PROVIDER_NAME] = str(provider)
    if run.temperature is not None:
        attrs[semconv.GENAI_REQUEST_TEMPERATURE] = run.temperature
    if params:
        attrs[semconv.OI_LLM_INVOCATION_PARAMETERS] = json.dumps(params, default=str)
    return attrs
