"""Runs stages over a RequestContext, each in its own span under one ``tracerag.request`` root.

The runner owns the span tree: it opens the root, opens one span per stage in order (stages a
tier skips still get a span, marked skipped), stamps the request_id on every span, times each
stage, and at the end hands the audit record to the record sink and the metrics. A failure of
tracing, storage or metrics never fails the request.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import contextlib
import contextvars
import logging
import os
import threading
import time
import weakref
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
from tracerag.text.unicode import first_lone_surrogate, fix_surrogates, is_invisible
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
    """A RequestContext from a question string or a dict; InputError on anything else.

    Refused: a question that is empty or shows nothing (only whitespace, zero-width or other
    invisible characters), longer than ``max_chars``, or any field that is not valid Unicode
    (a lone UTF-16 surrogate such as ``"\\ud800"``). Surrogate pairs are joined into the
    character they encode.
    """
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
    for key in ("question", "session_id", "user_id", "channel", "request_id"):
        field = data.get(key)
        if field is None:
            continue
        if not isinstance(field, str):
            raise InputError(f"{key} must be a string")
        lone = first_lone_surrogate(field)
        if lone is not None:
            raise InputError(
                f"{key} is not valid Unicode: a lone UTF-16 surrogate at character {lone}"
            )
        data[key] = fix_surrogates(field)
    question = data["question"]
    if is_invisible(question):
        raise InputError("the question shows no visible character")
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
    response: Response = ctx.response
    return response


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
    """Run a coroutine to completion from sync code, in the caller's context.

    The coroutine sees the caller's contextvars (the current OpenTelemetry span, LangChain's
    run config and callbacks). Called where no event loop runs, it runs on this thread's own
    event loop, made on first use and kept for the thread's life. Called inside a running
    event loop (which it cannot re-enter), it runs on one long-lived loop in a background thread
    while the caller waits; from that background loop itself, on a loop in a fresh thread.
    """
    try:
        running = asyncio.get_running_loop()
    except RuntimeError:
        return _run_here(coro_factory())
    context = contextvars.copy_context()
    if running is _bridge.loop:  # nested: waiting here would block the loop it needs
        return _run_in_new_thread(coro_factory(), context)
    return _bridge.run(coro_factory(), context)


def _run_here(coro: Coroutine[Any, Any, T]) -> T:
    loop = _thread_loop()
    task = loop.create_task(coro)  # the task runs in a copy of the caller's context
    try:
        return loop.run_until_complete(task)
    except BaseException:
        if not task.done():  # interrupted (KeyboardInterrupt): do not leave it half-run
            task.cancel()
            with contextlib.suppress(BaseException):
                loop.run_until_complete(task)
        raise


class _ThreadLoop:
    """One thread's event loop for sync calls; closed when the thread ends or at exit."""

    def __init__(self) -> None:
        self.loop = asyncio.new_event_loop()
        weakref.finalize(self, _close_loop, self.loop)


def _close_loop(loop: asyncio.AbstractEventLoop) -> None:
    if not loop.is_running() and not loop.is_closed():
        loop.close()


_local = threading.local()


def _thread_loop() -> asyncio.AbstractEventLoop:
    holder: _ThreadLoop | None = getattr(_local, "holder", None)
    if holder is None or holder.loop.is_closed():
        holder = _ThreadLoop()
        _local.holder = holder
    return holder.loop


class _Bridge:
    """A long-lived event loop in a daemon thread, for sync calls made inside a running loop."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self.loop: asyncio.AbstractEventLoop | None = None

    def _start(self) -> asyncio.AbstractEventLoop:
        with self._lock:
            if self.loop is None:
                loop = asyncio.new_event_loop()
                thread = threading.Thread(
                    target=loop.run_forever, name="tracerag-sync-bridge", daemon=True
                )
                thread.start()
                self.loop = loop
            return self.loop

    def run(self, coro: Coroutine[Any, Any, T], context: contextvars.Context) -> T:
        loop = self.loop or self._start()
        done: concurrent.futures.Future[T] = concurrent.futures.Future()
        tasks: list[asyncio.Task[T]] = []

        def start() -> None:
            if not done.set_running_or_notify_cancel():
                coro.close()
                return
            task = context.run(loop.create_task, coro)
            tasks.append(task)
            task.add_done_callback(lambda t: _settle(done, t))

        loop.call_soon_threadsafe(start)
        try:
            return done.result()
        except BaseException:
            if not done.done():  # the caller was interrupted: stop the work it waited for
                done.cancel()
                loop.call_soon_threadsafe(lambda: [t.cancel() for t in tasks])
            raise

    def forget(self) -> None:
        """After fork: the thread is gone in the child, so start afresh on next use."""
        self._lock = threading.Lock()
        self.loop = None


def _settle(done: concurrent.futures.Future[T], task: asyncio.Task[T]) -> None:
    if done.done():
        return
    if task.cancelled():
        done.cancel()
    elif (error := task.exception()) is not None:
        done.set_exception(error)
    else:
        done.set_result(task.result())


def _run_in_new_thread(coro: Coroutine[Any, Any, T], context: contextvars.Context) -> T:
    outcome: list[Any] = []

    def target() -> None:
        try:
            outcome.append(("ok", context.run(asyncio.run, coro)))
        except BaseException as exc:
            outcome.append(("error", exc))

    thread = threading.Thread(target=target, name="tracerag-sync-nested")
    thread.start()
    thread.join()
    kind, value = outcome[0]
    if kind == "error":
        raise value
    result: T = value
    return result


_bridge = _Bridge()


def _after_fork_in_child() -> None:
    global _local
    _local = threading.local()
    _bridge.forget()


if hasattr(os, "register_at_fork"):
    os.register_at_fork(after_in_child=_after_fork_in_child)
