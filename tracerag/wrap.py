"""wrap(app): the six traced stages around an existing LangChain chain or LangGraph graph.

The app is left unchanged and is inspected once: its prompt templates give the prompt version
(a stable hash of their text), its chat model gives the model version and temperature, its
retriever is found so the retrieve stage can call it once. The caller's input is passed to the
app as it is; the question, the answer and the documents are found in the app's input and output
by ``tracerag.chain_io`` (``input_key=``, ``output_key=``, ``documents_key=``). Each request runs:

- register: versions from the arguments or the inspection; those still unknown (prompt and
  model called inside graph nodes) are learned from this request's runs, and the request is
  refused if the runs do not show them either;
- retrieve: the app's retriever (or ``retriever=``), called once with relevance scores where it
  can give them; an app that retrieves only inside its runs is recorded after them;
- sample: the app run N times concurrently and independently (``tracerag.graph_runs``);
  ``tracerag.chain_capture`` records per run the documents it retrieved, the documents its output
  carries, its model calls and its prompt templates; documents a run retrieved that the retrieve
  stage did not are added to the materials, so what was in a prompt can be cited; deterministic
  errors (``tracerag.chain_errors``) are not retried;
- plan: a foreign app writes no plan, so this stage records each sample's *implied* plan —
  the materials it actually cited and the quantities it states — and how far they agree;
- verify and assemble: as in RAGPipeline. Citations may be material ids (``[policy-7]``) or
  1-based positions in the documents the run put in its prompt (``[1]``).

If the model runs at temperature 0 the samples cannot disagree: a warning is logged and put on
the span and the Response, and self-consistency is reported as uninformative.
"""

from __future__ import annotations

import asyncio
import contextvars
import logging
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

from langchain_core.documents import Document
from langchain_core.language_models import BaseLanguageModel
from langchain_core.prompts import BasePromptTemplate
from langchain_core.retrievers import BaseRetriever
from langchain_core.runnables import Runnable, RunnableConfig
from opentelemetry.trace import INVALID_SPAN, Span, TracerProvider

from tracerag import metrics, semconv
from tracerag.chain_capture import (
    RunCapture,
    learned_versions,
    missing_version_error,
    model_call_attributes,
    prompt_text,
)
from tracerag.chain_errors import is_transient
from tracerag.chain_io import ChainIO, independent_copy, question_field
from tracerag.context import Plan, RequestContext, Sample
from tracerag.contract import Response
from tracerag.errors import MissingVersionError
from tracerag.graph_runs import Sampler, SampleRun
from tracerag.llm import Tries, model_name, record_retry, retry_call
from tracerag.pipeline import build_settings
from tracerag.prompts import fingerprint
from tracerag.routing import EscalationHandler, Thresholds
from tracerag.runner import Step, parse_input, run_steps, run_sync
from tracerag.settings import RetryPolicy, Settings
from tracerag.signals.claims import citation_ids, strip_citations
from tracerag.signals.confidence import Combiner
from tracerag.signals.consistency import Equivalence
from tracerag.signals.rules import Rule
from tracerag.signals.support import SupportBackend
from tracerag.stages.assemble import assemble
from tracerag.stages.plan import plan_from_samples
from tracerag.stages.register import register
from tracerag.stages.retrieve import fetch, record_materials, to_materials
from tracerag.stages.sample import (
    TEMPERATURE_ZERO_WARNING,
    finish_sample_span,
    record_samples,
)
from tracerag.stages.verify import resolver_for, verify
from tracerag.text.quantities import extract_quantities
from tracerag.tracing import capture

logger = logging.getLogger("tracerag.wrap")


@dataclass
class ChainInfo:
    """What inspecting a chain found: prompt texts, models, retrievers."""

    prompt_texts: list[str] = field(default_factory=list)
    models: list[BaseLanguageModel] = field(default_factory=list)
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


def inspect_chain(chain: Runnable) -> ChainInfo:
    """Find the prompts, models and retrievers inside a chain's graph."""
    info = ChainInfo()
    for node in chain.get_graph().nodes.values():
        data = node.data
        if isinstance(data, BasePromptTemplate):
            info.prompt_texts.append(prompt_text(data))
        elif isinstance(data, BaseLanguageModel):
            info.models.append(data)
        elif isinstance(data, BaseRetriever):
            info.retrievers.append(data)
    return info


# the caller's input for the app, for the request being run (set by WrappedChain.ainvoke)
_CHAIN_INPUT: contextvars.ContextVar[Any] = contextvars.ContextVar("tracerag_chain_input")


class WrappedChain(Runnable[Any, Response]):
    """An existing chain run through the six traced stages; returns a ``Response``."""

    def __init__(
        self,
        chain: Runnable,
        *,
        settings: Settings,
        info: ChainInfo,
        chain_input: Callable[[str], Any] | None = None,
        io: ChainIO | None = None,
        run_once: Sequence[str] = (),
    ) -> None:
        self.chain = chain
        self.settings = settings
        self.info = info
        self.chain_input = chain_input
        self.io = io or ChainIO()
        self.sampler = Sampler(chain, run_once)
        steps = [
            Step("register", self._register),
            Step("retrieve", self._retrieve),
            Step("sample", self._sample),
            Step("plan", self._plan),
            Step("verify", verify),
            Step("assemble", assemble),
        ]
        if settings.tier == "low":
            steps[3] = Step("plan", None, "tier low: no plan")
            steps[4] = Step("verify", None, "tier low: no verification")
        self.steps = steps

    @property
    def escalation(self) -> EscalationHandler:
        return self.settings.escalation

    async def ainvoke(
        self, input: Any, config: RunnableConfig | None = None, **kwargs: Any
    ) -> Response:
        request = self.io.request(input)
        ctx = parse_input(
            {"question": request.question, **request.fields},
            max_chars=self.settings.max_question_chars,
        )
        chain_input = (
            self.chain_input(ctx.question) if self.chain_input else request.chain_input
        )
        token = _CHAIN_INPUT.set(chain_input)
        try:
            return await run_steps(ctx, self.settings, self.steps, config, mode="wrap")
        finally:
            _CHAIN_INPUT.reset(token)

    def invoke(self, input: Any, config: RunnableConfig | None = None, **kwargs: Any) -> Response:
        return run_sync(lambda: self.ainvoke(input, config, **kwargs))

    @property
    def InputType(self) -> Any:
        return str | dict

    @property
    def OutputType(self) -> type[Response]:
        return Response

    async def _register(
        self, ctx: RequestContext, settings: Settings, span: Span, config: Any = None
    ) -> RequestContext:
        ctx.params["positional"] = True  # ``[1]`` may cite the run's first document
        try:
            ctx = await register(ctx, settings, span, config)
        except MissingVersionError:
            # versions neither given nor found in the chain: learned from this request's runs
            ctx.params["versions_from_runs"] = [
                name for name in ("prompt", "model") if not getattr(ctx.versions, name)
            ]
            span.set_attribute(semconv.VERSION_FROM_RUNS, ctx.params["versions_from_runs"])
        temperature = self.info.temperature
        if temperature is not None:
            ctx.params["temperature"] = temperature
            span.set_attribute(semconv.TEMPERATURE, temperature)
        return ctx

    async def _retrieve(
        self, ctx: RequestContext, settings: Settings, span: Span, config: Any = None
    ) -> RequestContext:
        if not self.info.retrievers:
            # the app retrieves inside its own runs (graph nodes, functions): recorded after them
            ctx.retrieval = {"source": "runs", "note": RUNS_NOTE}
            span.set_attribute(semconv.RETRIEVAL_SOURCE, "runs")
            return ctx
        pairs: list[tuple[Document, float | None]] = []
        for retriever in self.info.retrievers:
            try:
                pairs.extend(await fetch(retriever, ctx.question, config))
            except Exception as exc:  # the chain's own runs will retrieve again
                ctx.record_error("retrieve", exc)
                span.record_exception(exc)
        ctx.materials = to_materials(pairs)
        record_materials(ctx, span)
        span.set_attribute(semconv.RETRIEVAL_SOURCE, "retriever")
        return ctx

    async def _sample(
        self, ctx: RequestContext, settings: Settings, span: Span, config: Any = None
    ) -> RequestContext:
        n = settings.samples_for_tier()
        tracer = settings.tracer
        captures = [RunCapture() for _ in range(n)]
        run_documents: list[list[Document]] = [[] for _ in range(n)]
        chain_input = _CHAIN_INPUT.get(None)
        if chain_input is None:  # stages run without ainvoke (the server): from the question
            chain_input = (
                self.chain_input(ctx.question)
                if self.chain_input
                else self.io.string_input(ctx.question)
            )
        runs: list[SampleRun] = await self.sampler.prepare(config, ctx.request_id, n)

        async def one(index: int) -> Sample:
            result = Sample(index=index)
            capture_run = captures[index]
            with tracer.start_as_current_span(semconv.SPAN_SAMPLE_ONE) as child:
                on_retry = record_retry(ctx, child, "sample", settings.meter_provider, sample=index)

                started = time.perf_counter()
                tries = Tries()

                async def once() -> Any:
                    capture_run.reset()
                    return await runs[index].ainvoke(independent_copy(chain_input), capture_run)

                try:
                    output = await retry_call(
                        once, settings.retry, on_retry=on_retry, retry_on=is_transient, tries=tries
                    )
                    run_documents[index] = self.io.documents(output) or capture_run.documents
                    result.raw = self.io.answer(output)
                    result.answer = result.raw.strip()
                    if not result.answer:
                        result.error = "empty answer"
                except Exception as exc:
                    result.error = f"{type(exc).__name__}: {exc}"
                    ctx.record_error("sample", exc, sample=index, final=True)
                    metrics.record_model_error(
                        "sample", exc, meter_provider=settings.meter_provider
                    )
                    child.record_exception(exc)
                result.attempts = tries.count
                result.latency_s = round(time.perf_counter() - started, 6)
                result.input_tokens = capture_run.token_usage.get("input_tokens")
                result.output_tokens = capture_run.token_usage.get("output_tokens")
                _model_attrs(child, capture_run, self.info)
                child.set_attributes(
                    model_call_attributes(
                        capture_run.last_call,
                        settings.prompt_version
                        or capture_run.prompt_version
                        or self.info.prompt_version,
                        capture_run.last_prompt_text,
                    )
                )
                if result.raw is not None:
                    output_value = capture(result.raw)
                    if output_value is not None:
                        child.set_attribute(semconv.OI_OUTPUT_VALUE, output_value)
                finish_sample_span(child, ctx, result)
            return result

        try:
            ctx.samples = list(await asyncio.gather(*(one(i) for i in range(n))))
        finally:
            await self.sampler.cleanup(runs)
        self._merge_run_materials(ctx, captures, run_documents, span)
        self._learn_versions(ctx, captures, span)
        temperatures = {c.temperature for c in captures if c.temperature is not None}
        temperature = (
            temperatures.pop() if len(temperatures) == 1 else ctx.params.get("temperature")
        )
        if temperature is not None:
            ctx.params["temperature"] = temperature
        if temperature == 0.0 and n > 1:
            ctx.params["temperature_zero"] = True
            logger.warning("tracerag wrap: %s", TEMPERATURE_ZERO_WARNING)
        record_samples(ctx, span, float(temperature if temperature is not None else -1.0))
        return ctx

    def _learn_versions(
        self, ctx: RequestContext, captures: list[RunCapture], span: Span
    ) -> None:
        """Versions not given nor found in the chain, from what its runs called; else refused."""
        pending = ctx.params.get("versions_from_runs")
        if not pending:
            return
        prompt, model = learned_versions(captures)
        ctx.versions.prompt = ctx.versions.prompt or prompt
        ctx.versions.model = ctx.versions.model or model
        if ctx.versions.prompt:
            span.set_attribute(semconv.VERSION_PROMPT, ctx.versions.prompt)
        if ctx.versions.model:
            span.set_attribute(semconv.VERSION_MODEL, ctx.versions.model)
        missing = [name for name in ("prompt", "model") if not getattr(ctx.versions, name)]
        if missing:
            raise missing_version_error(ctx.request_id, missing)

    def _merge_run_materials(
        self,
        ctx: RequestContext,
        captures: list[RunCapture],
        run_documents: list[list[Document]],
        span: Span,
    ) -> None:
        known = {m.id: m for m in ctx.materials}
        added: list[str] = []
        for sample, capture_run, used in zip(ctx.samples, captures, run_documents, strict=True):
            retrieved = to_materials([(d, None) for d in [*capture_run.documents, *used]])
            for m in retrieved:
                if m.id not in known:
                    m.rank = len(ctx.materials) + 1
                    ctx.materials.append(m)
                    known[m.id] = m
                    added.append(m.id)
            # positions ``[1]`` count in the documents the run put in its prompt
            sample.material_order = [m.id for m in to_materials([(d, None) for d in used])]
        source = ctx.retrieval.get("source") or "retriever"
        if source == "runs":  # the documents appear in the trace here, once
            record_materials(ctx, span)
        else:
            if added:  # counts and scores over every material, on the record
                record_materials(ctx, INVALID_SPAN)
            span.set_attribute(semconv.RETRIEVAL_COUNT, len(ctx.materials))
            span.set_attribute(semconv.RETRIEVAL_MATERIAL_IDS, [m.id for m in ctx.materials])
        ctx.retrieval["source"] = source if not added or source == "runs" else "retriever+runs"
        if added:
            ctx.retrieval["added_from_runs"] = added
        span.set_attribute(semconv.RETRIEVAL_SOURCE, ctx.retrieval["source"])

    async def _plan(
        self, ctx: RequestContext, settings: Settings, span: Span, config: Any = None
    ) -> RequestContext:
        for s in ctx.samples:
            if not s.ok:
                continue
            resolve = resolver_for(ctx, s)
            ids = [resolve(i) or i for i in citation_ids(s.answer or "")]
            facts = [q.raw for q in extract_quantities(strip_citations(s.answer or ""))]
            s.plan = Plan(material_ids=list(dict.fromkeys(ids)), key_facts=facts, mode="wrap")
        return await plan_from_samples(ctx, settings, span, config)


RUNS_NOTE = "no retriever found in the app; materials are what its runs retrieved"


def _model_attrs(span: Span, capture_run: RunCapture, info: ChainInfo) -> None:
    import json

    name = capture_run.model_name or info.model_version
    span.set_attribute(semconv.OI_SPAN_KIND, semconv.OI_KIND_LLM)
    span.set_attribute(semconv.GENAI_OPERATION_NAME, semconv.GENAI_OPERATION_CHAT)
    if name:
        span.set_attribute(semconv.OI_LLM_MODEL_NAME, name)
        span.set_attribute(semconv.GENAI_REQUEST_MODEL, name)
    provider = capture_run.invocation_params.get(
        "ls_provider"
    ) or capture_run.invocation_params.get("_type")
    if provider:
        span.set_attribute(semconv.GENAI_PROVIDER_NAME, str(provider))
    if capture_run.temperature is not None:
        span.set_attribute(semconv.GENAI_REQUEST_TEMPERATURE, capture_run.temperature)
    if capture_run.invocation_params:
        span.set_attribute(
            semconv.OI_LLM_INVOCATION_PARAMETERS,
            json.dumps(capture_run.invocation_params, default=str),
        )


def wrap(
    chain: Runnable,
    *,
    prompt_version: str | None = None,
    model_version: str | None = None,
    n_samples: int = 5,
    thresholds: Thresholds | tuple[float, float] | None = None,
    rules: Sequence[Rule] = (),
    escalation: EscalationHandler | None = None,
    tier: str = "high",
    support_backend: str | SupportBackend = "lexical",
    equivalence: Equivalence | None = None,
    combiner: Combiner | None = None,
    retry: RetryPolicy | None = None,
    chain_input: Callable[[str], Any] | None = None,
    input_key: str | None = None,
    output_key: str | None = None,
    documents_key: str | None = None,
    run_once: Sequence[str] = (),
    retriever: BaseRetriever | None = None,
    tracer_provider: TracerProvider | None = None,
    meter_provider: Any = None,
    audit: Any = "auto",
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
    materials. ``chain_input`` turns the question into the app's input instead.
    """
    if not isinstance(chain, Runnable):
        raise TypeError(f"wrap() needs a LangChain Runnable, got {type(chain).__name__}")
    info = inspect_chain(chain)
    if retriever is not None and retriever not in info.retrievers:
        info.retrievers.append(retriever)
    temperature = info.temperature
    settings = build_settings(
        retriever=None,
        llm=None,
        tracer_provider=tracer_provider,
        prompt_version=prompt_version or info.prompt_version,
        model_version=model_version or info.model_version,
        n_samples=n_samples,
        temperature=temperature if temperature is not None else 0.7,
        plan_mode="inline",
        tier=tier,
        thresholds=thresholds,
        rules=rules,
        escalation=escalation,
        support_backend=support_backend,
        equivalence=equivalence,
        combiner=combiner,
        retry=retry,
        audit=audit,
        meter_provider=meter_provider,
    )
    if temperature == 0.0 and n_samples > 1:
        logger.warning("tracerag wrap: %s", TEMPERATURE_ZERO_WARNING)
    io = ChainIO(
        input_key=input_key,
        output_key=output_key,
        documents_key=documents_key,
        string_key=None if input_key else question_field(chain),
    )
    return WrappedChain(
        chain, settings=settings, info=info, chain_input=chain_input, io=io, run_once=run_once
    )


__all__ = ["ChainInfo", "RunCapture", "WrappedChain", "inspect_chain", "wrap"]
