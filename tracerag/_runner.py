"""The run loop: a request through the stage table, each stage in its own span under one root.

``run`` owns the span tree and the request's state: it opens the root, opens one span per stage
in order (stages a tier skips still get a span, marked skipped), stamps the request_id on every
span, times each stage, and puts each stage's output into a new ``RequestState``. At the end it
hands the audit record to the record sink, then the request's ticket (escalate, review) to the
escalation handler with the record's fate (``Ticket.audit_persisted``), builds and validates the
Response once (with what the sink said), and records the metrics. The record, the root span's
attributes and the metrics are the state's projections (``RequestState.to_record``,
``root_attributes``, ``outcome_fields``). A failure of tracing, storage, metrics, the escalation
handler or a stage listener never fails the request. A stage that refuses the request after
finishing its work (``StageRefusal``) has its output kept in the state, and so in the record.
A turn a stage reports paused for a person (``Interrupted``, say the wrapped app's own
interrupt) is an outcome of its own: no further stage runs, and the record, the root span and
the metrics say ``interrupted``, neither routed nor failed.

The LangChain Runnable both front doors are is ``StagedRunnable``; the events listeners hear are
in ``tracerag.events``; the sync entry points run the loop through ``run_sync``.
"""

from __future__ import annotations

import abc
import contextlib
import dataclasses
import inspect
import logging
import time
from collections.abc import Mapping, Sequence
from typing import Any

from langchain_core.runnables import RunnableConfig
from opentelemetry import trace
from opentelemetry.trace import Span, Status, StatusCode
from opentelemetry.util.types import AttributeValue

from tracerag import _semconv as semconv
from tracerag import _usage as usage
from tracerag._choices import Stage
from tracerag._settings import RecordSink, Settings
from tracerag._state import RequestInput, RequestState, StageRefusal
from tracerag.contract import (
    AppInterrupt,
    Response,
    _schemas,
    caller_response,
    validate_response,
)
from tracerag.errors import ConfigurationError
from tracerag.events import StageEvent, StageListener, tell
from tracerag.stages._register import new_request_id
from tracerag.stages._table import Step
from tracerag.telemetry import _instruments as metrics
from tracerag.telemetry._content_capture import capture
from tracerag.telemetry._evaluations import evaluation
from tracerag.telemetry._providers import get_tracer
from tracerag.telemetry._spans import set_span_metadata

__all__ = ["SETTINGS_SINK", "Interrupted", "conversation_id", "outcome_of", "prepare", "run"]


logger = logging.getLogger("tracerag")

#: ``run``'s default ``record_sink``: the one the settings name.
SETTINGS_SINK: Any = object()


class Interrupted(Exception, abc.ABC):
    """A stage's word that the turn paused for a person (an interrupt): an outcome of its own,
    neither routed nor failed. A stage raises it in a ``StageRefusal`` (its output is kept);
    ``run`` then runs no further stage and delivers the turn as interrupted: the record's
    ``interrupted`` section names the interrupts (ids and payload types) and its ``response``
    the Response the caller gets (``response()``), with no request error; the root span is
    named ``... [interrupted]``, its decision attribute says so and its status stays unset; the
    request metrics count it under ``decision="interrupted"`` and the interrupted turns by
    ``kind``."""

    kind: metrics.InterruptKind = "app"

    def __init__(self, interrupts: Sequence[AppInterrupt], message: str) -> None:
        super().__init__(message)
        self.interrupts = tuple(interrupts)

    @abc.abstractmethod
    def response(self) -> Response:
        """The Response the caller gets for the paused turn."""

    def section(self) -> dict[str, Any]:
        """The record's ``interrupted`` section: the kind, and each interrupt's id and payload
        type (its ``type`` field, None when it has none)."""
        return {
            "kind": self.kind,
            "interrupts": [{"id": i.id, "type": interrupt_type(i)} for i in self.interrupts],
        }


def interrupt_type(interrupt: AppInterrupt) -> str | None:
    """An interrupt's payload type: its ``type`` field (``answer_review``), else None."""
    value = interrupt.value
    kind = value.get("type") if isinstance(value, Mapping) else None
    return kind if isinstance(kind, str) and kind else None


async def run(
    request: RequestInput,
    settings: Settings,
    steps: Sequence[Step],
    config: RunnableConfig | None = None,
    *,
    mode: str = "pipeline",
    on_stage: StageListener | None = None,
    record_sink: RecordSink | None = SETTINGS_SINK,
    agent: str | None = None,
) -> Response:
    """Run the steps under one root span; return the validated Response.

    ``record_sink`` replaces the settings' sink for this request (None: keep no record).
    ``agent``: the name of the agent the front door wraps (else the run's ``lc_agent_name``,
    else the mode); the root span of any front door but a pipeline is ``invoke_agent {agent}``
    (a pipeline's is ``invoke_workflow tracerag``).
    """
    sink = settings.record_sink if record_sink is SETTINGS_SINK else record_sink
    if not request.request_id:
        request = dataclasses.replace(request, request_id=new_request_id())
    tracer = get_tracer(settings.tracer_provider)  # per request: a provider set later is used
    started = time.perf_counter()
    root_name = _RootName(mode, agent or _agent_of(config))
    with (
        usage.metering() as ledger,
        tracer.start_as_current_span(
            root_name.span_name(), record_exception=False, set_status_on_exception=False
        ) as root,
        contextlib.ExitStack() as last_span,  # the last stage's span, held open to the end
    ):
        span_context = root.get_span_context()
        state = RequestState(
            input=request,
            trace_id=trace.format_trace_id(span_context.trace_id)
            if span_context.is_valid
            else None,
        )
        if root.is_recording():
            root.set_attributes(root_name.attributes(state.request_id, request, config))
        current: Step | None = None
        step_started = started
        paused: Interrupted | None = None
        try:
            for current in steps:
                step_started = time.perf_counter()
                held = last_span if current is steps[-1] else None
                state, refusal = await _run_step(current, state, settings, config, on_stage, held)
                if isinstance(refusal, Interrupted):  # paused for a person: no further stage
                    paused = refusal
                    break
                if refusal is not None:
                    raise refusal
        except BaseException as exc:
            root.record_exception(exc)
            root.set_status(Status(StatusCode.ERROR, f"{type(exc).__name__}: {exc}"))
            if current is not None and current.name not in state.timings:
                state = state.with_timing(current.name, time.perf_counter() - step_started)
            state = state.with_error("request", exc, final=True)
            state = state.with_timing("request", time.perf_counter() - started)
            with _deliver_span(tracer, state.request_id, root):
                spent = _usage(root, ledger, settings)
                _set_root(root, state, None, root_name)
                persisted = await _send_record_to_sink(state, settings, sink, spent)
                _give_ticket_to_handler(state, settings, persisted, root)
                _record_metrics(state, settings, spent)
            raise
        state = state.with_timing("request", time.perf_counter() - started)
        if paused is not None:
            with _deliver_span(tracer, state.request_id, root):
                return await _interrupted(paused, state, settings, sink, root, ledger, root_name)
        # in the last stage's span (assemble's), still open: what it decided is delivered
        spent = _usage(root, ledger, settings)
        persisted = await _send_record_to_sink(state, settings, sink, spent)
        notes = _give_ticket_to_handler(state, settings, persisted, root)
        try:
            response = _caller_response_of(state, persisted, notes)
        except BaseException as exc:
            root.record_exception(exc)
            root.set_status(Status(StatusCode.ERROR, f"{type(exc).__name__}: {exc}"))
            _record_metrics(state, settings, spent)
            raise
        _record_metrics(state, settings, spent)
        _set_root(root, state, response, root_name)
    return response


async def _interrupted(
    paused: Interrupted,
    state: RequestState,
    settings: Settings,
    sink: RecordSink | None,
    root: Span,
    ledger: usage.UsageLedger,
    name: _RootName,
) -> Response:
    """Deliver a turn paused for a person: its record (interrupted, with the Response), the
    root span (named and marked interrupted, no error), its metrics; return its Response."""
    spent = _usage(root, ledger, settings)
    response = paused.response()
    extra = {"response": response.model_dump(mode="json"), "interrupted": paused.section()}
    persisted = await _send_record_to_sink(state, settings, sink, spent, extra)
    if persisted is not None:
        response = response.model_copy(update={"audit_persisted": persisted})
        validate_response(response)
    if root.is_recording():
        try:
            root.update_name(name.span_name(semconv.INTERRUPTED))
            attrs = state.root_attributes(routed=False)
            attrs.update(
                {
                    semconv.DECISION: semconv.INTERRUPTED,
                    semconv.STATUS: response.status,
                    semconv.INTERRUPT_KIND: paused.kind,
                    semconv.INTERRUPT_COUNT: len(paused.interrupts),
                    semconv.INTERRUPT_IDS: [i.id or "" for i in paused.interrupts],
                    semconv.INTERRUPT_TYPES: [interrupt_type(i) or "" for i in paused.interrupts],
                }
            )
            if persisted is not None:
                attrs[semconv.AUDIT_PERSISTED] = persisted
            root.set_attributes(attrs)
            set_span_metadata(root, {**state.root_metadata(), "decision": semconv.INTERRUPTED})
        except Exception:  # tracing never fails a request
            logger.exception("tracerag: could not set root span attributes")
    _record_metrics(state, settings, spent, interrupted=paused.kind)
    return response


@dataclasses.dataclass(frozen=True, slots=True)
class _RootName:
    """The root span's name and GenAI operation: a workflow (RAGPipeline) or an agent."""

    mode: str
    agent: str | None

    @property
    def is_agent(self) -> bool:
        return self.mode != "pipeline"

    def span_name(self, decision: str | None = None) -> str:
        if self.is_agent:
            return semconv.agent_span_name(self.agent or self.mode, decision)
        return semconv.workflow_span_name(decision)

    def attributes(
        self, request_id: str, request: RequestInput, config: RunnableConfig | None
    ) -> dict[str, Any]:
        attrs: dict[str, Any] = {
            semconv.SPAN_NAME: semconv.SPAN_REQUEST,
            semconv.OI_SPAN_KIND: semconv.OI_KIND_CHAIN,
            semconv.MODE: self.mode,
            semconv.REQUEST_ID: request_id,
        }
        if self.is_agent:
            attrs[semconv.GENAI_OPERATION_NAME] = semconv.GENAI_OPERATION_INVOKE_AGENT
            attrs[semconv.GENAI_AGENT_NAME] = self.agent or self.mode
        else:
            attrs[semconv.GENAI_OPERATION_NAME] = semconv.GENAI_OPERATION_INVOKE_WORKFLOW
            attrs[semconv.GENAI_WORKFLOW_NAME] = semconv.WORKFLOW_NAME
        conversation = conversation_id(request, config)
        if conversation is not None:
            attrs[semconv.GENAI_CONVERSATION_ID] = conversation
            attrs[semconv.OI_SESSION_ID] = conversation
        return attrs


def _agent_of(config: RunnableConfig | None) -> str | None:
    """The name of the agent a request runs in, from its run's metadata (``create_agent(name=)``
    puts ``lc_agent_name`` there), for a front door that names none."""
    metadata = (config or {}).get("metadata") or {}
    name = metadata.get("lc_agent_name")
    return name if isinstance(name, str) and name else None


def conversation_id(request: RequestInput, config: RunnableConfig | None) -> str | None:
    """The conversation a request belongs to: its ``session_id``, else the LangGraph thread
    (``configurable.thread_id``) it runs on; None for a request on neither."""
    if request.session_id:
        return request.session_id
    configurable = (config or {}).get("configurable") or {}
    thread = configurable.get("thread_id")
    if thread is None or thread == "":
        return None
    return str(thread)


def prepare() -> None:
    """Set-up every request needs, done once per process ahead of the first request (the
    Response validator compiled): the front doors call it when built, so a first request's root
    span holds no time outside its stage and deliver spans. Never raises: a broken schema is
    reported by the request's own validation."""
    try:
        _schemas("response.schema.json")
    except Exception:
        logger.exception("tracerag: could not prepare the Response validator")


def _deliver_span(tracer: trace.Tracer, request_id: str, root: Span) -> Any:
    """Where a failed request's record and ticket are delivered: the last stage's span when it
    is still open (the failure came in it), else a ``tracerag.deliver`` span of its own."""
    if trace.get_current_span() is not root:
        return contextlib.nullcontext()
    span = tracer.start_as_current_span(
        semconv.SPAN_DELIVER, record_exception=False, set_status_on_exception=False
    )
    return _Stamped(span, request_id)


class _Stamped:
    """A span context manager whose span gets its tracerag name and request id."""

    __slots__ = ("_cm", "_request_id")

    def __init__(self, cm: Any, request_id: str) -> None:
        self._cm = cm
        self._request_id = request_id

    def __enter__(self) -> Span:
        span: Span = self._cm.__enter__()
        if span.is_recording():
            span.set_attributes(
                {semconv.SPAN_NAME: semconv.SPAN_DELIVER, semconv.REQUEST_ID: self._request_id}
            )
        return span

    def __exit__(self, *exc: Any) -> Any:
        return self._cm.__exit__(*exc)


def _caller_response_of(
    state: RequestState, persisted: bool | None, notes: tuple[str, ...] = ()
) -> Response:
    """The caller's Response: what the decision says, less a withheld answer's text."""
    decision = state.decision
    if decision is None:
        raise ConfigurationError("the stage table has no assemble stage: there is no Response")
    if notes:
        decision = dataclasses.replace(decision, warnings=decision.warnings + notes)
    response = caller_response(decision.response(state.request_id, state.trace_id, persisted))
    validate_response(response)
    return response


def _give_ticket_to_handler(
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


async def _announce_stage(listener: StageListener, step: Step, state: RequestState) -> None:
    event = StageEvent(
        stage=step.name,
        skipped=step.fn is None,
        duration_s=state.timings.get(step.name),
        state=state,
    )
    await tell(listener, event)


async def _run_step(
    step: Step,
    state: RequestState,
    settings: Settings,
    config: RunnableConfig | None,
    on_stage: StageListener | None = None,
    held: contextlib.ExitStack | None = None,
) -> tuple[RequestState, BaseException | None]:
    """The state with the step's output, and the error refusing the request after it, if any.

    The stage's listener hears it inside the stage's span (a request refused by the stage is
    not told of it), so a slow listener's time is in the span of the stage it listened to.
    With ``held`` the span stays open (and current) after the step, until ``held`` closes: the
    last stage's span holds the delivery of what the request decided.
    """
    name = semconv.STAGE_SPANS[step.name]
    attrs: dict[str, AttributeValue] = {
        semconv.SPAN_NAME: name,
        semconv.STAGE: str(step.name),
        semconv.OI_SPAN_KIND: _KINDS.get(step.name, semconv.OI_KIND_CHAIN),
        semconv.REQUEST_ID: state.request_id,
        semconv.STAGE_SKIPPED: step.fn is None,
    }
    if step.name == Stage.RETRIEVE:  # named by the GenAI conventions (the stage adds its source)
        name = semconv.retrieval_span_name(None)
        attrs[semconv.GENAI_OPERATION_NAME] = semconv.GENAI_OPERATION_RETRIEVAL
    with contextlib.ExitStack() as own:
        span = (held if held is not None else own).enter_context(
            get_tracer(settings.tracer_provider).start_as_current_span(
                name, record_exception=False, set_status_on_exception=False
            )
        )
        span.set_attributes(attrs)
        if step.fn is None:
            span.set_attribute(semconv.STAGE_SKIP_REASON, step.skip_reason or "skipped")
            state = state.with_skipped(step.name)
            if on_stage is not None:
                await _announce_stage(on_stage, step, state)
            return state, None
        started = time.perf_counter()
        refusal: BaseException | None = None
        try:
            output = await step.fn(state, settings, span, config)
        except StageRefusal as refused:  # the stage's output is kept; the request still fails
            output, refusal = refused.output, refused.error
            if isinstance(refusal, Interrupted):  # paused for a person: no error
                span.set_attribute(semconv.INTERRUPT_KIND, refusal.kind)
            else:
                span.record_exception(refusal)
                span.set_status(Status(StatusCode.ERROR, f"{type(refusal).__name__}: {refusal}"))
        except BaseException as exc:
            span.record_exception(exc)
            span.set_status(Status(StatusCode.ERROR, f"{type(exc).__name__}: {exc}"))
            raise
        state = state.with_output(step.name, output, time.perf_counter() - started)
        if refusal is None and on_stage is not None:
            await _announce_stage(on_stage, step, state)
        return state, refusal


_KINDS = {
    Stage.RETRIEVE: semconv.OI_KIND_RETRIEVER,
    Stage.SAMPLE: semconv.OI_KIND_CHAIN,
    Stage.VERIFY: semconv.OI_KIND_EVALUATOR,
}


def _set_root(
    root: Span, state: RequestState, response: Response | None, name: _RootName | None = None
) -> None:
    """The root span's attributes and metadata: those the state's parts declare (the route's
    once there is a Response), and the Response itself as the caller got it.

    A routed request's root span is renamed to carry its decision
    (``invoke_workflow tracerag [escalate]``), so a trace list showing root names tells the
    decisions apart, and gets the verdict as a ``gen_ai.evaluation.result``: the confidence,
    labelled with the decision.
    """
    if not root.is_recording():
        return
    try:
        if response is not None and name is not None:
            _verdict(root, response, name)
        attrs = state.root_attributes(routed=response is not None)
        if response is not None:
            if response.audit_persisted is not None:
                attrs[semconv.AUDIT_PERSISTED] = response.audit_persisted
            output = capture(response.model_dump_json())
            if output is not None:
                attrs[semconv.OI_OUTPUT_VALUE] = output
                attrs[semconv.OI_OUTPUT_MIME] = "application/json"
        root.set_attributes(attrs)
        set_span_metadata(root, state.root_metadata())
    except Exception:  # tracing never fails a request
        logger.exception("tracerag: could not set root span attributes")


def _verdict(root: Span, response: Response, name: _RootName) -> None:
    """The verdict the caller got, on the root span: in its name, and as an evaluation."""
    root.update_name(name.span_name(response.decision))
    confidence = response.confidence
    explanation = (
        f"confidence {confidence:.3f}" if confidence is not None else "not scored (tier low)"
    )
    explanation += f", routed to {response.decision}"
    if response.ticket_id:
        explanation += f" (ticket {response.ticket_id})"
    evaluation(root, semconv.EVALUATION_VERDICT, confidence, response.decision, explanation)


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


async def _send_record_to_sink(
    state: RequestState,
    settings: Settings,
    sink: RecordSink | None,
    spent: dict[str, Any] | None = None,
    extra: Mapping[str, Any] | None = None,
) -> bool | None:
    """Hand the finished record (with the sections in ``extra``) to the sink: True if it took
    it, None without a sink."""
    if sink is None:
        return None
    try:
        record = state.to_record()
        if spent is not None:
            record["usage"] = spent
        if extra:
            record.update(extra)
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
    return metrics.RequestOutcome(**state.outcome_fields())


def _record_metrics(
    state: RequestState,
    settings: Settings,
    spent: dict[str, Any] | None = None,
    *,
    interrupted: metrics.InterruptKind | None = None,
) -> None:
    try:
        outcome = outcome_of(state)
        paused = interrupted is not None
        if interrupted is not None:
            metrics.record_turn_interrupted(interrupted, meter_provider=settings.meter_provider)
        metrics.record_request(outcome, interrupted=paused, meter_provider=settings.meter_provider)
        if spent is not None:
            metrics.record_usage(
                outcome, spent, interrupted=paused, meter_provider=settings.meter_provider
            )
    except Exception:
        logger.exception("tracerag: metrics failed for request %s", state.request_id)
