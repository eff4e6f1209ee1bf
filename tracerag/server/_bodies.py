"""The bodies the server takes and sends, as pydantic models (they make the OpenAPI document)."""

from __future__ import annotations

from typing import Annotated, Any, Literal, Union

from pydantic import BaseModel, ConfigDict, Field

from tracerag.contract import Response as RAGResponse
from tracerag.store._base import QueueItem


class ChatTurn(BaseModel):
    """One earlier message of the conversation a question follows."""

    model_config = ConfigDict(extra="forbid", strict=True)

    role: Literal["user", "assistant"]
    content: str = Field(max_length=8000)


class AnswerRequest(BaseModel):
    """The body of ``POST /v1/answer`` and ``POST /v1/answer/stream``."""

    model_config = ConfigDict(extra="forbid", strict=True)

    question: str = Field(
        description="The question, Chinese or English; not blank, not only invisible characters."
    )
    session_id: str | None = Field(default=None, max_length=200)
    user_id: str | None = Field(default=None, max_length=200)
    channel: str | None = Field(default=None, max_length=200)
    chat_history: list[ChatTurn] | None = Field(
        default=None,
        max_length=200,
        description="The conversation's earlier messages, oldest first: the question is "
        'verified as the standalone question it asks after them ("And for a phone?" after '
        "a laptop's warranty); the record keeps both.",
    )


class ReviewOutcome(BaseModel):
    """A person's decision on a routed request, as the caller sees it."""

    action: Literal["approve", "edit", "reject"]
    decided_at: str


#: where a request stands for its caller (``RequestStatus.state``)
RequestState = Literal[
    "answered",
    "flagged_for_review",
    "pending_human_review",
    "unverified",
    "approved",
    "edited",
    "rejected",
    "unknown",
]


class RequestStatus(BaseModel):
    """What ``GET /v1/requests/{id}`` tells the caller: the outcome, never a withheld answer."""

    request_id: str
    state: RequestState = Field(
        description="The Response's status until a reviewer decides, then approved, edited "
        "or rejected."
    )
    decision: Literal["pass", "review", "escalate"] | None = Field(
        description="The router's decision for the request."
    )
    final_answer: str | None = Field(
        description="The answer the caller may show: the verified answer of a passed or "
        "review-flagged request, the reviewed answer once approved or edited; null while "
        "withheld and after a rejection."
    )
    ticket_id: str | None = None
    trace_id: str | None = None
    review: ReviewOutcome | None = Field(
        default=None, description="Set once a reviewer has decided."
    )


class StageEvent(BaseModel):
    """The data of a ``stage`` event of the answer stream."""

    stage: Literal["register", "retrieve", "plan", "sample", "verify", "assemble"]
    request_id: str
    trace_id: str | None
    skipped: bool
    duration_s: float | None
    signals: dict[str, Any] = Field(
        description="Key signals of the stage (retrieve: count, material_ids, top_score; "
        "verify: citation_valid, citation_score, fabricated_citations, self_consistency, "
        "answers_question; "
        "assemble: confidence, decision; …). Never answer text."
    )


class StreamError(BaseModel):
    """The data of an ``error`` event: the request failed after the stream started."""

    error: Literal["invalid_input", "pipeline_failed", "request_unfinished"] = Field(
        description="invalid_input: the pipeline refused the question; pipeline_failed: it "
        "failed; request_unfinished: the replica running it stopped before it ended (its "
        "outcome may appear later at GET /v1/requests/{id})."
    )
    detail: str


EVENT_ID = (
    "`<request_id>:<stage>` or `<request_id>:<event>`: send it back as `Last-Event-ID` to "
    "resume after this event."
)


class StageMessage(BaseModel):
    """A ``stage`` event: one stage completed (six in all, skipped ones included)."""

    event: Literal["stage"]
    id: str = Field(description=EVENT_ID)
    data: StageEvent


class ResponseMessage(BaseModel):
    """The ``response`` event: the caller view of the Response (withheld: no text)."""

    event: Literal["response"]
    id: str = Field(description=EVENT_ID)
    data: RAGResponse


class ErrorMessage(BaseModel):
    """The ``error`` event: the request failed; the stream ends."""

    event: Literal["error"]
    id: str = Field(description=EVENT_ID)
    data: StreamError


class DecisionMessage(BaseModel):
    """The ``decision`` event: a reviewer decided the request (streams that wait for it)."""

    event: Literal["decision"]
    id: str = Field(description=EVENT_ID)
    data: RequestStatus


#: One event of an answer stream, told apart by ``event`` (the SSE ``event:`` field). On the
#: wire each is ``id:``, ``event:`` and one ``data:`` line of JSON; ``: ping`` comments keep the
#: connection open.
StreamEvent = Annotated[
    Union[StageMessage, ResponseMessage, ErrorMessage, DecisionMessage],  # noqa: UP007
    Field(discriminator="event"),
]
STREAM_EVENT_MODELS = (StageMessage, ResponseMessage, ErrorMessage, DecisionMessage)


class EventsTicket(BaseModel):
    """Where to follow a request: ``POST /v1/requests`` and ``GET .../events-url``."""

    request_id: str
    events_url: str = Field(
        description="The request's event stream, for `new EventSource(base + events_url)`: a "
        "path with a `token` good for this request only (when the API needs a key)."
    )
    status_url: str = Field(description="The request's outcome (`GET`, with the API key).")
    expires_at: int | None = Field(
        description="When the token stops opening the stream (seconds since the epoch); null "
        "when the API needs no key."
    )


class DecisionRequest(BaseModel):
    """The body of ``POST /review/api/items/{id}/decision``."""

    model_config = ConfigDict(extra="forbid", strict=True)

    action: Literal["approve", "edit", "reject"]
    final_answer: str | None = Field(default=None, max_length=20_000)
    reason: str | None = Field(default=None, max_length=2_000)
    reviewer: str | None = Field(
        default=None,
        max_length=64,
        description="Who decides, for the shared reviewer token only (named tokens name "
        "their reviewer). Any script: 李伟 works.",
    )
    scores: dict[str, int] | None = Field(
        default=None,
        description="Rubric scores by dimension name (whole numbers on each dimension's "
        "scale); the queue's rubric says which dimensions exist and which are required.",
    )


class Health(BaseModel):
    """``GET /healthz``: the process answers."""

    ok: bool
    review_desk: bool


class Readiness(BaseModel):
    """``GET /readyz``: whether answers can be recorded in the store now."""

    ready: bool
    store: dict[str, Any]


class QueuePage(BaseModel):
    """``GET /review/api/queue``: one page of the review queue and the real total."""

    items: list[QueueItem]
    total: int
    offset: int
    limit: int


class Decision(BaseModel):
    """A stored review decision."""

    request_id: str
    reviewer: str
    action: Literal["approve", "edit", "reject"]
    final_answer: str | None
    reason: str | None
    decided_at: str


class Vote(BaseModel):
    """A judgement recorded on an item that needs several reviewers, not yet settled (202)."""

    request_id: str
    reviewer: str
    action: Literal["approve", "edit", "reject"]
    reviews: int = Field(description="Judgements on the item so far, this one included.")
    required: int = Field(description="How many reviewers the item's queue asks for.")
    disputed: bool = Field(
        description="The judgements disagree: the next one, by any reviewer, settles the item."
    )


class FeedbackRequest(BaseModel):
    """A verdict on an answer (``tracerag.materials.feedback.record_feedback``)."""

    model_config = ConfigDict(extra="forbid")

    request_id: str = Field(min_length=1, max_length=200)
    verdict: Literal["confirm", "deny", "clarify"]
    comment: str | None = Field(default=None, max_length=4000)
    correction: str | None = Field(
        default=None, max_length=8000, description="required for clarify: the right statement"
    )
    user_token: str | None = Field(
        default=None,
        max_length=1024,
        description="the end user's signed id, made by the application's backend with "
        "TRACERAG_FEEDBACK_KEY (tracerag.materials.UserTokens): the verdict counts as that "
        "user's",
    )
    user: str | None = Field(
        default=None,
        min_length=1,
        max_length=64,
        description="a name the user gave: kept beside the verdict as unverified, never "
        "trusted; on its own it makes the verdict an unverified note that counts for nothing",
    )


class FeedbackOutcome(BaseModel):
    """What the one who gave a verdict may know about it."""

    request_id: str
    verdict: Literal["confirm", "deny", "clarify"]
    feedback_id: str | None = None
    recorded_as: Literal["verdict", "note"] = Field(
        description="verdict: an authenticated principal gave it; note: kept, counts for nothing"
    )
    counted: bool = Field(description="whether it moved the credibility of what the answer used")
    note: str | None = Field(default=None, description="why it did not count, when it did not")
    correction_held: bool = Field(
        default=False, description="the correction was kept for a person to review"
    )
