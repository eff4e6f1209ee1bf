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
import warnings
from collections import defaultdict
from collections.abc import Callable, Mapping, Sequence
from contextvars import ContextVar
from dataclasses import dataclass, field
from typing import Any, Protocol

from langchain_core.chat_history import BaseChatMessageHistory
from langchain_core.messages import AIMessage, BaseMessage
from langchain_core.runnables import Runnable, RunnableConfig
from langchain_core.runnables.history import RunnableWithMessageHistory
from pydantic import BaseModel

from tracerag._llm import text_of
from tracerag.contract import Response, validate_response, withheld
from tracerag.errors import ConfigurationError

#: What the app's thread or history keeps in place of a withheld answer. ``{ticket_id}`` and
#: ``{request_id}`` are filled in (the ticket id is the request id when there is no ticket).
DEFAULT_WITHHELD_MESSAGE = (
    "A member of our team will answer this question shortly (ticket {ticket_id})."
)
_FIELDS = ("ticket_id", "request_id")


def check_withheld_message(template: str) -> str:
    """The template, if it formats with ``{ticket_id}`` and ``{request_id}`` alone."""
    if not isinstance(template, str) or not template.strip():
        raise ConfigurationError("withheld_message must be a non-empty string")
    try:
        template.format(**dict.fromkeys(_FIELDS, "x"))
    except (KeyError, IndexError, ValueError) as exc:
        raise ConfigurationError(
            f"withheld_message may use only the fields {{ticket_id}} and {{request_id}}: {exc!r}"
        ) from None
    return template


def withheld_text(template: str, response: Response) -> str:
    """The withheld message for a Response."""
    ticket = response.ticket_id or response.request_id
    return template.format(ticket_id=ticket, request_id=response.request_id)


# -- redaction ------------------------------------------------------------------------------------
def _same_text(value: str, answer: str) -> bool:
    return value.strip() == answer.strip()


def redact(value: Any, answer: str, replacement: str) -> Any:
    """``value`` with every message and string whose text is ``answer`` replaced (a new value;
    messages keep their id and name, so LangGraph's message reducer sees the same message)."""
    if isinstance(value, BaseMessage):
        if isinstance(value, AIMessage) and _same_text(text_of(value), answer):
            return AIMessage(content=replacement, id=value.id, name=value.name)
        return value
    if isinstance(value, str):
        return replacement if _same_text(value, answer) else value
    if isinstance(value, Mapping):
        return type(value)({k: redact(v, answer, replacement) for k, v in value.items()})  # type: ignore[call-arg]
    if isinstance(value, list):
        return [redact(v, answer, replacement) for v in value]
    if isinstance(value, tuple) and not hasattr(value, "_fields"):
        return tuple(redact(v, answer, replacement) for v in value)
    return value


def holds(value: Any, text: str, depth: int = 0) -> bool:
    """Whether ``text`` appears anywhere in ``value`` (messages, models, containers)."""
    if depth > 40 or not text.strip():
        return False
    needle = text.strip()
    if isinstance(value, str):
        return needle in value
    if isinstance(value, BaseMessage):
        return holds(value.content, text, depth + 1) or holds(
            [value.additional_kwargs, getattr(value, "tool_calls", None)], text, depth + 1
        )
    if isinstance(value, BaseModel):
        return holds(value.model_dump(), text, depth + 1)
    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        return holds(dataclasses.asdict(value), text, depth + 1)
    if isinstance(value, Mapping):
        return any(holds(v, text, depth + 1) for v in value.values())
    if isinstance(value, (list, tuple, set, frozenset)):
        return any(holds(v, text, depth + 1) for v in value)
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
    answer: str | None  # the answer the app's run wrote (None: it wrote none)
    failed: bool = False  # the app's own run failed: nothing to commit

    async def commit(self, response: Response, replacement: str) -> tuple[str, ...]:
        thread = self.target.get("thread_id")
        if self.failed:
            return (
                f"the app's own run failed: thread {thread!r} was left as it was before "
                "this request",
            )
        hidden = withheld(response) and self.answer is not None and self.answer.strip()
        written = []
        for saved in self.checkpoints:
            checkpoint = saved.checkpoint
            writes = list(saved.pending_writes or ())
            if hidden:
                assert self.answer is not None
                checkpoint = {
                    **checkpoint,
                    "channel_values": redact(
                        checkpoint.get("channel_values", {}), self.answer, replacement
                    ),
                }
                writes = [(t, c, redact(v, self.answer, replacement)) for t, c, v in writes]
                if holds([checkpoint["channel_values"], [v for _, _, v in writes]], self.answer):
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

    async def commit(self, response: Response, template: str) -> Response:
        """Commit every noted turn; the Response with the warnings they gave."""
        if not self.pending:
            return response
        replacement = withheld_text(template, response)
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


def note_turn(turn: Turn) -> bool:
    """Hand a turn to the request committing it; False when no request is committing turns."""
    turns = CURRENT_TURNS.get()
    if turns is None:
        return False
    turns.pending.append(turn)
    return True


# -- RunnableWithMessageHistory -------------------------------------------------------------------
def history_runnable(chain: Any) -> RunnableWithMessageHistory | None:
    return chain if isinstance(chain, RunnableWithMessageHistory) else None


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


def history_turn(app: RunnableWithMessageHistory, app_input: Any, config: RunnableConfig) -> Turn:
    """The turn to add to the app's real history: its input messages."""
    merged = app._merge_configs(config)  # the history the app itself would write to
    history: BaseChatMessageHistory = merged["configurable"]["message_history"]
    return HistoryTurn(history=history, inputs=app._get_input_messages(app_input))


__all__ = [
    "CURRENT_TURNS",
    "DEFAULT_WITHHELD_MESSAGE",
    "HistoryTurn",
    "ThreadTurn",
    "Turn",
    "Turns",
    "check_withheld_message",
    "history_runnable",
    "history_turn",
    "holds",
    "note_turn",
    "read_only_history",
    "redact",
    "withheld_text",
]
