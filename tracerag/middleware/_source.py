"""The middleware's source: materials from the turn's tool results, samples from its model call.

The same stage table as every front door (``tracerag.stages._table``) runs with this source:

- retrieve: the materials are what the tools the agent called in this turn returned (``_turn``):
  documents (artifacts and store searches), else the tools' text; nothing is retrieved again;
- sample: the answers are the agent's answering model call, drawn from the same request
  (``Draw`` callables the middleware gives) in adaptive rounds as on every front door
  (``tracerag.stages._stopping``): ``min_samples`` first, more only while the route could
  still change, at most N. Each is recorded by its own ``RunCapture`` (model name,
  parameters, what it was shown, token usage), so a ``[n]`` citation is the n-th material
  that call was shown and the versions are learned as ``wrap()`` learns them.
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
from tracerag._adaptive import Tally
from tracerag._llm import OnRetry, Tries, clean_text, text_of
from tracerag._state import (
    ErrorLog,
    RequestState,
    Retrieval,
    Sample,
    SampleSet,
    StageRefusal,
)
from tracerag.middleware._turn import Turn
from tracerag.stages._plan import implied_plan
from tracerag.stages._retrieve import record_materials
from tracerag.stages._sample import (
    TEMPERATURE_ZERO_WARNING,
    Draw,
    adaptive_fields,
    draw_samples,
    record_samples,
    samples_wanted,
)
from tracerag.stages._stopping import Verifier, draw_adaptive
from tracerag.wrapping._capture import RunCapture, model_call_attributes
from tracerag.wrapping._documents import run_materials, shown_order
from tracerag.wrapping._versions import learn_versions, missing_version_error

if TYPE_CHECKING:
    from tracerag._settings import Settings

__all__ = ["TOOLS_NOTE", "DrawAnswer", "OnRound", "TurnSource"]

logger = logging.getLogger("tracerag.middleware")

TOOLS_NOTE = "materials are what the agent's tools returned in this turn"
#: One answer of the answering model call: ``(index, on_retry, tries) -> AIMessage``.
DrawAnswer = Callable[[int, OnRetry, Tries], Awaitable[AIMessage]]
#: Told the samples of a round before they are drawn (so one call can answer them all).
OnRound = Callable[[Sequence[int]], None]


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
        on_round: OnRound | None = None,
    ) -> None:
        self.turn = turn
        self._draw = draw
        self._on_round = on_round
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
        """The answering call's answers in adaptive rounds (at most N), each with the order it
        was shown the materials."""
        wanted = samples_wanted(state, settings)
        captures = self.captures[:wanted]
        registered = state.registration.versions if state.registration is not None else None

        async def generate(index: int, on_retry: OnRetry, tries: Tries) -> Draw:
            message = await self._draw(index, on_retry, tries)
            usage = captures[index].token_usage
            # a sample that shared another's call was not billed: that call's usage is its
            reported = message.usage_metadata if captures[index].calls else None
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
        materials = state.materials
        verifier = Verifier(state, settings, span, errors, positional=True)

        def draw_round(indices: Sequence[int]) -> Awaitable[tuple[Sample, ...]]:
            chosen = list(indices)
            if self._on_round is not None:
                self._on_round(chosen)
            return draw_samples(
                state, settings, len(chosen), generate, describe, errors, indices=chosen
            )

        async def judge(drawn: tuple[Sample, ...]) -> Tally:
            # as the verify stage will see them: citing by position in the order shown
            ready = tuple(
                dataclasses.replace(s, material_order=shown_order(materials, captures[s.index], []))
                for s in drawn
            )
            return await verifier.tally(ready, materials)

        drawn, stopped = await draw_adaptive(state, settings, wanted, draw_round, judge)
        n = len(drawn)
        captures = captures[:n]
        for index in sorted(i for i in self._unmetered if i < n):
            for spent in captures[index].calls:
                usage_meter.note(spent)
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
        # a call that answered several samples is on the capture of the first of them only
        calls = sum(len(c.calls) for c in captures)
        warnings = record_samples(samples, span, temperature, stopped, wanted, calls)
        pending = state.registration.versions_from_runs if state.registration is not None else ()
        learned = learn_versions(pending, captures, state.question, materials, span)
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
            verified=dict(verifier.reports),
            **adaptive_fields(stopped, wanted, calls),  # type: ignore[arg-type]
        )
        missing = [name for name in pending if learned is None or not getattr(learned, name)]
        if missing:
            raise StageRefusal(missing_version_error(state.request_id, missing), sampled)
        return sampled


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
