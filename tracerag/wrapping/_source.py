"""wrap()'s source: how a wrapped app's materials are retrieved and its samples drawn."""

from __future__ import annotations

import dataclasses
import functools
import json
import logging
import threading
from collections import OrderedDict
from collections.abc import Awaitable, Callable, Sequence
from typing import TYPE_CHECKING, Any

from langchain_core.documents import Document
from langchain_core.retrievers import BaseRetriever
from langchain_core.runnables import Runnable, RunnableConfig
from langchain_core.vectorstores import VectorStoreRetriever
from opentelemetry.trace import Span

from tracerag import _semconv as semconv
from tracerag import _usage as usage_meter
from tracerag._adaptive import Tally
from tracerag._llm import OnRetry, Tries, clean_text, model_slots, retry_call, within
from tracerag._state import (
    ErrorLog,
    RequestInput,
    RequestState,
    Retrieval,
    RunVersions,
    Sample,
    SampleSet,
    StageRefusal,
)
from tracerag.contract import AppInterrupt, Versions
from tracerag.errors import ConfigurationError, RetrieverTimeoutError, UnreadableOutputError
from tracerag.stages._plan import implied_plan
from tracerag.stages._retrieve import fetch, record_materials, to_materials
from tracerag.stages._sample import (
    TEMPERATURE_ZERO_WARNING,
    Draw,
    NotDrawn,
    adaptive_fields,
    draw_samples,
    record_samples,
    samples_wanted,
)
from tracerag.stages._stopping import Verifier, draw_adaptive
from tracerag.telemetry._providers import get_tracer
from tracerag.telemetry._spans import data_source_of, describe_retrieval, top_k_of
from tracerag.wrapping._capture import RunCapture, model_call_attributes
from tracerag.wrapping._commit import (
    PAUSED_AFTER_ANSWER,
    AppInterrupted,
    Turn,
    answered_before_pause,
    history_turn,
    interrupts_of,
    note_structured,
    note_turn,
    paused_in_subgraph,
    withheld_pieces,
)
from tracerag.wrapping._documents import run_materials, shown_order
from tracerag.wrapping._hooks import Shared, scope
from tracerag.wrapping._inspect import ChainInfo
from tracerag.wrapping._io import ChainIO, independent_copy
from tracerag.wrapping._retryable import is_transient
from tracerag.wrapping._samples import Attempt, RequestRuns, Sampler
from tracerag.wrapping._versions import learn_versions, missing_version_error

if TYPE_CHECKING:
    from tracerag._settings import Settings
    from tracerag.signals._types import Material

logger = logging.getLogger("tracerag.wrapping")

RUNS_NOTE = "no retriever found in the app; materials are what its runs retrieved"
#: Requests whose retrieval is kept between their retrieve and sample stages, at most.
MAX_OPEN_REQUESTS = 4096
# retrievers whose documents the retrieve stage fetches from their store as they would
_SEARCHES_AS_RETRIEVER = {"similarity", "similarity_score_threshold"}


class ChainSource:
    """wrap()'s source: the app's retrievers, and samples from the app's runs (``_runs``)."""

    mode = "wrap"
    learns_versions = True

    @property
    def agent_name(self) -> str:
        """The wrapped app's name (``create_agent(name=...)``, a graph's ``LangGraph``): the
        root span is ``invoke_agent {agent_name}``."""
        return self.chain.get_name()

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
        self.sampler = sampler or Sampler(chain, answer_of=self.io.answer_or_none)
        self.chain_input = chain_input
        # each request's shared retrieval, from its retrieve stage to its sample stage
        self._open: OrderedDict[str, Shared] = OrderedDict()
        self._open_lock = threading.Lock()

    @property
    def shares_retrieval(self) -> bool:
        return self.sampler.sampling == "answer"

    def _shared(self, request_id: str, *, take: bool) -> Shared:
        with self._open_lock:
            shared = self._open.pop(request_id, None) if take else self._open.get(request_id)
            if shared is None:
                shared = Shared(self.shares_retrieval)
                if not take:
                    self._open[request_id] = shared
                    while len(self._open) > MAX_OPEN_REQUESTS:
                        self._open.popitem(last=False)
            return shared

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
        """The app's retrievers, each called once; a failing one is kept as an error.

        With ``sampling="answer"`` what each returned is what the app's runs get from it for
        the same question (``_hooks.Shared``), so the request retrieves once.
        """
        if not self.info.retrievers:
            # the app retrieves inside its own runs (graph nodes, tools): recorded after them
            span.set_attribute(semconv.RETRIEVAL_SOURCE, "runs")
            describe_retrieval(span, None, None)
            return Retrieval.of((), note=RUNS_NOTE, source="runs")
        shared = self._shared(state.request_id, take=False)
        errors = ErrorLog()
        pairs: list[tuple[Document, float | None]] = []
        for retriever in self.info.retrievers:
            try:
                with scope(shared):
                    found = await within(
                        functools.partial(fetch, retriever, state.question, config),
                        settings.retry.retriever_timeout,
                        RetrieverTimeoutError,
                    )
            except Exception as exc:  # the app's own runs will retrieve again
                errors.record_error("retrieve", exc)
                span.record_exception(exc)
                continue
            pairs.extend(found)
            if _fetched_as_retrieved(retriever, found):
                shared.seed(retriever, state.question, [doc for doc, _ in found])
        retrieval = Retrieval.of(
            to_materials(pairs),
            errors=errors.freeze(),
            source="retriever",
            shape=settings.retrieval_shape,
        )
        record_materials(retrieval, span)
        span.set_attribute(semconv.RETRIEVAL_SOURCE, "retriever")
        sources = [data_source_of(r) for r in self.info.retrievers]
        ks = [top_k_of(r) for r in self.info.retrievers]
        describe_retrieval(
            span,
            "+".join(dict.fromkeys(s for s in sources if s)) or None,
            sum(k for k in ks if k is not None) if all(k is not None for k in ks) else None,
            [(m.id, m.score, m.text) for m in retrieval.materials],
        )
        return retrieval

    async def sample(
        self, state: RequestState, settings: Settings, span: Span, config: Any = None
    ) -> SampleSet:
        """N answers from the app's runs; each with the materials its answer was shown."""
        n = max_n = samples_wanted(state, settings)
        shared = self._shared(state.request_id, take=True)
        tracer = get_tracer(settings.tracer_provider)
        captures = [RunCapture(tracer, state.request_id) for _ in range(n)]
        outputs: list[Any] = [None] * n
        app_input = self.app_input(state.input)
        registered = state.registration.versions if state.registration is not None else None
        runs = await self.sampler.start(config, state.request_id, n)
        span.set_attribute(semconv.SAMPLING, self.sampler.sampling)

        async def generate(index: int, on_retry: OnRetry, tries: Tries) -> Draw:
            capture_run = captures[index]
            capture_run.within_current_span()  # the sample's span: its run's tools go under it

            def attempts(attempt: Attempt) -> Awaitable[Any]:
                async def once() -> Any:
                    # an attempt holds one of the app's call slots (max_concurrency)
                    async with model_slots(settings.max_concurrency, self.sampler.chain):
                        capture_run.reset()
                        with scope(shared, capture_run):
                            return await attempt()

                return retry_call(
                    once, settings.retry, on_retry=on_retry, retry_on=is_transient, tries=tries
                )

            try:
                output = await runs.draw(index, independent_copy(app_input), capture_run, attempts)
            finally:
                if index == 0:
                    runs.app_run_done()
            outputs[index] = output
            if index == 0 and interrupts_of(output):  # paused for a person: no answer drawn
                raise NotDrawn("the app's own run paused at an interrupt before answering")
            usage = capture_run.token_usage
            return Draw(
                clean_text(self.io.answer(output), settings.retry.max_output_chars),
                input_tokens=usage.get("input_tokens"),
                output_tokens=usage.get("output_tokens"),
            )

        def describe(index: int, draw: Draw | None) -> dict[str, Any]:
            capture_run = captures[index]
            attrs = _model_attrs(capture_run, self.info)
            # a fork resumed at the model step: its prompt is the one the app's run formatted
            origin = captures[0] if runs.kinds[index] == "fork" else capture_run
            template_version = (
                (registered.prompt if registered is not None else None)
                or capture_run.prompt_version
                or origin.prompt_version
                or self.info.prompt_version
            )
            template_text = capture_run.last_prompt_text or origin.last_prompt_text
            attrs.update(
                model_call_attributes(capture_run.last_call, template_version, template_text)
            )
            attrs.update(usage_meter.span_attributes(capture_run.calls))
            attrs[semconv.SAMPLE_RUN] = runs.kinds[index]
            return attrs  # the output message is set from the sample itself

        errors = ErrorLog()
        verifier = Verifier(state, settings, span, errors, positional=True, kept=runs.kept)

        def draw_round(indices: Sequence[int]) -> Awaitable[tuple[Sample, ...]]:
            chosen = list(indices)
            return draw_samples(
                state, settings, len(chosen), generate, describe, errors, indices=chosen
            )

        async def judge(drawn: tuple[Sample, ...]) -> Tally:
            # the samples so far as the verify stage will see them: with the materials their
            # runs retrieved, each citing by position in the order its run was shown
            carried = [
                self.io.documents(outputs[s.index]) if outputs[s.index] is not None else []
                for s in drawn
            ]
            got = [captures[s.index] for s in drawn]
            seen = state.materials + run_materials(state.materials, got, carried)
            ready = tuple(
                dataclasses.replace(
                    s, material_order=shown_order(seen, captures[s.index], carried[i])
                )
                for i, s in enumerate(drawn)
            )
            return await verifier.tally(ready, seen)

        paused_in: list[str] = []
        try:
            drawn, stopped = await draw_adaptive(state, settings, n, draw_round, judge)
            paused_in = await runs.paused_in()
            if not paused_in:  # a turn paused inside a subgraph is refused, not kept
                await self._note_turn(runs, outputs[0], app_input, config)
        finally:
            await runs.cleanup()
        n = len(drawn)
        captures, outputs = captures[:n], outputs[:n]
        carried = [self.io.documents(o) if o is not None else [] for o in outputs]
        extra = run_materials(state.materials, captures, carried)
        materials = state.materials + extra
        samples = tuple(
            implied_plan(
                dataclasses.replace(
                    s, material_order=shown_order(materials, captures[i], carried[i])
                ),
                materials,
            )
            for i, s in enumerate(drawn)
        )
        _record_run_materials(state, materials, extra, span)
        temperatures = {c.temperature for c in captures if c.temperature is not None}
        # the runs' own temperature, else the chain's; None: the model has none tracerag knows
        temperature = temperatures.pop() if len(temperatures) == 1 else self.info.temperature
        zero = temperature == 0.0 and n > 1
        if zero:
            logger.warning("tracerag wrap: %s", TEMPERATURE_ZERO_WARNING)
        calls = sum(len(c.calls) for c in captures)
        warnings = record_samples(samples, span, temperature, stopped, max_n, calls) + _unreadable(
            samples
        )
        note_structured(
            {
                s.answer: data
                for s, o in zip(samples, outputs, strict=True)
                if s.answer is not None and (data := self.io.structured(o)) is not None
            }
        )
        kept = runs.kept
        if kept is not None:
            span.set_attribute(semconv.SAMPLE_KEPT, kept)
        pending = state.registration.versions_from_runs if state.registration is not None else ()
        learned = learn_versions(pending, captures, state.question, materials, span)
        sampled = SampleSet(
            samples=samples,
            temperature=temperature,
            temperature_zero=settings.temperature == 0.0 or zero,
            positional=True,
            extra_materials=extra,
            versions=learned,
            warnings=warnings,
            errors=errors.freeze(),
            kept=kept,
            sampling=self.sampler.sampling,
            runs=tuple(runs.kinds[:n]),
            **adaptive_fields(stopped, max_n, calls),  # type: ignore[arg-type]
        )
        interrupts = interrupts_of(outputs[0])
        if interrupts and paused_in:
            raise StageRefusal(ConfigurationError(paused_in_subgraph(paused_in)), sampled)
        if interrupts and answered_before_pause(outputs[0]):
            raise StageRefusal(ConfigurationError(PAUSED_AFTER_ANSWER), sampled)
        if interrupts:  # the app paused for a person: nothing to verify yet
            paused = self._interrupted(state, interrupts, learned)
            sampled = _drawn_before_pause(sampled)
            span.set_attributes(
                {
                    semconv.SAMPLES_DRAWN: len(sampled.samples),
                    semconv.SAMPLES_OK: 0,
                    semconv.SAMPLES_FAILED: 0,  # paused, not failed
                    semconv.SAMPLES_STOP: semconv.INTERRUPTED,
                }
            )
            raise StageRefusal(paused, sampled)
        missing = [name for name in pending if learned is None or not getattr(learned, name)]
        if missing:  # the record still shows what the runs did and retrieved
            raise StageRefusal(missing_version_error(state.request_id, missing), sampled)
        return sampled

    def _interrupted(
        self,
        state: RequestState,
        interrupts: tuple[AppInterrupt, ...],
        learned: RunVersions | None,
    ) -> AppInterrupted:
        registered = state.registration.versions if state.registration is not None else None
        found = [v for v in (registered, learned) if v is not None]
        versions = Versions(
            prompt=next((v.prompt for v in found if v.prompt), ""),
            model=next((v.model for v in found if v.model), ""),
            tracerag=registered.tracerag if registered is not None else "",
        )
        tier = state.registration.tier if state.registration is not None else "high"
        return AppInterrupted(
            interrupts,
            request_id=state.request_id,
            trace_id=state.trace_id,
            versions=versions,
            tier=str(tier),
        )

    async def _note_turn(self, runs: RequestRuns, output: Any, app_input: Any, config: Any) -> None:
        """Hand what this turn leaves in the app's own state (its thread, its history) to the
        request, which commits it once routed (``_commit``)."""
        turns: list[Turn] = []
        pieces = (
            withheld_pieces(self.io.answer_or_none(output), self.io.structured(output))
            if output is not None
            else ()
        )
        thread = await runs.turn(pieces, output is None)
        if thread is not None:
            turns.append(thread)
        history_app = self.sampler.history_app
        if history_app is not None:
            turns.append(history_turn(history_app, app_input, config or RunnableConfig()))
        for turn in turns:
            if not note_turn(turn):
                logger.warning(
                    "tracerag wrap: a sample stage ran outside a wrapped app's request; "
                    "its turn is not kept in the app's thread or history"
                )


def _drawn_before_pause(sampled: SampleSet) -> SampleSet:
    """A paused turn's samples: the app's own run only. The others were never drawn (the turn
    has no answer to sample yet), so they are neither failed samples nor errors."""
    first = sampled.samples[:1]
    unread = set(_unreadable(sampled.samples))
    return dataclasses.replace(
        sampled,
        samples=first,
        runs=sampled.runs[:1],
        stop_reason=semconv.INTERRUPTED,  # not settled, nor every sample drawn
        stop_risk=None,
        errors=tuple(e for e in sampled.errors if e.extra.get("sample", 0) == 0),
        warnings=tuple(w for w in sampled.warnings if w not in unread) + _unreadable(first),
    )


def _unreadable(samples: Sequence[Any]) -> tuple[str, ...]:
    """A warning naming why the app's outputs could not be read, when some could not: an
    escalation of unreadable outputs is never silent."""
    errors = [
        s.error for s in samples if s.error and s.error.startswith(UnreadableOutputError.__name__)
    ]
    if not errors:
        return ()
    first = errors[0].split(": ", 1)[-1]
    return (f"{len(errors)} of {len(samples)} outputs of the app could not be read: {first}",)


def _fetched_as_retrieved(retriever: BaseRetriever, found: Sequence[Any]) -> bool:
    """Whether the retrieve stage's documents are what ``retriever.invoke(question)`` returns:
    a vector store retriever searched as it searches (through its own invoke, documents are
    shared by ``_hooks`` already)."""
    return isinstance(retriever, VectorStoreRetriever) and (
        retriever.search_type in _SEARCHES_AS_RETRIEVER
        and all(score is not None for _, score in found)
    )


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
