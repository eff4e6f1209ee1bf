"""The review API (JSON, Bearer token): the queue, a request's stored trail, a decision or
vote on a queued item, and the labelled export. It is in the OpenAPI document; the desk's
HTML pages are not."""

from __future__ import annotations

import dataclasses
from typing import Annotated, Any, Literal

from fastapi import APIRouter, Query, Request
from fastapi.responses import JSONResponse, Response, StreamingResponse
from pydantic import ValidationError

from tracerag.server._auth import NAMED, valid_reviewer_name
from tracerag.server._bodies import Decision, DecisionRequest, QueuePage, Vote
from tracerag.server._deps import Reviewer, ServicesDep, json_body, store_call, validation_detail
from tracerag.server._error_shape import ApiError, error_responses
from tracerag.server._routes.desk_export import EXPORT_FORMATS, export_stream
from tracerag.server._routes.review_decisions import decide
from tracerag.store._base import RequestNotFound

router = APIRouter(
    prefix="/review/api",
    tags=["review"],
    responses=error_responses(401, 429, 503) | {"default": error_responses(500)[500]},
)


@router.get(
    "/queue", summary="The review queue (newest state of each item)", response_model=QueuePage
)
async def queue_api(
    request: Request,
    session: Reviewer,
    svc: ServicesDep,
    status: Literal["pending", "claimed", "decided"] | None = None,
    limit: Annotated[int, Query(ge=1, le=1000)] = 100,
    offset: Annotated[int, Query(ge=0, le=1_000_000_000)] = 0,
) -> JSONResponse:
    items = await store_call(svc, svc.store.list_queue, status, offset + limit)
    counts = (await store_call(svc, svc.store.metrics)).queue
    total = counts.get(status, 0) if status else sum(counts.values())
    return JSONResponse(
        {
            "items": [i.to_dict() for i in items[offset : offset + limit]],
            "total": total,
            "offset": offset,
            "limit": limit,
        }
    )


@router.get(
    "/requests/{request_id}",
    summary="The full stored trail of a request (operators)",
    response_model=dict[str, Any],
    responses=error_responses(404),
)
async def trail_api(request_id: str, session: Reviewer, svc: ServicesDep) -> JSONResponse:
    try:
        trail = await store_call(svc, svc.store.get, request_id)
    except RequestNotFound:
        raise ApiError(404, "not_found", f"no request {request_id!r}") from None
    return JSONResponse(trail.to_dict())


@router.post(
    "/items/{request_id}/decision",
    summary="Judge a queued item: the decision, or a vote when its queue asks for several "
    "reviewers (Bearer token only)",
    response_model=Decision,
    responses=error_responses(400, 403, 404, 409, 415, 422)
    | {
        202: {
            "description": "A vote: the item waits for more reviewers (or, disputed, for one "
            "more judgement that settles it).",
            "model": Vote,
        }
    },
    openapi_extra={
        "requestBody": {
            "required": True,
            "content": {
                "application/json": {"schema": {"$ref": "#/components/schemas/DecisionRequest"}}
            },
        }
    },
)
async def decide_api(
    request_id: str, request: Request, session: Reviewer, svc: ServicesDep
) -> JSONResponse:
    if session.via != "bearer":
        raise ApiError(403, "forbidden", "the review API takes the token as a bearer header")
    raw = await json_body(request, svc)
    try:
        body = DecisionRequest.model_validate(raw)
    except ValidationError as exc:
        raise ApiError(422, "invalid_input", validation_detail(exc)) from None
    name = session.reviewer
    if session.kind != NAMED:
        name = (body.reviewer or request.headers.get("x-reviewer") or name).strip()
        if not valid_reviewer_name(name):
            raise ApiError(422, "invalid_input", "reviewer: up to 64 letters, digits, .@+-_")
    outcome, tasks = await decide(
        svc, request_id, name, body.action, body.final_answer, body.reason, body.scores
    )
    if outcome.decision is None:
        vote = Vote(
            request_id=request_id,
            reviewer=name,
            action=body.action,
            reviews=outcome.reviews,
            required=outcome.required,
            disputed=outcome.disputed,
        )
        return JSONResponse(vote.model_dump(), status_code=202)
    return JSONResponse(dataclasses.asdict(outcome.decision), background=tasks)


@router.get(
    "/export",
    summary="The decided items as a labelled dataset (JSON lines or CSV)",
    response_class=StreamingResponse,
    responses={
        200: {
            "description": "One labelled example per decided item: question, answer, claims "
            "with their evidence, signals, decision, label, every reviewer's scores.",
            "content": {
                "application/x-ndjson": {
                    "schema": {
                        "type": "string",
                        "description": "one JSON object per line, as `tracerag desk export` writes",
                    }
                },
                "text/csv": {"schema": {"type": "string", "description": "a header, then rows"}},
            },
        },
        **error_responses(422),
    },
)
async def export_api(
    session: Reviewer,
    svc: ServicesDep,
    format: Literal["jsonl", "csv"] = "jsonl",
    route: Literal["escalate", "review"] | None = None,
) -> Response:
    return StreamingResponse(
        export_stream(svc, format, route),
        media_type=EXPORT_FORMATS[format] + "; charset=utf-8",
        headers={"Content-Disposition": f'attachment; filename="desk-decisions.{format}"'},
    )


__all__ = ["router"]
