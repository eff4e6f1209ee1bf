"""Stage 4, sample×N: N answers drawn concurrently at the configured temperature.

Each sample is its own child span with its raw output. Transient model errors are retried
(bounded, exponential backoff); a sample that still fails is kept with its error, never dropped.
"""

from __future__ import annotations

import asyncio
import json
import time
from typing import Any

from langchain_core.language_models import BaseChatModel
from langchain_core.messages import BaseMessage
from langchain_core.runnables import RunnableConfig
from opentelemetry.trace import Span, Status, StatusCode, Tracer

from tracerag import metrics, semconv
from tracerag.context import Plan, RequestContext, Sample
from tracerag.errors import ConfigurationError, PlanError
from tracerag.llm import (
    Tries,
    call_model,
    invocation_parameters,
    model_name,
    provider_name,
    record_retry,
    text_of,
    token_usage,
    with_temperature,
)
from tracerag.prompts import PROMPT, TASK_ANSWER, TASK_PLAN_AND_ANSWER, prompt_values
from tracerag.settings import Settings
from tracerag.stages.plan import parse_plan, split_inline
from tracerag.tracing import MODEL_SPAN_KIND, capture, get_tracer

TEMPERATURE_ZERO_WARNING = (
    "the model samples at temperature 0, so samples cannot disagree: "
    "self-consistency is reported as uninformative"
)


def llm_span_attributes(llm: BaseChatModel, temperature: float | None) -> dict:
    """OpenInference and GenAI attributes describing the model of a sample span."""
    name = model_name(llm) or type(llm).__name__
    params = invocation_parameters(llm)
    if temperature is not None:
        params["temperature"] = temperature
    attrs = {
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


def finish_sample_span(
    span: Span, ctx: RequestContext, sample: Sample, extra: dict[str, Any] | None = None
) -> None:
    """All attributes of a finished sample span, set in one call."""
    attrs: dict[str, Any] = dict(extra or {})
    attrs.update(
        {
            semconv.REQUEST_ID: ctx.request_id,
            semconv.SAMPLE_INDEX: sample.index,
            semconv.SAMPLE_ATTEMPTS: sample.attempts,
            semconv.SAMPLE_OK: sample.ok,
        }
    )
    attrs.update(output_attributes(sample.raw))
    attrs.update(usage_attributes(sample))
    if sample.error:
        attrs[semconv.SAMPLE_ERROR] = sample.error
        span.set_status(Status(StatusCode.ERROR, sample.error))
    span.set_attributes(attrs)


def record_samples(ctx: RequestContext, span: Span, temperature: float | None) -> None:
    """Stage-level sample attributes, and the temperature-zero warning where it applies
    (``temperature`` None: the model has none that tracerag knows)."""
    ok = sum(1 for s in ctx.samples if s.ok)
    span.set_attribute(semconv.SAMPLES_OK, ok)
    span.set_attribute(semconv.SAMPLES_FAILED, len(ctx.samples) - ok)
    if temperature is not None and temperature >= 0:
        span.set_attribute(semconv.TEMPERATURE, float(temperature))
    zero = temperature == 0.0 and len(ctx.samples) > 1
    span.set_attribute(semconv.TEMPERATURE_ZERO, zero)
    if zero and TEMPERATURE_ZERO_WARNING not in ctx.warnings:
        ctx.warnings.append(TEMPERATURE_ZERO_WARNING)
        span.add_event(semconv.EVENT_WARNING, {semconv.WARNING_MESSAGE: TEMPERATURE_ZERO_WARNING})


async def sample(
    ctx: RequestContext, settings: Settings, span: Span, config: RunnableConfig | None = None
) -> RequestContext:
    """Draw the tier's number of samples concurrently, each in its own child span."""
    if settings.llm is None:
        raise ConfigurationError("the sample stage needs a chat model")
    llm, applied = with_temperature(settings.llm, settings.temperature)
    if not applied:
        ctx.warnings.append(
            f"{type(settings.llm).__name__} has no temperature field; sampled at its own setting"
        )
    inline = settings.plan_mode == "inline" and settings.tier == "high"
    task = TASK_PLAN_AND_ANSWER if inline else TASK_ANSWER
    plan = ctx.plan if ctx.plan is not None and ctx.plan.ok else None
    messages = PROMPT.format_messages(**prompt_values(task, ctx.question, ctx.materials, plan))
    n = settings.samples_for_tier()
    tracer: Tracer = get_tracer(settings.tracer_provider)
    retrieved = [m.id for m in ctx.materials]

    # a model without a temperature field samples at its own setting: none is reported
    model_attributes = llm_span_attributes(llm, settings.temperature if applied else None)
    # the prompt goes onto the sample stage span once, not onto each of the N samples
    span.set_attributes(input_message_attributes(messages))
    if ctx.versions.prompt:
        model_attributes[semconv.OI_PROMPT_TEMPLATE_VERSION] = ctx.versions.prompt

    async def one(index: int) -> Sample:
        result = Sample(index=index)
        with tracer.start_as_current_span(semconv.SPAN_SAMPLE_ONE, kind=MODEL_SPAN_KIND) as child:
            on_retry = record_retry(ctx, child, "sample", settings.meter_provider, sample=index)

            started = time.perf_counter()
            tries = Tries()
            try:
                message = await call_model(
                    llm,
                    messages,
                    policy=settings.retry,
                    on_retry=on_retry,
                    config=config,
                    tries=tries,
                )
                result.raw = text_of(message)
                result.input_tokens, result.output_tokens = token_usage(message)
                if inline:
                    plan_text, result.answer = split_inline(result.raw)
                    result.plan = _inline_plan(plan_text, retrieved)
                else:
                    result.answer = result.raw.strip()
                if not result.answer:
                    result.error = "empty answer"
            except Exception as exc:
                result.error = f"{type(exc).__name__}: {exc}"
                ctx.record_error("sample", exc, sample=index, final=True)
                metrics.record_model_error("sample", exc, meter_provider=settings.meter_provider)
                child.record_exception(exc)
            result.attempts = tries.count
            result.latency_s = round(time.perf_counter() - started, 6)
            finish_sample_span(child, ctx, result, model_attributes)
        return result

    ctx.samples = list(await asyncio.gather(*(one(i) for i in range(n))))
    record_samples(ctx, span, settings.temperature)
    return ctx


def _inline_plan(plan_text: str | None, retrieved: list[str]) -> Plan:
    if plan_text is None:
        return Plan(ok=False, error="sample wrote no PLAN line", mode="inline")
    try:
        return parse_plan(plan_text, retrieved, mode="inline")
    except PlanError as exc:
        return Plan(ok=False, error=str(exc), raw=plan_text, mode="inline")
