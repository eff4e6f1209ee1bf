"""Reading a wrapped app's input and output: the question, the answer, the documents it used.

Apps take and return many shapes: a question string, ``{"question": …}`` (LangChain's RAG
tutorial graph), ``{"input", "chat_history"}`` (conversational chains), ``{"messages": […]}``
(agents and chat graphs); they return a string, an ``AIMessage``, ``{"answer", "context"}``
(``create_retrieval_chain``) or a whole graph state. ``ChainIO`` finds the question, the answer
and the documents in these shapes, by the key the caller names or by common defaults, and leaves
the caller's input itself unchanged.

A ``messages`` list may hold every form LangChain accepts for a message: ``HumanMessage``
objects, ``("user", text)`` tuples, ``{"role": "user", "content": text}`` dicts and bare
strings (a human message); the question is its last user message, and the user messages
before it are the conversation's earlier turns (as are those of a ``chat_history`` field): the
turn's standalone question is resolved with them (``tracerag.text._followup``).
"""

from __future__ import annotations

import copy
import dataclasses
import json
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from functools import cached_property
from typing import Any, Literal

from langchain_core.documents import Document
from langchain_core.messages import AIMessage, BaseMessage, HumanMessage, convert_to_messages
from pydantic import BaseModel, RootModel

from tracerag._llm import text_of
from tracerag.errors import InputError, UnreadableOutputError
from tracerag.wrapping._commit import CITED_ID_FIELDS

DEFAULT_INPUT_KEYS = ("question", "input", "query")
DEFAULT_OUTPUT_KEYS = ("answer", "output", "result", "text")
DEFAULT_DOCUMENTS_KEYS = ("context", "source_documents", "documents")
MESSAGES_KEY = "messages"
#: the fields of an app's input that hold the conversation's earlier messages
DEFAULT_HISTORY_KEYS = ("chat_history", "history")
#: Where ``create_agent(..., response_format=...)`` puts its structured answer.
STRUCTURED_KEY = "structured_response"
_MARKER = re.compile(r"\[[^\[\]\s]+\]")
# request fields tracerag reads from a dict input (they are passed to the app as well)
REQUEST_FIELDS = ("session_id", "user_id", "channel", "request_id")
# the conversation's earlier messages in tracerag's own request form
OWN_HISTORY_KEY = "chat_history"


@dataclass(frozen=True)
class ChainRequest:
    """One caller's request: the question tracerag verifies and the input the app is run on."""

    question: str
    chain_input: Any
    fields: Mapping[str, str]
    #: the user's earlier turns in the input (oldest first), and the field they were read from
    earlier: tuple[str, ...] = ()
    history_source: Literal["messages", "chat_history"] | None = None


@dataclass(frozen=True)
class ChainIO:
    """Where the question, the answer and the documents are in an app's input and output.

    Each key is optional; when it is not given the defaults are tried in order
    (``DEFAULT_INPUT_KEYS``, ``DEFAULT_OUTPUT_KEYS``, ``DEFAULT_DOCUMENTS_KEYS``).
    """

    input_key: str | None = None
    output_key: str | None = None
    documents_key: str | None = None
    # the field a bare string question goes in when ``input_key`` is not given (see
    # ``question_field``); ``messages`` means a one-message chat history
    string_key: str | None = None
    # the app whose input tells ``string_key`` when it is not given; read on first need, so
    # apps that are always called with a dict never have their input schema built
    app: Any = field(default=None, repr=False, compare=False)

    @cached_property
    def _string_key(self) -> str | None:
        if self.string_key is not None or self.app is None:
            return self.string_key
        return question_field(self.app)

    def request(self, value: Any) -> ChainRequest:
        """The question and the app's input from what the caller passed.

        A string is the question; it is passed to the app as ``{input_key: question}`` when
        ``input_key`` (or else ``string_key``) is set, else as the string. A dict is passed
        through as it is (chat history and every other field kept); its question is read
        from it. A dict of tracerag's own request fields only (``question``, ``session_id``,
        ``user_id``, ``channel``, ``request_id``, ``chat_history``) given to an app without a
        ``question`` field is tracerag's request: the app gets the question as it gets a
        string, and ``chat_history`` is the conversation the question follows.
        """
        if isinstance(value, str):
            return ChainRequest(question=value, chain_input=self.string_input(value), fields={})
        if isinstance(value, Mapping):
            fields = {k: value[k] for k in REQUEST_FIELDS if value.get(k) is not None}
            for key, field_value in fields.items():
                if not isinstance(field_value, str):
                    raise InputError(f"{key} must be a string")
            question = self.question(value)
            if self._is_own_request(value):
                # tracerag's request: the app gets the question; its chat_history is read here
                history = value.get(OWN_HISTORY_KEY)
                earlier = user_turns(history, OWN_HISTORY_KEY) if history else ()
                source: Literal["messages", "chat_history"] | None = (
                    "chat_history" if earlier else None
                )
                return ChainRequest(question, self.string_input(question), fields, earlier, source)
            earlier, source = self.earlier_turns(value)
            return ChainRequest(question, value, fields, earlier, source)
        raise InputError(f"input must be a question string or a dict, got {type(value).__name__}")

    def _is_own_request(self, value: Mapping[str, Any]) -> bool:
        """Whether a dict is tracerag's request form rather than the app's own input."""
        if self.input_key is not None:
            return False
        own_form = "question" in value and set(value) <= {
            "question",
            OWN_HISTORY_KEY,
            *REQUEST_FIELDS,
        }
        return own_form and self._string_key != "question"

    def string_input(self, question: str) -> Any:
        """The app's input for a bare question string."""
        key = self.input_key or self._string_key
        if key is None:
            return question
        if key == MESSAGES_KEY:
            return {MESSAGES_KEY: [HumanMessage(question)]}
        return {key: question}

    def question(self, value: Mapping[str, Any]) -> str:
        """The question in a dict input; InputError naming ``input_key=`` when none is found."""
        if self.input_key is not None:
            if self.input_key not in value:
                raise InputError(
                    f"the input has no {self.input_key!r} field (input_key={self.input_key!r}); "
                    f"it has {sorted(map(str, value))}"
                )
            field_value = value[self.input_key]
            text = _text(field_value)
            if text is not None:
                return text
            if _is_message_list(field_value) or isinstance(field_value, Mapping):
                return question_in_messages(field_value, self.input_key)
            raise InputError(
                f"input field {self.input_key!r} (input_key={self.input_key!r}) holds "
                f"{type(field_value).__name__}, not the question: it must be text, a message "
                "or a list of messages"
            )
        text = _first_text(value, DEFAULT_INPUT_KEYS)
        if text is not None:
            return text
        if MESSAGES_KEY in value:
            messages = value[MESSAGES_KEY]
            if isinstance(messages, str):
                return messages  # LangChain reads a bare string as one human message
            if isinstance(messages, (BaseMessage, Mapping)) or _is_message_list(messages):
                return question_in_messages(messages, MESSAGES_KEY)
        raise InputError(
            f"cannot find the question in an input with fields {sorted(map(str, value))}; "
            f"tried {list(DEFAULT_INPUT_KEYS)} and the last user message of {MESSAGES_KEY!r}: "
            "pass input_key= to wrap() to name the field that holds it"
        )

    def earlier_turns(
        self, value: Mapping[str, Any]
    ) -> tuple[tuple[str, ...], Literal["messages", "chat_history"] | None]:
        """The user's turns before the question in a dict input, and where they were read: the
        user messages before the last one of the question's message list, else those of a
        ``chat_history`` (or ``history``) field. None found: ``((), None)``."""
        key = self.input_key or MESSAGES_KEY
        messages = value.get(key)
        if _is_message_list(messages) or isinstance(messages, (BaseMessage, Mapping)):
            turns = user_turns(messages, key)
            if len(turns) > 1:
                return turns[:-1], "messages"
        for history_key in DEFAULT_HISTORY_KEYS:
            history = value.get(history_key)
            if history_key != key and _is_message_list(history) and history:
                turns = user_turns(history, history_key)
                if turns:
                    return turns, "chat_history"
        return (), None

    def answer(self, output: Any) -> str:
        """The answer text of the app's output; ``UnreadableOutputError`` (a ``TypeError``)
        naming ``output_key=`` if none."""
        if isinstance(output, Mapping):
            if self.output_key is not None:
                text = _text(output.get(self.output_key))
                if text is None and output.get(self.output_key) is not None:
                    text = structured_text(output[self.output_key])
                if text is None:
                    raise UnreadableOutputError(
                        f"the output has no text field {self.output_key!r} "
                        f"(output_key={self.output_key!r}); it has {sorted(map(str, output))}"
                    )
                return text
            text = _first_text(output, DEFAULT_OUTPUT_KEYS)
            if text is not None:
                return text
            if output.get(STRUCTURED_KEY) is not None:  # create_agent's response_format
                text = structured_text(output[STRUCTURED_KEY])
                if text is None:
                    raise UnreadableOutputError(
                        f"the app's structured answer ({STRUCTURED_KEY!r}, a "
                        f"{type(output[STRUCTURED_KEY]).__name__}) holds no text field to verify"
                    )
                return text
            messages = output.get(MESSAGES_KEY)
            if isinstance(messages, Sequence) and messages and isinstance(messages[-1], AIMessage):
                return text_of(messages[-1])
            raise UnreadableOutputError(
                f"cannot find the answer in an output with fields {sorted(map(str, output))}; "
                f"tried {list(DEFAULT_OUTPUT_KEYS)} and {MESSAGES_KEY!r}: "
                "pass output_key= to wrap() to name the field"
            )
        text = _text(output)
        if text is None:
            raise UnreadableOutputError(
                f"cannot read an answer from app output of type {type(output).__name__}"
            )
        return text

    def structured(self, output: Any) -> dict[str, Any] | None:
        """The app's structured answer as JSON (``structured_response``, or what
        ``output_key`` names when it is structured), or None."""
        if not isinstance(output, Mapping):
            return None
        value = output.get(self.output_key or STRUCTURED_KEY)
        data = _structured_data(value)
        return json.loads(json.dumps(data, default=str)) if data is not None else None

    def answer_or_none(self, output: Any) -> str | None:
        """The answer text of an output or a graph state, or None when it holds none."""
        try:
            return self.answer(output)
        except TypeError:
            return None

    def documents(self, output: Any) -> list[Document]:
        """The documents the app's output carries (e.g. ``state["context"]``), else none."""
        if not isinstance(output, Mapping):
            return []
        keys = (self.documents_key,) if self.documents_key else DEFAULT_DOCUMENTS_KEYS
        for key in keys:
            value = output.get(key)
            if isinstance(value, Sequence) and not isinstance(value, str):
                docs = [d for d in value if isinstance(d, Document)]
                if docs:
                    return docs
        return []


def input_fields(chain: Any) -> tuple[str, ...] | None:
    """The fields of an app's dict input (a graph's input state, a chain's input schema)."""
    schema = getattr(getattr(chain, "builder", None), "input_schema", None)
    if isinstance(schema, type):
        fields = getattr(schema, "model_fields", None)
        if isinstance(fields, Mapping):
            return tuple(fields)
        annotations: dict[str, Any] = {}
        for cls in reversed(schema.__mro__):
            annotations.update(getattr(cls, "__annotations__", {}) or {})
        return tuple(annotations) or None
    try:
        model = chain.get_input_schema()
    except Exception:
        return None
    if not isinstance(model, type) or not issubclass(model, BaseModel):
        return None
    if issubclass(model, RootModel):
        return None
    return tuple(info.alias or name for name, info in model.model_fields.items()) or None


def question_field(chain: Any) -> str | None:
    """The field a bare question string goes in for an app that takes a dict, if it is clear.

    The first of ``DEFAULT_INPUT_KEYS`` the app's input has, else ``messages`` for a chat
    graph; None for an app that takes a string (or whose input cannot be told).
    """
    fields = input_fields(chain)
    if not fields:
        return None
    for key in (*DEFAULT_INPUT_KEYS, MESSAGES_KEY):
        if key in fields:
            return key
    return None


def _is_message_list(value: Any) -> bool:
    return isinstance(value, Sequence) and not isinstance(value, (str, bytes))


def question_in_messages(messages: Any, key: str = MESSAGES_KEY) -> str:
    """The last user message of a chat input, in any form LangChain accepts for a message.

    ``HumanMessage`` objects, ``("user", text)`` / ``("human", text)`` tuples, role dicts
    (``{"role": "user", "content": text}``) and bare strings are user messages. InputError
    when the messages cannot be read as LangChain reads them, or hold no user message.
    """
    items: list[Any] = (
        [messages] if isinstance(messages, (BaseMessage, Mapping)) else list(messages)
    )
    try:
        parsed = convert_to_messages(items)
    except Exception as exc:  # LangChain refuses the same input with the same error
        raise InputError(
            f"input field {key!r} is not a list of chat messages LangChain can read: {exc}. "
            "Give messages as HumanMessage objects, (role, text) tuples, "
            '{"role": ..., "content": ...} dicts or strings'
        ) from exc
    for message in reversed(parsed):
        if isinstance(message, HumanMessage):
            text = text_of(message)
            if text.strip():
                return text
    roles = [m.type for m in parsed]
    raise InputError(
        f"input field {key!r} holds no user message with text (roles: {roles or 'none'}); "
        "the question is the last user message"
    )


def user_turns(messages: Any, key: str) -> tuple[str, ...]:
    """The text of each user message with text in a chat input (any form LangChain accepts),
    oldest first; InputError when LangChain cannot read the messages."""
    items: list[Any] = (
        [messages] if isinstance(messages, (BaseMessage, Mapping)) else list(messages)
    )
    try:
        parsed = convert_to_messages(items)
    except Exception as exc:  # LangChain refuses the same input with the same error
        raise InputError(
            f"input field {key!r} is not a list of chat messages LangChain can read: {exc}"
        ) from exc
    texts = (text_of(m) for m in parsed if isinstance(m, HumanMessage))
    return tuple(t.strip() for t in texts if t.strip())


def _structured_data(value: Any) -> dict[str, Any] | None:
    if isinstance(value, BaseModel):
        return value.model_dump(mode="json")
    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        return dataclasses.asdict(value)
    if isinstance(value, Mapping):
        return dict(value)
    return None


def structured_text(value: Any) -> str | None:
    """The text of a structured answer to verify: its text fields in order, each followed by
    the ids its id fields cite (``CITED_ID_FIELDS``) when it has no citation marker of its own.
    None when it is not structured or holds no text."""
    data = _structured_data(value)
    if data is None:
        return None
    texts: list[str] = []
    ids: list[str] = []

    def walk(node: Any, key: str | None) -> None:
        if isinstance(node, str):
            if key in CITED_ID_FIELDS:
                ids.append(node.strip())
            elif node.strip():
                texts.append(node.strip())
        elif isinstance(node, Mapping):
            for k, v in node.items():
                walk(v, str(k).lower())
        elif isinstance(node, (list, tuple)):
            for v in node:
                walk(v, key)

    walk(data, None)
    if not texts:
        return None
    markers = " ".join(f"[{i}]" for i in dict.fromkeys(i for i in ids if i))
    cited = [t if not markers or _MARKER.search(t) else f"{t} {markers}" for t in texts]
    return "\n".join(cited)


def _text(value: Any) -> str | None:
    if isinstance(value, str):
        return value
    if isinstance(value, BaseMessage):
        return text_of(value)
    return None


def _first_text(value: Mapping[str, Any], keys: Sequence[str]) -> str | None:
    """The text of the first of ``keys`` whose field in ``value`` holds text."""
    for key in keys:
        text = _text(value.get(key))
        if text is not None:
            return text
    return None


def independent_copy(value: Any) -> Any:
    """A deep copy of an app input, so concurrent runs cannot share mutable state.

    Inputs that cannot be copied (open clients, locks) are passed as they are.
    """
    try:
        return copy.deepcopy(value)
    except Exception:
        return value


__all__ = [
    "DEFAULT_DOCUMENTS_KEYS",
    "DEFAULT_HISTORY_KEYS",
    "DEFAULT_INPUT_KEYS",
    "DEFAULT_OUTPUT_KEYS",
    "ChainIO",
    "ChainRequest",
    "independent_copy",
    "input_fields",
    "question_field",
    "question_in_messages",
    "structured_text",
    "user_turns",
]
