"""The frontend API: answers, the answer stream, a request's outcome, the schemas, health."""

from __future__ import annotations

import asyncio
import logging
from collections.abc import AsyncIterator
from typing import Annotated, Any, Literal, get_args

from fastapi import APIRouter, Depends, Request
from fastapi.responses import JSONResponse, Response
from fastapi.sse import EventSourceResponse, ServerSentEvent

from tracerag._routing import Route
from tracerag.contract import Response as RAGResponse
from tracerag.contract import response_schema
from tracerag.server._bodies import (
    Health,
    Readiness,
    RequestState,
    RequestStatus,
)
from tracerag.server._deps import (
    AnswerInput,
    IdempotencyKey,
    ServicesDep,
    require_api_key,
    store_call,
)
from tracerag.server._error_shape import ApiError, error_responses
from tracerag.server._routes.sse import (
    ANSWER_BODY,
    IDEMPOTENCY_HEADER,
    LAST_EVENT_ID_HEADER,
    REPLAYED_HEADER,
    STREAM_200,
    StreamPlan,
    begin,
    events_of,
    resume_after,
    run_headers,
    run_of,
    stream_plan,
)
from tracerag.server._run_book import fingerprint, parse_event_id
from tracerag.store._base import RequestNotFound
from tracerag.store._codec import RequestTrail

logger = logging.getLogger("tracerag.server")

STATES = {"approve": "approved", "edit": "edited", "reject": "rejected"}
router = APIRouter(prefix="/v1", tags=["answers"], dependencies=[Depends(require_api_key)])


def request_status(trail: RequestTrail) -> dict[str, Any]:
    """The caller's view of a stored request: its state and, when it may be shown, the answer."""
    rec = trail.audit
    response = rec.response
    review = trail.review
    decision = rec.decision
    outcome: dict[str, Any] | None = None
    if review is not None and review.status == "decided":
        state = STATES.get(str(review.action), "unknown")
        final = review.final_answer if review.action != "reject" else None
        outcome = {"action": review.action, "decided_at": review.decided_at}
    else:
        state = str((response.status if response is not None else None) or "unknown")
        answer = response.answer if response is not None else None
        final = answer if decision in (Route.PASS, Route.REVIEW) else None
    valid_states = get_args(RequestState)
    return RequestStatus.model_validate(
        {
            "request_id": trail.request_id,
            "state": state if state in valid_states else "unknown",
            "decision": decision if decision in tuple(Route) else None,
            "final_answer": final,
            "ticket_id": response.ticket_id if response is not None else None,
            "trace_id": rec.trace_id,
            "review": outcome,
        }
    ).model_dump(mode="json")


ERROR_STATUS = {"invalid_input": 422, "pipeline_failed": 500, "request_unfinished": 503}


@router.post(
    "/answer",
    response_model=RAGResponse,
    summary="Answer a question",
    description="Runs the six stages and returns the Response. An escalated answer is "
    "withheld: `answer` is null and no claim or evidence carries its text. With an "
    "`Idempotency-Key` already used, the request it started is joined or replayed "
    "(`Idempotency-Replayed: true`), not asked again.",
    responses={
        200: {"description": "the Response", "headers": REPLAYED_HEADER},
        **error_responses(400, 401, 408, 413, 415, 422, 503),
        "default": error_responses(500)[500],
    },
    openapi_extra={"requestBody": ANSWER_BODY, "parameters": [IDEMPOTENCY_HEADER]},
)
async def answer(
    request: Request, data: AnswerInput, key: IdempotencyKey, svc: ServicesDep
) -> Response:
    run, replayed = await begin(svc, request, data, key, resumable=key is not None)
    final = await run.final()
    if final.name == "error":
        problem = final.data
        code = problem.get("error")
        raise ApiError(ERROR_STATUS.get(code, 500), code, problem.get("detail"))
    return Response(final.text, media_type="application/json", headers=run_headers(run, replayed))


async def answer_stream_plan(
    request: Request,
    response: Response,
    data: AnswerInput,
    key: IdempotencyKey,
    svc: ServicesDep,
    until: Literal["response", "decision"] = "response",
) -> StreamPlan:
    """The stream ``POST /v1/answer/stream`` sends: a new run, the run its key started, or the
    run a reconnect's ``Last-Event-ID`` names (its errors and 204 come first)."""
    last = request.headers.get("last-event-id")
    parsed = parse_event_id(last) if last else None
    if last and parsed is None:
        raise ApiError(400, "bad_request", "Last-Event-ID is not an event id of this server")
    if parsed is not None and key is None:
        # a reconnect: resume the request the last event belongs to, never ask again
        run = await run_of(svc, parsed[0])
        if run.fingerprint and run.fingerprint != fingerprint(data):
            raise ApiError(
                409, "conflict", f"Last-Event-ID names request {parsed[0]!r}, another question"
            )
        replayed = True
    else:
        run, replayed = await begin(svc, request, data, key, resumable=True)
    after = resume_after(run, last) if parsed is not None and parsed[0] == run.request_id else None
    return stream_plan(
        svc,
        run,
        after,
        until_decision=until == "decision",
        headers=run_headers(run, replayed),
        response=response,
    )


@router.post(
    "/answer/stream",
    response_class=EventSourceResponse,
    summary="Answer a question, streaming each stage",
    description="Server-Sent Events: a `retry:` hint, then one `stage` event per stage as it "
    "completes (register, retrieve, plan, sample, verify, assemble; a wrapped app samples "
    "before it plans), then one `response` "
    "(the caller view of the Response) or one `error`; with `until=decision`, a request "
    "routed to a reviewer then gets its `decision` event once a reviewer decides. `: ping` "
    "comments keep the connection open. Answer text is never streamed before it is "
    "verified. A reconnect sends `Last-Event-ID` (and the same `Idempotency-Key`): the "
    "stream resumes the same request after that event instead of asking again. For "
    "`EventSource`, which can only GET, use `POST /v1/requests` and its events URL.",
    responses={
        200: {**STREAM_200, "headers": REPLAYED_HEADER},
        204: {"description": "a resumed stream with nothing left to send"},
        **error_responses(400, 401, 404, 408, 409, 413, 415, 422, 503),
        "default": error_responses(500)[500],
    },
    openapi_extra={
        "requestBody": ANSWER_BODY,
        "parameters": [IDEMPOTENCY_HEADER, LAST_EVENT_ID_HEADER],
    },
)
async def answer_stream(
    plan: Annotated[StreamPlan, Depends(answer_stream_plan)], svc: ServicesDep
) -> AsyncIterator[ServerSentEvent]:
    async for event in events_of(svc, plan):
        yield event


@router.get(
    "/requests/{request_id}",
    response_model=RequestStatus,
    summary="The outcome of a request",
    description="State, decision and the answer the caller may show (the reviewed answer once "
    "a person has decided). Never a withheld answer; the full trail is for reviewers "
    "(`GET /review/api/requests/{id}`).",
    responses=error_responses(401, 404, 503) | {"default": error_responses(500)[500]},
)
async def get_request(request_id: str, svc: ServicesDep) -> JSONResponse:
    try:
        trail = await store_call(svc, svc.store.get, request_id)
    except RequestNotFound:
        raise ApiError(404, "not_found", f"no request {request_id!r}") from None
    return JSONResponse(request_status(trail))


class SchemaJSONResponse(JSONResponse):
    """A JSON Schema, sent as its own media type (RFC draft-bhutton-json-schema)."""

    media_type = "application/schema+json"


@router.get(
    "/schemas/response.json",
    summary="The Response JSON Schema (draft 2020-12)",
    response_class=SchemaJSONResponse,
    responses={
        200: {
            "description": "The schema every Response validates against",
            "content": {"application/schema+json": {"schema": {"type": "object"}}},
        },
        "default": error_responses(500)[500],
    },
)
async def response_json_schema() -> SchemaJSONResponse:
    return SchemaJSONResponse(response_schema())


health = APIRouter(tags=["health"])


@health.get("/healthz", response_model=Health, summary="The process answers")
async def healthz(svc: ServicesDep) -> dict[str, Any]:
    return {"ok": True, "review_desk": svc.review_desk}


@health.get(
    "/readyz",
    response_model=Readiness,
    summary="Whether answers can be recorded now",
    responses={503: {"model": Readiness, "description": "the store is failing or not answering"}},
)
async def readyz(svc: ServicesDep) -> JSONResponse:
    state = svc.answerer.store_state()
    # Switch here to the store's own readiness check once it has one.
    try:
        await asyncio.wait_for(asyncio.to_thread(svc.store.get, "readyz-probe"), timeout=2.0)
    except RequestNotFound:
        pass  # the store answered
    except asyncio.TimeoutError:
        state = {**state, "ready": False, "last_error": "timeout"}
    except Exception as exc:
        state = {**state, "ready": False, "last_error": type(exc).__name__}
    return JSONResponse({"ready": state["ready"], "store": state}, 200 if state["ready"] else 503)
