"""Answer streams a browser can open, resume and keep open until a reviewer decides.

- ``POST /v1/requests`` starts a request and answers 202 at once with its ``events_url``
  (and, with an ``Idempotency-Key`` seen before, the request that key started);
- ``GET /v1/requests/{id}/events`` is its event stream, for ``EventSource``: every event so
  far, then the rest as they come, then — for a request routed to a reviewer — the ``decision``
  event once a reviewer decides. A reconnect (``Last-Event-ID``) resumes after the last event
  received; once everything was sent it answers 204, which tells ``EventSource`` to stop.
  Reading it takes the API key (``X-API-Key``) or the events URL's ``token``;
- ``GET /v1/requests/{id}/events-url`` gives a fresh events URL for a request (API key).

The question never goes in a URL (URLs end up in logs), and a GET never runs the pipeline (a
foreign page could otherwise make a browser ask questions on its behalf without a preflight).
"""

from __future__ import annotations

import json
import logging
import urllib.parse
from collections.abc import AsyncIterator
from dataclasses import dataclass
from typing import Annotated, Any

from fastapi import APIRouter, Depends, Request
from fastapi.responses import JSONResponse, Response
from fastapi.sse import EventSourceResponse, ServerSentEvent
from opentelemetry import propagate

from tracerag.contract import Response as RAGResponse
from tracerag.server._answerer import Answerer, StageHook
from tracerag.server._deps import (
    AnswerInput,
    IdempotencyKey,
    Services,
    ServicesDep,
    has_api_key,
    require_api_key,
)
from tracerag.server._error_shape import ApiError, error_responses
from tracerag.server._run_book import Event, KeyReused, Run, parse_event_id

logger = logging.getLogger("tracerag.server")
security_log = logging.getLogger("tracerag.server.security")

RETRY_MS = 3000  # how long a browser's EventSource waits before reconnecting
#: the longest a stream waits for its run without looking again (the ``: ping`` keep-alive
#: comments of an idle stream are FastAPI's, every 15 s)
WAKE_SECONDS = 15.0
STAGE_NAMES = ("register", "retrieve", "plan", "sample", "verify", "assemble")

ANSWER_BODY = {
    "required": True,
    "content": {"application/json": {"schema": {"$ref": "#/components/schemas/AnswerRequest"}}},
}
IDEMPOTENCY_HEADER = {
    "name": "Idempotency-Key",
    "in": "header",
    "required": False,
    "description": "Up to 255 visible ASCII characters naming this question: sent again "
    "(a retry, a reconnect), it joins or replays the request it started instead of asking "
    "again. Kept for the server's replay time (10 minutes by default); the same key with "
    "another question is refused (422 `idempotency_key_reused`).",
    "schema": {"type": "string", "minLength": 1, "maxLength": 255, "pattern": "^[!-~]+$"},
}
LAST_EVENT_ID_HEADER = {
    "name": "Last-Event-ID",
    "in": "header",
    "required": False,
    "description": "The id of the last event received (EventSource sends it on reconnect): "
    "the stream resumes after it, and the request is not asked again.",
    "schema": {"type": "string", "maxLength": 300, "pattern": "^[A-Za-z0-9._-]{1,200}:[!-~]+$"},
}
STREAM_200 = {
    "description": "Server-Sent Events; each event's `event` field says which of the union "
    "it is, its `data` is one line of JSON.",
    "content": {"text/event-stream": {"schema": {"$ref": "#/components/schemas/StreamEventSent"}}},
}
REPLAYED_HEADER = {
    "Idempotency-Replayed": {
        "description": "`true` when the Idempotency-Key named a request already asked: its "
        "events or outcome are replayed, nothing ran again.",
        "schema": {"type": "string", "enum": ["true"]},
    },
    "X-Request-Id": {"description": "The request's id.", "schema": {"type": "string"}},
}

router = APIRouter(prefix="/v1", tags=["answers"])


# -- starting a run ----------------------------------------------------------------------------


async def begin(
    svc: Services,
    request: Request,
    data: dict[str, Any],
    key: str | None,
    *,
    resumable: bool,
) -> tuple[Run, bool]:
    """Start (or, by key, join) the run answering ``data`` in the caller's trace context."""
    assert svc.runs is not None
    parent = propagate.extract(request.headers)
    answerer: Answerer = svc.answerer

    async def runner(payload: dict[str, Any], on_stage: StageHook) -> RAGResponse:
        return await answerer.run(payload, on_stage=on_stage, parent=parent)

    try:
        return await svc.runs.start(data, runner, key=key, resumable=resumable)
    except KeyReused as exc:
        raise ApiError(422, "idempotency_key_reused", str(exc)) from None


def run_headers(run: Run, replayed: bool) -> dict[str, str]:
    headers = {"X-Request-Id": run.request_id}
    if replayed:
        headers["Idempotency-Replayed"] = "true"
    return headers


# -- streaming a run ---------------------------------------------------------------------------


#: the stream's first block: a comment naming it, and how long EventSource waits to reconnect
PREAMBLE = ServerSentEvent(comment="tracerag answer stream", retry=RETRY_MS)
EVENT_PARTS = (*STAGE_NAMES, "response", "error", "decision")


def resume_after(run: Run, last_event_id: str | None) -> str | None:
    """The event a stream resumes after (a stage or event name), None to start at the first.

    400 when ``last_event_id`` is not an event of this request.
    """
    if not last_event_id:
        return None
    parsed = parse_event_id(last_event_id)
    if parsed is None or parsed[0] != run.request_id or parsed[1] not in EVENT_PARTS:
        raise ApiError(
            400,
            "bad_request",
            f"Last-Event-ID is not an event of request {run.request_id!r}",
        )
    return parsed[1]


def _after(run: Run, after: str | None, i: int) -> tuple[list[Event], bool]:
    """The events from position ``i`` a stream resuming after ``after`` sends, and whether
    it still skips (has not reached ``after``)."""
    out: list[Event] = []
    skipping = after is not None
    for event in run.events[i:]:
        if skipping:
            if event.part == after:
                skipping = False
                continue
            if not (after in STAGE_NAMES and event.name != "stage"):
                continue
            skipping = False  # a replay without stage events: go on with what followed
        out.append(event)
    return out, skipping


def sent(request_id: str, event: Event) -> ServerSentEvent:
    """One event of a run as sent: its name, its id and its line of JSON (as it was made)."""
    return ServerSentEvent(event=event.name, id=f"{request_id}:{event.part}", raw_data=event.text)


def decision_sent(request_id: str, status: Any) -> ServerSentEvent:
    """The reviewer's decision as sent: one line of JSON, as the run's events are."""
    text = json.dumps(status, ensure_ascii=False, separators=(",", ":"))
    return ServerSentEvent(event="decision", id=f"{request_id}:decision", raw_data=text)


@dataclass(frozen=True)
class StreamPlan:
    """What a stream sends: the run's events after ``after``, then (``until_decision``) the
    reviewer's decision. FastAPI's ``EventSourceResponse`` frames them and sends the ``: ping``
    keep-alive comments while the stream is idle."""

    run: Run
    after: str | None
    until_decision: bool


class NothingToSend(Exception):
    """A stream with nothing left to send: answered 204, which tells EventSource to stop."""

    def __init__(self, headers: dict[str, str]) -> None:
        super().__init__("nothing left to send")
        self.headers = headers


async def nothing_to_send(request: Request, exc: Exception) -> Response:
    """The exception handler that answers a ``NothingToSend`` with its 204."""
    assert isinstance(exc, NothingToSend)
    return Response(status_code=204, headers=exc.headers)


def stream_plan(
    svc: Services,
    run: Run,
    after: str | None,
    *,
    until_decision: bool,
    headers: dict[str, str],
    response: Response,
) -> StreamPlan:
    """The stream after ``after``, its ``headers`` set on ``response``; ``NothingToSend`` when
    nothing is left to send."""
    if after == "decision":
        raise NothingToSend(headers)
    if run.done:
        left, _ = _after(run, after, 0)
        if not left and not (until_decision and run.awaits_decision(svc.store)):
            raise NothingToSend(headers)
    response.headers.update(headers)
    return StreamPlan(run, after, until_decision)


async def events_of(svc: Services, plan: StreamPlan) -> AsyncIterator[ServerSentEvent]:
    """The stream: the run's events after ``after``, then (when asked) the decision."""
    run = plan.run
    yield PREAMBLE
    i = 0
    skip_to = plan.after
    while True:
        batch, still = _after(run, skip_to, i)
        i += len(run.events[i:])
        skip_to = skip_to if still else None
        for event in batch:
            yield sent(run.request_id, event)
        if i < len(run.events):
            continue  # more came while these were sent
        if run.done:
            break
        await run.changed(WAKE_SECONDS)
    if not (plan.until_decision and svc.decisions is not None and run.awaits_decision(svc.store)):
        return
    status = await svc.decisions.wait(run.request_id)
    yield decision_sent(run.request_id, status)


# -- who may read a request's events ----------------------------------------------------------


def events_url(svc: Services, request_id: str) -> tuple[str, int | None]:
    """The events URL of a request (with a token when the API needs a key) and its expiry."""
    path = f"/v1/requests/{urllib.parse.quote(request_id, safe='')}/events"
    if svc.tokens is None:
        return path, None
    token, expires = svc.tokens.make(request_id)
    return f"{path}?{urllib.parse.urlencode({'token': token})}", expires


def ticket(svc: Services, request_id: str) -> dict[str, Any]:
    url, expires = events_url(svc, request_id)
    return {
        "request_id": request_id,
        "events_url": url,
        "status_url": f"/v1/requests/{urllib.parse.quote(request_id, safe='')}",
        "expires_at": expires,
    }


def events_reader(request: Request, request_id: str, svc: ServicesDep) -> None:
    """The API key, or the events URL's token for this request."""
    if has_api_key(request, svc):
        return
    token = request.query_params.get("token")
    if token and svc.tokens is not None and svc.tokens.check(request_id, token):
        return
    client = request.client.host if request.client else "unknown"
    security_log.warning(
        "refused the events of %s to %s: %s",
        request_id,
        client,
        "an invalid or expired token" if token else "no API key and no token",
    )
    raise ApiError(
        401,
        "unauthorized",
        "send X-API-Key, or open the events_url the request was started with (its token may "
        "have expired: ask GET /v1/requests/{id}/events-url for a new one)",
    )


async def run_of(svc: Services, request_id: str) -> Run:
    assert svc.runs is not None
    try:
        run = await svc.runs.find(request_id)
    except ApiError:
        raise
    except Exception as exc:
        logger.warning("finding request %s failed: %s: %s", request_id, type(exc).__name__, exc)
        raise ApiError(
            503, "store_unavailable", f"the audit store is unavailable ({type(exc).__name__})"
        ) from None
    if run is None:
        raise ApiError(404, "not_found", f"no request {request_id!r}")
    return run


# -- routes ------------------------------------------------------------------------------------


@router.post(
    "/requests",
    status_code=202,
    summary="Start answering a question; follow it at its events URL",
    description="Runs the six stages in the background and answers at once with the request's "
    "`events_url`: open it with `EventSource` (a browser) to receive each stage, the response "
    "and, for a request routed to a reviewer, the reviewer's decision. The backend holding "
    "the API key calls this and hands the page the events URL; the question is never put in "
    "a URL. With an `Idempotency-Key` already used, the request it started is returned "
    "(`Idempotency-Replayed: true`), not asked again.",
    response_model=None,
    responses={
        202: {
            "description": "the request was started (or, by its key, found)",
            "content": {
                "application/json": {"schema": {"$ref": "#/components/schemas/EventsTicket"}}
            },
            "headers": {
                **REPLAYED_HEADER,
                "Location": {"description": "the status URL", "schema": {"type": "string"}},
            },
        },
        **error_responses(400, 401, 408, 413, 415, 422, 503),
        "default": error_responses(500)[500],
    },
    dependencies=[Depends(require_api_key)],
    openapi_extra={"requestBody": ANSWER_BODY, "parameters": [IDEMPOTENCY_HEADER]},
)
async def start_request(
    request: Request, data: AnswerInput, key: IdempotencyKey, svc: ServicesDep
) -> JSONResponse:
    run, replayed = await begin(svc, request, data, key, resumable=True)
    body = ticket(svc, run.request_id)
    headers = {**run_headers(run, replayed), "Location": body["status_url"]}
    return JSONResponse(body, status_code=202, headers=headers)


async def events_plan(
    request_id: str,
    request: Request,
    response: Response,
    svc: ServicesDep,
    _: None = Depends(events_reader),
) -> StreamPlan:
    """The stream ``GET /v1/requests/{id}/events`` sends (its errors and 204 come first)."""
    run = await run_of(svc, request_id)
    after = resume_after(run, request.headers.get("last-event-id"))
    headers = {"X-Request-Id": run.request_id}
    return stream_plan(svc, run, after, until_decision=True, headers=headers, response=response)


@router.get(
    "/requests/{request_id}/events",
    response_class=EventSourceResponse,
    summary="The event stream of a request (EventSource)",
    description="Every event of the request so far, then the rest as they come: six `stage`, "
    "one `response` (or `error`), then — when the request was routed to a reviewer (decision "
    "`review` or `escalate`, its record stored) — one `decision` once a reviewer decides, "
    "without polling. A reconnect with `Last-Event-ID` resumes after that event; when "
    "nothing is left to send the answer is 204 (EventSource stops). Needs `X-API-Key` or "
    "the `token` of the events URL. After the server's replay time a request's stage events "
    "are no longer kept: its stream then gives the response and the decision.",
    responses={
        200: STREAM_200,
        204: {"description": "everything was sent already: stop reconnecting"},
        **error_responses(400, 401, 404, 503),
        "default": error_responses(500)[500],
    },
    openapi_extra={"parameters": [LAST_EVENT_ID_HEADER]},
)
async def request_events(
    request_id: str, plan: Annotated[StreamPlan, Depends(events_plan)], svc: ServicesDep
) -> AsyncIterator[ServerSentEvent]:
    async for event in events_of(svc, plan):
        yield event


@router.get(
    "/requests/{request_id}/events-url",
    summary="A fresh events URL for a request",
    description="For a page that keeps waiting after its events URL's token expired.",
    response_model=None,
    responses={
        200: {
            "description": "the request's events URL",
            "content": {
                "application/json": {"schema": {"$ref": "#/components/schemas/EventsTicket"}}
            },
        },
        **error_responses(401, 404, 503),
        "default": error_responses(500)[500],
    },
    dependencies=[Depends(require_api_key)],
)
async def fresh_events_url(request_id: str, svc: ServicesDep) -> JSONResponse:
    run = await run_of(svc, request_id)
    return JSONResponse(ticket(svc, run.request_id))
