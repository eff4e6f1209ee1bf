"""A person's review of a withheld answer, as a LangGraph interrupt and its resume value.

The interrupt's payload names the ticket, the request and why the answer was withheld; it never
holds the withheld text (that lives in the ticket and the audit record). The resume value is
``{"type": "approve"}`` (release the candidate the ticket holds), ``{"type": "edit", "answer":
"…"}`` (release this text instead) or ``{"type": "reject"}`` (keep the replacement message).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from enum import Enum
from typing import Any

from pydantic import BaseModel, ConfigDict, ValidationError, model_validator

from tracerag.errors import InputError

__all__ = [
    "INTERRUPT_TYPE",
    "RESUME_SCHEMA",
    "ResumeValue",
    "ReviewAction",
    "ReviewDecision",
    "interrupt_payload",
    "parse_resume",
    "refusal_of",
]

#: The ``type`` of the interrupt a withheld answer raises.
INTERRUPT_TYPE = "answer_review"
#: Longest edited answer accepted, in characters.
MAX_EDIT_CHARS = 20_000


class ReviewAction(str, Enum):
    """What a reviewer does with a withheld answer."""

    APPROVE = "approve"
    EDIT = "edit"
    REJECT = "reject"


#: The JSON Schema of the resume value, surfaced with the interrupt.
RESUME_SCHEMA: dict[str, Any] = {
    "type": "object",
    "properties": {
        "type": {"type": "string", "enum": [a.value for a in ReviewAction]},
        "answer": {"type": "string", "description": "The answer to release (edit only)."},
    },
    "required": ["type"],
    "additionalProperties": False,
}


@dataclass(frozen=True)
class ReviewDecision:
    """A checked resume value."""

    action: ReviewAction
    answer: str | None = None


def interrupt_payload(ticket_id: str, request_id: str, reasons: list[str]) -> dict[str, Any]:
    """What the interrupt shows the reviewer's client: ids and reasons, never the answer."""
    return {
        "type": INTERRUPT_TYPE,
        "ticket_id": ticket_id,
        "request_id": request_id,
        "reasons": list(reasons),
        "response_schema": RESUME_SCHEMA,
    }


def parse_resume(value: Any) -> ReviewDecision:
    """The reviewer's decision; ``InputError`` naming what is wrong with any other value."""
    if not isinstance(value, Mapping):
        raise InputError(
            "resume an answer review with a dict such as {'type': 'approve'}, "
            f"{{'type': 'edit', 'answer': '…'}} or {{'type': 'reject'}}; got {type(value).__name__}"
        )
    unknown = sorted(set(value) - {"type", "answer"})
    if unknown:
        raise InputError(f"unknown field(s) {unknown} in the review's resume value")
    kind = value.get("type")
    try:
        action = ReviewAction(kind)
    except ValueError:
        choices = [a.value for a in ReviewAction]
        raise InputError(f"the review's type must be one of {choices}, got {kind!r}") from None
    answer = value.get("answer")
    if action is ReviewAction.EDIT:
        if not isinstance(answer, str) or not answer.strip():
            raise InputError("an 'edit' review needs the answer to release, a non-empty string")
        if len(answer) > MAX_EDIT_CHARS:
            raise InputError(
                f"the edited answer is {len(answer)} characters; the limit is {MAX_EDIT_CHARS}"
            )
        return ReviewDecision(action, answer.strip())
    if answer is not None:
        raise InputError(f"a {action.value!r} review takes no answer (only 'edit' does)")
    return ReviewDecision(action)


class ResumeValue(BaseModel):
    """The resume value as LangGraph validates it before it keeps it (``interrupt``'s
    ``response_schema``): a value ``parse_resume`` refuses is not kept, and the review waits."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    type: ReviewAction
    answer: str | None = None

    @model_validator(mode="before")
    @classmethod
    def _checked(cls, value: Any) -> Any:
        if isinstance(value, ResumeValue):
            return value
        parse_resume(value)
        return value

    def decision(self) -> ReviewDecision:
        return parse_resume(self.model_dump(mode="json", exclude_none=True))


def refusal_of(error: ValidationError) -> str:
    """What is wrong with a resume value that validation refused, as ``parse_resume`` says it."""
    for detail in error.errors():
        cause = (detail.get("ctx") or {}).get("error")
        if isinstance(cause, InputError):
            return str(cause)
    return f"the review's resume value is not valid: {error}"
