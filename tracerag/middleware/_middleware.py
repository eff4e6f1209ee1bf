"""``TraceragMiddleware``: the six verified stages inside a ``create_agent`` app.

``create_agent(model, tools, middleware=[TraceragMiddleware(...)])``. The agent runs as it
does; the middleware changes three things:

- ``wrap_tool_call``: the vector store searches a tool makes are seen (``_hooks``), so their
  documents are materials even when the tool shows the model only text;
- ``wrap_model_call``: a model call that calls tools passes through. The answering call (one
  whose reply calls no tool) is drawn again from the same request, through the middleware
  inside this one (the handler), in adaptive rounds as on every front door (``min_samples``
  first, more only while the route could still change, at most N; a round in one call where
  the agent's model takes ``n``; each call in one of the model's ``max_concurrency`` slots),
  and the request runs the stage table with the turn's source (``_source``): materials from
  the turn's tool results, the answers as samples. Nothing of
  a sample reaches the caller's callbacks or LangGraph's ``messages`` stream; the reply that
  enters the agent's state is the verified answer (pass, review) or a replacement message
  (escalate), and the turn's ``Response`` (its caller view) is the state's ``tracerag`` key;
- ``after_agent``: on a checkpointed thread a withheld answer interrupts the turn for a person
  (``_review``): the model node has finished, so resuming re-runs only this hook, and the
  approved candidate is read from the ticket, never from the thread.

Spans, metrics, the audit record and tickets are the runner's, as for every front door.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import functools
import logging
import threading
from collections.abc import Awaitable, Callable, Mapping, Sequence
from typing import TYPE_CHECKING, Annotated, Any, cast

from langchain.agents.middleware import AgentMiddleware, AgentState, ModelRequest, ModelResponse
from langchain.agents.middleware.types import ExtendedModelResponse, OmitFromInput
from langchain_core.callbacks import AsyncCallbackHandler, BaseCallbackHandler, BaseCallbackManager
from langchain_core.language_models import BaseChatModel
from langchain_core.messages import AIMessage, BaseMessage, ToolMessage
from langchain_core.runnables import RunnableConfig
from langchain_core.runnables.config import var_child_runnable_config
from langchain_core.tracers.langchain import LangChainTracer
from langgraph.config import get_config, get_stream_writer
from langgraph.errors import GraphInterrupt
from langgraph.prebuilt.tool_node import ToolCallRequest
from langgraph.types import Command, interrupt
from pydantic import AfterValidator, ValidationError
from typing_extensions import NotRequired, Unpack

from tracerag import _usage as usage_meter
from tracerag._choices import Stage, check_options
from tracerag._llm import (
    OnRetry,
    Tries,
    concurrency_of,
    generates_several,
    model_slots,
    retry_call,
    text_of,
    within,
)
from tracerag._pipeline import PipelineOptions, build_settings
from tracerag._routing import Ticket
from tracerag._runner import SETTINGS_SINK, run
from tracerag._state import RequestInput, RequestState
from tracerag._sync import run_sync
from tracerag._withheld import check_withheld_message, withheld_text
from tracerag.contract import Response, caller_view
from tracerag.errors import (
    ConfigurationError,
    InputError,
    ModelTimeoutError,
    UnreadableOutputError,
)
from tracerag.events import StageEvent, tell
from tracerag.middleware._call import CALL_HOOKS
from tracerag.middleware._review import (
    ResumeValue,
    ReviewAction,
    interrupt_payload,
    refusal_of,
)
from tracerag.middleware._source import OnRound, TurnSource
from tracerag.middleware._turn import SearchLog, is_answer, turn_of
from tracerag.signals._attribution import UNSCORED
from tracerag.stages._stopping import first_round as first_samples
from tracerag.stages._table import steps_for
from tracerag.telemetry._instruments import record_turn_interrupted, record_turn_resumed
from tracerag.wrapping._capture import RunCapture
from tracerag.wrapping._hooks import Shared, instrument, scope
from tracerag.wrapping._inspect import retrieval_parts
from tracerag.wrapping._retryable import is_transient

if TYPE_CHECKING:
    from langgraph.runtime import Runtime

    from tracerag._settings import Settings

__all__ = ["TraceragMiddleware", "TraceragState"]

logger = logging.getLogger("tracerag.middleware")

#: The key of a message's ``response_metadata`` that marks what the middleware decided.
MARK = "tracerag"

Handler = Callable[[ModelRequest[Any]], Awaitable[Any]]


class TraceragState(AgentState[Any]):
    """The agent's state with the turn's verified ``Response`` (its caller view).

    ``tracerag``: the last answered turn's Response as JSON, without a withheld answer's text.
    ``tracerag_review``: a person's decision on that turn's withheld answer, once taken
    (``{"ticket_id", "request_id", "type"}``). Both are outputs only: the agent's input schema
    does not take them.
    """

    tracerag: NotRequired[Annotated[dict[str, Any], OmitFromInput]]
    tracerag_review: NotRequired[Annotated[dict[str, Any], OmitFromInput]]


class TraceragMiddleware(AgentMiddleware[TraceragState, Any, Any]):
    """Verify an agent's answer before it enters the agent's state; withhold it for a person.

    ``withheld_message``: the text that replaces a withheld answer (``{ticket_id}`` is filled
    in); by default it says a person will answer, in Chinese for a question written in
    Chinese. ``interrupt_on_escalate`` (True): on a checkpointed thread, interrupt the turn
    for review (``Command(resume={"type": "approve" | "edit" | "reject", ...})``).
    ``speculative`` (True): when the model is called right after tool results (the answering
    call of a RAG agent), draw the first round's ``min_samples`` answers at once (in one call
    with ``n`` where the model takes it); a call that turns out to call tools keeps only its
    first reply (the others are discarded). Sampling then goes on in rounds only while the
    route could still change (``min_samples=n_samples``: all N at once, fixed N).
    ``prompt_version`` and ``model_version`` name the versions (default: learned from the
    answering calls, as ``wrap()`` learns them). The other options are
    ``tracerag.PipelineOptions`` (``n_samples``, ``min_samples``, ``max_concurrency``,
    ``thresholds``, ``escalation``, ``audit``, ``tracer_provider``, …).
    """

    state_schema = TraceragState

    def __init__(
        self,
        *,
        prompt_version: str | None = None,
        model_version: str | None = None,
        withheld_message: str | None = None,
        interrupt_on_escalate: bool = True,
        speculative: bool = True,
        **options: Unpack[PipelineOptions],
    ) -> None:
        super().__init__()
        check_options("TraceragMiddleware", options, PipelineOptions.__optional_keys__)
        self.settings: Settings = build_settings(
            retriever=None,
            llm=None,
            prompt_version=prompt_version,
            model_version=model_version,
            prompt_version_source="argument" if prompt_version else None,
            model_version_source="argument" if model_version else None,
            temperature=0.7,
            plan_mode="inline",
            **options,
        )
        self.withheld_message = check_withheld_message(withheld_message)
        self.interrupt_on_escalate = interrupt_on_escalate
        self.speculative = speculative
        self._searches = SearchLog()
        self._instrumented: set[int] = set()
        self._lock = threading.Lock()

    @property
    def name(self) -> str:
        return "TraceragMiddleware"

    # -- tools: what their store searches return ------------------------------------------
    def wrap_tool_call(
        self,
        request: ToolCallRequest,
        handler: Callable[[ToolCallRequest], ToolMessage | Command[Any]],
    ) -> ToolMessage | Command[Any]:
        with self._seen(request):
            return handler(request)

    async def awrap_tool_call(
        self,
        request: ToolCallRequest,
        handler: Callable[[ToolCallRequest], Awaitable[ToolMessage | Command[Any]]],
    ) -> ToolMessage | Command[Any]:
        with self._seen(request):
            return await handler(request)

    @contextlib.contextmanager
    def _seen(self, request: ToolCallRequest) -> Any:
        tool = request.tool
        if tool is not None and id(tool) not in self._instrumented:
            with self._lock:
                if id(tool) not in self._instrumented:
                    instrument(*retrieval_parts(tool))
                    self._instrumented.add(id(tool))
        call_id = str(request.tool_call.get("id") or "")
        with scope(Shared(False), self._searches.for_call(call_id)):
            yield

    # -- the model: the answering call sampled, verified and routed -------------------------
    def wrap_model_call(
        self,
        request: ModelRequest[Any],
        handler: Callable[[ModelRequest[Any]], Any],
    ) -> Any:
        async def in_thread(r: ModelRequest[Any]) -> Any:
            return await asyncio.to_thread(handler, r)

        return run_sync(lambda: self.awrap_model_call(request, in_thread))

    async def awrap_model_call(
        self,
        request: ModelRequest[Any],
        handler: Handler,
    ) -> Any:
        if request.response_format is not None:
            raise ConfigurationError(
                "TraceragMiddleware verifies text answers and cannot yet verify a "
                "response_format agent's structured answer; wrap the agent with "
                "tracerag.wrap(...) instead"
            )
        node_config: RunnableConfig = var_child_runnable_config.get() or {}
        n = self.settings.samples_for_tier()
        # started before the turn's retrieval is read: its tool results carry no scores
        first_round = first_samples(self.settings, n, None, None, shape=UNSCORED)
        captures = [RunCapture() for _ in range(n)]
        agent_model = request.model
        several = isinstance(agent_model, BaseChatModel) and generates_several(agent_model)
        #: non-empty while the model's calls with ``n`` return the answers asked for
        takes_n = {True} if several else set()
        limit = concurrency_of(self.settings.max_concurrency, agent_model)

        unmetered: set[int] = set()  # calls made before the request's run: noted by its sample
        #: answers another sample's call gave (a call with ``n``): index -> its message
        given: dict[int, AIMessage] = {}

        timeout = self.settings.retry.model_timeout
        # a sample's call is timed from when it holds its slot (``call``), not while it queues
        untimed = dataclasses.replace(self.settings.retry, model_timeout=None)

        async def call(index: int, answers: int = 1, timed: bool = True) -> ModelResponse[Any]:
            """The answering call for sample ``index``; with ``answers`` > 1, one call that
            answers samples ``index`` .. ``index + answers - 1`` (the model takes ``n``). It
            waits for one of the model's slots (``max_concurrency``), then runs within the
            policy's ``model_timeout`` (``timed``; the agent's own first call is not)."""
            if usage_meter.current_ledger() is None:
                unmetered.add(index)
            else:
                unmetered.discard(index)
            choices = _Choices() if answers > 1 else None
            asked = request
            if choices is not None:
                asked = request.override(model=agent_model.model_copy(update={"n": answers}))
            token = var_child_runnable_config.set(
                quiet_config(node_config, captures[index], choices)
            )
            try:
                async with model_slots(limit, agent_model):
                    got = _as_response(
                        await within(
                            functools.partial(handler, asked),
                            timeout if timed else None,
                            ModelTimeoutError,
                        )
                    )
            finally:
                var_child_runnable_config.reset(token)
            if choices is not None:
                if len(choices.messages) < answers:  # it ignores ``n``: one call per sample
                    takes_n.clear()
                for offset, message in enumerate(choices.messages[1:answers], start=1):
                    given[index + offset] = message
                    _share(captures[index], captures[index + offset], message)
            return got

        speculate = self.speculative and first_round > 1 and _after_tools(request.messages)
        # right after tool results, the first round is started at once: in one call where the
        # model takes ``n``, else one call each (only ``min_samples``: the rule may stop there)
        first = asyncio.ensure_future(
            call(0, first_round if speculate and several else 1, timed=False)
        )
        spare: dict[int, asyncio.Future[ModelResponse[Any]]] = {}
        if speculate and not several:
            spare = {i: asyncio.ensure_future(call(i)) for i in range(1, first_round)}
        try:
            opened = await first
        except BaseException:
            await _cancel(spare)
            raise
        if not is_answer(_last_ai(opened)):
            await _cancel(spare)
            return opened
        responses: dict[int, ModelResponse[Any]] = {0: opened}
        #: a round's one call, shared by its samples: index -> (call, position in it, size)
        shared: dict[int, tuple[asyncio.Future[None], int, int]] = {}

        def on_round(indices: Sequence[int]) -> None:
            fresh = [i for i in indices if i != 0 and i not in given and i not in spare]
            if takes_n and len(fresh) > 1 and fresh == list(range(fresh[0], fresh[-1] + 1)):
                future: asyncio.Future[None] = asyncio.get_running_loop().create_future()
                for position, index in enumerate(fresh):
                    shared[index] = (future, position, len(fresh))

        def answer_of(got: ModelResponse[Any] | AIMessage | None) -> AIMessage:
            message = _last_ai(got) if isinstance(got, ModelResponse) else got
            if not is_answer(message):
                raise UnreadableOutputError(
                    "the sample called a tool instead of answering from the turn's results"
                )
            return cast(AIMessage, message)

        async def draw(index: int, on_retry: OnRetry, tries: Tries) -> AIMessage:
            if index == 0:
                return cast(AIMessage, _last_ai(opened))
            if index in shared and shared[index][1] > 0:  # a later sample of a shared call
                future, _, _ = shared.pop(index)
                await asyncio.shield(future)
                if index in given:
                    tries.count = 1
            if index in given:
                message = answer_of(given.pop(index))
                responses[index] = ModelResponse(result=[message])
                return message
            pending = spare.pop(index, None)
            answers = 1
            leads: asyncio.Future[None] | None = None
            if index in shared:  # the first sample of a shared call makes it for the others
                leads, _, answers = shared.pop(index)

            async def once() -> AIMessage:
                nonlocal pending
                if pending is not None:  # started at once with the first (it holds its slot)
                    task, pending = pending, None
                    got = await task
                else:
                    captures[index].reset()
                    got = await call(index, answers)
                message = answer_of(got)
                responses[index] = got
                return message

            try:  # each attempt is timed in ``call``, once it holds its slot
                return await retry_call(
                    once, untimed, on_retry=on_retry, retry_on=is_transient, tries=tries
                )
            finally:  # the others take what the call gave (a failed call: they draw their own)
                if leads is not None and not leads.done():
                    leads.set_result(None)

        try:
            response, state = await self._verify(
                request, node_config, draw, captures, unmetered, on_round
            )
        finally:
            await _cancel(spare)
        return self._release(request, response, state, responses)

    async def _verify(
        self,
        request: ModelRequest[Any],
        node_config: RunnableConfig,
        draw: Callable[[int, OnRetry, Tries], Awaitable[AIMessage]],
        captures: list[RunCapture],
        unmetered: set[int],
        on_round: OnRound | None = None,
    ) -> tuple[Response, RequestState | None]:
        """The turn through the stage table: its Response and its final state."""
        turn = turn_of(request.messages, self._searches)
        source = TurnSource(turn, draw, captures, unmetered, on_round)
        steps = steps_for(self.settings.tier, self.settings.plan_mode, source)
        thread = (node_config.get("configurable") or {}).get("thread_id")
        hooks = CALL_HOOKS.get()
        parsed = RequestInput.parse(
            {
                "question": turn.question,
                "session_id": str(thread) if thread else None,
                "request_id": hooks.request_id if hooks is not None else None,
            },
            max_chars=self.settings.max_question_chars,
        ).following(turn.earlier, "messages")
        finished: dict[str, RequestState] = {}
        listener = hooks.on_stage if hooks is not None else None

        async def on_stage(event: StageEvent) -> None:
            if event.stage is Stage.ASSEMBLE:
                finished["state"] = event.state
            if listener is not None:
                await tell(listener, event)

        quiet = quiet_config(node_config)
        token = var_child_runnable_config.set(quiet)
        try:
            response = await run(
                parsed,
                self.settings,
                steps,
                quiet,
                mode=source.mode,
                on_stage=on_stage,
                record_sink=hooks.record_sink if hooks is not None else SETTINGS_SINK,
            )
        finally:
            var_child_runnable_config.reset(token)
        return response, finished.get("state")

    def _release(
        self,
        request: ModelRequest[Any],
        response: Response,
        state: RequestState | None,
        responses: Mapping[int, ModelResponse[Any]],
    ) -> ExtendedModelResponse[Any]:
        """What enters the agent's state: the verified answer, or the replacement message."""
        view = caller_view(response)
        mark: dict[str, Any] = {
            "request_id": response.request_id,
            "decision": response.decision,
            "ticket_id": response.ticket_id,
        }
        chosen = _chosen(state, responses)
        if response.answer is not None:
            # the chosen sample's own message (its id, usage), with the answer as verified
            message = _last_ai(chosen) if chosen is not None else None
            if message is None:
                message = AIMessage(content=response.answer, id=f"tracerag-{response.request_id}")
            elif text_of(message).strip() != response.answer:
                message = message.model_copy(update={"content": response.answer})
            final = message.model_copy(
                update={"response_metadata": {**message.response_metadata, MARK: mark}}
            )
        else:
            ticket = state.decision.ticket if state is not None and state.decision else None
            mark["withheld"] = True
            mark["reasons"] = list(ticket.reasons) if ticket is not None else []
            final = AIMessage(
                content=withheld_text(
                    self.withheld_message,
                    question=request_question(request),
                    ticket_id=response.ticket_id,
                    request_id=response.request_id,
                ),
                id=f"tracerag-{response.request_id}",
                response_metadata={MARK: mark},
            )
        _write_stream({"tracerag": view})
        return ExtendedModelResponse(
            model_response=ModelResponse(result=[final]),
            command=Command(update={"tracerag": view}),
        )

    # -- after the turn: a person reviews a withheld answer ---------------------------------
    def after_agent(self, state: TraceragState, runtime: Runtime[Any]) -> dict[str, Any] | None:
        return self._review(state)

    async def aafter_agent(
        self, state: TraceragState, runtime: Runtime[Any]
    ) -> dict[str, Any] | None:
        return self._review(state)

    def _review(self, state: TraceragState) -> dict[str, Any] | None:
        messages = state.get("messages") or []
        last = messages[-1] if messages else None
        mark = _mark(last)
        if mark is None or not mark.get("withheld") or mark.get("review"):
            return None
        if not self.interrupt_on_escalate or not _checkpointed():
            return None
        assert isinstance(last, AIMessage)
        ticket_id = str(mark.get("ticket_id") or "")
        request_id = str(mark.get("request_id") or "")
        candidate = functools.partial(self.candidate, ticket_id, request_id)

        def available(value: ResumeValue) -> ResumeValue:
            if value.type is ReviewAction.APPROVE:
                candidate()  # refused before LangGraph keeps the value: the review waits
            return value

        try:
            value = interrupt(
                interrupt_payload(ticket_id, request_id, list(mark.get("reasons") or [])),
                response_schema=cast(
                    "type[ResumeValue]", Annotated[ResumeValue, AfterValidator(available)]
                ),
            )
        except GraphInterrupt:  # the turn pauses here for a person (resumed: counted below)
            record_turn_interrupted("answer_review", meter_provider=self.settings.meter_provider)
            raise
        except ValidationError as exc:
            try:
                raise InputError(refusal_of(exc)) from None
            except InputError as refused:
                _invalid_resume(refused)  # the review still waits: the value is not kept
                raise
        decision = value.decision()
        record_turn_resumed(
            "answer_review", decision.action.value, meter_provider=self.settings.meter_provider
        )
        if decision.action is ReviewAction.APPROVE:
            text = candidate()
        elif decision.action is ReviewAction.EDIT:
            text = cast(str, decision.answer)
        else:
            text = text_of(last)
        review = {"ticket_id": ticket_id, "request_id": request_id, "type": decision.action.value}
        released = AIMessage(
            content=text,
            id=last.id,
            response_metadata={MARK: {**mark, "review": decision.action.value}},
        )
        return {"messages": [released], "tracerag_review": review}

    def candidate(self, ticket_id: str, request_id: str = "") -> str:
        """The withheld candidate answer: from the ticket the escalation handler keeps, else
        from the request's audit record, as the review desk that decided read it."""
        lookup = getattr(self.settings.escalation, "get", None)
        ticket = lookup(ticket_id) if callable(lookup) else None
        hooks = CALL_HOOKS.get()
        from_record = (hooks.approved or {}).get(request_id) if hooks is not None else None
        if not isinstance(ticket, Ticket) and from_record:
            return from_record
        if not isinstance(ticket, Ticket):
            raise InputError(
                f"ticket {ticket_id} is not held by the escalation handler "
                f"({type(self.settings.escalation).__name__}), so its candidate cannot be "
                "approved; resume with {'type': 'edit', 'answer': …} or {'type': 'reject'}"
            )
        if not ticket.candidate_answer:
            raise InputError(
                f"ticket {ticket_id} holds no candidate answer to approve; resume with "
                "{'type': 'edit', 'answer': …} or {'type': 'reject'}"
            )
        return ticket.candidate_answer


# -- helpers --------------------------------------------------------------------------------


def quiet_config(
    config: RunnableConfig, capture: RunCapture | None = None, *more: BaseCallbackHandler | None
) -> RunnableConfig:
    """The node's config for calls no caller may hear: its callbacks cut to LangSmith's tracer
    (and a capture, and the handlers ``more``). LangGraph's ``messages`` stream and
    ``astream_events`` are callback handlers too: nothing a sample draws reaches them."""
    callbacks = config.get("callbacks")
    kept: list[BaseCallbackHandler] = []
    if isinstance(callbacks, BaseCallbackManager):
        handlers = [*callbacks.handlers, *callbacks.inheritable_handlers]
    else:
        handlers = list(callbacks or [])
    for handler in handlers:
        if isinstance(handler, LangChainTracer) and handler not in kept:
            kept.append(handler)
    if capture is not None:
        kept.append(capture)
    kept.extend(h for h in more if h is not None)
    quiet = cast(RunnableConfig, dict(config))
    if isinstance(callbacks, BaseCallbackManager):
        manager = callbacks.copy()
        manager.set_handlers(list(kept))
        quiet["callbacks"] = manager
    else:
        quiet["callbacks"] = kept
    return quiet


class _Choices(AsyncCallbackHandler):
    """Every answer a call with ``n`` gave (a chat model's ``invoke`` returns the first only)."""

    def __init__(self) -> None:
        self.messages: list[AIMessage] = []

    async def on_llm_end(self, response: Any, **kwargs: Any) -> None:
        generations = getattr(response, "generations", None) or []
        found = [getattr(g, "message", None) for g in (generations[0] if generations else [])]
        self.messages = [m for m in found if isinstance(m, AIMessage)]


def _share(source: RunCapture, target: RunCapture, message: AIMessage) -> None:
    """``target`` records the call ``source`` made as the one that wrote ``message``: what it
    was shown (for its citations, the versions) and not what it spent (billed once, on
    ``source``)."""
    target.reset()
    call = source.last_call
    if call is not None:
        target.model_calls.append(
            dataclasses.replace(
                call, output=text_of(message), input_tokens=None, output_tokens=None
            )
        )
    target.documents = list(source.documents)
    target.prompt_texts = list(source.prompt_texts)
    target.last_prompt_text = source.last_prompt_text


def request_question(request: ModelRequest[Any]) -> str:
    try:
        return turn_of(request.messages, SearchLog(1)).question
    except InputError:
        return ""


def _as_response(result: Any) -> ModelResponse[Any]:
    if isinstance(result, ModelResponse):
        return result
    if isinstance(result, AIMessage):
        return ModelResponse(result=[result])
    if isinstance(result, ExtendedModelResponse):
        return result.model_response
    model_response = getattr(result, "model_response", None)
    if isinstance(model_response, ModelResponse):
        return model_response
    raise UnreadableOutputError(f"the model call returned {type(result).__name__}")


def _last_ai(response: ModelResponse[Any]) -> AIMessage | None:
    return next((m for m in reversed(response.result) if isinstance(m, AIMessage)), None)


def _after_tools(messages: list[Any]) -> bool:
    return bool(messages) and isinstance(messages[-1], ToolMessage)


async def _cancel(tasks: Mapping[int, asyncio.Future[Any]]) -> None:
    for task in tasks.values():
        task.cancel()
    for task in tasks.values():
        with contextlib.suppress(BaseException):
            await task


def _chosen(
    state: RequestState | None, responses: Mapping[int, ModelResponse[Any]]
) -> ModelResponse[Any] | None:
    verification = state.verification if state is not None else None
    index = verification.selection.sample_index if verification is not None else None
    if index is None:
        return responses.get(0)
    return responses.get(index)


def _mark(message: BaseMessage | None) -> dict[str, Any] | None:
    if not isinstance(message, AIMessage):
        return None
    mark = message.response_metadata.get(MARK)
    return dict(mark) if isinstance(mark, Mapping) else None


def _checkpointed() -> bool:
    """Whether the running graph has a checkpointer (an interrupt can be resumed)."""
    try:
        configurable = get_config().get("configurable") or {}
    except RuntimeError:
        return False
    return configurable.get("__pregel_checkpointer") is not None


def _invalid_resume(error: BaseException) -> None:
    """Mark a refused resume value as LangGraph marks one its schema refuses: the interrupt is
    not answered, so the reviewer can answer it again."""
    try:
        from langgraph.errors import _mark_invalid_resume
    except ImportError:  # an older LangGraph: the value is kept and the turn fails
        return
    _mark_invalid_resume(error)


def _write_stream(chunk: dict[str, Any]) -> None:
    """The turn's Response on the graph's ``custom`` stream (when one is open)."""
    try:
        writer = get_stream_writer()
    except RuntimeError:
        return
    try:
        writer(chunk)
    except Exception:  # a stream consumer never fails the turn
        logger.exception("tracerag middleware: could not write the Response to the stream")
