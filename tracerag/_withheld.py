"""The message that stands in an app's conversation for an answer the router withheld.

Every front door that writes into the app's own state (wrap()'s checkpointed thread and message
history, the middleware's final message) replaces a withheld answer with this text, so the
user sees that a person will answer, and with which ticket, and never the candidate itself.
"""

from __future__ import annotations

import unicodedata

from tracerag.errors import ConfigurationError

__all__ = ["DEFAULT_WITHHELD", "DEFAULT_WITHHELD_ZH", "check_withheld_message", "withheld_text"]

#: The replacement of a withheld answer to a question not written in Chinese.
DEFAULT_WITHHELD = (
    "I can't give a verified answer to this yet. A person will review your question and "
    "answer it (ticket {ticket_id})."
)
#: The same, for a question written in Chinese.
DEFAULT_WITHHELD_ZH = (
    "这个问题暂时无法给出经过核实的回答，将由人工审核后答复您（工单 {ticket_id}）。"
)

_FIELDS = ("ticket_id", "request_id")


def check_withheld_message(template: str | None) -> str | None:
    """The caller's template (None: the default for the question's language), if it is a
    non-empty text that formats with ``{ticket_id}`` and ``{request_id}`` alone."""
    if template is None:
        return None
    if not isinstance(template, str) or not template.strip():
        raise ConfigurationError("withheld_message must be a non-empty string")
    try:
        template.format(**dict.fromkeys(_FIELDS, "x"))
    except (KeyError, IndexError, ValueError) as exc:
        raise ConfigurationError(
            f"withheld_message may use only the fields {{ticket_id}} and {{request_id}}: {exc!r}"
        ) from None
    return template


def withheld_text(
    template: str | None, *, question: str, ticket_id: str | None, request_id: str
) -> str:
    """The replacement text for one withheld answer: the caller's template, else the default
    in the question's language, with the ticket (the request id where no ticket was made)."""
    chosen = template or (DEFAULT_WITHHELD_ZH if _is_chinese(question) else DEFAULT_WITHHELD)
    return chosen.format(ticket_id=ticket_id or request_id, request_id=request_id)


def _is_chinese(text: str) -> bool:
    return any(unicodedata.name(ch, "").startswith("CJK UNIFIED") for ch in text)
