"""The LangChain Runnable both front doors are: every surface runs a request as one run.

Every surface (``invoke``, ``ainvoke``, ``stream``, ``astream``, ``astream_events``,
``astream_log``, ``batch``, ``abatch``, ``transform``, ``atransform``) runs a request as one
LangChain run of its own, through the run loop (``tracerag.runner.run``). The callback handlers
the caller passes (``config["callbacks"]``, or those of the runnable that calls it) hear that
run only: its start, a ``tracerag.stage`` custom event after each stage, a ``tracerag.answer``
event with the text of an answer the route releases, and its end with the caller's
``Response``. tracerag's own calls (retriever, model, the wrapped app's runs) are children of
that run without the caller's handlers (``inner_config``), so nothing a sample drew reaches the
caller before it is verified, and a withheld answer never does.

``stream`` / ``astream`` also take LangGraph's ``stream_mode`` (one or a list), ``subgraphs`` and
``version``: the chunks are projections of the stage events and the Response
(``tracerag.events.StreamProjection``). ``astream_events`` / ``stream_events`` with
``version="v3"`` return a run stream over the same projections. The stream then carries the
request's own run just as ``ainvoke`` does.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import logging
from collections.abc import AsyncIterator, Awaitable, Iterator
from typing import Any, Literal, overload

from langchain_core.callbacks import AsyncCallbackManager, AsyncCallbackManagerForChainRun
from langchain_core.runnables import Runnable, RunnableConfig
from langchain_core.runnables.config import (
    ensure_config,
    patch_config,
    var_child_runnable_config,
)
from langchain_core.runnables.schema import StreamEvent

from tracerag._choices import Stage, check_options
from tracerag._conversation import rewrite_turn
from tracerag._routing import EscalationHandler
from tracerag._runner import SETTINGS_SINK, prepare, run
from tracerag._settings import RecordSink, Settings
from tracerag._state import RequestInput
from tracerag._sync import iterate_sync, run_sync
from tracerag.contract import Response
from tracerag.errors import ConfigurationError
from tracerag.events import (
    ANSWER_EVENT,
    STAGE_EVENT,
    V3_MODES,
    AsyncRequestStream,
    CallerStages,
    RequestStream,
    StageEvent,
    StageListener,
    StreamMode,
    StreamProjection,
    answer_data,
    stream_modes,
    tell,
)
from tracerag.stages._table import Source, Step, steps_for

__all__ = [
    "CALL_OPTIONS",
    "STREAM_OPTIONS",
    "StagedRunnable",
    "caller_handlers",
    "inner_config",
    "stream_options",
]

logger = logging.getLogger("tracerag")

#: The keyword arguments every surface takes for one call: ``arun``'s hooks.
CALL_OPTIONS = frozenset({"on_stage", "record_sink"})
#: What ``stream`` / ``astream`` take besides: LangGraph's stream options
STREAM_OPTIONS = CALL_OPTIONS | {"stream_mode", "subgraphs", "version"}
#: The namespace of every chunk (``subgraphs=True``, ``version="v2"``): the request's own run.
#: tracerag's inner runs (the app's, the samples') are never the caller's subgraphs: what they
#: stream is unverified.
ROOT_NAMESPACE: tuple[str, ...] = ()


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


class _CallerEvents:
    """The stage listener of a request in a LangChain run: custom events for the caller, then
    the listener given to ``arun``. Neither can fail the request."""

    def __init__(
        self, manager: AsyncCallbackManager, run_id: Any, listener: StageListener | None
    ) -> None:
        self._manager = manager
        self._run_id = run_id
        self._listener = listener
        self._order = CallerStages()

    async def __call__(self, event: StageEvent) -> None:
        for told in self._order.take(event):  # the verify stage's once the route is known
            try:
                await self._dispatch(told)
            except Exception:  # a handler with raise_error: logged, the request goes on
                logger.exception("tracerag: a callback handler failed on %s", told.stage)
        if self._listener is not None:  # the caller's own hook hears every stage as it ends
            await tell(self._listener, event)

    async def _dispatch(self, event: StageEvent) -> None:
        if not self._manager.handlers:
            return
        await self._manager.on_custom_event(STAGE_EVENT, event.to_dict(), run_id=self._run_id)
        if event.stage is not Stage.ASSEMBLE:
            return
        data = answer_data(event.state)
        if data is not None:
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
        prepare()  # once per process: no first request pays for (or hides) the set-up

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
    def escalation(self) -> EscalationHandler:
        """The handler that receives escalated and review-flagged requests."""
        return self._settings.escalation

    def parse_input(self, input: Any) -> RequestInput:
        """The checked input; ``InputError`` when it is not a valid question."""
        return RequestInput.parse(input, max_chars=self._settings.max_question_chars)

    async def read_conversation(
        self, request: RequestInput, config: RunnableConfig | None
    ) -> RequestInput:
        """The request with the conversation it belongs to, where ``config`` names one the
        front door can read (wrap(): the app's checkpointed thread, its message history); the
        pipeline's conversation is its input's ``chat_history``."""
        return request

    async def arun(
        self,
        input: Any,
        config: RunnableConfig | None = None,
        *,
        on_stage: StageListener | None = None,
        record_sink: RecordSink | None = SETTINGS_SINK,
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
        """Answer one question. The keyword arguments are ``arun``'s hooks for this call
        (``on_stage``, ``record_sink``; also as bound by ``.bind(...)``); any other is refused
        with ``TypeError``, never dropped."""
        check_options("ainvoke", kwargs, CALL_OPTIONS)
        return await self.arun(input, config, **kwargs)

    def invoke(self, input: Any, config: RunnableConfig | None = None, **kwargs: Any) -> Response:
        """Answer one question from sync code (see ``ainvoke``)."""
        check_options("invoke", kwargs, CALL_OPTIONS)
        return run_sync(lambda: self.ainvoke(input, config, **kwargs))

    def stream(
        self, input: Any, config: RunnableConfig | None = None, **kwargs: Any
    ) -> Iterator[Any]:
        """``astream`` from sync code: one Response chunk, or the chunks of ``stream_mode``,
        handed over as the request makes them."""
        check_options("stream", kwargs, STREAM_OPTIONS)
        if _streams_modes(kwargs):
            stream_options("stream", kwargs)  # refused under this name, before any work
            yield from iterate_sync(lambda: self.astream(input, config, **kwargs))
            return
        yield self.invoke(input, config, **_hooks(kwargs))

    async def astream(
        self, input: Any, config: RunnableConfig | None = None, **kwargs: Any
    ) -> AsyncIterator[Any]:
        """One chunk: the Response, once the request is verified, routed and recorded; or, with
        LangGraph's ``stream_mode`` (``"values"``, ``"updates"``, ``"messages"``, ``"custom"``,
        ``"debug"``, or a list: ``(mode, chunk)``), ``subgraphs=True`` (``(namespace, ...)``)
        and ``version="v2"`` (``{"type", "ns", "data"}`` parts), the projections of each stage
        and of the Response (``tracerag.events.StreamProjection``).

        Nothing of a sample streams: the caller's callbacks (and ``astream_events``) hear the
        request's own run, its ``tracerag.stage`` events and, for a released answer, one
        ``tracerag.answer`` event, never the app's or the model's inner runs; the ``messages``
        chunk is the released answer, once verified. The other keyword arguments are ``arun``'s
        hooks, as for ``ainvoke``.
        """
        check_options("astream", kwargs, STREAM_OPTIONS)
        if _streams_modes(kwargs):
            modes, as_list, subgraphs, parts = stream_options("astream", kwargs)
            async for mode, chunk in self._modes(input, config, modes, _hooks(kwargs)):
                yield _shaped(mode, chunk, as_list=as_list, subgraphs=subgraphs, parts=parts)
            return

        async def once() -> AsyncIterator[Any]:
            yield input

        answer = functools.partial(
            self._stream_answer, caller=caller_handlers(config), hooks=_hooks(kwargs)
        )
        async for chunk in self._atransform_stream_with_config(once(), answer, config):
            yield chunk

    async def _modes(
        self,
        input: Any,
        config: RunnableConfig | None,
        modes: tuple[StreamMode, ...],
        hooks: dict[str, Any],
    ) -> AsyncIterator[tuple[StreamMode, Any]]:
        """The request as ``(mode, chunk)`` pairs, each as soon as its stage has ended.

        The request runs as ``ainvoke`` runs it (its own LangChain run, the caller's callbacks
        hearing that run only), in a task of its own; stopping the iteration cancels it.
        """
        projection = StreamProjection(modes)
        heard: asyncio.Queue[StageEvent | None] = asyncio.Queue()
        listener: StageListener | None = hooks.get("on_stage")

        async def on_stage(event: StageEvent) -> None:
            heard.put_nowait(event)
            if listener is not None:
                await tell(listener, event)

        options = {**hooks, "on_stage": on_stage}
        task = asyncio.ensure_future(self.arun(input, config, **options))
        task.add_done_callback(lambda _: heard.put_nowait(None))
        try:
            while (event := await heard.get()) is not None:
                for part in projection.stage(event):
                    yield part
            response = task.result()  # what failed the request is raised here
            for part in projection.response(response):
                yield part
        finally:
            if not task.done():  # the caller stopped reading: stop the request
                task.cancel()
                with contextlib.suppress(asyncio.CancelledError):
                    await task

    @overload
    def astream_events(
        self,
        input: Any,
        config: RunnableConfig | None = None,
        *,
        version: Literal["v1", "v2"] = "v2",
        **kwargs: Any,
    ) -> AsyncIterator[StreamEvent]: ...

    @overload
    def astream_events(
        self,
        input: Any,
        config: RunnableConfig | None = None,
        *,
        version: Literal["v3"],
        **kwargs: Any,
    ) -> Awaitable[AsyncRequestStream]: ...

    def astream_events(
        self,
        input: Any,
        config: RunnableConfig | None = None,
        *,
        version: Literal["v1", "v2", "v3"] = "v2",
        **kwargs: Any,
    ) -> AsyncIterator[StreamEvent] | Awaitable[AsyncRequestStream]:
        """LangChain's event stream of the request's own run (``v1``, ``v2``), or, for
        ``version="v3"``, an awaitable of the request's run stream (``AsyncRequestStream``:
        protocol events; ``values``, ``updates``, ``custom`` and ``messages`` projections;
        ``await run.output()`` for the Response). The keyword arguments of ``v3`` are
        ``arun``'s hooks; ``stream_mode`` and ``subgraphs`` are the run stream's own."""
        if version == "v3":
            check_options("astream_events", kwargs, CALL_OPTIONS)
            return self._astream_events_v3(input, config, kwargs)
        return super().astream_events(input, config, version=version, **kwargs)

    async def _astream_events_v3(
        self, input: Any, config: RunnableConfig | None, hooks: dict[str, Any]
    ) -> AsyncRequestStream:
        return AsyncRequestStream(self._modes(input, config, V3_MODES, hooks))

    # LangChain types the v3 result Iterator[Any]; the run stream is iterable (and has its
    # projections) as LangGraph's GraphRunStream is, not an iterator itself
    @overload  # type: ignore[override]
    def stream_events(
        self,
        input: Any,
        config: RunnableConfig | None = None,
        *,
        version: Literal["v1", "v2"] = "v2",
        **kwargs: Any,
    ) -> Iterator[StreamEvent]: ...

    @overload
    def stream_events(
        self,
        input: Any,
        config: RunnableConfig | None = None,
        *,
        version: Literal["v3"],
        **kwargs: Any,
    ) -> RequestStream: ...

    def stream_events(
        self,
        input: Any,
        config: RunnableConfig | None = None,
        *,
        version: Literal["v1", "v2", "v3"] = "v2",
        **kwargs: Any,
    ) -> Iterator[StreamEvent] | RequestStream:
        """``astream_events(version="v3")`` from sync code: the request's run stream
        (``RequestStream``), advanced as the caller reads it. LangChain has no sync ``v1`` /
        ``v2`` event stream: those raise ``NotImplementedError`` as for every Runnable."""
        if version == "v3":
            check_options("stream_events", kwargs, CALL_OPTIONS)
            return RequestStream(iterate_sync(lambda: self._modes(input, config, V3_MODES, kwargs)))
        return super().stream_events(input, config, version=version, **kwargs)

    async def _stream_answer(
        self,
        inputs: AsyncIterator[Any],
        run_manager: AsyncCallbackManagerForChainRun,
        config: RunnableConfig,
        *,
        caller: frozenset[int],
        hooks: dict[str, Any],
    ) -> AsyncIterator[Response]:
        value: Any = None
        async for chunk in inputs:  # one input (atransform hands over the whole of it)
            value = chunk
        yield await self._answer(value, run_manager, config, caller=caller, **hooks)

    async def _answer(
        self,
        input: Any,
        run_manager: AsyncCallbackManagerForChainRun,
        config: RunnableConfig,
        *,
        caller: frozenset[int],
        on_stage: StageListener | None = None,
        record_sink: RecordSink | None = SETTINGS_SINK,
    ) -> Response:
        """The request inside its LangChain run: stages, record, ticket, caller's Response.

        ``config`` is the run's child config (the caller's callbacks with it). The stages run
        with ``inner_config``: the same, less the caller's handlers, so the app's and the
        model's runs reach tracerag's own capture and LangSmith, never the caller.
        """
        request = await self.read_conversation(self.parse_input(input), config)
        request = await rewrite_turn(request, self._settings.question_rewriter, config)
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
                agent=getattr(self._source, "agent_name", None),  # a Source may name its agent
            )
        finally:
            var_child_runnable_config.reset(token)

    @property
    def InputType(self) -> Any:
        return str | dict

    @property
    def OutputType(self) -> type[Response]:
        return Response


def _hooks(options: dict[str, Any]) -> dict[str, Any]:
    """The ``arun`` hooks among a stream call's keyword arguments."""
    return {key: value for key, value in options.items() if key in CALL_OPTIONS}


def _streams_modes(options: dict[str, Any]) -> bool:
    """Whether a stream call asks for LangGraph's stream modes (else: one Response chunk)."""
    return any(options.get(key) is not None for key in ("stream_mode", "subgraphs", "version"))


def stream_options(
    caller: str, options: dict[str, Any]
) -> tuple[tuple[StreamMode, ...], bool, bool, bool]:
    """The modes, whether they came as a list, ``subgraphs`` and whether chunks are v2 parts.

    ``stream_mode`` defaults to ``"values"`` (LangGraph's default for a graph) when only
    ``subgraphs`` or ``version`` is given. ``ConfigurationError`` for a value it does not take.
    """
    mode = options.get("stream_mode")
    modes, as_list = stream_modes(caller, "values" if mode is None else mode)
    subgraphs = options.get("subgraphs")
    if subgraphs is None:
        subgraphs = False
    if not isinstance(subgraphs, bool):
        raise ConfigurationError(f"{caller}() got subgraphs={subgraphs!r}; it is True or False")
    version = options.get("version")
    if version not in (None, "v1", "v2"):
        raise ConfigurationError(
            f"{caller}() got version={version!r}; the stream versions are 'v1' (chunks) and "
            "'v2' ({'type', 'ns', 'data'} parts); for the v3 run stream call "
            "astream_events(version='v3')"
        )
    return modes, as_list, subgraphs, version == "v2"


def _shaped(mode: StreamMode, chunk: Any, *, as_list: bool, subgraphs: bool, parts: bool) -> Any:
    """A chunk as LangGraph streams it for the options given."""
    if parts:
        part: dict[str, Any] = {"type": mode, "ns": ROOT_NAMESPACE, "data": chunk}
        if mode == "values":
            part["interrupts"] = ()
        return part
    if as_list:
        return (ROOT_NAMESPACE, mode, chunk) if subgraphs else (mode, chunk)
    return (ROOT_NAMESPACE, chunk) if subgraphs else chunk
