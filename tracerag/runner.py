"""Runs stages over a RequestContext, each in its own span under one ``tracerag.request`` root.

The runner owns the span tree: it opens the root, opens one span per stage in order (stages a
tier skips still get a span, marked skipped), stamps the request_id on every span, times each
stage, and at the end hands the audit record to the record sink and the metrics. A failure of
tracing, storage or metrics never fails the request.
"""

from __future__ import annotations

import asyncio
import logging
import threading
import time
from collections.abc import Awaitable, Callable, Coroutine, Sequence
from dataclasses import dataclass
from typing import Any, TypeVar

from langchain_core.runnables import RunnableConfig
from opentelemetry import trace
from opentelemetry.trace import Span, Status, StatusCode

from tracerag import metrics, semconv
from tracerag.context import RequestContext
from tracerag.contract import Response
from tracerag.errors import InputError
from tracerag.settings import Settings
from tracerag.tracing import capture, set_span_metadata

logger = logging.getLogger("tracerag")

StageFn = Callable[
    [RequestContext, Settings, Span, RunnableConfig | None], Awaitable[RequestContext]
]

INPUT_KEYS = {"question", "session_id", "user_id", "channel", "request_id"}

T = TypeVar("T")


@dataclass(frozen=True)
class Step:
    """One stage in a run: its name, its function, or why it is skipped."""

    name: str
    fn: StageFn | None = None
    skip_reason: str | None = None


def parse_input(value: Any, *, max_chars: int = 8000) -> RequestContext:
    """A RequestContext from a question string or a dict; InputError on anything else."""
    if isinstance(value, str):
        data: dict[str, Any] = {"question": value}
    elif isinstance(value, dict):
        unknown = set(value) - INPUT_KEYS
        if unknown:
            raise InputError(
                f"unknown input field(s) {sorted(unknown)}; accepted: {sorted(INPUT_KEYS)}"
            )
        data = dict(value)
    else:
        raise InputError(
            f"input must be a question string or a dict with 'question', got {type(value).__name__}"
        )
    question = data.get("question")
    if not isinstance(question, str) or not question.strip():
        raise InputError("the question must be a non-empty string")
    if len(question) > max_chars:
        raise InputError(f"the question is {len(question)} characters; the limit is {max_chars}")
    for key in ("session_id", "user_id", "channel", "request_id"):
        if data.get(key) is not None and not isinstance(data[key], str):
            raise InputError(f"{key} must be a string")
    return RequestContext(
        question=question.strip(),
        session_id=data.get("session_id"),
        user_id=data.get("user_id"),
        channel=data.get("channel"),
        request_id=data.get("request_id") or "",
    )


async def run_steps(
    ctx: RequestContext,
    settings: Settings,
    steps: Sequence[Step],
    config: RunnableConfig | None = None,
    *,
    mode: str = "pipeline",
    on_stage: Callable[[str, RequestContext], None] | None = None,
) -> Response:
    """Run the steps under one root span; return the assembled Response.

    ``on_stage(name, ctx)``, if given, is called after each step (skipped ones included); an
    exception it raises is logged and never fails the request.
    """
    tracer = settings.tracer
    started = time.perf_counter()
    with tracer.start_as_current_span(
        semconv.SPAN_REQUEST, record_exception=False, set_status_on_exception=False
    ) as root:
        root.set_attribute(semconv.OI_SPAN_KIND, semconv.OI_KIND_CHAIN)
        root.set_attribute(semconv.MODE, mode)
        span_context = root.get_span_context()
        ctx.trace_id = (
            trace.format_trace_id(span_context.trace_id) if span_context.is_valid else None
        )
        if ctx.request_id:
            root.set_attribute(semconv.REQUEST_ID, ctx.request_id)
        try:
            for step in steps:
                ctx = await _run_step(step, ctx, settings, config)
                if ctx.request_id:
                    root.set_attribute(semconv.REQUEST_ID, ctx.request_id)
                if on_stage is not None:
                    try:
                        on_stage(step.name, ctx)
                    except Exception:
                        logger.exception("tracerag: on_stage hook failed after %s", step.name)
        except BaseException as exc:
            root.record_exception(exc)
            root.set_status(Status(StatusCode.ERROR, f"{type(exc).__name__}: {exc}"))
            ctx.record_error("request", exc, final=True)
            ctx.timings["request"] = round(time.perf_counter() - started, 6)
            _set_root(root, ctx)
            _deliver(ctx, settings)
            raise
        ctx.timings["request"] = round(time.perf_counter() - started, 6)
        _deliver(ctx, settings)
        _set_root(root, ctx)
    return ctx.response


async def _run_step(
    step: Step, ctx: RequestContext, settings: Settings, config: RunnableConfig | None
) -> RequestContext:
    name = semconv.STAGE_SPANS[step.name]
    with settings.tracer.start_as_current_span(
        name, record_exception=False, set_status_on_exception=False
    ) as span:
        span.set_attribute(semconv.STAGE, step.name)
        span.set_attribute(semconv.OI_SPAN_KIND, _KINDS.get(step.name, semconv.OI_KIND_CHAIN))
        if ctx.request_id:
            span.set_attribute(semconv.REQUEST_ID, ctx.request_id)
        if step.fn is None:
            span.set_attribute(semconv.STAGE_SKIPPED, True)
            span.set_attribute(semconv.STAGE_SKIP_REASON, step.skip_reason or "skipped")
            ctx.skipped.append(step.name)
            return ctx
        span.set_attribute(semconv.STAGE_SKIPPED, False)
        started = time.perf_counter()
        try:
            ctx = await step.fn(ctx, settings, span, config)
        except BaseException as exc:
            span.record_exception(exc)
            span.set_status(Status(StatusCode.ERROR, f"{type(exc).__name__}: {exc}"))
            raise
        finally:
            ctx.timings[step.name] = round(time.perf_counter() - started, 6)
            if ctx.request_id:
                span.set_attribute(semconv.REQUEST_ID, ctx.request_id)
    return ctx


_KINDS = {
    "retrieve": semconv.OI_KIND_RETRIEVER,
    "sample": semconv.OI_KIND_CHAIN,
    "verify": semconv.OI_KIND_EVALUATOR,
}


def _set_root(root: Span, ctx: RequestContext) -> None:
    attrs: dict[str, Any] = {
        semconv.TIER: ctx.tier,
        semconv.ERROR_COUNT: len(ctx.errors),
    }
    if ctx.request_id:  # a request refused in a stage has its id too
        attrs[semconv.REQUEST_ID] = ctx.request_id
    if ctx.versions.prompt:
        attrs[semconv.VERSION_PROMPT] = ctx.versions.prompt
    if ctx.versions.model:
        attrs[semconv.VERSION_MODEL] = ctx.versions.model
    if ctx.versions.tracerag:
        attrs[semconv.VERSION_TRACERAG] = ctx.versions.tracerag
    if ctx.session_id:
        attrs[semconv.OI_SESSION_ID] = ctx.session_id
    if ctx.user_id:
        attrs[semconv.OI_USER_ID] = ctx.user_id
    if ctx.channel:
        attrs[semconv.CHANNEL] = ctx.channel
    question = capture(ctx.question)
    if question is not None:
        attrs[semconv.OI_INPUT_VALUE] = question
    response: Response | None = ctx.response
    if response is not None:
        attrs[semconv.DECISION] = response.decision
        attrs[semconv.STATUS] = response.status
        if response.confidence is not None:
            attrs[semconv.CONFIDENCE] = response.confidence
        if response.ticket_id:
            attrs[semconv.TICKET_ID] = response.ticket_id
        if response.audit_persisted is not None:
            attrs[semconv.AUDIT_PERSISTED] = response.audit_persisted
        if response.calibration:
            attrs[semconv.CALIBRATION] = response.calibration
        output = capture(response.model_dump_json())
        if output is not None:
            attrs[semconv.OI_OUTPUT_VALUE] = output
            attrs[semconv.OI_OUTPUT_MIME] = "application/json"
    try:
        root.set_attributes(attrs)
        set_span_metadata(
            root,
            {
                "request_id": ctx.request_id,
                "tier": ctx.tier,
                "versions": {
                    "prompt": ctx.versions.prompt,
                    "model": ctx.versions.model,
                    "tracerag": ctx.versions.tracerag,
                },
                "decision": ctx.decision,
                "confidence": ctx.confidence,
                "calibration": ctx.calibration,
            },
        )
    except Exception:  # tracing never fails a request
        logger.exception("tracerag: could not set root span attributes")


def _deliver(ctx: RequestContext, settings: Settings) -> None:
    """Hand the finished record to the audit sink and the metrics; never raises."""
    persisted: bool | None = None
    if settings.record_sink is not None:
        try:
            persisted = bool(settings.record_sink(ctx.to_record()))
        except Exception as exc:
            persisted = False
            logger.exception("tracerag: audit sink failed for request %s", ctx.request_id)
            metrics.record_audit_failure(type(exc).__name__, meter_provider=settings.meter_provider)
    if ctx.response is not None and persisted is not None:
        ctx.response = ctx.response.model_copy(update={"audit_persisted": persisted})
    try:
        metrics.record_request(ctx, meter_provider=settings.meter_provider)
    except Exception:
        logger.exception("tracerag: metrics failed for request %s", ctx.request_id)


def run_sync(coro_factory: Callable[[], Coroutine[Any, Any, T]]) -> T:
    """Run a coroutine to completion from sync code, even inside a running event loop."""
    try:
        asyncio.get_running_loop()
    except RuntimeError:
        return asyncio.run(coro_factory())
    result: dict[str, Any] = {}

    def target() -> None:
        try:
            result["value"] = asyncio.run(coro_factory())
        except BaseException as exc:
            result["error"] = exc

    thread = threading.Thread(target=target, name="tracerag-sync")
    thread.start()
    thread.join()
    if "error" in result:
        raise result["error"]
    return result["value"]
