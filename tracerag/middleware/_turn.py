"""One agent turn as the model node sees it: the question, and what the tools showed the model.

A turn begins at the last human message. Every ``ToolMessage`` after it is what a tool the agent
called in this turn returned: the documents of a ``content_and_artifact`` tool (its artifact),
the documents its vector store searches returned (``_hooks``, reported by the middleware's
``wrap_tool_call`` under the tool call's id), else its text, which is a material of its own.
"""

from __future__ import annotations

import threading
from collections import OrderedDict
from collections.abc import Sequence
from dataclasses import dataclass

from langchain_core.documents import Document
from langchain_core.messages import AIMessage, BaseMessage, HumanMessage, ToolMessage

from tracerag._llm import text_of
from tracerag.errors import InputError
from tracerag.wrapping._capture import RunCapture, tool_documents, tool_text

__all__ = ["SearchLog", "Turn", "is_answer", "turn_of"]

#: Tool calls whose store searches are kept until their turn's answer is verified, at most.
MAX_TOOL_CALLS = 4096


@dataclass(frozen=True)
class Turn:
    """What one turn asked and what its tools showed the model."""

    question: str
    #: the user's earlier turns in this agent's messages, oldest first: the conversation the
    #: turn's standalone question is resolved with
    earlier: tuple[str, ...]
    documents: tuple[tuple[Document, float | None], ...]
    tool_texts: tuple[tuple[str, str], ...]
    tool_calls: int

    def capture(self) -> RunCapture:
        """A run capture holding the turn's tool results (``_materials`` reads these)."""
        run = RunCapture()
        run.documents = [doc for doc, _ in self.documents]
        run.scores = {id(doc): score for doc, score in self.documents if score is not None}
        run.tool_texts = list(self.tool_texts)
        run.tool_calls = self.tool_calls
        return run


class SearchLog:
    """The documents each tool call's vector store searches returned, by tool call id.

    A ``DocumentSink`` per tool call (``for_call``); the model node of the same turn reads them
    back (``take``). Bounded: the oldest calls are forgotten first.
    """

    def __init__(self, max_calls: int = MAX_TOOL_CALLS) -> None:
        self._found: OrderedDict[str, list[tuple[Document, float | None]]] = OrderedDict()
        self._lock = threading.Lock()
        self._max = max_calls

    def for_call(self, tool_call_id: str) -> _CallSink:
        return _CallSink(self, tool_call_id)

    def add(self, tool_call_id: str, found: Sequence[tuple[Document, float | None]]) -> None:
        with self._lock:
            self._found.setdefault(tool_call_id, []).extend(found)
            self._found.move_to_end(tool_call_id)
            while len(self._found) > self._max:
                self._found.popitem(last=False)

    def get(self, tool_call_id: str) -> list[tuple[Document, float | None]]:
        with self._lock:
            return list(self._found.get(tool_call_id, ()))


class _CallSink:
    __slots__ = ("_call", "_log")

    def __init__(self, log: SearchLog, tool_call_id: str) -> None:
        self._log = log
        self._call = tool_call_id

    def saw_documents(self, found: Sequence[tuple[Document, float | None]]) -> None:
        self._log.add(self._call, found)


def is_answer(message: BaseMessage | None) -> bool:
    """Whether a model's reply answers the user: an AI message that calls no tool."""
    return isinstance(message, AIMessage) and not message.tool_calls


def turn_of(messages: Sequence[BaseMessage], searches: SearchLog) -> Turn:
    """The turn the messages end with; ``InputError`` when no human message asks anything."""
    last_human = next(
        (i for i in range(len(messages) - 1, -1, -1) if isinstance(messages[i], HumanMessage)),
        None,
    )
    if last_human is None:
        raise InputError("the agent's messages hold no human message: there is no question")
    question = text_of(messages[last_human], sep="\n").strip()
    earlier = tuple(
        said
        for message in messages[:last_human]
        if isinstance(message, HumanMessage) and (said := text_of(message, sep="\n").strip())
    )
    documents: list[tuple[Document, float | None]] = []
    texts: list[tuple[str, str]] = []
    calls = 0
    for message in messages[last_human + 1 :]:
        if not isinstance(message, ToolMessage):
            continue
        calls += 1
        artifacts = tool_documents(message)
        searched = searches.get(message.tool_call_id)
        documents.extend((doc, None) for doc in artifacts)
        documents.extend(searched)
        if artifacts or searched:
            continue
        text = tool_text(message)
        if text and text.strip():
            texts.append((message.name or "tool", text))
    return Turn(question, earlier, tuple(documents), tuple(texts), calls)
