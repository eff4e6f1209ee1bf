"""Stage 4, sample×N: N answers drawn concurrently at the configured temperature.

Each sample is its own child span with its raw output. Transient model errors are retried
(bounded, exponential backoff); a sample that still fails is kept with its error, never dropped.
``draw_samples`` is that machinery for any way of producing one answer (a chat model here, a
whole chain under ``wrap()``); ``sample`` is the RAGPipeline's way: the chat model, prompted
with the materials (and the plan, when there is one).
"""

from __future__ import annotations

import asyncio
import dataclasses
import json
import threading
import time
import weakref
from collections.abc import Awaitable, Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, TypeVar, cast

from langchain_core.language_models import BaseChatModel
from langchain_core.messages import AIMessage, BaseMessage
from langchain_core.runnables import RunnableConfig
from opentelemetry.trace import Span, Status, StatusCode, Tracer

from tracerag import _semconv as semconv
from tracerag import _usage as usage
from tracerag._choices import PlanMode, Tier
from tracerag._declare import stamp
from tracerag._llm import (
    OnRetry,
    Tries,
    call_model,
    call_model_several,
    concurrency_of,
    generates_several,
    invocation_parameters,
    model_name,
    model_slots,
    provider_name,
    record_retry,
    text_of,
    token_usage,
    with_temperature,
)
from tracerag._settings import Settings
from tracerag._state import ErrorLog, RequestState, Sample, SampleSet
from tracerag.errors import ConfigurationError, OutputTooLongError, PlanError
from tracerag.prompts import TASK_ANSWER, TASK_PLAN_AND_ANSWER, prompt_messages
from tracerag.signals._types import Plan
from tracerag.stages._plan import parse_plan, split_inline
from tracerag.stages._stopping import Stopped, Verifier, draw_adaptive
from tracerag.telemetry import _instruments as metrics
from tracerag.telemetry._content_capture import capture
from tracerag.telemetry._providers import get_tracer
from tracerag.telemetry._spans import MODEL_SPAN_KIND

TEMPERATURE_ZERO_WARNING = (
    "the model samples at temperature 0, so samples cannot disagree: "
    "self-consistency is reported as uninformative"
)


def llm_span_attributes(llm: BaseChatModel, temperature: float | None) -> dict[str, Any]:
    """OpenInference and GenAI attributes describing the model of a sample span."""
    name = model_name(llm) or type(llm).__name__
    params = invocation_parameters(llm)
    if temperature is not None:
        params["temperature"] = temperature
    attrs: dict[str, Any] = {
        semconv.OI_SPAN_KIND: semconv.OI_KIND_LLM,
        semconv.OI_LLM_MODEL_NAME: name,
        semconv.OI_LLM_INVOCATION_PARAMETERS: json.dumps(params, default=str),
        semconv.GENAI_OPERATION_NAME: semconv.GENAI_OPERATION_CHAT,
        semconv.GENAI_PROVIDER_NAME: provider_name(llm),
        semconv.GENAI_REQUEST_MODEL: name,
    }
    if temperature is not None:
        attrs[semconv.GENAI_REQUEST_TEMPERATURE] = float(temperature)
    return attrs


_DESCRIBED: dict[tuple[int, float | None], tuple[weakref.ref[Any], dict[str, Any]]] = {}
_DESCRIBED_LOCK = threading.Lock()


def model_attributes_of(
    base: BaseChatModel, llm: BaseChatModel, temperature: float | None
) -> dict[str, Any]:
    """``llm_span_attributes(llm, temperature)`` for ``llm``, the pipeline's model ``base`` at
    that temperature: described on its first request, then reused (a fresh dict each time)."""
    key = (id(base), temperature)
    known = _DESCRIBED.get(key)
    if known is not None and known[0]() is base:
        return dict(known[1])
    attrs = llm_span_attributes(llm, temperature)

    def forget(_: object) -> None:
        with _DESCRIBED_LOCK:
            entry = _DESCRIBED.get(key)
            if entry is not None and entry[0]() is None:
                del _DESCRIBED[key]

    with _DESCRIBED_LOCK:
        _DESCRIBED[key] = (weakref.ref(base, forget), attrs)
    return dict(attrs)


def input_message_attributes(messages: list[BaseMessage]) -> dict[str, Any]:
    """OpenInference input messages, under the content-capture policy (computed once a request)."""
    attrs: dict[str, Any] = {}
    for i, message in enumerate(messages):
        attrs[semconv.oi_input_message(i, "role")] = message.type
        content = capture(str(message.content))
        if content is not None:
            attrs[semconv.oi_input_message(i, "content")] = content
    return attrs


def output_attributes(output: str | None) -> dict[str, Any]:
    """OpenInference output message of a sample, under the capture policy (the sample's text
    goes onto its span once, as the output message)."""
    if output is None:
        return {}
    attrs: dict[str, Any] = {semconv.oi_output_message(0, "role"): "assistant"}
    content = capture(output)
    if content is not None:
        attrs[semconv.oi_output_message(0, "content")] = content
    return attrs


def usage_attributes(sample: Sample) -> dict[str, Any]:
    """Token counts of a sample, where the model reported them (OpenInference and GenAI)."""
    attrs: dict[str, Any] = {}
    if sample.input_tokens is not None:
        attrs[semconv.OI_LLM_TOKEN_PROMPT] = sample.input_tokens
        attrs[semconv.GENAI_USAGE_INPUT_TOKENS] = sample.input_tokens
    if sample.output_tokens is not None:
        attrs[semconv.OI_LLM_TOKEN_COMPLETION] = sample.output_tokens
        attrs[semconv.GENAI_USAGE_OUTPUT_TOKENS] = sample.output_tokens
    if sample.input_tokens is not None and sample.output_tokens is not None:
        attrs[semconv.OI_LLM_TOKEN_TOTAL] = sample.input_tokens + sample.output_tokens
    return attrs


class NotDrawn(Exception):
    """A sample not drawn after all (say, the turn paused for a person before it could be): no
    model call failed, so it is no error of the request, no model error and no span error; the
    sample keeps the reason, prefixed ``not drawn:``."""


#: The prefix of a not-drawn sample's ``error``.
NOT_DRAWN = "not drawn: "


def finish_sample_span(
    span: Span, request_id: str, sample: Sample, extra: Mapping[str, Any] | None = None
) -> None:
    """All attributes of a finished sample span, set in one call."""
    if sample.error and not sample.error.startswith(NOT_DRAWN):
        span.set_status(Status(StatusCode.ERROR, sample.error))
    if not span.is_recording():
        return
    attrs: dict[str, Any] = dict(extra or {})
    attrs.update(
        {
            semconv.SPAN_NAME: semconv.SPAN_SAMPLE_ONE,
            semconv.REQUEST_ID: request_id,
            semconv.SAMPLE_INDEX: sample.index,
            semconv.SAMPLE_ATTEMPTS: sample.attempts,
            semconv.SAMPLE_OK: sample.ok,
        }
    )
    attrs.update(output_attributes(sample.raw))
    attrs.update(usage_attributes(sample))
    if sample.error:
        attrs[semconv.SAMPLE_ERROR] = sample.error
    span.set_attributes(attrs)
    # the GenAI conventions name a model call ``chat {gen_ai.request.model}``
    model = attrs.get(semconv.GENAI_REQUEST_MODEL)
    if model:
        span.update_name(semconv.chat_span_name(str(model)))


def record_samples(
    samples: tuple[Sample, ...],
    span: Span,
    temperature: float | None,
    stopped: Stopped | None = None,
    max_samples: int = 0,
    calls: int | None = None,
) -> tuple[str, ...]:
    """The sample stage's span attributes (``SampleSet.SIGNALS``) and the temperature-zero
    warning, if it applies (``temperature``: the one the samples were drawn at; None: the
    model has none that tracerag knows; ``stopped``, ``max_samples``, ``calls``: how adaptive
    sampling went, see ``adaptive_fields``)."""
    drawn = SampleSet(
        samples=samples,
        temperature=temperature,
        **adaptive_fields(stopped, max_samples, calls),  # type: ignore[arg-type]
    )
    stamp(span, drawn)
    if not drawn.drawn_at_zero:
        return ()
    span.add_event(semconv.EVENT_WARNING, {semconv.WARNING_MESSAGE: TEMPERATURE_ZERO_WARNING})
    return (TEMPERATURE_ZERO_WARNING,)


def adaptive_fields(
    stopped: Stopped | None, max_samples: int, calls: int | None
) -> dict[str, object]:
    """The ``SampleSet`` fields that say how adaptive sampling went (none without ``stopped``)."""
    if stopped is None:
        return {}
    return {
        "max_samples": max_samples,
        "rounds": stopped.rounds,
        "stop_reason": str(stopped.reason),
        "stop_risk": None if stopped.risk is None else round(stopped.risk, 4),
        "calls": calls,
        "min_samples": stopped.min_samples,
        "risk_bound": stopped.bound,
    }


@dataclass(frozen=True, slots=True)
class Draw:
    """What one way of answering produced for a sample: its raw text and what it reported."""

    raw: str
    answer: str | None = None  # default: the raw text, stripped
    plan: Plan | None = None
    input_tokens: int | None = None
    output_tokens: int | None = None
    #: what the call spent, as ``tracerag.usage`` counts it (for the sample span)
    spent: usage.CallUsage | None = None


#: Produce one sample's answer: ``(index, on_retry, tries) -> Draw``; raise when it fails.
Generate = Callable[[int, OnRetry, Tries], Awaitable[Draw]]
#: What ``draw_samples`` makes a Draw of, when ``finish`` is given.
R = TypeVar("R")
#: The sample span's own attributes: ``(index, draw or None when it failed) -> attributes``.
Describe = Callable[[int, "Draw | None"], Mapping[str, Any]]


async def draw_samples(
    state: RequestState,
    settings: Settings,
    n: int,
    generate: Callable[[int, OnRetry, Tries], Awaitable[R]],
    describe: Describe,
    errors: ErrorLog,
    finish: Callable[[R], Draw] | None = None,
    *,
    indices: Sequence[int] | None = None,
) -> tuple[Sample, ...]:
    """Draw ``n`` samples concurrently (those numbered ``indices``, default ``0..n-1``), each in
    its own child span; failures are kept.

    ``generate`` gives each sample's Draw (a ``Generate``), or, with ``finish``, what ``finish``
    makes the Draw of (what either raises fails the sample)."""
    tracer: Tracer = get_tracer(settings.tracer_provider)
    request_id = state.request_id

    async def one(index: int) -> Sample:
        with tracer.start_as_current_span(
            semconv.chat_span_name(None), kind=MODEL_SPAN_KIND
        ) as child:
            on_retry = record_retry(errors, child, "sample", settings.meter_provider, sample=index)
            started = time.perf_counter()
            tries = Tries()
            draw: Draw | None = None
            error: str | None = None
            kept: str | None = None  # what fits of an over-long output, for the record
            try:
                got = await generate(index, on_retry, tries)
                draw = finish(got) if finish is not None else cast(Draw, got)
            except NotDrawn as exc:  # nothing failed: the sample was never drawn
                error = f"{NOT_DRAWN}{exc}"
            except Exception as exc:
                error = f"{type(exc).__name__}: {exc}"
                if isinstance(exc, OutputTooLongError):
                    kept = exc.text
                errors.record_error("sample", exc, sample=index, final=True)
                metrics.record_model_error("sample", exc, meter_provider=settings.meter_provider)
                child.record_exception(exc)
            answer = None
            if draw is not None:
                answer = draw.answer if draw.answer is not None else draw.raw.strip()
                if not answer:
                    error = "empty answer"
            result = Sample(
                index=index,
                raw=draw.raw if draw is not None else kept,
                answer=answer,
                plan=draw.plan if draw is not None else None,
                error=error,
                attempts=tries.count,
                latency_s=round(time.perf_counter() - started, 6),
                input_tokens=draw.input_tokens if draw is not None else None,
                output_tokens=draw.output_tokens if draw is not None else None,
            )
            # a span that records nothing is not described
            described = describe(index, draw) if child.is_recording() else None
            finish_sample_span(child, request_id, result, described)
        return result

    chosen = range(n) if indices is None else indices
    return tuple(await asyncio.gather(*(one(i) for i in chosen)))


def samples_wanted(state: RequestState, settings: Settings) -> int:
    """How many samples this request draws, as registered."""
    if state.registration is not None:
        return state.registration.n_samples
    return settings.samples_for_tier()


async def sample(
    state: RequestState, settings: Settings, span: Span, config: RunnableConfig | None = None
) -> SampleSet:
    """Draw the tier's samples from the chat model, each in its own child span: adaptively
    (``tracerag._adaptive``), several to one call where the model answers a prompt n times."""
    if settings.llm is None:
        raise ConfigurationError("the sample stage needs a chat model")
    llm, applied = with_temperature(settings.llm, settings.temperature)
    warnings: list[str] = []
    if not applied:
        warnings.append(
            f"{type(settings.llm).__name__} has no temperature field; sampled at its own setting"
        )
    inline = settings.plan_mode is PlanMode.INLINE and settings.tier is Tier.HIGH
    task = TASK_PLAN_AND_ANSWER if inline else TASK_ANSWER
    plan = state.plan if state.plan is not None and state.plan.ok else None
    materials = state.materials
    # every sample is sent this one prompt, message for message: a provider's prompt cache
    # sees the same prefix each time
    messages = prompt_messages(
        task, state.standalone_question, materials, plan, prompt=settings.prompt
    )
    retrieved = [m.id for m in materials]

    # a model without a temperature field samples at its own setting: none is reported
    model_attributes = model_attributes_of(
        settings.llm, llm, settings.temperature if applied else None
    )
    # the prompt goes onto the sample stage span once, not onto each of the N samples
    if span.is_recording():
        span.set_attributes(input_message_attributes(messages))
    versions = state.registration.versions if state.registration is not None else None
    if versions is not None and versions.prompt:
        model_attributes[semconv.OI_PROMPT_TEMPLATE_VERSION] = versions.prompt

    # samples often write the same plan word for word: parse each distinct one once
    plans: dict[str | None, Plan] = {}
    several = generates_several(llm)
    # the round's one call, when several samples share it: index -> (call, position in it)
    shared: dict[int, tuple[asyncio.Future[list[AIMessage]], int, int]] = {}
    calls = 0

    async def one_call(on_retry: OnRetry, tries: Tries) -> AIMessage:
        async with model_slots(
            concurrency_of(settings.max_concurrency, settings.llm), settings.llm
        ):
            return await call_model(
                llm, messages, policy=settings.retry, on_retry=on_retry, config=config, tries=tries
            )

    async def several_call(n: int, on_retry: OnRetry, tries: Tries) -> list[AIMessage]:
        async with model_slots(
            concurrency_of(settings.max_concurrency, settings.llm), settings.llm
        ):
            return await call_model_several(
                llm,
                messages,
                n,
                policy=settings.retry,
                on_retry=on_retry,
                config=config,
                tries=tries,
            )

    async def generate(index: int, on_retry: OnRetry, tries: Tries) -> tuple[AIMessage, int]:
        nonlocal calls
        if index not in shared:
            calls += 1
            return await one_call(on_retry, tries), 1
        future, position, size = shared[index]
        if position == 0:  # the round's first sample makes the call the others share
            calls += 1
            try:
                future.set_result(await several_call(size, on_retry, tries))
            except asyncio.CancelledError:
                future.cancel()
                raise
            except Exception as exc:
                future.set_exception(exc)
                raise
            return future.result()[0], size
        replies = await asyncio.shield(future)
        tries.count = 1
        return replies[position], 0

    def finish(got: tuple[AIMessage, int]) -> Draw:  # no coroutine more per sample
        message, billed = got
        raw = text_of(message)
        spent: usage.CallUsage | None = None
        input_tokens: int | None
        output_tokens: int | None
        if billed:
            # the call's usage, billed once: a call for several answers reports them together
            input_tokens, output_tokens = token_usage(message)
            call = usage.usage_of(
                message,
                stage=usage.STAGE_SAMPLE,
                model=model_attributes[semconv.GENAI_REQUEST_MODEL],
                prompt=messages,
            )
            spent = dataclasses.replace(call, generations=billed) if billed > 1 else call
            usage.note(spent)
        else:
            input_tokens = output_tokens = None
        if inline:
            plan_text, answer = split_inline(raw)
            plan = plans.get(plan_text)
            if plan is None:
                plan = plans[plan_text] = _inline_plan(plan_text, retrieved)
            return Draw(raw, answer, plan, input_tokens, output_tokens, spent)
        return Draw(raw, None, None, input_tokens, output_tokens, spent)

    def describe(index: int, draw: Draw | None) -> Mapping[str, Any]:
        if draw is None or draw.spent is None:
            return dict(model_attributes)
        return {**model_attributes, **usage.span_attributes(draw.spent)}

    errors = ErrorLog()
    wanted = samples_wanted(state, settings)

    async def draw_round(indices: Sequence[int]) -> tuple[Sample, ...]:
        chosen = list(indices)
        if several and len(chosen) > 1:
            future: asyncio.Future[list[AIMessage]] = asyncio.get_running_loop().create_future()
            for position, index in enumerate(chosen):
                shared[index] = (future, position, len(chosen))
        return await draw_samples(
            state, settings, len(chosen), generate, describe, errors, finish, indices=chosen
        )

    verifier = Verifier(state, settings, span, errors, positional=True)  # as the set says
    samples, stopped = await draw_adaptive(
        state, settings, wanted, draw_round, lambda drawn: verifier.tally(drawn, materials)
    )
    # a model without a temperature field samples at its own setting: none is known
    drawn_at = settings.temperature if applied else None
    warnings.extend(record_samples(samples, span, drawn_at, stopped, wanted, calls))
    return SampleSet(
        samples=samples,
        temperature=drawn_at,
        temperature_zero=settings.temperature == 0.0,
        # a numbered footnote ``[2]`` names the second material the prompt showed, as in wrap()
        positional=True,
        warnings=tuple(warnings),
        errors=errors.freeze(),
        verified=dict(verifier.reports),
        **adaptive_fields(stopped, wanted, calls),  # type: ignore[arg-type]
    )


def _inline_plan(plan_text: str | None, retrieved: list[str]) -> Plan:
    if plan_text is None:
        return Plan(ok=False, error="sample wrote no PLAN line", mode="inline")
    try:
        return parse_plan(plan_text, retrieved, mode="inline")
    except PlanError as exc:
        return Plan(ok=False, error=str(exc), raw=plan_text, mode="inline")
