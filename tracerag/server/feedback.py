"""``POST /v1/feedback``: a user's verdict on an answer, as ``record_feedback`` takes it.

Body: ``{"request_id": "...", "verdict": "confirm" | "deny" | "clarify", "comment": "...",
"correction": "...", "user": "..."}`` (``correction`` required for ``clarify``; ``user`` names
who gave it, default ``anonymous``, recorded as ``user:<name>``). Guarded by ``X-API-Key`` when
a key is configured. 200 with what changed; 404 unknown request; 409 when this user already gave
feedback on the request; 422 invalid body.

The app includes it with one line: ``app.include_router(feedback_router(api_key=key))``. The
registry is opened beside ``app.state.store`` on first use (or pass ``registry=``).
"""

from __future__ import annotations

import asyncio
import threading
from typing import Any, Literal

from fastapi import APIRouter, Request
from fastapi.responses import JSONResponse
from pydantic import BaseModel, Field, ValidationError

from tracerag.server.auth import same_secret


class FeedbackRequest(BaseModel):
    """The feedback body."""

    request_id: str = Field(min_length=1, max_length=200)
    verdict: Literal["confirm", "deny", "clarify"]
    comment: str | None = Field(default=None, max_length=4000)
    correction: str | None = Field(default=None, max_length=8000)
    user: str = Field(default="anonymous", min_length=1, max_length=64)


def _problem(status: int, error: str, detail: Any) -> JSONResponse:
    return JSONResponse({"error": error, "detail": detail}, status_code=status)


def feedback_router(registry: Any = None, *, api_key: str | None = None) -> APIRouter:
    """The ``/v1/feedback`` route, over ``registry`` or one opened beside the app's store."""
    router = APIRouter()
    lock = threading.Lock()
    opened: dict[str, Any] = {}

    def get_registry(request: Request) -> Any:
        if registry is not None:
            return registry
        with lock:
            if "registry" not in opened:
                from tracerag.materials import MaterialRegistry

                opened["registry"] = MaterialRegistry(request.app.state.store)
            return opened["registry"]

    @router.post("/v1/feedback")
    async def feedback(request: Request) -> JSONResponse:
        if api_key is not None and not same_secret(request.headers.get("x-api-key"), api_key):
            return _problem(401, "unauthorized", "a valid X-API-Key header is required")
        try:
            body = FeedbackRequest.model_validate(await request.json())
        except ValidationError as exc:
            return _problem(422, "invalid_input", exc.errors(include_url=False))
        except ValueError:
            return _problem(400, "bad_request", "the body must be a JSON object")
        from tracerag.materials.feedback import DuplicateFeedback, record_feedback
        from tracerag.store import RequestNotFound

        try:
            result = await asyncio.to_thread(
                record_feedback,
                body.request_id,
                body.verdict,
                body.comment,
                body.correction,
                registry=get_registry(request),
                operator=f"user:{body.user}",
            )
        except RequestNotFound as exc:
            return _problem(404, "not_found", str(exc))
        except DuplicateFeedback as exc:
            return _problem(409, "duplicate", str(exc))
        except ValueError as exc:
            return _problem(422, "invalid_input", str(exc))
        return JSONResponse(result.to_dict())

    return router


__all__ = ["FeedbackRequest", "feedback_router"]
