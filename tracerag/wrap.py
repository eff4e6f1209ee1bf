"""wrap(chain): the six traced stages around an existing LCEL RAG chain, left unchanged.

The chain is inspected once: its prompt templates give the prompt version (a stable hash of their
text), its chat model gives the model version and temperature, its retriever is found so the
retrieve stage can call it once. Each request then runs:

- register: versions from the arguments or from the inspection; refused if either is unknown;
- retrieve: the chain's retriever, called once (with relevance scores where it can give them);
- sample: the chain itself, run N times concurrently; LangChain callbacks capture, per run, the
  documents it retrieved (``on_retriever_end``) and the model's invocation parameters
  (``on_chat_model_start`` / ``on_llm_start``); documents a run retrieved that the retrieve stage
  did not join the materials after the retrieved ones, so what was in a prompt can be cited.
  A foreign chain writes no plan, so each sample carries its *implied* plan — the materials it
  actually cited and the quantities it states;
- plan, verify and assemble: the stage table of RAGPipeline with ``plan="inline"`` (the plan
  stage records how far the samples' plans agree). Citations may be material ids
  (``[policy-7]``) or 1-based positions in the run's retrieved order (``[1]``).

Only retrieval and sampling are wrap's own (``ChainSource``); every stage is the shared one.

If the model runs at temperature 0 the samples cannot disagree: a warning is logged and put on
the span and the Response, and self-consistency is reported as uninformative.
"""

from __future__ import annotations

import dataclasses
import functools
import json
import logging
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any
from uuid import UUID

from langchain_core.callbacks import AsyncCallbackHandler
from langchain_core.documents import Document
from langchain_core.language_models import BaseLanguageModel
from langchain_core.messages import AIMessage, BaseMessage
from langchain_core.prompts import BasePromptTemplate
from langchain_core.retrievers import BaseRetriever
from langchain_core.runnables import Runnable, RunnableConfig
from opentelemetry.trace import Span, TracerProvider

from tracerag import semconv
from tracerag import usage as usage_meter
from tracerag.errors import ConfigurationError, RetrieverTimeoutError
from tracerag.llm import OnRetry, Tries, clean_text, model_name, retry_call, text_of, within
from tracerag.pipeline import build_settings
from tracerag.prompts import fingerprint
from tracerag.runner import StagedRunnable
from tracerag.signals.attribution import ShapeThresholds
from tracerag.stages.plan import implied_plan
from tracerag.stages.retrieve import fetch, record_materials, to_materials
from tracerag.stages.sample import (
    TEMPERATURE_ZERO_WARNING,
    Draw,
    draw_samples,
    record_samples,
    samples_wanted,
)
from tracerag.state import ErrorLog, RequestState, Retrieval, SampleSet

if TYPE_CHECKING:
    from tracerag.routing import EscalationHandler, Thresholds
    from tracerag.settings import RetryPolicy, Settings
    from tracerag.signals.confidence import Combiner
    from tracerag.signals.consistency import Equivalence
    from tracerag.signals.rules import Rule
    from tracerag.signals.support import SupportBackend
    from tracerag.signals.types import Material

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
        self.calls: list[usage_meter.CallUsage] = []
        self.prompts: dict[Any, Any] = {}

    async def on_retriever_end(
        self, documents: Sequence[Document], *, run_id: UUID, **kwargs: Any
    ) -> None:
        self.documents.extend(documents)

    async def on_chat_model_start(
        self, serialized: dict[str, Any], messages: list[list[BaseMessage]], **kwargs: Any
    ) -> None:
        self._params(kwargs)
        self.prompts[kwargs.get("run_id")] = [m for batch in messages for m in batch]

    async def on_llm_start(
        self, serialized: dict[str, Any], prompts: list[str], **kwargs: Any
    ) -> None:
        self._params(kwargs)
        self.prompts[kwargs.get("run_id")] = "\n".join(prompts)

    async def on_llm_end(self, response: Any, **kwargs: Any) -> None:
        for generations in getattr(response, "generations", []) or []:
            for generation in generations:
                usage = getattr(getattr(generation, "message", None), "usage_metadata", None)
                for key in ("input_tokens", "output_tokens"):
                    if usage and usage.get(key) is not None:
                        self.token_usage[key] = self.token_usage.get(key, 0) + int(usage[key])
                self.calls.append(
                    usage_meter.note(
                        usage_meter.usage_of(
                            getattr(generation, "message", None) or getattr(generation, "text", ""),
                            stage=usage_meter.STAGE_SAMPLE,
                            model=self.model_name,
                            prompt=self.prompts.pop(kwargs.get("run_id"), None),
                            llm_output=getattr(response, "llm_output", None),
                        )
                    )
                )

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


class ChainSource:
    """wrap()'s source: the chain's retrievers, and samples from whole runs of the chain."""

    mode = "wrap"

    def __init__(
        self, chain: Runnable, info: ChainInfo, chain_input: Callable[[str], Any] | None = None
    ) -> None:
        self.chain = chain
        self.info = info
        self.chain_input = chain_input or (lambda question: question)

    async def retrieve(
        self, state: RequestState, settings: Settings, span: Span, config: Any = None
    ) -> Retrieval:
        """The chain's retrievers, each called once; a failing one is kept as an error."""
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
            except Exception as exc:  # the chain's own runs will retrieve again
                errors.record_error("retrieve", exc)
                span.record_exception(exc)
        note = None if self.info.retrievers else NO_RETRIEVER_NOTE
        retrieval = Retrieval.of(
            to_materials(pairs), note=note, errors=errors.freeze(), shape=settings.retrieval_shape
        )
        record_materials(retrieval, span)
        return retrieval

    async def sample(
        self, state: RequestState, settings: Settings, span: Span, config: Any = None
    ) -> SampleSet:
        """The chain run N times concurrently; each sample with its run's documents and plan."""
        n = samples_wanted(state, settings)
        captures = [RunCapture() for _ in range(n)]
        question = self.chain_input(state.question)

        async def generate(index: int, on_retry: OnRetry, tries: Tries) -> Draw:
            capture_run = captures[index]
            run_config: RunnableConfig = {**(config or {}), "callbacks": [capture_run]}

            async def once() -> Any:
                capture_run.documents.clear()
                return await self.chain.ainvoke(question, config=run_config)

            output = await retry_call(once, settings.retry, on_retry=on_retry, tries=tries)
            return Draw(
                clean_text(output_text(output), settings.retry.max_output_chars),
                input_tokens=capture_run.token_usage.get("input_tokens"),
                output_tokens=capture_run.token_usage.get("output_tokens"),
            )

        def describe(index: int, draw: Draw | None) -> dict[str, Any]:
            attrs = _model_attrs(captures[index], self.info)
            attrs.update(usage_meter.span_attributes(captures[index].calls))
            return attrs  # the output message is set from the sample itself

        errors = ErrorLog()
        drawn = await draw_samples(state, settings, n, generate, describe, errors)
        extra, orders = _run_materials(state.materials, captures)
        materials = state.materials + extra
        samples = tuple(
            implied_plan(dataclasses.replace(s, material_order=order), materials)
            for s, order in zip(drawn, orders, strict=True)
        )
        if extra:
            span.set_attribute(semconv.RETRIEVAL_MATERIAL_IDS, [m.id for m in materials])
        temperatures = {c.temperature for c in captures if c.temperature is not None}
        # the runs' own temperature, else the chain's; None: the model has none tracerag knows
        temperature = temperatures.pop() if len(temperatures) == 1 else self.info.temperature
        zero = temperature == 0.0 and n > 1
        if zero:
            logger.warning("tracerag wrap: %s", TEMPERATURE_ZERO_WARNING)
        warnings = record_samples(samples, span, temperature)
        return SampleSet(
            samples=samples,
            temperature=temperature,
            temperature_zero=settings.temperature == 0.0 or zero,
            positional=True,
            extra_materials=extra,
            warnings=warnings,
            errors=errors.freeze(),
        )


NO_RETRIEVER_NOTE = "no retriever found in the chain; materials come from its runs"


def _run_materials(
    known_materials: tuple[Material, ...], captures: list[RunCapture]
) -> tuple[tuple[Material, ...], list[tuple[str, ...]]]:
    """Materials the runs retrieved beyond the known ones, and each run's retrieved order."""
    known = {m.id for m in known_materials}
    extra: list[Material] = []
    orders: list[tuple[str, ...]] = []
    for capture_run in captures:
        order: list[str] = []
        for m in to_materials([(d, None) for d in capture_run.documents]):
            if m.id not in known:
                extra.append(dataclasses.replace(m, rank=len(known_materials) + len(extra) + 1))
                known.add(m.id)
            order.append(m.id)
        orders.append(tuple(order))
    return tuple(extra), orders


class WrappedChain(StagedRunnable):
    """An existing chain run through the six traced stages; returns a ``Response``."""

    def __init__(
        self,
        chain: Runnable,
        *,
        settings: Settings,
        info: ChainInfo,
        chain_input: Callable[[str], Any] | None = None,
    ) -> None:
        super().__init__(settings, ChainSource(chain, info, chain_input))
        self.chain = chain
        self.info = info

    @property
    def escalation(self) -> EscalationHandler:
        return self.settings.escalation


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
    review_clustered_retrieval: bool = False,
    relevance_floor: float | None = None,
    retrieval_shape: ShapeThresholds | None = None,
    prices: Mapping[str, Any] | str | None = None,
) -> WrappedChain:
    """Wrap an existing LCEL RAG chain so each request runs the six traced, verified stages.

    ``chain_input`` turns the question into the chain's input (default: the question string).
    ``prices``: a price table per model (see ``tracerag.usage``) for the cost of each request.
    """
    if not isinstance(chain, Runnable):
        raise ConfigurationError(
            f"wrap() needs a LangChain Runnable, got {type(chain).__name__}"
        )
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
        review_clustered_retrieval=review_clustered_retrieval,
        relevance_floor=relevance_floor,
        retrieval_shape=retrieval_shape or ShapeThresholds(),
        prices=usage_meter.load_prices(prices),
    )
    if temperature == 0.0 and n_samples > 1:
        logger.warning("tracerag wrap: %s", TEMPERATURE_ZERO_WARNING)
    return WrappedChain(chain, settings=settings, info=info, chain_input=chain_input)


__all__ = ["ChainInfo", "ChainSource", "RunCapture", "WrappedChain", "inspect_chain", "wrap"]
