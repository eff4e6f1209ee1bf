"""A conversation's turn rewritten as a standalone question by the app's own runnable.

Without ``question_rewriter=`` a turn is resolved without a model (``tracerag.text._followup``)
as the request is parsed. With one, the rewriter is called once per turn that has earlier
turns, as LangChain's history-aware retriever calls its contextualising chain: with
``{"input": turn, "chat_history": [HumanMessage(earlier turn), ...]}``; its text (a string or
a message) is the standalone question, recorded with resolution ``rewriter``. A rewriter that
fails, or answers with no text, is named in the record (``conversation.rewriter_error``) and
in the log, and the turn keeps the resolution made without it: the request is answered all
the same.
"""

from __future__ import annotations

import dataclasses
import logging

from langchain_core.messages import BaseMessage, HumanMessage
from langchain_core.runnables import Runnable, RunnableConfig

from tracerag._llm import text_of
from tracerag._state import Conversation, RequestInput
from tracerag.errors import UnreadableOutputError

__all__ = ["rewrite_turn"]

logger = logging.getLogger("tracerag.conversation")


async def rewrite_turn(
    request: RequestInput,
    rewriter: Runnable[dict[str, object], object] | None,
    config: RunnableConfig | None = None,
) -> RequestInput:
    """The request with its standalone question from ``rewriter`` (None, or a request on its
    own: the request as it is)."""
    conversation = request.conversation
    if rewriter is None or conversation is None:
        return request
    history: list[BaseMessage] = [HumanMessage(turn) for turn in conversation.earlier]
    try:
        output = await rewriter.ainvoke(
            {"input": request.question, "chat_history": history}, config
        )
        text = _text(output)
        if not text:
            raise UnreadableOutputError(
                f"the rewriter returned no question text ({type(output).__name__})"
            )
    except Exception as exc:  # the turn keeps the resolution made without the rewriter
        error = f"{type(exc).__name__}: {exc}"
        logger.warning(
            "tracerag: the question rewriter failed, turn resolved without it: %s", error
        )
        kept = Conversation(
            conversation.earlier,
            conversation.standalone,
            conversation.method,
            conversation.source,
            rewriter_error=error,
        )
        return dataclasses.replace(request, conversation=kept)
    return request.following(
        conversation.earlier, conversation.source, standalone=text, method="rewriter"
    )


def _text(output: object) -> str:
    if isinstance(output, str):
        return output.strip()
    if isinstance(output, BaseMessage):
        return text_of(output).strip()
    return ""
