"""wrap(app): the six traced stages around an existing LangChain chain or LangGraph graph.

The app is left unchanged and is inspected once: its prompt templates give the prompt version
(a stable hash of their text), its chat model gives the model version and temperature, its
retriever is found so the retrieve stage can call it once. The caller's input is passed to the
app as it is; the question, the answer and the documents are found in the app's input and output
by ``tracerag.chain_io`` (``input_key=``, ``output_key=``, ``documents_key=``). Each request runs:

- register: versions from the arguments or the inspection; those still unknown (prompt and
  model called inside graph nodes) are left to be learned from this request's runs;
- retrieve: the app's retriever (or ``retriever=``), called once with relevance scores where it
  can give them; an app that retrieves only inside its runs is recorded after them
  (``tracerag.retrieval.source = runs``);
- sample: the app run N times concurrently and independently (``tracerag.graph_runs``);
  ``tracerag.chain_capture`` records per run the documents it retrieved, the documents its output
  carries, its model calls and its prompt templates; documents a run retrieved that the retrieve
  stage did not join the materials after the retrieved ones, so what was in a prompt can be
  cited; deterministic errors (``tracerag.chain_errors``) are not retried. Versions left to the
  runs are learned here, and the request is refused if the runs do not show them either.
  A foreign app writes no plan, so each sample carries its *implied* plan — the materials it
  actually cited and the quantities it states;
- plan, verify and assemble: the stage table of RAGPipeline with ``plan="inline"`` (the plan
  stage records how far the samples' plans agree). Citations may be material ids
  (``[policy-7]``) or 1-based positions in the documents the run put in its prompt (``[1]``).

Only retrieval and sampling are wrap's own (``ChainSource``); every stage is the shared one.

If the model runs at temperature 0 the samples cannot disagree: a warning is logged and put on
the span and the Response, and self-consistency is reported as uninformative.
"""

from __future__ import annotations

import dataclasses
import functools
import json
import logging
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from langchain_core.documents import Document
from langchain_core.language_models import BaseLanguageModel
from langchain_core.prompts import BasePromptTemplate
from langchain_core.retrievers import BaseRetriever
from langchain_core.runnables import Runnable, RunnableLambda, RunnableParallel, RunnableSequence
from langchain_core.runnables.base import RunnableBindingBase, RunnableEachBase
from langchain_core.runnables.configurable import DynamicRunnable
from langchain_core.runnables.passthrough import RunnableAssign
from opentelemetry.trace import Span

from tracerag import semconv
from tracerag import usage as usage_meter
from tracerag._runnable import StagedRunnable
from tracerag.chain_capture import (
    RunCapture,
    learned_versions,
    missing_version_error,
    model_call_attributes,
    prompt_text,
)
from tracerag.chain_errors import is_transient
from tracerag.chain_io import ChainIO, independent_copy
from tracerag.errors import ConfigurationError, RetrieverTimeoutError
from tracerag.graph_runs import Sampler, SampleRun
from tracerag.llm import OnRetry, Tries, clean_text, model_name, retry_call, within
from tracerag.options import check_options
from tracerag.pipeline import PipelineOptions, build_settings
from tracerag.prompts import fingerprint
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

if TYPE_CHECKING:
    from typing_extensions import Unpack

    from tracerag.routing import EscalationHandler
    from tracerag.settings import Settings
    from tracerag.signals.types import Material

logger = logging.getLogger("tracerag.wrap")


@dataclass
class ChainInfo:
    """What inspecting a chain found: prompt texts, models, retrievers."""

    prompt_texts: list[str] = field(default_factory=list)
    models: list[BaseLanguageModel[Any]] = field(default_factory=list)
    retrievers: list[BaseRetriever] = field(default_factory=list)

    @property
    def prompt_version(self) -> str | None:
        return fingerprint(*self.prompt_texts) if self.prompt_texts else None

    @property
    def model_version(self) -> str | None:
        names = [n for n in (model_name(m) for m in self.models) if n]
        return "+".join(dict.fromkeys(names)) or None

    @property
    def temperature(self) -> float | None:
        for m in self.models:
            value = getattr(m, "temperature", None)
            if isinstance(value, (int, float)):
                return float(value)
        return None


def graph_nodes(runnable: Runnable[Any, Any]) -> Iterator[Any]:
    """The runnables ``runnable.get_graph()`` draws as its nodes, in its order.

    Schema nodes may be left out; a runnable drawn by code other than LangChain's own
    composition (a LangGraph app, for one) gives the nodes of its ``get_graph()``.
    """
    # walking LangChain's compositions directly builds no input or output schema; for a chain
    # with a branch, get_graph() spends tens of milliseconds on those
    draw = type(runnable).get_graph
    if draw is Runnable.get_graph:
        yield runnable
    elif draw is RunnableSequence.get_graph:
        for step in runnable.steps:  # type: ignore[attr-defined]
            yield from graph_nodes(step)
    elif draw is RunnableParallel.get_graph:
        for step in runnable.steps__.values():  # type: ignore[attr-defined]
            yield from graph_nodes(step)
    elif draw is RunnableAssign.get_graph:
        yield from graph_nodes(runnable.mapper)  # type: ignore[attr-defined]
    elif draw is RunnableBindingBase.get_graph or draw is RunnableEachBase.get_graph:
        yield from graph_nodes(runnable.bound)  # type: ignore[attr-defined]
    elif draw is DynamicRunnable.get_graph:
        yield from graph_nodes(runnable.prepare()[0])  # type: ignore[attr-defined]
    elif draw is RunnableLambda.get_graph:
        deps = runnable.deps  # type: ignore[attr-defined]
        if deps:
            for dep in deps:
                yield from graph_nodes(dep)
        else:
            yield runnable
    else:
        for node in runnable.get_graph().nodes.values():
            yield node.data


def inspect_chain(chain: Runnable[Any, Any]) -> ChainInfo:
    """Find the prompts, models and retrievers inside a chain's graph."""
    info = ChainInfo()
    for data in graph_nodes(chain):
        if isinstance(data, BasePromptTemplate):
            info.prompt_texts.append(prompt_text(data))
        elif isinstance(data, BaseLanguageModel):
            info.models.append(data)
        elif isinstance(data, BaseRetriever):
            info.retrievers.append(data)
    return info


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


class WrappedChain(StagedRunnable):
    """An existing chain or graph run through the six traced stages; returns a ``Response``.

    Input: what the app takes (a question string, or a dict such as ``{"question": …}`` or
    ``{"input": …, "chat_history": […]}``), passed to it unchanged; ``session_id``,
    ``user_id``, ``channel`` and ``request_id`` in a dict are recorded too. A
    ``RequestInput`` is tracerag's own request: the app gets its question as a bare question.
    """

    def __init__(
        self,
        chain: Runnable[Any, Any],
        *,
        settings: Settings,
        info: ChainInfo,
        chain_input: Callable[[str], Any] | None = None,
        io: ChainIO | None = None,
        run_once: Sequence[str] = (),
    ) -> None:
        source = ChainSource(
            chain,
            info,
            io=io,
            sampler=Sampler(chain, run_once),
            chain_input=chain_input,
        )
        super().__init__(settings, source)
        self.chain = chain
        self.info = info
        self.chain_input = chain_input
        self.io = source.io
        self.sampler = source.sampler

    @property
    def escalation(self) -> EscalationHandler:
        return self.settings.escalation

    def parse_input(self, input: Any) -> RequestInput:
        """The checked request, with the caller's input kept for the app."""
        if isinstance(input, RequestInput):
            return super().parse_input(input)
        request = self.io.request(input)
        parsed = super().parse_input({"question": request.question, **request.fields})
        if self.chain_input is not None:  # the app's input is made from the question
            return parsed
        return dataclasses.replace(parsed, app_input=request.chain_input)


def wrap(
    chain: Runnable[Any, Any],
    *,
    prompt_version: str | None = None,
    model_version: str | None = None,
    chain_input: Callable[[str], Any] | None = None,
    input_key: str | None = None,
    output_key: str | None = None,
    documents_key: str | None = None,
    run_once: Sequence[str] = (),
    retriever: BaseRetriever | None = None,
    **options: Unpack[PipelineOptions],
) -> WrappedChain:
    """Wrap an existing LangChain chain or LangGraph graph so each request runs the six traced,
    verified stages.

    The caller's input is passed to the app unchanged. ``input_key`` names the field holding
    the question (default: ``question``, ``input``, ``query``, or a string input);
    ``output_key`` the field holding the answer (default: ``answer``, ``output``, ``result``, or
    a string or ``AIMessage`` output); ``documents_key`` the field of the output holding the
    documents the app used (default: ``context``, ``source_documents``). ``run_once`` names
    graph nodes that must run once per request, not once per sample. ``retriever`` is the
    retriever the app uses inside its nodes, called once in the retrieve stage for scored
    materials. ``chain_input`` turns the question into the app's input instead. The options it
    shares with ``RAGPipeline`` are ``tracerag.pipeline.PipelineOptions``.
    """
    check_options("wrap", options, PipelineOptions.__optional_keys__)
    if not isinstance(chain, Runnable):
        raise ConfigurationError(
            f"wrap() needs a LangChain Runnable, got {type(chain).__name__}"
        )
    info = inspect_chain(chain)
    if retriever is not None and retriever not in info.retrievers:
        info.retrievers.append(retriever)
    temperature = info.temperature
    settings = build_settings(
        retriever=None,
        llm=None,
        prompt_version=prompt_version or info.prompt_version,
        model_version=model_version or info.model_version,
        temperature=temperature if temperature is not None else 0.7,
        plan_mode="inline",
        **options,
    )
    if temperature == 0.0 and settings.n_samples > 1:
        logger.warning("tracerag wrap: %s", TEMPERATURE_ZERO_WARNING)
    io = ChainIO(
        input_key=input_key,
        output_key=output_key,
        documents_key=documents_key,
        app=None if input_key else chain,
    )
    return WrappedChain(
        chain, settings=settings, info=info, chain_input=chain_input, io=io, run_once=run_once
    )


__all__ = ["ChainInfo", "ChainSource", "WrappedChain", "inspect_chain", "wrap"]
