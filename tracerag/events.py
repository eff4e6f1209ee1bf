"""What a request tells while it runs: a ``StageEvent`` after each stage, for listeners.

``RAGPipeline.arun(..., on_stage=listener)`` (and ``wrap()``'s) calls the listener with a
``StageEvent`` after each stage, skipped ones included; the server streams them. Every
LangChain surface (``astream_events`` included) sends the same events to the caller's callback
handlers as custom events: ``STAGE_EVENT`` after each stage, with ``StageEvent.to_dict()`` as
its data, and ``ANSWER_EVENT`` once an answer is verified and released (routes pass and
review), with ``answer_data()``. A withheld answer's text is never sent.

The stream modes (``stream(..., stream_mode=...)``, LangGraph's names) are projections of the same
events (``StreamProjection``), and ``astream_events(version="v3")`` / ``stream_events(version=
"v3")`` return a run stream over them (``AsyncRequestStream``, ``RequestStream``): the stage
signals, the released answer once verified, and the Response.
"""

from __future__ import annotations

import asyncio
import contextlib
import inspect
import logging
import time
from collections.abc import AsyncIterator, Awaitable, Callable, Iterator
from dataclasses import dataclass, replace
from datetime import datetime, timezone
from types import TracebackType
from typing import TYPE_CHECKING, Any, Literal, get_args

from tracerag._choices import Route, Stage
from tracerag._declare import stream_signals
from tracerag._state import RequestState
from tracerag.contract import WITHHELD_VERDICT, Response
from tracerag.errors import ConfigurationError

if TYPE_CHECKING:
    from langchain_core.language_models.chat_model_stream import (
        AsyncChatModelStream,
        ChatModelStream,
    )
    from langchain_core.messages import AIMessageChunk

__all__ = [
    "ANSWER_EVENT",
    "STAGE_EVENT",
    "STREAM_MODES",
    "AsyncRequestStream",
    "CallerStages",
    "RequestStream",
    "StageEvent",
    "StageListener",
    "StreamMode",
]

logger = logging.getLogger("tracerag")

#: The custom event (``on_custom_event``, ``astream_events`` v2) sent after each stage; its data
#: is ``StageEvent.to_dict()``: the stage, the request and trace ids, timing and key signals.
STAGE_EVENT = "tracerag.stage"
#: The custom event that carries a released answer's text (routes pass and review), sent once
#: it is verified and routed: ``{request_id, trace_id, decision, status, confidence, text}``.
ANSWER_EVENT = "tracerag.answer"


@dataclass(frozen=True)
class StageEvent:
    """What a listener hears after each stage, skipped ones included."""

    stage: Stage
    skipped: bool
    duration_s: float | None
    state: RequestState
    #: the route withheld the answer: the verify stage's signals, measured on that answer, are
    #: kept to its verdicts (``contract.WITHHELD_VERDICT``), as the caller view keeps them
    withheld: bool = False

    @property
    def request_id(self) -> str:
        return self.state.request_id

    @property
    def trace_id(self) -> str | None:
        return self.state.trace_id

    @property
    def output(self) -> Any:
        """The stage's typed output (None when it was skipped)."""
        return self.state.output(self.stage)

    def signals(self) -> dict[str, Any]:
        """The stage's key signals, JSON-able (empty when it was skipped): those its output
        declares for the stream (``SIGNALS``, ``stream=``)."""
        output = None if self.skipped else self.output
        found = stream_signals(output) if output is not None else {}
        if self.withheld and self.stage is Stage.VERIFY:
            return {k: v for k, v in found.items() if k in WITHHELD_VERDICT}
        return found

    def to_dict(self) -> dict[str, Any]:
        """The event as a stream sends it: stage, ids, skipped, duration and signals."""
        return {
            "stage": str(self.stage),
            "request_id": self.request_id,
            "trace_id": self.trace_id,
            "skipped": self.skipped,
            "duration_s": self.duration_s,
            "signals": self.signals(),
        }


class CallerStages:
    """A request's stage events in the order and form a caller may see them.

    The verify stage's signals are measured on the candidate answer (its citation scores, the
    ids it cited), and whether that answer is released is known only once assemble has routed
    it: the verify event waits for the assemble event and is told then, kept to its verdicts
    when the answer is withheld. A request that fails before assemble routes nothing, and its
    verify event is never told: nothing measured on an answer no one released reaches the
    caller. Every other event is told as it comes.
    """

    def __init__(self) -> None:
        self._held: StageEvent | None = None

    def take(self, event: StageEvent) -> list[StageEvent]:
        """The events to tell the caller now, in order."""
        if event.stage is Stage.VERIFY and not event.skipped:
            self._held = event
            return []
        if event.stage is Stage.ASSEMBLE and self._held is not None:
            held, self._held = self._held, None
            if released_answer(event.state) is None:
                held = replace(held, withheld=True)
            return [held, event]
        return [event]


#: Called with each ``StageEvent``; may be async. What it raises is logged, never re-raised.
StageListener = Callable[[StageEvent], "Awaitable[None] | None"]


async def tell(listener: StageListener, event: StageEvent) -> None:
    """Hand an event to a listener (awaited when async); what it raises is logged only."""
    try:
        result = listener(event)
        if inspect.isawaitable(result):
            await result
    except Exception:
        logger.exception("tracerag: on_stage listener failed after %s", event.stage)


def released_answer(state: RequestState) -> str | None:
    """The answer's text when the route releases it (pass, review), else None."""
    decision = state.decision
    if decision is None or decision.decision not in (Route.PASS, Route.REVIEW):
        return None
    return decision.answer


def answer_data(state: RequestState) -> dict[str, Any] | None:
    """The ``ANSWER_EVENT`` data of a finished request; None when no answer is released."""
    text = released_answer(state)
    decision = state.decision
    if text is None or decision is None:
        return None
    return {
        "request_id": state.request_id,
        "trace_id": state.trace_id,
        "decision": str(decision.decision),
        "status": decision.status,
        "confidence": decision.confidence,
        "text": text,
    }


# -- stream modes: LangGraph-shaped projections of a request's events -------------------------

#: The stream modes ``stream`` / ``astream`` take (LangGraph's names): ``values`` the request's
#: state as it grows, ``updates`` one ``{stage: signals}`` per stage that ran then
#: ``{"response": Response}``, ``messages`` the released answer as ``(AIMessageChunk, metadata)``
#: once verified, ``custom`` the ``tracerag.stage`` / ``tracerag.answer`` events, ``debug`` a
#: ``task_result`` per stage.
StreamMode = Literal["values", "updates", "messages", "custom", "debug"]
STREAM_MODES: tuple[StreamMode, ...] = get_args(StreamMode)
#: The node name a released answer's message carries (``metadata["langgraph_node"]``)
ANSWER_NODE = str(Stage.ASSEMBLE)
#: LangGraph's modes tracerag has nothing true to put in: a request keeps no checkpoints (its
#: audit record is what it keeps) and runs no graph tasks a caller could resume
_REFUSED_MODES = {
    "checkpoints": "a request keeps no checkpoints: its audit record is what it keeps",
    "tasks": "a request's stages are no graph tasks: 'debug' has a task_result per stage",
}


def stream_modes(caller: str, value: object) -> tuple[tuple[StreamMode, ...], bool]:
    """The modes asked for, and whether they came as a list (chunks are then ``(mode, chunk)``).

    ``ConfigurationError`` naming the allowed modes for anything else.
    """
    as_list = isinstance(value, (list, tuple))
    asked = list(value) if isinstance(value, (list, tuple)) else [value]
    modes: list[StreamMode] = []
    for mode in asked:
        if not isinstance(mode, str) or mode not in STREAM_MODES:
            why = _REFUSED_MODES.get(mode) if isinstance(mode, str) else None
            allowed = ", ".join(repr(m) for m in STREAM_MODES)
            raise ConfigurationError(
                f"{caller}() got stream_mode={mode!r}"
                + (f" ({why})" if why else "")
                + f"; the stream modes are {allowed}, or a list of them"
            )
        if mode not in modes:
            modes.append(mode)
    if not modes:
        raise ConfigurationError(f"{caller}() got stream_mode=[]: name at least one mode")
    return tuple(modes), as_list


def answer_message(state: RequestState) -> tuple[AIMessageChunk, dict[str, Any]] | None:
    """The released answer as a ``messages`` stream chunk, None when the route withholds it."""
    data = answer_data(state)
    if data is None:
        return None
    from langchain_core.messages import AIMessageChunk

    message = AIMessageChunk(content=data["text"], id=f"tracerag-{state.request_id}")
    metadata = {
        "langgraph_node": ANSWER_NODE,
        "langgraph_step": len(Stage),
        "tracerag_request_id": data["request_id"],
        "tracerag_trace_id": data["trace_id"],
        "tracerag_decision": data["decision"],
        "tracerag_status": data["status"],
        "tracerag_confidence": data["confidence"],
    }
    return message, metadata


class StreamProjection:
    """A request's stage events and Response as the chunks of the modes asked for.

    Every chunk holds what the stage events hold (ids, numbers, verdicts: never a sample's
    text) and, once the route released it, the verified answer; a withheld answer's text is in
    none of them (the Response is the caller view).
    """

    def __init__(self, modes: tuple[StreamMode, ...]) -> None:
        self._modes = modes
        self._values: dict[str, Any] = {}
        self._step = 0
        self._order = CallerStages()

    def stage(self, event: StageEvent) -> list[tuple[StreamMode, Any]]:
        """The chunks one stage event makes, in the order of the modes asked for (the verify
        stage's once the route is known: ``CallerStages``)."""
        return [part for told in self._order.take(event) for part in self._told(told)]

    def _told(self, event: StageEvent) -> list[tuple[StreamMode, Any]]:
        self._step += 1
        signals = event.signals()
        if not self._values:
            self._values = {
                "request_id": event.request_id,
                "trace_id": event.trace_id,
                "question": event.state.question,
            }
        if not event.skipped:
            self._values = {**self._values, str(event.stage): signals}
        out: list[tuple[StreamMode, Any]] = []
        for mode in self._modes:
            if mode == "custom":
                out.append((mode, {"name": STAGE_EVENT, "data": event.to_dict()}))
                answer = answer_data(event.state) if event.stage is Stage.ASSEMBLE else None
                if answer is not None:
                    out.append((mode, {"name": ANSWER_EVENT, "data": answer}))
            elif mode == "debug":
                out.append((mode, self._task_result(event, signals)))
            elif event.skipped:
                continue
            elif mode == "updates":
                out.append((mode, {str(event.stage): signals}))
            elif mode == "values":
                out.append((mode, dict(self._values)))
            elif mode == "messages" and event.stage is Stage.ASSEMBLE:
                message = answer_message(event.state)
                if message is not None:
                    out.append((mode, message))
        return out

    def response(self, response: Response) -> list[tuple[StreamMode, Any]]:
        """The last chunks: the Response (the caller view) in ``values`` and ``updates``."""
        out: list[tuple[StreamMode, Any]] = []
        for mode in self._modes:
            if mode == "updates":
                out.append((mode, {"response": response}))
            elif mode == "values":
                self._values = {**self._values, "response": response}
                out.append((mode, dict(self._values)))
        return out

    def _task_result(self, event: StageEvent, signals: dict[str, Any]) -> dict[str, Any]:
        # the error's type only: a message may quote what a model or an app returned
        errors = [e.type for e in event.state.errors if e.stage == str(event.stage)]
        return {
            "type": "task_result",
            "timestamp": datetime.now(timezone.utc).isoformat(),
            "step": self._step,
            "payload": {
                "id": f"{event.request_id}:{event.stage}",
                "name": str(event.stage),
                "error": errors[0] if errors else None,
                "interrupts": [],
                "result": signals,
                "skipped": event.skipped,
                "duration_s": event.duration_s,
            },
        }


# -- astream_events(version="v3"): a run stream over a request ------------------------------

#: The modes a v3 run stream is built from: everything but ``debug``
V3_MODES: tuple[StreamMode, ...] = ("values", "updates", "messages", "custom")


def protocol_event(method: str, data: Any) -> dict[str, Any]:
    """A v3 protocol event (LangGraph's shape): ``{"type": "event", "method", "params"}``."""
    return {
        "type": "event",
        "method": method,
        "params": {"namespace": [], "timestamp": int(time.time() * 1000), "data": data},
    }


def message_events(message: AIMessageChunk) -> list[dict[str, Any]]:
    """The content-block protocol events of a released answer: one text block, whole."""
    text = str(message.content)
    block = {"type": "text", "text": text}
    return [
        {"event": "message-start", "role": "ai", "id": message.id or ""},
        {"event": "content-block-start", "index": 0, "content": {"type": "text", "text": ""}},
        {"event": "content-block-delta", "index": 0, "delta": {"type": "text-delta", "text": text}},
        {"event": "content-block-finish", "index": 0, "content": block},
        {"event": "message-finish"},
    ]


class _RunLog:
    """The buffered events of one v3 run: each projection reads it with its own cursor."""

    def __init__(self) -> None:
        self.items: list[tuple[str, Any]] = []  # (projection, item); "events" for the log
        self.done = False
        self.error: BaseException | None = None
        self.response: Response | None = None

    def take(self, mode: str, chunk: Any, make_stream: Callable[[], Any]) -> None:
        if mode == "messages":
            message, metadata = chunk
            events = message_events(message)
            stream = make_stream()
            for event in events:
                stream.dispatch(event)
            for event in events:
                self.items.append(("events", protocol_event("messages", (event, metadata))))
            self.items.append(("messages", stream))
            return
        if mode in ("values", "updates") and isinstance(chunk, dict):
            response = chunk.get("response")
            if isinstance(response, Response):
                self.response = response
        self.items.append(("events", protocol_event(mode, chunk)))
        self.items.append((mode, chunk))

    def check(self) -> None:
        """Raise what failed the request, if it failed."""
        if self.error is not None:
            raise self.error

    def result(self) -> Response:
        self.check()
        assert self.response is not None, "a request that ended has a Response"
        return self.response


class RequestStream:
    """The run stream ``stream_events(version="v3")`` returns: a request, driven by the caller.

    Shaped as LangGraph's ``GraphRunStream``: iterating it yields protocol events
    (``{"type": "event", "method": "values" | "updates" | "messages" | "custom", "params":
    {"namespace": [], "timestamp", "data"}}``); ``values``, ``updates`` and ``custom`` iterate
    the chunks of those stream modes; ``messages`` yields one ``ChatModelStream`` per released
    answer, only once it is verified (none when the route withholds it); ``output`` is the
    Response. Each projection replays the run from its start, so several can be read; the
    request advances only while one is read (or ``output`` is asked for).
    """

    def __init__(self, chunks: Iterator[tuple[StreamMode, Any]]) -> None:
        self._chunks = chunks
        self._log = _RunLog()

    def _pump(self) -> bool:
        if self._log.done:
            return False
        try:
            mode, chunk = next(self._chunks)
        except StopIteration:
            self._log.done = True
            return False
        except Exception as error:
            self._log.done = True
            self._log.error = error
            return False
        self._log.take(mode, chunk, _chat_model_stream)
        return True

    def _read(self, name: str) -> Iterator[Any]:
        cursor = 0
        while True:
            while cursor < len(self._log.items):
                kind, item = self._log.items[cursor]
                cursor += 1
                if kind == name:
                    yield item
            if not self._pump() and cursor >= len(self._log.items):
                self._log.check()
                return

    def __iter__(self) -> Iterator[dict[str, Any]]:
        return self._read("events")

    @property
    def values(self) -> Iterator[dict[str, Any]]:
        """The request's state after each stage that ran, then with its Response."""
        return self._read("values")

    @property
    def updates(self) -> Iterator[dict[str, Any]]:
        """``{stage: signals}`` per stage that ran, then ``{"response": Response}``."""
        return self._read("updates")

    @property
    def custom(self) -> Iterator[dict[str, Any]]:
        """``{"name": "tracerag.stage" | "tracerag.answer", "data": ...}`` per event."""
        return self._read("custom")

    @property
    def messages(self) -> Iterator[ChatModelStream]:
        """The released answer as a finished ``ChatModelStream`` (``.text``, ``.output``)."""
        return self._read("messages")

    @property
    def output(self) -> Response:
        """Run the request to its end and return its Response (raises what failed it)."""
        while self._pump():
            pass
        return self._log.result()

    def abort(self) -> None:
        """Stop the request early: it is cancelled, and its audit record says so."""
        self._log.done = True
        close = getattr(self._chunks, "close", None)
        if close is not None:
            close()

    def __enter__(self) -> RequestStream:
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.abort()


class AsyncRequestStream:
    """The run stream ``astream_events(version="v3")`` resolves to: ``RequestStream``'s async
    twin (``async for`` over it or its projections; ``await run.output()``)."""

    def __init__(self, chunks: AsyncIterator[tuple[StreamMode, Any]]) -> None:
        self._chunks = chunks
        self._log = _RunLog()
        self._lock = asyncio.Lock()
        self._pull: asyncio.Future[tuple[StreamMode, Any]] | None = None
        self._aborted = False

    async def _pump(self) -> bool:
        async with self._lock:  # one pull at a time; a waiter finds the log grown
            if self._log.done:
                return False
            # the pull is a task of its own, so that abort() can cancel it mid-stage
            self._pull = asyncio.ensure_future(self._chunks.__anext__())
            try:
                mode, chunk = await self._pull
            except StopAsyncIteration:
                self._log.done = True
                return False
            except asyncio.CancelledError:
                if not self._aborted:  # the reader itself was cancelled: stop the pull too
                    self._pull.cancel()
                    raise
                self._log.done = True
                return False
            except Exception as error:
                self._log.done = True
                self._log.error = error
                return False
            finally:
                self._pull = None
            self._log.take(mode, chunk, _async_chat_model_stream)
            return True

    async def _read(self, name: str) -> AsyncIterator[Any]:
        cursor = 0
        while True:
            while cursor < len(self._log.items):
                kind, item = self._log.items[cursor]
                cursor += 1
                if kind == name:
                    yield item
            if not await self._pump() and cursor >= len(self._log.items):
                self._log.check()
                return

    def __aiter__(self) -> AsyncIterator[dict[str, Any]]:
        return self._read("events")

    @property
    def values(self) -> AsyncIterator[dict[str, Any]]:
        """The request's state after each stage that ran, then with its Response."""
        return self._read("values")

    @property
    def updates(self) -> AsyncIterator[dict[str, Any]]:
        """``{stage: signals}`` per stage that ran, then ``{"response": Response}``."""
        return self._read("updates")

    @property
    def custom(self) -> AsyncIterator[dict[str, Any]]:
        """``{"name": "tracerag.stage" | "tracerag.answer", "data": ...}`` per event."""
        return self._read("custom")

    @property
    def messages(self) -> AsyncIterator[AsyncChatModelStream]:
        """The released answer as a finished ``AsyncChatModelStream``."""
        return self._read("messages")

    async def output(self) -> Response:
        """Run the request to its end and return its Response (raises what failed it)."""
        while await self._pump():
            pass
        return self._log.result()

    async def abort(self) -> None:
        """Stop the request early: it is cancelled, and its audit record says so."""
        self._aborted = True
        self._log.done = True
        pull = self._pull
        if pull is not None and not pull.done():  # a reader waits on a stage: stop it there
            pull.cancel()
            with contextlib.suppress(asyncio.CancelledError, StopAsyncIteration):
                await pull
        async with self._lock:  # no pull runs now; the request's task ends with the iterator
            close = getattr(self._chunks, "aclose", None)
            if close is not None:
                await close()

    async def __aenter__(self) -> AsyncRequestStream:
        return self

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        await self.abort()


def _chat_model_stream() -> ChatModelStream:
    from langchain_core.language_models.chat_model_stream import ChatModelStream

    return ChatModelStream(node=ANSWER_NODE)


def _async_chat_model_stream() -> AsyncChatModelStream:
    from langchain_core.language_models.chat_model_stream import AsyncChatModelStream

    return AsyncChatModelStream(node=ANSWER_NODE)
