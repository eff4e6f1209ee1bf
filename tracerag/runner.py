"""Runs the stage table over a request, each stage in its own span under one root span.

The runner owns the span tree and the request's state: it opens the root, opens one span per
stage in order (stages a tier skips still get a span, marked skipped), stamps the request_id on
every span, times each stage, and puts each stage's output into a new ``RequestState``. At the
end it hands the audit record to the record sink, then the request's ticket (escalate, review)
to the escalation handler with the record's fate (``Ticket.audit_persisted``), builds and
validates the Response once (with what the sink said), and records the metrics. A failure of
tracing, storage, metrics, the escalation handler or a stage listener never fails the request.
A stage that refuses the request after finishing its work (``StageRefusal``) has its output
kept in the state, and so in the audit record.

``StagedRunnable`` is the LangChain Runnable both front doors are. Every surface (``invoke``,
``ainvoke``, ``stream``, ``astream``, ``astream_events``, ``astream_log``, ``batch``,
``abatch``, ``transform``, ``atransform``) runs a request as one LangChain run of its own. The
callback handlers the caller passes (``config["callbacks"]``, or those of the runnable that
calls it) hear that run only: its start, a ``tracerag.stage`` custom event after each stage, a
``tracerag.answer`` event with the text of an answer the route releases, and its end with the
caller's ``Response``. tracerag's own calls (retriever, model, the wrapped app's runs) are
children of that run without the caller's handlers (``inner_config``), so nothing a sample
drew reaches the caller before it is verified, and a withheld answer never does.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import contextlib
import contextvars
import dataclasses
import functools
import inspect
import logging
import os
import threading
import time
import weakref
from collections.abc import AsyncIterator, Awaitable, Callable, Coroutine, Sequence
from dataclasses import dataclass
from typing import Any, TypeVar

from langchain_core.callbacks import AsyncCallbackManager, AsyncCallbackManagerForChainRun
from langchain_core.runnables import Runnable, RunnableConfig
from langchain_core.runnables.config import (
    ensure_config,
    patch_config,
    var_child_runnable_config,
)
from opentelemetry import trace
from opentelemetry.trace import Span, Status, StatusCode

from tracerag import metrics, semconv, usage
from tracerag.contract import Response, caller_response, validate_response
from tracerag.routing import PASS, REVIEW
from tracerag.settings import Settings
from tracerag.stages.assemble import outcome_attributes
from tracerag.stages.register import new_request_id
from tracerag.stages.table import Source, Step, steps_for
from tracerag.state import INPUT_KEYS, RequestInput, RequestState, StageRefusal
from tracerag.tracing import capture, get_tracer, set_span_metadata

__all__ = [
    "ANSWER_EVENT",
    "INPUT_KEYS",
    "STAGE_EVENT",
    "RecordSink",
    "StageEvent",
    "StageListener",
    "StagedRunnable",
    "Step",
    "caller_handlers",
    "inner_config",
    "parse_input",
    "run",
    "run_sync",
]

logger = logging.getLogger("tracerag")

T = TypeVar("T")

#: Where a finished request's audit record goes: ``(record) -> accepted``, sync or async.
RecordSink = Callable[[dict[str, Any]], "bool | Awaitable[bool]"]


@dataclass(frozen=True)
class StageEvent:
    """What a listener hears after each stage, skipped ones included."""

    stage: str
    skipped: bool
    duration_s: float | None
    state: RequestState

    @property
    def request_id(self) -> str:
        return self.state.request_id

    @property
    def trace_id(self) -> str | None:
        return self.state.trace_id

    @property
    def output(self) -> Any:
        """The stage's typed output (None when it was skipped)."""
        return getattr(self.state, RequestState.slot(self.stage))

    def signals(self) -> dict[str, Any]:
        """The stage's key signals, JSON-able (empty when it was skipped)."""
        state = self.state
        if self.skipped:
            return {}
        if self.stage == "register" and state.registration is not None:
            reg = state.registration
            return {
                "tier": reg.tier,
                "n_samples": reg.n_samples,
                "prompt_version": reg.versions.prompt,
                "model_version": reg.versions.model,
            }
        if self.stage == "retrieve" and state.retrieval is not None:
            return {
                "count": len(state.retrieval.materials),
                "material_ids": [m.id for m in state.retrieval.materials],
                "top_score": state.retrieval.top_score,
                "score_margin": state.retrieval.score_margin,
            }
        if self.stage == "plan" and state.plan is not None:
            return {
                "material_ids": list(state.plan.material_ids),
                "ok": state.plan.ok,
                "attempts": state.plan.attempts,
                "mode": state.plan.mode,
            }
        if self.stage == "sample" and state.samples is not None:
            ok = len(state.samples.ok)
            return {"samples_ok": ok, "samples_failed": len(state.samples.samples) - ok}
        if self.stage == "verify" and state.verification is not None:
            report = state.verification.citations
            return {
                "citation_valid": report.valid,
                "citation_score": report.score,
                "citation_coverage": report.coverage,
                "citation_accuracy": report.accuracy,
                "fabricated_citations": list(report.fabricated),
                "stale_citations": list(report.stale),
                "self_consistency": state.verification.selection.share,
                "consistency_groups": state.verification.consistency.n_groups,
                "answers_question": (
                    state.verification.relevance.addresses
                    if state.verification.relevance is not None
                    else None
                ),
            }
        if self.stage == "assemble" and state.decision is not None:
            return {"confidence": state.decision.confidence, "decision": state.decision.decision}
        return {}

    def to_dict(self) -> dict[str, Any]:
        """The event as a stream sends it: stage, ids, skipped, duration and signals."""
        return {
            "stage": self.stage,
            "request_id": self.request_id,
            "trace_id": self.trace_id,
            "skipped": self.skipped,
            "duration_s": self.duration_s,
            "signals": self.signals(),
        }


#: Called with each ``StageEvent``; may be async. What it raises is logged, never re-raised.
StageListener = Callable[[StageEvent], "Awaitable[None] | None"]

_SETTINGS_SINK: Any = object()


def parse_input(value: Any, *, max_chars: int = 8000) -> RequestInput:
    """A RequestInput from a question string or a dict; InputError on anything else."""
    return RequestInput.parse(value, max_chars=max_chars)


async def run(
    request: RequestInput,
    settings: Settings,
    steps: Sequence[Step],
    config: RunnableConfig | None = None,
    *,
    mode: str = "pipeline",
    on_stage: StageListener | None = None,
    record_sink: RecordSink | None = _SETTINGS_SINK,
) -> Response:
    """Run the steps under one root span; return the validated Response.

    ``record_sink`` replaces the settings' sink for this request (None: keep no record).
    """
    sink = settings.record_sink if record_sink is _SETTINGS_SINK else record_sink
    if not request.request_id:
        request = dataclasses.replace(request, request_id=new_request_id())
    tracer = get_tracer(settings.tracer_provider)  # per request: a provider set later is used
    started = time.perf_counter()
    with (
        usage.metering() as ledger,
        tracer.start_as_current_span(
            semconv.SPAN_REQUEST, record_exception=False, set_status_on_exception=False
        ) as root,
    ):
        span_context = root.get_span_context()
        state = RequestState(
            input=request,
            trace_id=trace.format_trace_id(span_context.trace_id)
            if span_context.is_valid
            else None,
        )
        root.set_attributes(
            {
                semconv.OI_SPAN_KIND: semconv.OI_KIND_CHAIN,
                semconv.MODE: mode,
                semconv.REQUEST_ID: state.request_id,
            }
        )
        current: Step | None = None
        step_started = started
        try:
            for current in steps:
                step_started = time.perf_counter()
                state, refusal = await _run_step(current, state, settings, config)
                if refusal is not None:
                    raise refusal
                if on_stage is not None:
                    await _tell(on_stage, current, state)
        except BaseException as exc:
            root.record_exception(exc)
            root.set_status(Status(StatusCode.ERROR, f"{type(exc).__name__}: {exc}"))
            if current is not None and current.name not in state.timings:
                state = state.with_timing(current.name, time.perf_counter() - step_started)
            state = state.with_error("request", exc, final=True)
            state = state.with_timing("request", time.perf_counter() - started)
            spent = _usage(root, ledger, settings)
            _set_root(root, state, None)
            persisted = await _deliver(state, settings, sink, spent)
            _hand_on(state, settings, persisted, root)
            _record_metrics(state, settings, spent)
            raise
        state = state.with_timing("request", time.perf_counter() - started)
        spent = _usage(root, ledger, settings)
        persisted = await _deliver(state, settings, sink, spent)
        notes = _hand_on(state, settings, persisted, root)
        try:
            response = _respond(state, persisted, notes)
        except BaseException as exc:
            root.record_exception(exc)
            root.set_status(Status(StatusCode.ERROR, f"{type(exc).__name__}: {exc}"))
            _record_metrics(state, settings, spent)
            raise
        _record_metrics(state, settings, spent)
        _set_root(root, state, response)
    return response


def _respond(
    state: RequestState, persisted: bool | None, notes: tuple[str, ...] = ()
) -> Response:
    """The caller's Response: what the decision says, less a withheld answer's text."""
    decision = state.decision
    if decision is None:
        raise RuntimeError("the stage table has no assemble stage: there is no Response")
    if notes:
        decision = dataclasses.replace(decision, warnings=decision.warnings + notes)
    response = caller_response(decision.response(state.request_id, state.trace_id, persisted))
    validate_response(response)
    return response


def _hand_on(
    state: RequestState, settings: Settings, persisted: bool | None, root: Span
) -> tuple[str, ...]:
    """Hand the request's ticket (if any) to the escalation handler, with its record's fate.

    Runs once the record sink has answered, so the ticket says whether the request it names is
    in the audit trail. A handler that raises never fails the request: the failure is logged,
    put on the root span, and returned as a warning for the Response.
    """
    ticket = state.decision.ticket if state.decision is not None else None
    if ticket is None:
        return ()
    ticket = dataclasses.replace(ticket, audit_persisted=persisted)
    try:
        settings.escalation.handle(ticket)
    except Exception as exc:
        logger.exception(
            "tracerag: escalation handler %s failed on ticket %s of request %s",
            type(settings.escalation).__name__,
            ticket.ticket_id,
            ticket.request_id,
        )
        root.record_exception(exc)
        return (
            f"ticket {ticket.ticket_id} was not taken by the escalation handler "
            f"({type(exc).__name__})",
        )
    return ()


async def _tell(listener: StageListener, step: Step, state: RequestState) -> None:
    event = StageEvent(
        stage=step.name,
        skipped=step.fn is None,
        duration_s=state.timings.get(step.name),
        state=state,
    )
    await _tell_listener(listener, event)


async def _tell_listener(listener: StageListener, event: StageEvent) -> None:
    try:
        result = listener(event)
        if inspect.isawaitable(result):
            await result
    except Exception:
        logger.exception("tracerag: on_stage listener failed after %s", event.stage)


async def _run_step(
    step: Step, state: RequestState, settings: Settings, config: RunnableConfig | None
) -> tuple[RequestState, BaseException | None]:
    """The state with the step's output, and the error refusing the request after it, if any."""
    name = semconv.STAGE_SPANS[step.name]
    with get_tracer(settings.tracer_provider).start_as_current_span(
        name, record_exception=False, set_status_on_exception=False
    ) as span:
        span.set_attributes(
            {
                semconv.STAGE: step.name,
                semconv.OI_SPAN_KIND: _KINDS.get(step.name, semconv.OI_KIND_CHAIN),
                semconv.REQUEST_ID: state.request_id,
                semconv.STAGE_SKIPPED: step.fn is None,
            }
        )
        if step.fn is None:
            span.set_attribute(semconv.STAGE_SKIP_REASON, step.skip_reason or "skipped")
            return state.with_skipped(step.name), None
        started = time.perf_counter()
        refusal: BaseException | None = None
        try:
            output = await step.fn(state, settings, span, config)
        except StageRefusal as refused:  # the stage's output is kept; the request still fails
            output, refusal = refused.output, refused.error
            span.record_exception(refusal)
            span.set_status(Status(StatusCode.ERROR, f"{type(refusal).__name__}: {refusal}"))
        except BaseException as exc:
            span.record_exception(exc)
            span.set_status(Status(StatusCode.ERROR, f"{type(exc).__name__}: {exc}"))
            raise
        return state.with_output(step.name, output, time.perf_counter() - started), refusal


_KINDS = {
    "retrieve": semconv.OI_KIND_RETRIEVER,
    "sample": semconv.OI_KIND_CHAIN,
    "verify": semconv.OI_KIND_EVALUATOR,
}


def _set_root(root: Span, state: RequestState, response: Response | None) -> None:
    if not root.is_recording():
        return
    reg = state.registration
    versions = state.versions
    attrs: dict[str, Any] = {semconv.ERROR_COUNT: len(state.errors)}
    if reg is not None:
        attrs[semconv.TIER] = reg.tier
        optional = {
            semconv.VERSION_PROMPT: versions.prompt,
            semconv.VERSION_MODEL: versions.model,
            semconv.VERSION_TRACERAG: versions.tracerag,
        }
    else:
        optional = {}
    request = state.input
    optional[semconv.OI_SESSION_ID] = request.session_id
    optional[semconv.OI_USER_ID] = request.user_id
    optional[semconv.CHANNEL] = request.channel
    attrs.update({key: value for key, value in optional.items() if value})  # the ones given
    question = capture(request.question)
    if question is not None:
        attrs[semconv.OI_INPUT_VALUE] = question
    if response is not None:
        attrs.update(outcome_attributes(response))
        if response.audit_persisted is not None:
            attrs[semconv.AUDIT_PERSISTED] = response.audit_persisted
        output = capture(response.model_dump_json())
        if output is not None:
            attrs[semconv.OI_OUTPUT_VALUE] = output
            attrs[semconv.OI_OUTPUT_MIME] = "application/json"
    decision = state.decision
    try:
        root.set_attributes(attrs)
        set_span_metadata(
            root,
            {
                "request_id": state.request_id,
                "tier": reg.tier if reg is not None else None,
                "versions": {
                    "prompt": versions.prompt if reg else None,
                    "model": versions.model if reg else None,
                    "tracerag": versions.tracerag if reg else "",
                },
                "decision": decision.decision if decision is not None else None,
                "confidence": decision.confidence if decision is not None else None,
                "calibration": decision.calibration if decision is not None else None,
            },
        )
    except Exception:  # tracing never fails a request
        logger.exception("tracerag: could not set root span attributes")


def _usage(root: Span, ledger: usage.UsageLedger, settings: Settings) -> dict[str, Any] | None:
    """The request's ``usage`` section, with its totals put on the root span; never raises."""
    try:
        section = usage.usage_section(ledger.calls(), settings.prices)
        if root.is_recording():
            root.set_attributes(usage.root_attributes(section))
        return section
    except Exception:
        logger.exception("tracerag: could not total the request's token usage")
        return None


async def _deliver(
    state: RequestState,
    settings: Settings,
    sink: RecordSink | None,
    spent: dict[str, Any] | None = None,
) -> bool | None:
    """Hand the finished record to the sink: True if it took it, None without a sink."""
    if sink is None:
        return None
    try:
        record = state.to_record()
        if spent is not None:
            record["usage"] = spent
        accepted = sink(record)
        if inspect.isawaitable(accepted):
            accepted = await accepted
        return bool(accepted)
    except Exception as exc:
        logger.exception("tracerag: audit sink failed for request %s", state.request_id)
        metrics.record_audit_failure(type(exc).__name__, meter_provider=settings.meter_provider)
        return False


def outcome_of(state: RequestState) -> metrics.RequestOutcome:
    """What the metrics record of a finished (or failed) request."""
    citations = state.verification.citations if state.verification is not None else None
    versions = state.registration.versions if state.registration is not None else None
    return metrics.RequestOutcome(
        tier=state.registration.tier if state.registration is not None else None,
        decision=state.decision.decision if state.decision is not None else None,
        confidence=state.decision.confidence if state.decision is not None else None,
        timings=state.timings,
        n_samples=len(state.samples.samples) if state.samples is not None else 0,
        citation_coverage=citations.coverage if citations is not None else None,
        citation_accuracy=citations.accuracy if citations is not None else None,
        fabricated=citations.fabricated if citations is not None else None,
        prompt_version=versions.prompt if versions is not None else None,
        model_version=versions.model if versions is not None else None,
    )


def _record_metrics(
    state: RequestState, settings: Settings, spent: dict[str, Any] | None = None
) -> None:
    try:
        outcome = outcome_of(state)
        metrics.record_request(outcome, meter_provider=settings.meter_provider)
        if spent is not None:
            metrics.record_usage(outcome, spent, meter_provider=settings.meter_provider)
    except Exception:
        logger.exception("tracerag: metrics failed for request %s", state.request_id)


#: The custom event (``on_custom_event``, ``astream_events`` v2) sent after each stage; its data
#: is ``StageEvent.to_dict()``: the stage, the request and trace ids, timing and key signals.
STAGE_EVENT = "tracerag.stage"
#: The custom event that carries a released answer's text (routes pass and review), sent once
#: it is verified and routed: ``{request_id, trace_id, decision, status, confidence, text}``.
ANSWER_EVENT = "tracerag.answer"


def caller_handlers(config: RunnableConfig | None) -> frozenset[int]:
    """The identities of the callback handlers the caller's config brings (the contextvar's
    config included when ``config`` is None): the handlers that hear only tracerag's run."""
    callbacks = ensure_config(config).get("callbacks")
    if not callbacks:
        return frozenset()
    if isinstance(callbacks, list):
        return frozenset(id(handler) for handler in callbacks)
    return frozenset(
        id(handler) for handler in [*callbacks.handlers, *callbacks.inheritable_handlers]
    )


def inner_config(
    config: RunnableConfig, run_manager: AsyncCallbackManagerForChainRun, caller: frozenset[int]
) -> RunnableConfig:
    """The config tracerag's own calls run with (retriever, model, the wrapped app's runs).

    Their runs are children of the request's run, with its tags and metadata, and with every
    inheritable handler but the caller's: an unverified sample's tokens, messages and outputs
    reach tracerag's capture and the tracers LangChain itself configures (LangSmith's
    ``LangChainTracer``, kept even when the caller passed it, and configure hooks), never a
    handler the caller passed in ``callbacks``, such as ``astream_events``'s stream or a
    LangGraph ``messages`` stream. Called from inside a LangGraph node, the runs are not
    subgraphs of the caller's graph either: they do not write to its stream or checkpointer.
    """
    child = run_manager.get_child()
    if caller:
        from langchain_core.tracers.langchain import LangChainTracer

        child.set_handlers(
            [
                handler
                for handler in child.handlers
                if id(handler) not in caller or isinstance(handler, LangChainTracer)
            ]
        )
    inner = patch_config(config, callbacks=child)
    configurable = inner.get("configurable") or {}
    if any(key.startswith(_GRAPH_RUNTIME) for key in configurable):
        # called inside a LangGraph node: the keys that would make tracerag's runs subgraph
        # steps of the caller's graph (its stream writer, its `subgraphs=True` stream, its
        # checkpointer and checkpoint) are the caller's; the conversation (thread_id) stays
        inner["configurable"] = {
            key: value
            for key, value in configurable.items()
            if not key.startswith(_GRAPH_RUNTIME) and key not in _GRAPH_CHECKPOINT
        }
    return inner


#: LangGraph's runtime keys in ``configurable`` (its ``CONFIG_KEY_*`` constants), set for the
#: runnables a graph node calls, and the parent checkpoint keys set with them
_GRAPH_RUNTIME = "__pregel_"
_GRAPH_CHECKPOINT = frozenset({"checkpoint_ns", "checkpoint_id", "checkpoint_map"})


def released_answer(state: RequestState) -> str | None:
    """The answer's text when the route releases it (pass, review), else None."""
    decision = state.decision
    if decision is None or decision.decision not in (PASS, REVIEW):
        return None
    return decision.answer


class _CallerEvents:
    """The stage listener of a request in a LangChain run: custom events for the caller, then
    the listener given to ``arun``. Neither can fail the request."""

    def __init__(
        self, manager: AsyncCallbackManager, run_id: Any, listener: StageListener | None
    ) -> None:
        self._manager = manager
        self._run_id = run_id
        self._listener = listener

    async def __call__(self, event: StageEvent) -> None:
        try:
            await self._dispatch(event)
        except Exception:  # a handler with raise_error: logged, the request goes on
            logger.exception("tracerag: a callback handler failed on %s", event.stage)
        if self._listener is not None:
            await _tell_listener(self._listener, event)

    async def _dispatch(self, event: StageEvent) -> None:
        if not self._manager.handlers:
            return
        await self._manager.on_custom_event(STAGE_EVENT, event.to_dict(), run_id=self._run_id)
        if event.stage != "assemble":
            return
        text = released_answer(event.state)
        decision = event.state.decision
        if text is None or decision is None:
            return
        data = {
            "request_id": event.request_id,
            "trace_id": event.trace_id,
            "decision": decision.decision,
            "status": decision.status,
            "confidence": decision.confidence,
            "text": text,
        }
        await self._manager.on_custom_event(ANSWER_EVENT, data, run_id=self._run_id)


class StagedRunnable(Runnable[Any, Response]):
    """A LangChain Runnable that answers through the stage table; base of both front doors.

    Input: a question string, or ``{"question", "session_id", "user_id", "channel",
    "request_id"}`` (all but question optional). Output: a validated ``tracerag.Response``.
    """

    def __init__(self, settings: Settings, source: Source) -> None:
        self._settings = settings
        self._source = source
        self._steps = steps_for(settings.tier, settings.plan_mode, source)

    @property
    def settings(self) -> Settings:
        """The frozen settings every request of this runnable reads."""
        return self._settings

    @property
    def steps(self) -> tuple[Step, ...]:
        """The stages a request runs, in order (skipped ones marked)."""
        return self._steps

    @property
    def mode(self) -> str:
        """``pipeline`` or ``wrap``: how materials and samples are obtained."""
        return self._source.mode

    @property
    def escalation(self) -> Any:
        """The handler that receives escalated and review-flagged requests."""
        return self._settings.escalation

    def parse_input(self, input: Any) -> RequestInput:
        """The checked input; ``InputError`` when it is not a valid question."""
        return RequestInput.parse(input, max_chars=self._settings.max_question_chars)

    async def arun(
        self,
        input: Any,
        config: RunnableConfig | None = None,
        *,
        on_stage: StageListener | None = None,
        record_sink: RecordSink | None = _SETTINGS_SINK,
    ) -> Response:
        """Answer one question; like ``ainvoke``, with hooks for this call.

        ``on_stage`` hears a ``StageEvent`` after each stage (skipped ones included), for
        streaming; what it raises is logged and never fails the request. ``record_sink``
        receives the request's audit record instead of the configured audit sink (None: keep
        no record); its answer (True when it took the record) is ``audit_persisted``.
        """
        answer = functools.partial(
            self._answer, caller=caller_handlers(config), on_stage=on_stage, record_sink=record_sink
        )
        return await self._acall_with_config(answer, input, config)

    async def ainvoke(
        self, input: Any, config: RunnableConfig | None = None, **kwargs: Any
    ) -> Response:
        return await self.arun(input, config)

    def invoke(self, input: Any, config: RunnableConfig | None = None, **kwargs: Any) -> Response:
        return run_sync(lambda: self.ainvoke(input, config, **kwargs))

    async def astream(
        self, input: Any, config: RunnableConfig | None = None, **kwargs: Any
    ) -> AsyncIterator[Response]:
        """One chunk: the Response, once the request is verified, routed and recorded.

        Nothing of a sample streams: the caller's callbacks (and ``astream_events``) hear the
        request's own run, its ``tracerag.stage`` events and, for a released answer, one
        ``tracerag.answer`` event, never the app's or the model's inner runs.
        """

        async def once() -> AsyncIterator[Any]:
            yield input

        answer = functools.partial(self._stream_answer, caller=caller_handlers(config))
        async for chunk in self._atransform_stream_with_config(once(), answer, config):
            yield chunk

    async def _stream_answer(
        self,
        inputs: AsyncIterator[Any],
        run_manager: AsyncCallbackManagerForChainRun,
        config: RunnableConfig,
        *,
        caller: frozenset[int],
    ) -> AsyncIterator[Response]:
        value: Any = None
        async for chunk in inputs:  # one input (atransform hands over the whole of it)
            value = chunk
        yield await self._answer(value, run_manager, config, caller=caller)

    async def _answer(
        self,
        input: Any,
        run_manager: AsyncCallbackManagerForChainRun,
        config: RunnableConfig,
        *,
        caller: frozenset[int],
        on_stage: StageListener | None = None,
        record_sink: RecordSink | None = _SETTINGS_SINK,
    ) -> Response:
        """The request inside its LangChain run: stages, record, ticket, caller's Response.

        ``config`` is the run's child config (the caller's callbacks with it). The stages run
        with ``inner_config``: the same, less the caller's handlers, so the app's and the
        model's runs reach tracerag's own capture and LangSmith, never the caller.
        """
        request = self.parse_input(input)
        inner = inner_config(config, run_manager, caller)
        events = run_manager.get_child()
        listener = _CallerEvents(events, run_manager.run_id, on_stage)
        # what a stage calls without a config (a graph node's model call) inherits ``inner``;
        # this runs in the context LangChain made for the run, so the change stays in it
        token = var_child_runnable_config.set(inner)
        try:
            return await run(
                request,
                self._settings,
                self._steps,
                inner,
                mode=self._source.mode,
                on_stage=listener,
                record_sink=record_sink,
            )
        finally:
            var_child_runnable_config.reset(token)

    @property
    def InputType(self) -> Any:
        return str | dict

    @property
    def OutputType(self) -> type[Response]:
        return Response


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
