"""``POST /v1/feedback``: a verdict on an answer, counted per authenticated principal.

Who the verdict is from, in this order:

1. ``user_token`` — an end user's id signed by the application's backend with
   ``TRACERAG_FEEDBACK_KEY`` (``tracerag.materials.UserTokens``): ``user:<id>``. A token that
   does not verify is refused (401); a token sent to a server without the key, too (400).
2. ``Authorization: Bearer`` with a named reviewer token: ``reviewer:<name>``.
3. The API key, when one guards ``/v1``: the application itself (``app:api-key``), one
   principal for all of its users.
4. Nothing else: the verdict is kept as an unverified note (with the ``user`` name the caller
   gave, never trusted) and moves no material.

One verdict per principal and request (409 ``duplicate``); a principal's verdicts beyond its
rate are refused (429 with ``Retry-After``). The reply says only what the giver may know: kept
as a verdict or a note, whether it counted, and whether a correction is held for review — no
material, credibility figure or quarantine.
"""

from __future__ import annotations

import logging
from typing import Any

from fastapi import APIRouter, Depends, Request
from fastapi.responses import JSONResponse
from pydantic import ValidationError

from tracerag._identity import DESK_NAMED, OperatorIdentity, fingerprint, hash_token
from tracerag.materials import InvalidUserToken
from tracerag.materials._principal import api_key_principal, declared_note
from tracerag.materials.feedback import DuplicateFeedback, FeedbackLimited, record_feedback
from tracerag.server._auth import NAMED
from tracerag.server._bodies import FeedbackOutcome, FeedbackRequest
from tracerag.server._deps import (
    JsonBody,
    Services,
    ServicesDep,
    begin_attempt,
    client_of,
    credential_failed,
    require_api_key,
    retry_after_header,
    store_call,
    text_problem,
    validation_detail,
)
from tracerag.server._error_shape import ApiError, ErrorCode, error_responses
from tracerag.store._base import RequestNotFound

security_log = logging.getLogger("tracerag.server.security")

router = APIRouter(prefix="/v1", tags=["answers"], dependencies=[Depends(require_api_key)])

FEEDBACK_BODY = {
    "required": True,
    "content": {"application/json": {"schema": {"$ref": "#/components/schemas/FeedbackRequest"}}},
}


def principal(request: Request, svc: Services, data: FeedbackRequest) -> OperatorIdentity:
    """Who gives the verdict (see the module's docstring); refuses a bad credential."""
    if data.user_token is not None:
        tokens = svc.feedback_tokens
        if tokens is None:
            raise ApiError(
                400,
                "bad_request",
                "this server takes no user tokens (TRACERAG_FEEDBACK_KEY is not set)",
            )
        try:
            who: OperatorIdentity = tokens.principal(data.user_token)
            return who
        except InvalidUserToken as exc:
            security_log.warning(
                "refused a feedback user token from %s: %s", client_of(request), exc
            )
            raise ApiError(401, "unauthorized", f"the user token was refused: {exc}") from None
    header = request.headers.get("authorization")
    if header and svc.auth is not None:
        scheme, _, given = header.partition(" ")
        client = client_of(request)
        if scheme.lower() == "bearer":
            begin_attempt(svc, client)
            found = svc.auth.identify(given.strip())
            if found is None:
                credential_failed(svc, client, request.url.path, "bearer token")
                raise ApiError(401, "unauthorized", "the reviewer token was refused")
            svc.auth.throttle.succeeded(client)
            kind, name = found
            if kind != NAMED or name is None:
                raise ApiError(
                    403,
                    "forbidden",
                    "the shared reviewer token names nobody: give verdicts with a named token",
                )
            digest = svc.auth.reviewers.get(name)
            return OperatorIdentity(
                f"reviewer:{name}", DESK_NAMED, fingerprint(digest) if digest else None
            )
    if svc.api_key is not None:
        return api_key_principal(fingerprint(hash_token(svc.api_key)))
    return declared_note(data.user)


@router.post(
    "/feedback",
    response_model=FeedbackOutcome,
    summary="A verdict on an answer",
    description="`confirm`, `deny` or `clarify` (with a correction, held for review). The "
    "verdict counts once per authenticated principal — an end user whose id the application "
    "signed (`user_token`), a named reviewer (Bearer), else the application by its API key — "
    "within per-principal and per-material limits; it moves the credibility of the materials "
    "the answer relied on. Without any of them it is kept as an unverified note and counts for "
    "nothing; `user` is never trusted. A material denied often enough is proposed for "
    "quarantine to a person on the desk. The reply says whether the verdict counted, nothing "
    "about materials. One verdict per principal and request (409 after); too many from one "
    "principal: 429.",
    responses=error_responses(400, 401, 403, 404, 409, 413, 415, 422, 429, 503)
    | {"default": error_responses(500)[500]},
    openapi_extra={"requestBody": FEEDBACK_BODY},
)
async def feedback(request: Request, body: JsonBody, svc: ServicesDep) -> JSONResponse:
    try:
        data = FeedbackRequest.model_validate(body)
    except ValidationError as exc:
        raise ApiError(422, "invalid_input", validation_detail(exc)) from None
    for name, value in data.model_dump(exclude_none=True).items():
        problem = text_problem(name, value) if isinstance(value, str) else None
        if problem:
            raise ApiError(422, "invalid_input", problem)
    who = principal(request, svc, data)
    declared = data.user
    registry = await store_call(svc, svc.materials)

    def give() -> tuple[str, Any]:  # the verdict's refusals, told apart from store failures
        try:
            return "ok", record_feedback(
                data.request_id,
                data.verdict,
                data.comment,
                data.correction,
                registry=registry,
                operator=who,
                declared_user=declared,
                limits=svc.feedback_limits,
            )
        except RequestNotFound:
            return "not_found", f"no request {data.request_id!r}"
        except DuplicateFeedback:
            return "duplicate", "a verdict on this request was already given by this principal"
        except FeedbackLimited as exc:
            return "too_many_requests", exc
        except ValueError as exc:
            return "invalid_input", str(exc)

    outcome, result = await store_call(svc, give)
    if outcome == "too_many_requests":
        raise ApiError(
            429,
            "too_many_requests",
            f"too many verdicts: {result}; try again later",
            retry_after_header(result.retry_after),
        )
    if outcome != "ok":
        refusals: dict[str, tuple[int, ErrorCode]] = {
            "not_found": (404, "not_found"),
            "duplicate": (409, "duplicate"),
            "invalid_input": (422, "invalid_input"),
        }
        status, code = refusals[outcome]
        raise ApiError(status, code, result)
    return JSONResponse(result.caller_view())


__all__ = ["principal", "router"]
