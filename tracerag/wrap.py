"""wrap(chain): the six traced stages around an existing LCEL RAG chain, left unchanged.

The chain is inspected once: its prompt templates give the prompt version (a stable hash of their
text), its chat model gives the model version and temperature, its retriever is found so the
retrieve stage can call it once. Each request then runs:

- register: versions from the arguments or from the inspection; refused if either is unknown;
- retrieve: the chain's retriever, called once (with relevance scores where it can give them);
- sample: the chain itself, run N times concurrently; LangChain callbacks capture, per run, the
  documents it retrieved (``on_retriever_end``) and the model's invocation parameters
  (``on_chat_model_start`` / ``on_llm_start``); documents a run retrieved that the retrieve stage
  did not are added to the materials, so what was in a prompt can be cited;
- plan: a foreign chain writes no plan, so this stage records each sample's *implied* plan —
  the materials it actually cited and the quantities it states — and how far they agree;
- verify and assemble: as in RAGPipeline. Citations may be material ids (``[policy-7]``) or
  1-based positions in the run's retrieved order (``[1]``).

If the model runs at temperature 0 the samples cannot disagree: a warning is logged and put on
the span and the Response, and self-consistency is reported as uninformative.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any
from uuid import UUID

from langchain_core.callbacks import AsyncCallbackHandler
from langchain_core.documents import Document
from langchain_core.language_models import BaseLanguageModel
from langchain_core.messages import AIMessage, BaseMessage
from langchain_core.prompts import BasePromptTemplate
from langchain_core.retrievers import BaseRetriever
from langchain_core.runnables import Runnable, RunnableConfig
from opentelemetry.trace import Span, TracerProvider

from tracerag import metrics, semconv
from tracerag.context import Plan, RequestContext, Sample
from tracerag.contract import Response
from tracerag.llm import Tries, model_name, record_retry, retry_call, text_of
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
from tracerag.tracing import MODEL_SPAN_KIND, get_tracer

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


def prompt_text(prompt: BasePromptTemplate) -> str:
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


class RunCapture(AsyncCallbackHandler):
    """Collects, for one chain run, the documents retrieved and the model's parameters."""

    def __init__(self) -> None:
        self.documents: list[Document] = []
        self.invocation_params: dict[str, Any] = {}
        self.model_calls = 0
        self.token_usage: dict[str, int] = {}

    async def on_retriever_end(
        self, documents: Sequence[Document], *, run_id: UUID, **kwargs: Any
    ) -> None:
        self.documents.extend(documents)

    async def on_chat_model_start(
        self, serialized: dict[str, Any], messages: list[list[BaseMessage]], **kwargs: Any
    ) -> None:
        self._params(kwargs)

    async def on_llm_start(
        self, serialized: dict[str, Any], prompts: list[str], **kwargs: Any
    ) -> None:
        self._params(kwargs)

    async def on_llm_end(self, response: Any, **kwargs: Any) -> None:
        for generations in getattr(response, "generations", []) or []:
            for generation in generations:
                usage = getattr(getattr(generation, "message", None), "usage_metadata", None)
                for key in ("input_tokens", "output_tokens"):
                    if usage and usage.get(key) is not None:
                        self.token_usage[key] = self.token_usage.get(key, 0) + int(usage[key])

    def _params(self, kwargs: dict[str, Any]) -> None:
        self.model_calls += 1
        params = kwargs.get("invocation_params") or {}
        metadata = kwargs.get("metadata") or {}
        merged = {**{k: v for k, v in metadata.items() if k.startswith("ls_")}, **params}
        self.invocation_params.update(merged)

    @property
    def model_name(self) -> str | None:
        p = self.invocation_params
        value = p.get("model_name") or p.get("model") or p.get("ls_model_name")
        return str(value) if value else None

    @property
    def temperature(self) -> float | None:
        p = self.invocation_params
        value = p.get("temperature", p.get("ls_temperature"))
        return float(value) if isinstance(value, (int, float)) else None


def output_text(output: Any) -> str:
    """The answer text of a chain's output (str, message, or dict with an answer field)."""
    if isinstance(output, str):
        return output
    if isinstance(output, AIMessage):
        return text_of(output)
    if isinstance(output, dict):
        for key in ("answer", "output", "result", "text"):
            if isinstance(output.get(key), str):
                return output[key]
    raise TypeError(f"cannot read an answer from chain output of type {type(output).__name__}")


class WrappedChain(Runnable[Any, Response]):
    """An existing chain run through the six traced stages; returns a ``Response``."""

    def __init__(
        self,
        chain: Runnable,
        *,
        settings: Settings,
        info: ChainInfo,
        chain_input: Callable[[str], Any] | None = None,
    ) -> None:
        self.chain = chain
        self.settings = settings
        self.info = info
        self.chain_input = chain_input or (lambda question: question)
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
        ctx = parse_input(input, max_chars=self.settings.max_question_chars)
        ctx.params["positional"] = True
        return await run_steps(ctx, self.settings, self.steps, config, mode="wrap")

    def invoke(self, input: Any, config: RunnableConfig | None = None, **kwargs: Any) -> Response:
        return run_sync(lambda: self.ainvoke(input, config, **kwargs))

    @property
    def OutputType(self) -> type[Response]:
        return Response

    async def _register(
        self, ctx: RequestContext, settings: Settings, span: Span, config: Any = None
    ) -> RequestContext:
        ctx = await register(ctx, settings, span, config)
        temperature = self.info.temperature
        if temperature is not None:
            ctx.params["temperature"] = temperature
            span.set_attribute(semconv.TEMPERATURE, temperature)
        return ctx

    async def _retrieve(
        self, ctx: RequestContext, settings: Settings, span: Span, config: Any = None
    ) -> RequestContext:
        pairs: list[tuple[Document, float | None]] = []
        for retriever in self.info.retrievers:
            try:
                pairs.extend(await fetch(retriever, ctx.question, config))
            except Exception as exc:  # the chain's own runs will retrieve again
                ctx.record_error("retrieve", exc)
                span.record_exception(exc)
        if not self.info.retrievers:
            ctx.retrieval["note"] = "no retriever found in the chain; materials come from its runs"
        ctx.materials = to_materials(pairs)
        record_materials(ctx, span)
        return ctx

    async def _sample(
        self, ctx: RequestContext, settings: Settings, span: Span, config: Any = None
    ) -> RequestContext:
        n = settings.samples_for_tier()
        tracer = get_tracer(settings.tracer_provider)
        captures = [RunCapture() for _ in range(n)]

        async def one(index: int) -> Sample:
            result = Sample(index=index)
            capture_run = captures[index]
            with tracer.start_as_current_span(
                semconv.SPAN_SAMPLE_ONE, kind=MODEL_SPAN_KIND
            ) as child:
                on_retry = record_retry(ctx, child, "sample", settings.meter_provider, sample=index)

                started = time.perf_counter()
                run_config: RunnableConfig = {**(config or {}), "callbacks": [capture_run]}
                tries = Tries()

                async def once() -> Any:
                    capture_run.documents.clear()
                    return await self.chain.ainvoke(
                        self.chain_input(ctx.question), config=run_config
                    )

                try:
                    output = await retry_call(once, settings.retry, on_retry=on_retry, tries=tries)
                    result.raw = output_text(output)
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
                finish_sample_span(child, ctx, result)
            return result

        ctx.samples = list(await asyncio.gather(*(one(i) for i in range(n))))
        self._merge_run_materials(ctx, captures, span)
        temperatures = {c.temperature for c in captures if c.temperature is not None}
        temperature = (
            temperatures.pop() if len(temperatures) == 1 else ctx.params.get("temperature")
        )
        if temperature is not None:
            ctx.params["temperature"] = temperature
        if temperature == 0.0 and n > 1:
            ctx.params["temperature_zero"] = True
            logger.warning("tracerag wrap: %s", TEMPERATURE_ZERO_WARNING)
        record_samples(ctx, span, temperature)
        return ctx

    def _merge_run_materials(
        self, ctx: RequestContext, captures: list[RunCapture], span: Span
    ) -> None:
        known = {m.id: m for m in ctx.materials}
        added: list[str] = []
        for sample, capture_run in zip(ctx.samples, captures, strict=True):
            run_materials = to_materials([(d, None) for d in capture_run.documents])
            order: list[str] = []
            for m in run_materials:
                if m.id not in known:
                    m.rank = len(ctx.materials) + 1
                    ctx.materials.append(m)
                    known[m.id] = m
                    added.append(m.id)
                order.append(m.id)
            sample.material_order = order
        if added:
            ctx.retrieval["added_from_runs"] = added
            span.set_attribute(semconv.RETRIEVAL_MATERIAL_IDS, [m.id for m in ctx.materials])

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
    tracer_provider: TracerProvider | None = None,
    meter_provider: Any = None,
    audit: Any = "auto",
) -> WrappedChain:
    """Wrap an existing LCEL RAG chain so each request runs the six traced, verified stages.

    ``chain_input`` turns the question into the chain's input (default: the question string).
    """
    if not isinstance(chain, Runnable):
        raise TypeError(f"wrap() needs a LangChain Runnable, got {type(chain).__name__}")
    info = inspect_chain(chain)
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
    return WrappedChain(chain, settings=settings, info=info, chain_input=chain_input)


__all__ = ["ChainInfo", "RunCapture", "WrappedChain", "inspect_chain", "wrap"]
