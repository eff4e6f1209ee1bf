"""The frontend API: answers, the answer stream, a request's outcome, the schemas, health."""

from __future__ import annotations

import asyncio
import logging
from collections.abc import AsyncIterator
from typing import Any

from fastapi import APIRouter, Depends, Request
from fastapi.responses import JSONResponse
from fastapi.sse import EventSourceResponse, ServerSentEvent
from opentelemetry import propagate

from tracerag.contract import Response as RAGResponse
from tracerag.contract import caller_view, response_schema
from tracerag.errors import InputError
from tracerag.runner import StageEvent
from tracerag.server.answerer import stage_event
from tracerag.server.deps import (
    AnswerInput,
    ServicesDep,
    require_api_key,
    store_call,
)
from tracerag.server.errors import ApiError, error_responses
from tracerag.server.models import (
    Health,
    Readiness,
    RequestStatus,
)
from tracerag.store.base import RequestNotFound
from tracerag.store.record import RequestTrail

logger = logging.getLogger("tracerag.server")

STATES = {"approve": "approved", "edit": "edited", "reject": "rejected"}
RETRY_MS = 3000  # how long a browser's EventSource waits before reconnecting

ANSWER_BODY = {
    "required": True,
    "content": {"application/json": {"schema": {"$ref": "#/components/schemas/AnswerRequest"}}},
}

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
        final = answer if decision in ("pass", "review") else None
    valid_states = RequestStatus.model_fields["state"].annotation.__args__  # type: ignore[union-attr]
    return RequestStatus.model_validate(
        {
            "request_id": trail.request_id,
            "state": state if state in valid_states else "unknown",
            "decision": decision if decision in ("pass", "review", "escalate") else None,
            "final_answer": final,
            "ticket_id": response.ticket_id if response is not None else None,
            "trace_id": rec.trace_id,
            "review": outcome,
        }
    ).model_dump(mode="json")


@router.post(
    "/answer",
    response_model=RAGResponse,
    summary="Answer a question",
    description="Runs the six stages and returns the Response. An escalated answer is "
    "withheld: `answer` is null and no claim or evidence carries its text.",
    responses=error_responses(400, 401, 408, 413, 415, 422, 503)
    | {"default": error_responses(500)[500]},
    openapi_extra={"requestBody": ANSWER_BODY},
)
async def answer(request: Request, data: AnswerInput, svc: ServicesDep) -> JSONResponse:
    parent = propagate.extract(request.headers)
    try:
        result = await svc.answerer.run(data, parent=parent)
    except InputError as exc:
        raise ApiError(422, "invalid_input", str(exc)) from None
    except Exception as exc:
        logger.exception("request failed")
        raise ApiError(500, "pipeline_failed", type(exc).__name__) from None
    return JSONResponse(caller_view(result), headers={"X-Request-Id": result.request_id})


@router.post(
    "/answer/stream",
    response_class=EventSourceResponse,
    summary="Answer a question, streaming each stage",
    description="Server-Sent Events: a `retry:` hint, then one `stage` event per stage as it "
    "completes (register, retrieve, plan, sample, verify, assemble), then one `response` "
    "(the caller view of the Response) or one `error`. `: ping` comments keep the connection "
    "open. Answer text is never streamed before it is verified. The event payloads are the "
    "`StreamEvents` schema.",
    responses={
        200: {
            "description": "the event stream",
            "content": {
                "text/event-stream": {"schema": {"$ref": "#/components/schemas/StreamEvents"}}
            },
        },
        **error_responses(400, 401, 408, 413, 415, 422, 503),
        "default": error_responses(500)[500],
    },
    openapi_extra={"requestBody": ANSWER_BODY},
)
async def answer_stream(
    request: Request, data: AnswerInput, svc: ServicesDep
) -> AsyncIterator[ServerSentEvent]:
    parent = propagate.extract(request.headers)
    queue: asyncio.Queue[tuple[str, Any] | None] = asyncio.Queue()

    def on_stage(event: StageEvent) -> None:
        queue.put_nowait(("stage", stage_event(event)))

    async def job() -> None:
        try:
            result = await svc.answerer.run(data, on_stage=on_stage, parent=parent)
            queue.put_nowait(("response", caller_view(result)))
        except Exception as exc:
            logger.exception("streamed request failed")
            queue.put_nowait(("error", {"error": "pipeline_failed", "detail": type(exc).__name__}))
        finally:
            queue.put_nowait(None)

    # the run completes (and is stored) even if the caller goes away mid-stream
    task = asyncio.create_task(job())
    svc.background.add(task)
    task.add_done_callback(svc.background.discard)

    yield ServerSentEvent(comment="tracerag answer stream", retry=RETRY_MS)
    n = 0
    while True:
        item = await queue.get()
        if item is None:
            return
        n += 1
        yield ServerSentEvent(event=item[0], data=item[1], id=str(n))


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


@router.get(
    "/schemas/response.json",
    summary="The Response JSON Schema (draft 2020-12)",
    response_model=dict[str, Any],
    responses={"default": error_responses(500)[500]},
)
async def response_json_schema() -> JSONResponse:
    return JSONResponse(response_schema(), media_type="application/schema+json")


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
