"""A request's input: the question and who asks it, its conversation, and the Unicode rules
every text it brings is read under.

``RequestInput.parse`` (``parse_input``) reads a question string, a dict or a chat input and
refuses what cannot be answered (``InputError``); ``Conversation`` is the user's earlier turns.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field, replace
from datetime import datetime
from typing import TYPE_CHECKING, Any, ClassVar, Literal

from tracerag import _semconv as semconv
from tracerag._declare import (
    Signal,
)
from tracerag.errors import InputError
from tracerag.signals._types import utcnow
from tracerag.telemetry._content_capture import capture
from tracerag.text._followup import ResolutionMethod, resolve_turn
from tracerag.text._unicode import first_lone_surrogate, fix_surrogates, is_invisible

if TYPE_CHECKING:
    pass

__all__ = [
    "INPUT_KEYS",
    "MAX_EARLIER_TURNS",
    "Conversation",
    "ConversationSource",
    "RequestInput",
    "parse_input",
]


INPUT_KEYS = frozenset(
    {"question", "session_id", "user_id", "channel", "request_id", "chat_history", "messages"}
)


#: The user's earlier turns a request is read with (and its record keeps), at most: the last.
MAX_EARLIER_TURNS = 20


#: Where a request's earlier turns come from: the request's ``chat_history``, the earlier
#: messages of the app's ``messages`` input, the app's checkpointed thread, or the history of a
#: ``RunnableWithMessageHistory``.
ConversationSource = Literal["chat_history", "messages", "thread", "history"]


@dataclass(frozen=True)
class Conversation:
    """The conversation a request's turn belongs to, and the standalone question it asks.

    ``earlier`` are the user's earlier turns (oldest first); ``standalone`` the question the
    turn asks read with them (``tracerag.text._followup``), which the verifier and the
    relevance check use; ``method`` how it was resolved (``standalone``: the turn as it is;
    ``substituted``, ``joined``, ``context``; ``rewriter``: the configured rewriter's);
    ``source`` where the earlier turns were read; ``rewriter_error`` why the configured
    question rewriter gave no question, when it failed (its turn is then resolved without it);
    ``read_error`` why the app's conversation store could not be read (the turn is then read
    with what the input holds).
    """

    earlier: tuple[str, ...]
    standalone: str
    method: ResolutionMethod
    source: ConversationSource
    #: why the configured rewriter gave no question (the turn was resolved without it)
    rewriter_error: str | None = None
    #: why the app's conversation could not be read (the turn was read on its own)
    read_error: str | None = None

    @classmethod
    def of(cls, turn: str, earlier: Sequence[str], source: ConversationSource) -> Conversation:
        """The conversation of ``turn`` after ``earlier``, resolved without a model."""
        resolved = resolve_turn(turn, earlier)
        return cls(tuple(earlier), resolved.question, resolved.method, source)

    def to_record(self) -> dict[str, Any]:
        """The record's ``conversation`` section."""
        record: dict[str, Any] = {
            "source": self.source,
            "resolution": self.method,
            "earlier_turns": len(self.earlier),
            "earlier_questions": list(self.earlier),
        }
        if self.rewriter_error is not None:
            record["rewriter_error"] = self.rewriter_error
        if self.read_error is not None:
            record["read_error"] = self.read_error
        return record


def _conversation_record(i: RequestInput) -> Any:
    return i.conversation.to_record() if i.conversation is not None else None


def _user_turns(value: Any, key: str) -> tuple[str, ...]:
    """The user turns of a chat history in any form LangChain accepts for messages."""
    from langchain_core.messages import HumanMessage, convert_to_messages

    if isinstance(value, (str, bytes)) or not isinstance(value, Sequence):
        raise InputError(
            f"{key} must be a list of chat messages (HumanMessage/AIMessage objects, "
            f"(role, text) tuples or role dicts), got {type(value).__name__}"
        )
    try:
        messages = convert_to_messages(list(value))
    except Exception as exc:  # LangChain refuses the same input with the same error
        raise InputError(f"{key} is not a list of chat messages LangChain can read: {exc}") from exc
    turns = []
    for message in messages:
        if isinstance(message, HumanMessage):
            text = message.text if isinstance(message.text, str) else str(message.content)
            if first_lone_surrogate(text) is not None:
                raise InputError(f"{key} holds a message that is not valid Unicode")
            if text.strip():
                turns.append(text.strip())
    return tuple(turns)


@dataclass(frozen=True)
class RequestInput:
    """What the caller asked, checked: a non-empty question and optional ids.

    ``app_input`` (``wrap()`` only) is the caller's input as the wrapped app takes it, passed
    to the app unchanged; None when the app's input is made from the question.
    ``conversation``: the earlier turns the question follows and the standalone question it
    asks (None: a request on its own); ``question`` stays the turn as the user wrote it.
    """

    question: str
    session_id: str | None = None
    user_id: str | None = None
    channel: str | None = None
    request_id: str | None = None
    started_at: datetime = field(default_factory=utcnow)
    app_input: Any = field(default=None, compare=False, repr=False)
    conversation: Conversation | None = None

    #: the request's input: in the record, on the root span and (as the stage that registers
    #: it) on the register span
    SIGNALS: ClassVar[tuple[Signal, ...]] = (
        Signal(
            lambda i: i.question,
            record="question",
            span=semconv.OI_INPUT_VALUE,
            root=semconv.OI_INPUT_VALUE,
            span_as=capture,
        ),
        # a conversation's turn: the standalone question it asks (none for a request on its own,
        # whose question is what it asks)
        Signal(
            lambda i: i.conversation.standalone if i.conversation is not None else None,
            record="standalone_question",
            span=semconv.QUESTION_STANDALONE,
            root=semconv.QUESTION_STANDALONE,
            span_as=capture,
        ),
        Signal(
            lambda i: i.conversation.method if i.conversation is not None else None,
            span=semconv.QUESTION_RESOLUTION,
            root=semconv.QUESTION_RESOLUTION,
        ),
        Signal(
            lambda i: len(i.conversation.earlier) if i.conversation is not None else None,
            span=semconv.CONVERSATION_TURNS,
            root=semconv.CONVERSATION_TURNS,
        ),
        Signal(
            lambda i: i.conversation.source if i.conversation is not None else None,
            span=semconv.CONVERSATION_SOURCE,
        ),
        Signal(_conversation_record, record="conversation", is_json=True),
        Signal(lambda i: i.session_id, record="session_id", root=semconv.OI_SESSION_ID, when=bool),
        Signal(lambda i: i.user_id, record="user_id", root=semconv.OI_USER_ID, when=bool),
        Signal(
            lambda i: i.channel,
            record="channel",
            span=semconv.CHANNEL,
            root=semconv.CHANNEL,
            when=bool,
        ),
        Signal(lambda i: i.started_at.isoformat(), record="started_at", span=semconv.STARTED_AT),
    )

    @property
    def standalone_question(self) -> str:
        """The question the turn asks, read with the conversation (the turn on its own)."""
        return self.conversation.standalone if self.conversation is not None else self.question

    def following(
        self,
        earlier: Sequence[str],
        source: ConversationSource,
        *,
        standalone: str | None = None,
        method: ResolutionMethod | None = None,
    ) -> RequestInput:
        """This request as the turn after the user's ``earlier`` turns (none: as it is).

        The standalone question is resolved without a model unless ``standalone`` (with its
        ``method``, e.g. ``rewriter``) is given. The last ``MAX_EARLIER_TURNS`` turns are read
        (and recorded): a follow-up leans on the turns just before it.
        """
        turns = tuple(t.strip() for t in earlier if t.strip())[-MAX_EARLIER_TURNS:]
        if not turns:
            return self
        conversation = Conversation.of(self.question, turns, source)
        if standalone is not None and standalone.strip():
            conversation = Conversation(turns, standalone.strip(), method or "rewriter", source)
        return replace(self, conversation=conversation)

    @classmethod
    def parse(cls, value: Any, *, max_chars: int = 8000) -> RequestInput:
        """A RequestInput from a question string or a dict; InputError on anything else.

        A dict's ``chat_history`` (the conversation's earlier messages, in any form LangChain
        accepts for messages) makes the request a turn of that conversation: its standalone
        question is resolved from the user's earlier turns (``Conversation``). A dict may give
        ``messages`` instead of ``question``: a chat input whose last user message is the
        question and whose earlier ones are the conversation.

        Refused: a question that is empty or shows nothing (only whitespace, zero-width or other
        invisible characters), longer than ``max_chars``, or any field that is not valid Unicode
        (a lone UTF-16 surrogate such as ``"\\ud800"``). Surrogate pairs are joined into the
        character they encode.
        """
        if isinstance(value, RequestInput):
            data: dict[str, Any] = {
                k: getattr(value, k)
                for k in (
                    "question",
                    *sorted(INPUT_KEYS - {"question", "chat_history", "messages"}),
                )
            }
        elif isinstance(value, str):
            data = {"question": value}
        elif isinstance(value, dict):
            unknown = set(value) - INPUT_KEYS
            if unknown:
                raise InputError(
                    f"unknown input field(s) {sorted(unknown)}; accepted: {sorted(INPUT_KEYS)}"
                )
            data = dict(value)
        else:
            raise InputError(
                "input must be a question string or a dict with 'question', "
                f"got {type(value).__name__}"
            )
        earlier: tuple[str, ...] | None = None
        source: ConversationSource = "chat_history"
        if data.get("messages") is not None:
            # a chat input: the question is its last user message, the ones before it the
            # conversation's earlier turns
            if "question" in data or data.get("chat_history") is not None:
                raise InputError(
                    "give the question as 'question' (with 'chat_history') or as the last "
                    "user message of 'messages', not both"
                )
            turns = _user_turns(data["messages"], "messages")
            if not turns:
                raise InputError(
                    "messages holds no user message with text; the question is the last one"
                )
            data["question"], earlier, source = turns[-1], turns[:-1], "messages"
        elif data.get("chat_history") is not None:
            earlier = _user_turns(data["chat_history"], "chat_history")
        question = data.get("question")
        if not isinstance(question, str) or not question.strip():
            raise InputError("the question must be a non-empty string")
        if len(question) > max_chars:
            raise InputError(
                f"the question is {len(question)} characters; the limit is {max_chars}"
            )
        for key in ("question", "session_id", "user_id", "channel", "request_id"):
            field_value = data.get(key)
            if field_value is None:
                continue
            if not isinstance(field_value, str):
                raise InputError(f"{key} must be a string")
            lone = first_lone_surrogate(field_value)
            if lone is not None:
                raise InputError(
                    f"{key} is not valid Unicode: a lone UTF-16 surrogate at character {lone}"
                )
            data[key] = fix_surrogates(field_value)
        question = data["question"]
        if is_invisible(question):
            raise InputError("the question shows no visible character")
        parsed = cls(
            question=question.strip(),
            session_id=data.get("session_id"),
            user_id=data.get("user_id"),
            channel=data.get("channel"),
            request_id=data.get("request_id") or None,
            conversation=value.conversation if isinstance(value, RequestInput) else None,
        )
        if earlier is None:
            return parsed
        return parsed.following(earlier, source)


def parse_input(value: Any, *, max_chars: int = 8000) -> RequestInput:
    """A RequestInput from a question string or a dict; InputError on anything else."""
    return RequestInput.parse(value, max_chars=max_chars)
