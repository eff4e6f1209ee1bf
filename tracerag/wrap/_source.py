"""wrap()'s source: how a wrapped app's materials are retrieved and its samples drawn."""

from __future__ import annotations

import dataclasses
import functools
import json
import logging
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, Any

from langchain_core.documents import Document
from langchain_core.runnables import Runnable
from opentelemetry.trace import Span

from tracerag import semconv
from tracerag import usage as usage_meter
from tracerag.errors import RetrieverTimeoutError
from tracerag.llm import OnRetry, Tries, clean_text, retry_call, within
from tracerag.stages.plan import implied_plan
from tracerag.stages.retrieve import fetch, record_materials, to_materials
from tracerag.stages.sample import (
    TEMPERATURE_ZERO_WARNING,
    Draw,
    draw_samples,
    record_samples,
    samples_wanted,
)
from tracerag.state import (
    ErrorLog,
    RequestInput,
    RequestState,
    Retrieval,
    RunVersions,
    SampleSet,
    StageRefusal,
)
from tracerag.wrap._capture import (
    RunCapture,
    learned_versions,
    missing_version_error,
    model_call_attributes,
)
from tracerag.wrap._inspect import ChainInfo
from tracerag.wrap._io import ChainIO, independent_copy
from tracerag.wrap._retryable import is_transient
from tracerag.wrap._runs import Sampler, SampleRun

if TYPE_CHECKING:
    from tracerag.settings import Settings
    from tracerag.signals.types import Material

logger = logging.getLogger("tracerag.wrap")

RUNS_NOTE = "no retriever found in the app; materials are what its runs retrieved"


class ChainSource:
    """wrap()'s source: the app's retrievers, and samples from whole, independent runs of it."""

    mode = "wrap"
    learns_versions = True

    def __init__(
        self,
        chain: Runnable[Any, Any],
        info: ChainInfo,
        *,
        io: ChainIO | None = None,
        sampler: Sampler | None = None,
        chain_input: Callable[[str], Any] | None = None,
    ) -> None:
        self.chain = chain
        self.info = info
        self.io = io or ChainIO()
        self.sampler = sampler or Sampler(chain)
        self.chain_input = chain_input

    def app_input(self, request: RequestInput) -> Any:
        """The app's input for a request: the caller's own, else one made from the question."""
        if request.app_input is not None:
            return request.app_input
        if self.chain_input is not None:
            return self.chain_input(request.question)
        return self.io.string_input(request.question)

    async def retrieve(
        self, state: RequestState, settings: Settings, span: Span, config: Any = None
    ) -> Retrieval:
        """The app's retrievers, each called once; a failing one is kept as an error."""
        if not self.info.retrievers:
            # the app retrieves inside its own runs (graph nodes, functions): recorded after them
            span.set_attribute(semconv.RETRIEVAL_SOURCE, "runs")
            return Retrieval.of((), note=RUNS_NOTE, source="runs")
        errors = ErrorLog()
        pairs: list[tuple[Document, float | None]] = []
        for retriever in self.info.retrievers:
            try:
                pairs.extend(
                    await within(
                        functools.partial(fetch, retriever, state.question, config),
                        settings.retry.retriever_timeout,
                        RetrieverTimeoutError,
                    )
                )
            except Exception as exc:  # the app's own runs will retrieve again
                errors.record_error("retrieve", exc)
                span.record_exception(exc)
        retrieval = Retrieval.of(
            to_materials(pairs),
            errors=errors.freeze(),
            source="retriever",
            shape=settings.retrieval_shape,
        )
        record_materials(retrieval, span)
        span.set_attribute(semconv.RETRIEVAL_SOURCE, "retriever")
        return retrieval

    async def sample(
        self, state: RequestState, settings: Settings, span: Span, config: Any = None
    ) -> SampleSet:
        """The app run N times; each sample with the documents its run used and its plan."""
        n = samples_wanted(state, settings)
        captures = [RunCapture() for _ in range(n)]
        used: list[list[Document]] = [[] for _ in range(n)]
        app_input = self.app_input(state.input)
        registered = state.registration.versions if state.registration is not None else None
        runs: list[SampleRun] = await self.sampler.prepare(config, state.request_id, n)

        async def generate(index: int, on_retry: OnRetry, tries: Tries) -> Draw:
            capture_run = captures[index]

            async def once() -> Any:
                capture_run.reset()
                return await runs[index].ainvoke(independent_copy(app_input), capture_run)

            output = await retry_call(
                once, settings.retry, on_retry=on_retry, retry_on=is_transient, tries=tries
            )
            used[index] = self.io.documents(output) or list(capture_run.documents)
            usage = capture_run.token_usage
            return Draw(
                clean_text(self.io.answer(output), settings.retry.max_output_chars),
                input_tokens=usage.get("input_tokens"),
                output_tokens=usage.get("output_tokens"),
            )

        def describe(index: int, draw: Draw | None) -> dict[str, Any]:
            capture_run = captures[index]
            attrs = _model_attrs(capture_run, self.info)
            template_version = (
                (registered.prompt if registered is not None else None)
                or capture_run.prompt_version
                or self.info.prompt_version
            )
            attrs.update(
                model_call_attributes(
                    capture_run.last_call, template_version, capture_run.last_prompt_text
                )
            )
            attrs.update(usage_meter.span_attributes(capture_run.calls))
            return attrs  # the output message is set from the sample itself

        errors = ErrorLog()
        try:
            drawn = await draw_samples(state, settings, n, generate, describe, errors)
        finally:
            await self.sampler.cleanup(runs)
        extra, orders = _run_materials(state.materials, captures, used)
        materials = state.materials + extra
        samples = tuple(
            implied_plan(dataclasses.replace(s, material_order=order), materials)
            for s, order in zip(drawn, orders, strict=True)
        )
        _record_run_materials(state, materials, extra, span)
        temperatures = {c.temperature for c in captures if c.temperature is not None}
        # the runs' own temperature, else the chain's; None: the model has none tracerag knows
        temperature = temperatures.pop() if len(temperatures) == 1 else self.info.temperature
        zero = temperature == 0.0 and n > 1
        if zero:
            logger.warning("tracerag wrap: %s", TEMPERATURE_ZERO_WARNING)
        warnings = record_samples(samples, span, temperature)
        pending = state.registration.versions_from_runs if state.registration is not None else ()
        learned = _learn_versions(pending, captures, span)
        sampled = SampleSet(
            samples=samples,
            temperature=temperature,
            temperature_zero=settings.temperature == 0.0 or zero,
            positional=True,
            extra_materials=extra,
            versions=learned,
            warnings=warnings,
            errors=errors.freeze(),
        )
        missing = [name for name in pending if learned is None or not getattr(learned, name)]
        if missing:  # the record still shows what the runs did and retrieved
            raise StageRefusal(missing_version_error(state.request_id, missing), sampled)
        return sampled


def _learn_versions(
    pending: Sequence[str], captures: Sequence[RunCapture], span: Span
) -> RunVersions | None:
    """The pending versions as the runs show them (prompt templates, model names)."""
    if not pending:
        return None
    prompt, model = learned_versions(captures)
    learned = RunVersions(
        prompt=prompt if "prompt" in pending else None,
        model=model if "model" in pending else None,
    )
    if learned.prompt:
        span.set_attribute(semconv.VERSION_PROMPT, learned.prompt)
    if learned.model:
        span.set_attribute(semconv.VERSION_MODEL, learned.model)
    return learned


def _run_materials(
    known_materials: tuple[Material, ...],
    captures: Sequence[RunCapture],
    used: Sequence[Sequence[Document]],
) -> tuple[tuple[Material, ...], list[tuple[str, ...]]]:
    """Materials the runs retrieved beyond the known ones, and the documents each run used.

    A run's order is the documents it put in its prompt (its output's documents, else what
    its retrievers returned): ``[1]`` cites the first of them.
    """
    known = {m.id for m in known_materials}
    extra: list[Material] = []
    orders: list[tuple[str, ...]] = []
    for capture_run, documents in zip(captures, used, strict=True):
        retrieved = to_materials([(d, None) for d in [*capture_run.documents, *documents]])
        for m in retrieved:
            if m.id not in known:
                extra.append(dataclasses.replace(m, rank=len(known_materials) + len(extra) + 1))
                known.add(m.id)
        orders.append(tuple(m.id for m in to_materials([(d, None) for d in documents])))
    return tuple(extra), orders


def _record_run_materials(
    state: RequestState,
    materials: tuple[Material, ...],
    extra: tuple[Material, ...],
    span: Span,
) -> None:
    """Put every material the answer may cite on the sample span, and where they come from."""
    source = state.retrieval.source if state.retrieval is not None else None
    if source == "runs":  # the documents appear in the trace here, once
        record_materials(Retrieval.of(materials, note=RUNS_NOTE), span)
    else:
        span.set_attributes(
            {
                semconv.RETRIEVAL_COUNT: len(materials),
                semconv.RETRIEVAL_MATERIAL_IDS: [m.id for m in materials],
            }
        )
        source = "retriever+runs" if extra else "retriever"
    span.set_attribute(semconv.RETRIEVAL_SOURCE, source)


def _model_attrs(capture_run: RunCapture, info: ChainInfo) -> dict[str, Any]:
    """The model attributes of a sample span, from what its run's callbacks saw."""
    name = capture_run.model_name or info.model_version
    attrs: dict[str, Any] = {
        semconv.OI_SPAN_KIND: semconv.OI_KIND_LLM,
        semconv.GENAI_OPERATION_NAME: semconv.GENAI_OPERATION_CHAT,
    }
    if name:
        attrs[semconv.OI_LLM_MODEL_NAME] = name
        attrs[semconv.GENAI_REQUEST_MODEL] = name
    params = capture_run.invocation_params
    provider = params.get("ls_provider") or params.get("_type")
    if provider:
        attrs[semconv.GENAI_PROVIDER_NAME] = str(provider)
    if capture_run.temperature is not None:
        attrs[semconv.GENAI_REQUEST_TEMPERATURE] = capture_run.temperature
    if params:
        attrs[semconv.OI_LLM_INVOCATION_PARAMETERS] = json.dumps(params, default=str)
    return attrs


__all__ = ["RUNS_NOTE", "ChainSource"]
