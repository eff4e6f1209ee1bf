"""What a wrapped app keeps of a turn: committed once the turn is verified and routed.

An app that keeps state across turns keeps what the caller may see, never a withheld answer:

- a LangGraph graph with its own checkpointer (``create_agent(..., checkpointer=...)``) runs the
  request on a private thread of its checkpointer, seeded with the caller's thread as it was
  (``_runs``). Once the request is routed its checkpoints are copied onto the caller's thread,
  ids and parents as they are, so ``get_state``, ``get_state_history`` and the next turn see
  the turn as the app ran it; for a withheld answer, the answer's message (and any field that
  holds the answer's text) is replaced by the withheld message in every checkpoint and in the
  pending writes that ``get_state_history`` shows as task results. A turn whose state still
  holds the withheld text elsewhere is not committed at all, and the Response says so;
- a ``RunnableWithMessageHistory`` runs with a read-only copy of its history, and the turn's
  human message and one AI message (the verified answer, or the withheld message) are added to
  the real history afterwards.

A request that fails commits nothing: the caller's thread and history are as they were.
"""

from __future__ import annotations

import dataclasses
import functools
import json
import warnings
from collections import defaultdict
from collections.abc import Callable, Mapping, Sequence
from contextvars import ContextVar
from dataclasses import dataclass, field
from typing import Any, Protocol

from langchain_core.chat_history import BaseChatMessageHistory
from langchain_core.messages import AIMessage, BaseMessage, ToolMessage
from langchain_core.runnables import Runnable, RunnableConfig
from langchain_core.runnables.config import var_child_runnable_config
from langchain_core.runnables.history import RunnableWithMessageHistory
from pydantic import BaseModel

from tracerag._runner import Interrupted
from tracerag._withheld import withheld_text
from tracerag.contract import (
    AppInterrupt,
    Response,
    SignalDetail,
    Versions,
    validate_response,
    withheld,
)
from tracerag.errors import ConfigurationError

#: What the app's thread or history keeps in place of a withheld answer. ``{ticket_id}`` and
#: ``{request_id}`` are filled in (the ticket id is the request id when there is no ticket).


#: Fields of a structured answer that hold the ids it cites (verified as its citations).
CITED_ID_FIELDS = frozenset(
    {"citations", "cited_ids", "sources", "source_ids", "references", "material_ids", "ids"}
)


# -- redaction ------------------------------------------------------------------------------------
#: Pieces of a structured answer shorter than this are not searched for (a "yes" is everywhere).
MIN_PIECE_CHARS = 8


def withheld_pieces(answer: str | None, structured: Mapping[str, Any] | None) -> tuple[str, ...]:
    """The texts a withheld answer leaves in an app's state: the answer, and each text field
    of its structured form (not the ids it cites)."""
    pieces = [answer.strip()] if answer and answer.strip() else []
    found: list[str] = []

    def walk(node: Any) -> None:
        if isinstance(node, str) and len(node.strip()) >= MIN_PIECE_CHARS:
            found.append(node.strip())
        elif isinstance(node, Mapping):
            for k, v in node.items():
                if str(k).lower() not in CITED_ID_FIELDS:  # the ids cited are no secret
                    walk(v)
        elif isinstance(node, (list, tuple)):
            for v in node:
                walk(v)

    walk(structured or {})
    return tuple(dict.fromkeys([*pieces, *found]))


def redact(
    value: Any, pieces: Sequence[str], replacement: str, earlier: frozenset[str] = frozenset()
) -> Any:
    """``value`` with what holds a withheld answer replaced (a new value): in a message list,
    an AI message of this turn holding it becomes the withheld message (same id, so
    LangGraph's message reducer sees the same message; no tool calls) and the tool messages
    answering its tool calls (a structured answer's echo) are dropped; messages of earlier turns
    (their ids in ``earlier``) are left as they were; a string holding it becomes the withheld
    message; any other object holding it (a structured answer) becomes None."""
    if isinstance(value, (list, tuple)) and any(isinstance(v, BaseMessage) for v in value):

        def withheld_here(item: Any) -> bool:
            return isinstance(item, AIMessage) and item.id not in earlier and holds(item, pieces)

        answered = {call["id"] for item in value if withheld_here(item) for call in item.tool_calls}
        kept: list[Any] = []
        for item in value:
            if withheld_here(item):
                kept.append(AIMessage(content=replacement, id=item.id, name=item.name))
            elif not (isinstance(item, ToolMessage) and item.tool_call_id in answered):
                kept.append(item)
        return tuple(kept) if isinstance(value, tuple) else kept
    if isinstance(value, AIMessage):
        return (
            AIMessage(content=replacement, id=value.id, name=value.name)
            if value.id not in earlier and holds(value, pieces)
            else value
        )
    if isinstance(value, BaseMessage):
        return value
    if isinstance(value, str):
        return replacement if holds(value, pieces) else value
    if isinstance(value, Mapping):
        return {k: redact(v, pieces, replacement, earlier) for k, v in value.items()}
    if isinstance(value, list):
        return [redact(v, pieces, replacement, earlier) for v in value]
    if isinstance(value, tuple) and not hasattr(value, "_fields"):
        return tuple(redact(v, pieces, replacement, earlier) for v in value)
    if isinstance(value, BaseModel) or (
        dataclasses.is_dataclass(value) and not isinstance(value, type)
    ):
        return None if holds(value, pieces) else value
    return value


def holds(
    value: Any,
    pieces: Sequence[str] | str,
    depth: int = 0,
    *,
    outputs_only: bool = False,
    earlier: frozenset[str] = frozenset(),
) -> bool:
    """Whether any of ``pieces`` appears anywhere in ``value`` (messages, models, containers);
    ``outputs_only``: not counting what the model was given (user, system and tool messages:
    a material the answer quotes is no withheld text) nor the messages of earlier turns."""
    needles = [pieces] if isinstance(pieces, str) else list(pieces)
    needles = [n.strip() for n in needles if n.strip()]
    if depth > 40 or not needles:
        return False
    if isinstance(value, str):
        return any(n in value for n in needles)
    deeper = functools.partial(
        holds, pieces=needles, depth=depth + 1, outputs_only=outputs_only, earlier=earlier
    )
    if isinstance(value, BaseMessage):
        if outputs_only and (not isinstance(value, AIMessage) or value.id in earlier):
            return False
        return deeper([value.content, value.additional_kwargs, getattr(value, "tool_calls", None)])
    if isinstance(value, BaseModel):
        return deeper(value.model_dump())
    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        return deeper(dataclasses.asdict(value))
    if isinstance(value, Mapping):
        return any(deeper(v) for v in value.values())
    if isinstance(value, (list, tuple, set, frozenset)):
        return any(deeper(v) for v in value)
    return False


# -- the turns ------------------------------------------------------------------------------------
class Turn(Protocol):
    """What one request leaves in the app's own state, written once it is routed."""

    async def commit(self, response: Response, replacement: str) -> tuple[str, ...]:
        """Write the turn (the withheld message in place of a withheld answer); the warnings
        for the Response."""
        ...


@dataclass
class ThreadTurn:
    """A graph's turn, run on a private thread: its checkpoints, oldest first, and where they
    go (the caller's thread)."""

    saver: Any
    target: dict[str, Any]
    checkpoints: Sequence[Any]  # CheckpointTuple, the seed excluded
    pieces: tuple[str, ...]  # what the app's run wrote of its answer (``withheld_pieces``)
    failed: bool = False  # the app's own run failed: nothing to commit
    #: the graph to resume on the kept turn: its run-once nodes after the answer wait for it
    resume: Any = None
    own: bool = False  # the target is tracerag's own thread, deleted once resumed
    earlier: frozenset[str] = frozenset()  # ids of the messages the thread held before

    async def commit(self, response: Response, replacement: str) -> tuple[str, ...]:
        thread = self.target.get("thread_id")
        if self.failed:
            return (
                f"the app's own run failed: thread {thread!r} was left as it was before "
                "this request",
            )
        hidden = withheld(response) and bool(self.pieces)
        earlier = frozenset(self.earlier)
        written = []
        for saved in self.checkpoints:
            checkpoint = saved.checkpoint
            writes = list(saved.pending_writes or ())
            if hidden:
                checkpoint = {
                    **checkpoint,
                    "channel_values": redact(
                        checkpoint.get("channel_values", {}), self.pieces, replacement, earlier
                    ),
                }
                writes = [
                    (t, c, redact(v, self.pieces, replacement, earlier)) for t, c, v in writes
                ]
                redacted = [checkpoint["channel_values"], [v for _, _, v in writes]]
                if holds(redacted, self.pieces, outputs_only=True, earlier=earlier):
                    return (
                        f"this turn was not kept in thread {thread!r}: the app's state holds "
                        "the withheld answer outside its answer message",
                    )
            written.append((saved, checkpoint, writes))
        for saved, checkpoint, writes in written:
            parent = (saved.parent_config or {}).get("configurable", {}).get("checkpoint_id")
            configurable = {**self.target, "checkpoint_ns": ""}
            if parent:
                configurable["checkpoint_id"] = parent
            else:
                configurable.pop("checkpoint_id", None)
            stored = await self.saver.aput(
                {"configurable": configurable},
                checkpoint,
                saved.metadata,
                dict(checkpoint.get("channel_versions", {})),
            )
            by_task: dict[str, list[tuple[str, Any]]] = defaultdict(list)
            for task, channel, value in writes:
                by_task[task].append((channel, value))
            for task, task_writes in by_task.items():
                await self.saver.aput_writes(stored, task_writes, task)
        if self.resume is None:
            return ()
        try:
            return await self._run_once_nodes()
        finally:
            if self.own:
                await self.saver.adelete_thread(self.target["thread_id"])

    async def _run_once_nodes(self) -> tuple[str, ...]:
        """Resume the kept turn: the run-once nodes after the answer act on what was kept. They
        run outside the caller's callbacks, as the app's runs do."""
        token = var_child_runnable_config.set(None)
        try:
            await self.resume.ainvoke(None, {"configurable": {**self.target, "checkpoint_ns": ""}})
        except Exception as exc:
            return (f"the run-once nodes after the answer failed once it was kept ({exc!r})",)
        finally:
            var_child_runnable_config.reset(token)
        return ()


@dataclass
class HistoryTurn:
    """A ``RunnableWithMessageHistory`` turn: its input messages, for the real history."""

    history: BaseChatMessageHistory
    inputs: list[BaseMessage]

    async def commit(self, response: Response, replacement: str) -> tuple[str, ...]:
        text = replacement if response.answer is None else response.answer
        await self.history.aadd_messages([*self.inputs, AIMessage(content=text)])
        return ()


@dataclass
class Turns:
    """The turns one request noted (the sample stage notes them; ``WrappedChain`` commits)."""

    pending: list[Turn] = field(default_factory=list)
    #: the samples' structured answers (``response_format``) by their answer's text
    structured: dict[str, dict[str, Any]] = field(default_factory=dict)

    async def commit(self, response: Response, template: str | None, question: str) -> Response:
        """Commit every noted turn; the Response with the warnings they gave, and with the
        structured answer of the one released."""
        if response.answer is not None and response.answer in self.structured:
            response = response.model_copy(update={"structured": self.structured[response.answer]})
            validate_response(response)
        if not self.pending:
            return response
        replacement = withheld_text(
            template,
            question=question,
            ticket_id=response.ticket_id,
            request_id=response.request_id,
        )
        notes: list[str] = []
        for turn in self.pending:
            try:
                notes.extend(await turn.commit(response, replacement))
            except Exception as exc:  # the Response stands; the caller is told
                notes.append(f"this turn could not be kept in the app's state ({exc!r})")
        self.pending.clear()
        if not notes:
            return response
        updated = response.model_copy(update={"warnings": [*response.warnings, *notes]})
        validate_response(updated)
        return updated


CURRENT_TURNS: ContextVar[Turns | None] = ContextVar("tracerag_wrap_turns", default=None)


def note_structured(answers: Mapping[str, dict[str, Any]]) -> None:
    """Hand the samples' structured answers to the request (the released one is returned)."""
    turns = CURRENT_TURNS.get()
    if turns is not None:
        turns.structured.update(answers)


def note_turn(turn: Turn) -> bool:
    """Hand a turn to the request committing it; False when no request is committing turns."""
    turns = CURRENT_TURNS.get()
    if turns is None:
        return False
    turns.pending.append(turn)
    return True


# -- interrupts the app raises ---------------------------------------------------------------------
INTERRUPT_KEY = "__interrupt__"
INTERRUPTED_WARNING = (
    "the app paused this turn for a person (an interrupt it raised): nothing was answered or "
    "verified yet; resume it with invoke(Command(resume=...), config) on the same thread"
)


class AppInterrupted(Interrupted):
    """The app's own run paused at an interrupt: the run loop delivers the turn as interrupted
    (not failed) and gives the Response saying so, never an escalation of an empty answer.
    Never reaches the caller."""

    kind = "app"

    def __init__(
        self,
        interrupts: Sequence[AppInterrupt],
        *,
        request_id: str,
        trace_id: str | None,
        versions: Versions,
        tier: str,
    ) -> None:
        super().__init__(
            interrupts, f"the app interrupted the turn ({len(interrupts)} interrupt(s))"
        )
        self.request_id = request_id
        self.trace_id = trace_id
        self.versions = versions
        self.tier = tier

    def response(self) -> Response:
        response = Response(
            request_id=self.request_id,
            trace_id=self.trace_id,
            answer=None,
            confidence=None,
            decision="escalate",
            status="pending_human_review",
            tier=self.tier,  # type: ignore[arg-type]
            signal_detail=SignalDetail(),
            evidence=[],
            versions=self.versions,
            warnings=[INTERRUPTED_WARNING],
            interrupts=list(self.interrupts),
        )
        validate_response(response)
        return response


def interrupts_of(output: Any) -> tuple[AppInterrupt, ...]:
    """The interrupts a graph's output reports (LangGraph's ``__interrupt__``), as JSON."""
    if not isinstance(output, Mapping):
        return ()
    found = output.get(INTERRUPT_KEY) or ()
    return tuple(
        AppInterrupt(
            id=getattr(item, "id", None),
            value=json.loads(json.dumps(getattr(item, "value", item), default=str)),
        )
        for item in found
    )


PAUSED_AFTER_ANSWER = (
    "the app paused (an interrupt it raised) after writing its answer, before tracerag "
    "verified it: the person it pauses for would be shown, and the thread would keep, an "
    "unverified answer. Pause before the answering step instead (HumanInTheLoopMiddleware "
    "gates tool calls) and let tracerag route the answer to a person (review, escalate); this "
    "turn was not kept in the thread"
)


def paused_in_subgraph(nodes: Sequence[str]) -> str:
    return (
        f"the app paused inside a subgraph (node {', '.join(map(repr, nodes))}): wrap() keeps "
        "and resumes the interrupts a graph's own nodes raise, not those of a graph inside "
        "one. Wrap the inner graph itself (the agent that pauses), with its own checkpointer; "
        "this turn was not kept in the thread"
    )


def answered_before_pause(output: Any) -> bool:
    """Whether an interrupted graph's state already holds a final answer (an AI message with
    text and no tool calls, or a structured answer)."""
    if not isinstance(output, Mapping):
        return False
    if output.get("structured_response") is not None:
        return True
    messages = output.get("messages")
    if isinstance(messages, Sequence) and messages and isinstance(messages[-1], AIMessage):
        last = messages[-1]
        return not last.tool_calls and bool(last.text.strip())
    return False


def is_command(value: Any) -> bool:
    """Whether ``value`` is a LangGraph ``Command`` (langgraph is not imported for it)."""
    return type(value).__name__ == "Command" and hasattr(value, "resume")


# -- RunnableWithMessageHistory -------------------------------------------------------------------
def history_runnable(chain: Any) -> RunnableWithMessageHistory | None:
    """The app, when it is a ``RunnableWithMessageHistory``; ``ConfigurationError`` when it
    holds one inside it (each of its runs would write the turn, a withheld answer with it)."""
    top = chain if isinstance(chain, RunnableWithMessageHistory) else None
    inner = inner_runnable(top) if top is not None else chain
    if _holds_history(inner):
        raise ConfigurationError(
            "the app holds a RunnableWithMessageHistory inside it: each of the N sample runs "
            "would write the turn to the history, a withheld answer with it. Wrap the "
            "RunnableWithMessageHistory itself, outermost: move what follows it into the "
            "chain it wraps and call wrap(RunnableWithMessageHistory(chain, ...))"
        )
    return top


def _holds_history(runnable: Any, depth: int = 0) -> bool:
    """Whether a LangChain composition holds a ``RunnableWithMessageHistory`` (its sequences,
    parallels, bindings and branches; not what a function calls)."""
    if depth > 50:
        return False
    if isinstance(runnable, RunnableWithMessageHistory):
        return True
    children: list[Any] = []
    for name in ("steps", "bound", "mapper", "default", "runnable"):
        child = getattr(runnable, name, None)
        if isinstance(child, Runnable):
            children.append(child)
        elif isinstance(child, list):
            children.extend(c for c in child if isinstance(c, Runnable))
    steps = getattr(runnable, "steps__", None)
    if isinstance(steps, Mapping):
        children.extend(steps.values())
    for branch in getattr(runnable, "branches", None) or ():
        children.extend(b for b in branch if isinstance(b, Runnable))
    return any(_holds_history(child, depth + 1) for child in children)


def inner_runnable(app: RunnableWithMessageHistory) -> Runnable[Any, Any]:
    """The runnable a ``RunnableWithMessageHistory`` was built around."""
    steps = getattr(getattr(app, "bound", None), "bound", None)
    found = getattr(steps, "steps", None)
    if isinstance(found, list) and len(found) == 2:
        pick: Callable[[Any], Any] | None = getattr(found[1], "func", None)
        listening = pick(None) if pick is not None else None
        inner = getattr(listening, "bound", None)
        if isinstance(inner, Runnable):
            return inner
    raise ConfigurationError(
        "cannot read the runnable inside this RunnableWithMessageHistory (an unknown "
        "langchain-core version?): wrap the runnable itself and keep the history around "
        "the wrapped app, RunnableWithMessageHistory(wrap(chain), ...)"
    )


class _Copy(BaseChatMessageHistory):
    """A history's messages as they were, for one run: what the run adds stays here."""

    def __init__(self, messages: list[BaseMessage]) -> None:
        self.messages = messages

    def add_messages(self, messages: Sequence[BaseMessage]) -> None:
        self.messages = [*self.messages, *messages]

    def clear(self) -> None:
        self.messages = []


def read_only_history(app: RunnableWithMessageHistory) -> RunnableWithMessageHistory:
    """The same app reading its history from a copy: its runs write nothing to the real one."""
    factory = app.get_session_history

    def copied(*args: Any, **kwargs: Any) -> BaseChatMessageHistory:
        return _Copy(list(factory(*args, **kwargs).messages))

    copied.__signature__ = _signature(factory)  # type: ignore[attr-defined]
    with warnings.catch_warnings():  # its deprecation was told when the app itself was built
        warnings.simplefilter("ignore", DeprecationWarning)
        return RunnableWithMessageHistory(
            inner_runnable(app),
            copied,
            input_messages_key=app.input_messages_key,
            output_messages_key=app.output_messages_key,
            history_messages_key=app.history_messages_key,
            history_factory_config=list(app.history_factory_config),
        )


def _signature(fn: Callable[..., Any]) -> Any:
    import inspect

    return inspect.signature(fn)


def message_ids(values: Any, depth: int = 0) -> frozenset[str]:
    """The ids of the messages a state holds (a thread's, before a turn)."""
    if depth > 20:
        return frozenset()
    if isinstance(values, BaseMessage):
        return frozenset({values.id}) if values.id else frozenset()
    if isinstance(values, Mapping):
        return frozenset().union(*(message_ids(v, depth + 1) for v in values.values()))
    if isinstance(values, (list, tuple)):
        return frozenset().union(*(message_ids(v, depth + 1) for v in values))
    return frozenset()


def history_turn(app: RunnableWithMessageHistory, app_input: Any, config: RunnableConfig) -> Turn:
    """The turn to add to the app's real history: its input messages."""
    merged = app._merge_configs(config)  # the history the app itself would write to
    history: BaseChatMessageHistory = merged["configurable"]["message_history"]
    return HistoryTurn(history=history, inputs=app._get_input_messages(app_input))


__all__ = [
    "CITED_ID_FIELDS",
    "CURRENT_TURNS",
    "INTERRUPTED_WARNING",
    "PAUSED_AFTER_ANSWER",
    "AppInterrupted",
    "HistoryTurn",
    "ThreadTurn",
    "Turn",
    "Turns",
    "answered_before_pause",
    "history_runnable",
    "history_turn",
    "holds",
    "interrupts_of",
    "is_command",
    "message_ids",
    "note_structured",
    "note_turn",
    "paused_in_subgraph",
    "read_only_history",
    "redact",
    "withheld_pieces",
]
